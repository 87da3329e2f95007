"""One action parser for every TRACE environment.

An agent's turn arrives in one of four shapes (docs/design.md, "The environment contract"):

(a) model text with a Hermes block ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``,
(b) a bare JSON tool call ``{"name": ..., "arguments": ...}`` (optionally in a code fence),
(c) an OpenAI assistant message dict (``{"role": "assistant", "content": ..., "tool_calls": [...]}``),
(d) plain text, which is a message to the user.

:func:`parse_action` turns any of them into a :class:`ParsedAction`. Anything
it cannot read becomes a :class:`ParsedAction` with ``error`` set, phrased so
that the agent can fix its next turn; the parser itself never raises.

The parser is also where hostile input stops, once for every environment: a turn
(or a dict action's JSON size) over :data:`MAX_ACTION_CHARS`, control characters,
lone surrogates (raw, or written as a JSON escape such as ``"\\ud800"`` in an
argument, a key, a tool name or an id), JSON nested deeper than
:data:`MAX_JSON_DEPTH`, integers longer than :data:`MAX_INT_DIGITS` digits and
non-JSON objects in a dict action are all rejected here, so that nothing behind
the parser (validation, tools, the transcript, trajectory files) ever sees them.
Non-finite numbers (``NaN``, ``Infinity``, ``1e999``) are valid JSON to Python and
are rejected later, by schema validation, wherever a number is expected.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

#: Turns longer than this are rejected rather than parsed (a runaway generation). For a dict action
#: the size is that of its JSON text, so a multi-megabyte tool name or id cannot slip through.
MAX_ACTION_CHARS = 65_536
#: JSON nested deeper than this is rejected: real tool arguments are a few levels deep, and deeper
#: data would only exhaust the recursion of whatever reads it next (validation, ``json.dumps``).
MAX_JSON_DEPTH = 64
#: Integers with more digits than this are rejected (Python refuses to convert beyond 4,300 digits).
MAX_INT_DIGITS = 1_000

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


def _surrogate(text: str) -> str | None:
    """The first lone surrogate in ``text`` as a ``\\uXXXX`` escape, or None if ``text`` is well-formed."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(text[exc.start]):04x}"
    return None


def _json_problem(value: Any, where: str) -> str | None:
    """Why ``value`` is not JSON data the environment can safely keep, or None.

    Decoded JSON can still hold what no tool, transcript or trajectory file can take: a lone surrogate
    written as an escape (``"\\ud800"``, which no UTF-8 writer can encode), nesting thousands deep, or
    (in a dict action built in Python) non-JSON objects, non-string keys and multi-megabyte strings.
    The walk is iterative, so depth itself cannot exhaust the stack.
    """
    size = 0
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, path, depth = stack.pop()
        at = f"{where} (at {path.lstrip('.')})" if path else where
        if depth > MAX_JSON_DEPTH:
            return (f"{where} is nested too deeply (more than {MAX_JSON_DEPTH} levels of arrays/objects). "
                    "Send a flat JSON tool call.")
        if isinstance(item, str):
            size += len(item)
            bad = _surrogate(item)
            if bad:
                return (f"{at} contains a lone surrogate ({bad}), which is not valid Unicode. Write the "
                        "character itself, or a complete surrogate pair.")
        elif isinstance(item, bool) or item is None:
            size += 4
        elif isinstance(item, int):
            # bit_length avoids converting a huge int to text just to count its digits
            digits = int(item.bit_length() * 0.30103) + 1
            if digits > MAX_INT_DIGITS:
                return f"{at} is an integer with about {digits:,} digits; the limit is {MAX_INT_DIGITS:,}."
            size += digits
        elif isinstance(item, float):
            size += 24
        elif isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    return f"{at} has a key {key!r:.60} that is not a string; JSON object keys are strings."
                bad = _surrogate(key)
                if bad:
                    return (f"{at} has a key with a lone surrogate ({bad}), which is not valid Unicode. Write "
                            "the character itself, or a complete surrogate pair.")
                size += len(key) + 2
                stack.append((child, f"{path}.{key[:40]}", depth + 1))
        elif isinstance(item, list):
            size += 2 + len(item)
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        else:
            return f"{at} is a {type(item).__name__}, which is not JSON data (use strings, numbers, lists, objects)."
        if size > MAX_ACTION_CHARS:
            return f"{where} is longer than {MAX_ACTION_CHARS:,} characters as JSON. Send a shorter turn."
    return None


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooManyDigits(len(text.lstrip("-")))
    return int(text)


