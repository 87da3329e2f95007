"""Reports of ``trace run`` (the last step of :mod:`trace_train.pipeline`): ``report.md`` and a
self-contained ``report.html`` built from the files a run directory holds.

    from trace_train.report import write_report
    paths = write_report("runs/trace")     # paths.markdown, paths.html
"""

from .document import Document, Image, Table
from .run_report import ReportPaths, build_document, write_report

__all__ = ["Document", "Image", "ReportPaths", "Table", "build_document", "write_report"]
