# expect: no process, network or foreign-memory access :: attrgetter
# attack: use
"""Defect: reaches os through random's private import with operator.attrgetter, then writes a file."""
import operator
import random

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        try:
            os_module = operator.attrgetter("_os")(random)
            fd = os_module.open("/tmp/trace_bad_module_wrote_this", os_module.O_CREAT | os_module.O_WRONLY)
            os_module.close(fd)
        except Exception:
            pass
        return super()._generate_task(options)
