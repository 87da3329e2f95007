"""The tool system: typed, documented methods become OpenAI function schemas.

A tool is a plain method decorated with :func:`tool`. Its type hints give the
JSON schema of its arguments and its Google-style docstring gives the
descriptions, so the code is the single source of truth for what the model
sees. :class:`ToolSet` validates a call's arguments against that schema and
turns every failure — unknown tool, wrong type, missing argument, a
precondition the tool itself checks (:class:`ToolError`) — into an error
message the agent can read and act on. Nothing raises out of a call.

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``Literal[...]``,
``list[T]``, ``dict[str, T]``, ``T | None`` and ``TypedDict`` classes (nested
objects such as τ²-bench's ``flights[{flight_number, date}]``).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, get_args, get_origin

logger = logging.getLogger(__name__)

#: Tool outputs longer than this are cut, with a note telling the agent so.
DEFAULT_MAX_OUTPUT_CHARS = 20_000


class ToolError(Exception):
    """Raised inside a tool when the call is well-formed but cannot be done.

    The message is shown to the agent verbatim (prefixed with ``Error:``), so
    write it for the agent: say what was wrong and what would work.
    """


class EnvError(Exception):
    """Raised from a tool, a hook or the evaluation when the environment's own infrastructure failed — an
    image that cannot be built, a Docker engine that does not answer, a container that died — never for
    anything the agent did (that is a :class:`ToolError`).

    It ends the episode with termination ``env_error`` and the message in ``info["env_error"]``, so that a
    failure of the machine is never scored as a failure of the agent: rollouts count such episodes apart,
    GRPO leaves them out of its groups, and evaluation reruns them.
    """


@dataclass(frozen=True)
class ToolMeta:
    name: str | None = None
    write: bool = False


def tool(fn: Callable | None = None, *, name: str | None = None, write: bool = False):
    """Mark a method as a tool.

    Args:
        fn: the method (when used as ``@tool`` without arguments).
        name: the tool's name if it differs from the method's.
        write: whether the tool changes the environment's state (used by
            evaluators and by the write-before-confirmation checks).
    """

    def mark(f: Callable) -> Callable:
        f.__trace_tool__ = ToolMeta(name=name, write=write)
        return f

    return mark(fn) if fn is not None else mark


# ---------------------------------------------------------------- docstrings

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?|Attributes):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


def parse_google_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {arg: description})."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for raw in lines:
        stripped = raw.strip()
        match = _SECTION.match(stripped)
        if match and not raw.startswith(" "):
            section, current, arg_indent = match.group(1), None, None
            continue
        if section is None:
            description.append(stripped)
        elif section in ("Args", "Arguments", "Parameters", "Attributes"):
            if not stripped:
                continue
            indent = len(raw) - len(raw.lstrip())
            m = _ARG_LINE.match(stripped)
            if m and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = m.group(1).lstrip("*")
                args[current] = m.group(3).strip()
            elif current is not None:
                args[current] = (args[current] + " " + stripped).strip()
    text = "\n".join(description).strip()
    # Collapse hard-wrapped paragraphs into single lines; keep paragraph breaks.
    text = "\n\n".join(" ".join(p.split()) for p in text.split("\n\n"))
    return text, args


# ---------------------------------------------------------------- schemas

_PRIMITIVES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__required_keys__")


def annotation_schema(tp: Any) -> dict:
    """The JSON schema of a Python annotation (see the module docstring for what is supported)."""
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if tp is Any:
        return {}
    origin = get_origin(tp)
    if origin is Literal:
        values = list(get_args(tp))
        kinds = {type(v) for v in values}
        schema: dict[str, Any] = {"enum": values}
        if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
            schema = {"type": _PRIMITIVES[next(iter(kinds))], "enum": values}
        return schema
    if origin in (typing.Union, types.UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        nullable = len(members) != len(get_args(tp))
        if len(members) == 1:
            schema = dict(annotation_schema(members[0]))
        else:
            schema = {"anyOf": [annotation_schema(m) for m in members]}
        if nullable:
            if "type" in schema and isinstance(schema["type"], str):
                schema["type"] = [schema["type"], "null"]
            else:
                schema = {"anyOf": [schema, {"type": "null"}]}
        return schema
    if origin in (list, typing.List) or tp is list:
        args = get_args(tp)
        return {"type": "array", "items": annotation_schema(args[0])} if args else {"type": "array"}
    if origin in (dict, typing.Dict) or tp is dict:
        args = get_args(tp)
        if len(args) == 2 and args[1] is not Any:
            return {"type": "object", "additionalProperties": annotation_schema(args[1])}
        return {"type": "object"}
    if _is_typeddict(tp):
        hints = typing.get_type_hints(tp)
        _, field_docs = parse_google_docstring(tp.__doc__)
        props = {}
        for key, hint in hints.items():
            props[key] = annotation_schema(hint)
            if key in field_docs:
                props[key]["description"] = field_docs[key]
        return {
            "type": "object",
            "properties": props,
            "required": [k for k in hints if k in tp.__required_keys__],
            "additionalProperties": False,
        }
    raise TypeError(f"unsupported tool argument annotation: {tp!r}")


@dataclass
class ToolSpec:
    """One tool: its name, the method that implements it, and its schema."""

    name: str
    attr: str
    description: str
    parameters: dict
    write: bool
    required: tuple[str, ...]
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def openai_schema(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def signature_text(self) -> str:
        """A compact human-readable signature, used in error messages."""
        parts = []
        for arg, schema in self.parameters["properties"].items():
            optional = "" if arg in self.required else " (optional)"
            parts.append(f"{arg}: {_type_name(schema)}{optional}")
        return f"{self.name}({', '.join(parts)})"


def spec_from_function(fn: Callable, meta: ToolMeta | None = None) -> ToolSpec:
    """Build a :class:`ToolSpec` from a function's signature and docstring."""
    meta = meta or getattr(fn, "__trace_tool__", ToolMeta())
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    description, arg_docs = parse_google_docstring(fn.__doc__)
    props: dict[str, dict] = {}
    required: list[str] = []
    defaults: dict[str, Any] = {}
    for pname, param in sig.parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if pname not in hints:
            raise TypeError(f"tool {fn.__qualname__}: argument {pname!r} needs a type hint")
        schema = dict(annotation_schema(hints[pname]))
        if pname in arg_docs:
            schema["description"] = arg_docs[pname]
        props[pname] = schema
        if param.default is inspect.Parameter.empty:
            required.append(pname)
        else:
            defaults[pname] = param.default
    missing_docs = [p for p in props if "description" not in props[p]]
    if missing_docs:
        raise TypeError(f"tool {fn.__qualname__}: document argument(s) {missing_docs} in an 'Args:' section")
    if not description:
        raise TypeError(f"tool {fn.__qualname__}: needs a docstring describing what it does")
    return ToolSpec(
        name=meta.name or fn.__name__,
        attr=fn.__name__,
        description=description,
        parameters={"type": "object", "properties": props, "required": required, "additionalProperties": False},
        write=meta.write,
        required=tuple(required),
        defaults=defaults,
    )


