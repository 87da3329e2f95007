"""``trace model``: the tiny offline model — build it, then warm it up on a target's oracle.

    trace model build [--preset tiny] [--out DIR] [--envs ID ...]
    trace model bootstrap --target trace/tau_airline-v0 [--exclude-scenarios S ...] [--steps 300]
                          [--env-kwarg KEY=VALUE ...] [--mix ENV=SHARE ...] [--mix-env-kwarg KEY=VALUE ...]
    trace model bootstrap --recipe trace_train/tiny/bases/embedded-default/recipe.json --out DIR

``build`` trains a tokenizer on the environments' own text, gives it TRL's Qwen3 chat template and
saves a Qwen3 model, random-init but for the ``tiny`` preset's hand-set copy circuit (cached by preset
and content). ``bootstrap`` is the SFT warm-up on
oracle trajectories; leaving scenario families out gives a base model with known gaps. It writes the
model, ``loss.json`` and ``loss_curve.png``. ``--recipe`` replays a shipped base's recipe (every
warm-up setting; bit for bit only on the CPU type it was built on). ``--mix`` adds a low share of other envs' oracle episodes
(a warm-up mixture): a base for GRPO on a capability env must be sometimes right there.
"""

from __future__ import annotations

import argparse

from . import CommandError, parse_key_values
from .rollout import REGISTRY_HELP, check_env_ids, load_registries


