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
    """``key=value`` command-line pairs as a dict (:func:`trace_train.pipeline.config.parse_key_values`), a bad
    pair reported as a :class:`CommandError`."""
    from trace_train.pipeline.config import ConfigError
    from trace_train.pipeline.config import parse_key_values as parse

    try:
        return parse(pairs, flag)
    except ConfigError as exc:
        raise CommandError(str(exc)) from None
