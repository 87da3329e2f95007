"""The ``diagnose`` stage: contrast successes and failures, retain the missing capabilities -> ``diagnosis/``."""

from __future__ import annotations


from ..config import parse_seeds
from .common import SECONDS_PER_LABEL_OFFLINE


def run_diagnose(ctx) -> tuple[list[str], dict]:
    from trace_train.analysis import LLMConfig, Thresholds, diagnose

    d = ctx.cfg.diagnose
    llm = LLMConfig(base_url=d.llm_url, model=d.llm_model, runs=d.runs) if d.llm_url else None
    result = diagnose(ctx.path("rollouts", "trajectories.jsonl"), ctx.path("diagnosis"), llm=llm,
                      thresholds=Thresholds(min_delta=d.min_delta, min_coverage=d.min_coverage),
                      offline_runs=d.runs)
    by_delta = sorted((s for s in result.scores if s.retained), key=lambda s: -(s.mean_delta or 0.0))
    selected = [s.name for s in by_delta[:d.max_capabilities]]
    return ["diagnosis"], {"retained": list(result.retained), "selected": selected,
                           "labeler": result.data.get("labeler"),
                           "dropped_by_max_capabilities": [s.name for s in by_delta[d.max_capabilities:]]}


def estimate_diagnose(ctx) -> tuple[float | None, str]:
    r, d = ctx.cfg.rollout, ctx.cfg.diagnose
    n = len(r.targets) * len(parse_seeds("rollout.seeds", r.seeds)) * r.samples
    if d.llm_url:
        return None, f"LLM labelling of {n} trajectories × {d.runs} runs on {d.llm_url}"
    return 5.0 + n * SECONDS_PER_LABEL_OFFLINE * d.runs, f"offline labeler on {n} trajectories"
