"""Headline: does GRPO (``trace train``) raise the bootstrapped tiny model's reward on a τ² capability env?

    python bench/grpo_gain.py [--work DIR] [--bootstrap-minutes 10] [--train-minutes 20] [--eval-seeds 200]

Four phases, each cached in ``--work`` (a rerun skips what is done):

1. **Base.** ``trace model bootstrap`` of the ``tiny`` preset on the airline target (one request per episode,
   ``size={"bundle_prob": 0}``), with a warm-up mixture: ``--mix-share`` (default 5%) of the target's episode
   count taken from each τ² capability env's own oracle episodes at difficulty 1 (seeds from 100000, so
   every seed used below is held out). That makes a base that is *sometimes* right on the capability
   envs; one bootstrapped on the target alone scores ~0 there (docs/design.md, "Models") and GRPO learns nothing from
   groups that are all 0.
2. **Calibration table** of that base on every τ² capability env at difficulties 1-3: ``--groups`` groups
   of ``--group-size`` rollouts at temperature 1.0 (seeds 5000+): mean reward, informative share (groups
   whose rewards differ), seconds per episode.
3. **Pick and train.** The rule (printed): the (env, difficulty) cell with the highest informative share;
   ties go to the mean reward nearest 0.4, then the lower difficulty. GRPO on it with ``trace train`` for
   ``--train-minutes`` of training (the time budget of ``TrainConfig.max_minutes``).
4. **Before vs after** on the same ``--eval-seeds`` held-out seeds (0..N-1), greedy decoding, the base vs
   base + adapter: mean reward of each, the paired difference with its 95% bootstrap confidence interval
   (``trace_train.evaluate.compare``), and the reward curve of training.

The ratio printed at the end is after / before (the anchor is the base, measured in the same run). On a
shared 2-core machine every time here is under contention.

Measured 2026-12-01 (``--bootstrap-minutes 12 --bootstrap-seeds 1500 --mix-share 0.1 --groups 4 --difficulties 1 2
--train-minutes 20 --eval-seeds 200 --max-turns 10``): the rule picked precondition_verification at difficulty
1; 23 GRPO steps in 19.4 min; greedy mean reward 0.010 → 0.328, paired gain +0.318 [+0.285, +0.350]. Success
stayed 0: the adapter learned to end without writing, which this env pays 0.5 on must-refuse requests
(README, *Training*). Look at ``eval_after.jsonl``'s ``reward_breakdown`` before reading a gain as a skill.

Measured 2026-12-02 on ``precondition_verification-v1`` with the shipped base (``--base
trace_train/tiny/bases/embedded-default --env trace/precondition_verification-v1 --difficulty 1 --difficulties 1
--groups 4 --group-size 4 --train-minutes 10 --eval-seeds 200 --max-turns 10``): 56 steps, 4% informative groups;
mean reward 0.005 → 0.003, success 0 → 0 (balanced accuracy 0.000): no free credit left, and this base is never
right on the env (docs/train.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = "trace/tau_airline-v0"


def capability_envs() -> list[str]:
    """The newest id of every τ² capability env (the ``-v1`` rewards pay only for evidence of the skill)."""
    import trace_envs

    caps = sorted({e.capability for e in trace_envs.registered()
                   if e.kind == "capability" and (e.target or "").startswith("tau_") and not e.requires
                   and e.origin == "hand-written"})
    return [trace_envs.latest_capability_id(c) for c in caps]


def make_base(work: Path, minutes: float, share: float, caps: list[str], train_seeds: int) -> str:
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model

    out = work / "base"
    if (out / "trace_model.json").exists():
        return str(out)
    cfg = BootstrapConfig(target=TARGET, preset="tiny", out=str(out), env_kwargs={"size": {"bundle_prob": 0.0}},
                          train_seeds=train_seeds, pretrain_frac=0.3, steps=1_000_000, max_seconds=minutes * 60,
                          mixture={c: share for c in caps}, mixture_env_kwargs={"difficulty": 1})
    result = bootstrap_model(cfg)
    print(f"base: {len(result.losses)} SFT steps on {result.examples} episodes in {result.seconds / 60:.1f} min, "
          f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}")
    return str(result.path)


def agent(model: str, temperature: float, adapter: str | None = None, batch: int = 32):
    from trace_train.agents import HFAgent

    return HFAgent(model, adapter=adapter, temperature=temperature, max_new_tokens=160, batch_size=batch, seed=0)


def calibration_table(work: Path, base: str, caps: list[str], difficulties: list[int], groups: int,
                      group_size: int, max_turns: int | None) -> list[dict]:
    from trace_envs.calibration import summarize
    from trace_train.tiny.metadata import model_env_kwargs
    from trace_train.rollouts import run_rollouts

    path = work / "calibration.json"
    table = json.loads(path.read_text()) if path.exists() else []
    done = {(r["env"], r["difficulty"]) for r in table}
    policy = agent(base, 1.0, batch=groups * group_size)
    for row in table:  # cells measured by an earlier run (possibly with another turn cap)
        print(f"  {row['env']:45s} d={row['difficulty']}  mean {row['mean_reward']:.3f}  informative "
              f"{row['informative']:.0%}  all-0 {row['all_zero']:.0%}  {row['s_per_episode']:.1f} s/episode  turn cap "
              f"{row.get('max_turns')}  (cached)")
    for env in caps:
        for d in difficulties:
            if (env, d) in done:
                continue
            s = run_rollouts(env, policy, seeds=range(5000, 5000 + groups), samples=group_size,
                             in_flight=groups * group_size, env_kwargs={**model_env_kwargs(base, env), "difficulty": d},
                             progress=False, keep_records=True, max_steps=max_turns)
            rep = summarize(s.records, env_id=env, difficulty=d)
            table.append({"env": env, "difficulty": d, "mean_reward": rep.mean_reward, "success": rep.success_rate,
                          "informative": rep.informative, "all_zero": rep.all_zero, "all_one": rep.all_one,
                          "s_per_episode": s.seconds / max(1, s.ran), "max_turns": max_turns})
            path.write_text(json.dumps(table, indent=1))
            print(f"  {env:45s} d={d}  mean {rep.mean_reward:.3f}  informative {rep.informative:.0%}  "
                  f"all-0 {rep.all_zero:.0%}  {s.seconds / max(1, s.ran):.1f} s/episode  turn cap {max_turns}",
                  flush=True)
    return table


RULE = ("highest informative share; ties: mean reward nearest 0.4, then the lower difficulty")


def pick(table: list[dict]) -> dict:
    return sorted(table, key=lambda r: (-round(r["informative"], 6), abs(r["mean_reward"] - 0.4), r["difficulty"]))[0]


def evaluate_pair(work: Path, base: str, adapter: str, env: str, difficulty: int, seeds: int,
                  max_turns: int | None) -> dict:
    from trace_train.evaluate import compare
    from trace_train.tiny.metadata import model_env_kwargs
    from trace_train.rollouts import run_rollouts

    kwargs = {**model_env_kwargs(base, env), "difficulty": difficulty}
    files = {}
    for name, adp in (("before", None), ("after", adapter)):
        files[name] = work / f"eval_{name}.jsonl"
        run_rollouts(env, agent(base, 0.0, adapter=adp, batch=48), seeds=range(seeds), out=files[name], in_flight=48,
                     env_kwargs=kwargs, agent_name=name, max_steps=max_turns)
    return compare(files["before"], files["after"], ks=(1,), n_boot=2000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/trace-grpo-gain")
    ap.add_argument("--base", help="a warmed-up base to start from instead of bootstrapping one, e.g. "
                    "trace_train/tiny/bases/embedded-default (the shipped base)")
    ap.add_argument("--env", help="train on this env id instead of the calibration table's pick")
    ap.add_argument("--difficulty", type=int, default=None, help="with --env: its difficulty (default 1)")
    ap.add_argument("--bootstrap-minutes", type=float, default=10.0)
    ap.add_argument("--bootstrap-seeds", type=int, default=1000, help="target episodes of the warm-up")
    ap.add_argument("--mix-share", type=float, default=0.05)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--difficulties", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--train-minutes", type=float, default=20.0)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-seeds", type=int, default=200)
    ap.add_argument("--max-turns", type=int, default=None,
                    help="cap on agent turns per episode in every phase after the base (default: the registry's)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    caps = capability_envs()
    t0 = time.perf_counter()
    print(f"[1/4] base: {args.base}" if args.base else
          f"[1/4] base: tiny, bootstrapped on {TARGET} + {args.mix_share:.0%} of each of {caps} (difficulty 1)",
          flush=True)
    base = args.base or make_base(work, args.bootstrap_minutes, args.mix_share, caps, args.bootstrap_seeds)
    print(f"[2/4] calibration of the base ({args.groups} groups x {args.group_size}, temperature 1.0)", flush=True)
    table = calibration_table(work, base, caps, args.difficulties, args.groups, args.group_size, args.max_turns)
    cell = pick(table)
    if args.env:
        chosen = [r for r in table if r["env"] == args.env and r["difficulty"] == (args.difficulty or 1)]
        cell = chosen[0] if chosen else {"env": args.env, "difficulty": args.difficulty or 1, "informative": 0.0,
                                         "mean_reward": 0.0}
    print(f"[3/4] rule: {RULE} -> {cell['env']} difficulty {cell['difficulty']} "
          f"(informative {cell['informative']:.0%}, mean reward {cell['mean_reward']:.3f})", flush=True)
    from trace_train.train.grpo import TrainConfig, read_log, train

    cfg = TrainConfig(env_ids=[cell["env"]], env_kwargs={"difficulty": cell["difficulty"]}, model=base,
                      output_dir=str(work / "train"), max_steps=10_000, max_minutes=args.train_minutes,
                      group_size=args.group_size, groups_per_step=args.groups_per_step, learning_rate=args.lr,
                      temperature=1.0, max_turn_tokens=160, resample_attempts=1,
                      max_tool_calling_iterations=args.max_turns, calibration_groups=0, save_steps=5,
                      resume=True)
    result = train(cfg)
    rows = read_log(result.log_csv)
    print(f"  trained {result.steps} steps, {result.rollouts} rollouts in {result.seconds / 60:.1f} min; "
          f"curve {result.curve_png}", flush=True)
    if rows:
        k = max(1, len(rows) // 4)
        first = sum(r["reward"] for r in rows[:k]) / k
        last = sum(r["reward"] for r in rows[-k:]) / k
        print(f"  training reward: first {k} steps {first:.3f}, last {k} steps {last:.3f}; informative share "
              f"{sum(1 - r['frac_reward_zero_std'] for r in rows) / len(rows):.0%} on average")
    print(f"[4/4] before vs after on seeds 0..{args.eval_seeds - 1} (greedy)", flush=True)
    cmp = evaluate_pair(work, base, str(result.adapter_dir), cell["env"], cell["difficulty"], args.eval_seeds,
                        args.max_turns)
    before = cmp["base"]["overall"]["mean_reward"]
    after = cmp["candidate"]["overall"]["mean_reward"]
    delta = cmp["delta"]["mean_reward"]
    print(f"  before: mean reward {before['value']:.3f} (95% CI {before['ci'][0]:.3f}..{before['ci'][1]:.3f})")
    print(f"  after:  mean reward {after['value']:.3f} (95% CI {after['ci'][0]:.3f}..{after['ci'][1]:.3f})")
    print(f"  gain:   {delta['value']:+.3f} (paired 95% CI {delta['ci'][0]:+.3f}..{delta['ci'][1]:+.3f}); tasks improved "
          f"{cmp['tasks']['improved']}, regressed {cmp['tasks']['regressed']}, same {cmp['tasks']['same']}")
    from trace_train.evaluate import breakdown_summary

    for name in ("before", "after"):
        side = cmp["base" if name == "before" else "candidate"]
        success = side["overall"].get("pass@1") or {}
        shares = breakdown_summary(work / f"eval_{name}.jsonl")
        paid = ", ".join(f"{k} {v:.2f}" for k, v in shares.items() if k not in ("reward",))
        print(f"  {name}: success {success.get('value', float('nan')):.3f}; reward breakdown: {paid}")
        for env_id, d in side.get("decisions", {}).items():
            print(f"  {name}: allowed {d['allowed']['success']:.3f} (n={d['allowed']['n']}), must-refuse "
                  f"{d['must_refuse']['success']:.3f} (n={d['must_refuse']['n']}), balanced accuracy "
                  f"{d['balanced_accuracy']:.3f}")
    significant = delta["ci"][0] > 0
    ratio = after["value"] / before["value"] if before["value"] > 0 else float("inf")
    print(f"ratio after/before: {ratio:.2f}; gain outside the interval: {'yes' if significant else 'no'}; "
          f"total {(time.perf_counter() - t0) / 60:.1f} min (2 shared cores: timings under contention)")
    (work / "summary.json").write_text(json.dumps({"cell": cell, "rule": RULE, "table": table, "train": result.to_dict(),
                                                   "before": before, "after": after, "delta": delta}, indent=1,
                                                  default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
