"""``trace eval``: pass@1, pass^k, per-scenario breakdown and bootstrap CIs of trajectory files.

    trace eval runs/candidate.jsonl --out runs/eval
    trace eval runs/candidate.jsonl --base runs/base.jsonl --k 1 2 4 --out runs/eval

With ``--base`` the two files are compared on the (env, seed) tasks both ran, with paired bootstrap
intervals of the difference. Writes JSON, a Markdown table and a PNG chart into ``--out``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import CommandError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="pass@1, pass^k and CIs of trajectories; compare base vs candidate",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trajectories", metavar="FILE", help="trajectory JSONL (the candidate when --base is given)")
    p.add_argument("--base", metavar="FILE", help="the base agent's trajectory JSONL to compare against")
    p.add_argument("--k", type=int, nargs="+", default=[1, 2, 4], help="k values of pass^k (default: 1 2 4)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples (default: 1000; 0 = no CIs)")
    p.add_argument("--level", type=float, default=0.95, help="confidence level (default: 0.95)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    p.add_argument("--out", help="report folder (default: next to FILE)")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args) -> int:
    from trace_train.evaluate import compare, evaluate, write_comparison, write_report

    for f in [args.trajectories] + ([args.base] if args.base else []):
        if not Path(f).exists():
            raise CommandError(f"{f}: no such file")
    if any(k < 1 for k in args.k):
        raise CommandError("--k values must be >= 1")
    if not 0 < args.level < 1:
        raise CommandError("--level must be between 0 and 1")
    out = Path(args.out) if args.out else Path(args.trajectories).with_suffix("")
    if args.base:
        result = compare(args.base, args.trajectories, ks=args.k, n_boot=args.n_boot, level=args.level,
                         seed=args.seed)
        if result["shared_tasks"] == 0:
            raise CommandError("the two files share no (env, seed) task; run both on the same seeds")
        paths = write_comparison(result, out, base_label=Path(args.base).stem,
                                 candidate_label=Path(args.trajectories).stem)
    else:
        result = evaluate(args.trajectories, ks=args.k, n_boot=args.n_boot, level=args.level, seed=args.seed)
        if result["overall"]["tasks"] == 0:
            raise CommandError(f"{args.trajectories} holds no trajectories")
        paths = write_report(result, out)
    print(paths["md"].read_text())
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return 0
