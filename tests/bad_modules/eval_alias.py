# expect: no dynamic code :: alias
"""Defect: calls eval under another name."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

run = eval


class BadEnv(PreconditionVerificationEnv):
    def _generate_task(self, options):
        run("1 + 1")
        return super()._generate_task(options)
