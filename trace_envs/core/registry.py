"""``registry.yaml``: the list of TRACE environments, registered with Gymnasium.

``import trace_envs`` reads the package's ``registry.yaml`` and every workspace
registry named by ``TRACE_REGISTRY`` (paths separated by ``:``; a path is a
``registry.yaml`` file or a folder holding one) and registers each entry with
Gymnasium, so ``gym.make("trace/<name>-v0")`` works. Users' own and generated
environments live in workspace registries, never in site-packages; a
workspace folder is put on ``sys.path`` so its modules import by name.

Generated entries (``origin: generated:*``) and entries with ``sandbox: true`` are
registered behind the sandboxed-env proxy (:mod:`trace_envs.core.sandboxed`): ``gym.make``
returns a proxy whose module runs in a bubblewrap worker, and this process never imports
the module (it is only located on disk). A generated entry cannot opt out.

A bad entry is rejected with a :class:`RegistryError` naming the file, the
entry and the fix. Entry points are checked cheaply at import time (the
module must exist); ``validate_entry(..., import_entry_point=True)`` and the
conformance checker import them fully.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]*/[a-z][a-z0-9_]*-v\d+$")
#: target: a benchmark-style env the loop improves on; capability: an env that isolates one capability;
#: sanity: a one-turn task whose answer is readable from the prompt, for checking that a trainer learns.
KINDS = ("target", "capability", "sanity")
FIELDS = ("id", "entry_point", "kind", "capability", "target", "max_episode_steps", "requires", "kwargs",
          "origin", "description", "sandbox", "hint")
#: The most characters of a registry ``hint`` (and of any text hint mode puts in a prompt from a registry entry).
HINT_BOUND = 2000
#: The entry point that ``gym.make`` calls for a sandboxed entry (docs/design.md, "Sandboxing").
SANDBOX_ENTRY_POINT = "trace_envs.core.sandboxed:SandboxedEnv"
BUILTIN_REGISTRY = Path(__file__).resolve().parent.parent / "registry.yaml"


class RegistryError(ValueError):
    """A registry file or entry is invalid; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class EnvEntry:
    """One registry entry (see docs/design.md, "registry.yaml")."""

    id: str
    entry_point: str
    kind: str
    description: str
    capability: str | None = None
    target: str | None = None
    max_episode_steps: int | None = None
    requires: tuple[str, ...] = ()
    kwargs: dict = field(default_factory=dict)
    origin: str = "hand-written"
    source: str = ""
    sandbox: bool = False
    hint: str | None = None  # hint mode's text; for a generated env, written by the generator from its spec

    @property
    def module(self) -> str:
        return self.entry_point.split(":", 1)[0]

    @property
    def generated(self) -> bool:
        return self.origin.startswith("generated")

    def load_class(self) -> type:
        """The env class; for a sandboxed entry a proxy class standing in for it, whose ``hint_text`` and
        constructor signature are the env's, read from a worker (its module is never imported here)."""
        if self.sandbox:
            from .sandboxed import stand_in_class

            return stand_in_class(self)
        module_name, _, attr = self.entry_point.partition(":")
        return getattr(importlib.import_module(module_name), attr)


_ENTRIES: dict[str, EnvEntry] = {}


def _fail(source: str, index: int | None, entry_id: Any, problem: str, fix: str) -> RegistryError:
    where = f"{source}" + (f", entry #{index + 1}" if index is not None else "")
    if entry_id:
        where += f" ({entry_id})"
    return RegistryError(f"{where}: {problem}. Fix: {fix}")


