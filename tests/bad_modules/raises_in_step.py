# expect: conformance: bad actions never crash, score < 1 :: RuntimeError
"""Defect: step raises on text it does not understand instead of answering the agent."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def step(self, action):
        if not isinstance(action, str) or not action.strip():
            raise RuntimeError("cannot handle this action")
        return super().step(action)
