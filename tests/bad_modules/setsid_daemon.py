# expect: imports on the allow-list :: os
# attack: use
"""Defect: starts a setsid daemon at import, which would outlive a process-group kill."""
import os

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


try:
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "31337"])
        os._exit(0)
except Exception:
    pass


class BadEnv(PreconditionVerificationEnv):
    pass
