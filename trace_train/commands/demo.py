"""``trace demo``: the main job on the embedded default (what ``make demo`` runs).

Today the strongest end-to-end path is: the τ²-style target environments,
their reference agents (the oracle and one planted-deficit agent per
capability), rollouts written as trajectory files, and the evaluation table —
per agent and target, and per capability the tasks exercise. It shows the
ground truth that the diagnosis stage (``trace diagnose``) is checked against:
an agent lacking a capability fails exactly the tasks that need it.
As the later stages land, this verb grows into the full TRACE loop.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

from . import CommandError, format_table

DEFAULT_TARGETS = ["trace/tau_airline-v0", "trace/tau_retail-v0"]
DEFAULT_AGENTS = ["oracle", "tau:skip_precondition", "tau:stop_after_first", "tau:wrong_record",
                  "tau:sloppy_arguments"]


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="run the main job on the embedded default",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", nargs="+", default=DEFAULT_TARGETS, help="target env ids")
    p.add_argument("--agents", nargs="+", default=DEFAULT_AGENTS, help="reference agent names")
    p.add_argument("--seeds", type=int, default=100, help="episodes per (agent, target)")
    p.add_argument("--out", default="runs/demo", help="run directory for trajectories and the summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import trace_envs
    from trace_envs import make_agent, rollout

    known = {e.id for e in trace_envs.registered()}
    missing = [t for t in args.targets if t not in known]
    if missing:
        raise CommandError(f"unknown target env(s) {missing}; see `trace envs list`")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "trajectories.jsonl"
    try:
        from tqdm import tqdm
    except ImportError:  # the suite-only install has no tqdm
        def tqdm(it, **_):  # type: ignore[no-redef]
            return it

    success: dict[tuple[str, str], list[float]] = defaultdict(list)
    by_need: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    t0 = time.perf_counter()
    episodes = 0
    with path.open("w", encoding="utf-8") as f:
        for target in args.targets:
            env = gym.make(target)
            for name in args.agents:
                agent = make_agent(name)
                for seed in tqdm(range(args.seeds), desc=f"{target} · {name}", leave=False):
                    record = rollout(env, agent, seed)
                    f.write(json.dumps(record, ensure_ascii=False) + "\n")
                    episodes += 1
                    success[(target, name)].append(record["reward"])
                    for need in _needs(record) or ["(none)"]:
                        by_need[(target, name, need)].append(record["reward"])
            env.close()
    elapsed = time.perf_counter() - t0

    short = {t: t.split("/")[-1] for t in args.targets}
    print(f"\nMean reward over {args.seeds} seeds (agent × target):\n")
    print(format_table(["agent"] + [short[t] for t in args.targets],
                       [[a] + [f"{_mean(success[(t, a)]):.2f}" for t in args.targets] for a in args.agents]))
    needs = sorted({k[2] for k in by_need})
    for target in args.targets:
        print(f"\n{short[target]}: mean reward on the tasks that need each capability (n tasks):\n")
        rows = []
        for a in args.agents:
            rows.append([a] + [_cell(by_need.get((target, a, n))) for n in needs])
        print(format_table(["agent"] + needs, rows))
    summary = {"episodes": episodes, "seconds": elapsed,
               "mean_reward": {f"{t}|{a}": _mean(v) for (t, a), v in success.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{episodes} episodes in {elapsed:.1f} s ({episodes / max(elapsed, 1e-9):.0f}/s); "
          f"trajectories: {path}")
    return 0


def _needs(record: dict) -> list[str]:
    return list((record.get("task") or {}).get("needs") or [])


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _cell(values: list[float] | None) -> str:
    return f"{_mean(values):.2f} ({len(values)})" if values else "-"
