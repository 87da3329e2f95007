"""Helpers for conversations in the OpenAI chat format.

Every TRACE environment keeps its transcript as a list of OpenAI-style
messages (``info["messages"]``) so that any chat template, trainer or API
client can consume it directly.
"""

from __future__ import annotations

import json
from typing import Any


def system_message(content: str) -> dict:
    return {"role": "system", "content": content}


def user_message(content: str) -> dict:
    return {"role": "user", "content": content}


def assistant_message(content: str = "", tool_calls: list[dict] | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def tool_call_entry(call_id: str, name: str, arguments: Any) -> dict:
    """One element of an assistant message's ``tool_calls`` (arguments as a JSON string, as the API sends them)."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False, default=str)},
    }


def tool_message(call_id: str, name: str, content: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


def hermes_tool_call(name: str, arguments: dict) -> str:
    """The text a Hermes/Qwen-style model emits to call a tool."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def tool_response_text(content: str) -> str:
    """How a tool's output is shown to the agent as an observation (Hermes/Qwen format)."""
    return f"<tool_response>\n{content}\n</tool_response>"


def tools_block(schemas: list[dict]) -> str:
    """The tool list as Hermes-style ``<tools>`` text, for agents that only read observations."""
    lines = "\n".join(json.dumps(s, ensure_ascii=False) for s in schemas)
    return f"<tools>\n{lines}\n</tools>"


def tool_calls_of(messages: list[dict]) -> list[tuple[str, dict, str | None]]:
    """Every (tool name, arguments, result content) in a transcript, in order."""
    results = {m.get("tool_call_id"): m.get("content") for m in messages if m.get("role") == "tool"}
    calls = []
    for m in messages:
        for tc in m.get("tool_calls") or ():
            fn = tc["function"]
            try:
                args = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
            except json.JSONDecodeError:
                args = fn["arguments"]
            calls.append((fn["name"], args, results.get(tc.get("id"))))
    return calls


def render_transcript(messages: list[dict], width: int = 2000) -> str:
    """A plain-text rendering of a conversation, for ``render()`` and the CLI."""
    out = []
    for m in messages:
        role = m["role"].upper()
        content = m.get("content") or ""
        if len(content) > width:
            content = content[:width] + " …"
        if m.get("tool_calls"):
            calls = "; ".join(f"{tc['function']['name']}({tc['function']['arguments']})" for tc in m["tool_calls"])
            out.append(f"[{role}] {content}\n  → {calls}".rstrip() if content else f"[{role}] → {calls}")
        elif m["role"] == "tool":
            out.append(f"[TOOL {m.get('name', '')}] {content}")
        else:
            out.append(f"[{role}] {content}")
    return "\n".join(out)


#: The tool through which a trainer's model talks to the simulated user (TRL's tool loop, ``trace serve``'s MCP
#: tools): the env's plain-text message, given a name so that tool-only trainers can send it.
USER_TOOL = "send_message_to_user"


def unwrap_tool_response(observation: str) -> str:
    """The tool's output text from an env observation ``<tool_response>\\n…\\n</tool_response>[notes]``."""
    head, tail = "<tool_response>\n", "\n</tool_response>"
    if observation.startswith(head):
        end = observation.rfind(tail)
        if end >= len(head) - 1:
            return observation[len(head):end] + observation[end + len(tail):]
    return observation
