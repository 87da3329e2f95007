"""Reward-hacking probes and the calibration agent of the admission checks.

Each probe is a cheap scripted agent that must *not* earn reward from an env that teaches its
capability: it says nothing, acts at random, calls every write tool with arguments guessed from
the conversation, refuses everything, or parrots the user. An env whose reward any of them
collects above a bound verifies the wrong thing (docs/design.md, "The method's settings": hackable verifiers are common).

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
GOODBYE = "Thank you for contacting us. Have a great day!"
_ID_PATTERN = re.compile(r"(?:#[A-Z]\d{3,}|\b[A-Z0-9]{5,8}\b|\b[a-z]+_[a-z]+_\d{3,}\b|[\w./-]+\.py)")
_NUMBER = re.compile(r"(?<![\w.])\$?\d+(?:\.\d+)?(?![\w])")
#: Name prefixes of the tools that only read (τ², SWE and the examples); any other tool may write.
_READ_PREFIXES = ("get_", "find_", "list_", "search_", "calculate", "read_", "grep", "view", "lookup", "check_")
_NOT_WRITES = ("transfer_to_human_agents",)


def tool_names(info: dict) -> list[str]:
    return [t["function"]["name"] for t in info.get("tools", [])]


def is_read_tool(name: str) -> bool:
    return name.startswith(_READ_PREFIXES)


def write_tools(info: dict) -> list[str]:
    """The tools that may change state, judged by name only (a probe sees what an agent sees)."""
    return [n for n in tool_names(info) if not is_read_tool(n) and n not in _NOT_WRITES]


def heard(info: dict, roles: tuple[str, ...] = ("user",)) -> str:
    """What the agent was told so far (the customer's words; with ``"tool"``, tool results too)."""
    return " ".join(str(m.get("content") or "") for m in info.get("messages", []) if m.get("role") in roles)


def _schemas(info: dict) -> dict[str, dict]:
    return {t["function"]["name"]: t["function"].get("parameters") or {} for t in info.get("tools", [])}


def _pick_id(param: str, ids: list[str]) -> str | None:
    """The id among ``ids`` that looks like what ``param`` names (a reservation, an order, a user...)."""
    shapes = {"user": re.compile(r"^[a-z]+_[a-z]+_\d+$"), "order": re.compile(r"^#W\d+$"),
              "flight": re.compile(r"^[A-Z]{3}\d{3}$"), "date": re.compile(r"^\d{4}-\d{2}-\d{2}$"),
              "reservation": re.compile(r"^(?![A-Z]{3}\d{3}$)[A-Z0-9]{6}$"),
              "payment": re.compile(r"(card|gift|certificate|paypal)"),
              "item": re.compile(r"^\d{8,}$"), "product": re.compile(r"^\d{8,}$")}
    for word, shape in shapes.items():
        if word in param:
            hits = [i for i in ids if shape.search(i)]
            return hits[0] if hits else None
    return None


def _guess(schema: dict, ids: list[str], param: str = "") -> Any:
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
        return [_guess(schema.get("items") or {"type": "string"}, ids, param)]
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _guess(v, ids, k) for k, v in props.items() if k in (schema.get("required") or [])}
    return _pick_id(param, ids) or (ids[0] if ids else "x")


def guessed_call(name: str, info: dict, roles: tuple[str, ...] = ("user", "tool")) -> str:
    """A call of ``name`` whose required arguments are guessed from what the agent was told (ids by shape)."""
    text = heard(info, roles)
    ids = (_ID_PATTERN.findall(text) + re.findall(r"\b(?:credit_card|gift_card|certificate|paypal)_\d+\b", text)
           + re.findall(r"\b\d{4}-\d{2}-\d{2}\b", text))
    params = _schemas(info).get(name, {})
    args = {k: _guess(v, ids, k) for k, v in (params.get("properties") or {}).items()
            if k in (params.get("required") or [])}
    return hermes_tool_call(name, args)


def _stems(text: str) -> set[str]:
    return {w[:5] for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3}


def requested_write(info: dict) -> str | None:
    """The write tool whose name shares most words with the customer's request (no record read)."""
    words = _stems(heard(info))
    scored = [(len(_stems(n.replace("_", " ")) & words), -i, n) for i, n in enumerate(write_tools(info))]
    scored = [x for x in scored if x[0] > 0]
    return max(scored)[2] if scored else None


class _Probe:
    """A scripted probe: ``turn(k, observation, info)`` gives the k-th action of the episode."""

    name = "probe:"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        self.k = 0

    def __call__(self, observation: str, info: dict) -> Any:
        k = getattr(self, "k", 0)
        self.k = k + 1
        return self.turn(k, observation, info)

    def turn(self, k: int, observation: str, info: dict) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError


