"""Success of the bootstrapped tiny model on held-out seeds of the target, against wall time.

The SFT warm-up (``trace model bootstrap``) trains the tiny preset on oracle trajectories of the
target (seeds from 100000 up) with some scenario families left out, for ``--budget-min`` minutes of
training (a time budget, not a step count planned in advance: see ``BootstrapConfig.max_seconds``);
at every quarter of it the model in training is evaluated greedily on held-out seeds
(``--eval-seeds``, default 0:40) with the compact prompt.

What is learnable in 20 CPU minutes: by default the warm-up trains on the simplest airline families
(``--scenarios flight_status info``: look the user up, one read tool, answer) with one request per
episode (``--bundle-prob 0``, the env's documented ``size={"bundle_prob": ...}`` knob), and the
evaluation env draws from those families plus the left-out ones (``--exclude-scenarios``, default
``cancel``), uniformly. Overall success is over that mix; the left-out share is reported apart. The
env is the real ``trace/tau_airline-v0`` (compact prompt: short policy and tool schemas); pass
``--scenarios`` with more families (or ``all``) for a harder curve. The recipe: the ``tiny`` preset
(built with a hand-set copy circuit, :mod:`trace_train.tiny.copy_circuit`, whose positional part is held
fixed during the warm-up: ``--freeze-circuit``), batches of 8, 4000 training episodes
(``--train-seeds``), and the curriculum ``--pretrain-frac 0.5`` (LM pre-training on the
conversations alone, then SFT; see ``BootstrapConfig.pretrain_frac``).

Reported per checkpoint: training wall time (setup and evaluation pauses excluded), success overall, on the
scenarios trained on, and on the scenarios left out — which must stay low: the warm-up yields a base
model with known gaps, the embedded demo's base agent — and, as a diagnostic, the share of assistant
turns of held-out oracle episodes the model reproduces exactly from the true history, tool calls and
messages apart (:func:`trace_train.tiny.sft_data.teacher_forced_turns`). Episode success needs every turn
right; the per-turn figures show where it stands before that (e.g. messages right, calls wrong: the
model has the turn format but does not yet copy ids from the conversation into its calls).

Anchor: the oracle (success 1.0 by construction) and the untrained model at step 0, same seeds.
Goal (issue 6): ≥ 30% overall success within 20 minutes of training on 2 cores.

Writes ``<out>/bootstrap_curve.json`` and ``<out>/bootstrap_curve.png``.

Usage::

    python bench/bootstrap_curve.py                                    # trace/tau_airline-v0, 20 min
    python bench/bootstrap_curve.py --budget-min 5 --eval-seeds 0:20   # a quick look
    python bench/bootstrap_curve.py --scenarios all --bundle-prob 0.3                # the full airline mix
    python bench/bootstrap_curve.py --target trace/tau_retail-v0 --scenarios all --exclude-scenarios return
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def parse_seeds(spec: str) -> list[int]:
    lo, _, hi = spec.partition(":")
    return list(range(int(lo), int(hi))) if hi else list(range(int(lo)))


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="trace/tau_airline-v0")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--scenarios", nargs="*", default=["flight_status", "info"],
                        help="families trained on (default: flight_status info; 'all': every family of the target)")
    parser.add_argument("--exclude-scenarios", nargs="*", default=["cancel"],
                        help="families left out of the warm-up and evaluated (default: cancel)")
    parser.add_argument("--bundle-prob", type=float, default=0.0,
                        help="chance of a multi-request episode (env size knob; default 0: one request each)")
    parser.add_argument("--budget-min", type=float, default=20.0, help="training wall-time budget in minutes")
    parser.add_argument("--steps", type=int, default=None,
                        help="a fixed number of steps instead of the time budget (evaluated every quarter)")
    parser.add_argument("--train-seeds", type=int, default=4000,
                        help="oracle episodes to train on (default: 4000; with 1000 the ~600 steps of 20 minutes "
                             "see each episode several times and late checkpoints got worse)")
    parser.add_argument("--warmup-steps", type=int, default=20)
    parser.add_argument("--eval-seeds", default="0:40", help="held-out seeds (default: 0:40)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--pretrain-frac", type=float, default=0.5,
                        help="curriculum: fraction of steps of LM pre-training on the conversations alone "
                             "(default 0.5)")
    parser.add_argument("--freeze-circuit", choices=["all", "positional", "none"], default="positional",
                        help="which part of the tiny preset's copy circuit stays as built (default: positional)")
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1 measured faster than 2 for the tiny preset on a busy 2-core box)")
    parser.add_argument("--device", default="cpu", help="cpu (the goal's setting) or cuda")
    parser.add_argument("--skip-untrained", action="store_true",
                        help="do not evaluate the random-init model at step 0 (slow: it rambles to max tokens)")
    parser.add_argument("--turn-episodes", type=int, default=12,
                        help="held-out oracle episodes of the trained families whose turns are replayed "
                             "teacher-forced at each evaluation (default: 12)")
    parser.add_argument("--out", default="bench/out/bootstrap_curve")
    args = parser.parse_args()

    import trace_envs
    from trace_envs import OracleAgent
    from trace_train.agents import HFAgent
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.build import build_model
    from trace_train.tiny.metadata import prompt_env_kwargs
    from trace_train.tiny.sft_data import oracle_trajectories, scenario_families, teacher_forced_turns
    from trace_train.tiny.tokenizer import default_corpus_envs
    from trace_train.rollouts import run_rollouts

    try:
        trace_envs.get_entry(args.target)
    except KeyError:
        sys.exit(f"{args.target} is not registered yet; this benchmark needs it (see `trace envs list`).")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    excluded = set(args.exclude_scenarios)
    seeds = parse_seeds(args.eval_seeds)
    size = {"bundle_prob": args.bundle_prob}
    trained = None if args.scenarios == ["all"] else list(args.scenarios)
    train_kwargs = {"size": size, **({"scenarios": trained} if trained else {})}
    eval_kwargs = {**prompt_env_kwargs(args.target, "compact"), "size": size,
                   **({"scenarios": trained + sorted(excluded - set(trained))} if trained else {})}
    env_kwargs = eval_kwargs

    def split(records: list[dict]) -> dict:
        left_out = [r for r in records if r.get("scenario") and excluded & set(scenario_families(r["scenario"]))]
        trained = [r for r in records if r not in left_out]
        rate = lambda rs: sum(r["success"] for r in rs) / len(rs) if rs else None  # noqa: E731
        return {"overall": rate(records), "trained_scenarios": rate(trained), "left_out_scenarios": rate(left_out),
                "n": len(records), "n_left_out": len(left_out),
                "mean_reward": sum(r["reward"] for r in records) / len(records)}

    oracle = split(run_rollouts(args.target, OracleAgent(), seeds, progress=False, keep_records=True,
                                env_kwargs=env_kwargs).records)
    print(f"oracle on {len(seeds)} held-out seeds: {oracle}")

    # Teacher-forced turns: held-out oracle episodes of the trained families, for the per-turn diagnostic.
    probe_records = oracle_trajectories(args.target, seeds, sorted(excluded), env_kwargs)[0][:args.turn_episodes]

    t_build = time.perf_counter()
    base = build_model(args.preset, env_ids=sorted(set(default_corpus_envs()) | {args.target}))
    print(f"model {base.path} ({'cached' if base.cached else 'built'} in {time.perf_counter() - t_build:.0f}s)")

    points: list[dict] = []

    def evaluate(step: int, model, tokenizer, seconds: float) -> None:
        t0 = time.perf_counter()
        agent = HFAgent(model, tokenizer=tokenizer, threads=None, max_new_tokens=args.max_new_tokens,
                        name=f"bootstrap@{step}", device=args.device)
        res = run_rollouts(args.target, agent, seeds, in_flight=len(seeds), progress=False, keep_records=True,
                           env_kwargs=env_kwargs)
        turns = teacher_forced_turns(model, tokenizer, probe_records, device=args.device)
        took = time.perf_counter() - t0
        point = {"step": step, "train_s": seconds, **split(res.records),
                 "turns_tool_call": turns["tool_call"], "turns_message": turns["message"], "eval_s": took,
                 "loadavg_1m": round(os.getloadavg()[0], 2)}
        points.append(point)
        print(f"step {step:>4}  train {point['train_s'] / 60:5.1f} min  success {point['overall']:.3f}  "
              f"trained scenarios {point['trained_scenarios']}  left out {point['left_out_scenarios']}  "
              f"turns right: calls {_rate(turns['tool_call'])} messages {_rate(turns['message'])}  "
              f"(eval {took:.0f}s, load {point['loadavg_1m']})", flush=True)

    budget_s = args.budget_min * 60
    cfg = BootstrapConfig(target=args.target, base=str(base.path), exclude_scenarios=tuple(excluded),
                          steps=args.steps or 1_000_000, max_seconds=None if args.steps else budget_s,
                          batch_size=args.batch_size, lr=args.lr, max_length=args.max_length, threads=args.threads,
                          device=args.device, train_seeds=args.train_seeds, out=str(out / "model"),
                          env_kwargs=train_kwargs, warmup_steps=args.warmup_steps, pretrain_frac=args.pretrain_frac,
                          freeze_circuit=args.freeze_circuit)
    # 4 evaluations, the last one at the end: every quarter of the budget (or of --steps).
    every_steps = -(-args.steps // 4) if args.steps else 0
    every_s = 0.0 if args.steps else budget_s / 4
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import torch

    torch.set_num_threads(args.threads)
    if not args.skip_untrained:
        evaluate(0, AutoModelForCausalLM.from_pretrained(base.path).to(args.device).eval(),
                 AutoTokenizer.from_pretrained(base.path), 0.0)

    def write_report(result=None) -> None:
        """bootstrap_curve.json and .png from the points so far (rewritten after every evaluation)."""
        if not points:
            return
        best = max(points, key=lambda p: p["overall"])
        within = [p for p in points if p["train_s"] <= 20 * 60]
        report = {"target": args.target, "scenarios": trained or "all", "exclude_scenarios": sorted(excluded),
                  "train_env_kwargs": {**prompt_env_kwargs(args.target, "compact"), **train_kwargs},
                  "eval_env_kwargs": eval_kwargs, "eval_seeds": args.eval_seeds, "budget_min": args.budget_min,
                  "oracle": oracle, "steps": points[-1]["step"], "batch_size": args.batch_size, "lr": args.lr,
                  "pretrain_frac": args.pretrain_frac, "freeze_circuit": args.freeze_circuit,
                  "threads": args.threads, "device": args.device, "cpu_count": os.cpu_count(),
                  "loadavg_now": os.getloadavg(), "complete": result is not None,
                  "goal": {"overall_success": 0.30, "within_min": 20.0},
                  "reached": {"overall": points[-1]["overall"], "trained_scenarios": points[-1]["trained_scenarios"],
                              "left_out_scenarios": points[-1]["left_out_scenarios"],
                              "train_min": round(points[-1]["train_s"] / 60, 2),
                              "best_overall": best["overall"], "best_at_min": round(best["train_s"] / 60, 2),
                              "best_overall_within_20_min": max((p["overall"] for p in within), default=None)},
                  "points": points}
        if result is not None:
            report.update({"model": str(result.path), "final_loss": result.losses[-1], "losses": result.losses,
                           "shared_prefix_tokens": json.loads((result.path / "trace_model.json").read_text())
                           ["bootstrap"].get("shared_prefix_tokens")})
        (out / "bootstrap_curve.json").write_text(json.dumps(report, indent=2))

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
        x = [p["train_s"] / 60 for p in points]
        for key, label in (("overall", "all held-out seeds"), ("trained_scenarios", "scenarios trained on"),
                           ("left_out_scenarios", f"left out ({', '.join(sorted(excluded))})")):
            ax.plot(x, [p[key] if p[key] is not None else float("nan") for p in points], marker="o", label=label)
        for key, label in (("turns_tool_call", "tool-call turns right (teacher-forced)"),
                           ("turns_message", "message turns right (teacher-forced)")):
            ax.plot(x, [p[key] if p[key] is not None else float("nan") for p in points], ls=":", marker=".",
                    label=label)
        ax.axhline(0.30, ls="--", lw=0.8, color="grey", label="goal 30%")
        ax.set_xlabel("training wall time (min)")
        ax.set_ylabel("success rate")
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlim(0, max(20.5, max(x) + 0.5))
        loads = [p["loadavg_1m"] for p in points]
        ax.set_title(f"bootstrap of the {args.preset} model on {args.target}\n"
                     f"trained: {', '.join(trained or ['all'])}; {os.cpu_count()} cores, {args.threads} thread(s), "
                     f"load avg {min(loads):.1f}-{max(loads):.1f}" + ("" if result is not None else " (partial)"),
                     fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "bootstrap_curve.png")
        plt.close(fig)

    checkpoint = evaluate

    def evaluate_and_write(step: int, model, tokenizer, seconds: float) -> None:
        checkpoint(step, model, tokenizer, seconds)
        write_report()

    result = bootstrap_model(cfg, progress=True, on_checkpoint=evaluate_and_write, checkpoint_every=every_steps,
                             checkpoint_every_s=every_s)
    write_report(result)
    last = points[-1]
    print(f"\nafter {last['train_s'] / 60:.1f} min: success {last['overall']:.3f} "
          f"(oracle {oracle['overall']:.3f}; goal 0.30); left-out scenarios {last['left_out_scenarios']}")
    print(f"written: {out / 'bootstrap_curve.json'}, {out / 'bootstrap_curve.png'}")

if __name__ == "__main__":
    main()
