"""Checkpoint selection: the GRPO budget read off the held-out learning curve of each run, not guessed.

GRPO on a tiny model can learn a skill within a few steps and give part of it back later (the headline recipe's
structured-data adapter: held-out success 0.21 for the base, 0.44 at step 10, 0.30 from step 30 on;
docs/train.md). A fixed step budget keeps whatever the last step left. Selection plays the base (step 0)
and every ``every``-th saved checkpoint (``<output_dir>/checkpoints/checkpoint-N``, and always the last one)
greedily on *validation* seeds of the run's own envs, seeds that neither training (1,000,000 on) nor the
evaluation's held-out env seeds (0-99 by default) use, and keeps the checkpoint with the highest success. It
is early stopping on a validation set: the evaluation stays on seeds the choice never saw.

The same curve machinery serves ``scripts/learning_curve.py``, which plays the checkpoints on the evaluation's
seeds or on the target to *show* the curve after a run.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

#: The curve's columns, as ``curve.csv`` writes them.
CURVE_FIELDS = ("step", "success", "lo", "hi", "reward", "episodes")


def checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, adapter folder) of each ``checkpoint-N`` under ``folder`` (a GRPO run's ``checkpoints/``), by step:
    the checkpoint itself, or its ``on_base/`` when GRPO trained a LoRA over a merged warm-up (train/fold.py)."""
    from .fold import usable_adapter

    found = [(int(m.group(1)), usable_adapter(p)) for p in Path(folder).glob("checkpoint-*")
             if p.is_dir() and (m := re.fullmatch(r"checkpoint-(\d+)", p.name))]
    return sorted(found)


def every_nth(points: Sequence[tuple[int, Path]], every: int) -> list[tuple[int, Path]]:
    """Every ``every``-th of ``points`` (the ``every``-th, the 2·``every``-th, ...), and always the last one."""
    return [pt for i, pt in enumerate(points) if i % every == every - 1 or i == len(points) - 1]


def curve_point(episodes: list[dict], seed: int = 0) -> dict:
    """One checkpoint's point: pass@1 over its episodes with the evaluation's own bootstrap interval
    (:func:`trace_train.evaluate.evaluate`), the mean reward apart from it, and the episode count."""
    from trace_train.evaluate import evaluate

    if not episodes:
        return {"success": float("nan"), "lo": float("nan"), "hi": float("nan"), "reward": float("nan"), "episodes": 0}
    m = evaluate(episodes, ks=[1], n_boot=2000, seed=seed)["overall"]["pass@1"]
    return {"success": m["value"], "lo": m["ci"][0], "hi": m["ci"][1],
            "reward": float(np.mean([float(t.get("reward") or 0.0) for t in episodes])), "episodes": len(episodes)}


def write_curve(rows: list[dict], out: Path, title: str, chosen: int | None = None) -> tuple[Path, Path]:
    """``curve.csv`` and ``curve.png`` of ``rows`` (one :func:`curve_point` per step, plus its ``step``)."""
    import csv

    out.mkdir(parents=True, exist_ok=True)
    with open(out / "curve.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(CURVE_FIELDS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    plot_curve(rows, out / "curve.png", title, chosen=chosen)
    return out / "curve.csv", out / "curve.png"


def plot_curve(rows: list[dict], path: Path, title: str, chosen: int | None = None) -> None:
    """Success with its 95% interval and mean reward against the GRPO step; ``chosen`` marks a selected step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.fill_between(steps, [r["lo"] for r in rows], [r["hi"] for r in rows], alpha=0.25, label="95% interval")
    ax.plot(steps, [r["success"] for r in rows], marker="o", label="success")
    ax.plot(steps, [r["reward"] for r in rows], marker=".", linestyle="--", label="mean reward")
    if chosen is not None:
        ax.axvline(chosen, color="tab:green", linestyle=":", label=f"selected: step {chosen}")
    ax.set_xlabel("GRPO step (0 = the base)")
    ax.set_ylabel("share of held-out seeds")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass
class Selection:
    """The outcome of :func:`select_checkpoint`.

    Attributes:
        step: the chosen checkpoint's step (never 0: the base is the curve's reference, not a choice).
        adapter_dir: its adapter folder.
        final_step: the run's last step (``step == final_step`` when the end of training was best).
        rows: the validation curve, one :func:`curve_point` per played step (step 0 = the base).
        seeds: the validation seeds, ``[start, stop)``.
        env_ids: the envs played (their successes pooled).
    """

    step: int
    adapter_dir: str
    final_step: int
    rows: list[dict] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    env_ids: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def choose(rows: list[dict]) -> int:
    """The step to keep from a validation curve: the highest success among the trained steps (step > 0), then
    the highest mean reward, then the latest step (ties keep more training, which the final adapter is)."""
    trained = [r for r in rows if r["step"] > 0 and r["episodes"]]
    if not trained:
        raise ValueError("no trained checkpoint was played")
    return max(trained, key=lambda r: (r["success"], r["reward"], r["step"]))["step"]


def step_episodes(out: str | Path, step: int) -> Path:
    """Where the episodes played with step ``step``'s checkpoint go under ``out`` (step 0 is the base)."""
    return Path(out) / f"{step:05d}" / "trajectories.jsonl"


