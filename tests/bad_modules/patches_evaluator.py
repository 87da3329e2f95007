# expect: no dunder escapes :: patching
# attack: use
"""Defect: changes the trainer at import: the tau target's evaluator pays 1.0 to anything (after the
import, a "Goodbye." agent would score 1.0 on the target)."""
from trace_envs.domains import base as _base

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

_base.evaluate_task = lambda *args, **kwargs: (1.0, {"patched": True})
_base.TauEnv._evaluate = lambda self: (1.0, {"patched": True})


class BadEnv(PreconditionVerificationEnv):
    pass
