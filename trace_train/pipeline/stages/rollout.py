"""The ``rollout`` stage: the base agent on the target's seeds -> ``rollouts/trajectories.jsonl``.

The episodes run on the rollout backend of ``rollout.engine`` (:func:`trace_train.backends.run_jobs`): with
``rollout.workers`` and a local model in local worker processes, each on a share of the seeds; with ``ray``
on Ray actors.
"""

from __future__ import annotations

import math

from ..config import parse_seeds
from trace_train.backends import RolloutJob, run_jobs
from trace_train.backends.local import _part_path

from .common import _check_targets, _episodes_seconds, base_agent_factory, base_env_kwargs_fn, workspace_registries


def run_rollout(ctx) -> tuple[list[str], dict]:
    from trace_train.rollouts import read_trajectories

    r = ctx.cfg.rollout
    _check_targets(ctx)
    out = ctx.path("rollouts", "trajectories.jsonl")
    kwargs = base_env_kwargs_fn(ctx)
    # Episodes already played before an interruption: in the file, or in the parts of a split run.
    before = sum(len(read_trajectories(path)) for path in [out, *(_part_path(out, i) for i in range(r.workers))])
    # In this process, or (rollout.workers, a local model) in several, each on a share of the seeds and
    # resumable in its own part file, joined into one; or on Ray actors (rollout.engine: ray).
    job = RolloutJob(key="base", make=base_agent_factory(ctx), targets=list(r.targets),
                     seeds=parse_seeds("rollout.seeds", r.seeds), samples=r.samples, out=out, in_flight=r.in_flight,
                     env_kwargs={env_id: kwargs(env_id) for env_id in r.targets}, progress=ctx.progress,
                     retry_env_errors=True, registries=workspace_registries(ctx), agent_name="base")
    run_jobs([job], r.engine, workers=r.workers, ray=ctx.cfg.ray)
    records = read_trajectories(out)
    rewards = [float(rec.get("reward") or 0.0) for rec in records]
    return ["rollouts/trajectories.jsonl"], {
        "episodes": len(records), "resumed_from": before,
        "mean_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "success_rate": sum(bool(rec.get("success")) for rec in records) / len(records) if records else 0.0,
        "targets": list(r.targets)}


def estimate_rollout(ctx) -> tuple[float | None, str]:
    r = ctx.cfg.rollout
    n = len(r.targets) * len(parse_seeds("rollout.seeds", r.seeds)) * r.samples
    if r.workers > 1 and ctx.cfg.base.kind in ("tiny", "hf"):
        workers = min(r.workers, n)
        return (_episodes_seconds(ctx, math.ceil(n / workers), r.in_flight),
                f"{n} episodes of the base agent, {workers} processes")
    return _episodes_seconds(ctx, n, r.in_flight), f"{n} episodes of the base agent"
