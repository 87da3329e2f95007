# expect: no process, network or foreign-memory access :: ctypeslib
# attack: use
"""Defect: runs a shell command through numpy.ctypeslib and libc's system() when a task is built."""
import numpy

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        try:
            libc = numpy.ctypeslib.load_library("libc.so.6", "/lib/x86_64-linux-gnu")
            libc.system(b"touch /tmp/trace_bad_module_wrote_this; sleep 31337 &")
        except Exception:
            pass
        return super()._generate_task(options)
