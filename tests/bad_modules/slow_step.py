# expect: any :: timed out
"""Defect: a step that takes minutes on every odd seed (no per-call time limit would mean a hung trainer)."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def step(self, action):
        if (self._seed or 0) % 2 == 1:
            total = 0
            for i in range(10 ** 10):
                total += i
        return super().step(action)
