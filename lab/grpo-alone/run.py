"""GRPO alone on the planted cancellation decision: from a start that samples both decisions, does reward lift
greedy success on held-out seeds?

    python lab/grpo-alone/run.py --out runs/grpo-alone                      # the experiment (README.md)
    python lab/grpo-alone/run.py --out runs/grpo-alone-shuffled --shuffle-rewards --start runs/grpo-alone/start

Stages, each reused when its output exists (an interrupted run goes on where it stopped):

1. ``warmup``: SFT (a LoRA, the library's ``trace train --sft``) of the planted base on oracle episodes of
   ``lab/cancel_decision_blind-v0``: the flow of a cancellation, with the decision independent of the cabin shown.
2. ``start``: that LoRA merged into the base, a model folder: the policy GRPO starts from.
3. ``grpo``: TRACE's GRPO (a fresh LoRA) on ``lab/cancel_decision-v0``, the env with the real decision, checkpoints
   every ``--save-steps``.
4. ``curve``: the start (step 0) and every checkpoint played greedily on held-out seeds (``--eval-seeds``; training
   seeds start at 1,000,000), with success, its bootstrap interval, the reward breakdown and the balanced accuracy
   of the decision (allowed and must-refuse requests counted apart).
5. ``select``: the library's checkpoint selection (the recipe's early stopping) on validation seeds
   (``--select-seeds``); the kept checkpoint and the last one are set against the start, paired on the held-out
   seeds. ``report.md``, ``curve.json``, ``curve.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REGISTRY = HERE / "registry.yaml"
BASE = ROOT / "lab" / "headline-planted" / "bases" / "headline-planted"
ENV = "lab/cancel_decision-v0"
BLIND_ENV = "lab/cancel_decision_blind-v0"
#: The planted recipe's training size (lab/headline-planted/config.yaml), without its lead-in questions, and the
#: compact prompt the base was warmed up with (named here: the curve's env kwargs are passed as they are).
ENV_KWARGS = {"size": {"ask_details_prob": 1.0, "cancel_grounds": ["business"], "read_back": True},
              "prompt": "compact"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", default="runs/grpo-alone", help="run folder")
    p.add_argument("--start", default=None, help="a start model folder to reuse (skips warmup and start)")
    p.add_argument("--warmup-steps", type=int, default=400, help="SFT steps on the decision-blind episodes")
    p.add_argument("--steps", type=int, default=30, help="GRPO optimiser steps")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--groups-per-step", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-4, help="GRPO learning rate (constant)")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the rollouts (the loss "
                   "uses the same)")
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=0, help="GRPO's torch seed; its training seeds start at "
                   "1,000,000 + 100,000 × seed")
    p.add_argument("--shuffle-rewards", action="store_true", help="the negative control: rewards dealt at random")
    p.add_argument("--eval-seeds", default="0:100", help="held-out env seeds of the curve, start:stop")
    p.add_argument("--select-seeds", default="100:150", help="validation seeds of the checkpoint selection")
    p.add_argument("--workers", type=int, default=1, help="checkpoints played at once")
    p.add_argument("--start-adapter", default=None, help="a LoRA folder to merge into the base as the start instead "
                   "of this script's warm-up (e.g. a recipe run's `train/<capability>/run/sft_warmup/adapter`)")
    p.add_argument("--lead-in-prob", type=float, default=0.0, help="share of GRPO's and the curve's episodes that "
                   "open with a flight-status question, as the recipe's env does (0.5 there)")
    p.add_argument("--continue-warmup", type=int, default=0, metavar="STEPS", help="as the recipe does: GRPO "
                   "trains the LoRA of the library's own SFT warm-up of STEPS steps (TrainConfig.sft_warmup_steps, "
                   "its episodes decision-blind through sft_warmup_env_kwargs) over the planted base, instead of a "
                   "fresh LoRA over a merged start; the curve's step 0 is then the base")
    p.add_argument("--env", default=ENV, help="the env GRPO trains on and the curve plays (e.g. a recipe run's "
                   "generated env, with --registry)")
    p.add_argument("--registry", default=None, help="a registry file or workspace folder that registers --env")
    args = p.parse_args(argv)
    if sum(map(bool, (args.start, args.start_adapter, args.continue_warmup))) > 1:
        p.error("--start, --start-adapter and --continue-warmup are three starts: give one")
    return args


def env_kwargs(lead_in_prob: float) -> dict:
    """The GRPO env's kwargs: ``ENV_KWARGS``, with the recipe's lead-in questions in a share of the episodes."""
    if not lead_in_prob:
        return ENV_KWARGS
    return {**ENV_KWARGS, "lead_in": ["flight_status"], "lead_in_prob": lead_in_prob}


def warmup_and_start(out: Path, steps: int) -> Path:
    """Stages 1 and 2: the decision-blind SFT LoRA, merged into the base."""
    from trace_train.train.config import TrainConfig
    from trace_train.train.grpo import train

    start = out / "start"
    if (start / "config.json").exists():
        return start
    cfg = TrainConfig(env_ids=[BLIND_ENV], model=str(BASE), output_dir=str(out / "warmup"), env_kwargs=ENV_KWARGS,
                      registry=[str(REGISTRY)], sft=True, sft_steps=steps, sft_episodes=1000, device="cpu",
                      threads=1, seed=0)
    result = train(cfg)
    return merge_start(Path(result.adapter_dir), start)


def merge_start(adapter_dir: Path, start: Path) -> Path:
    """Stage 2: the LoRA at ``adapter_dir`` merged into the base, saved as the model folder ``start``."""
    if (start / "config.json").exists():
        return start
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(BASE), dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(str(start))
    AutoTokenizer.from_pretrained(str(BASE)).save_pretrained(str(start))
    # The base's metadata (its prompt size and chat format), which the trainer reads off the model folder: without
    # it GRPO's envs fall back to the full prompt the base never saw.
    shutil.copy(BASE / "trace_model.json", start / "trace_model.json")
    return start


def run_grpo(out: Path, start: Path, args: argparse.Namespace) -> Path:
    """Stage 3."""
    from trace_train.train.config import TrainConfig
    from trace_train.train.grpo import train

    run = out / "grpo"
    if (run / "train_result.json").exists():
        return run
    warm = {"sft_warmup_steps": args.continue_warmup, "sft_episodes": 1000,
            "sft_warmup_env_kwargs": {"size": {"blind_cabin_prob": 0.5}}} if args.continue_warmup else {}
    cfg = TrainConfig(env_ids=[args.env], model=str(start), output_dir=str(run),
                      env_kwargs=env_kwargs(args.lead_in_prob), **warm, registry=registries(args),
                      group_size=args.group_size, groups_per_step=args.groups_per_step,
                      learning_rate=args.lr, lr_scheduler_type="constant", max_steps=args.steps,
                      save_steps=args.save_steps, max_tool_calling_iterations=30, max_turn_tokens=160,
                      temperature=args.temperature, shuffle_rewards=args.shuffle_rewards, device="cpu", threads=1,
                      seed=args.seed, seed_offset=1_000_000 + 100_000 * args.seed,
                      resume=(run / "checkpoints").is_dir())
    train(cfg)
    return run


def decision_row(episodes: list[dict]) -> dict:
    """Balanced accuracy of the decision and the reward breakdown's shares, over one checkpoint's episodes.

    The agent went ahead when it called the requested write (``attempted``, allowed requests) or the forbidden one
    (``forbidden_write``, must-refuse requests); otherwise it refused (or stopped)."""
    counts = {"act": [0, 0], "refuse": [0, 0]}  # gold decision -> [right, total]
    keys = ("evidence", "informed", "exact", "communicated")
    shares = {k: 0 for k in keys}
    for t in episodes:
        b = t.get("reward_breakdown") or {}
        # An episode cut short (too many errors, repeated calls) has no breakdown of its request: its gold decision
        # is the task's, and it did not go ahead.
        gold = b.get("decision") or (t.get("task") or {}).get("decision")
        if gold not in counts:
            continue
        went_ahead = bool(b.get("attempted") or b.get("forbidden_write"))
        counts[gold][0] += int(went_ahead == (gold == "act"))
        counts[gold][1] += 1
        for k in keys:
            shares[k] += int(bool(b.get(k)))
    acc = {g: (r / n if n else float("nan")) for g, (r, n) in counts.items()}
    n = sum(c[1] for c in counts.values())
    from trace_envs.calibration import decision_accuracy

    success = decision_accuracy(episodes) or {}
    return {"acc_act": acc["act"], "acc_refuse": acc["refuse"], "balanced_acc": (acc["act"] + acc["refuse"]) / 2,
            "n_act": counts["act"][1], "n_refuse": counts["refuse"][1],
            "success_allowed": success.get("allowed", {}).get("success", float("nan")),
            "success_must_refuse": success.get("must_refuse", {}).get("success", float("nan")),
            "balanced_success": success.get("balanced_accuracy", float("nan")),
            **{f"share_{k}": shares[k] / n if n else float("nan") for k in keys}}


def registries(args: argparse.Namespace) -> list[str]:
    """The registries GRPO and the curve load: this experiment's, and ``--registry`` when given."""
    return [str(REGISTRY)] + ([str(args.registry)] if args.registry else [])


