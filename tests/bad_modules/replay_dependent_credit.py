# expect: same actions, same reward :: depends on earlier episodes
"""Defect (issue 58): a later play of a seed in the same worker pays only if it repeats the seed's first
transcript, so a GRPO group's reward depends on its members' order (the oracle played twice still gets 1.0,
which is all admission used to replay). Admission now replays calibration episodes in a fresh worker and
compares rewards; the use-time audit replays sampled episodes in a second worker."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    first = {}

    def _evaluate(self):
        reward, info = super()._evaluate()
        said = repr([m.get("content") for m in self.messages if m.get("role") == "assistant"])
        seen = BadEnv.first.setdefault(self._seed, said)
        if seen != said:
            return 0.0, {**info, "replayed": True}
        return reward, info
