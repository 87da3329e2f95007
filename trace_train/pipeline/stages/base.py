"""The ``base`` stage: prepare the base agent (the tiny model's warm-up is cached by content) -> ``base/base.json``."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import fields
from pathlib import Path
from typing import Any

from ..config import BaseSection, ConfigError
from .common import (SECONDS_BOOTSTRAP_SETUP, SECONDS_PER_SFT_STEP_TINY, SFT_TWO_THREAD_SPEEDUP, _check_targets,
                     _scripted_agent)


def tiny_bootstrap_config(section: BaseSection, target: str):
    """The :class:`~trace_train.tiny.bootstrap.BootstrapConfig` of the base warm-up (``base.bootstrap`` over defaults)."""
    from trace_train.tiny.bootstrap import BootstrapConfig

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
    from trace_train.tiny.bootstrap import keyed_settings
    from trace_train.tiny.build import BUILD_VERSION
    from trace_train.tiny.metadata import cache_root

    data = {k: v for k, v in keyed_settings(bcfg).items() if k != "out"}
    key = hashlib.sha256(json.dumps({"cfg": data, "build": BUILD_VERSION}, sort_keys=True,
                                    default=str).encode()).hexdigest()[:12]
    return cache_root() / f"run-base-{bcfg.target.replace('/', '_')}-{key}"


def shipped_roots(section: BaseSection) -> list[Path]:
    """Where shipped bases are looked for: the package's, then ``base.shipped`` (which must exist) if set."""
    from trace_train.tiny.shipped import BASES

    if not section.shipped:
        return [BASES]
    extra = Path(section.shipped)
    if not extra.is_dir():
        raise ConfigError(f"base.shipped: {extra} is not a folder (a shipped base's folder, or a folder of them)")
    return [BASES, extra]


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
        from trace_train.tiny.bootstrap import bootstrap_model
        from trace_train.tiny.metadata import model_metadata

        from trace_train.tiny.shipped import install_shipped_base

        bcfg = tiny_bootstrap_config(b, target)
        path = tiny_base_cache_dir(bcfg)
        cached = _cached_base(path)
        shipped = None
        if not cached:
            # A base shipped with the project for exactly this recipe: no warm-up, the same base on every CPU.
            shipped = install_shipped_base(path, shipped_roots(b))
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
    from trace_train.tiny.build import PRESETS

    if preset in PRESETS:  # train.model names a size preset: build it here (offline, cached by content)
        from trace_train.tiny.build import build_model
        from trace_train.tiny.tokenizer import default_corpus_envs

        built = build_model(preset, env_ids=sorted(set(default_corpus_envs()) | set(ctx.cfg.rollout.targets)))
        info["train_model_path"] = str(built.path)
        outputs.append(str(built.path))
    ctx.path("base").mkdir(parents=True, exist_ok=True)
    # base.json is what later stages read; whether the warm-up came from the cache is not part of it (a
    # re-run of this stage that finds its own model cached must leave the later stages up to date).
    (ctx.path("base", "base.json")).write_text(json.dumps({k: v for k, v in info.items() if k != "cached"},
                                                          indent=2, default=str) + "\n")
    return outputs, info


def warmup_seconds_per_step(threads: int, roots: list[Path] | None = None) -> float:
    """Rough seconds of one warm-up step on ``threads`` torch threads.

    Measured where it can be: the shipped bases' warm-ups (``recipe.json``: train seconds over steps), which run
    today's recipes (long conversations, language-model pre-training first); those on as many threads if any, else
    all of them. Threads are not converted: a second thread was 1.7x faster on an older, shorter recipe, and the
    planted recipe's warm-up took 3.5 s a step on two threads against 2.5 s on one (two 2-core machines of one CPU
    type, 2026-12-04). Without a shipped base, the bench constant (from a shorter recipe; about half today's time).
    """
    from trace_train.tiny.shipped import BASES, shipped_bases

    measured: dict[int, list[float]] = {}
    for shipped in shipped_bases(roots if roots is not None else [BASES]):
        warmup = shipped.recipe.get("warmup") or {}
        if warmup.get("train_seconds") and warmup.get("steps"):
            n = int(shipped.recipe["bootstrap"].get("threads", 1))
            measured.setdefault(n, []).append(warmup["train_seconds"] / warmup["steps"])
    if not measured:
        return SECONDS_PER_SFT_STEP_TINY / (SFT_TWO_THREAD_SPEEDUP if threads >= 2 else 1.0)
    times = measured.get(threads) or [t for ts in measured.values() for t in ts]
    return sum(times) / len(times)


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

    try:
        roots = shipped_roots(b)
    except ConfigError as exc:
        return None, str(exc)
    shipped = find_shipped_base(tiny_base_cache_dir(bcfg).name, roots)
    if shipped is not None:
        if shipped.path.parent in roots[:1]:
            return 2.0, f"tiny base shipped with the project ({shipped.name}): no warm-up"
        return 2.0, f"tiny base shipped in {shipped.path} (base.shipped): no warm-up"
    per_step = warmup_seconds_per_step(bcfg.threads, roots)
    train = bcfg.max_seconds if bcfg.max_seconds else bcfg.steps * per_step
    budget = f"{train / 60:.0f} min budget" if bcfg.max_seconds else f"{bcfg.steps} steps"
    return SECONDS_BOOTSTRAP_SETUP + train, (f"warm-up of the {bcfg.preset} model on {bcfg.target} "
                                             f"({budget}; cached afterwards)")