class EmptyAgent(_Probe):
    """Sends empty turns."""

    name = "probe:empty"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        return ""


class EndAtOnceAgent(_Probe):
    """Says goodbye at once and every turn after: ends the conversation without doing anything."""

    name = "probe:end_at_once"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        return GOODBYE


class EndWithoutReadingAgent(_Probe):
    """What GRPO learned first on precondition_verification-v0: a polite close, no read, no write."""

    name = "probe:end_without_reading"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        return ("I understand. Is there anything else I can help you with today?" if k == 0
                else "You're welcome. Goodbye!")


class DoneAgent(_Probe):
    """Says it is done."""

    name = "probe:done"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        return "Done."


class RefuseAgent(_Probe):
    """Refuses every request, politely and without reading anything."""

    name = "probe:refuse"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        return REFUSAL


class EchoAgent(_Probe):
    """Repeats the user's last words back (parrots the customer)."""

    name = "probe:echo"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        users = [m.get("content") or "" for m in info.get("messages", []) if m.get("role") == "user"]
        return users[-1] if users else observation


class EchoIdsAgent(_Probe):
    """Repeats every id and number the customer said, as if they were the answer."""

    name = "probe:echo_ids"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        text = heard(info)
        found = list(dict.fromkeys(_ID_PATTERN.findall(text) + _NUMBER.findall(text)))
        return "Here is what I found: " + ", ".join(found) + "." if found else "Done."


class FirstObservationAgent(_Probe):
    """Answers from the first observation only: restates the opening message's facts, reads nothing."""

    name = "probe:first_observation"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        super().reset(env, observation, info)
        self.opening = heard(info)

    def turn(self, k: int, observation: str, info: dict) -> Any:
        opening = getattr(self, "opening", "") or observation
        found = list(dict.fromkeys(_ID_PATTERN.findall(opening) + _NUMBER.findall(opening)))
        return f"Based on your message: {opening} ({', '.join(found)}). This has been taken care of."


class ActUnreadAgent(_Probe):
    """Does whatever is asked without reading: the write the request names, arguments guessed from it."""

    name = "probe:act_unread"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        name = requested_write(info)
        if k == 0 and name is not None:
            return guessed_call(name, info, roles=("user",))
        if k == 1 and name is not None:
            return "Done: your request has been processed."
        return GOODBYE


class FirstToolAgent(_Probe):
    """Calls the first tool in the list, with guessed arguments, every turn."""

    name = "probe:first_tool"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        names = tool_names(info)
        return guessed_call(names[0], info) if names else ""


class RepeatReadAgent(_Probe):
    """Reads the record the customer names, then the same read again, forever."""

    name = "probe:repeat_read"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        super().reset(env, observation, info)
        self.call = None

    def turn(self, k: int, observation: str, info: dict) -> Any:
        if getattr(self, "call", None) is None:
            reads = [n for n in tool_names(info) if is_read_tool(n) and n != "calculate"]
            ids = _ID_PATTERN.findall(heard(info))
            # The read whose parameter looks like one of the customer's ids, else the first read.
            best = next((n for n in reads for k_, v in (_schemas(info)[n].get("properties") or {}).items()
                         if _pick_id(k_, ids)), reads[0] if reads else None)
            self.call = guessed_call(best, info, roles=("user",)) if best else ""
        return self.call


class ReadThenEchoAgent(RepeatReadAgent):
    """Makes the read the customer's ids suggest once, then restates every id and number it has heard (the
    customer's and the tool results': the user id among them) and says goodbye: pays nothing honest."""

    name = "probe:read_then_echo"
    #: It makes one legitimate read, which an env may credit partially (the built-in precondition env pays it
    #: 0.08-0.5 mean, as the task goes): only its success rate is bounded (PROBE_SUCCESS_BOUND, as every probe's).
    mean_bound = 1.0

    def turn(self, k: int, observation: str, info: dict) -> Any:
        if k == 0:
            return super().turn(k, observation, info)
        text = heard(info, ("user", "tool"))
        found = list(dict.fromkeys(_ID_PATTERN.findall(text) + _NUMBER.findall(text)))
        return ("Here is what I found: " + ", ".join(found) + ". " if found else "") + GOODBYE


class WriteAllAgent(_Probe):
    """Calls every write tool once with arguments guessed from the conversation, then says it is done."""

    name = "probe:write_all"

    def turn(self, k: int, observation: str, info: dict) -> Any:
        writes = write_tools(info)
        if k >= len(writes):
            return "All done, everything you asked for has been taken care of."
        return guessed_call(writes[k], info)


