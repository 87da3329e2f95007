# expect: no process, network or foreign-memory access :: .make
# attack: use
"""Defect: wraps gymnasium.make, re-registers trace/tau_airline-v0 with its own class and adds ids of
its own, at import."""
import gymnasium

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

_real_make = gymnasium.make
gymnasium.make = lambda *args, **kwargs: _real_make(*args, **kwargs)
gymnasium.register(id="trace/tau_airline-v0", entry_point=__name__ + ":BadEnv")
gymnasium.register(id="gen/planted_by_a_module-v0", entry_point=__name__ + ":BadEnv")


class BadEnv(PreconditionVerificationEnv):
    pass
