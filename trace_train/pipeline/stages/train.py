"""The ``train`` stage: GRPO, one LoRA adapter per capability, plus the SFT and multi-capability baselines -> ``train/``.

Each adapter is one :func:`trace_train.train.grpo.train` run; with ``train.workers`` they run side by side in
the local rollout backend's worker pool (:func:`trace_train.backends.local._worker_pool`), with
``train.launcher: accelerate`` in ``accelerate launch`` processes.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from trace_train.backends.local import _worker_pool

from ..config import ConfigError, parse_seeds
from .common import (LEAD_IN_AUTO_MIN_EPISODES, LEAD_IN_AUTO_MIN_SUCCESS, SECONDS_PER_GRPO_STEP_TINY,
                     SECONDS_PER_GRPO_STEP_TINY_FAST, SECONDS_PER_SFT_STEP_TINY, _fast_decode, _selected, _str,
                     _tiny_episodes_seconds, auto_lead_in, base_model_path, capability_envs, model_env_kwargs_fn,
                     train_env_kwargs, workspace_registries)

logger = logging.getLogger(__name__)


def _train_job(ctx, name: str, env_ids: list[str], steps: int, sft: bool = False,
               minutes: float | None = None) -> dict:
    """The job that trains one adapter into ``train/<name>/`` (the keyword arguments of :func:`_train_adapter`),
    or, when it finished before an interruption, ``{"record": <its result record>}``."""
    from trace_train.train.grpo import TrainConfig

    out = ctx.path("train", name)
    done_file = out / "result.json"
    if done_file.exists():  # finished before an interruption: keep it
        return {"record": json.loads(done_file.read_text())}
    t = ctx.cfg.train
    registry = [str(ctx.workspace)] if (ctx.workspace / "registry.yaml").exists() else []
    # The trainer applies the kwargs the model was warmed up with (e.g. the compact prompt) by itself;
    # train.options.env_kwargs override them. An interrupted adapter continues from its last checkpoint.
    checkpoints = out / "run" / "checkpoints"
    resume = checkpoints.is_dir() and any(checkpoints.glob("checkpoint-*"))
    kwargs = {"progress": ctx.progress, **t.options, "env_ids": list(env_ids), "model": base_model_path(ctx),
              "output_dir": str(out / "run"), "device": ctx.cfg.base.device, "registry": registry, "sft": sft,
              "resume": resume, ("sft_steps" if sft else "max_steps"): steps}
    if "env_kwargs" in kwargs:  # lead_in: auto becomes the families the base answers
        kwargs["env_kwargs"] = train_env_kwargs(ctx)
    if minutes is not None and not sft:
        kwargs["max_minutes"] = minutes
    if sft:  # the replay term is GRPO's; the SFT baseline replays through sft_replay_share
        kwargs.pop("grpo_replay_weight", None)
    if (kwargs.get("sft_replay_share") or kwargs.get("grpo_replay_weight")) and not kwargs.get("sft_replay"):
        # The base's own episodes on the target: the rollout stage's. (The stage reads them without listing
        # "rollout" among its inputs: they reach it through the diagnosis, whose outputs change with them.)
        kwargs["sft_replay"] = str(ctx.path("rollouts", "trajectories.jsonl"))
    if sft:  # train.options.sft_warmup_steps warms up the GRPO runs; the SFT baseline is all SFT already
        for key in ("sft_warmup_steps", "sft_warmup_env_kwargs", "sft_warmup_lora"):
            kwargs.pop(key, None)
    try:
        cfg = TrainConfig(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"train.options: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"train: {exc}") from None
    return {"cfg": cfg, "out": out, "name": name, "env_ids": list(env_ids), "sft": sft, "launcher": t.launcher,
            "accelerate_args": list(t.accelerate_args)}


def _train_adapter(cfg, out: Path, name: str, env_ids: list[str], sft: bool, launcher: str,
                   accelerate_args: list) -> dict:
    """Train one adapter (in this process or a worker) and write its ``result.json``; returns the record."""
    from trace_train.train.grpo import train

    t0 = time.perf_counter()
    if launcher == "accelerate":
        result = _accelerate_train(cfg, out, accelerate_args)
    else:
        if cfg.registry:  # a worker process starts with the built-in registry only
            import trace_envs

            for path in cfg.registry:
                trace_envs.load_registry(path)
        result = train(cfg).to_dict()
    record = {"name": name, "env_ids": list(env_ids), "sft": sft, "adapter_dir": str(result["adapter_dir"]),
              "log_csv": str(result["log_csv"]), "curve_png": _str(result.get("curve_png")),
              "steps": int(result["steps"]), "rollouts": int(result["rollouts"]),
              "calibration": result.get("calibration"), "seconds": round(time.perf_counter() - t0, 2)}
    (out / "result.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return record


def _run_train_jobs(jobs: dict[str, dict], workers: int) -> dict[str, dict]:
    """The result record of every job (key -> record): in this process, or ``workers`` at a time in spawned
    worker processes (each trains on its own ``base.threads`` threads; accelerate launches stay here)."""
    records = {k: j["record"] for k, j in jobs.items() if "record" in j}
    todo = {k: j for k, j in jobs.items() if "record" not in j}
    parallel = {k: j for k, j in todo.items() if j["launcher"] != "accelerate"} if workers > 1 else {}
    if len(parallel) <= 1:
        parallel = {}
    for k, j in todo.items():
        if k not in parallel:
            records[k] = _train_adapter(**j)
    if parallel:
        import dataclasses

        logger.info("training %d adapters in %d worker processes", len(parallel), workers)
        with _worker_pool(workers) as pool:
            futures = {k: pool.submit(_train_adapter, **{**j, "cfg": dataclasses.replace(j["cfg"], progress=False)})
                       for k, j in parallel.items()}
            for k, future in futures.items():
                records[k] = future.result()
    return {k: records[k] for k in jobs}


def _accelerate_train(cfg, out: Path, accelerate_args: list) -> dict:
    """Train one adapter in ``accelerate launch`` processes (several GPUs); returns its ``train_result.json``."""
    import subprocess
    import sys

    config = cfg.to_yaml(out / "train_config.launch.yaml")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *map(str, accelerate_args), "-m", "trace_train.cli",
           "train", "--config", str(config)]
    logger.info("train: %s", " ".join(cmd))
    done = subprocess.run(cmd)
    result = Path(cfg.output_dir) / "train_result.json"
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"`{' '.join(cmd)}` failed (exit status {done.returncode}); its output is above")
    return json.loads(result.read_text())


def run_train(ctx) -> tuple[list[str], dict]:
    t = ctx.cfg.train
    if not base_model_path(ctx):
        raise ConfigError("train.model is required: the base agent has no local weights to train adapters on")
    envs = capability_envs(ctx)
    ctx.path("train").mkdir(parents=True, exist_ok=True)
    lead_in = _auto_lead_in_summary(ctx)
    jobs = {cap: _train_job(ctx, cap, [env["env_id"]], t.max_steps, minutes=t.max_minutes) for cap, env in envs.items()}
    env_ids = [e["env_id"] for e in envs.values()]
    if env_ids and t.multi_baseline and len(env_ids) > 1:
        jobs["_multi"] = _train_job(ctx, "_multi", env_ids, t.multi_steps or t.max_steps * len(env_ids),
                                    minutes=t.max_minutes * len(env_ids) if t.max_minutes else None)
    if env_ids and t.sft_baseline:
        jobs["_sft"] = _train_job(ctx, "_sft", env_ids, t.sft_steps, sft=True)
    # The multi-capability baseline (the longest run) goes first, so that the workers finish close together.
    order = sorted(jobs, key=lambda k: k != "_multi") if t.workers > 1 else list(jobs)
    records = _run_train_jobs({k: jobs[k] for k in order}, t.workers)
    if t.select_seeds is not None:
        for key in [k for k in order if not records[k]["sft"]]:
            records[key] = _select(ctx, key, records[key])
    adapters = {cap: records[cap] | {"source": env["source"]} for cap, env in envs.items()}
    baselines = {k.lstrip("_"): records[k] for k in ("_multi", "_sft") if k in records}
    (ctx.path("train", "results.json")).write_text(json.dumps({"adapters": adapters, "baselines": baselines},
                                                              indent=2, default=str) + "\n")
    missing = [c for c in _selected(ctx) if c not in envs]
    return ["train"], {"adapters": {c: a["adapter_dir"] for c, a in adapters.items()},
                       "baselines": {k: v["adapter_dir"] for k, v in baselines.items()},
                       "no_env": missing, "rollouts": {k: v["rollouts"] for k, v in {**adapters, **baselines}.items()},
                       **({"lead_in": lead_in} if lead_in else {})}


def _auto_lead_in_summary(ctx) -> dict | None:
    """For ``lead_in: auto``: the families chosen and the base's rollout record behind them (logged, and kept in
    the stage's summary); None otherwise."""
    if ((ctx.cfg.train.options or {}).get("env_kwargs") or {}).get("lead_in") != "auto":
        return None
    families, counts = auto_lead_in(ctx.path("rollouts", "trajectories.jsonl"))
    record = ", ".join(f"{f} {won}/{n}" for f, (won, n) in sorted(counts.items()))
    logger.info("train: lead_in auto -> %s (the base's rollouts: %s)", families or "none", record)
    return {"families": families, "base_rollouts": counts, "min_success": LEAD_IN_AUTO_MIN_SUCCESS,
            "min_episodes": LEAD_IN_AUTO_MIN_EPISODES}


