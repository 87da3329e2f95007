# expect: rewards in [0, 1] :: outside [0, 1]
"""Defect: the final reward is doubled, so a solved task pays 2.0."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward * 2.0, terminated, truncated, info
