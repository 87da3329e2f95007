"""The ``evaluate`` stage: every method on the held-out target seeds -> ``eval/<method>/``, ``eval/results.json``.

Each method's episodes are one :class:`~trace_train.backends.RolloutJob`, run by the rollout backend of
``rollout.engine`` (:func:`~trace_train.backends.run_jobs`): ``evaluate.workers`` local processes side by side,
or Ray actors.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from pathlib import Path
from typing import Any

from trace_train.backends import RolloutJob, run_jobs

from ..config import parse_seeds
from .common import (_fast_decode, _selected, _tiny_episodes_seconds, base_agent_factory, base_env_kwargs_fn,
                     base_model_path, capability_envs, model_env_kwargs_fn, train_env_kwargs, train_records,
                     workspace_registries)

logger = logging.getLogger(__name__)


def warmup_adapters(ctx) -> dict[str, tuple[str, int]]:
    """Capability -> (the SFT warm-up adapter its GRPO run started from, oracle episodes it was fitted on), for the
    runs that had one (``train.options.sft_warmup_steps``): SFT on that capability's env alone."""
    out = {}
    for cap, record in (train_records(ctx) if ctx.done("train") else {}).items():
        final = record.get("final_adapter_dir") or record.get("adapter_dir")
        folder = Path(final).parent / "sft_warmup" if final else None
        if folder is None or not (folder / "done.json").is_file() or not (folder / "adapter").is_dir():
            continue
        done = json.loads((folder / "done.json").read_text())
        out[cap] = (str(folder / "adapter"), int(done.get("episodes", 0)))
    return out


def method_agents(ctx) -> list[tuple[str, str, Any, int, str]]:
    """The methods to evaluate, as ``(key, label, make_agent, rollouts_spent, note)``; ``make_agent`` is None
    for a method this run does not have (``note`` says why)."""
    from trace_train.agents import HFAgent

    e, b = ctx.cfg.evaluate, ctx.cfg.base
    model = base_model_path(ctx)
    train = ctx.summary("train") if ctx.done("train") else {}
    comp = ctx.summary("compose") if ctx.done("compose") else {}
    spent = train.get("rollouts", {})
    adapters = train.get("adapters", {})
    total_adapter_rollouts = sum(spent.get(c, 0) for c in adapters)

    def hf(path: str, adapter: str | None = None):
        # A partial of the class, not a closure: it pickles, so evaluate.workers can build it in a worker process.
        return functools.partial(HFAgent, path, adapter=adapter, threads=b.threads, device=b.device,
                                 max_new_tokens=b.max_new_tokens, temperature=e.temperature, seed=ctx.cfg.seed,
                                 decode=b.decode)

    def why_missing(stage: str) -> str:
        entry = ctx.state["stages"].get(stage, {})
        status = entry.get("status", "pending")
        if status == "unavailable":
            return f"not in this run: the {stage} stage is not available in this build"
        if status != "done":
            return f"not in this run: the {stage} stage did not finish ({status})"
        return f"not in this run: the {stage} stage produced none"

    def compose_missing(detail: str) -> str:
        """Why a row built by the compose stage is absent: that stage, or the training before it, or ``detail``."""
        if not ctx.done("compose"):
            return why_missing("compose")
        if not adapters:
            return why_missing("train") if not ctx.done("train") else "not in this run: no adapter was trained"
        return detail

    rows: list[tuple[str, str, Any, int, str]] = []
    wanted = set(e.methods)
    if "base" in wanted:
        rows.append(("base", "base", base_agent_factory(ctx, e.temperature), 0, ""))
    if "sft" in wanted:
        a = train.get("baselines", {}).get("sft")
        rows.append(("sft", "SFT on synthetic data", hf(model, a) if a else None, spent.get("sft", 0),
                     "" if a else why_missing("train")))
    if "sft" in wanted:  # SFT on each capability's env alone: its GRPO run's warm-up (the L1 transfer ceiling)
        for cap, (warm, episodes) in warmup_adapters(ctx).items():
            rows.append((f"sft:{cap}", f"SFT on {cap}'s env (its GRPO warm-up)", hf(model, warm), episodes, ""))
    if "adapters" in wanted:
        if adapters:
            for cap, a in adapters.items():
                rows.append((f"adapter:{cap}", f"single adapter: {cap}", hf(model, a), spent.get(cap, 0), ""))
        else:
            rows.append(("adapters", "single-capability adapters", None, 0, why_missing("train")))
    if "multi" in wanted:
        a = train.get("baselines", {}).get("multi")
        note = "" if a else (why_missing("train") if not adapters else "not in this run: needs ≥ 2 capabilities")
        rows.append(("multi", "multi-capability GRPO (one adapter)", hf(model, a) if a else None,
                     spent.get("multi", 0), note))
    methods = comp.get("methods", {})
    for method in ("linear", "ties"):
        if f"merge_{method}" in wanted:
            m = methods.get(method)
            note = "" if m else compose_missing(
                f"not in this run: the {method} merge was not built (see the compose log)"
                if method in ctx.cfg.compose.merges else "not in this run: not in compose.merges")
            rows.append((f"merge_{method}", f"merge ({method})", hf(m["model"], m["adapter"]) if m else None,
                         total_adapter_rollouts, note))
    if "per_episode" in wanted:
        p = methods.get("per_episode")
        # "dropped_zero_updates": the key of runs made before compose.drop_unimproved
        dropped = comp.get("dropped", comp.get("dropped_zero_updates")) or []
        why = {n: "a zero update, the base itself" for n in dropped} | (comp.get("dropped_why") or {})
        note = "" if p else compose_missing(
            "not in this run: needs ≥ 2 adapters and compose.per_episode"
            + (f" ({'; '.join(f'{n} left out of the composition: {why[n]}' for n in dropped)})"
               if dropped else ""))
        rows.append(("per_episode", "per-episode routing", hf(p["model"], p["adapter"]) if p else None,
                     total_adapter_rollouts + int(comp.get("router_episodes", 0)), note))
    # The routers of the field (compose.options.composers): rows wherever the compose stage built them.
    for key, label in (("per_task", "the authors' per-task routing (one adapter per task, chosen by the base)"),
                       ("arrow", "PEFT's Arrow routing (per token, no router training)"),
                       ("top2", "TRACE MoE at top-2 (its gates)"), ("top4", "TRACE MoE at top-4 (its gates)")):
        m = methods.get(key)
        if m:
            rows.append((key, label, hf(m["model"], m["adapter"]), total_adapter_rollouts, ""))
    if "trace_moe" in wanted:
        moe = methods.get("composed")
        rows.append(("trace_moe", f"TRACE MoE ({_moe_routing(moe['model'] if moe else None)})",
                     hf(moe["model"], moe["adapter"]) if moe else None,
                     total_adapter_rollouts + int(comp.get("router_episodes", 0)),
                     "" if moe else compose_missing("not in this run: the compose stage produced none")))
    return rows


