"""One action parser for every TRACE environment.

An agent's turn arrives in one of four shapes (DESIGN.md, "Action"):

(a) model text with a Hermes block ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``,
(b) a bare JSON tool call ``{"name": ..., "arguments": ...}`` (optionally in a code fence),
(c) an OpenAI assistant message dict (``{"role": "assistant", "content": ..., "tool_calls": [...]}``),
(d) plain text, which is a message to the user.

:func:`parse_action` turns any of them into a :class:`ParsedAction`. Anything
it cannot read becomes a :class:`ParsedAction` with ``error`` set, phrased so
that the agent can fix its next turn; the parser itself never raises.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

#: Turns longer than this are rejected rather than parsed (a runaway generation).
MAX_ACTION_CHARS = 65_536

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)
# C0 controls other than tab, newline and carriage return, DEL, and C1 controls.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass
class ToolCall:
    """One requested tool call. ``arguments`` is whatever JSON the agent sent (validated later)."""

    name: Any
    arguments: Any
    id: str = ""


@dataclass
class ParsedAction:
    """The agent's turn, read. Exactly one of ``error``, ``tool_calls`` or ``content`` matters."""

    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None

    @property
    def is_tool_call(self) -> bool:
        return self.error is None and bool(self.tool_calls)

    @property
    def is_message(self) -> bool:
        return self.error is None and not self.tool_calls


def _reject(message: str) -> ParsedAction:
    return ParsedAction(error=message)


def _check_text(text: str, what: str) -> str | None:
    if len(text) > MAX_ACTION_CHARS:
        return f"{what} is {len(text):,} characters long; the limit is {MAX_ACTION_CHARS:,}. Send a shorter turn."
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"{what} contains invalid Unicode (a lone surrogate at position {exc.start}). Send valid UTF-8 text."
    bad = _CONTROL.search(text)
    if bad:
        return (f"{what} contains the control character U+{ord(bad.group()):04X} at position {bad.start()}. "
                "Remove control characters and send the turn again.")
    return None


def _call_from_json(obj: Any, where: str) -> ToolCall | str:
    """A ToolCall from a decoded JSON object, or an error string."""
    if not isinstance(obj, dict):
        return f"{where} must be a JSON object like {{\"name\": \"tool_name\", \"arguments\": {{...}}}}."
    if "name" not in obj:
        return f"{where} has no \"name\" field. Use {{\"name\": \"tool_name\", \"arguments\": {{...}}}}."
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return f"the \"arguments\" of {where} are a string that is not valid JSON ({exc.msg} at position {exc.pos})."
    extra = set(obj) - {"name", "arguments", "parameters", "id", "type"}
    if extra:
        return f"{where} has unexpected field(s) {sorted(extra)}; only \"name\" and \"arguments\" are allowed."
    return ToolCall(name=obj["name"], arguments=args, id=str(obj.get("id", "")))


def _decode(payload: str, where: str) -> Any:
    try:
        return json.loads(payload)
    except json.JSONDecodeError as exc:
        return ValueError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}).")


def _parse_text(text: str) -> ParsedAction:
    problem = _check_text(text, "Your turn")
    if problem:
        return _reject(problem)
    visible = _THINK.sub("", text).strip()
    if not visible:
        return _reject("Your turn is empty. Reply to the user in text, or call a tool with a <tool_call> block.")

    opens, closes = visible.count(_OPEN), visible.count(_CLOSE)
    if opens or closes:
        if opens != closes:
            return _reject(f"Your turn has {opens} <tool_call> and {closes} </tool_call> tags; every "
                           "<tool_call> needs its own </tool_call>.")
        blocks = []
        pos = 0
        for _ in range(opens):
            start = visible.index(_OPEN, pos)
            end = visible.find(_CLOSE, start)
            if end < 0 or _OPEN in visible[start + len(_OPEN):end]:
                return _reject("Your <tool_call> blocks are nested or out of order. Write one "
                               "<tool_call>{...}</tool_call> block.")
            blocks.append(visible[start + len(_OPEN):end].strip())
            pos = end + len(_CLOSE)
        calls = []
        for i, block in enumerate(blocks):
            where = "the <tool_call> block" if len(blocks) == 1 else f"<tool_call> block {i + 1}"
            fenced = _FENCE.match(block)
            decoded = _decode(fenced.group(1) if fenced else block, where)
            if isinstance(decoded, ValueError):
                return _reject(f"{decoded} Write {{\"name\": \"tool_name\", \"arguments\": {{...}}}} inside the tags.")
            call = _call_from_json(decoded, where)
            if isinstance(call, str):
                return _reject(call)
            calls.append(call)
        # Text around the blocks (reasoning, preambles) is kept as the message content; it is not
        # sent to the user, and the calls themselves live in tool_calls (the OpenAI format).
        content = visible
        for block_start in range(opens):
            start = content.index(_OPEN)
            end = content.index(_CLOSE, start) + len(_CLOSE)
            content = content[:start] + content[end:]
        return ParsedAction(content=content.strip(), tool_calls=calls)

    fenced = _FENCE.match(visible)
    candidate = fenced.group(1).strip() if fenced else visible
    if candidate.startswith("{") and candidate.endswith("}"):
        decoded = _decode(candidate, "Your JSON tool call")
        if isinstance(decoded, ValueError):
            return _reject(f"{decoded} To call a tool send {{\"name\": \"tool_name\", \"arguments\": {{...}}}}; "
                           "to talk to the user send plain text.")
        call = _call_from_json(decoded, "your JSON tool call")
        if isinstance(call, str):
            return _reject(call)
        return ParsedAction(content="", tool_calls=[call])
    return ParsedAction(content=visible)


def _parse_message(message: dict) -> ParsedAction:
    role = message.get("role", "assistant")
    if role != "assistant" or not ({"content", "tool_calls"} & set(message)):
        return _reject("A dict action must be an OpenAI assistant message: {\"role\": \"assistant\", "
                       "\"content\": \"...\"} or with \"tool_calls\": [...].")
    content = message.get("content") or ""
    if not isinstance(content, str):
        if isinstance(content, list):  # OpenAI content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        else:
            return _reject(f"The message's \"content\" must be a string, got {type(content).__name__}.")
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return _reject("The message's \"tool_calls\" must be a list.")
    if not raw_calls:
        return _parse_text(content)
    problem = _check_text(content, "The message content")
    if problem:
        return _reject(problem)
    calls = []
    for i, raw in enumerate(raw_calls):
        where = f"tool_calls[{i}]"
        fn = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(fn, dict):
            return _reject(f"{where} must look like {{\"type\": \"function\", \"function\": "
                           "{\"name\": ..., \"arguments\": \"{...}\"}}.")
        call = _call_from_json({k: v for k, v in fn.items() if k in ("name", "arguments")}, where)
        if isinstance(call, str):
            return _reject(call)
        call.id = str(raw.get("id", ""))
        calls.append(call)
    return ParsedAction(content=_THINK.sub("", content).strip(), tool_calls=calls)


def parse_action(action: Any) -> ParsedAction:
    """Read one agent turn (any of the four shapes); never raises."""
    try:
        if isinstance(action, str):
            return _parse_text(action)
        if isinstance(action, dict):
            return _parse_message(action)
        if isinstance(action, bytes):
            try:
                return _parse_text(action.decode("utf-8"))
            except UnicodeDecodeError:
                return _reject("Your turn is bytes that are not valid UTF-8. Send text.")
        return _reject(f"An action must be text or an OpenAI assistant message dict, got {type(action).__name__}.")
    except RecursionError:
        return _reject("Your turn is nested too deeply to read. Send a flat JSON tool call.")
