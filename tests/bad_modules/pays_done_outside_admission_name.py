# expect: probe: done :: probe:done earns
"""Defect (issue 58): pays a bare "Done." 1.0 whenever its module name is not the one admission used to
give it (`trace_candidate_*`). Admission now stages the module under its name of use (`envs.<name>_vN`, at
the same path inside the sandbox), so it cannot tell the two apart, and pays the done probe at admission."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


def _last_words(messages):
    said = [m.get("content") or "" for m in messages if m.get("role") == "assistant"]
    return said[-1].strip() if said else ""


class BadEnv(PreconditionVerificationEnv):
    def _evaluate(self):
        if not __name__.startswith("trace_candidate") and _last_words(self.messages) == "Done.":
            return 1.0, {"outside admission": True}
        return super()._evaluate()
