"""The "SFT on synthetic data" baseline of the train stage (``TrainConfig.sft``, ``trace train --sft``).

A LoRA trained on the capability envs' oracle episodes instead of by GRPO, with the tiny model's warm-up code
(:mod:`trace_train.tiny.bootstrap`); it writes the same files as a GRPO run (``adapter/``, ``train_log.csv``,
``train_result.json``) so the pipeline evaluates it as one more method. :func:`fit_sft_lora` is also GRPO's SFT
warm-up (``TrainConfig.sft_warmup_steps``).
"""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

from .config import TrainConfig, overlay_kwargs
from .log import TrainResult


def fit_sft_lora(cfg: TrainConfig, env_kwargs: dict[str, dict], device: str, out: Path, steps: int,
                 on_checkpoint=None, checkpoint_every: int = 0, mixture_over: dict | None = None):
    """Fit a LoRA on the envs' oracle episodes with the bootstrap's SFT code
    (:func:`trace_train.tiny.bootstrap.bootstrap_model` with ``lora``): the first env as its target and the others as
    a mixture of the same size. Writes the adapter (PEFT format) to ``out`` and returns the
    :class:`~trace_train.tiny.bootstrap.BootstrapResult`. Used by the SFT baseline and by GRPO's SFT warm-up
    (``TrainConfig.sft_warmup_steps``). ``on_checkpoint``/``checkpoint_every``: the bootstrap's hook, called as
    ``fn(step, model, tokenizer, training_seconds)`` every ``checkpoint_every`` steps and at the end.
    ``mixture_over``: kwargs over ``cfg.env_kwargs`` for the other envs (the warm-up's own, as ``env_kwargs``
    already carries them for the first)."""
    from ..tiny.bootstrap import BootstrapConfig, bootstrap_model

    first, *others = cfg.env_ids
    target_kwargs = {k: v for k, v in env_kwargs[first].items() if k != "prompt"}
    prompt = env_kwargs[first].get("prompt", "compact")
    boot = BootstrapConfig(target=first, base=cfg.model, out=str(out), train_seeds=cfg.sft_episodes,
                           seed_offset=cfg.train_seed_range()[0], steps=steps, batch_size=cfg.sft_batch_size,
                           lr=cfg.sft_lr, warmup_steps=min(10, steps), prompt=prompt if prompt in
                           ("compact", "full") else "compact", threads=cfg.threads, device=device, seed=cfg.seed,
                           env_kwargs=target_kwargs, mixture={e: 1.0 for e in others},
                           mixture_env_kwargs=overlay_kwargs(cfg.env_kwargs, mixture_over or {}),
                           lora={"r": cfg.lora_r, "lora_alpha": cfg.lora_alpha, "lora_dropout": cfg.lora_dropout,
                                 "target_modules": list(cfg.lora_target_modules)},
                           turn_head_weight=float(cfg.sft_turn_head_weight),
                           replay=cfg.sft_replay if cfg.sft_replay_share else None,
                           replay_share=float(cfg.sft_replay_share))
    return bootstrap_model(boot, progress=cfg.progress, on_checkpoint=on_checkpoint, checkpoint_every=checkpoint_every)


def train_sft(cfg: TrainConfig, env_kwargs: dict[str, dict], device: str, t0: float) -> TrainResult:
    """The "SFT on synthetic data" baseline: :func:`fit_sft_lora` for ``cfg.sft_steps`` steps, written as a
    GRPO run's files."""
    cfg.to_yaml(Path(cfg.output_dir) / "train_config.yaml")
    result = fit_sft_lora(cfg, env_kwargs, device, cfg.adapter_dir, cfg.sft_steps)
    out = Path(cfg.output_dir)
    log_csv = out / "train_log.csv"
    with open(log_csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "loss"])
        writer.writerows((i + 1, loss) for i, loss in enumerate(result.losses))
    curve = result.path / "loss_curve.png"
    info = json.loads((result.path / "trace_adapter.json").read_text())
    (cfg.adapter_dir / "trace_adapter.json").write_text(json.dumps(
        {"base_model": str(cfg.model), "method": "sft", "env_ids": cfg.env_ids, "env_kwargs": env_kwargs,
         "steps": len(result.losses), "bootstrap": info.get("bootstrap")}, indent=2, default=str))
    res = TrainResult(adapter_dir=cfg.adapter_dir, log_csv=log_csv, curve_png=curve if curve.exists() else None,
                      steps=len(result.losses), rollouts=result.examples, calibration=None,
                      seconds=time.perf_counter() - t0, output_dir=out, final={"loss": result.losses[-1]})
    (out / "train_result.json").write_text(json.dumps(res.to_dict(), indent=2, default=str))
    return res
