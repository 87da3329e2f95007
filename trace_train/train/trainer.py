"""TRACE's ``GRPOTrainer`` and the callbacks of a GRPO run (the trainer side of :mod:`trace_train.train.grpo`).

* :class:`TraceGRPOTrainer`: TRL's ``GRPOTrainer`` with the batch rows (seeds) handed to TRACE's rollout function,
  the shared-prefix forward for the loss's log-probs, the replay term, and the **mismatch metric**: every step it
  compares the log-probabilities the rollouts sampled the agent's tokens with against the loss's own log-probs of
  the same tokens (``mismatch_kl``, ``sampled_token_share``). A trainer whose sampler and loss disagree is
  off-policy without knowing it; the field bounds this number in CI (docs/train.md, "Does the trainer learn?").
* :class:`StepLogger`: one ``train_log.csv`` row per optimiser step, with seconds per phase.
* :class:`TimeBudget`: stops before the step that would overrun a training-time budget.

This module imports TRL and transformers at its top; :mod:`trace_train.train.grpo` imports it when it trains.
"""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from .log import write_rows


class TraceGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` that lets the rollout function see the batch rows (their seeds), which TRL hands to
    ``environment_factory.reset`` but not to ``rollout_func``, and that measures its train/inference mismatch."""

    #: Set by :func:`~trace_train.train.grpo.train`: compute the loss's log-probs with the batch's shared prefix
    #: encoded once.
    trace_shared_prefix = False
    #: Set by :func:`~trace_train.train.grpo.train` with ``grpo_replay_weight``: (weight,
    #: :class:`~.replay.ReplayBatches`, pad id).
    trace_replay = None
    _trace_rows = None
    _trace_capture = False
    _trace_logps = None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)
        if self.trace_replay is None or not model.training:
            return loss
        from .replay import replay_nll

        weight, batches, pad_id = self.trace_replay
        with self.accelerator.autocast():
            nll = replay_nll(self.accelerator.unwrap_model(model), batches.next(), pad_id,
                             str(self.accelerator.device))
        self._metrics["train"]["replay_nll"].append(float(nll.detach()))
        return loss + weight * nll

    def _compute_loss(self, model, inputs):
        # The first log-prob forward inside the loss is the policy's: keep it to compare with the sampler's.
        self._trace_capture, self._trace_logps = "sampling_per_token_logps" in inputs, None
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._trace_capture = False
        if self._trace_logps is not None:
            self._log_mismatch(self._trace_logps, inputs)
        return loss

    def _log_mismatch(self, logps: torch.Tensor, inputs: dict) -> None:
        """``mismatch_kl``: KL(sampler ‖ trainer) over the agent tokens that carry a sampler log-prob, by the k3
        estimator on the sampled tokens (``exp(d) - 1 - d``, d = trainer − sampler log-prob: non-negative, zero
        only where the two agree); ``sampled_token_share``: those tokens' share of the agent tokens in the loss."""
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        sampler = inputs["sampling_per_token_logps"]
        scored = mask.bool() & ~torch.isnan(sampler)
        agent = int(mask.sum())
        if agent == 0:
            return
        d = (logps.double() - sampler.double())[scored]
        kl = float((torch.expm1(d) - d).mean()) if d.numel() else math.nan  # expm1: exact near 0, never negative
        self._metrics["train"]["mismatch_kl"].append(kl)
        self._metrics["train"]["sampled_token_share"].append(int(scored.sum()) / agent)

    def _generate_and_score_completions(self, inputs):
        self._trace_rows = inputs
        try:
            return super()._generate_and_score_completions(inputs)
        finally:
            self._trace_rows = None

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                           batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                           **extra):
        # Text-only batches take the shared-prefix forward (the same values); anything else is TRL's.
        # (One process only: the unwrapped module's forward would bypass DDP's own forward.)
        if not self.trace_shared_prefix or compute_aux_loss or any(v is not None for v in extra.values()) \
                or self.accelerator.num_processes > 1:
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **extra)
        else:
            from .prefix_logprobs import shared_prefix_logprobs

            with self.accelerator.autocast():
                logps, entropies = shared_prefix_logprobs(self.accelerator.unwrap_model(model), input_ids,
                                                          attention_mask, logits_to_keep, self.temperature,
                                                          compute_entropy)
            out = (logps, entropies, None)
        if self._trace_capture:
            self._trace_capture, self._trace_logps = False, out[0].detach()
        return out


class StepLogger(TrainerCallback):
    """One ``train_log.csv`` row per optimiser step, with the step's seconds per phase.

    Args:
        log_csv: the file; a resumed run (``start_step`` > 0) keeps its rows up to that step, a new one starts it.
        rollouts: the run's :class:`~trace_train.train.grpo.GroupRollouts` (its ``last`` statistics), or None
            with TRL's own tool loop.
        default_episodes: episodes per step when the rollout function does not say.
        start_step: the step a resumed run starts from (0: a new run).
    """

    def __init__(self, log_csv: Path, rollouts: Any = None, default_episodes: int = 0, start_step: int = 0) -> None:
        self.log_csv, self.rollouts, self.default_episodes = Path(log_csv), rollouts, default_episodes
        self.t_step = self.t_pre = 0.0
        self.optimizer_s = self.step_s = 0.0
        self.rows: list[dict] = []
        if self.log_csv.exists() and start_step > 0:  # resumed: keep the rows up to the checkpoint
            with open(self.log_csv, newline="") as f:
                kept = [r for r in csv.DictReader(f) if int(float(r["step"])) <= start_step]
            write_rows(self.log_csv, kept, mode="w")
        elif self.log_csv.exists():
            self.log_csv.unlink()

    def on_step_begin(self, args, state, control, **kwargs):
        self.t_step = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.t_pre = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer_s = time.perf_counter() - self.t_pre

    def on_step_end(self, args, state, control, **kwargs):
        self.step_s = time.perf_counter() - self.t_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" not in logs:
            return
        last = self.rollouts.last if self.rollouts is not None else {}
        rollout_s = last.get("rollout_s")  # None with rollout: trl (TRL's loop is not timed by phase)
        row = {"step": state.global_step, "reward": logs.get("reward"), "reward_std": logs.get("reward_std"),
               "frac_reward_zero_std": logs.get("frac_reward_zero_std"),
               "informative_before_resampling": last.get("informative_before_resampling",
                                                         1.0 - logs.get("frac_reward_zero_std", math.nan)),
               "resampled_groups": last.get("resampled_groups", 0), "env_errors": last.get("env_errors", 0),
               "episodes": last.get("episodes", self.default_episodes), "kl": logs.get("kl"),
               "mismatch_kl": logs.get("mismatch_kl"), "sampled_token_share": logs.get("sampled_token_share"),
               "completion_length": logs.get("completions/mean_length"),
               "clipped_ratio": logs.get("completions/clipped_ratio"), "loss": logs.get("loss"),
               "replay_nll": logs.get("replay_nll"),
               "grad_norm": logs.get("grad_norm"), "learning_rate": logs.get("learning_rate"),
               "generation_s": last.get("generation_s"), "env_s": last.get("env_s"),
               "encode_s": last.get("encode_s"), "rollout_s": rollout_s,
               "forward_backward_s": (self.step_s - self.optimizer_s - rollout_s) if rollout_s else None,
               "optimizer_s": self.optimizer_s, "step_s": self.step_s,
               "reward_by_env": json.dumps(last.get("reward_by_env", {}), sort_keys=True)}
        self.rows.append(row)
        write_rows(self.log_csv, [row])


class TimeBudget(TrainerCallback):
    """Stops training before the step that would overrun ``minutes`` of training (predicted as the slowest of the
    last 4 steps); the trainer then saves its final checkpoint as at ``max_steps``."""

    def __init__(self, minutes: float) -> None:
        self.minutes = minutes
        self.spent = 0.0
        self.recent: list[float] = []
        self.t = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self.t = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.recent = (self.recent + [time.perf_counter() - self.t])[-4:]
        self.spent += self.recent[-1]
        if self.spent + max(self.recent) > self.minutes * 60:
            control.should_training_stop = True
            control.should_save = True
