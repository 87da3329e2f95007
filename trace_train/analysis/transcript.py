"""A trajectory's transcript as a list of events, and the condensed text an analyst (or a model) reads.

The analysis stage sees only what a human analyst would see in a trajectory file: the
conversation (``messages``, OpenAI format), the tool schemas, the reward and the outcome. It never
reads the hidden task (``record["task"]``: scenario, needs): those are the ground truth the method is
checked against, not an input to it. :func:`parse_events` turns the messages into a flat list of
:class:`Event` (user turns, agent turns, tool calls paired with their results), which the offline
labeler's rules walk; :func:`condense` renders a transcript in a compact form that fits a model's
context for the LLM analysis agent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

_ERROR_PREFIX = "Error:"


@dataclass
class Event:
    """One step of a conversation.

    Attributes:
        kind: ``system``, ``user``, ``agent`` (a message to the user) or ``call`` (a tool call and its result).
        text: the message text (user, agent, system), or the raw result text (call).
        name: the tool name (call).
        arguments: the parsed arguments (call); ``None`` when they were not a JSON object.
        raw_arguments: the arguments as the agent sent them.
        result: the parsed JSON result (call), or the result text when it is not JSON.
        error: the error message when the call failed (the result starts with ``Error:``).
        index: position in the event list.
    """

    kind: str
    text: str = ""
    name: str = ""
    arguments: dict | None = None
    raw_arguments: Any = None
    result: Any = None
    error: str | None = None
    index: int = 0

    @property
    def ok(self) -> bool:
        return self.kind == "call" and self.error is None


def _loads(text: Any) -> Any:
    if not isinstance(text, str):
        return text
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        return text


def parse_events(messages: list[dict]) -> list[Event]:
    """The conversation as events; each tool call is paired with its result (by id, else in order)."""
    events: list[Event] = []
    pending: dict[str, Event] = {}
    order: list[Event] = []
    for m in messages or []:
        role = m.get("role")
        content = m.get("content") or ""
        if not isinstance(content, str):  # content parts
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if role == "system":
            events.append(Event("system", content))
        elif role == "user":
            events.append(Event("user", content))
        elif role == "assistant":
            if content.strip():
                events.append(Event("agent", content))
            for i, tc in enumerate(m.get("tool_calls") or []):
                fn = tc.get("function") or {}
                raw = fn.get("arguments")
                args = _loads(raw) if isinstance(raw, str) else raw
                ev = Event("call", name=str(fn.get("name", "")), raw_arguments=raw,
                           arguments=args if isinstance(args, dict) else None)
                events.append(ev)
                pending[str(tc.get("id") or f"_{len(order)}_{i}")] = ev
                order.append(ev)
        elif role == "tool":
            ev = pending.pop(str(m.get("tool_call_id")), None)
            if ev is None:
                ev = next((e for e in order if e.result is None and e.error is None and e.text == ""), None)
            if ev is None:  # a result without a call: keep it visible
                ev = Event("call", name=str(m.get("name", "")))
                events.append(ev)
            ev.text = content
            if content.startswith(_ERROR_PREFIX):
                ev.error = content[len(_ERROR_PREFIX):].strip()
            else:
                ev.result = _loads(content)
    for i, ev in enumerate(events):
        ev.index = i
    return events


def trajectory_id(record: dict, index: int) -> str:
    """A stable, readable id for a trajectory: ``<env short name>/<agent>/s<seed>[.k]`` plus its position."""
    env = str(record.get("env_id", "env")).split("/")[-1]
    seed = record.get("seed")
    sample = record.get("sample")
    tail = f"s{seed}" + (f".{sample}" if sample not in (None, 0) else "")
    return f"t{index:04d}:{env}/{record.get('agent', 'agent')}/{tail}"


def _short(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    text = re.sub(r"\s+", " ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def condense(record: dict, max_chars: int = 4000, result_chars: int = 300, message_chars: int = 400) -> str:
    """A compact transcript: one line per turn, tool results cut to ``result_chars``.

    The system prompt is left out (it is the same for every trajectory of an env); the outcome
    (reward, success, termination) comes first. If the whole is still longer than ``max_chars``,
    the middle of the conversation is elided, keeping its start and its end.
    """
    head = (f"outcome: {'SUCCESS' if record.get('success') else 'FAILURE'} reward={record.get('reward')} "
            f"termination={record.get('termination')}")
    lines = []
    for ev in parse_events(record.get("messages") or []):
        if ev.kind == "user":
            lines.append("USER: " + _short(ev.text, message_chars))
        elif ev.kind == "agent":
            lines.append("AGENT: " + _short(ev.text, message_chars))
        elif ev.kind == "call":
            args = ev.arguments if ev.arguments is not None else ev.raw_arguments
            lines.append(f"CALL {ev.name}({_short(args, message_chars)})")
            lines.append(("ERROR: " + _short(ev.error, result_chars)) if ev.error is not None
                         else "RESULT: " + _short(ev.result if ev.result is not None else ev.text, result_chars))
    body = "\n".join(lines)
    if len(head) + 1 + len(body) > max_chars:
        budget = max(200, max_chars - len(head) - 40)
        keep_head = budget * 2 // 3
        body = body[:keep_head] + "\n[... middle of the conversation elided ...]\n" + body[-(budget - keep_head):]
    return head + "\n" + body
