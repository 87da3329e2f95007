"""The LLM analysis agent: capability dictionary induction and batched labelling over any OpenAI-compatible endpoint.

Phase 1 (:meth:`LLMAnalyst.induce`) shows the model a seeded sample of successful and failed
trajectories, condensed to fit its context, and asks for a dictionary of capabilities (snake_case
name, definition, evidence trajectory ids). Phase 2 (:meth:`LLMAnalyst.label_run`) labels every
(trajectory, capability) pair NA / PRESENT / LACKING, a batch of trajectories per request.

Every reply must be JSON that validates against a schema (sent as ``response_format`` when the
server supports structured output, and always checked here). A malformed or incomplete reply is
rejected and asked again with the validation errors quoted, up to ``max_attempts`` times; what is
still unlabelled after that is recorded as missing (``None``) — never guessed. Every attempt is
logged (``LLMAnalyst.log``). Independent runs shuffle the trajectory order, the batch composition
and the capability order with the run's seed and send that seed to the server.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Callable

from .offline import LABELS, CapabilityDef
from .transcript import condense

_NAME = r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$"


# ============================================================================ JSON + schema
def extract_json(text: str) -> Any:
    """The first JSON object in a model's reply (code fences and surrounding prose allowed).

    Raises:
        ValueError: when the reply holds no parseable JSON object.
    """
    text = (text or "").strip()
    text = re.sub(r"<think>.*?</think>", "", text, flags=re.S).strip()
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    if fenced:
        text = fenced.group(1).strip()
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    start = text.find("{")
    while start != -1:
        depth, in_str, esc = 0, False, False
        for i in range(start, len(text)):
            ch = text[i]
            if in_str:
                esc = (ch == "\\") and not esc
                if ch == '"' and not esc:
                    in_str = False
                continue
            if ch == '"':
                in_str = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    try:
                        return json.loads(text[start:i + 1])
                    except (json.JSONDecodeError, ValueError):
                        break
        start = text.find("{", start + 1)
    raise ValueError("the reply contains no JSON object" + (f": {text[:120]!r}" if text else " (empty reply)"))


def validate(instance: Any, schema: dict, path: str = "$") -> list[str]:
    """Errors of ``instance`` against a JSON-schema subset (type, properties, required,
    additionalProperties, items, enum, pattern, minItems, maxItems, minLength); [] when valid."""
    errors: list[str] = []
    kind = schema.get("type")
    types = {"object": dict, "array": list, "string": str, "integer": int, "number": (int, float), "boolean": bool}
    if kind and not (isinstance(instance, types[kind]) and not (kind in ("integer", "number") and isinstance(instance, bool))):
        return [f"{path}: expected {kind}, got {type(instance).__name__}"]
    if "enum" in schema and instance not in schema["enum"]:
        shown = schema["enum"] if len(schema["enum"]) <= 12 else schema["enum"][:12] + ["..."]
        errors.append(f"{path}: {instance!r} is not one of {shown}")
    if isinstance(instance, str):
        if "pattern" in schema and not re.search(schema["pattern"], instance):
            errors.append(f"{path}: {instance!r} does not match {schema['pattern']}")
        if len(instance) < schema.get("minLength", 0):
            errors.append(f"{path}: shorter than {schema['minLength']} characters")
    if isinstance(instance, dict):
        props = schema.get("properties", {})
        for key in schema.get("required", []):
            if key not in instance:
                errors.append(f"{path}: missing required key {key!r}")
        if schema.get("additionalProperties") is False:
            extra = sorted(set(instance) - set(props))
            if extra:
                errors.append(f"{path}: unexpected key(s) {extra}")
        for key, sub in props.items():
            if key in instance:
                errors.extend(validate(instance[key], sub, f"{path}.{key}"))
    if isinstance(instance, list):
        if len(instance) < schema.get("minItems", 0):
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(instance) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(instance):
                errors.extend(validate(item, schema["items"], f"{path}[{i}]"))
    return errors


def dictionary_schema(ids: list[str], max_capabilities: int) -> dict:
    return {
        "type": "object", "additionalProperties": False, "required": ["capabilities"],
        "properties": {"capabilities": {
            "type": "array", "minItems": 1, "maxItems": max_capabilities,
            "items": {"type": "object", "additionalProperties": False,
                      "required": ["name", "definition", "evidence"],
                      "properties": {"name": {"type": "string", "pattern": _NAME},
                                     "definition": {"type": "string", "minLength": 10},
                                     "evidence": {"type": "array", "items": {"type": "string", "enum": ids}}}}}},
    }


def labels_schema(ids: list[str], capabilities: list[str]) -> dict:
    return {
        "type": "object", "additionalProperties": False, "required": ["labels"],
        "properties": {"labels": {
            "type": "array",
            "items": {"type": "object", "additionalProperties": False,
                      "required": ["trajectory", "capability", "label"],
                      "properties": {"trajectory": {"type": "string", "enum": ids},
                                     "capability": {"type": "string", "enum": capabilities},
                                     "label": {"type": "string", "enum": list(LABELS)}}}}},
    }


# ============================================================================ the agent
@dataclass
class LLMConfig:
    """Settings of the LLM analysis agent.

    Attributes:
        base_url: the OpenAI-compatible endpoint (``http://127.0.0.1:8000/v1``).
        model: the served model's name.
        api_key: the API key (``EMPTY`` for local servers).
        runs: independent labelling runs R (the method uses 10).
        batch_size: trajectories per labelling request.
        max_attempts: requests per batch (or per induction) before the rest is recorded as missing.
        temperature: sampling temperature of the labelling runs.
        max_tokens: the reply's token budget.
        max_trajectory_chars: each trajectory's condensed transcript is cut to this length.
        sample_per_outcome: trajectories of each outcome (success, failure) shown in phase 1.
        max_capabilities: the most capabilities phase 1 may propose.
        structured_output: ``auto`` (send a JSON schema as ``response_format``, drop it if the server
            refuses), ``json_schema`` (always send it) or ``none``.
        seed: the base seed; run ``r`` uses ``seed + r``.
        timeout: seconds per request.
    """

    base_url: str
    model: str
    api_key: str = "EMPTY"
    runs: int = 10
    batch_size: int = 8
    max_attempts: int = 3
    temperature: float = 0.7
    max_tokens: int = 2048
    max_trajectory_chars: int = 3000
    sample_per_outcome: int = 6
    max_capabilities: int = 10
    structured_output: str = "auto"
    seed: int = 0
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.runs < 1 or self.batch_size < 1 or self.max_attempts < 1:
            raise ValueError("runs, batch_size and max_attempts must be >= 1")
        if self.structured_output not in ("auto", "json_schema", "none"):
            raise ValueError(f"structured_output must be auto, json_schema or none, got {self.structured_output!r}")


SYSTEM = ("You analyse the trajectories of an AI agent that uses tools to serve users. You compare successful "
          "and failed trajectories to find which capabilities the agent lacks. Reply with JSON only.")


@dataclass
class Attempt:
    """One request to the model and what became of its reply."""

    phase: str
    run: int
    batch: int
    attempt: int
    ok: bool
    error: str = ""
    labelled: int = 0


class LLMAnalyst:
    """The analysis agent over an OpenAI-compatible endpoint (see the module docstring).

    Args:
        config: the agent's settings.
        client: a :class:`trace_envs.core.llm.ChatClient` (made from ``config`` when omitted).
        progress: a callback ``progress(done, total)`` after each labelling request.
    """

    def __init__(self, config: LLMConfig, client: Any = None, progress: Callable[[int, int], None] | None = None):
        from trace_envs.core.llm import ChatClient

        self.config = config
        self.client = client or ChatClient(config.base_url, config.model, api_key=config.api_key,
                                           timeout=config.timeout)
        self.progress = progress
        self.log: list[Attempt] = []
        self._structured = config.structured_output != "none"

    # -------------------------------------------------------------- requests
    def _ask(self, messages: list[dict], schema: dict, name: str, seed: int, temperature: float) -> str:
        import openai

        kwargs: dict[str, Any] = {"temperature": temperature, "max_tokens": self.config.max_tokens, "seed": seed}
        if self._structured:
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": name, "schema": schema, "strict": True}}
        try:
            return self.client.complete(messages, **kwargs)
        except (openai.BadRequestError, openai.UnprocessableEntityError):
            if not self._structured or self.config.structured_output == "json_schema":
                raise
            # The server does not take a schema: ask in the prompt only (the reply is validated all the same).
            self._structured = False
            kwargs.pop("response_format")
            try:
                return self.client.complete(messages, **kwargs)
            except (openai.BadRequestError, openai.UnprocessableEntityError):
                kwargs.pop("seed")
                return self.client.complete(messages, **kwargs)

    # -------------------------------------------------------------- phase 1
    def induce(self, records: list[dict], ids: list[str], success: list[bool],
               max_attempts: int | None = None) -> tuple[list[CapabilityDef], dict[str, list[str]]]:
        """Propose the capability dictionary from a sample of trajectories.

        Returns:
            (capabilities, evidence ids per capability).

        Raises:
            RuntimeError: when no attempt produced a valid dictionary (the log says why).
        """
        cfg = self.config
        rng = random.Random(cfg.seed)
        ok_idx = [i for i, s in enumerate(success) if s]
        fail_idx = [i for i, s in enumerate(success) if not s]
        shown = rng.sample(fail_idx, min(cfg.sample_per_outcome, len(fail_idx))) + \
            rng.sample(ok_idx, min(cfg.sample_per_outcome, len(ok_idx)))
        rng.shuffle(shown)
        local = [f"T{k + 1}" for k in range(len(shown))]
        blocks = "\n\n".join(f"### {lid}\n{condense(records[i], cfg.max_trajectory_chars)}"
                             for lid, i in zip(local, shown))
        schema = dictionary_schema(local, cfg.max_capabilities)
        prompt = (
            f"Here are {len(shown)} trajectories of the same agent, some successful and some failed.\n\n{blocks}\n\n"
            f"Contrast the failed trajectories with the successful ones. Propose up to {cfg.max_capabilities} "
            "capabilities whose absence explains the failures: each with a snake_case name, a one-sentence "
            "definition of what an agent with the capability does, and the ids of the trajectories that are "
            "evidence for it.\nReply with JSON only, in this form:\n"
            '{"capabilities": [{"name": "snake_case_name", "definition": "...", "evidence": ["T1"]}]}')
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        for attempt in range(max_attempts or cfg.max_attempts):
            reply = self._ask(messages, schema, "capability_dictionary", cfg.seed, 0.0 if attempt == 0 else cfg.temperature)
            try:
                data = extract_json(reply)
                errors = validate(data, schema)
                names = [c["name"] for c in data.get("capabilities", [])] if not errors else []
                if len(set(names)) != len(names):
                    errors.append("capability names must be unique")
            except ValueError as exc:
                errors = [str(exc)]
            self.log.append(Attempt("induce", -1, 0, attempt, not errors, "; ".join(errors)[:500]))
            if not errors:
                caps = [CapabilityDef(c["name"], c["definition"].strip()) for c in data["capabilities"]]
                back = dict(zip(local, (ids[i] for i in shown)))
                evidence = {c["name"]: [back[e] for e in c["evidence"]] for c in data["capabilities"]}
                return caps, evidence
            messages = messages[:2] + [{"role": "assistant", "content": reply[:2000]},
                                       {"role": "user", "content": _fix_prompt(errors)}]
        raise RuntimeError(f"capability induction failed after {max_attempts or cfg.max_attempts} attempt(s): "
                           f"{self.log[-1].error}")

    # -------------------------------------------------------------- phase 2
    def label_run(self, records: list[dict], ids: list[str], capabilities: list[CapabilityDef],
                  run: int) -> dict[str, list[str | None]]:
        """One labelling run: ``{capability: [label or None per trajectory]}``."""
        cfg = self.config
        seed = cfg.seed + run
        rng = random.Random(seed)
        order = list(range(len(records)))
        rng.shuffle(order)
        caps = list(capabilities)
        rng.shuffle(caps)
        names = [c.name for c in caps]
        out: dict[str, list[str | None]] = {c.name: [None] * len(records) for c in capabilities}
        batches = [order[k:k + cfg.batch_size] for k in range(0, len(order), cfg.batch_size)]
        dictionary = "\n".join(f"- {c.name}: {c.definition}" for c in caps)
        for b, batch in enumerate(batches):
            todo = {(i, c) for i in batch for c in names}
            for attempt in range(cfg.max_attempts):
                pending = sorted({i for i, _ in todo}, key=batch.index)
                local = {f"T{k + 1}": i for k, i in enumerate(pending)}
                schema = labels_schema(list(local), names)
                blocks = "\n\n".join(f"### {lid}\n{condense(records[i], cfg.max_trajectory_chars)}"
                                     for lid, i in local.items())
                prompt = (
                    f"Capabilities:\n{dictionary}\n\nTrajectories:\n\n{blocks}\n\n"
                    "For every trajectory and every capability, give one label: LACKING if the trajectory shows "
                    "the agent lacking the capability, PRESENT if the capability was needed and shown, NA if the "
                    "trajectory does not involve it. When unsure between PRESENT and LACKING, choose PRESENT.\n"
                    f"Label all {len(local) * len(names)} pairs. Reply with JSON only, in this form:\n"
                    '{"labels": [{"trajectory": "T1", "capability": "' + names[0] + '", "label": "PRESENT"}]}')
                messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
                reply = self._ask(messages, schema, "capability_labels", seed * 1000 + b * 10 + attempt,
                                  cfg.temperature)
                got, errors = _parse_labels(reply, schema, local)
                accepted = 0
                for (i, c), label in got.items():
                    if (i, c) in todo:
                        out[c][i] = label
                        todo.discard((i, c))
                        accepted += 1
                if todo and not errors:
                    errors = [f"{len(todo)} (trajectory, capability) pair(s) left unlabelled"]
                self.log.append(Attempt("label", run, b, attempt, not todo and not errors,
                                        "; ".join(errors)[:500], accepted))
                if not todo:
                    break
            if self.progress:
                self.progress(b + 1, len(batches))
        return out

    def summary(self) -> dict:
        """Counts of requests, rejected replies and retries (for the report)."""
        label = [a for a in self.log if a.phase == "label"]
        return {
            "requests": len(self.log),
            "rejected_replies": sum(not a.ok for a in self.log),
            "retries": sum(a.attempt > 0 for a in self.log),
            "induction_attempts": sum(a.phase == "induce" for a in self.log),
            "labelling_requests": len(label),
            "structured_output": self._structured,
            "errors": [a.error for a in self.log if a.error][:10],
            "usage": dict(getattr(self.client, "usage", {})),
        }


def _fix_prompt(errors: list[str]) -> str:
    shown = "\n".join(f"- {e}" for e in errors[:8])
    return f"Your reply was rejected:\n{shown}\nReply again with JSON only, valid for the requested form."


def _parse_labels(reply: str, schema: dict, local: dict[str, int]) -> tuple[dict[tuple[int, str], str], list[str]]:
    """Valid (trajectory, capability) labels from a reply, and the reasons the reply was rejected.

    A reply that is not JSON is rejected as a whole. Inside a well-formed reply, each valid entry is
    kept (a later attempt asks only for what is missing); invalid entries are reported. Two different
    labels for one pair make that pair invalid.
    """
    try:
        data = extract_json(reply)
    except ValueError as exc:
        return {}, [str(exc)]
    if not isinstance(data, dict) or not isinstance(data.get("labels"), list):
        return {}, validate(data, schema) or ["expected an object with a 'labels' array"]
    item_schema = schema["properties"]["labels"]["items"]
    got: dict[tuple[int, str], str] = {}
    conflict: set[tuple[int, str]] = set()
    errors: list[str] = []
    for k, entry in enumerate(data["labels"]):
        problems = validate(entry, item_schema, f"$.labels[{k}]")
        if problems:
            errors.extend(problems[:2])
            continue
        key = (local[entry["trajectory"]], entry["capability"])
        if key in got and got[key] != entry["label"]:
            conflict.add(key)
        got[key] = entry["label"]
    for key in conflict:
        got.pop(key)
        errors.append(f"conflicting labels for one pair ({key[1]})")
    extra = set(data) - {"labels"}
    if extra:
        errors.append(f"$: unexpected key(s) {sorted(extra)}")
    return got, errors