def validate_entry(raw: Any, source: str, index: int, import_entry_point: bool = False) -> EnvEntry:
    """Check one raw YAML entry and turn it into an :class:`EnvEntry`."""
    if not isinstance(raw, dict):
        raise _fail(source, index, None, f"an entry must be a mapping, got {type(raw).__name__}",
                    "write the entry as `- id: ns/name-v0` followed by its fields")
    entry_id = raw.get("id")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise _fail(source, index, entry_id, f"unknown field(s) {unknown}", f"use only {', '.join(FIELDS)}")
    for key in ("id", "entry_point", "kind", "description"):
        if not raw.get(key):
            raise _fail(source, index, entry_id, f"missing required field {key!r}", f"add `{key}: ...` to the entry")
    if not isinstance(entry_id, str) or not ID_PATTERN.match(entry_id):
        raise _fail(source, index, entry_id, f"malformed id {entry_id!r}",
                    "ids look like `namespace/snake_case_name-v0` (lowercase, digits, underscores; a version suffix)")
    if raw["kind"] not in KINDS:
        raise _fail(source, index, entry_id, f"unknown kind {raw['kind']!r}", f"kind must be one of {', '.join(KINDS)}")
    ep = raw["entry_point"]
    if not isinstance(ep, str) or not re.match(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", ep):
        raise _fail(source, index, entry_id, f"malformed entry_point {ep!r}",
                    "write it as `package.module:ClassName`")
    module_name, _, attr = ep.partition(":")
    origin = str(raw.get("origin", "hand-written"))
    sandbox = raw.get("sandbox")
    if sandbox is not None and not isinstance(sandbox, bool):
        raise _fail(source, index, entry_id, f"sandbox must be true or false, got {sandbox!r}",
                    "write `sandbox: true` to run the env in a sandboxed worker process")
    if origin.startswith("generated"):
        if sandbox is False:
            raise _fail(source, index, entry_id, "a generated env cannot opt out of the sandbox (sandbox: false)",
                        "remove the `sandbox` field: generated envs always run sandboxed")
        sandbox = True
    sandbox = bool(sandbox)
    if sandbox:
        # Never imported here, nor found by find_spec (which imports the parent packages): only located.
        found = _module_file(module_name, source) is not None
    else:
        try:
            found = importlib.util.find_spec(module_name) is not None
        except (ImportError, ValueError):
            found = False
    if not found:
        raise _fail(source, index, entry_id, f"entry_point module {module_name!r} cannot be found",
                    "check the module path, or put the module next to the workspace registry.yaml")
    if import_entry_point and not sandbox:
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:
            raise _fail(source, index, entry_id, f"entry_point {ep!r} cannot be imported ({type(exc).__name__}: {exc})",
                        "make the module import cleanly and define the class it names") from exc
        from .env import TraceEnv

        if not (isinstance(cls, type) and issubclass(cls, TraceEnv)):
            raise _fail(source, index, entry_id, f"{ep} is not a TraceEnv subclass",
                        "subclass trace_envs.TraceEnv")
    steps = raw.get("max_episode_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise _fail(source, index, entry_id, f"max_episode_steps must be a positive integer, got {steps!r}",
                    "set e.g. `max_episode_steps: 30`")
    requires = raw.get("requires") or []
    kwargs = raw.get("kwargs") or {}
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise _fail(source, index, entry_id, "requires must be a list of strings", "write e.g. `requires: [docker]`")
    if not isinstance(kwargs, dict):
        raise _fail(source, index, entry_id, "kwargs must be a mapping", "write e.g. `kwargs: {domain: airline}`")
    hint = raw.get("hint")
    if hint is not None and not (isinstance(hint, str) and len(hint) <= HINT_BOUND):
        raise _fail(source, index, entry_id, f"hint must be a string of at most {HINT_BOUND} characters",
                    "shorten the hint (or remove it)")
    return EnvEntry(id=entry_id, entry_point=ep, kind=raw["kind"], description=str(raw["description"]),
                    capability=raw.get("capability"), target=raw.get("target"), max_episode_steps=steps,
                    requires=tuple(requires), kwargs=dict(kwargs), origin=origin, source=source, sandbox=sandbox,
                    hint=hint)


def prompt_hint(entry: EnvEntry) -> str:
    """The text GRPO's hint mode may put in a system prompt for ``entry`` (when the run gives none).

    A hand-written env's own ``hint_text``, else its registry description. A generated env's texts are data,
    never prompt text: not its module's ``hint_text`` (read from its worker), not its ``REGISTRATION``
    description, nor anything else the module wrote. Its hint is the registry's ``hint``, which only the
    generator writes, from its own spec; else the hint of a hand-written env that teaches the same
    capability (its ``hint_text`` or registry description: trusted text); else one naming the capability.
    """
    if not entry.generated:
        own = getattr(entry.load_class(), "hint_text", None)
        if isinstance(own, str) and own.strip():
            return own.strip()[:HINT_BOUND]
        return f"Hint ({entry.capability or entry.id}): {entry.description}"[:HINT_BOUND]
    if entry.hint and entry.hint.strip():
        return entry.hint.strip()[:HINT_BOUND]
    if entry.capability:
        for other in _ENTRIES.values():  # a hand-written env teaching the same capability: trusted text
            if other.capability == entry.capability and other.kind == "capability" and not other.sandbox:
                return prompt_hint(other)
    what = entry.capability or entry.id
    return f"Hint ({what}): this task tests the {what.replace('_', ' ')} capability."


def _module_file(module_name: str, source: str) -> Path | None:
    """The file of a sandboxed entry's module, without importing anything: beside the registry file that
    names it, else (a hand-written package opting in) where the import system would find it."""
    parts = module_name.split(".")
    here = Path(source).parent if source else None
    if here is not None:
        for candidate in (here.joinpath(*parts).with_suffix(".py"), here.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    for root in sys.path:
        base = Path(root or ".")
        for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if candidate.is_file():
                return candidate
    return None


def worker_spec(entry: EnvEntry, **overrides: Any):
    """The :class:`~trace_envs.core.sandboxed.WorkerSpec` of a sandboxed entry: which module the worker
    imports, from which folder, and which folder it may read (the module's top-level package, or the
    module file itself)."""
    from .sandboxed import WorkerSpec

    module_name, _, attr = entry.entry_point.partition(":")
    path = _module_file(module_name, entry.source)
    if path is None:
        raise RegistryError(f"{entry.source} ({entry.id}): entry_point module {module_name!r} cannot be found. "
                            "Fix: put the module next to the workspace registry.yaml")
    # Absolute: the worker's sandbox binds this folder by path, and a registry loaded by a relative path
    # (`trace run --out runs/demo`) would otherwise name a folder relative to whichever cwd bwrap starts in.
    path = path.resolve()
    parts = module_name.split(".")
    depth = len(parts) if path.name == "__init__.py" else len(parts) - 1
    root = path.parents[depth] if depth < len(path.parents) else path.parent
    bind = root / parts[0] if len(parts) > 1 or path.name == "__init__.py" else path
    return WorkerSpec(env_id=entry.id, module=module_name, cls=attr, module_root=str(root), bind=str(bind),
                      **{"generated": entry.generated, **overrides})


def _cache_path(text: str) -> Path:
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]
    root = Path(os.environ.get("TRACE_CACHE", Path.home() / ".cache" / "trace"))
    return root / "registry" / f"{digest}.json"


def _load_yaml(path: Path, source: str) -> Any:
    """Parse a registry file. The parsed form is cached as JSON keyed by the file's content hash, because
    importing PyYAML alone costs more than the rest of ``import trace_envs`` adds to gymnasium's import."""
    text = path.read_text(encoding="utf-8")
    cache = _cache_path(text)
    try:
        return json.loads(cache.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    import yaml

    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise RegistryError(f"{source}: not valid YAML ({exc}). Fix: the file must be a YAML list of entries") from exc
    try:  # a read-only home or cache folder only costs speed
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, cache)
    except (OSError, TypeError, ValueError):
        pass
    return data


def read_registry(path: str | os.PathLike, import_entry_points: bool = False) -> list[EnvEntry]:
    """Read and validate one registry file (or a folder holding ``registry.yaml``)."""
    path = Path(path)
    if path.is_dir():
        path = path / "registry.yaml"
    source = str(path)
    if not path.is_file():
        raise RegistryError(f"{source}: registry file not found. Fix: point TRACE_REGISTRY at a registry.yaml "
                            "or a folder that holds one")
    data = _load_yaml(path, source)
    if data is None:
        return []
    if not isinstance(data, list):
        raise RegistryError(f"{source}: the top level must be a list of entries, got {type(data).__name__}. "
                            "Fix: start each entry with `- id: ...`")
    if path.parent != BUILTIN_REGISTRY.parent and str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))  # workspace modules import by name
    entries: list[EnvEntry] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(data):
        entry = validate_entry(raw, source, i, import_entry_point=import_entry_points)
        if entry.id in seen:
            raise _fail(source, i, entry.id, f"duplicate id (also entry #{seen[entry.id] + 1})",
                        "give each environment its own id; bump the version (-v1) for a changed behaviour")
        seen[entry.id] = i
        entries.append(entry)
    return entries


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def register_entries(entries: list[EnvEntry]) -> None:
    """Register entries with Gymnasium (refusing ids already registered from another file)."""
    import gymnasium as gym

    for entry in entries:
        previous = _ENTRIES.get(entry.id)
        if previous is not None:
            if previous.source == entry.source or _same_file(previous.source, entry.source):
                continue  # the same file loaded twice (perhaps by another spelling of its path)
            raise RegistryError(f"{entry.source} ({entry.id}): duplicate id, already registered by {previous.source}. "
                                "Fix: rename the environment in your workspace registry")
        if entry.sandbox:
            # The proxy: the module runs in a sandboxed worker, never in this process.
            gym.register(id=entry.id, entry_point=SANDBOX_ENTRY_POINT, max_episode_steps=entry.max_episode_steps,
                         kwargs={"trace_env_id": entry.id, **entry.kwargs}, disable_env_checker=False)
        else:
            gym.register(id=entry.id, entry_point=entry.entry_point, max_episode_steps=entry.max_episode_steps,
                         kwargs=dict(entry.kwargs), disable_env_checker=False)
        _ENTRIES[entry.id] = entry


