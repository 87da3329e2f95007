# expect: conformance: seed determinism :: different
"""Defect: the opening message depends on the global random generator, not on the seed."""
import random

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        return super()._generate_task(options) + f" (ticket {random.randint(10000, 99999)})"
