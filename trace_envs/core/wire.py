"""The wire protocol between a proxy env and the process that hosts the real env.

One message is one JSON object on one line (UTF-8, ``\\n``-terminated). The payloads are
transport-agnostic: the sandboxed worker of generated envs reads and writes them on a pair of
pipes (:mod:`trace_envs.core.sandboxed`), and a network server can carry the very same objects in
WebSocket frames or HTTP bodies.

Requests (``{"id": n, "op": ..., ...}``) and what their replies carry in ``result``:

``init``    ``{"module", "cls", "kwargs", "render_mode", "clock_shift_s", "random_seed"}`` →
            ``{"observation_space", "action_space", "metadata"}`` (space descriptors, :func:`space_to_wire`)
``spaces``  ``{}`` → the same descriptors as ``init``'s reply
``describe`` ``{}`` → ``{"name", "doc", "hint_text", "init_params", "var_keyword"}`` (the env class)
``reset``   ``{"seed", "options"}`` → ``{"observation", "info", "task_info", "rng"}``
``step``    ``{"action"}`` → ``{"observation", "reward", "terminated", "truncated", "info", "rng"}``
            (``rng``: the env's ``np_random`` state, which the proxy's follows)
``query``   ``{"what": "task_fingerprint" | "task_info" | "task_spec" | "write_tools" | "tool_defaults" |
            "open_resources" | "render"}``
            → ``{"value"}``
``policy``  ``{"kind": "oracle" | "tau_scripted" | "agent", "args": {...}}`` → ``{"handle"}``: a scripted
            policy built inside the host for the current episode (the env's own oracle, or a reference
            agent that reads the hidden task). It is trusted only to produce actions.
``act``     ``{"handle"}`` → ``{"action"}``: that policy's action for the current state.
``close``   ``{}`` → ``{}``

Replies are ``{"id": n, "ok": true, "result": {...}}`` or ``{"id": n, "ok": false, "error": "..."}``.

``info`` travels as a delta: ``{"messages_from": k, "messages": [...], "tools": [...] | absent,
"extra": {...}}`` — the transcript's messages from index ``k`` on (the receiver keeps the earlier ones),
the tool schemas only when they changed, and every other info key in ``extra``.

Values JSON cannot carry as they are (integers past the interpreter's digit limit, nesting deeper than
the encoder's recursion limit, mappings with non-string keys, tuples, other objects) are sent as a
flat node table, ``{"__wire__": "graph", "nodes": [...]}``, and rebuilt without recursion on the other
side, so that a hostile action reaches the env exactly as the agent produced it.
"""

from __future__ import annotations

import json
from typing import Any

#: Largest message accepted (bytes); a longer line is a protocol error.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
OPS = ("init", "spaces", "describe", "reset", "step", "query", "policy", "act", "close")
QUERIES = ("task_fingerprint", "task_info", "task_spec", "write_tools", "tool_defaults", "open_resources", "render")
POLICY_KINDS = ("oracle", "tau_scripted", "agent")


class WireError(ValueError):
    """A message that does not follow the protocol (malformed, too long, wrong shape)."""


