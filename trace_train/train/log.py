"""What a training run leaves: :class:`TrainResult`, and ``train_log.csv`` with its reader and reward curve.

``train_log.csv`` has one row per optimiser step, written by :class:`trace_train.train.trainer.StepLogger`; the report,
the checkpoint selection and the benchmarks read it. Importing this module imports nothing heavy (matplotlib only
when a curve is drawn).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

@dataclass
class TrainResult:
    """What a run of :func:`trace_train.train.grpo.train` (GRPO or its SFT baseline) produced."""

    adapter_dir: Path
    log_csv: Path
    curve_png: Path | None
    steps: int
    rollouts: int
    calibration: dict | None
    seconds: float = 0.0
    output_dir: Path | None = None
    final: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}



#: Columns of ``train_log.csv`` (TRL's metric names where it has one). ``mismatch_kl``: the KL between the
#: distribution the rollouts sampled from and the trainer's, over the tokens both scored (k3 estimator, on the
#: sampled tokens); ``sampled_token_share``: the share of the agent's tokens in the loss that are exactly the
#: tokens it sampled (1.0: the loss trains what was sampled, token for token).
LOG_COLUMNS = ("step", "reward", "reward_std", "frac_reward_zero_std", "informative_before_resampling",
               "resampled_groups", "env_errors", "episodes", "kl", "mismatch_kl", "sampled_token_share",
               "completion_length", "clipped_ratio", "loss", "replay_nll", "grad_norm", "learning_rate",
               "generation_s", "env_s", "encode_s", "rollout_s", "forward_backward_s", "optimizer_s", "step_s",
               "reward_by_env")


def read_log(log_csv: str | Path) -> list[dict]:
    """``train_log.csv`` as a list of dicts of floats (empty cells are None)."""
    def value(key: str, text: str | None):
        if text in ("", None):
            return None
        return json.loads(text) if key == "reward_by_env" else float(text)

    with open(log_csv, newline="") as f:
        return [{k: value(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_rows(log_csv: Path, rows: list[dict], mode: str = "a") -> None:
    """Append ``rows`` to ``log_csv`` (``mode="w"``: replace it), with the header when the file is new."""
    new = mode == "w" or not log_csv.exists()
    with open(log_csv, mode, newline="") as f:
        writer = csv.DictWriter(f, fieldnames=LOG_COLUMNS, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerows(rows)


def plot_reward_curve(log_csv: Path, path: Path, title: str) -> Path | None:
    """Reward mean ± std per step and the informative share of groups, from ``train_log.csv``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = read_log(log_csv)
    if not rows:
        return None
    steps = [r["step"] for r in rows]
    mean = [r["reward"] or 0.0 for r in rows]
    std = [r["reward_std"] or 0.0 for r in rows]
    informative = [1.0 - (r["frac_reward_zero_std"] or 0.0) for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, mean, marker="o", ms=3, label="reward (mean over the step's rollouts)")
    # rewards live in [0, 1]: the ± std band is drawn inside it
    ax.fill_between(steps, [max(0.0, m - s) for m, s in zip(mean, std)], [min(1.0, m + s) for m, s in zip(mean, std)],
                    alpha=0.2)
    ax.plot(steps, informative, ls="--", color="tab:green", label="informative groups (share)")
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # steps are whole numbers
    ax.set_ylabel("reward / share")
    ax.set_ylim(-0.05, 1.05)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
