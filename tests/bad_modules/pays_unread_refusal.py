# expect: probe: refuse :: probe:refuse earns
"""Defect: a refusal earns the silent-refusal credit without the record that decides it being read.

This is precondition_verification-v0's reward, which GRPO learned to collect by ending every
conversation at once (131 of 200 held-out episodes in the clean run earned exactly this 0.5).
"""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _score(self):
        reward, breakdown = super()._score()
        outcomes = self.request_outcomes()
        if breakdown["decision"] == "refuse" and not outcomes.write_calls:
            reward = max(reward, 0.5)
        return reward, breakdown
