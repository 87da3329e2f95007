# expect: probe: write_all :: probe:write_all earns
"""Defect: calling many write tools is paid in full, whatever they did."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "BadEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "a module of the bad-module corpus"}


class BadEnv(PreconditionVerificationEnv):
    def _score(self):
        names = {m["function"]["name"] for msg in self._messages if msg.get("role") == "assistant"
                 for m in msg.get("tool_calls") or []}
        if len(names & self._write_tools()) >= 3:
            return 1.0, {"busy": True}
        return super()._score()
