"""``trace run``: the whole TRACE loop in one run directory, resumable stage by stage.

The room of the pipeline:

* :mod:`trace_train.pipeline.config`: ``RunConfig``, one dataclass per stage's section, read from YAML;
* :mod:`trace_train.pipeline.runner`: stage order, ``stages.json``, resume, ``--dry-run`` (:class:`Pipeline`);
* :mod:`trace_train.pipeline.stages`: one module per stage with its ``run_<stage>`` and ``estimate_<stage>``
  side by side (base, rollout, diagnose, generate, train, compose, evaluate, report).

What ``trace_train.pipeline`` exported when it was one module it still exports::

    from trace_train.pipeline import Pipeline
    from trace_train.pipeline.config import load_config
    Pipeline(load_config("examples/configs/gpu_qwen3.yaml")).run()
"""

from .runner import (FORMAT_VERSION, HASH_LIMIT_BYTES, Context, Pipeline, PipelineError, PlanRow, RunResult, Stage,
                     file_digest, format_plan, path_digest)

__all__ = ["Context", "FORMAT_VERSION", "HASH_LIMIT_BYTES", "Pipeline", "PipelineError", "PlanRow", "RunResult",
           "Stage", "file_digest", "format_plan", "path_digest"]