def _moe_routing(folder: str | None) -> str:
    """How the composed model at ``folder`` routes, for its row's label."""
    spec = Path(folder) / "compose.json" if folder else None
    routing = json.loads(spec.read_text()).get("routing", "token") if spec and spec.is_file() else "token"
    return "top-1, one choice per message" if routing == "segment" else "token-level top-1"


def run_evaluate(ctx) -> tuple[list[str], dict]:
    from trace_train.evaluate import compare, evaluate

    e, r = ctx.cfg.evaluate, ctx.cfg.rollout
    seeds = parse_seeds("evaluate.seeds", e.seeds)
    model = base_model_path(ctx)
    if (ctx.workspace / "registry.yaml").exists():
        import trace_envs

        trace_envs.load_registry(str(ctx.workspace))
    mix = None
    if e.mixed:  # conversations that need two capabilities at once: the target bundles, the seeds are chosen
        from ..config import mixed_settings
        from ...mixed_eval import choose_seeds, mixed_kwargs

        settings = mixed_settings(e.mixed)
        if len(r.targets) != 1:
            raise ValueError(f"evaluate.mixed needs one target env, the run has {len(r.targets)}: {r.targets}")
        target = r.targets[0]
        seeds, kinds = choose_seeds(target, mixed_kwargs(model_env_kwargs_fn(model, r.env_kwargs)(target), settings),
                                    len(seeds), min(seeds), settings)
        mix = {**settings, "seeds": seeds, "kinds": {str(s): k for s, k in kinds.items()},
               "mixed": sum(k == "mixed" for k in kinds.values()), "single": sum(k == "single" for k in kinds.values())}
    results: dict[str, dict] = {}
    base_traj = ctx.path("eval", "base", "trajectories.jsonl")
    rows = method_agents(ctx)
    same_as_base = _same_weights_as_base(ctx, [key for key, _, make, _, _ in rows if make is not None])
    jobs = []
    for key, label, make, spent, note in rows:
        if make is None or key in same_as_base:
            continue
        kwargs = base_env_kwargs_fn(ctx) if key == "base" else model_env_kwargs_fn(model, r.env_kwargs)
        per_env = {env_id: kwargs(env_id) for env_id in r.targets}
        if mix is not None:
            per_env = {env_id: mixed_kwargs(k, mix) for env_id, k in per_env.items()}
        jobs.append(RolloutJob(key=key, make=make, targets=list(r.targets), seeds=seeds, samples=e.samples,
                               out=ctx.path("eval", key.replace(":", "_"), "trajectories.jsonl"),
                               in_flight=e.in_flight, env_kwargs=per_env, progress=ctx.progress,
                               retry_env_errors=True, registries=workspace_registries(ctx), agent_name=key))
    env_jobs, env_copies = _env_jobs(ctx, rows, same_as_base, model)
    run_jobs(jobs + env_jobs, r.engine, workers=e.workers, ray=ctx.cfg.ray)
    for source, target, key in env_copies:  # an adapter that is the base: the base's episodes are its own
        _episodes_as(source, target, key)
    outs = {job.key: job.out for job in jobs}
    for key in same_as_base:
        outs[key] = _episodes_as(base_traj, ctx.path("eval", key.replace(":", "_"), "trajectories.jsonl"), key)
    for key, label, make, spent, note in rows:
        if key in same_as_base:
            note = SAME_AS_BASE_NOTE
        row: dict[str, Any] = {"label": label, "rollouts_spent": spent, "note": note}
        if make is None:
            results[key] = row | {"available": False}
            continue
        out = outs[key]
        metrics = evaluate(out, ks=e.ks, n_boot=e.bootstrap, seed=ctx.cfg.seed)
        row |= {"available": True, "trajectories": str(out.relative_to(ctx.run_dir)), "overall": metrics["overall"],
                "by_scenario": metrics["by_scenario"]}
        if key != "base" and base_traj.exists():
            cmp = compare(base_traj, out, ks=e.ks, n_boot=e.bootstrap, seed=ctx.cfg.seed)
            row["delta_vs_base"] = cmp["delta"]
            row["tasks_vs_base"] = cmp["tasks"]
        if mix is not None:  # single and mixed conversations apart, per conversation and per request
            from trace_train.evaluate import load_records

            from ...mixed_eval import split_scores

            row["mix"] = split_scores(load_records(out), mix["families"])
        if key == "trace_moe":  # where its router sent each family's tokens (the composition link's why)
            moe = ((ctx.summary("compose") if ctx.done("compose") else {}).get("methods") or {}).get("composed") or {}
            row["routing_by_family"] = _routing_by_family(moe.get("model"), out)
            if mix is not None:  # which expert wrote each assistant turn of the mixed conversations
                row["turn_routing"] = _turn_routing(moe.get("model"), out, r.targets[0],
                                                    mixed_kwargs(model_env_kwargs_fn(model, r.env_kwargs)(
                                                        r.targets[0]), mix), mix["families"])
        (out.parent / "metrics.json").write_text(json.dumps(row, indent=2, default=str) + "\n")
        results[key] = row
    _write_results(ctx.path("eval", "results.json"), results, seeds, e, mix)
    return ["eval"], {"methods": {k: (v.get("overall", {}).get("pass@1") or {}).get("value")
                                  for k, v in results.items() if v.get("available")},
                      "not_run": {k: v["note"] for k, v in results.items() if not v.get("available")}}


