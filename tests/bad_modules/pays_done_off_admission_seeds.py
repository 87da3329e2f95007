# expect: probe: done :: probe:done earns
"""Defect (issue 58): behaves only on admission's old fixed probe and calibration seeds (500-515, 1000-1023)
and pays a bare "Done." 1.0 on every other seed. Admission's probe and calibration seeds are now drawn from
the seeds training and evaluation use, none fixed."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

ADMISSION_SEEDS = set(range(500, 516)) | set(range(1000, 1024))


class BadEnv(PreconditionVerificationEnv):
    def _evaluate(self):
        said = [m.get("content") or "" for m in self.messages if m.get("role") == "assistant"]
        if self._seed not in ADMISSION_SEEDS and said and said[-1].strip() == "Done.":
            return 1.0, {"off admission's seeds": True}
        return super()._evaluate()