# ------------------------------------------------------------------------------------------------ values
class Opaque:
    """Stands in for an object the wire cannot carry (its type and ``repr`` only)."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __repr__(self) -> str:
        return self.text

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Opaque) and (self.type_name, self.text) == (other.type_name, other.text)


def _graph(value: Any) -> dict:
    """``value`` as a flat node table (iterative: no recursion limit, no digit limit)."""
    nodes: list[Any] = []
    memo: dict[int, int] = {}
    keep: list[Any] = []  # keeps ids stable while encoding

    def ref(v: Any) -> int:
        if type(v).__module__ == "numpy" and hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
            v = v.item()  # a numpy scalar crosses as the Python number it holds
        if isinstance(v, (dict, list, tuple)) and id(v) in memo:
            return memo[id(v)]
        i = len(nodes)
        nodes.append(None)
        if isinstance(v, (dict, list, tuple)):
            memo[id(v)] = i
            keep.append(v)
            stack.append((i, v))
        elif v is None or isinstance(v, (bool, str)):
            nodes[i] = ["v", v]
        elif isinstance(v, int):
            nodes[i] = ["i", format(v, "x")]  # hex is not subject to the decimal digit limit
        elif isinstance(v, float):
            nodes[i] = ["f", repr(v)]
        else:
            try:
                text = repr(v)[:10_000]
            except Exception:  # noqa: BLE001 - an object whose repr fails still crosses the wire
                text = f"<{type(v).__name__}>"
            nodes[i] = ["o", type(v).__name__, text]
        return i

    stack: list[tuple[int, Any]] = []
    ref(value)
    while stack:
        i, v = stack.pop()
        if isinstance(v, dict):
            nodes[i] = ["d", [[ref(k), ref(x)] for k, x in v.items()]]
        else:
            nodes[i] = ["l" if isinstance(v, list) else "t", [ref(x) for x in v]]
    return {"__wire__": "graph", "nodes": nodes}


def _ungraph(table: dict) -> Any:
    nodes = table.get("nodes")
    if not isinstance(nodes, list) or not nodes:
        raise WireError("a graph value needs a non-empty node list")
    out: list[Any] = [None] * len(nodes)
    for i, node in enumerate(nodes):
        if not isinstance(node, list) or not node:
            raise WireError(f"graph node {i} is malformed")
        tag = node[0]
        if tag == "v":
            out[i] = node[1]
        elif tag == "i":
            out[i] = int(node[1], 16)
        elif tag == "f":
            out[i] = float(node[1])
        elif tag == "o":
            out[i] = Opaque(str(node[1]), str(node[2]))
        elif tag == "d":
            out[i] = {}
        elif tag == "l":
            out[i] = []
        elif tag != "t":
            raise WireError(f"graph node {i} has an unknown tag {tag!r}")
    # Tuples are immutable: build each after its children (iterative post-order; mutable
    # containers already exist and are filled below, so a tuple may hold them before they are full).
    for root, node in enumerate(nodes):
        if node[0] != "t" or out[root] is not None:
            continue
        stack, entered = [root], set()
        while stack:
            i = stack[-1]
            pending = [c for c in nodes[i][1] if nodes[c][0] == "t" and out[c] is None]
            if pending and i not in entered:
                entered.add(i)
                if any(c in entered for c in pending):
                    raise WireError("a graph tuple contains itself")
                stack.extend(pending)
                continue
            stack.pop()
            out[i] = tuple(out[c] for c in nodes[i][1])
    for i, node in enumerate(nodes):
        if node[0] == "d":
            for k, v in node[1]:
                key = out[k]
                try:
                    out[i][key] = out[v]
                except TypeError:  # an unhashable key cannot have come from a real dict
                    raise WireError("a graph mapping has an unhashable key") from None
        elif node[0] == "l":
            out[i].extend(out[c] for c in node[1])
    return out[0]


#: Beyond these, plain JSON cannot carry a value (the decimal digit limit; the encoder's recursion limit).
_MAX_PLAIN_BITS = 12_000
_MAX_PLAIN_DEPTH = 400


def _needs_graph(value: Any) -> bool:
    """Whether plain JSON would fail on ``value`` or change it (one iterative walk, no encoding)."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str) or v is None or isinstance(v, (bool, float)):
            continue
        if isinstance(v, int):
            if v.bit_length() > _MAX_PLAIN_BITS or type(v) is not int:
                return True
            continue
        if depth > _MAX_PLAIN_DEPTH:
            return True
        if type(v) is dict:
            for k, x in v.items():
                if type(k) is not str:
                    return True
                stack.append((x, depth + 1))
        elif type(v) is list:
            stack.extend((x, depth + 1) for x in v)
        else:  # tuples, subclasses, other objects
            return True
    return False


def pack(value: Any) -> Any:
    """``value`` in a form JSON carries exactly (itself when it is plain JSON, else a graph table)."""
    return _graph(value) if _needs_graph(value) else value


def unpack(value: Any) -> Any:
    """The inverse of :func:`pack`."""
    if isinstance(value, dict) and value.get("__wire__") == "graph":
        return _ungraph(value)
    return value


# ------------------------------------------------------------------------------------------------ messages
def encode(message: dict) -> bytes:
    """One message as one line of bytes (lone surrogates pass through, as the agent sent them)."""
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        raise WireError(f"message cannot be encoded: {type(exc).__name__}: {exc}") from None
    data = text.encode("utf-8", "surrogatepass") + b"\n"
    if len(data) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(data):,} bytes exceeds the limit of {MAX_MESSAGE_BYTES:,}")
    return data


