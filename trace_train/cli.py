"""``trace``: the command line of TRACE.

Every stage of the pipeline (docs/design.md) is a verb, contributed by one module of
:mod:`trace_train.commands`; this file only assembles them::

    trace envs list                     # the registered environments
    trace envs show trace/tau_airline-v0 --seed 3
    trace envs check examples/warehouse_stock-v0 --registry examples

To add verbs, write ``trace_train/commands/<part>.py`` with a
``register(subparsers)`` function and add ``"<part>"`` to
:data:`COMMAND_MODULES`. A module whose optional dependencies are missing
(e.g. docker for ``swe``) does not break the other verbs: its name is still
listed, and using it says what to install.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from trace_train.commands import CommandError

#: Command modules, in ``trace --help`` order. A bare name is ``trace_train.commands.<name>``;
#: a dotted name is imported as written.
COMMAND_MODULES: list[str] = [
    "envs",
    "demo",
    "model",
    "rollout",
    "eval",
    "swe",
    "diagnose",
    "generate",
    "run",
    "train",
    "compose",
    "serve",
]

#: Packages of this project: an ImportError naming one of them is a bug, never a missing extra.
_OWN_PACKAGES = ("trace_envs", "trace_train", "generators")

#: Which ``pip install 'trace-rl[...]'`` extra provides a missing top-level package.
_EXTRA_OF = {
    "torch": "train", "transformers": "train", "trl": "train", "peft": "train", "datasets": "train",
    "accelerate": "train", "tokenizers": "train", "matplotlib": "train", "tqdm": "train",
    "docker": "swe", "git": "swe", "libcst": "swe",
    "openai": "llm", "vllm": "vllm", "openenv": "serve", "fastapi": "serve", "fastmcp": "serve",
    "uvicorn": "serve", "websockets": "serve",
}


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line plus a pointer to ``--help``."""

    def error(self, message: str):  # noqa: D102 - argparse hook
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trace-rl")
    except PackageNotFoundError:
        return "unknown (not installed; run `pip install -e .`)"


def _module_path(name: str) -> str:
    return name if "." in name else f"trace_train.commands.{name}"


def _missing_dependency(exc: ImportError) -> str | None:
    """The missing third-party package's name, or ``None`` if the ImportError is a bug of ours."""
    missing = (exc.name or "").split(".")[0]
    if not missing or missing in _OWN_PACKAGES:
        return None
    return missing


def _unavailable(subparsers, verb: str, module: str, exc: ImportError, missing: str) -> str:
    """Register a placeholder verb for a module that cannot load; returns the message shown when it is used."""
    extra = _EXTRA_OF.get(missing)
    fix = f"pip install 'trace-rl[{extra}]'" if extra else f"pip install {missing}"
    subparsers.add_parser(verb, help=f"(unavailable: missing {missing!r}; {fix})", add_help=False)
    return f"`trace {verb}` is unavailable: {exc} (needed by {module}). Fix: {fix}"


def build_parser(modules: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The top-level parser with every command module's verbs."""
    parser = _Parser(
        prog="trace",
        description="TRACE: turn an agent's recurring failures into targeted training environments.",
        epilog=("examples:\n"
                "  trace envs list\n"
                "  trace envs show examples/warehouse_stock-v0 --seed 3 --registry examples\n"
                "  trace envs check examples/warehouse_stock-v0 --registry examples\n\n"
                "Run `trace <command> --help` for a command's options. Workspace registries: --registry PATH "
                "or TRACE_REGISTRY=path[:path...]."),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"trace {_version()}")
    parser.add_argument("--unsandboxed", action="store_true",
                        help="let generated envs run without bubblewrap (a plain subprocess that can read your files "
                             "and reach the network; accepted anywhere on the command line; same as "
                             "TRACE_UNSANDBOXED=1). Without it, a generated env refuses to run where bubblewrap is "
                             "missing; generated envs need --unsandboxed-generated as well")
    parser.add_argument("--unsandboxed-generated", action="store_true",
                        help="with --unsandboxed: let *generated* envs run without bubblewrap too (code a model wrote, "
                             "running as you: it can read your files and your other processes' environments; same as "
                             "TRACE_UNSANDBOXED_GENERATED=1)")
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="<command>")
    #: verb -> why it cannot run (its module's optional dependency is missing)
    parser.unavailable = {}
    for name in COMMAND_MODULES if modules is None else modules:
        path = _module_path(name)
        try:
            module = importlib.import_module(path)
        except ImportError as exc:
            missing = _missing_dependency(exc)
            if missing is None:
                raise
            verb = path.rsplit(".", 1)[-1]
            parser.unavailable[verb] = _unavailable(subparsers, verb, path, exc, missing)
            continue
        module.register(subparsers)
    parser.set_defaults(func=None, _parser=parser)
    return parser


def _is_user_error(exc: BaseException) -> bool:
    if isinstance(exc, CommandError):
        return True
    registry = sys.modules.get("trace_envs.core.registry")  # only if trace_envs was imported at all
    sandboxed = sys.modules.get("trace_envs.core.sandboxed")
    return (registry is not None and isinstance(exc, registry.RegistryError)) or \
        (sandboxed is not None and isinstance(exc, sandboxed.SandboxUnavailable))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``trace`` with ``argv`` (default: ``sys.argv[1:]``); returns the exit status.

    Usage errors and :class:`~trace_train.commands.CommandError` print one line to
    stderr and return 2; a failed check or run returns 1.
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--unsandboxed-generated" in argv:
        import os

        argv = [a for a in argv if a != "--unsandboxed-generated"]
        os.environ["TRACE_UNSANDBOXED_GENERATED"] = "1"
        print("trace: warning: --unsandboxed-generated: generated code may run as you, outside any sandbox",
              file=sys.stderr)
    if "--unsandboxed" in argv:
        # Global, wherever it is written: every generated env this run makes may start without bubblewrap.
        import os

        argv = [a for a in argv if a != "--unsandboxed"]
        os.environ["TRACE_UNSANDBOXED"] = "1"
        print("trace: warning: --unsandboxed: generated envs may run without a sandbox (your files and the network "
              "are within their reach)", file=sys.stderr)
    verb = next((a for a in argv if not a.startswith("-")), None)
    if verb in parser.unavailable:
        print(f"trace: error: {parser.unavailable[verb]}", file=sys.stderr)
        return 2
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if args.func is None:
        # A command group without its sub-command (e.g. `trace envs`): show what it offers.
        args._parser.print_help(sys.stderr)
        return 2
    try:
        status = args.func(args)
    except KeyboardInterrupt:
        print("trace: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if not _is_user_error(exc):
            raise
        print(f"trace: error: {exc}", file=sys.stderr)
        return 2
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