def curve(out: Path, start: Path, run: Path, seeds: range, workers: int, kwargs: dict,
          env: str = ENV, regs: Sequence[str] = (str(REGISTRY),)) -> list[dict]:
    """Stage 4: play the start and the checkpoints on held-out seeds; the rows of the curve."""
    from trace_train.rollouts import read_trajectories
    from trace_train.train.select import select_checkpoint, step_episodes

    sel = select_checkpoint(str(start), run, [env], list(seeds), out / "curve", env_kwargs=lambda e: kwargs,
                            workers=workers, registries=list(regs), max_new_tokens=160,
                            final_adapter=run / "adapter", progress=True)
    rows = []
    for point in sel.rows:
        episodes = read_trajectories(step_episodes(out / "curve", point["step"]))
        rows.append({**point, **decision_row(episodes)})
    return rows


def select(out: Path, start: Path, run: Path, seeds: range, workers: int, kwargs: dict,
           env: str = ENV, regs: Sequence[str] = (str(REGISTRY),)) -> int:
    """The checkpoint the library's selection keeps (``trace_train.train.select``, what the recipe does): the best
    greedy success on validation seeds, which neither training nor the held-out curve uses."""
    from trace_train.train.select import select_checkpoint

    return select_checkpoint(str(start), run, [env], list(seeds), out / "select", env_kwargs=lambda e: kwargs,
                             workers=workers, registries=list(regs), max_new_tokens=160,
                             final_adapter=run / "adapter").step


