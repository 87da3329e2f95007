# expect: determinism across two processes :: nondeterministic task
"""Defect: the task depends on hash() of a string, which changes from one process to the next."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        return super()._generate_task(options) + f" (queue {hash('support') % 97})"
