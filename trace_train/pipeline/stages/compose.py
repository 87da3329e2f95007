"""The ``compose`` stage: token-level top-1 MoE over the adapters, merges, per-episode routing -> ``compose/``."""

from __future__ import annotations

import json
from pathlib import Path

from .common import (SECONDS_PER_ROUTER_RUN_TINY, SECONDS_PER_ROUTER_STEP_TINY, SECONDS_PER_SCRIPTED_EPISODE, _str,
                     base_model_path, capability_envs, model_env_kwargs_fn)


def _adapters(ctx) -> dict[str, str]:
    return dict(ctx.summary("train").get("adapters", {})) if ctx.done("train") else {}


def run_compose(ctx) -> tuple[list[str], dict]:
    from trace_envs import OracleAgent
    from trace_train import compose as C
    from trace_train.rollouts import run_rollouts

    c = ctx.cfg.compose
    adapters = _adapters(ctx)
    if len(adapters) < 1:
        ctx.path("compose").mkdir(parents=True, exist_ok=True)
        (ctx.path("compose", "results.json")).write_text(json.dumps({"note": "no adapters to compose"}) + "\n")
        return ["compose"], {"note": "no adapters were trained, nothing to compose"}
    model = base_model_path(ctx)
    envs = capability_envs(ctx)
    names = list(adapters)
    # The gates learn from successful trajectories of each capability env; the oracle's are successful by
    # construction and carry the env id that the optional label loss maps to its adapter. Seeds far from
    # the training and evaluation seeds.
    data = []
    for cap in names:
        path = ctx.path("compose", "data", f"{cap}.jsonl")
        run_rollouts(envs[cap]["env_id"], OracleAgent(), range(500_000, 500_000 + c.router_seeds), out=path,
                     env_kwargs=model_env_kwargs_fn(model), progress=False, agent_name="oracle")
        data.append(str(path))
    baselines = [m for m in c.merges] + (["per_episode"] if c.per_episode and len(names) > 1 else [])
    options = {"progress": ctx.progress, "device": ctx.cfg.base.device, "threads": ctx.cfg.base.threads,
               **c.options}
    res = C.compose(model, {n: adapters[n] for n in names}, data, ctx.path("compose", "moe"), top_k=c.top_k,
                    adapter_envs={n: [envs[n]["env_id"]] for n in names}, baselines=baselines, **options)
    methods = json.loads(Path(res.methods_json).read_text()) if res.methods_json else {}
    results = {"adapters": adapters, "data": data, "router_episodes": len(names) * c.router_seeds,
               "router_trained_on": res.episodes, "dropped_zero_updates": res.dropped,
               "labelled_envs": res.labelled_envs,
               "moe": {"out_dir": str(res.out_dir), "routing_csv": _str(res.routing_csv),
                       "heatmap_png": _str(res.heatmap_png), "loss_png": _str(res.loss_png)},
               "methods": methods, "skipped_baselines": [m for m in baselines if m not in methods]}
    (ctx.path("compose", "results.json")).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return ["compose"], {k: v for k, v in results.items() if k != "data"}


def estimate_compose(ctx) -> tuple[float | None, str]:
    import math

    from trace_train.compose.api import router_config
    from trace_train.compose.train import RouterTrainConfig

    c = ctx.cfg.compose
    k = len(_adapters(ctx)) or ctx.cfg.diagnose.max_capabilities
    router = router_config((c.options or {}).get("train")) or RouterTrainConfig()
    steps = router.epochs * math.ceil(k * c.router_seeds / router.accumulate)
    return (SECONDS_PER_ROUTER_RUN_TINY + max(0, steps - 12) * SECONDS_PER_ROUTER_STEP_TINY + 10 * len(c.merges)
            + k * c.router_seeds * SECONDS_PER_SCRIPTED_EPISODE,
            f"router over {k} adapters ({steps} steps), {len(c.merges)} merges")
