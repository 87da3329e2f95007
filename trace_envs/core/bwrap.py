"""What a bubblewrap sandbox with a private ``/tmp`` must still show of the real one.

The SWE target's local bubblewrap sandbox (``trace_envs/swe/sandbox.py``) gives the untrusted code an
empty ``/tmp``. (The worker of generated envs, ``trace_envs/core/sandboxed.py``, binds only what it
needs instead, under its own empty ``/tmp``.) A checkout, a virtual
environment or ``TRACE_CACHE`` may well live there (a CI runner's clone, a pytest temporary directory),
and an empty ``/tmp`` would then hide the interpreter and the very packages the sandboxed process
imports. :func:`rebind_hidden` gives those paths back, read-only, and nothing else of the real ``/tmp``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable

#: Top-level folders the sandboxes replace with an empty tmpfs.
HIDDEN_ROOTS = ("tmp", "run")


def rebind_hidden(extra: Iterable[str | os.PathLike] = ()) -> list[str]:
    """``--ro-bind SRC DST`` options for the interpreter, the import path, this project's checkout,
    ``TRACE_CACHE`` and ``extra`` where they lie under a hidden root. Put them after the ``--tmpfs``
    options and before any writable ``--bind`` inside them (bubblewrap applies options in order)."""
    project = Path(__file__).resolve().parents[2]  # the folder holding trace_envs/ (a checkout or site-packages)
    wanted = {sys.prefix, sys.base_prefix, sys.executable, str(project), *sys.path, *map(str, extra)}
    if os.environ.get("TRACE_CACHE"):
        wanted.add(os.environ["TRACE_CACHE"])
    hidden = set()
    for raw in wanted:
        if not raw:
            continue
        path = Path(raw).resolve()
        # Never the hidden root itself (a '' entry of sys.path run from /tmp would undo the sandbox).
        if len(path.parts) > 2 and path.parts[1] in HIDDEN_ROOTS and path.exists():
            hidden.add(path)
    kept: list[Path] = []  # a bind inside an already bound folder is redundant: outermost first
    for path in sorted(hidden, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return [opt for path in kept for opt in ("--ro-bind", str(path), str(path))]