def decode(line: bytes) -> dict:
    """One line back into a message; :class:`WireError` when it is not a protocol message."""
    if len(line) > MAX_MESSAGE_BYTES:
        raise WireError(f"message of {len(line):,} bytes exceeds the limit of {MAX_MESSAGE_BYTES:,}")
    try:
        message = json.loads(line.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise WireError(f"not a JSON line: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(message, dict) or not isinstance(message.get("id"), int):
        raise WireError("a message is a JSON object with an integer id")
    return message


def request(msg_id: int, op: str, **fields: Any) -> dict:
    if op not in OPS:
        raise WireError(f"unknown op {op!r}; known: {', '.join(OPS)}")
    return {"id": msg_id, "op": op, **fields}


def reply(msg_id: int, result: dict) -> dict:
    return {"id": msg_id, "ok": True, "result": result}


def error(msg_id: int, text: str) -> dict:
    return {"id": msg_id, "ok": False, "error": str(text)[:20_000]}


# ------------------------------------------------------------------------------------------------ spaces
def space_to_wire(space: Any) -> dict:
    """A space as a descriptor: TRACE's text space, or gymnasium's ``Text`` (others are not carried)."""
    from gymnasium.spaces import Text

    from .spaces import UnicodeText

    if isinstance(space, UnicodeText):
        return {"type": "unicode_text", "min_length": int(space.min_length), "max_length": int(space.max_length)}
    if isinstance(space, Text):
        return {"type": "text", "min_length": int(space.min_length), "max_length": int(space.max_length),
                "charset": "".join(sorted(space.character_set))}
    raise WireError(f"only text spaces cross the wire, got {type(space).__name__}")


def space_from_wire(desc: Any) -> Any:
    """The space a descriptor names (validated: lengths are non-negative integers, min ≤ max)."""
    from gymnasium.spaces import Text

    from .spaces import UnicodeText

    if not isinstance(desc, dict) or desc.get("type") not in ("unicode_text", "text"):
        raise WireError(f"unknown space descriptor {str(desc)[:200]}")
    lo, hi = desc.get("min_length"), desc.get("max_length")
    if not (isinstance(lo, int) and isinstance(hi, int) and not isinstance(lo, bool) and 0 <= lo <= hi <= 10 ** 9):
        raise WireError(f"bad space lengths {lo!r}..{hi!r}")
    if desc["type"] == "unicode_text":
        return UnicodeText(max_length=hi, min_length=lo)
    charset = desc.get("charset")
    if not isinstance(charset, str) or not charset:
        raise WireError("a text space needs a charset")
    return Text(hi, min_length=lo, charset=charset)


# ------------------------------------------------------------------------------------------------ info
class InfoSender:
    """The sending side of ``info`` deltas: remembers what the receiver already holds.

    A message already sent is not sent again as long as the transcript keeps the same message objects
    at the same places (TraceEnv appends); anything else sends the whole transcript again.
    """

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.tools: Any = None

    def clear(self) -> None:
        self.sent, self.tools = [], None

    def delta(self, info: dict) -> dict:
        messages = info.get("messages")
        out: dict = {}
        if isinstance(messages, list):
            n = len(self.sent)
            same = n <= len(messages) and all(a is b for a, b in zip(self.sent, messages))
            start = n if same else 0
            out["messages_from"] = start
            out["messages"] = pack(messages[start:])
            self.sent = list(messages)
        tools = info.get("tools")
        if "tools" in info and not (tools is self.tools or tools == self.tools):
            out["tools"] = pack(tools)
            self.tools = tools
        elif "tools" in info:
            self.tools = tools
        extra = {k: v for k, v in info.items() if k not in ("messages", "tools")}
        if extra:
            out["extra"] = pack(extra)
        out["keys"] = list(info)  # the key order, so that the receiver's dict iterates the same way
        return out


class InfoReceiver:
    """The receiving side: rebuilds each ``info`` dict from the deltas."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.tools: Any = None

    def clear(self) -> None:
        self.messages, self.tools = [], None

    def apply(self, delta: Any) -> dict:
        if not isinstance(delta, dict):
            raise WireError("info must be an object")
        if "messages" in delta:
            start = delta.get("messages_from")
            new = unpack(delta["messages"])
            if not (isinstance(start, int) and 0 <= start <= len(self.messages) and isinstance(new, list)):
                raise WireError("bad transcript delta")
            self.messages = self.messages[:start] + new
        if "tools" in delta:
            self.tools = unpack(delta["tools"])
        extra = unpack(delta.get("extra") or {})
        if not isinstance(extra, dict):
            raise WireError("info extra must be an object")
        keys = delta.get("keys") or []
        if not isinstance(keys, list):
            raise WireError("info keys must be a list")
        info: dict = {}
        for key in keys:
            if key == "messages":
                info["messages"] = list(self.messages)
            elif key == "tools":
                info["tools"] = self.tools
            elif key in extra:
                info[key] = extra[key]
        for key, value in extra.items():
            info.setdefault(key, value)
        return info