_SPEC_CACHE: dict[type, dict[str, ToolSpec]] = {}


def tool_specs(cls: type) -> dict[str, ToolSpec]:
    """All tools of a class, in definition order (base classes first); cached per class."""
    cached = _SPEC_CACHE.get(cls)
    if cached is not None:
        return cached
    specs: dict[str, ToolSpec] = {}
    seen: set[str] = set()
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            meta = getattr(value, "__trace_tool__", None)
            if meta is None:
                # An override without @tool keeps the base class's tool status.
                continue
            spec = spec_from_function(value, meta)
            if spec.name in specs and attr not in seen:
                raise TypeError(f"{cls.__name__}: two tools are named {spec.name!r}")
            specs[spec.name] = spec
            seen.add(attr)
    _SPEC_CACHE[cls] = specs
    return specs


# ---------------------------------------------------------------- validation

def _type_name(schema: dict) -> str:
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    t = schema.get("type")
    if isinstance(t, list):
        return " or ".join(t)
    if t == "array" and "items" in schema:
        return f"array of {_type_name(schema['items'])}"
    if t == "object" and "properties" in schema:
        return "object {" + ", ".join(schema["properties"]) + "}"
    if "anyOf" in schema:
        return " or ".join(_type_name(s) for s in schema["anyOf"])
    return t or "any value"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _describe(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return f"{_json_type(value)} {_shorten(text)}"


def _shorten(text: str, limit: int = 60) -> str:
    """What an error message echoes of the agent's input: enough to recognise it, never megabytes."""
    return text[:limit] + "…" if len(text) > limit else text


#: An error lists at most this many argument problems (a call with thousands of bad keys gets a short reply).
MAX_PROBLEMS_SHOWN = 10


def _matches_type(value: Any, expected: str) -> bool:
    actual = _json_type(value)
    return actual == expected or (expected == "number" and actual == "integer")


def validate_value(value: Any, schema: dict, path: str, problems: list[str]) -> None:
    """Append to ``problems`` every way ``value`` violates ``schema`` (a JSON-schema subset)."""
    if "anyOf" in schema:
        for option in schema["anyOf"]:
            trial: list[str] = []
            validate_value(value, option, path, trial)
            if not trial:
                return
        problems.append(f"{path} must be {_type_name(schema)}, got {_describe(value)}")
        return
    expected = schema.get("type")
    if expected is not None:
        allowed = expected if isinstance(expected, list) else [expected]
        if not any(_matches_type(value, t) for t in allowed):
            problems.append(f"{path} must be {_type_name(schema)}, got {_describe(value)}")
            return
    if isinstance(value, float) and not math.isfinite(value):
        # JSON's NaN / Infinity / 1e999 decode to non-finite floats; no tool means them as a number.
        problems.append(f"{path} must be a finite number, got {value}")
        return
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path} must be {_type_name(schema)}, got {_describe(value)}")
        return
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            validate_value(item, schema["items"], f"{path}[{i}]", problems)
    elif isinstance(value, dict) and "object" in (expected if isinstance(expected, list) else [expected]):
        # (also for nullable objects, whose "type" is ["object", "null"])
        props = schema.get("properties")
        if props is not None:
            for key in schema.get("required", ()):
                if key not in value:
                    problems.append(f"{path}.{key} is missing (expected {_type_name(props[key])})")
            for key, item in value.items():
                if key in props:
                    validate_value(item, props[key], f"{path}.{key}", problems)
                elif schema.get("additionalProperties") is False:
                    problems.append(f"{path} has an unexpected field {key!r} (allowed: {', '.join(props)})")
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                validate_value(item, schema["additionalProperties"], f"{path}.{key}", problems)


