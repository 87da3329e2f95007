"""Plain text tables, as the CLI's verbs and ``trace run --dry-run``'s plan print them.

It lives below the CLI so that the pipeline (:func:`trace_train.pipeline.runner.format_plan`) prints the same
tables as the verbs without importing :mod:`trace_train.commands`.
"""

from __future__ import annotations

from typing import Iterable, Sequence


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]], empty: str = "-") -> str:
    """Plain, left-aligned text columns (readable in any terminal and in logs).

    ``None`` and empty values are shown as ``empty``; lists and tuples are joined with commas.
    """

    def cell(value: object) -> str:
        if value is None or value == "" or value == () or value == []:
            return empty
        if isinstance(value, (list, tuple)):
            return ",".join(str(v) for v in value)
        return str(value)

    table = [[str(h) for h in headers]] + [[cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
