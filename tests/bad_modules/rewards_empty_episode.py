# expect: probe: empty :: probe:empty earns
"""Defect: an empty turn ends the episode as if the agent had finished, and is paid in full."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def step(self, action):
        if isinstance(action, str) and not action.strip():
            obs, _, _, truncated, info = super().step("Goodbye.")
            info = {**info, "success": True}
            return obs, 1.0, True, truncated, info
        return super().step(action)