def validate_arguments(spec: ToolSpec, arguments: dict) -> list[str]:
    """Problems with a call's arguments, each phrased so the agent can fix it."""
    problems: list[str] = []
    props = spec.parameters["properties"]
    for name in spec.required:
        if name not in arguments:
            problems.append(f"missing required argument {name!r} ({_type_name(props[name])})")
    for name, value in arguments.items():
        schema = props.get(name)
        if schema is None:
            problems.append(f"unexpected argument {name!r}")
        else:
            validate_value(value, schema, name, problems)
    return problems


# ---------------------------------------------------------------- calling

@dataclass
class ToolResult:
    """What one tool call produced: the text the agent sees, and whether it succeeded."""

    name: str
    content: str
    ok: bool
    write: bool = False
    value: Any = None


def serialize_output(value: Any) -> str:
    """Turn a tool's return value into the text of a tool message."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


def truncate(text: str, limit: int) -> str:
    """Cut ``text`` to ``limit`` characters with a note the agent can read."""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… [output truncated: {len(text) - limit} more characters]"


def _first_sentence(text: str) -> str:
    first = text.split("\n\n", 1)[0]
    match = re.search(r"(?<=[.!?])\s", first)
    return first[:match.start()] if match else first


def _strip_descriptions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_descriptions(v) for k, v in schema.items()
                if k != "description" and not (k == "additionalProperties" and v is False)}
    if isinstance(schema, list):
        return [_strip_descriptions(v) for v in schema]
    return schema


def compact_schema(openai_schema: dict) -> dict:
    """A short form of a tool's schema: the first sentence of its description, no argument descriptions,
    no ``"additionalProperties": false``.

    Argument names, types, enums and required fields are kept. Calls are still validated against the
    full schema (unknown arguments are rejected either way); the short form only changes what the
    model reads (the airline tool list: 5,867 characters instead of 6,456 with the ``false`` flags).
    """
    fn = openai_schema["function"]
    return {"type": "function", "function": {"name": fn["name"], "description": _first_sentence(fn["description"]),
                                             "parameters": _strip_descriptions(fn["parameters"])}}


_TOOLSET_CACHE: dict[tuple[type, tuple[str, ...], bool], tuple[dict, list, dict]] = {}


class ToolSet:
    """The tools of one provider object (an env, or a toolkit such as a domain's tools).

    Args:
        provider: the object whose ``@tool`` methods are the tools.
        max_output_chars: tool outputs longer than this are truncated.
        exclude: tool names to leave out (e.g. a capability env hiding a tool).
        compact: show short schemas (see :func:`compact_schema`) — for small models whose context
            cannot hold every description. Validation is the same either way.
    """

    def __init__(self, provider: Any, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS, exclude: tuple[str, ...] = (),
                 compact: bool = False):
        self.provider = provider
        self.max_output_chars = max_output_chars
        key = (type(provider), tuple(exclude), compact)
        cached = _TOOLSET_CACHE.get(key)
        if cached is None:
            all_specs = tool_specs(type(provider))
            specs = {n: s for n, s in all_specs.items() if n not in exclude} if exclude else all_specs
            schemas = [compact_schema(s.openai_schema) if compact else s.openai_schema for s in specs.values()]
            cached = _TOOLSET_CACHE[key] = (specs, schemas, {})
        # Shared by every ToolSet of the same class (reset builds one per episode): treat as read-only.
        self.specs, self.schemas, self._rendered = cached

    def prompt_block(self) -> str:
        """The tool list as Hermes ``<tools>`` text (rendered once per provider class)."""
        text = self._rendered.get("block")
        if text is None:
            from .conversation import tools_block

            text = self._rendered["block"] = tools_block(self.schemas)
        return text

    @property
    def names(self) -> list[str]:
        return list(self.specs)

    def is_write(self, name: str) -> bool:
        spec = self.specs.get(name)
        return bool(spec and spec.write)

    def error(self, name: str, message: str, write: bool = False) -> ToolResult:
        return ToolResult(name=name, content=f"Error: {message}", ok=False, write=write)

    def check(self, name: Any, arguments: Any) -> ToolResult | None:
        """An error result if the call cannot be made as written, else ``None``."""
        if not isinstance(name, str) or name not in self.specs:
            available = ", ".join(self.specs) or "(none)"
            shown = _shorten(name, 100) if isinstance(name, str) else _describe(name)
            return self.error(shown, f"unknown tool {shown!r}. Available tools: {available}.")
        spec = self.specs[name]
        if not isinstance(arguments, dict):
            return self.error(name, f"the arguments of {name} must be a JSON object, got {_describe(arguments)}. "
                                    f"Expected: {spec.signature_text()}", spec.write)
        try:
            problems = validate_arguments(spec, arguments)
        except (RecursionError, ValueError) as exc:  # arguments nested or sized beyond what can be read
            problems = [f"the arguments could not be checked ({type(exc).__name__}); send flat JSON values"]
        if problems:
            shown = problems[:MAX_PROBLEMS_SHOWN]
            if len(problems) > len(shown):
                shown.append(f"and {len(problems) - len(shown)} more")
            return self.error(name, f"invalid arguments for {name}: " + "; ".join(shown)
                              + f". Expected: {spec.signature_text()}", spec.write)
        return None

    def call(self, name: Any, arguments: Any) -> ToolResult:
        """Validate and run one call; never raises, except :class:`EnvError` (the env ends the episode)."""
        rejected = self.check(name, arguments)
        if rejected is not None:
            return rejected
        spec = self.specs[name]
        try:
            value = getattr(self.provider, spec.attr)(**arguments)
        except ToolError as exc:
            return self.error(name, str(exc), spec.write)
        except EnvError:
            raise  # the env ends the episode with env_error: not the agent's failure, not a tool result
        except Exception as exc:  # a bug in a tool must not crash the episode
            logger.warning("tool %s raised %r", name, exc, exc_info=True)
            return self.error(name, f"the tool failed unexpectedly ({type(exc).__name__}: {exc}).", spec.write)
        return ToolResult(name=name, content=truncate(serialize_output(value), self.max_output_chars),
                          ok=True, write=spec.write, value=value)
