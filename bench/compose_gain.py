"""Headline of stage four: does the token-routed composed model beat every single adapter and both
merges on an even mixture of capability envs, while staying close to each capability's own adapter?

    python bench/compose_gain.py [--work DIR] [--envs ENV ...] [--train-minutes 20] [--eval-seeds 200]

Phases, each cached in ``--work`` (a rerun skips what is done):

1. **Base.** ``--base``, or the tiny preset bootstrapped on the airline target with a low share
   (``--mix-share``) of each capability env's oracle episodes (difficulty 1), as in ``bench/grpo_gain.py``,
   so that it is sometimes right on the capability envs (docs/design.md, "Models").
2. **Adapters.** One GRPO LoRA per env of ``--envs`` with ``trace train`` (``--train-minutes`` each).
3. **Router data.** Each adapter rolled out on its own env at temperature 1.0 (held-out seeds from
   20000); its successful episodes, topped up with ``--oracle-episodes`` oracle episodes per env when the
   adapters rarely succeed, are the router's training data.
4. **Compose** with ``trace compose`` at top-1 (with the baselines: PEFT linear and TIES merges,
   per-episode routing), top-2 and top-4 (when K + 1 >= 4).
5. **Evaluate** every method greedily on seeds 0..N-1 of each env: mean reward with a 95% bootstrap
   interval per env and on the even mixture (all envs' episodes together), and the routing heat map path.

Anchor: the best single adapter on the mixture, measured in the same run; the script prints
composed / anchor. On a shared 2-core CPU an episode of the tiny model costs seconds, so the defaults
(200 seeds per env, 20 training minutes per adapter) take hours. A smoke run of the whole chain,
``--bootstrap-minutes 1 --train-minutes 1 --router-seeds 4 --oracle-episodes 6 --eval-seeds 3 --top-ks 1``,
took 20 min on a loaded 2-core machine; its numbers mean nothing (one GRPO step per adapter).
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
DEFAULT_ENVS = ["trace/precondition_verification-v1", "trace/multi_step_completion-v1",
                "trace/tool_calling_precision-v1"]


def env_kwargs(base: str, env: str, difficulty: int) -> dict:
    from trace_train.tiny.metadata import model_env_kwargs

    return {**model_env_kwargs(base, env), "difficulty": difficulty}


def make_base(work: Path, minutes: float, share: float, envs: list[str]) -> str:
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model

    out = work / "base"
    if (out / "trace_model.json").exists():
        return str(out)
    cfg = BootstrapConfig(target=TARGET, preset="tiny", out=str(out), env_kwargs={"size": {"bundle_prob": 0.0}},
                          train_seeds=1000, pretrain_frac=0.3, steps=1_000_000, max_seconds=minutes * 60,
                          mixture={e: share for e in envs}, mixture_env_kwargs={"difficulty": 1})
    bootstrap_model(cfg)
    return str(out)


def train_adapter(work: Path, base: str, env: str, difficulty: int, minutes: float, lr: float) -> str:
    from trace_train.compose.data import capability_of
    from trace_train.train.grpo import TrainConfig, train

    out = work / "train" / capability_of(env)
    adapter = out / "adapter"
    if (adapter / "trace_adapter.json").exists():
        return str(adapter)
    cfg = TrainConfig(env_ids=[env], env_kwargs={"difficulty": difficulty}, model=base, output_dir=str(out),
                      max_steps=10_000, max_minutes=minutes, group_size=4, groups_per_step=2, learning_rate=lr,
                      temperature=1.0, max_turn_tokens=160, resample_attempts=1, calibration_groups=0, save_steps=5,
                      resume=True)
    return str(train(cfg).adapter_dir)


def router_data(work: Path, base: str, adapters: dict[str, str], difficulty: int, seeds: int,
                oracle_episodes: int) -> Path:
    from trace_envs import rollout
    from trace_envs.agents import OracleAgent
    from trace_train.agents import HFAgent
    from trace_train.rollouts import read_trajectories, run_rollouts

    path = work / "router_data.jsonl"
    if path.exists():
        return path
    tmp = work / "router_data.partial.jsonl"
    for env, adapter in adapters.items():
        agent = HFAgent(base, adapter=adapter, temperature=1.0, max_new_tokens=160, batch_size=32, seed=0)
        run_rollouts(env, agent, seeds=range(20000, 20000 + seeds), samples=2, out=tmp, in_flight=32,
                     env_kwargs=env_kwargs(base, env, difficulty), agent_name=f"adapter:{env}")
    records = [r for r in read_trajectories(tmp) if r.get("success")]
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        for env in adapters:
            mine = sum(r["env_id"] == env for r in records)
            for s in range(max(0, oracle_episodes - mine)):
                f.write(json.dumps(rollout(env, OracleAgent(), seed=30000 + s,
                                           env_kwargs=env_kwargs(base, env, difficulty))) + "\n")
            print(f"  {env}: {mine} successful adapter episodes, {max(0, oracle_episodes - mine)} oracle episodes")
    return path


def mean_ci(values: list[float], n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    import numpy as np

    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    boots = v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1)
    return float(v.mean()), float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="/tmp/trace-compose-gain", help="cache folder of every phase")
    ap.add_argument("--base", help="a base model folder (default: bootstrap the tiny preset)")
    ap.add_argument("--envs", nargs="+", default=DEFAULT_ENVS, help="capability envs, one adapter each")
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--bootstrap-minutes", type=float, default=10.0)
    ap.add_argument("--mix-share", type=float, default=0.05)
    ap.add_argument("--train-minutes", type=float, default=20.0)
    ap.add_argument("--lr", type=float, default=1e-3, help="GRPO learning rate (tiny model)")
    ap.add_argument("--router-seeds", type=int, default=64, help="adapter rollouts per env for router data (x2)")
    ap.add_argument("--oracle-episodes", type=int, default=32, help="top-up of router data per env")
    ap.add_argument("--router-lr", type=float, default=5e-2, help="gate learning rate (tiny model)")
    ap.add_argument("--top-ks", type=int, nargs="+", default=[1, 2, 4], help="top-k settings (those <= K + 1)")
    ap.add_argument("--eval-seeds", type=int, default=200)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    print(f"[1/5] base ({args.base or 'tiny, bootstrapped'})", flush=True)
    base = args.base or make_base(work, args.bootstrap_minutes, args.mix_share, args.envs)
    print(f"[2/5] GRPO adapters, {args.train_minutes} min each: {', '.join(args.envs)}", flush=True)
    adapters = {env: train_adapter(work, base, env, args.difficulty, args.train_minutes, args.lr) for env in args.envs}
    print("[3/5] router data", flush=True)
    data = router_data(work, base, adapters, args.difficulty, args.router_seeds, args.oracle_episodes)

    from trace_train.compose import RouterTrainConfig, compose
    from trace_train.compose.data import capability_of

    named = {capability_of(env): a for env, a in adapters.items()}
    k = len(named)
    top_ks = sorted({1} | {t for t in args.top_ks if 1 <= t <= k + 1})  # top-1 carries the baselines
    print(f"[4/5] compose K={k} at top-k {top_ks}", flush=True)
    results = {}
    for top_k in top_ks:
        out = work / f"compose_top{top_k}"
        if not (out / "methods.json").exists():
            compose(base, named, data, out, top_k=top_k, train=RouterTrainConfig(lr=args.router_lr),
                    baselines=("linear", "ties", "per_episode") if top_k == 1 else ())
        results[top_k] = json.loads((out / "methods.json").read_text())
    methods = {f"composed top-{t}": r["composed"] for t, r in results.items()}
    methods.update({name: m for name, m in results[1].items() if name != "composed"})

    print(f"[5/5] evaluation on seeds 0..{args.eval_seeds - 1} of each env (greedy)", flush=True)
    from trace_train.agents import HFAgent
    from trace_train.rollouts import read_trajectories, run_rollouts

    table = {}
    for name, m in methods.items():
        path = work / "eval" / (name.replace(" ", "_").replace(":", "_") + ".jsonl")
        path.parent.mkdir(exist_ok=True)
        agent = HFAgent(m["model"], adapter=m["adapter"], max_new_tokens=160, batch_size=48)
        run_rollouts(args.envs, agent, seeds=range(args.eval_seeds), out=path, in_flight=48,
                     env_kwargs=lambda env: env_kwargs(base, env, args.difficulty), agent_name=name, progress=False)
        records = read_trajectories(path)
        row = {env: mean_ci([r["reward"] for r in records if r["env_id"] == env]) for env in args.envs}
        row["mixture"] = mean_ci([r["reward"] for r in records])
        table[name] = row
        print(f"  {name}: mixture {row['mixture'][0]:.3f}", flush=True)

    def cell(v):
        return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]"

    cols = [capability_of(e) for e in args.envs] + ["mixture"]
    print("\nmean reward [95% bootstrap CI], greedy, seeds 0.." f"{args.eval_seeds - 1} per env")
    print("| method | " + " | ".join(cols) + " |\n|---|" + "---|" * len(cols))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(cell(row[e]) for e in args.envs + ["mixture"]) + " |")
    singles = {n: r for n, r in table.items() if n.startswith("adapter:")}
    best = max(singles, key=lambda n: singles[n]["mixture"][0])
    anchor = singles[best]["mixture"][0]
    comp = table["composed top-1"]["mixture"][0]
    ratio = comp / anchor if anchor > 0 else float("inf")
    print(f"\ncomposed top-1 / best single adapter ({best}) on the mixture: {ratio:.2f}")
    print(f"routing heat map: {work / 'compose_top1' / 'routing.png'}")
    print(f"total {(time.perf_counter() - t0) / 60:.1f} min (2 shared cores: timings under contention)")
    (work / "summary.json").write_text(json.dumps({"table": table, "anchor": best, "ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
