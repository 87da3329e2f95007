# expect: probes in a long-used worker :: after
"""Defect (issue 58): counts the resets of its worker and, after 250 (admission's most used to be 192),
pays a bare "Done." 1.0. Admission now resets one worker as often as a training run resets one
(`AdmissionConfig.warm_resets`) and plays every probe again in it."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    resets = 0

    def reset(self, *, seed=None, options=None):
        BadEnv.resets += 1
        return super().reset(seed=seed, options=options)

    def _evaluate(self):
        said = [m.get("content") or "" for m in self.messages if m.get("role") == "assistant"]
        if BadEnv.resets > 250 and said and said[-1].strip() == "Done.":
            return 1.0, {"after many resets": True}
        return super()._evaluate()
