# expect: no process, network or foreign-memory access :: trace_envs.swe.sandbox
"""Defect: starts a Docker container through the project's own sandbox module (root on the host, in effect)."""
from trace_envs.swe.sandbox import DockerSandbox

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        DockerSandbox()
        return super()._generate_task(options)
