"""Calibration: the base model on the training seeds before GRPO, and whether its groups would carry signal.

A GRPO group whose rollouts all score the same has zero advantage and teaches nothing. :func:`calibrate` plays
``calibration_groups`` groups of ``group_size`` on the first training seeds with the untrained model and
summarises them with :func:`trace_envs.calibration.summarize`; :func:`trace_train.train.grpo.train` writes the
result to ``calibration.json`` and logs which knob to turn where fewer than half the groups are informative.
"""

from __future__ import annotations

import logging

from .config import TrainConfig

logger = logging.getLogger(__name__)


def calibrate(cfg: TrainConfig, env_kwargs: dict[str, dict], device: str, model=None, tokenizer=None) -> dict:
    """The base model on the training seeds before training: ``calibration_groups`` groups of ``group_size``.

    Returns ``{env_id: CalibrationReport.to_dict(groups=False)}`` and logs a warning, with the figures and the
    knobs to turn, for every env where fewer than half the groups would be informative.
    """
    from trace_envs.calibration import summarize

    from ..agents import HFAgent
    from ..rollouts import run_rollouts

    lo, _ = cfg.train_seed_range()
    seeds = list(range(lo, lo + cfg.calibration_groups))
    agent = HFAgent(model if model is not None else cfg.model, tokenizer=tokenizer, threads=None, device=device,
                    max_new_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, seed=cfg.seed,
                    batch_size=max(1, len(seeds) * cfg.group_size), decode=cfg.decode)
    out = {}
    for env_id in cfg.env_ids:
        summary = run_rollouts(env_id, agent, seeds=seeds, samples=cfg.group_size, in_flight=len(seeds) * cfg.group_size,
                               env_kwargs=env_kwargs[env_id], progress=cfg.progress, keep_records=True,
                               max_steps=cfg.max_tool_calling_iterations)
        report = summarize(summary.records, env_id=env_id, agent="base", difficulty=env_kwargs[env_id].get("difficulty"),
                           seed_offset=lo)
        out[env_id] = {**report.to_dict(groups=False), "seconds": summary.seconds,
                       "seconds_per_episode": summary.seconds / max(1, summary.ran)}
        if report.informative < 0.5:
            if report.all_zero >= report.all_one:
                knob = ("the base is rarely right: lower the difficulty (env_kwargs difficulty), raise temperature, "
                        "warm the base up on a low share of this env's oracle episodes (`trace model bootstrap "
                        "--mix ENV=0.05`), or use resample_attempts / hint_share")
            else:
                knob = "the base is almost always right: raise the difficulty (env_kwargs difficulty) or temperature"
            logger.warning("calibration of %s: only %.0f%% of %d groups are informative (mean reward %.3f, all-0 %.0f%%, "
                           "all-1 %.0f%%, %.1f s/episode); GRPO will see little signal. Fix: %s", env_id,
                           100 * report.informative, report.groups, report.mean_reward, 100 * report.all_zero,
                           100 * report.all_one, out[env_id]["seconds_per_episode"], knob)
            out[env_id]["warning"] = knob
    return out