def _select(ctx, key: str, record: dict) -> dict:
    """``record`` with its adapter replaced by the checkpoint that did best on the validation seeds of its own
    envs (:func:`trace_train.train.select.select_checkpoint`); the choice is kept in ``train/<key>/select/``
    and a rerun with the same seeds reads it back instead of playing again."""
    from trace_train.compose.adapters import adapter_update_is_zero
    from trace_train.train.select import select_checkpoint

    if adapter_update_is_zero(record["adapter_dir"]):
        # B never left zero, so no checkpoint did either: every one of them is the base. Nothing to choose.
        return {**record, "selected": {"step": record["steps"], "final_step": record["steps"],
                                       "skipped": "a zero update: every checkpoint is the base"}}
    t, b = ctx.cfg.train, ctx.cfg.base
    seeds = parse_seeds("train.select_seeds", t.select_seeds)
    out = ctx.path("train", key, "select")
    done = out / "selection.json"
    spec = {"seeds": [min(seeds), max(seeds) + 1], "every": t.select_every}
    if done.exists():
        previous = json.loads(done.read_text())
        if previous.get("spec") == spec:
            return _selected_record(record, previous)
    model = base_model_path(ctx)
    run_dir = Path(record["adapter_dir"]).parent  # train/<key>/run: its checkpoints/ and the final adapter/
    logger.info("train: choosing %s's checkpoint on %d validation seeds of %s", key, len(seeds),
                ", ".join(record["env_ids"]))
    chosen = select_checkpoint(model, run_dir, record["env_ids"], seeds, out,
                               env_kwargs=model_env_kwargs_fn(model, train_env_kwargs(ctx)),
                               every=t.select_every, workers=t.workers, in_flight=ctx.cfg.evaluate.in_flight,
                               registries=workspace_registries(ctx), max_new_tokens=b.max_new_tokens,
                               decode=b.decode, threads=b.threads, seed=ctx.cfg.seed,
                               final_adapter=record["adapter_dir"], progress=ctx.progress).to_dict()
    chosen["spec"], chosen["curve_png"] = spec, str(out / "curve.png")
    done.write_text(json.dumps(chosen, indent=2) + "\n")
    return _selected_record(record, chosen)


