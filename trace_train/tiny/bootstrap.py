"""The SFT warm-up of the tiny model on the target env's oracle trajectories (``trace model bootstrap``).

:func:`bootstrap_model` plays the target env's oracle on training seeds
(:func:`~trace_train.tiny.sft_data.oracle_trajectories`), turns every assistant turn into a target rendered
exactly as :class:`~trace_train.agents.HFAgent` renders it at inference (:func:`~trace_train.tiny.sft_data.sft_rows`)
and trains on the completion tokens with the fast forward of :mod:`trace_train.tiny.sft_forward`. Scenario
families named in ``exclude_scenarios`` are left out, which produces a base model with real, known gaps. It
saves the model, ``loss.json`` and a ``loss_curve.png``; with ``lora`` it trains an adapter instead (the "SFT
on synthetic data" baseline, :mod:`trace_train.train.sft`).

Prompt size: τ²-style envs carry a long policy and many tool schemas. A tiny model cannot attend over
thousands of tokens cheaply, so the warm-up makes the target with the env constructor argument
``prompt="compact"`` when the env accepts one (the τ² domains do; others are made as they are). The env
kwargs used are stored in ``trace_model.json`` next to the weights, and
:func:`~trace_train.tiny.metadata.model_env_kwargs` returns them for a given env id, so that rollouts of the
model see the same prompts it was trained on.

Heavy imports (torch, transformers, peft, matplotlib) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .build import build_model
from .copy_circuit import FREEZE_CHOICES, CopyCircuit, circuit_of, freeze_copy_circuit
from .metadata import cache_root, model_metadata, prompt_env_kwargs
from .sft_data import oracle_trajectories, replay_episodes, sft_rows, shared_prefix_length, target_families
from .sft_forward import _targets_only_supported, local_attention_mass, sft_loss
from .tokenizer import default_corpus_envs

logger = logging.getLogger(__name__)


@dataclass
class BootstrapConfig:
    """Settings of the SFT warm-up on oracle trajectories.

    Attributes:
        target: env id whose oracle trajectories are the training data.
        base: a model folder to start from; default: build ``preset`` (with ``target`` in the corpus).
        preset: size preset used when ``base`` is not given.
        out: output folder; default ``<cache>/bootstrap-<target>-<hash>``.
        exclude_scenarios: scenario families (``task_spec()["scenario"]``) left out of training.
        scenario_shares: scenario families kept at a share below 1 (``{"cancel": 0.1}`` keeps about one
            cancel episode in ten, chosen by seed): families *under-represented* in the warm-up rather
            than absent, so the base shows them sometimes but not reliably.
        train_seeds: how many training episodes to collect; seeds start at ``seed_offset`` so that
            evaluation on small seeds is held out.
        seed_offset: first training seed.
        steps: optimiser steps.
        batch_size: trajectories per step (each one sequence, loss on its assistant turns).
        lr: peak learning rate (linear warm-up, cosine decay).
        warmup_steps: linear warm-up length.
        max_length: longest training sequence in tokens; assistant turns beyond it are left out
            (use compact prompts so that whole episodes fit).
        prompt: ``"compact"`` (default) or ``"full"``: the target's prompt size, passed as the env
            kwarg ``prompt`` when the env has one.
        threads: torch CPU threads (1 is fastest for the tiny presets).
        device: torch device to train on (``cpu``; ``cuda`` where there is one).
        seed: torch seed (data order, dropout-free init is fixed by the base).
        env_kwargs: passed to ``gym.make`` (e.g. ``scenarios`` to train on chosen families only, or
            ``size={"bundle_prob": 0.0}`` for one request per episode: shorter episodes).
        shared_prefix: encode the token prefix every training sequence shares (the system prompt and
            tool schemas, thousands of tokens with a τ² policy) once per step and let the batch attend
            to it, instead of once per sequence. The gradient is exact (it flows through the shared
            keys/values); only the cost changes.
        pretrain_frac: a curriculum: the first fraction of the steps is language-model pre-training
            on the conversations alone — without the shared prompt (a few hundred tokens per sequence
            instead of a few thousand, so these steps are several times cheaper) and with every token
            a target: user turns and tool results too. Tool results repeat the ids of the call
            before them and of earlier turns, so this phase is rich in copying, the skill SFT on
            assistant turns alone leaves unlearnt for a long time (the model writes memorised ids
            instead of the user's). The remaining steps are SFT on the assistant turns of whole
            sequences, as the model sees them at inference. 0 disables it. Measured on the airline
            target (bench/bootstrap_curve.py): a lower SFT loss at the same wall time, but the
            ``tiny`` preset still did not copy ids within 40 CPU minutes before it had a copy circuit.
        max_seconds: a training-time budget (the optimisation loop only): training stops before the
            step that would overrun it (timed as the slowest of the last 8), or after ``steps`` (then an upper
            bound), whichever comes first; the learning-rate schedule and the pre-training phase
            follow the share of the budget spent. Robust to a
            machine of unknown or varying speed, where a step count planned from a probe is not.
        freeze_circuit: for a base built with a copy circuit (the ``tiny`` preset), which of its
            weights stay as built: ``all``, ``positional`` (the induction head trains too) or
            ``none`` (:func:`trace_train.tiny.copy_circuit.circuit_gradient_masks`). Everything else
            trains. With ``none``, SFT slowly erodes the copying it relies on; with ``all``, the
            induction head cannot adapt to start a copy (measured on the airline target: the user id
            after "My user id is" came out wrong in every replayed episode).
        mixture: the warm-up mixture: ``{env_id: share}`` adds, for each env, ``round(share * train_seeds)``
            (at least 1) oracle episodes of that env to the target's (seeds from ``seed_offset`` too, so
            evaluation seeds stay held out). A low share of a capability env's own episodes (e.g. 0.05)
            makes a base that is *sometimes* right on that env, which GRPO needs (a group whose rollouts
            all score 0 carries no signal; a base warmed up on the target alone scores ~0 on the τ²
            capability envs, docs/design.md, "Models").
        mixture_env_kwargs: ``gym.make`` kwargs of the mixture envs (e.g. ``{"difficulty": 1}``); the
            ``prompt`` switch is added for envs that have one.
        lora: train a LoRA adapter instead of the whole model (the base stays frozen): a mapping of
            ``peft.LoraConfig`` arguments (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``).
            The output folder then holds a PEFT adapter (``PeftModel.from_pretrained(base, out)``), not
            a model; ``trace train --sft`` uses this.
        turn_head_weight: the SFT loss counts the first ``turn_head_tokens`` tokens of every assistant turn
            this many times (1: a plain token mean). A turn's decision — a message or a tool call, which
            tool, go ahead or refuse — sits in its opening, while most of its tokens are copied or fixed by
            the format; under a plain mean a fitted episode's loss barely sees a decision made wrong half
            the time (:func:`trace_train.tiny.sft_forward.turn_head_weights`). Not applied to the
            pre-training phase, where every token is a target.
        turn_head_tokens: how many tokens open a turn for ``turn_head_weight``.
        replay: a trajectories file (JSON lines) of the base agent's own episodes, usually on the target (the
            pipeline passes its rollouts): with ``replay_share``, its episodes of the target families the
            training episodes never draw join the SFT rows, so that a LoRA keeps the base's behaviour on them
            (:func:`~trace_train.tiny.sft_data.replay_episodes`).
        replay_share: the share of the SFT rows that are replayed episodes (0: off), repeated as needed:
            ``round(share / (1 - share) × oracle episodes)`` rows.
    """

    target: str
    base: str | None = None
    preset: str = "tiny"
    out: str | None = None
    exclude_scenarios: tuple[str, ...] = ()
    scenario_shares: dict = field(default_factory=dict)
    train_seeds: int = 400
    seed_offset: int = 100_000
    steps: int = 300
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 20
    max_length: int = 4096
    prompt: str = "compact"
    threads: int = 1
    device: str = "cpu"
    seed: int = 0
    env_kwargs: dict = field(default_factory=dict)
    shared_prefix: bool = True
    pretrain_frac: float = 0.0
    freeze_circuit: str = "positional"
    max_seconds: float | None = None
    mixture: dict = field(default_factory=dict)
    mixture_env_kwargs: dict = field(default_factory=dict)
    lora: dict | None = None
    turn_head_weight: float = 1.0
    turn_head_tokens: int = 8
    replay: str | None = None
    replay_share: float = 0.0

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if self.freeze_circuit not in FREEZE_CHOICES:
            raise ValueError(f"freeze_circuit must be one of {', '.join(FREEZE_CHOICES)}, got {self.freeze_circuit!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.train_seeds < 1:
            raise ValueError(f"train_seeds must be >= 1, got {self.train_seeds}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.pretrain_frac < 1.0:
            raise ValueError(f"pretrain_frac must be in [0, 1), got {self.pretrain_frac}")
        if isinstance(self.turn_head_weight, bool) or not isinstance(self.turn_head_weight, (int, float)) \
                or not self.turn_head_weight >= 1:
            raise ValueError(f"turn_head_weight must be a number >= 1 (1: a plain token mean), got "
                             f"{self.turn_head_weight!r}")
        if isinstance(self.turn_head_tokens, bool) or not isinstance(self.turn_head_tokens, int) \
                or self.turn_head_tokens < 1:
            raise ValueError(f"turn_head_tokens must be an integer >= 1, got {self.turn_head_tokens!r}")
        if self.prompt not in ("compact", "full"):
            raise ValueError(f"prompt must be 'compact' or 'full', got {self.prompt!r}")
        if isinstance(self.replay_share, bool) or not isinstance(self.replay_share, (int, float)) \
                or not 0.0 <= self.replay_share < 1.0:
            raise ValueError(f"replay_share must be a number in [0, 1) (the share of the SFT rows replayed), got "
                             f"{self.replay_share!r}")
        if self.replay_share > 0 and not self.replay:
            raise ValueError("replay_share > 0 needs replay: a trajectories file of the base's own episodes")
        if self.replay is not None and not Path(self.replay).is_file():
            raise ValueError(f"replay: no trajectories file at {self.replay}")
        self.exclude_scenarios = tuple(self.exclude_scenarios)
        for family, share in self.scenario_shares.items():
            if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
                raise ValueError(f"scenario_shares[{family!r}] must be a number in (0, 1] (the share of that "
                                 f"family's episodes kept), got {share!r}; use exclude_scenarios to leave it out")
        for env_id, share in self.mixture.items():
            if not isinstance(share, (int, float)) or isinstance(share, bool) or not share > 0:
                raise ValueError(f"mixture share of {env_id} must be a number > 0 (a share of train_seeds), "
                                 f"got {share!r}")


#: Options added after warmed-up bases were cached and shipped: while at these defaults they stay out of every
#: content key (:func:`keyed_settings`), so the folders keyed before they existed still match.
NEUTRAL_DEFAULTS = {"turn_head_weight": 1.0, "turn_head_tokens": 8, "replay": None, "replay_share": 0.0}


def keyed_settings(cfg: BootstrapConfig) -> dict:
    """``asdict(cfg)`` for a content key: without the options of :data:`NEUTRAL_DEFAULTS` left at their defaults."""
    return {k: v for k, v in asdict(cfg).items() if not (k in NEUTRAL_DEFAULTS and v == NEUTRAL_DEFAULTS[k])}


def _lr_at(step: int, done: float, cfg: BootstrapConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine to 10% over the share ``done`` of the run."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def plot_loss(losses: list[float], path: Path, title: str, pretrain_steps: int = 0) -> None:
    """Save a loss curve (raw and smoothed) as PNG; a dashed line marks the end of LM pre-training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(1, len(losses) + 1), losses, lw=0.8, alpha=0.4, label="loss")
    if len(losses) >= 10:
        w = max(5, len(losses) // 30)
        smooth = [sum(losses[max(0, i - w + 1):i + 1]) / len(losses[max(0, i - w + 1):i + 1])
                  for i in range(len(losses))]
        ax.plot(range(1, len(losses) + 1), smooth, lw=1.6, label=f"mean of {w}")
    if pretrain_steps:
        ax.axvline(pretrain_steps + 0.5, ls="--", lw=0.8, color="grey")
        ax.text(pretrain_steps + 0.5, 0.97, " SFT →", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                color="grey")
        ax.text(pretrain_steps + 0.5, 0.97, "← LM pre-training (all tokens) ", transform=ax.get_xaxis_transform(),
                va="top", ha="right", fontsize=8, color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy per target token")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class BootstrapResult:
    """Outcome of :func:`bootstrap_model`."""

    path: Path
    losses: list[float]
    examples: int
    turns: int
    truncated: int
    scenario_counts: dict
    seconds: float
    replayed: int = 0  #: rows replayed from the agent's own episodes (BootstrapConfig.replay), beyond ``examples``


#: Window of the banded attention used in training for the copy circuit's held previous-token layer.
LOCAL_WINDOW = 8


def _banded_window(model, circuit: CopyCircuit | None, freeze: str, rows) -> int | None:
    """:data:`LOCAL_WINDOW` when training may run the layers before the last with banded attention.

    That is when they are exactly the copy circuit's previous-token layer held fixed (so its attention
    stays local for the whole run), checked on a training sequence: all but 1e-4 of every head's
    attention within the window. None otherwise (the plain forward is used).
    """
    if circuit is None or freeze == "none" or len(model.model.layers) != 2 or not _targets_only_supported(model):
        return None
    mass = local_attention_mass(model, rows[0][0][:1024], LOCAL_WINDOW)
    if mass < 1 - 1e-4:
        logger.warning("the previous-token layer puts only %.6f of its attention within %d positions; "
                       "training without banded attention", mass, LOCAL_WINDOW)
        return None
    return LOCAL_WINDOW


def bootstrap_model(cfg: BootstrapConfig, progress: bool = True,
                    on_checkpoint: Callable[[int, Any, Any, float], None] | None = None,
                    checkpoint_every: int = 0, checkpoint_every_s: float = 0.0) -> BootstrapResult:
    """SFT warm-up of a tiny model on the target env's oracle trajectories.

    Args:
        cfg: the settings.
        progress: show a tqdm bar.
        on_checkpoint: called as ``fn(step, model, tokenizer, training_seconds)`` every
            ``checkpoint_every`` steps (or ``checkpoint_every_s`` seconds of training) and at the end;
            the model is in eval mode during the call. ``training_seconds`` counts the optimisation
            loop only: not the setup (oracle episodes, model load) nor the callbacks themselves.
        checkpoint_every: period of ``on_checkpoint`` in steps (0 = only at the end).
        checkpoint_every_s: period of ``on_checkpoint`` in seconds of training (0 = by steps).

    Returns:
        A :class:`BootstrapResult`; the model, ``loss.json``, ``loss_curve.png`` and ``trace_model.json``
        are in ``result.path``.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    torch.set_num_threads(max(1, cfg.threads))
    env_kwargs = {**prompt_env_kwargs(cfg.target, cfg.prompt), **cfg.env_kwargs}
    base = cfg.base or str(build_model(cfg.preset, env_ids=sorted(set(default_corpus_envs()) | {cfg.target})).path)
    tokenizer = AutoTokenizer.from_pretrained(base)
    seeds = range(cfg.seed_offset, cfg.seed_offset + cfg.train_seeds)
    records, counts = oracle_trajectories(cfg.target, seeds, cfg.exclude_scenarios, env_kwargs, cfg.scenario_shares)
    if not records:
        raise RuntimeError(f"no oracle trajectories of {cfg.target} left to train on (scenario counts: {counts}); "
                           "check --exclude-scenarios")
    mixture_counts = {}
    for env_id, share in sorted(cfg.mixture.items()):
        n = max(1, round(share * cfg.train_seeds))
        mix_kwargs = {**prompt_env_kwargs(env_id, cfg.prompt), **cfg.mixture_env_kwargs}
        extra, _ = oracle_trajectories(env_id, range(cfg.seed_offset, cfg.seed_offset + n), env_kwargs=mix_kwargs)
        records.extend(extra)
        mixture_counts[env_id] = {"episodes": len(extra), "env_kwargs": mix_kwargs}
    replay, replayed = None, []
    if cfg.replay_share > 0:
        count = round(cfg.replay_share / (1.0 - cfg.replay_share) * len(records))
        drawn = {f for r in records for f in r.get("families") or target_families(None, r.get("scenario"))}
        replayed, replay = replay_episodes(cfg.replay, drawn, count, seed=cfg.seed)
        if not replayed:
            logger.warning("replay: none of the %d episodes in %s is of a family the training episodes leave out "
                           "(they draw %s); nothing replayed", replay["episodes_in_file"], cfg.replay,
                           ", ".join(replay["left_out_families"]) or "no labelled family")
    rows, turns, truncated = sft_rows(tokenizer, records, cfg.max_length)
    env_rows = len(rows)  # the env episodes this fit spent (the replayed ones were spent by whoever recorded them)
    if replayed:
        more, more_turns, more_truncated = sft_rows(tokenizer, replayed, cfg.max_length)
        rows, turns, truncated = rows + more, turns + more_turns, truncated + more_truncated
    if truncated:
        logger.warning("%d assistant turns did not fit in %d tokens and were left out; use compact prompts",
                       truncated, cfg.max_length)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(cfg.device)
    circuit = circuit_of(model_metadata(base))
    peft_model = None
    if cfg.lora is not None:
        # A LoRA on a frozen base: sft_loss runs the base model's modules, into which PEFT injected the
        # adapters. No banded attention: the adapters may make the held layer attend beyond the band.
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **cfg.lora))
        model = peft_model.get_base_model()
        local_window = None
    else:
        if circuit is not None:
            freeze_copy_circuit(model, circuit, cfg.freeze_circuit)
        local_window = _banded_window(model, circuit, cfg.freeze_circuit, rows)
    model.train()
    model.config.use_cache = False
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                              weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    pad = tokenizer.pad_token_id
    prefix_len = shared_prefix_length(rows) if cfg.shared_prefix else 0
    logger.info("bootstrap: %d sequences, shared prefix of %d tokens", len(rows), prefix_len)
    losses: list[float] = []
    order: list[int] = []
    pretrain_steps = 0
    train_s = 0.0  # time in the optimisation loop (callbacks excluded)
    # The next step is predicted to take as long as the slowest recent one: step times vary by a few percent,
    # and predicting with the last one alone let a slightly slower step end past the budget.
    recent_steps_s: deque[float] = deque(maxlen=8)

    def over_budget() -> bool:
        return bool(cfg.max_seconds and recent_steps_s and train_s + max(recent_steps_s) > cfg.max_seconds)
    next_checkpoint_s = checkpoint_every_s
    # With a time budget the number of steps is not known ahead: the bar counts steps and shows the
    # minutes spent of the budget.
    bar = tqdm(total=None if cfg.max_seconds else cfg.steps, desc=f"bootstrap {cfg.target}", disable=not progress,
               unit="step")
    budget = f"/{cfg.max_seconds / 60:.1f}" if cfg.max_seconds else ""
    for step in range(cfg.steps):
        # Share of the run done: of the time budget when there is one, else of the steps.
        done = train_s / cfg.max_seconds if cfg.max_seconds else step / cfg.steps
        if over_budget():
            break  # the next step would overrun the budget
        t_step = time.perf_counter()
        batch_idx = []
        for _ in range(cfg.batch_size):
            if not order:
                order = torch.randperm(len(rows), generator=gen).tolist()
            batch_idx.append(order.pop())
        batch = [rows[i] for i in batch_idx]
        for g in optim.param_groups:
            g["lr"] = _lr_at(step, done, cfg)
        pretraining = done < cfg.pretrain_frac
        pretrain_steps += int(pretraining)
        loss = sft_loss(model, batch, pad, prefix_len, cfg.device, drop_prefix=pretraining, every_token=pretraining,
                        local_window=local_window, head_weight=1.0 if pretraining else cfg.turn_head_weight,
                        head_tokens=cfg.turn_head_tokens)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(float(loss.detach()))
        recent_steps_s.append(time.perf_counter() - t_step)
        train_s += recent_steps_s[-1]
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", train_min=f"{train_s / 60:.1f}{budget}")
        due = (checkpoint_every and (step + 1) % checkpoint_every == 0) or \
              (checkpoint_every_s and train_s >= next_checkpoint_s)
        last = step + 1 == cfg.steps or over_budget()
        if on_checkpoint and due and not last:
            next_checkpoint_s += checkpoint_every_s
            model.eval()
            model.config.use_cache = True
            on_checkpoint(step + 1, model, tokenizer, train_s)
            model.train()
            model.config.use_cache = False
    bar.close()
    model.eval()
    model.config.use_cache = True

    # Options left at their defaults stay out of the key, so folders cached before they existed still match.
    keyed = {k: v for k, v in keyed_settings(cfg).items()
             if not (k in ("mixture", "mixture_env_kwargs", "lora", "scenario_shares") and not v)}
    if cfg.replay:  # the replayed file's content, not its path
        keyed["replay"] = hashlib.sha256(Path(cfg.replay).read_bytes()).hexdigest()[:16]
    key = hashlib.sha256(json.dumps({"cfg": keyed, "base": model_metadata(base).get("content_key", base)},
                                    sort_keys=True, default=str).encode()).hexdigest()[:12]
    out = Path(cfg.out) if cfg.out else cache_root() / f"bootstrap-{cfg.target.replace('/', '_')}-{key}"
    out.mkdir(parents=True, exist_ok=True)
    saved = peft_model if peft_model is not None else model
    saved.to("cpu").save_pretrained(out)
    saved.to(cfg.device)
    tokenizer.save_pretrained(out)
    meta = model_metadata(base)
    meta.pop("reset_options", None)
    # A bootstrapped folder is not the base build: give it its own key so build_model never mistakes it.
    meta.update({"content_key": f"bootstrap-{key}", "base_content_key": meta.get("content_key"),
                 "env_kwargs": env_kwargs, "bootstrap": {
        "target": cfg.target, "base": str(base), "exclude_scenarios": list(cfg.exclude_scenarios),
        "scenario_shares": dict(cfg.scenario_shares),
        "steps": len(losses), "max_seconds": cfg.max_seconds, "batch_size": cfg.batch_size, "lr": cfg.lr,
        "examples": env_rows, "replayed_rows": len(rows) - env_rows, "train_seconds": train_s,
        "pretrain_steps": pretrain_steps, "frozen_circuit": cfg.freeze_circuit if circuit else None,
        "turns": turns, "truncated": truncated, "shared_prefix_tokens": prefix_len, "banded_window": local_window,
        "scenario_counts": counts, "mixture": mixture_counts, "replay": replay, "lora": cfg.lora,
        "final_loss": losses[-1],
        "turn_head_weight": cfg.turn_head_weight, "turn_head_tokens": cfg.turn_head_tokens,
        "seconds": time.perf_counter() - t0}})
    # An adapter folder is not a model folder: its record gets its own name, so model_metadata() of it is {}.
    (out / ("trace_adapter.json" if peft_model is not None else "trace_model.json")).write_text(
        json.dumps(meta, indent=2, default=str))
    (out / "loss.json").write_text(json.dumps({"loss": losses}, indent=None))
    plot_loss(losses, out / "loss_curve.png", f"SFT warm-up on {cfg.target} ({len(rows)} episodes, {turns} turns)",
              pretrain_steps=pretrain_steps)
    if on_checkpoint:
        on_checkpoint(len(losses), model, tokenizer, train_s)
    return BootstrapResult(out, losses, env_rows, turns, truncated, counts, time.perf_counter() - t0,
                           replayed=len(rows) - env_rows)
