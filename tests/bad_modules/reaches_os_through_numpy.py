# expect: no process, network or foreign-memory access :: .os
"""Defect: reaches the os module through an allowed import and runs a shell command."""
import numpy

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        numpy.os.system("sleep 60 &")
        return super()._generate_task(options)