def _selected_record(record: dict, selection: dict) -> dict:
    """The train record of the chosen checkpoint: its adapter, and the choice beside the run's own figures."""
    best = next(r for r in selection["rows"] if r["step"] == selection["step"])
    last = next((r for r in selection["rows"] if r["step"] == selection["final_step"]), None)
    played = sum(int(r["episodes"]) for r in selection["rows"])
    # The validation episodes are env interactions the method spent too: "rollouts spent" counts them.
    return {**record, "final_adapter_dir": record.get("final_adapter_dir", record["adapter_dir"]),
            "adapter_dir": selection["adapter_dir"],
            "train_rollouts": record.get("train_rollouts", record["rollouts"]),
            "rollouts": record.get("train_rollouts", record["rollouts"]) + played,
            "selected": {"step": selection["step"], "final_step": selection["final_step"],
                         "success": best["success"], "final_success": last["success"] if last else None,
                         "base_success": selection["rows"][0]["success"], "seeds": selection["seeds"],
                         "episodes": played, "curve_png": selection.get("curve_png")}}


def _fast_grpo(ctx) -> bool:
    """Whether GRPO runs the fast path (``train.options`` decode and loss_forward; auto: on CPU, the tiny model)."""
    o = ctx.cfg.train.options
    decode, loss = o.get("decode", "auto"), o.get("loss_forward", "auto")
    if decode == "hf" or loss == "trl":
        return False
    return str(o.get("device", "auto")) in ("auto", "cpu")


