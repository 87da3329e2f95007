"""Calibration matrix: mean reward of each planted-deficit agent on each τ² capability env, per difficulty.

    python bench/calibration_matrix.py [--seeds 40] [--difficulties 1,2,3,4,5] [--json out.json]

For every registered capability env whose target is a τ² domain, and every difficulty, it runs
the oracle, the four planted-deficit agents (``tau:skip_precondition``, ``tau:stop_after_first``,
``tau:wrong_record``, ``tau:sloppy_arguments``) and the stochastic ``tau:noisy`` on the same seeds,
prints the agents × envs matrix of mean rewards, and checks isolation: the agent lacking the
env's capability scores low (≤ --low, default 0.5) and the oracle and the agents lacking other
capabilities score high (≥ --high, default 0.75). It prints PASS/FAIL per env and difficulty and
exits 1 if any check fails. The anchor is the oracle (1.0 by construction): each row is a ratio
against it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import trace_envs
from trace_envs.calibration import DEFICIT_AGENTS, HIGH, LOW, deficit_rewards, isolation_problems

AGENTS = ["oracle", *DEFICIT_AGENTS, "tau:noisy"]


def capability_envs() -> list:
    return [e for e in trace_envs.registered()
            if e.kind == "capability" and (e.target or "").startswith("tau") and not e.requires]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=40, help="episodes per (env, difficulty, agent) (default 40)")
    p.add_argument("--difficulties", default="1,2,3,4,5")
    p.add_argument("--low", type=float, default=LOW, help=f"most the lacking agent may score (default {LOW})")
    p.add_argument("--high", type=float, default=HIGH, help=f"least the other agents must score (default {HIGH})")
    p.add_argument("--json", help="save the matrix as JSON")
    args = p.parse_args(argv)
    difficulties = [int(x) for x in args.difficulties.split(",")]
    envs = capability_envs()
    if not envs:
        print("no τ² capability env is registered")
        return 1
    seeds = range(args.seeds)
    results: dict = {}
    failures = 0
    t0 = time.perf_counter()
    for d in difficulties:
        print(f"\n== difficulty {d} ({args.seeds} seeds) ==")
        names = [e.id.split("/")[-1].removesuffix("-v0") for e in envs]
        width = max(len(a) for a in AGENTS)
        print(" " * width + "  " + "  ".join(f"{n[:24]:>24}" for n in names))
        table = {e.id: deficit_rewards(e.id, seeds, difficulty=d, agents=AGENTS) for e in envs}
        for a in AGENTS:
            print(a.ljust(width) + "  " + "  ".join(f"{table[e.id][a]:>24.3f}" for e in envs))
        for e in envs:
            problems = isolation_problems(e.capability, table[e.id], args.low, args.high)
            ok = not problems
            failures += not ok
            print(f"{'PASS' if ok else 'FAIL'}  {e.id} (difficulty {d})" + ("" if ok else ": " + "; ".join(problems)))
        results[d] = table
    print(f"\n{len(envs) * len(difficulties) * len(AGENTS) * args.seeds} episodes in "
          f"{time.perf_counter() - t0:.1f} s; {failures} failing (env, difficulty) pairs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({str(d): t for d, t in results.items()}, f, indent=2)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