class _TooManyDigits(ValueError):
    def __init__(self, digits: int):
        super().__init__(f"contains an integer with {digits:,} digits; the limit is {MAX_INT_DIGITS:,}")


def _loads(payload: str) -> Any:
    """``json.loads`` that refuses integers too long to handle (instead of a ValueError from deep inside)."""
    return json.loads(payload, parse_int=_parse_int)


def _call_from_json(obj: Any, where: str) -> ToolCall | str:
    """A ToolCall from a decoded JSON object, or an error string."""
    if not isinstance(obj, dict):
        return f"{where} must be a JSON object like {{\"name\": \"tool_name\", \"arguments\": {{...}}}}."
    if "name" not in obj:
        return f"{where} has no \"name\" field. Use {{\"name\": \"tool_name\", \"arguments\": {{...}}}}."
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = _loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return f"the \"arguments\" of {where} are a string that is not valid JSON ({exc.msg} at position {exc.pos})."
        except _TooManyDigits as exc:
            return f"the \"arguments\" of {where} {exc}."
        except RecursionError:
            return f"the \"arguments\" of {where} are nested too deeply to read. Send a flat JSON object."
        problem = _json_problem(args, f"the \"arguments\" of {where}")
        if problem:
            return problem
    extra = set(obj) - {"name", "arguments", "parameters", "id", "type"}
    if extra:
        return f"{where} has unexpected field(s) {sorted(extra)}; only \"name\" and \"arguments\" are allowed."
    return ToolCall(name=obj["name"], arguments=args, id=str(obj.get("id", "")))


def _decode(payload: str, where: str) -> Any:
    """The decoded JSON, or a ValueError whose message says what is wrong (shown to the agent)."""
    try:
        decoded = _loads(payload)
    except json.JSONDecodeError as exc:
        return ValueError(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}).")
    except _TooManyDigits as exc:
        return ValueError(f"{where} {exc}.")
    except RecursionError:
        return ValueError(f"{where} is nested too deeply to read.")
    problem = _json_problem(decoded, where)
    return ValueError(problem) if problem else decoded


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


def _content_text(content: Any) -> str | ParsedAction:
    """A message's ``content`` as text: a string, None, or a list of OpenAI content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return _reject(f"The message's \"content\" must be a string, got {type(content).__name__}.")
    texts = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            return _reject(f"content part {i} must be an object like {{\"type\": \"text\", \"text\": \"...\"}}, "
                           f"got {type(part).__name__}.")
        text = part.get("text", "")
        if not isinstance(text, str):
            return _reject(f"the \"text\" of content part {i} must be a string, got {type(text).__name__}.")
        texts.append(text)
    return "".join(texts)


def _parse_message(message: dict) -> ParsedAction:
    role = message.get("role", "assistant")
    if role != "assistant" or not ({"content", "tool_calls"} & set(message)):
        return _reject("A dict action must be an OpenAI assistant message: {\"role\": \"assistant\", "
                       "\"content\": \"...\"} or with \"tool_calls\": [...].")
    # A dict never went through the text checks, so check the whole of it once: size, depth, Unicode.
    problem = _json_problem(message, "The message")
    if problem:
        return _reject(problem)
    content = _content_text(message.get("content"))
    if isinstance(content, ParsedAction):
        return content
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
    except Exception as exc:  # the contract is "never raises": a parser bug becomes an error the agent sees
        logger.exception("parse_action failed on a %s action", type(action).__name__)
        return _reject(f"Your turn could not be read ({type(exc).__name__}). Send plain text, or one "
                       "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> block.")
