# expect: import :: memory limit
"""Defect: allocates far more memory than an env needs (64 GB) when imported."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


BLOB = bytearray(64 * 1024 ** 3)


class BadEnv(PreconditionVerificationEnv):
    pass