def paired(out: Path, step: int) -> dict:
    """Held-out success of step ``step``'s checkpoint minus the start's, paired on seeds, with its interval."""
    from trace_train.evaluate import compare
    from trace_train.train.select import step_episodes

    result = compare(step_episodes(out / "curve", 0), step_episodes(out / "curve", step), ks=[1], n_boot=2000,
                     seed=0)
    return result["delta"]["pass@1"]


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot(steps, [r["success"] for r in rows], marker="o", label="greedy success")
    ax.fill_between(steps, [r["lo"] for r in rows], [r["hi"] for r in rows], alpha=0.2)
    ax.plot(steps, [r["balanced_acc"] for r in rows], marker="s", label="decision: balanced accuracy")
    ax.plot(steps, [r["acc_refuse"] for r in rows], ls=":", label="refuses a must-refuse request")
    ax.plot(steps, [r["acc_act"] for r in rows], ls="--", label="goes ahead with an allowed one")
    ax.set_xlabel("GRPO step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(rows: list[dict], diffs: dict[str, tuple[int, dict]], args: argparse.Namespace) -> str:
    head = ("| step | success [95% CI] | success: allowed / must-refuse | mean reward | decision: balanced acc. | "
            "goes ahead (allowed) | refuses (must-refuse) | read the record | stated facts | exact write |\n"
            "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(
        f"| {r['step']} | {r['success']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] | {r['success_allowed']:.2f} / "
        f"{r['success_must_refuse']:.2f} | {r['reward']:.3f} | "
        f"{r['balanced_acc']:.3f} | {r['acc_act']:.3f} ({r['n_act']}) | {r['acc_refuse']:.3f} ({r['n_refuse']}) | "
        f"{r['share_evidence']:.2f} | {r['share_communicated']:.2f} | {r['share_exact']:.2f} |\n" for r in rows)
    lines = "".join(f"- {what} (step {step}) − start, paired on the held-out seeds: **{d['value']:+.3f} "
                    f"[{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]**\n" for what, (step, d) in diffs.items())
    arm = "shuffled rewards (negative control)" if args.shuffle_rewards else "rewards as the env pays them"
    start_text = f"`{args.start}`" if args.start else \
        f"the planted base; GRPO trains the LoRA of {args.continue_warmup} decision-blind SFT warm-up steps (step 0 " \
        f"is the base)" if args.continue_warmup else \
        f"the planted base + `{args.start_adapter}`, merged" if args.start_adapter else \
        f"the planted base + {args.warmup_steps} SFT steps on `{BLIND_ENV}`, merged"
    lead_in = f" Lead-in flight-status questions in {args.lead_in_prob:g} of the episodes." if args.lead_in_prob else ""
    return (f"# GRPO alone on `{args.env}` ({arm})\n\n"
            f"Start: {start_text}. "
            f"GRPO: {args.steps} steps × {args.groups_per_step} groups × {args.group_size} episodes at temperature "
            f"{args.temperature:g}, lr {args.lr:g} constant, LoRA r16, seed {args.seed}. Greedy on held-out seeds "
            f"{args.eval_seeds}.{lead_in}\n\n"
            f"Validation seeds (checkpoint selection) {args.select_seeds}.\n\n{lines}\n"
            + head + body + "\n![curve](curve.png)\n")


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(ROOT))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.start:
        start = Path(args.start)
    elif args.continue_warmup:
        start = BASE
    elif args.start_adapter:
        start = merge_start(Path(args.start_adapter), out / "start")
    else:
        start = warmup_and_start(out, args.warmup_steps)
    run = run_grpo(out, start, args)
    kwargs = env_kwargs(args.lead_in_prob)
    a, b = (int(x) for x in args.eval_seeds.split(":"))
    rows = curve(out, start, run, range(a, b), args.workers, kwargs, args.env, registries(args))
    a, b = (int(x) for x in args.select_seeds.split(":"))
    chosen = select(out, start, run, range(a, b), args.workers, kwargs, args.env, registries(args))
    diffs = {"the checkpoint selection keeps": (chosen, paired(out, chosen)),
             "the last checkpoint": (rows[-1]["step"], paired(out, rows[-1]["step"]))}
    (out / "curve.json").write_text(json.dumps({"rows": rows, "selected": chosen,
                                                "paired": {k: {"step": st, **d} for k, (st, d) in diffs.items()}},
                                               indent=2))
    plot(rows, out / "curve.png", f"GRPO on {args.env}" + (" (shuffled rewards)" if args.shuffle_rewards else ""))
    text = report(rows, diffs, args)
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
