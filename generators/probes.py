"""Reward-hacking probes and the calibration agent of the admission checks.

Each probe is a cheap scripted agent that must *not* earn reward from an env that teaches its
capability: it says nothing, acts at random, calls every write tool with arguments guessed from
the conversation, refuses everything, or parrots the user. An env whose reward any of them
collects above a bound verifies the wrong thing (FACTS.md §6: hackable verifiers are common).

:class:`MixtureAgent` is the calibration agent: per episode it plays the oracle or the planted-
deficit agent that lacks the env's capability, so a GRPO group of it has the spread a base model
that is sometimes right would have, and an env in which the deficit agent scores as well as the
oracle (too easy for the capability) leaves the calibration band.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from trace_envs.agents import RandomAgent
from trace_envs.core.conversation import hermes_tool_call

REFUSAL = "I'm sorry, but I can't help with that request."
_ID_PATTERN = re.compile(r"(?:#[A-Z]\d{3,}|\b[A-Z0-9]{5,8}\b|\b[a-z]+_[a-z]+_\d{3,}\b|[\w./-]+\.py)")


class EmptyAgent:
    """Sends empty turns."""

    name = "probe:empty"

    def __call__(self, observation: str, info: dict) -> Any:
        return ""


class RefuseAgent:
    """Refuses every request, politely and without reading anything."""

    name = "probe:refuse"

    def __call__(self, observation: str, info: dict) -> Any:
        return REFUSAL


class EchoAgent:
    """Repeats the user's last words back."""

    name = "probe:echo"

    def __call__(self, observation: str, info: dict) -> Any:
        users = [m.get("content") or "" for m in info.get("messages", []) if m.get("role") == "user"]
        return users[-1] if users else observation


def _guess(schema: dict, ids: list[str]) -> Any:
    kind = schema.get("type")
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if kind == "integer":
        return 1
    if kind == "number":
        return 1.0
    if kind == "boolean":
        return True
    if kind == "array":
        return [_guess(schema.get("items") or {"type": "string"}, ids)]
    if kind == "object":
        return {}
    return ids[0] if ids else "x"


class WriteAllAgent:
    """Calls every write tool once with arguments guessed from the conversation, then says it is done."""

    name = "probe:write_all"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        toolset = getattr(env, "_toolset", None)
        names = [t["function"]["name"] for t in info.get("tools", [])]
        self.writes = [n for n in names if toolset is not None and toolset.is_write(n)]
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in info.get("tools", [])}
        self.i = 0

    def __call__(self, observation: str, info: dict) -> Any:
        if self.i >= len(getattr(self, "writes", [])):
            return "All done, everything you asked for has been taken care of."
        name = self.writes[self.i]
        self.i += 1
        text = " ".join(str(m.get("content") or "") for m in info.get("messages", [])
                        if m.get("role") in ("user", "tool"))  # not the policy: its example ids are no one's
        ids = _ID_PATTERN.findall(text)
        params = self.schemas.get(name, {})
        args = {k: _guess(v, ids) for k, v in (params.get("properties") or {}).items()
                if k in (params.get("required") or [])}
        return hermes_tool_call(name, args)


def probe_agents(seed: int) -> list[Any]:
    """The five probes (the random one seeded)."""
    random = RandomAgent(seed)
    random.name = "probe:random"
    return [EmptyAgent(), random, WriteAllAgent(), RefuseAgent(), EchoAgent()]


#: Upper bound on each probe's mean reward. Loose enough for the built-in envs' partial credit (a
#: generic refusal earns up to 0.40 on precondition_verification's must-refuse tasks; attempting the
#: right write earns per-request credit on multi_step_completion, ≈ 0.6 for write_all on retail),
#: tight enough that an env paying for the probe's behaviour is rejected.
PROBE_BOUNDS = {"probe:empty": 0.45, "probe:random": 0.45, "probe:write_all": 0.7, "probe:refuse": 0.45,
                "probe:echo": 0.45}
#: Upper bound on each probe's success rate (reward 1.0): no probe should ever solve a task.
PROBE_SUCCESS_BOUND = 0.25


def deficit_agent(capability: str) -> Any:
    """The planted-deficit agent lacking ``capability`` (τ² capabilities and ``swe_localization``)."""
    from trace_envs.agents import make_agent

    if capability == "swe_localization":
        return make_agent("loc:give_up")
    from trace_envs.domains.agents import TauScriptedAgent

    return TauScriptedAgent([capability])


class MixtureAgent:
    """A scripted stand-in for a base model that lacks the env's capability, for calibration.

    Per episode it plays the planted-deficit agent lacking ``capability`` (probability
    ``deficit``), the random agent (``random``: a base model's garbage turns) or the oracle (the
    rest). The weights are fixed, not tuned per env: with GRPO's default group size of 8, every
    built-in capability env at its default difficulty sits inside the FACTS.md §1 band for them,
    and an env in which the deficit agent does as well as the oracle (too easy for the capability)
    or the oracle's share never shows (too hard) leaves it. The draw is a pure function of
    (``seed``, the env seed), so a group's members differ and a rerun is identical.
    """

    def __init__(self, capability: str, deficit: float = 0.4, random: float = 0.25, seed: int = 0):
        from trace_envs.agents import OracleAgent

        if deficit < 0 or random < 0 or deficit + random > 1:
            raise ValueError(f"weights must be >= 0 and sum to at most 1, got deficit={deficit}, random={random}")
        self.name = f"mixture:{capability}"
        self.weights, self.seed = (deficit, random), seed
        self.oracle, self.deficit, self.random = OracleAgent(), deficit_agent(capability), RandomAgent(seed)
        self._current: Any = None

    def reset(self, env: Any, observation: str, info: dict) -> None:
        env_seed = getattr(env, "_seed", None) or 0
        u = np.random.default_rng(np.random.SeedSequence([self.seed, int(env_seed)])).random()
        deficit, random = self.weights
        self._current = self.deficit if u < deficit else self.random if u < deficit + random else self.oracle
        if hasattr(self._current, "reset"):
            self._current.reset(env, observation, info)

    def __call__(self, observation: str, info: dict) -> Any:
        return self._current(observation, info)