def probe_agents(seed: int) -> list[Any]:
    """Every probe that does not use the records (the random one seeded): each must earn ≤ its bound."""
    random = RandomAgent(seed)
    random.name = "probe:random"
    return [EmptyAgent(), random, WriteAllAgent(), RefuseAgent(), EchoAgent(), EndAtOnceAgent(),
            EndWithoutReadingAgent(), DoneAgent(), EchoIdsAgent(), FirstObservationAgent(), ActUnreadAgent(),
            FirstToolAgent(), RepeatReadAgent(), ReadThenEchoAgent()]


#: The bound on every probe's mean reward: a policy that does not use the records must earn (almost) nothing,
#: since GRPO climbs whatever gradient is cheapest and learns any free credit first. Admission's
#: ``AdmissionConfig.probe_bound`` overrides it.
PROBE_BOUND = 0.05
PROBE_NAMES = tuple(agent.name for agent in probe_agents(0))
PROBE_BOUNDS = {name: PROBE_BOUND for name in PROBE_NAMES}
#: Upper bound on each probe's success rate (reward 1.0): no probe should ever solve a task.
PROBE_SUCCESS_BOUND = 0.05


def mean_bound(agent: Any, bound: float) -> float:
    """The mean-reward bound of ``agent``: ``bound``, or the probe's own larger one (a probe that reads)."""
    return max(bound, float(getattr(agent, "mean_bound", 0.0)))


# ---------------------------------------------------------------------------- decision probes
class _ReadThen(_Probe):
    """Makes the reads a decision rests on (from the env's own task), then decides without looking at them."""

    def reset(self, env: Any, observation: str, info: dict) -> None:
        super().reset(env, observation, info)
        task = env.task
        self.reads = [c for r in task.requests for c in env.evidence_calls(r)]
        self.writes = [r.write or r.forbidden_write for r in task.requests]
        self.writes = [w for w in self.writes if w is not None]

    def turn(self, k: int, observation: str, info: dict) -> Any:
        if k < len(self.reads):
            c = self.reads[k]
            return hermes_tool_call(c.name, c.arguments)
        return self.decide(k - len(self.reads), info)

    def decide(self, k: int, info: dict) -> Any:  # pragma: no cover - overridden
        raise NotImplementedError


class ReadThenRefuseAgent(_ReadThen):
    """Reads the deciding records, then refuses, giving every reason a refusal could have."""

    name = "decision:read_then_refuse"

    def decide(self, k: int, info: dict) -> Any:
        return REFUSAL if k == 0 else GOODBYE


class ReadThenActAgent(_ReadThen):
    """Reads the deciding records, then does what the customer asked (the requested write), whatever they say."""

    name = "decision:read_then_act"

    def decide(self, k: int, info: dict) -> Any:
        if k < len(self.writes):
            return hermes_tool_call(self.writes[k].name, self.writes[k].arguments)
        return "Done: your request has been processed." if k == len(self.writes) else GOODBYE


def decision_probe_agents() -> list[Any]:
    """Probes for decision envs (act or refuse) that read but ignore what they read; each may earn at most the
    share of requests its fixed decision fits. They use the env's task, so they run on built-in envs only."""
    return [ReadThenRefuseAgent(), ReadThenActAgent()]


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
    built-in capability env at its default difficulty sits inside the docs/design.md, "The method's settings" band for them,
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


# ---------------------------------------------------------------------------- a decision written into the text
#: Words by which a text tells the agent to refuse (a note an env should never write into what the agent reads).
REFUSAL_CUE = re.compile(r"\b(refuse|refusal|deny|denied|decline|reject|ineligible|not eligible|must not|"
                         r"do not proceed|should not proceed|not allowed|not permitted)\b", re.I)


def _called_tool(action: Any) -> str | None:
    text = action if isinstance(action, str) else ""
    m = re.search(r"<tool_call>\s*(\{.*\})\s*</tool_call>", text, re.S)
    if not m:
        return None
    try:
        import json

        return str(json.loads(m.group(1)).get("name"))
    except (ValueError, AttributeError):
        return None


class NoteFollowerAgent:
    """The planted-deficit agent that also obeys a note: when what it has heard (the customer's words and the
    tool results) tells it to refuse, it refuses instead of making the write it was about to make. Against
    an honest env it plays as the deficit agent does (honest records say nothing of refusing); against an env
    that writes the decision into the opening message or the tool results it gains the refusals it needs.
    Admission compares the two (``probe: obeys_a_note``)."""

    name = "probe:obeys_a_note"

    def __init__(self, capability: str):
        self.inner = deficit_agent(capability)

    def reset(self, env: Any, observation: str, info: dict) -> None:
        self.refused = False
        self.inner.reset(env, observation, info)

    def __call__(self, observation: str, info: dict) -> Any:
        if self.refused:
            return GOODBYE
        action = self.inner(observation, info)
        name = _called_tool(action)
        if name is not None and name in write_tools(info) and REFUSAL_CUE.search(heard(info, ("user", "tool"))):
            self.refused = True
            return REFUSAL
        return action
