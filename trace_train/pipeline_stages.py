"""The stages of ``trace run`` (:mod:`trace_train.pipeline` runs them and keeps their bookkeeping).

Each ``run_<stage>(ctx)`` reads only the files earlier stages wrote into the run directory, writes its own
(DESIGN.md, "Run directory") and returns ``(outputs, summary)``. Each ``estimate_<stage>(ctx)`` returns the
expected seconds (or None) and a one-line note for ``--dry-run``; the per-unit times are constants measured on
a 2-core CPU with the tiny model (noisy: the machine was shared), so they are rough by design.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from .pipeline_config import BaseSection, ConfigError, parse_seeds

logger = logging.getLogger(__name__)

# Rough per-unit seconds on a 2-core CPU (see the module docstring).
SECONDS_PER_SCRIPTED_EPISODE = 0.05
# A batch of b tiny-model episodes generated together (compact τ² prompt, ≤ 16 turns of ≤ 96 tokens) takes about
# SECONDS_PER_TINY_BATCH + b × SECONDS_PER_TINY_EPISODE_IN_BATCH on one thread: decoding steps, not batch width,
# are most of the cost (measured: 40 episodes in 96 s; 9 methods x 40 held-out episodes, two at once, in 439 s).
SECONDS_PER_TINY_BATCH = 40.0
SECONDS_PER_TINY_EPISODE_IN_BATCH = 1.5
# With decode: fast (trace_train.fast_decode, the default for the tiny model on CPU), measured by
# `bench/rollout_speed.py --in-flight 8 40` on the embedded default's evaluation, both paths in one run (two runs,
# docs/speed.md): 3.3x and 4.1x the episodes per second of decode: hf at 8 in flight (decoding steps: the per-batch
# term), 7.2x and 7.8x at 40 (where generate() reads 40 copies of the shared prompt's keys each token). The
# per-batch term is divided by the first ratio; the per-episode term is what then makes 40 episodes at 40 in flight
# that much faster than above.
FAST_DECODE_SPEEDUP_NARROW, FAST_DECODE_SPEEDUP_40 = 3.7, 7.5
SECONDS_PER_TINY_BATCH_FAST = SECONDS_PER_TINY_BATCH / FAST_DECODE_SPEEDUP_NARROW
SECONDS_PER_TINY_EPISODE_IN_BATCH_FAST = max(0.02, ((SECONDS_PER_TINY_BATCH + 40 * SECONDS_PER_TINY_EPISODE_IN_BATCH)
                                                    / FAST_DECODE_SPEEDUP_40 - SECONDS_PER_TINY_BATCH_FAST) / 40)
SECONDS_PER_ENDPOINT_EPISODE = 2.0    # an OpenAI-compatible endpoint, 8 requests in flight
SECONDS_PER_LABEL_OFFLINE = 0.01
SECONDS_PER_ADMISSION = 15.0          # an offline template's env admits in ~4 s under bubblewrap; LLM retries cost more
SECONDS_PER_GRPO_STEP_TINY = 8.0     # decode: hf, loss_forward: trl (the path before the fast one)
# decode: fast + loss_forward: shared_prefix (the default for the tiny model on CPU): divided by the ratio
# `bench/grpo_speed.py --rounds 2` measured between the two paths at the embedded default's train options (3.35x
# and 3.96x in two runs, docs/speed.md).
GRPO_FAST_SPEEDUP = 3.65
SECONDS_PER_GRPO_STEP_TINY_FAST = SECONDS_PER_GRPO_STEP_TINY / GRPO_FAST_SPEEDUP
SECONDS_PER_SFT_STEP_TINY = 1.2       # bench/bootstrap_curve.py: 484 warm-up steps of the tiny model in 9 min
SECONDS_PER_ROUTER_RUN_TINY = 15.0    # gates over 2 adapters on 16 oracle episodes, with the merges: 16 s
#: Warm-up steps on two torch threads against one: the default's 1200 steps in 812 s on 2 threads, its
#: earlier 800 steps in 927 s on one (the same machine: 0.68 s against 1.16 s a step).
SFT_TWO_THREAD_SPEEDUP = 1.7
SECONDS_BOOTSTRAP_SETUP = 60.0        # building the tiny model and collecting ~4,000 oracle episodes (measured 55 s)


def _prefix_key(run_dir: Path) -> str:
    return hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]


# ----------------------------------------------------------------------------- base


def tiny_bootstrap_config(section: BaseSection, target: str):
    """The :class:`~trace_train.models.BootstrapConfig` of the base warm-up (``base.bootstrap`` over defaults)."""
    from trace_train.models import BootstrapConfig

    known = {f.name for f in fields(BootstrapConfig)}
    unknown = sorted(set(section.bootstrap) - known)
    if unknown:
        raise ConfigError(f"base.bootstrap.{unknown[0]}: unknown key; valid keys: {', '.join(sorted(known))}")
    kwargs = {"target": target, "preset": section.preset, "threads": section.threads, "device": section.device,
              **section.bootstrap}
    for key in ("exclude_scenarios",):
        if key in kwargs:
            kwargs[key] = tuple(kwargs[key])
    try:
        return BootstrapConfig(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"base.bootstrap: {exc}") from None


def tiny_base_cache_dir(bcfg) -> Path:
    """Where the warmed-up base lives in the model cache: keyed by the warm-up's settings and the code version."""
    from trace_train.models import BUILD_VERSION, cache_root

    data = {k: v for k, v in asdict(bcfg).items() if k != "out"}
    key = hashlib.sha256(json.dumps({"cfg": data, "build": BUILD_VERSION}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:12]
    return cache_root() / f"run-base-{bcfg.target.replace('/', '_')}-{key}"


def _cached_base(path: Path) -> bool:
    meta = path / "trace_model.json"
    if not meta.is_file():
        return False
    try:
        return "bootstrap" in json.loads(meta.read_text())
    except json.JSONDecodeError:
        return False


def run_base(ctx) -> tuple[list[str], dict]:
    b = ctx.cfg.base
    target = ctx.cfg.rollout.targets[0]
    info: dict[str, Any] = {"kind": b.kind}
    outputs = ["base/base.json"]
    if b.kind == "tiny":
        from trace_train.models import bootstrap_model, model_metadata

        from trace_train.tiny.shipped import install_shipped_base

        bcfg = tiny_bootstrap_config(b, target)
        path = tiny_base_cache_dir(bcfg)
        cached = _cached_base(path)
        shipped = None
        if not cached:
            # A base shipped with the project for exactly this recipe: no warm-up, the same base on every CPU.
            shipped = install_shipped_base(path)
            cached = shipped is not None
        if not cached:
            # Train into a temporary folder and rename: a killed warm-up never leaves a half-saved "cached" model.
            tmp = path.with_name(path.name + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            bcfg.out = str(tmp)
            bootstrap_model(bcfg, progress=ctx.progress)
            shutil.rmtree(path, ignore_errors=True)
            tmp.rename(path)
        meta = model_metadata(path).get("bootstrap", {})
        info.update(model_path=str(path), cached=cached, shipped=shipped.name if shipped else None, warmup={
            "target": meta.get("target"), "steps": meta.get("steps"), "examples": meta.get("examples"),
            "train_seconds": meta.get("train_seconds"), "exclude_scenarios": meta.get("exclude_scenarios"),
            "scenario_counts": meta.get("scenario_counts"), "final_loss": meta.get("final_loss")})
        if (path / "loss_curve.png").exists():
            ctx.path("base").mkdir(parents=True, exist_ok=True)
            shutil.copy(path / "loss_curve.png", ctx.path("base", "warmup_loss.png"))
            outputs.append("base/warmup_loss.png")
        outputs.append(str(path))
    elif b.kind == "hf":
        info["model_path"] = b.model
        if Path(b.model).exists():
            outputs.append(str(Path(b.model).resolve()))
    elif b.kind == "openai":
        info.update(model=b.model, base_url=b.base_url)
    else:
        info.update(agent=b.agent or "mixture", agent_kwargs=b.agent_kwargs, mixture=b.mixture)
        _scripted_agent(b)  # fail here, not in the rollouts, if the name is wrong
    _check_targets(ctx)
    preset = ctx.cfg.train.model
    from trace_train.models import PRESETS

    if preset in PRESETS:  # train.model names a size preset: build it here (offline, cached by content)
        from trace_train.models import build_model, default_corpus_envs

        built = build_model(preset, env_ids=sorted(set(default_corpus_envs()) | set(ctx.cfg.rollout.targets)))
        info["train_model_path"] = str(built.path)
        outputs.append(str(built.path))
    ctx.path("base").mkdir(parents=True, exist_ok=True)
    # base.json is what later stages read; whether the warm-up came from the cache is not part of it (a
    # re-run of this stage that finds its own model cached must leave the later stages up to date).
    (ctx.path("base", "base.json")).write_text(json.dumps({k: v for k, v in info.items() if k != "cached"},
                                                          indent=2, default=str) + "\n")
    return outputs, info


def estimate_base(ctx) -> tuple[float | None, str]:
    b = ctx.cfg.base
    if b.kind != "tiny":
        return 1.0, f"{b.kind} base agent: nothing to prepare"
    try:
        bcfg = tiny_bootstrap_config(b, ctx.cfg.rollout.targets[0])
    except ConfigError as exc:
        return None, str(exc)
    if _cached_base(tiny_base_cache_dir(bcfg)):
        return 1.0, "tiny base warm-up cached (by content)"
    from trace_train.tiny.shipped import find_shipped_base

    shipped = find_shipped_base(tiny_base_cache_dir(bcfg).name)
    if shipped is not None:
        return 2.0, f"tiny base shipped with the project ({shipped.name}): no warm-up"
    per_step = SECONDS_PER_SFT_STEP_TINY / (SFT_TWO_THREAD_SPEEDUP if bcfg.threads >= 2 else 1.0)
    train = bcfg.max_seconds if bcfg.max_seconds else bcfg.steps * per_step
    budget = f"{train / 60:.0f} min budget" if bcfg.max_seconds else f"{bcfg.steps} steps"
    return SECONDS_BOOTSTRAP_SETUP + train, (f"warm-up of the {bcfg.preset} model on {bcfg.target} "
                                             f"({budget}; cached afterwards)")


def _check_targets(ctx) -> None:
    import trace_envs

    registries = [str(ctx.workspace)] if (ctx.workspace / "registry.yaml").exists() else []
    for path in registries:
        trace_envs.load_registry(path)
    for env_id in ctx.cfg.rollout.targets:
        try:
            trace_envs.get_entry(env_id)
        except KeyError:
            raise ConfigError(f"rollout.targets: unknown env id {env_id!r}; `trace envs list` shows the "
                              "registered ones") from None


class MixtureAgent:
    """Plays each episode with one of several scripted agents, picked by the episode's first observation.

    The pick is a hash of (seed, the first observation's text), so it is the same for the same task in any
    process (a resumed rollout picks what the interrupted one would have) and varies across tasks; a copy
    of this agent per open episode (what :func:`~trace_train.rollouts.run_rollouts` does) changes nothing.
    """

    def __init__(self, agents: dict[str, Any], weights: dict[str, float], seed: int = 0, name: str = "mixture"):
        self.agents, self.name, self.seed = agents, name, seed
        total = float(sum(weights.values()))
        self.cumulative, acc = [], 0.0
        for key in agents:
            acc += weights[key] / total
            self.cumulative.append((acc, key))
        self.current: Any = None
        self.picked: str | None = None

    def reset(self, env: Any, observation: str, info: dict) -> None:
        digest = hashlib.sha256(f"{self.seed}\0{observation}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        self.picked = next((k for c, k in self.cumulative if u < c), self.cumulative[-1][1])
        self.current = self.agents[self.picked]
        if hasattr(self.current, "reset"):
            self.current.reset(env, observation, info)

    def __call__(self, observation: str, info: dict) -> Any:
        return self.current(observation, info)


def _scripted_agent(b: BaseSection, seed: int = 0):
    from trace_envs.agents import agent_names, make_agent

    try:
        if b.mixture:
            return MixtureAgent({n: make_agent(n) for n in b.mixture}, dict(b.mixture), seed=seed, name="base")
        return make_agent(b.agent, **b.agent_kwargs)
    except KeyError:
        raise ConfigError(f"base.agent: unknown agent {b.agent!r}; choose one of {', '.join(agent_names())}") from None
    except TypeError as exc:
        raise ConfigError(f"base.agent_kwargs: {exc}") from None


def base_model_path(ctx) -> str | None:
    """The local model the adapters are trained on: ``train.model`` or the base agent's own model."""
    summary = ctx.summary("base")
    model = summary.get("train_model_path") or ctx.cfg.train.model or summary.get("model_path")
    return str(Path(model).expanduser()) if model else None


def model_env_kwargs_fn(model: str | None, extra: dict | None = None):
    """``env_id -> gym.make kwargs``: the kwargs a model built here was trained with, then ``extra``."""
    from trace_train.models import model_env_kwargs

    def kwargs(env_id: str) -> dict:
        base = {}
        if model and Path(model, "trace_model.json").exists():
            base = model_env_kwargs(model, env_id)
        return {**base, **(extra or {})}

    return kwargs


def base_agent_factory(ctx, temperature: float | None = None):
    """A no-argument callable that builds the base agent (at ``temperature``, default ``base.temperature``).

    For a local model it is a partial of :class:`~trace_train.agents.HFAgent`, which pickles, so a worker
    process can build its own copy; a scripted or endpoint base is built where it runs.
    """
    b = ctx.cfg.base
    temp = b.temperature if temperature is None else temperature
    if b.kind in ("tiny", "hf"):
        from trace_train.agents import HFAgent

        return functools.partial(HFAgent, ctx.summary("base")["model_path"], threads=b.threads, device=b.device,
                                 max_new_tokens=b.max_new_tokens, temperature=temp, seed=ctx.cfg.seed, name="base",
                                 decode=b.decode)
    if b.kind == "openai":
        from trace_train.agents import OpenAIChatAgent

        return lambda: OpenAIChatAgent(b.model, base_url=b.base_url, api_key=b.api_key, temperature=temp,
                                       max_tokens=b.max_new_tokens)
    return lambda: _scripted_agent(b, ctx.cfg.seed)


def base_env_kwargs_fn(ctx):
    """``env_id -> gym.make kwargs`` of the base agent's episodes: a local model's own (e.g. the compact prompt
    it was warmed up on), then ``rollout.env_kwargs``."""
    extra = ctx.cfg.rollout.env_kwargs
    if ctx.cfg.base.kind in ("tiny", "hf"):
        return model_env_kwargs_fn(ctx.summary("base")["model_path"], extra)
    return lambda env_id: dict(extra)


def _fast_decode(ctx, decode: str | None = None) -> bool:
    """Whether the base's local model decodes the fast way (``base.decode``, or ``decode``; auto: the tiny model on
    CPU)."""
    b = ctx.cfg.base
    decode = decode or b.decode
    return decode == "fast" or (decode == "auto" and b.kind == "tiny" and str(b.device).startswith("cpu"))


def _tiny_episodes_seconds(n: int, in_flight: int, fast: bool) -> float:
    """Rough seconds of ``n`` tiny-model episodes with ``in_flight`` open at once."""
    width = max(1, min(n, in_flight))
    if fast:
        return math.ceil(n / width) * (SECONDS_PER_TINY_BATCH_FAST + width * SECONDS_PER_TINY_EPISODE_IN_BATCH_FAST)
    return math.ceil(n / width) * (SECONDS_PER_TINY_BATCH + width * SECONDS_PER_TINY_EPISODE_IN_BATCH)


def _episodes_seconds(ctx, n: int, in_flight: int) -> float:
    """Rough seconds of ``n`` episodes of the base agent with ``in_flight`` open at once."""
    kind = ctx.cfg.base.kind
    if kind in ("scripted", "openai"):
        return n * {"scripted": SECONDS_PER_SCRIPTED_EPISODE, "openai": SECONDS_PER_ENDPOINT_EPISODE}[kind]
    return _tiny_episodes_seconds(n, in_flight, _fast_decode(ctx))


# ----------------------------------------------------------------------------- rollout


def run_rollout(ctx) -> tuple[list[str], dict]:
    from trace_train.rollouts import read_trajectories

    r = ctx.cfg.rollout
    _check_targets(ctx)
    out = ctx.path("rollouts", "trajectories.jsonl")
    kwargs = base_env_kwargs_fn(ctx)
    # Episodes already played before an interruption: in the file, or in the parts of a split run.
    before = sum(len(read_trajectories(path)) for path in [out, *(_part_path(out, i) for i in range(r.workers))])
    # In this process, or (rollout.workers, a local model) in several, each on a share of the seeds and
    # resumable in its own part file, joined into one.
    _run_method_rollouts([dict(key="base", make=base_agent_factory(ctx), targets=list(r.targets),
                               seeds=parse_seeds("rollout.seeds", r.seeds), samples=r.samples, out=out,
                               in_flight=r.in_flight, env_kwargs={env_id: kwargs(env_id) for env_id in r.targets},
                               progress=ctx.progress)], r.workers)
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


# ----------------------------------------------------------------------------- diagnose


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


def _selected(ctx) -> list[str]:
    return list(ctx.summary("diagnose").get("selected", []))


# ----------------------------------------------------------------------------- generate


def run_generate(ctx) -> tuple[list[str], dict]:
    from generators import generate

    g = ctx.cfg.generate
    specs = [ctx.path("diagnosis", "specs", f"{c}.json") for c in _selected(ctx)]
    specs = [s for s in specs if s.exists()]
    ctx.path("generate").mkdir(parents=True, exist_ok=True)
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    results = generate(specs, ctx.workspace, run_dir=ctx.path("generate"), llm_url=g.llm_url, model=g.llm_model,
                       attempts=g.attempts, progress=ctx.progress) if specs else []
    rows = [{"capability": r.capability, "admitted": bool(r.admitted), "env_id": r.env_id,
             "module": str(r.module) if r.module else None, "report_json": str(r.report_json),
             "report_md": str(r.report_md), "attempts": r.attempts, "reason": r.reason} for r in results]
    (ctx.path("generate", "results.json")).write_text(json.dumps(rows, indent=2) + "\n")
    outputs = ["generate"]
    if ctx.workspace.resolve().is_relative_to(ctx.run_dir.resolve()):
        outputs.append(str(ctx.workspace.resolve().relative_to(ctx.run_dir.resolve())))
    return outputs, {"admitted": {r["capability"]: r["env_id"] for r in rows if r["admitted"]},
                     "rejected": [r["capability"] for r in rows if not r["admitted"]],
                     "workspace": str(ctx.workspace), "generator": "llm" if g.llm_url else "offline"}


def estimate_generate(ctx) -> tuple[float | None, str]:
    n = _selected(ctx)
    k = len(n) if ctx.done("diagnose") else ctx.cfg.diagnose.max_capabilities
    g = ctx.cfg.generate
    if g.llm_url:
        return None, f"LLM generation on {g.llm_url}, up to {g.attempts} attempts per capability"
    return k * SECONDS_PER_ADMISSION, f"offline generation + admission of {'≤' if not ctx.done('diagnose') else ''}{k} envs"


def capability_envs(ctx) -> dict[str, dict]:
    """Per selected capability, the env its adapter trains on: the admitted generated env when there is one,
    else the newest hand-written registered env of that capability (``trace/<capability>-vN``), marked so."""
    import trace_envs

    admitted = ctx.summary("generate").get("admitted", {}) if ctx.done("generate") else {}
    if admitted and (ctx.workspace / "registry.yaml").exists():
        trace_envs.load_registry(str(ctx.workspace))
    out = {}
    for cap in _selected(ctx):
        if cap in admitted and admitted[cap]:
            out[cap] = {"env_id": admitted[cap], "source": "generated"}
            continue
        try:
            env_id = trace_envs.latest_capability_id(cap)
        except KeyError:
            continue
        gen = ctx.state["stages"].get("generate", {}).get("status")
        why = "generation was not available in this build" if gen == "unavailable" else "no admitted generated env"
        out[cap] = {"env_id": env_id, "source": f"hand-written ({why})"}
    return out


# ----------------------------------------------------------------------------- train


def _train_job(ctx, name: str, env_ids: list[str], steps: int, sft: bool = False,
               minutes: float | None = None) -> dict:
    """The job that trains one adapter into ``train/<name>/`` (the keyword arguments of :func:`_train_adapter`),
    or, when it finished before an interruption, ``{"record": <its result record>}``."""
    from trace_train.grpo import TrainConfig

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
    if minutes is not None and not sft:
        kwargs["max_minutes"] = minutes
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
    from trace_train.grpo import train

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
    adapters = {cap: records[cap] | {"source": env["source"]} for cap, env in envs.items()}
    baselines = {k.lstrip("_"): records[k] for k in ("_multi", "_sft") if k in records}
    (ctx.path("train", "results.json")).write_text(json.dumps({"adapters": adapters, "baselines": baselines},
                                                              indent=2, default=str) + "\n")
    missing = [c for c in _selected(ctx) if c not in envs]
    return ["train"], {"adapters": {c: a["adapter_dir"] for c, a in adapters.items()},
                       "baselines": {k: v["adapter_dir"] for k, v in baselines.items()},
                       "no_env": missing, "rollouts": {k: v["rollouts"] for k, v in {**adapters, **baselines}.items()}}


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
    from trace_train.models import PRESETS

    model = t.model or (ctx.summary("base").get("model_path") if ctx.cfg.base.kind != "tiny" else "tiny")
    if model not in PRESETS and not (model and Path(model, "trace_model.json").exists()):
        return None, f"{k} adapters × {t.max_steps} GRPO steps (time depends on the model and the GPUs)"
    runs = k + k * t.multi_baseline * (k > 1)  # the multi baseline gets the budget of all k adapters
    sft = t.sft_baseline * (t.sft_steps * SECONDS_PER_SFT_STEP_TINY + 30.0)
    # Several workers: the runs share them; no fewer seconds than the longest run (the multi baseline's).
    longest = k * t.multi_baseline * (k > 1) or 1
    if t.max_minutes:
        total = runs * (t.max_minutes * 60 + 30.0) + sft
        floor = longest * (t.max_minutes * 60 + 30.0)
        what = f"{k} adapters × {t.max_minutes:g} min of GRPO + the multi-capability and SFT baselines"
    else:
        per_step = SECONDS_PER_GRPO_STEP_TINY_FAST if _fast_grpo(ctx) else SECONDS_PER_GRPO_STEP_TINY
        total = runs * t.max_steps * per_step + sft
        floor = longest * t.max_steps * per_step
        what = f"{k} adapters × {t.max_steps} GRPO steps + baselines"
    if t.workers > 1:
        return max(total / t.workers, floor), what + f", {t.workers} at once"
    return total, what


# ----------------------------------------------------------------------------- compose


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
               "router_trained_on": res.episodes,
               "moe": {"out_dir": str(res.out_dir), "routing_csv": _str(res.routing_csv),
                       "heatmap_png": _str(res.heatmap_png), "loss_png": _str(res.loss_png)},
               "methods": methods, "skipped_baselines": [m for m in baselines if m not in methods]}
    (ctx.path("compose", "results.json")).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return ["compose"], {k: v for k, v in results.items() if k != "data"}


def _str(p: Any) -> str | None:
    return None if p is None else str(p)


def estimate_compose(ctx) -> tuple[float | None, str]:
    c = ctx.cfg.compose
    k = len(_adapters(ctx)) or ctx.cfg.diagnose.max_capabilities
    return (SECONDS_PER_ROUTER_RUN_TINY + 10 * len(c.merges) + k * c.router_seeds * SECONDS_PER_SCRIPTED_EPISODE,
            f"router over {k} adapters, {len(c.merges)} merges")


# ----------------------------------------------------------------------------- evaluate


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
        note = "" if p else compose_missing("not in this run: needs ≥ 2 adapters and compose.per_episode")
        rows.append(("per_episode", "per-episode routing", hf(p["model"], p["adapter"]) if p else None,
                     total_adapter_rollouts + int(comp.get("router_episodes", 0)), note))
    if "trace_moe" in wanted:
        moe = methods.get("composed")
        rows.append(("trace_moe", "TRACE MoE (token-level top-1)", hf(moe["model"], moe["adapter"]) if moe else None,
                     total_adapter_rollouts + int(comp.get("router_episodes", 0)),
                     "" if moe else compose_missing("not in this run: the compose stage produced none")))
    return rows


def run_evaluate(ctx) -> tuple[list[str], dict]:
    from trace_train.evaluate import compare, evaluate

    e, r = ctx.cfg.evaluate, ctx.cfg.rollout
    seeds = parse_seeds("evaluate.seeds", e.seeds)
    model = base_model_path(ctx)
    if (ctx.workspace / "registry.yaml").exists():
        import trace_envs

        trace_envs.load_registry(str(ctx.workspace))
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
        jobs.append(dict(key=key, make=make, targets=list(r.targets), seeds=seeds, samples=e.samples,
                         out=ctx.path("eval", key.replace(":", "_"), "trajectories.jsonl"), in_flight=e.in_flight,
                         env_kwargs=per_env, progress=ctx.progress))
    _run_method_rollouts(jobs, e.workers)
    outs = {job["key"]: job["out"] for job in jobs}
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
        (out.parent / "metrics.json").write_text(json.dumps(row, indent=2, default=str) + "\n")
        results[key] = row
    _write_results(ctx.path("eval", "results.json"), results, seeds, e)
    return ["eval"], {"methods": {k: (v.get("overall", {}).get("pass@1") or {}).get("value")
                                  for k, v in results.items() if v.get("available")},
                      "not_run": {k: v["note"] for k, v in results.items() if not v.get("available")}}


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


def _method_rollouts(key, make, targets, seeds, samples, out, in_flight, env_kwargs, progress) -> str:
    """One method's held-out rollouts into ``out`` (resumable: episodes already there are kept)."""
    from trace_train.rollouts import run_rollouts

    agent = make()
    try:
        # Episodes the machine failed (env_error) are rerun, here and when a run resumes; what still fails
        # after a second pass is left out of the metrics and reported (trace_train.evaluate).
        for _ in range(2):
            summary = run_rollouts(targets, agent, seeds, samples=samples, out=out, in_flight=in_flight,
                                   env_kwargs=env_kwargs.__getitem__, progress=progress, agent_name=key,
                                   retry_env_errors=True)
            if not summary.env_errors:
                break
    finally:
        close = getattr(agent, "close", None)
        if callable(close):
            close()
    return key


def _die_with_parent() -> None:
    """Worker initializer: a worker gets SIGKILL when the run's process dies, so a killed run leaves no worker
    writing into its directory while the resumed run works there. (Each job sets its own torch threads.)"""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


def _worker_pool(workers: int):
    """The process pool of ``train.workers`` / ``evaluate.workers``: spawned (no torch state is forked), and each
    worker dies with the run (:func:`_die_with_parent`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent)


def _part_path(out: Path, i: int) -> Path:
    return out.with_name(f"{out.stem}.part{i}{out.suffix}")


def _split_last_round(jobs: list[dict], workers: int) -> list[list[dict]]:
    """The jobs as groups of parts: a job of the last round, which would leave workers idle (9 methods on 2
    workers end with one running alone), is split by seeds into parts that run side by side; every other
    job is one part. A job whose output file already exists (a run that stopped after it finished or while
    it ran unsplit) is never split: it resumes in its own file."""
    tail = len(jobs) % workers
    groups = [[job] for job in jobs]
    if workers <= 1 or tail == 0:
        return groups
    n_parts = workers // tail
    for g, job in enumerate(jobs[len(jobs) - tail:], len(jobs) - tail):
        seeds = list(job["seeds"])
        if job["out"].exists():  # whole already: parts left by a join that was interrupted are spent
            for i in range(n_parts):
                _part_path(job["out"], i).unlink(missing_ok=True)
            continue
        if n_parts < 2 or len(seeds) < n_parts:
            continue
        size = math.ceil(len(seeds) / n_parts)
        groups[g] = [{**job, "seeds": seeds[i * size:(i + 1) * size], "out": _part_path(job["out"], i)}
                     for i in range(n_parts) if seeds[i * size:(i + 1) * size]]
    return groups


def _join_parts(parts: list[dict], out: Path) -> None:
    """The parts' episodes into ``out``, part after part, then the parts removed."""
    tmp = out.with_name(out.name + ".joining")
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part["out"].read_bytes())
    tmp.replace(out)
    for part in parts:
        part["out"].unlink(missing_ok=True)
        part["out"].with_name(part["out"].name + ".lock").unlink(missing_ok=True)


def _run_method_rollouts(jobs: list[dict], workers: int) -> None:
    """Every job's rollouts: in this process, or ``workers`` at a time in worker processes (spawned, so no torch
    state is forked). A job whose agent cannot be sent to a worker (a scripted or endpoint base) runs here.
    The last round's jobs are split by seeds so that no worker idles (:func:`_split_last_round`); an
    interrupted split job resumes in its parts."""
    import pickle

    parallel = []
    for job in jobs:
        try:
            pickle.dumps(job["make"])
            parallel.append(job)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    groups = _split_last_round(parallel, workers) if workers > 1 else []
    if sum(len(group) for group in groups) <= 1:  # one process would do all of it: this one
        parallel, groups = [], []
    local = [job for job in jobs if not any(job is p for p in parallel)]
    for job in local:
        _method_rollouts(**job)
    if not parallel:
        return
    from concurrent.futures import as_completed

    logger.info("rolling out %d agents in %d worker processes", len(parallel), workers)
    with _worker_pool(workers) as pool:
        futures = {pool.submit(_method_rollouts, **{**part, "progress": False}): g
                   for g, group in enumerate(groups) for part in group}
        left = [len(group) for group in groups]
        for future in as_completed(futures):
            key, g = future.result(), futures[future]
            left[g] -= 1
            if left[g]:
                continue
            if len(groups[g]) > 1:
                _join_parts(groups[g], parallel[g]["out"])
            if jobs[0]["progress"]:
                print(f"  rolled out {key} ({sum(n == 0 for n in left)}/{len(groups)})", flush=True)


def _write_results(path: Path, results: dict, seeds: list[int], e) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"seeds": [min(seeds), max(seeds) + 1], "n_seeds": len(seeds), "samples": e.samples,
                                "ks": e.ks, "temperature": e.temperature, "methods": results},
                               indent=2, default=str) + "\n")


def estimate_evaluate(ctx) -> tuple[float | None, str]:
    e, r = ctx.cfg.evaluate, ctx.cfg.rollout
    n = len(r.targets) * len(parse_seeds("evaluate.seeds", e.seeds)) * e.samples
    k = len(_selected(ctx)) if ctx.done("diagnose") else ctx.cfg.diagnose.max_capabilities
    methods = 1 + (len(e.methods) - 2) + k  # base + the other rows (one per adapter)
    # Every row but a scripted or endpoint base's own is a local model (an adapter, a merge, the composer); the
    # composer always decodes with generate(), the others as base.decode says.
    fast = _fast_decode(ctx)
    composer = int("trace_moe" in e.methods)
    per_method = [_tiny_episodes_seconds(n, e.in_flight, fast and i >= composer) for i in range(methods)]
    workers = min(e.workers, methods)
    return (math.ceil(methods / workers) * sum(per_method) / methods,
            f"≤ {methods} methods × {n} held-out episodes" + (f", {workers} at once" if workers > 1 else ""))
