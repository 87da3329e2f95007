"""The environment core: base class, text space, tools, action parsing, conversations, registry, checker."""

from .env import PlannedPolicy, TraceEnv, canonical_hash
from .parsing import ParsedAction, ToolCall, parse_action
from .registry import EnvEntry, RegistryError, get_entry, load_registry, read_registry, registered
from .spaces import UnicodeText
from .tools import EnvError, ToolError, ToolResult, ToolSet, tool

__all__ = [
    "EnvEntry", "EnvError", "ParsedAction", "PlannedPolicy", "RegistryError", "ToolCall", "ToolError", "ToolResult", "ToolSet", "TraceEnv",
    "UnicodeText", "canonical_hash", "get_entry", "load_registry", "parse_action", "read_registry", "registered",
    "tool",
]
