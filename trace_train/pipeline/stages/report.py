"""The ``report`` step that closes every ``trace run``: ``report.md`` and a self-contained ``report.html``.

It is not a stage of ``stages.json`` (it reads whatever the run directory holds, finished or not, and is
written again after every stage); :meth:`trace_train.pipeline.runner.Pipeline.write_report` calls
:func:`run_report`. The documents themselves are built by :mod:`trace_train.report`.
"""

from __future__ import annotations

import logging
from pathlib import Path

logger = logging.getLogger(__name__)


def run_report(run_dir: Path) -> tuple[Path | None, Path | None]:
    """Write ``report.md`` and ``report.html`` of ``run_dir``; ``(None, None)`` when that fails (logged)."""
    from trace_train.report import write_report

    try:
        paths = write_report(run_dir)
    except Exception:  # a report must never hide the stage error that got us here
        logger.exception("could not write the report of %s", run_dir)
        return None, None
    return paths.markdown, paths.html


def estimate_report(ctx) -> tuple[float | None, str]:
    """Seconds to write the report (it reads the run directory's JSON and images only)."""
    return 1.0, "report.md and report.html"
