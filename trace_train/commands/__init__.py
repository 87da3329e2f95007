"""The verbs of the ``trace`` command line, one module per part of the project.

Each module here exposes ``register(subparsers)``, which adds its verbs to the
top-level parser (see :mod:`trace_train.cli`). A verb is an ``argparse``
sub-parser whose ``func`` default is ``func(args) -> int | None`` (the exit
status; ``None`` means 0).

Rules for a command module:

* import only the standard library and light project modules at module level;
  torch, transformers, docker and the like are imported inside the command
  functions, so ``trace --help`` stays fast and a missing extra breaks only
  the verbs that need it;
* report a user's mistake (unknown id, missing file, bad value) by raising
  :class:`CommandError`: the CLI prints its message on one line and exits 2,
  without a traceback.
"""

from __future__ import annotations

from typing import Iterable

from trace_train.text_table import format_table  # noqa: F401 - the verbs print their tables with it


class CommandError(Exception):
    """A user-facing error: printed as ``trace: error: <message>``, exit status 2 (no traceback)."""


def parse_key_values(pairs: Iterable[str], flag: str) -> dict:
    """``key=value`` command-line pairs (e.g. ``--env-kwarg difficulty=3``) as a dict.

    Values are read as JSON when they parse (numbers, booleans, lists), else kept as strings.
    """
    import json

    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise CommandError(f"{flag} {pair!r} must look like key=value")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
