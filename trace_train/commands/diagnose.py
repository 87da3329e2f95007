"""``trace diagnose``: name the capabilities an agent lacks from its rollouts.

    trace diagnose runs/base                                  # offline labeler (built-in capabilities)
    trace diagnose runs/base/trajectories.jsonl --out runs/base/analysis
    trace diagnose runs/base --llm http://127.0.0.1:8000/v1 --model Qwen/Qwen3-8B --runs 10

Writes ``capabilities.json`` (docs/design.md, "The method's settings"), ``report.md``, ``capabilities.png`` and
``specs/<capability>.json`` (one per retained capability, for ``trace generate``). With ``--llm`` the
LLM analysis agent induces the dictionary and labels the trajectories R times; the offline labeler
then cross-checks its labels (agreement per capability in the report).
"""

from __future__ import annotations

import argparse

from . import CommandError, format_table


def register(subparsers) -> None:
    p = subparsers.add_parser("diagnose", help="contrastive capability analysis of an agent's rollouts",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", metavar="RUN_DIR|TRAJECTORIES.jsonl", help="a run directory or a trajectory file")
    p.add_argument("--out", help="output folder (default: the run directory / the file's folder)")
    p.add_argument("--llm", metavar="URL", help="OpenAI-compatible base URL of the analysis model")
    p.add_argument("--model", help="the analysis model's name (with --llm)")
    p.add_argument("--api-key", default="EMPTY", help="API key for --llm (default: EMPTY)")
    p.add_argument("--runs", type=int, default=None, help="labelling runs R (default: 10 with --llm, 1 offline)")
    p.add_argument("--batch-size", type=int, default=8, help="trajectories per labelling request")
    p.add_argument("--max-attempts", type=int, default=3, help="requests per batch before labels are missing")
    p.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the labelling runs")
    p.add_argument("--max-tokens", type=int, default=2048, help="reply token budget per request")
    p.add_argument("--max-trajectory-chars", type=int, default=3000, help="condensed transcript length")
    p.add_argument("--dictionary", choices=["induce", "builtin"], default="induce",
                   help="with --llm: induce the dictionary (phase 1) or label the built-in capabilities")
    p.add_argument("--structured-output", choices=["auto", "json_schema", "none"], default="auto",
                   help="send the JSON schema as response_format (auto: drop it if the server refuses)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per LLM request")
    p.add_argument("--seed", type=int, default=0, help="seed of the runs' orders and of the bootstrap")
    p.add_argument("--min-delta", type=float, default=0.20, help="retention: minimum Δ = ER⁻ − ER⁺")
    p.add_argument("--min-coverage", type=float, default=0.10, help="retention: minimum LF / #failed")
    p.add_argument("--min-runs-fraction", type=float, default=0.8, help="retention: share of runs that must pass")
    p.add_argument("--min-runs", type=int, default=None, help="retention: runs that must pass (overrides the fraction)")
    p.add_argument("--min-lacking-failures", type=int, default=3, metavar="K",
                   help="retention: minimum evidence, at least K failed trajectories labelled LACKING (1: off)")
    p.add_argument("--explain-away", action="store_true",
                   help="retain one capability at a time, scoring the next on the failures the retained ones do "
                        "not explain (finds deficits that dilute each other; default: the paper's rule)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the intervals (0: none)")
    p.add_argument("--no-figure", action="store_true", help="do not draw capabilities.png")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from trace_train.analysis import AnalysisError, LLMConfig, Thresholds, diagnose

    if (args.llm is None) != (args.model is None):
        raise CommandError("--llm URL and --model NAME go together")
    try:
        th = Thresholds(min_delta=args.min_delta, min_coverage=args.min_coverage,
                        min_runs_fraction=args.min_runs_fraction, min_runs_passed=args.min_runs,
                        min_lacking_failures=args.min_lacking_failures, explain_away=args.explain_away,
                        bootstrap=args.bootstrap, seed=args.seed)
        llm = None
        if args.llm:
            llm = LLMConfig(base_url=args.llm, model=args.model, api_key=args.api_key, runs=args.runs or 10,
                            batch_size=args.batch_size, max_attempts=args.max_attempts,
                            temperature=args.temperature, max_tokens=args.max_tokens,
                            max_trajectory_chars=args.max_trajectory_chars,
                            structured_output=args.structured_output, seed=args.seed, timeout=args.timeout)
        elif args.runs is not None and args.runs < 1:
            raise ValueError("--runs must be >= 1")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    progress = None
    if llm is not None:
        try:
            from tqdm import tqdm
            bar = tqdm(desc="labelling", unit="batch")

            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(1)
        except ImportError:
            pass
    try:
        result = diagnose(args.source, args.out, llm=llm, thresholds=th, dictionary=args.dictionary,
                          offline_runs=args.runs or 1, figure=not args.no_figure, progress=progress)
    except AnalysisError as exc:
        raise CommandError(str(exc)) from None
    k = th.min_lacking_failures
    rows = [[s.name, "yes" if s.retained else "no", _f(s.mean_delta), _f(s.mean_coverage), _f(s.mean_er_minus),
             _f(s.mean_er_plus), f"{min(r.LF for r in s.runs)}" + ("" if min(r.LF for r in s.runs) >= k else " <"),
             f"{s.runs_passed}/{len(s.runs)}"] + ([str(s.round)] if th.explain_away else [])
            for s in result.scores]
    print(format_table(["capability", "retained", "delta", "coverage", "ER-", "ER+", f"LF (min {k})", "runs"]
                       + (["round"] if th.explain_away else []), rows))
    print(f"\nretained: {', '.join(result.retained) or 'none'}"
          + (" (explain-away)" if th.explain_away else ""))
    un = result.data.get("unattributed") or {}
    if un.get("failed"):
        print(f"unattributed failures: {un['count']} of {un['failed']} ({un['share']:.0%}); "
              f"{un['no_lacking_label']} with no LACKING label at all"
              + (f"; e.g. {', '.join(e['trajectory'] for e in un['examples'][:3])}" if un["examples"] else ""))
    print(f"wrote {result.capabilities_json}, {result.report}"
          + (f", {result.figure}" if result.figure else "") + f" and {len(result.specs)} spec(s) in "
          f"{result.out / 'specs'}")
    return 0


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"
