"""``trace train``: one LoRA adapter per capability, by GRPO on its env (or the SFT baseline).

    trace train --env trace/precondition_verification-v1 --model MODEL_DIR --out runs/train/pv
    trace train --config train.yaml [--env ID ...] [--model M] [--out DIR] [--set FIELD=VALUE ...]
    trace train --env A --env B ... --model M --out DIR     # one adapter on a mixture (multi-capability GRPO)
    trace train --sft --env A --env B ... --model M --out DIR   # SFT of a LoRA on the envs' oracle episodes

Every field of the run is a ``TrainConfig`` field (``trace train --help-config`` lists them with their
help); the flags below are shortcuts for the common ones and ``--set FIELD=VALUE`` reaches any of them
(values are read as JSON when they parse). Flags win over ``--config``. A bad value fails before any
model loads, naming the field and the fix.

Writes under --out: adapter/ (PEFT), checkpoints/, train_log.csv, reward_curve.png, calibration.json,
train_config.yaml, train_result.json. ``--resume`` continues from the latest checkpoint.
"""

from __future__ import annotations

import argparse

from . import CommandError, parse_key_values
from .rollout import REGISTRY_HELP, load_registries


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("train", help="GRPO (or --sft) of one LoRA adapter on capability env(s)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", dest="envs", action="append", default=None, metavar="ID",
                   help="capability env id (repeatable: one adapter on the mixture)")
    p.add_argument("--model", help="base model folder (e.g. from `trace model bootstrap`) or hub id")
    p.add_argument("--out", help="run folder (TrainConfig.output_dir)")
    p.add_argument("--config", metavar="FILE", help="a YAML file of TrainConfig fields")
    p.add_argument("--sft", action="store_true", default=None,
                   help="SFT of a LoRA on the envs' oracle episodes instead of GRPO (the paper's SFT baseline)")
    p.add_argument("--steps", type=int, help="optimiser steps (max_steps)")
    p.add_argument("--group-size", type=int, help="rollouts per group (num_generations)")
    p.add_argument("--groups-per-step", type=int, help="groups (seeds) per step")
    p.add_argument("--lr", type=float, help="learning rate")
    p.add_argument("--temperature", type=float, help="sampling temperature")
    p.add_argument("--difficulty", type=int, help="shortcut for --env-kwarg difficulty=N")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE", help="gym.make kwarg (repeatable)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], help="device preset")
    p.add_argument("--resample", type=int, metavar="N", help="dynamic sampling: re-collect all-equal groups up to N times")
    p.add_argument("--hint-share", type=float, metavar="F", help="hint mode: share of each group with a hint (off-policy)")
    p.add_argument("--calibration-groups", type=int, metavar="N", help="base-model groups before training (0 = skip)")
    p.add_argument("--resume", action="store_true", default=None, help="continue from the latest checkpoint")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=VALUE",
                   help="any TrainConfig field (repeatable), e.g. --set lora_r=8 --set trl_args='{\"top_p\": 0.9}'")
    p.add_argument("--registry", action="append", default=[], metavar="PATH", help=REGISTRY_HELP)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--help-config", action="store_true", help="list every TrainConfig field and exit")
    p.set_defaults(func=cmd_train)


def build_config(args):
    """The ``TrainConfig`` of a ``trace train`` command line (``--config``, then the flags on top)."""
    from trace_train.train.config import ConfigError, TrainConfig

    overrides = parse_key_values(args.sets, "--set")
    env_kwargs = parse_key_values(args.env_kwarg, "--env-kwarg")
    if args.difficulty is not None:
        env_kwargs["difficulty"] = args.difficulty
    flags = {"env_ids": args.envs, "model": args.model, "output_dir": args.out, "sft": args.sft,
             "max_steps": args.steps, "group_size": args.group_size, "groups_per_step": args.groups_per_step,
             "learning_rate": args.lr, "temperature": args.temperature, "device": args.device,
             "resample_attempts": args.resample, "hint_share": args.hint_share,
             "calibration_groups": args.calibration_groups, "resume": args.resume,
             "progress": False if args.no_progress else None}
    overrides.update({k: v for k, v in flags.items() if v is not None})
    if args.registry:
        overrides["registry"] = list(args.registry) + list(overrides.get("registry") or [])
    try:
        if args.config:
            base = TrainConfig.from_yaml(args.config)
            data = base.to_dict()
            if env_kwargs:
                data["env_kwargs"] = {**data["env_kwargs"], **env_kwargs}
            return TrainConfig.from_dict(data, **overrides)
        if env_kwargs:
            overrides["env_kwargs"] = {**(overrides.get("env_kwargs") or {}), **env_kwargs}
        missing = [flag for flag, key in (("--env", "env_ids"), ("--model", "model"), ("--out", "output_dir"))
                   if not overrides.get(key)]
        if missing:
            raise CommandError(f"{', '.join(missing)} required (or a --config file that sets them)")
        return TrainConfig.from_dict({}, **overrides)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    except TypeError as exc:  # a --set value of the wrong shape
        raise CommandError(f"{exc} (check --set)") from exc


def cmd_train(args) -> int:
    if args.help_config:
        from trace_train.train.config import TrainConfig

        print(TrainConfig.help())
        return 0
    load_registries(args.registry)
    cfg = build_config(args)
    from trace_train.train.grpo import train
    from trace_train.train.config import ConfigError

    try:
        result = train(cfg)
    except ConfigError as exc:
        raise CommandError(str(exc)) from exc
    final = result.final or {}
    what = "SFT" if cfg.sft else "GRPO"
    print(f"{what}: {result.steps} steps, {result.rollouts} {'episodes' if cfg.sft else 'rollouts'}, "
          f"{result.seconds:.0f}s" + (f"; last step reward {final['reward']:.3f}" if final.get("reward") is not None
                                      else ""))
    for env_id, report in (result.calibration or {}).items():
        print(f"calibration of the base on {env_id}: mean reward {report['mean_reward']:.3f}, informative groups "
              f"{report['informative']:.0%}" + (f" - {report['warning']}" if report.get("warning") else ""))
    print(f"log: {result.log_csv}")
    if result.curve_png:
        print(f"curve: {result.curve_png}")
    print(result.adapter_dir)
    return 0