def load_registry(path: str | os.PathLike, import_entry_points: bool = False) -> list[EnvEntry]:
    """Read a workspace registry and register its entries; returns them."""
    entries = read_registry(path, import_entry_points=import_entry_points)
    register_entries(entries)
    return entries


def load_default_registries() -> None:
    """Register the built-in registry and those named by ``TRACE_REGISTRY`` (called by ``import trace_envs``)."""
    register_entries(read_registry(BUILTIN_REGISTRY))
    for part in filter(None, os.environ.get("TRACE_REGISTRY", "").split(os.pathsep)):
        load_registry(part)


def registered() -> list[EnvEntry]:
    """Every registered TRACE entry, in registration order."""
    return list(_ENTRIES.values())


def get_entry(env_id: str) -> EnvEntry:
    env_id = env_id.split(":", 1)[-1]
    if env_id not in _ENTRIES:
        known = ", ".join(_ENTRIES) or "(none)"
        raise KeyError(f"unknown TRACE environment {env_id!r}. Registered: {known}")
    return _ENTRIES[env_id]


def _version(env_id: str) -> int:
    tail = env_id.rsplit("-v", 1)
    return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else -1


def latest_capability_id(capability: str) -> str:
    """The newest hand-written ``trace/<capability>-vN`` id (ids never change; a new reward is a new ``-vN``).

    The pipeline, the generator and the docs train on this one; older versions stay registered as published.
    """
    ids = [e.id for e in _ENTRIES.values() if e.id.startswith(f"trace/{capability}-v") and e.origin == "hand-written"]
    if not ids:
        raise KeyError(f"no hand-written env for capability {capability!r}; registered: {', '.join(_ENTRIES) or '(none)'}")
    return max(ids, key=_version)
