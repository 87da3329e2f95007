"""The ``compose`` stage: token-level top-1 MoE over the adapters, merges, per-episode routing -> ``compose/``."""

from __future__ import annotations

import json
from pathlib import Path

from .common import (SECONDS_PER_ROUTER_RUN_TINY, SECONDS_PER_ROUTER_STEP_TINY, SECONDS_PER_SCRIPTED_EPISODE, _str,
                     base_model_path, capability_envs, model_env_kwargs_fn, train_records)


def _adapters(ctx) -> dict[str, str]:
    return dict(ctx.summary("train").get("adapters", {})) if ctx.done("train") else {}


def unimproved(ctx, names: list[str]) -> dict[str, str]:
    """The adapters among ``names`` whose chosen checkpoint was not clearly better than the base on their own env's
    validation seeds (checkpoint selection's curve), each with the figures that say so.

    "Clearly better" is the paired Δ success (chosen checkpoint − base, over the validation seeds both played) with
    the lower end of its 95% bootstrap interval above zero: one lucky win in 50 episodes is not a skill learnt
    (seed 1 of the headline recipe: 0.02 against 0.00, and the adapter kept lowered the target). Where selection's
    episode files are gone, the values alone decide (at or below the base). An adapter without a selection (a zero
    update, or selection off) is not judged here."""
    from trace_train.evaluate import compare
    from trace_train.train.select import step_episodes

    records, out = train_records(ctx), {}
    for name in names:
        chosen = (records.get(name) or {}).get("selected") or {}
        if chosen.get("success") is None or chosen.get("base_success") is None:
            continue
        figures = (f"success {chosen['success']:.2f} at step {chosen['step']}, the base {chosen['base_success']:.2f}")
        select_dir = ctx.path("train", name, "select")
        base_eps, step_eps = step_episodes(select_dir, 0), step_episodes(select_dir, int(chosen["step"]))
        if base_eps.is_file() and step_eps.is_file():
            delta = compare(base_eps, step_eps, ks=[1], n_boot=2000)["delta"].get("pass@1")
            if delta is not None and not delta["ci"][0] > 0:
                lo, hi = delta["ci"]
                out[name] = (f"no checkpoint was clearly better than the base on its env's validation seeds ({figures};"
                             f" paired Δ {delta['value']:+.2f} [{lo:+.2f}, {hi:+.2f}])")
        elif chosen["success"] <= chosen["base_success"]:
            out[name] = f"no checkpoint beat the base on its env's validation seeds ({figures})"
    return out


def _selected_successes(ctx, cap: str) -> list[dict]:
    """The successful episodes that checkpoint selection played with ``cap``'s chosen checkpoint (its own envs'
    validation seeds), or [] when there was no choice (selection off, or a zero update)."""
    from trace_train.rollouts import read_trajectories
    from trace_train.train.select import step_episodes

    step = ((train_records(ctx).get(cap) or {}).get("selected") or {}).get("step")
    if step is None:
        return []
    path = step_episodes(ctx.path("train", cap, "select"), int(step))
    return [r for r in read_trajectories(path) if r.get("success")] if path.is_file() else []


def router_episodes(ctx, names: list[str], env_ids: dict[str, str],
                    model: str) -> tuple[list[str], dict[str, str], int]:
    """One file of router episodes per adapter in ``compose/data/``, where each came from, and how many episodes
    were played for them (the oracle's; the chosen checkpoint's were played, and counted, by selection).

    The gates learn from successful trajectories of each capability env, which carry the env id that the
    optional label loss maps to its adapter: the oracle's (successful by construction; seeds far from the
    training and evaluation seeds) or, with ``router_data: selected``, the chosen checkpoint's own.
    """
    from trace_envs import OracleAgent
    from trace_train.rollouts import run_rollouts

    c = ctx.cfg.compose
    data, sources, played = [], {}, 0
    for cap in names:
        path = ctx.path("compose", "data", f"{cap}.jsonl")
        own = _selected_successes(ctx, cap)[:c.router_seeds] if c.router_data == "selected" else []
        if own:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(r) + "\n" for r in own))
            sources[cap] = f"selected: {len(own)} successful episodes of the chosen checkpoint"
        else:
            run_rollouts(env_ids[cap], OracleAgent(), range(500_000, 500_000 + c.router_seeds), out=path,
                         env_kwargs=model_env_kwargs_fn(model), progress=False, agent_name="oracle")
            played += c.router_seeds
            sources[cap] = f"oracle: {c.router_seeds} episodes" + (
                " (the chosen checkpoint has no successful episode)" if c.router_data == "selected" else "")
        data.append(str(path))
    return data, sources, played


def run_compose(ctx) -> tuple[list[str], dict]:
    from trace_train import compose as C

    c = ctx.cfg.compose
    adapters = _adapters(ctx)
    if len(adapters) < 1:
        ctx.path("compose").mkdir(parents=True, exist_ok=True)
        (ctx.path("compose", "results.json")).write_text(json.dumps({"note": "no adapters to compose"}) + "\n")
        return ["compose"], {"note": "no adapters were trained, nothing to compose"}
    model = base_model_path(ctx)
    envs = capability_envs(ctx)
    names = list(adapters)
    data, sources, played = router_episodes(ctx, names, {n: envs[n]["env_id"] for n in names}, model)
    baselines = [m for m in c.merges] + (["per_episode"] if c.per_episode and len(names) > 1 else [])
    options = {"progress": ctx.progress, "device": ctx.cfg.base.device, "threads": ctx.cfg.base.threads,
               **c.options}
    if c.drop_unimproved:
        options["leave_out"] = unimproved(ctx, names)
    res = C.compose(model, {n: adapters[n] for n in names}, data, ctx.path("compose", "moe"), top_k=c.top_k,
                    adapter_envs={n: [envs[n]["env_id"]] for n in names}, baselines=baselines, **options)
    methods = json.loads(Path(res.methods_json).read_text()) if res.methods_json else {}
    results = {"adapters": adapters, "data": data, "router_data": sources,
               "router_episodes": played,  # env episodes the router cost ("rollouts spent")
               "router_trained_on": res.episodes, "dropped": res.dropped,
               "dropped_why": res.dropped_why,
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
    # The pre-fit reads each episode once per round without gradients: about a third of a step's work per episode.
    prefit = (math.ceil(router.prefit_rounds * k * c.router_seeds / (3 * router.accumulate))
              if router.prefit_steps else 0)
    return (SECONDS_PER_ROUTER_RUN_TINY + max(0, steps + prefit - 12) * SECONDS_PER_ROUTER_STEP_TINY
            + 10 * len(c.merges) + k * c.router_seeds * SECONDS_PER_SCRIPTED_EPISODE,
            f"router over {k} adapters ({steps} steps" + (", after a label pre-fit" if prefit else "") + f"), "
            f"{len(c.merges)} merges")
