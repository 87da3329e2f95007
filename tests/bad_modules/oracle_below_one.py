# expect: conformance: oracle scores 1.0 :: oracle below 1.0
"""Defect: the oracle does not solve the task."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def oracle(self):
        return lambda observation, info: "Hello! How can I help?"
