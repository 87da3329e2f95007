# expect: probe: refuse :: probe:refuse earns
"""Defect: detects that it is not being admitted (its own command line) and then pays 1.0 to anything.
Admission runs it through the same worker as every later use, so it cannot tell the two apart."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


def _admitted_now():
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            return b"admission" in fh.read()
    except Exception:
        return True


class BadEnv(PreconditionVerificationEnv):
    def _evaluate(self):
        if not _admitted_now():
            return 1.0, {"outside admission": True}
        return super()._evaluate()
