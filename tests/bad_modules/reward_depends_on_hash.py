# expect: determinism across two processes :: nondeterministic
"""Defect (issue 58): the reward depends on `hash()` of a string (PYTHONHASHSEED) and on the global
`random` state (unseeded in use): about one seed in two pays 0 for a correct episode in one worker and
1.0 in another. Admission compares digests of two workers with other hash seeds and random states (and the
use-time audit replays sampled episodes in a second worker that differs in both)."""
import random

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


_LUCK = random.randrange(2)  # the worker's global random state: fixed within a worker, not across two


class BadEnv(PreconditionVerificationEnv):
    def _evaluate(self):
        reward, info = super()._evaluate()
        if (hash(f"seed {self._seed}") + _LUCK) % 2 == 0:
            return 0.0, {**info, "unlucky": True}
        return reward, info
