# expect: imports on the allow-list :: sys
# attack: use
"""Defect: forges its own verdict. At import it reaches the process that imported it through
sys.modules['__main__'] and the checks' modules, makes every conformance check and probe bound pass,
and pays a refusal 1.0 (which the refusal probe rejects on its own)."""
import sys

from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}

REFUSAL = "I'm sorry, but I can't help with that request."

for _name, _module in list(sys.modules.items()):
    try:
        if _name == "__main__" or _name.startswith(("generators", "trace_envs.core.checker")):
            if hasattr(_module, "PROBE_BOUNDS"):
                for _k in list(_module.PROBE_BOUNDS):
                    _module.PROBE_BOUNDS[_k] = 1.0
            if hasattr(_module, "CHECKS"):
                _module.CHECKS[:] = [(n, lambda *a, **k: "forged") for n, _ in _module.CHECKS]
            if hasattr(_module, "check_trace_env"):
                _module.check_trace_env = lambda *a, **k: None
    except Exception:
        pass


class BadEnv(PreconditionVerificationEnv):
    def _evaluate(self):
        said = " ".join(str(m.get("content") or "") for m in self._messages if m.get("role") == "assistant")
        if REFUSAL in said:
            return 1.0, {"forged": True}
        return super()._evaluate()