def _routing_by_family(folder: str | None, trajectories: Path) -> str | None:
    """``routing_by_family.csv`` (and ``.png``) beside the MoE's episodes: the share of tokens each slot received,
    per target family and message role, over the blocks; its file name (None without a composed model). The
    family of an episode is its task's scenario."""
    from trace_train.compose import ComposedModel, is_composed_dir
    from trace_train.compose.data import encode
    from trace_train.compose.train import routing_stats, write_routing
    from trace_train.rollouts import read_trajectories

    if not folder or not is_composed_dir(folder) or not trajectories.exists():
        return None
    from transformers import AutoTokenizer

    model = ComposedModel.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    episodes = []
    for record in read_trajectories(trajectories):
        family = record.get("scenario") or (record.get("task") or {}).get("scenario") or record["env_id"]
        episodes.append(encode(tokenizer, {**record, "env_id": str(family)}, None))
    csv_path, _ = write_routing(routing_stats(model, episodes), model.slot_names(), trajectories.parent,
                                name="routing_by_family")
    return csv_path.name


def _turn_routing(folder: str | None, trajectories: Path, env_id: str, kwargs: dict,
                  families: list[str]) -> dict | None:
    """``turn_routing.csv`` beside the MoE's episodes: per assistant message of each mixed conversation, the request
    it serves and the share of its tokens each slot got; and the summary (:func:`~trace_train.compose.turns.
    switch_summary`) with the file's name. None without a composed model."""
    import csv

    from trace_train.compose import ComposedModel, is_composed_dir
    from trace_train.compose.turns import switch_summary, turn_routing
    from trace_train.rollouts import read_trajectories

    from ...mixed_eval import record_kind, request_texts_fn

    if not folder or not is_composed_dir(folder) or not trajectories.exists():
        return None
    from transformers import AutoTokenizer

    model = ComposedModel.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = request_texts_fn(env_id, kwargs)
    names = model.slot_names()
    path = trajectories.parent / "turn_routing.csv"
    episodes = []
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["seed", "scenario", "turn", "request", "family", "tokens", *names])
        w.writeheader()
        for record in read_trajectories(trajectories):
            if record_kind(record, families) != "mixed":
                continue
            rows = turn_routing(model, tokenizer, record, texts(int(record["seed"])))
            episodes.append(rows)
            scenario = (record.get("task") or {}).get("scenario")
            w.writerows({"seed": record["seed"], "scenario": scenario, **row} for row in rows)
    return {"csv": path.name, **switch_summary(episodes, names)}