def register(subparsers: argparse._SubParsersAction) -> None:
    model = subparsers.add_parser("model", help="build and bootstrap the tiny offline model",
                                  description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model.set_defaults(func=None, _parser=model)
    verbs = model.add_subparsers(title="subcommands", dest="model_command", metavar="<subcommand>")

    p = verbs.add_parser("build", help="build the random-init tiny Qwen3 model and its tokenizer",
                         description="Build (or fetch from the cache) a tiny Qwen3 model, offline.")
    p.add_argument("--preset", default="tiny", help="nano, tiny, tiny-keys or small (default: tiny)")
    p.add_argument("--out", help="output folder (default: the cache, keyed by preset and content)")
    p.add_argument("--envs", nargs="+", metavar="ID",
                   help="envs whose text trains the tokenizer (default: every registered env without requirements)")
    p.add_argument("--corpus-seeds", type=int, default=8, help="oracle episodes per env for the corpus")
    p.add_argument("--seed", type=int, default=0, help="initialisation seed")
    p.add_argument("--force", action="store_true", help="rebuild even if cached")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=REGISTRY_HELP)
    p.set_defaults(func=cmd_build)

    p = verbs.add_parser("bootstrap", help="SFT warm-up on a target env's oracle trajectories",
                         description="SFT warm-up of the tiny model on oracle trajectories of --target.")
    p.add_argument("--target", metavar="ID", help="the env whose oracle is imitated (required without --recipe)")
    p.add_argument("--recipe", metavar="FILE",
                   help="a shipped base's recipe.json (trace_train/tiny/bases/*/recipe.json): every warm-up setting "
                        "from it; only --out and --no-progress still apply")
    p.add_argument("--base", help="model folder to start from (default: build --preset)")
    p.add_argument("--preset", default="tiny", help="size preset when --base is not given (default: tiny)")
    p.add_argument("--exclude-scenarios", nargs="*", default=[], metavar="S",
                   help="scenario families (task_spec()['scenario']) left out of the warm-up")
    p.add_argument("--scenario-share", action="append", default=[], metavar="FAMILY=SHARE",
                   help="keep only SHARE (0-1] of a family's episodes (repeatable), e.g. cancel=0.1: a family "
                        "under-represented in the warm-up rather than absent")
    p.add_argument("--steps", type=int, default=None,
                   help="optimiser steps (default: 300; with --minutes, a cap on the steps)")
    p.add_argument("--minutes", type=float, default=None, metavar="M",
                   help="train for M minutes of optimisation instead of a step count (a time budget: the LR "
                        "schedule and --pretrain-frac follow the share of it spent)")
    p.add_argument("--batch-size", type=int, default=8, help="trajectories per step (default: 8)")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (default: 3e-3)")
    p.add_argument("--pretrain-frac", type=float, default=0.0, metavar="F",
                   help="curriculum: the first F of the steps are LM pre-training on the conversations alone "
                        "(every token, no system prompt; cheaper steps), the rest SFT (default: 0)")
    p.add_argument("--freeze-circuit", choices=["all", "positional", "none"], default="positional",
                   help="for a base with a copy circuit (the tiny preset): which of it stays as built during "
                        "the warm-up (default: positional)")
    p.add_argument("--train-seeds", type=int, default=400, help="oracle episodes collected (default: 400)")
    p.add_argument("--seed-offset", type=int, default=100_000,
                   help="first training seed; evaluation seeds below it are held out (default: 100000)")
    p.add_argument("--max-length", type=int, default=4096, help="longest training sequence in tokens (default: 4096)")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="gym.make kwarg of the target (repeatable), e.g. scenarios='[\"flight_status\",\"info\"]' "
                        "or size='{\"bundle_prob\": 0}'")
    p.add_argument("--mix", action="append", default=[], metavar="ENV=SHARE",
                   help="warm-up mixture (repeatable): add SHARE x --train-seeds oracle episodes of ENV, e.g. "
                        "--mix trace/precondition_verification-v1=0.05, so that the base is sometimes right on it "
                        "(GRPO needs groups that are not all 0)")
    p.add_argument("--mix-env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="gym.make kwarg of the --mix envs (repeatable), e.g. difficulty=1")
    p.add_argument("--prompt", choices=["compact", "full"], default="compact",
                   help="the target's prompt size, for envs with a prompt switch (default: compact)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--out", help="output folder (default: in the cache)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=REGISTRY_HELP)
    p.set_defaults(func=cmd_bootstrap)


def cmd_build(args) -> int:
    trace_envs = load_registries(args.registry)
    from trace_train.tiny.build import PRESETS, build_model
    from trace_train.tiny.metadata import model_metadata

    if args.preset not in PRESETS:
        raise CommandError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    if args.envs:
        check_env_ids(trace_envs, args.envs)
    result = build_model(args.preset, out=args.out, env_ids=args.envs, corpus_seeds=args.corpus_seeds,
                         seed=args.seed, force=args.force)
    state = "cached" if result.cached else "built"
    print(f"{state} {result.preset} model: {result.parameters:,} parameters, vocabulary {result.vocab_size}, "
          f"{result.seconds:.1f}s")
    copy = model_metadata(result.path).get("copy_accuracy_repeated_random")
    if copy is not None:
        print(f"copy circuit: continues repeated random text with {copy:.0%} accuracy before any training")
    print(result.path)
    return 0


def _shares(items: list[str], flag: str, shape: str, example: str) -> dict[str, float]:
    """``NAME=SHARE`` arguments of a repeatable flag, as a mapping; a malformed one is a clear error."""
    shares = {}
    for item in items:
        name, sep, share = item.rpartition("=")
        try:
            shares[name] = float(share)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise CommandError(f"{flag} {item!r} must look like {shape}, e.g. {example}")
    return shares


def _from_recipe(args):
    import json
    from pathlib import Path

    from trace_train.tiny.bootstrap import BootstrapConfig

    try:
        recipe = json.loads(Path(args.recipe).read_text())
        fields = dict(recipe["bootstrap"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CommandError(f"--recipe {args.recipe}: not a shipped base's recipe.json ({exc})") from exc
    for key in ("exclude_scenarios",):
        if key in fields:
            fields[key] = tuple(fields[key])
    try:
        return BootstrapConfig(**{**fields, "out": args.out})
    except (TypeError, ValueError) as exc:
        raise CommandError(f"--recipe {args.recipe}: {exc}") from exc


def cmd_bootstrap(args) -> int:
    trace_envs = load_registries(args.registry)
    if args.recipe:
        from trace_train.tiny.bootstrap import bootstrap_model

        cfg = _from_recipe(args)
        check_env_ids(trace_envs, [cfg.target])
        result = bootstrap_model(cfg, progress=not args.no_progress)
        print(f"trained {len(result.losses)} steps in {result.seconds:.0f}s; loss {result.losses[0]:.3f} -> "
              f"{result.losses[-1]:.3f}")
        print(result.path)
        return 0
    if not args.target:
        raise CommandError("give --target ID (the env whose oracle is imitated) or --recipe FILE")
    check_env_ids(trace_envs, [args.target])
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.build import PRESETS

    mixture = _shares(args.mix, "--mix", "ENV=SHARE", "trace/precondition_verification-v1=0.05")
    check_env_ids(trace_envs, list(mixture))
    scenario_shares = _shares(args.scenario_share, "--scenario-share", "FAMILY=SHARE", "cancel=0.1")

    if args.preset not in PRESETS:
        raise CommandError(f"unknown preset {args.preset!r}; choose one of {', '.join(PRESETS)}")
    try:
        cfg = BootstrapConfig(target=args.target, base=args.base, preset=args.preset,
                              exclude_scenarios=tuple(args.exclude_scenarios), scenario_shares=scenario_shares,
                              steps=args.steps if args.steps is not None else
                              (1_000_000 if args.minutes is not None else 300),
                              max_seconds=args.minutes * 60 if args.minutes is not None else None,
                              batch_size=args.batch_size, lr=args.lr, train_seeds=args.train_seeds,
                              seed_offset=args.seed_offset, max_length=args.max_length,
                              prompt=args.prompt, threads=args.threads, out=args.out,
                              pretrain_frac=args.pretrain_frac, freeze_circuit=args.freeze_circuit,
                              env_kwargs=parse_key_values(args.env_kwarg, "--env-kwarg"), mixture=mixture,
                              mixture_env_kwargs=parse_key_values(args.mix_env_kwarg, "--mix-env-kwarg"))
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    try:
        result = bootstrap_model(cfg, progress=not args.no_progress)
    except RuntimeError as exc:
        if "no oracle trajectories" in str(exc):
            raise CommandError(str(exc)) from exc
        raise
    except TypeError as exc:  # a bad --env-kwarg reaches the env constructor
        raise CommandError(f"{exc} (check --env-kwarg)") from exc
    kept = {s: c for s, c in result.scenario_counts.items()}
    print(f"trained {len(result.losses)} steps on {result.examples} episodes ({result.turns} assistant turns) "
          f"in {result.seconds:.0f}s; loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}")
    print(f"scenarios: {kept}")
    print(f"loss curve: {result.path / 'loss_curve.png'}")
    print(result.path)
    return 0
