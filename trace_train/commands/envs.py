"""``trace envs``: list, inspect and check the registered environments.

    trace envs list [--kind target|capability] [--registry PATH]...
    trace envs show ID [--seed N] [--registry PATH]...
    trace envs check ID [--seeds N] [--registry PATH]...

``--registry`` loads a workspace registry (a ``registry.yaml`` or a folder
holding one) on top of the built-in registry and ``TRACE_REGISTRY``.
"""

from __future__ import annotations

import argparse
import inspect
import re

from . import CommandError, format_table

_TOOLS_SECTION = re.compile(r"# Tools\n.*?</tools>", re.DOTALL)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``trace envs ...`` to the top-level parser."""
    envs = subparsers.add_parser("envs", help="list, inspect and check environments",
                                 description="List, inspect and check the registered TRACE environments.")
    envs.set_defaults(func=None, _parser=envs)
    verbs = envs.add_subparsers(title="subcommands", dest="envs_command", metavar="<subcommand>")

    registry_help = ("a workspace registry to load first (a registry.yaml or a folder holding one); "
                     "repeatable")

    p = verbs.add_parser("list", help="a table of every registered environment",
                         description="List the registered environments (built-in, TRACE_REGISTRY and --registry).")
    p.add_argument("--kind", help="show only this kind (target or capability)")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_list)

    p = verbs.add_parser("show", help="an environment's description, tools and a sample task",
                         description="Show an environment's documentation, its tools and the task of one seed.")
    p.add_argument("env_id", metavar="ID", help="a registered id, e.g. examples/warehouse_stock-v0")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample task (default: 0)")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_show)

    p = verbs.add_parser("check", help="run the conformance checks on an environment",
                         description="Run trace_envs.check_trace_env on one environment; exit 1 if a check fails.")
    p.add_argument("env_id", metavar="ID", help="a registered id, e.g. examples/warehouse_stock-v0")
    p.add_argument("--seeds", type=int, default=20, metavar="N",
                   help="seeds for the oracle and seed checks (default: 20)")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=registry_help)
    p.set_defaults(func=cmd_check)


# ---------------------------------------------------------------- helpers

def _load(registries: list[str]):
    """Import ``trace_envs`` (registering the defaults) and load ``--registry`` paths; returns the module."""
    try:
        import trace_envs
    except Exception as exc:  # a broken TRACE_REGISTRY entry is the user's to fix, not a crash
        if type(exc).__name__ == "RegistryError":
            raise CommandError(f"{exc} (while loading TRACE_REGISTRY)") from exc
        raise
    for path in registries:
        try:
            trace_envs.load_registry(path)
        except trace_envs.RegistryError as exc:
            raise CommandError(str(exc)) from exc
    return trace_envs


def _entry(trace_envs, env_id: str):
    try:
        return trace_envs.get_entry(env_id)
    except KeyError as exc:
        message = exc.args[0] if exc.args else str(exc)
        raise CommandError(f"{message}. Fix: check the id with `trace envs list`, or pass --registry PATH "
                           "for a workspace environment") from exc


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


def _signature(schema: dict) -> str:
    """``name(arg: type, opt: type?)`` from an OpenAI function schema."""
    from trace_envs.core.tools import _type_name

    fn = schema["function"]
    params = fn.get("parameters") or {}
    required = set(params.get("required", ()))
    args = [f"{name}: {_type_name(s)}" + ("" if name in required else "?")
            for name, s in (params.get("properties") or {}).items()]
    return f"{fn['name']}({', '.join(args)})"


# ---------------------------------------------------------------- verbs

def cmd_list(args: argparse.Namespace) -> int:
    trace_envs = _load(args.registry)
    from trace_envs.core.registry import KINDS

    if args.kind is not None and args.kind not in KINDS:
        raise CommandError(f"unknown kind {args.kind!r}; choose one of {', '.join(KINDS)}")
    entries = [e for e in trace_envs.registered() if args.kind is None or e.kind == args.kind]
    if not entries:
        print("No environments registered" + (f" of kind {args.kind!r}" if args.kind else "")
              + ". Add a workspace registry with --registry PATH or TRACE_REGISTRY.")
        return 0
    rows = [(e.id, e.kind, e.capability, e.target, e.requires, e.origin) for e in entries]
    print(format_table(["id", "kind", "capability", "target", "requires", "origin"], rows))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    trace_envs = _load(args.registry)
    import gymnasium as gym

    entry = _entry(trace_envs, args.env_id)
    cls = entry.load_class()
    print(entry.id)
    print("=" * len(entry.id))
    print(entry.description)
    print()
    facts = [("entry point", entry.entry_point), ("kind", entry.kind), ("capability", entry.capability),
             ("target", entry.target), ("max steps", entry.max_episode_steps), ("requires", entry.requires),
             ("kwargs", entry.kwargs), ("origin", entry.origin), ("registry", entry.source)]
    width = max(len(k) for k, _ in facts)
    for key, value in facts:
        if isinstance(value, (list, tuple)):
            value = ", ".join(value)
        print(f"{key.ljust(width)}  {value if value not in (None, '', {}) else '-'}")

    doc = inspect.cleandoc(cls.__doc__ or "")
    print()
    print(doc if doc else f"({cls.__name__} has no docstring)")

    env = gym.make(entry.id)
    try:
        try:
            observation, info = env.reset(seed=args.seed)
        except Exception as exc:
            raise CommandError(f"{entry.id}: reset(seed={args.seed}) failed ({type(exc).__name__}: {exc})") from exc
        tools = info.get("tools") or []
        title = f"Tools ({len(tools)})"
        print()
        print(title)
        print("-" * len(title))
        for schema in tools:
            print(f"  {_signature(schema)}")
            description = _first_line(schema["function"].get("description", ""))
            if description:
                print(f"      {description}")
        if not tools:
            print("  (none)")
        shown = _TOOLS_SECTION.sub(f"# Tools\n[{len(tools)} tool schemas, listed above]", observation)
        title = f"Sample task (seed {args.seed})"
        print()
        print(title)
        print("-" * len(title))
        print(shown)
        print()
        print(f"task fingerprint: {env.unwrapped.task_fingerprint()}")
    finally:
        env.close()
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    trace_envs = _load(args.registry)
    entry = _entry(trace_envs, args.env_id)
    if args.seeds < 2:
        raise CommandError(f"--seeds must be at least 2 (the seed checks compare seeds), got {args.seeds}")
    print(f"Checking {entry.id} on {args.seeds} seeds ...", flush=True)
    report = trace_envs.check_trace_env(entry.id, n_seeds=args.seeds)
    print(report.summary())
    return 0 if report.ok else 1