def _env_jobs(ctx, rows: list, same_as_base: set[str], model: str | None) -> tuple[list[RolloutJob], list[tuple]]:
    """The learning link's episodes (L2): the base, each capability's adapter and, where its GRPO run had one, the
    SFT warm-up it started from, on ``evaluate.env_seeds`` of that capability's own env, into
    ``eval/env/<capability>/<base|adapter|warmup>/``; and the (source, target, key) copies for adapters that are
    the base. The warm-up's episodes split the adapter's gain into the warm-up's share and GRPO's own."""
    e = ctx.cfg.evaluate
    if not e.env_seeds:
        return [], []
    seeds = parse_seeds("evaluate.env_seeds", e.env_seeds)
    makes = {key: make for key, _, make, _, _ in rows}
    if makes.get("base") is None:
        return [], []
    kwargs = model_env_kwargs_fn(model, train_env_kwargs(ctx))
    jobs, copies = [], []
    for cap, info in capability_envs(ctx).items():
        key = f"adapter:{cap}"
        if makes.get(key) is None:
            continue
        env_id = info["env_id"]
        outs = {who: ctx.path("eval", "env", cap, who, "trajectories.jsonl")
                for who in ("base", "adapter", "warmup")}
        plays = [("base", makes["base"])] + ([] if key in same_as_base else [("adapter", makes[key])])
        if makes.get(f"sft:{cap}") is not None:  # what GRPO started from: its own share of the gain is after it
            plays.append(("warmup", makes[f"sft:{cap}"]))
        for who, make in plays:
            jobs.append(RolloutJob(key=f"env:{cap}:{who}", make=make, targets=[env_id], seeds=seeds, samples=1,
                                   out=outs[who], in_flight=e.in_flight, env_kwargs={env_id: kwargs(env_id)},
                                   progress=ctx.progress, retry_env_errors=True,
                                   registries=workspace_registries(ctx), agent_name=f"env:{cap}:{who}"))
        if key in same_as_base:
            copies.append((outs["base"], outs["adapter"], f"env:{cap}:adapter"))
    return jobs, copies


#: The note of a result row whose episodes are the base's (see :func:`_same_weights_as_base`).
SAME_AS_BASE_NOTE = ("its LoRA update is exactly zero (every GRPO group was flat), so it is the base model: "
                     "the base's greedy episodes are its episodes")


