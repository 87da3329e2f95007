"""The stages of ``trace run``, one module each (:mod:`trace_train.pipeline.runner` runs them and keeps their bookkeeping).

Each ``run_<stage>(ctx)`` reads only the files earlier stages wrote into the run directory, writes its own
(docs/design.md, "Run directory") and returns ``(outputs, summary)``. Each ``estimate_<stage>(ctx)`` returns the
expected seconds (or None) and a one-line note for ``--dry-run``; the per-unit times are constants measured on
a 2-core CPU with the tiny model (:mod:`~trace_train.pipeline.stages.common`), so they are rough by design.

Stage order: base, rollout, diagnose, generate, train, compose, evaluate, then the report.
"""

from .base import estimate_base, run_base
from .compose import estimate_compose, run_compose
from .diagnose import estimate_diagnose, run_diagnose
from .evaluate import estimate_evaluate, run_evaluate
from .generate import estimate_generate, run_generate
from .report import estimate_report, run_report
from .rollout import estimate_rollout, run_rollout
from .train import estimate_train, run_train

__all__ = ["estimate_base", "estimate_compose", "estimate_diagnose", "estimate_evaluate", "estimate_generate",
           "estimate_report", "estimate_rollout", "estimate_train", "run_base", "run_compose", "run_diagnose",
           "run_evaluate", "run_generate", "run_report", "run_rollout", "run_train"]
