"""What every config of ``trace_train`` shares: one :class:`ConfigError`, and building a section dataclass from a
YAML mapping with errors that name the key and the fix.

It sits at the bottom of ``trace_train`` (it imports nothing of it), so that ``train/`` and ``backends/`` check
their own settings without importing ``pipeline/`` above them (docs/design.md, "Layout").
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot be used (a ``trace run`` section, a ``TrainConfig`` field, the ``ray:`` section);
    the message names the key and the fix."""


def _choice(key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}")


def _at_least(key: str, value: Any, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} must be >= {low}, got {value}")


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a YAML value fits a field's type hint (ints are accepted for floats)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is not None:
        hint = origin
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(origin or hint, "__name__", str(hint))


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping of keys to values, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(names)}"
            raise ConfigError(f"{full}: unknown key; {hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, f"{full}.")
            continue
        if not _type_ok(value, hint):
            raise ConfigError(f"{full} must be {_type_name(hint)}, got {value!r} ({type(value).__name__})")
        kwargs[key] = value
    return cls(**kwargs)


__all__ = ["ConfigError", "_at_least", "_build", "_choice", "_type_name", "_type_ok"]