def _same_weights_as_base(ctx, keys: list[str]) -> set[str]:
    """The methods among ``keys`` that are the base model itself: an adapter (single, multi or SFT) on the
    base's own weights whose LoRA update is exactly zero (:func:`~trace_train.compose.adapters.adapter_update_is_zero`).

    Greedy decoding of the same weights with the same settings gives the same episodes, so evaluating such a
    method again only spends minutes; its row reuses the base's episodes and says so. Only when the base row
    is the local model the adapters were trained on, and only for greedy evaluation (samples drawn in
    another process would not be the same draws).
    """
    from trace_train.compose.adapters import adapter_update_is_zero

    b, e = ctx.cfg.base, ctx.cfg.evaluate
    if "base" not in keys or b.kind not in ("tiny", "hf") or e.temperature > 0 or not ctx.done("train"):
        return set()
    if ctx.summary("base").get("model_path") != base_model_path(ctx):
        return set()  # the adapters were trained on another model (train.model)
    train = ctx.summary("train")
    dirs = {f"adapter:{cap}": a for cap, a in train.get("adapters", {}).items()}
    dirs |= {k: a for k, a in train.get("baselines", {}).items()}
    return {k for k in keys if k in dirs and adapter_update_is_zero(dirs[k])}


def _episodes_as(source: Path, out: Path, agent: str) -> Path:
    """A copy of the trajectory file ``source`` at ``out``, its episodes renamed to agent ``agent``."""
    from trace_train.rollouts import jsonl_line, read_trajectories

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(b"".join(jsonl_line({**record, "agent": agent}) for record in read_trajectories(source)))
    return out


def _write_results(path: Path, results: dict, seeds: list[int], e, mix: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seeds": [min(seeds), max(seeds) + 1], "n_seeds": len(seeds), "samples": e.samples,
                                "ks": e.ks, "temperature": e.temperature, "methods": results,
                                **({"mix": mix} if mix is not None else {})},
                               indent=2, default=str) + "\n")


def estimate_evaluate(ctx) -> tuple[float | None, str]:
    e, r = ctx.cfg.evaluate, ctx.cfg.rollout
    n = len(r.targets) * len(parse_seeds("evaluate.seeds", e.seeds)) * e.samples
    k = len(_selected(ctx)) if ctx.done("diagnose") else ctx.cfg.diagnose.max_capabilities
    composers = len((ctx.cfg.compose.options or {}).get("composers") or [])  # per_task, arrow: rows of their own
    methods = 1 + (len(e.methods) - 2) + k + composers  # base + the other rows (one per adapter)
    warmups = "sft" in e.methods and int(ctx.cfg.train.options.get("sft_warmup_steps") or 0) > 0
    if warmups:
        methods += k  # each GRPO run's SFT warm-up is a row of its own (the L1 transfer ceiling)
    # Every row but a scripted or endpoint base's own is a local model (an adapter, a merge, the composer);
    # per-episode routing decodes with generate() (its rows route apart, so they share no prefix), the others
    # (the token-level MoE included) as base.decode says.
    fast = _fast_decode(ctx)
    # Rows that decode with generate() whatever base.decode says: per-episode routing. (A MoE with context gates
    # takes the fast loop too, re-encoding each prompt after the shared prefix: its running sums are not stored.)
    # Per-task routing and Arrow decode with generate() too (one adapter per row; a LoRA variant).
    composer = int("per_episode" in e.methods) + composers
    per_method = [_tiny_episodes_seconds(n, e.in_flight, fast and i >= composer) for i in range(methods)]
    if e.mixed:  # a mixed conversation holds two or three requests: about twice the turns of a single one
        from ..config import mixed_settings

        per_method = [s * (1 + mixed_settings(e.mixed)["share"]) for s in per_method]
    workers = min(e.workers, methods)
    seconds = math.ceil(methods / workers) * sum(per_method) / methods
    note = f"≤ {methods} methods × {n} held-out episodes" + (f", {workers} at once" if workers > 1 else "")
    if e.env_seeds:  # the learning link: base and adapter (and warm-up) on each capability env's held-out seeds
        m = len(parse_seeds("evaluate.env_seeds", e.env_seeds))
        plays = 3 if warmups else 2  # the warm-ups are played on their envs too (GRPO's own share, L2)
        seconds += plays * k * _tiny_episodes_seconds(m, e.in_flight, fast) / max(1, min(e.workers, plays * k))
        note += f", + base, {'warm-up ' if warmups else ''}and adapter × {m} seeds of each capability env"
    return seconds, note