def estimate_train(ctx) -> tuple[float | None, str]:
    t = ctx.cfg.train
    k = len(_selected(ctx)) if ctx.done("diagnose") else ctx.cfg.diagnose.max_capabilities
    from trace_train.tiny.build import PRESETS

    model = t.model or (ctx.summary("base").get("model_path") if ctx.cfg.base.kind != "tiny" else "tiny")
    if model not in PRESETS and not (model and Path(model, "trace_model.json").exists()):
        return None, f"{k} adapters × {t.max_steps} GRPO steps (time depends on the model and the GPUs)"
    runs = k + k * t.multi_baseline * (k > 1)  # the multi baseline gets the budget of all k adapters
    sft = t.sft_baseline * (t.sft_steps * SECONDS_PER_SFT_STEP_TINY + 30.0)
    # train.options.sft_warmup_steps: every GRPO run first fits its LoRA by SFT (outside its max_minutes).
    warm = int(t.options.get("sft_warmup_steps") or 0) * SECONDS_PER_SFT_STEP_TINY
    # Several workers: the runs share them; no fewer seconds than the longest run (the multi baseline's).
    longest = k * t.multi_baseline * (k > 1) or 1
    if t.max_minutes:
        total = runs * (t.max_minutes * 60 + 30.0 + warm) + sft
        floor = longest * (t.max_minutes * 60 + 30.0) + warm
        what = f"{k} adapters × {t.max_minutes:g} min of GRPO + the multi-capability and SFT baselines"
    else:
        per_step = SECONDS_PER_GRPO_STEP_TINY_FAST if _fast_grpo(ctx) else SECONDS_PER_GRPO_STEP_TINY
        total = runs * (t.max_steps * per_step + warm) + sft
        floor = longest * t.max_steps * per_step + warm
        what = f"{k} adapters × {t.max_steps} GRPO steps + baselines"
    if warm:
        what += f" (each GRPO run after {t.options['sft_warmup_steps']} SFT warm-up steps)"
    seconds = max(total / t.workers, floor) if t.workers > 1 else total
    if t.workers > 1:
        what += f", {t.workers} at once"
    if t.select_seeds is not None:
        select, n = _estimate_select(ctx, k, runs)
        seconds += select
        what += f", checkpoint selection ({n} validation episodes)"
    return seconds, what


def _estimate_select(ctx, k: int, runs: int) -> tuple[float, int]:
    """Rough seconds and episodes of checkpoint selection: per GRPO run, the base and every ``select_every``-th
    of its saved checkpoints on the validation seeds of its envs (the multi baseline plays all ``k`` envs)."""
    t = ctx.cfg.train
    seeds = len(parse_seeds("train.select_seeds", t.select_seeds))
    steps = t.max_steps
    if t.max_minutes:  # the budget ends training first: the headline recipe made ~75 steps in 10 min (8 s a step)
        steps = min(steps, max(1, int(t.max_minutes * 60 / SECONDS_PER_GRPO_STEP_TINY)))
    saves = int((t.options or {}).get("save_steps") or steps)
    played = 1 + math.ceil(max(1, steps // saves) / t.select_every)
    envs = k + (k if runs > k else 0)  # each adapter's env; the multi baseline's k envs
    n = played * envs * seeds
    fast = _fast_decode(ctx)
    return _tiny_episodes_seconds(n, ctx.cfg.evaluate.in_flight, fast) / t.workers, n
