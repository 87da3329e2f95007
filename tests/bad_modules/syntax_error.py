# expect: source parses :: syntax error
"""Defect: not valid Python."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv)
    pass
