"""``trace run``: the whole TRACE loop — rollout → diagnose → generate → train → compose → evaluate — and its report.

    trace run                                   # the embedded default: CPU, the tiny model, τ² airline
    trace run examples/configs/gpu_qwen3.yaml   # a config (YAML, one section per stage)
    trace run CONFIG --dry-run                  # the plan, with a time estimate per stage
    trace run CONFIG --from train               # re-run train and everything after it
    trace run CONFIG --until diagnose           # stop after the diagnosis
    trace run CONFIG --out runs/other           # another run directory
    trace run CONFIG --set seed=1 --set evaluate.seeds=200:400   # one field changed, the file untouched
    trace run CONFIG --ray auto                 # every rollout on the actors of this machine's Ray cluster

Everything goes into one run directory (``stages.json``, one folder per stage, ``report.md`` and a
self-contained ``report.html``). Running the same command again after an interruption resumes: finished
stages whose inputs did not change are skipped, and the interrupted stage continues where it can.
The config schema is documented in :mod:`trace_train.pipeline.config` and ``examples/configs/README.md``.
"""

from __future__ import annotations

import argparse

from . import CommandError
from .rollout import add_ray_arguments, ray_address


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("run", help="the whole TRACE loop in one run directory, with a report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="?", help="a run config (YAML); default: the embedded CPU default")
    p.add_argument("--out", help="the run directory (overrides the config's `out`)")
    p.add_argument("--from", dest="from_stage", metavar="STAGE",
                   help="re-run this stage and every later one (base, rollout, diagnose, generate, train, compose, "
                        "evaluate)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="set one config field (dotted key, YAML value), e.g. --set train.options.seed=1; "
                        "repeatable, applied in order before the config is checked")
    p.add_argument("--until", metavar="STAGE", help="stop after this stage (the report is still written)")
    p.add_argument("--dry-run", action="store_true", help="print the plan with a time estimate per stage, run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_ray_arguments(p)
    p.set_defaults(func=cmd_run)


def load_run_config(path: str | None, out: str | None, settings: list[str] | None = None):
    from trace_train.pipeline.config import ConfigError, embedded_default, load_config

    settings = list(settings or [])
    try:
        return load_config(path, settings, out=out) if path else embedded_default(settings, out=out)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc


def cmd_run(args) -> int:
    from trace_train.pipeline import Pipeline, PipelineError, format_plan
    from trace_train.pipeline.config import ConfigError

    cfg = load_run_config(args.config, args.out, args.settings)
    if args.ray is not None:  # every rollout of the run on Ray actors; the stages' fingerprints do not change
        cfg.rollout.engine = "ray"
        if args.ray:
            cfg.ray.address = ray_address(args.ray)
        try:
            cfg.validate()
        except ConfigError as exc:
            raise CommandError(str(exc)) from exc
    if cfg.rollout.engine == "ray" and not args.dry_run:  # no cluster there: fail now, before any stage runs
        try:
            from trace_train.backends.ray_backend import RayBackendError, connect
        except ImportError as exc:
            raise CommandError(f"rollout.engine: ray needs Ray: pip install 'trace-rl[ray]' ({exc})") from None
        try:
            connect(cfg.ray.address)
        except RayBackendError as exc:
            raise CommandError(str(exc)) from exc
    pipeline = Pipeline(cfg, progress=not args.no_progress)
    try:
        plan = pipeline.plan(args.from_stage)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    source = args.config or "the embedded default (CPU, tiny model, τ² airline target)"
    print(f"trace run: {source} -> {cfg.out}\n")
    print(format_plan(plan) + "\n", flush=True)
    if args.dry_run:
        return 0
    try:
        result = pipeline.run(from_stage=args.from_stage, stop_after=args.until)
    except (ConfigError, PipelineError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"\ntrace run: finished in {result.seconds / 60:.1f} min "
          f"(ran: {', '.join(result.ran) or 'nothing'}; skipped: {', '.join(result.skipped) or 'nothing'})")
    if result.report_md:
        print(f"report: {result.report_md}  {result.report_html}")
    return 0
