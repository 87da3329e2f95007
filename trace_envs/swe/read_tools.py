"""The read-only repository tools shared by the SWE environments.

``trace/swe_repo-v0`` reads its repository inside a Docker sandbox; ``trace/swe_localization-v0``
serves the same bugged tree from memory. Both must offer the agent the same ``list_files``,
``view_file`` and ``search`` (the capability env keeps the target's tool schemas, docs/design.md), so the
tools, their docstrings (which are their schemas) and their output format are written once here.
Each environment supplies the storage through three small hooks: :meth:`_read`, :meth:`_list`
and :meth:`_grep`.

No tool may run unbounded, and a regular expression from the agent is the one input here that could
(``(a|aa)+$`` backtracks exponentially in Python's ``re``, and ``re`` cannot be interrupted: it holds
the GIL and ignores signals while it matches). :func:`grep_lines` therefore matches with the
``regex`` package, whose matcher takes a ``timeout``, and gives every ``search`` call one time budget
(:data:`SEARCH_TIME_LIMIT_S`) for all its lines; a call that spends it ends with an error the agent can
act on. ``regex`` counts the budget in CPU time of the process (on a loaded machine a search may take
longer on the wall clock, but never more than its share of CPU), and checks it every few thousand steps. (The Docker sandbox runs ``grep -E``, an automaton-based matcher bounded by the sandbox's
command timeout.)
"""

from __future__ import annotations

import posixpath
import re
import time
from typing import Iterable

import regex

from trace_envs.core import ToolError, tool

#: Most lines ``search`` returns.
MAX_SEARCH_HITS = 200
#: CPU seconds one ``search`` call may spend matching, over all the lines it reads.
SEARCH_TIME_LIMIT_S = 1.0


def grep_lines(pattern: str, files: Iterable[tuple[str, str]], limit: int,
               time_limit: float = SEARCH_TIME_LIMIT_S) -> str:
    """``file:line:text`` for each line of ``files`` (``(path, text)`` pairs) that ``pattern`` matches.

    Stops after ``limit`` hits. Matching is bounded: past ``time_limit`` seconds in total it raises a
    :class:`ToolError` that says why, instead of running for as long as the pattern backtracks.
    """
    try:
        rx = regex.compile(pattern)
    except regex.error as exc:
        raise ToolError(f"invalid regular expression: {exc}") from exc
    deadline = time.process_time() + time_limit  # the clock regex's own timeout uses
    hits: list[str] = []
    for path, text in files:
        for i, line in enumerate(text.splitlines(), 1):
            left = deadline - time.process_time()
            try:
                if left <= 0:
                    raise TimeoutError
                found = rx.search(line, timeout=left)
            except TimeoutError:
                raise ToolError(f"the search stopped after {time_limit:g} s of matching without finishing (at {path}:{i}, "
                                f"{len(hits)} matches so far): the pattern backtracks too much. Use a simpler "
                                "pattern, without nested repetition such as (a+)+ or (a|aa)*.") from None
            if found:
                hits.append(f"{path}:{i}:{line}")
                if len(hits) >= limit:
                    return "\n".join(hits)
    return "\n".join(hits)


class RepoReadTools:
    """Mixin: ``list_files``, ``view_file`` and ``search`` over a repository at ``/testbed``."""

    @staticmethod
    def _path(path: str) -> str:
        """``path`` relative to the repository root (``/testbed/...`` accepted); ToolError outside it."""
        norm = posixpath.normpath(path.strip() or ".")
        if norm.startswith("/testbed"):
            norm = posixpath.relpath(norm, "/testbed")
        if norm.startswith("/") or norm == ".." or norm.startswith("../"):
            raise ToolError(f"path {path!r} is outside the repository; use paths relative to /testbed")
        return norm

    # -- storage hooks
    def _read(self, path: str) -> str:
        """The text of a file (``path`` as the agent gave it); ToolError if it cannot be read."""
        raise NotImplementedError

    def _list(self, rel: str) -> str:
        """Newline-separated sorted entries under directory ``rel``, two levels deep; ToolError if none."""
        raise NotImplementedError

    def _grep(self, pattern: str, rel: str, limit: int) -> str:
        """``file:line:text`` lines of ``.py`` files under ``rel`` matching ``pattern`` (at most ``limit``);
        ``pattern`` already compiles as a Python regular expression."""
        raise NotImplementedError

    # -- the tools
    @tool
    def list_files(self, path: str = ".") -> str:
        """List files and directories under a path of the repository (two levels deep).

        Args:
            path: a directory relative to the repository root.
        """
        return self._list(self._path(path)).rstrip("\n")

    @tool
    def view_file(self, path: str, start_line: int = 1, end_line: int = 0) -> str:
        """Show a file with line numbers.

        Args:
            path: the file, relative to the repository root.
            start_line: first line to show (1-based).
            end_line: last line to show; 0 means the end of the file.
        """
        lines = self._read(path).splitlines()
        end = len(lines) if end_line <= 0 else min(end_line, len(lines))
        return "\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(max(1, start_line), end + 1)) \
            or "(no lines in that range)"

    @tool
    def search(self, pattern: str, path: str = ".") -> str:
        """Search Python files for a regular expression (grep -E); prints file:line:text.

        Args:
            pattern: an extended regular expression.
            path: a file or directory to search, relative to the repository root.
        """
        try:  # one error for a bad pattern whichever engine runs it
            re.compile(pattern)
        except re.error as exc:
            raise ToolError(f"invalid regular expression: {exc}") from exc
        return self._grep(pattern, self._path(path), MAX_SEARCH_HITS).rstrip("\n") or "(no matches)"


__all__ = ["RepoReadTools", "MAX_SEARCH_HITS", "SEARCH_TIME_LIMIT_S", "grep_lines"]
