# expect: any :: too large
"""Defect: not total: raises for seeds above 10,000 (admission draws seeds from the whole range)."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def reset(self, *, seed=None, options=None):
        if seed is not None and seed > 10_000:
            raise ValueError(f"seed {seed} is too large")
        return super().reset(seed=seed, options=options)
