# expect: no process, network or foreign-memory access :: .save
# attack: use
"""Defect: writes files with numpy.save, numpy.memmap and open(**{'mode': 'w'})."""
import numpy

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        for write in (lambda: numpy.save("/tmp/trace_bad_module_wrote_this.npy", numpy.zeros(3)),
                      lambda: numpy.memmap("/tmp/trace_bad_module_wrote_this", mode="w+", shape=(8,)),
                      lambda: open("/tmp/trace_bad_module_wrote_this", **{"mode": "w"}).write("pwned")):
            try:
                write()
            except Exception:
                pass
        return super()._generate_task(options)
