# expect: no dunder escapes :: __subclasses__
"""Defect: walks from a tuple to every class in the interpreter (the classic sandbox escape)."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


LOADERS = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "BuiltinImporter"]


class BadEnv(PreconditionVerificationEnv):
    pass
