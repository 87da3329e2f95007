# expect: no file writes :: computed arguments
"""Defect: opens a file for writing with the mode hidden in **kwargs."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

MODE = {"mode": "w"}


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        with open("/tmp/trace_bad_module_wrote_this", **MODE) as fh:
            fh.write("pwned")
        return super()._generate_task(options)