def select_checkpoint(model: str, run_dir: str | Path, env_ids: Sequence[str], seeds: Sequence[int], out: str | Path,
                      env_kwargs: Callable[[str], dict], every: int = 1, workers: int = 1, in_flight: int = 50,
                      registries: Sequence[str] = (), max_new_tokens: int = 96, decode: str = "auto",
                      threads: int = 1, seed: int = 0, final_adapter: str | Path | None = None,
                      progress: bool = False) -> Selection:
    """Play the base and the checkpoints of the GRPO run in ``run_dir`` on ``seeds`` of ``env_ids`` and keep the best.

    Args:
        model: the base model folder the adapter was trained on.
        run_dir: the GRPO run's ``output_dir`` (its ``checkpoints/checkpoint-N`` folders are the candidates).
        env_ids: the envs the run trained on (each plays every seed; successes are pooled).
        seeds: validation seeds: disjoint from the training seeds and from the evaluation's.
        out: where episodes (``<step>/trajectories.jsonl``, resumed when present), ``curve.csv``, ``curve.png``
            and ``selection.json`` go.
        env_kwargs: env id -> ``gym.make`` kwargs (those the run trained with).
        every: play every ``every``-th checkpoint (the last one always).
        workers: checkpoints played at once, one process each.
        final_adapter: the run's final adapter folder, which the last checkpoint stands for when the run saved
            no checkpoint at its last step.
    """
    from trace_train.agents import HFAgent
    from trace_train.backends import RolloutJob, run_jobs
    from trace_train.rollouts import read_trajectories

    out = Path(out)
    points = checkpoints(Path(run_dir) / "checkpoints")
    final = json.loads((Path(run_dir) / "train_result.json").read_text())["steps"] \
        if (Path(run_dir) / "train_result.json").is_file() else (points[-1][0] if points else 0)
    if final_adapter is not None and (not points or points[-1][0] < final):
        points.append((final, Path(final_adapter)))  # the end of training, not saved as a checkpoint
    if not points:
        raise ValueError(f"{run_dir}: no checkpoint to choose from (save_steps must be set)")
    plays = [(0, None)] + [(step, str(path)) for step, path in every_nth(points, every)]
    jobs = [RolloutJob(key=f"select step {step}", targets=list(env_ids), seeds=list(seeds), samples=1,
                       make=functools.partial(HFAgent, model, adapter=adapter, threads=threads,
                                              max_new_tokens=max_new_tokens, temperature=0.0, seed=seed,
                                              decode=decode, name=f"step-{step}"),
                       out=step_episodes(out, step), in_flight=in_flight,
                       env_kwargs={e: env_kwargs(e) for e in env_ids}, registries=list(registries),
                       retry_env_errors=True, progress=progress, agent_name=f"step-{step}")
            for step, adapter in plays]
    run_jobs(jobs, workers=workers)
    wanted = {(e, int(s)) for e in env_ids for s in seeds}
    rows = []
    for (step, _), job in zip(plays, jobs):
        episodes = [t for t in read_trajectories(job.out) if (t["env_id"], int(t["seed"])) in wanted]
        rows.append({"step": step, **curve_point(episodes, seed=seed)})
    step = choose(rows)
    selection = Selection(step=step, adapter_dir=str(dict(plays)[step]), final_step=final, rows=rows,
                          seeds=[min(seeds), max(seeds) + 1], env_ids=list(env_ids))
    write_curve(rows, out, f"validation success along GRPO on {', '.join(env_ids)}", chosen=step)
    (out / "selection.json").write_text(json.dumps(selection.to_dict(), indent=2) + "\n")
    return selection


__all__ = ["CURVE_FIELDS", "Selection", "checkpoints", "choose", "curve_point", "every_nth", "plot_curve",
           "select_checkpoint", "step_episodes", "write_curve"]
