# expect: imports on the allow-list :: subprocess
"""Defect: spawns a process."""
import subprocess

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        subprocess.run(["sleep", "60"])
        return super()._generate_task(options)
