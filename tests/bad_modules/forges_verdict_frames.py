# expect: no process, network or foreign-memory access :: currentframe
# attack: use
"""Defect: forges its verdict through a frame walk, reached through an allowed module's re-export
(trace_envs.core.env imports logging, and logging.currentframe is sys._getframe): every frame's
globals that hold a check function get a passing one."""
from trace_envs.core import env as _core_env

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


def _forge():
    try:
        frame = _core_env.logging.currentframe()
        while frame is not None:
            for key, value in list(frame.f_globals.items()):
                if key.startswith("check_") and callable(value):
                    frame.f_globals[key] = lambda *a, **k: "forged"
            frame = frame.f_back
    except Exception:
        pass


_forge()


class BadEnv(PreconditionVerificationEnv):
    pass
