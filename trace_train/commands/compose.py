"""``trace compose``: one token-routed model over the capability adapters (stage four of TRACE).

    trace compose --base MODEL --adapters runs/x/train/*/adapter --data runs/x/compose/episodes.jsonl \\
        --out runs/x/compose
    trace compose --base MODEL --adapters precondition_verification=A1 tool_calling_precision=A2 \\
        --data TRAJ.jsonl --out OUT --top-k 2 --epochs 3 --baselines linear ties
    trace compose ... --composers per_task arrow --task-choice nearest --arrow-top-k 1   # routers of the field

Builds the composed model (one gate per block over base + K adapters, top-1 multiplicative routing),
trains only the gates on the successful episodes of --data (next-token loss through p_top, Switch
load balancing, label loss toward the adapter of each episode's env), writes it with its routing
statistics (routing.csv, routing.png), and the baselines: PEFT's linear and TIES merges and per-episode
routing; with --composers, the TRACE authors' per-task routing (one adapter per task chosen by the base),
PEFT's Arrow (per-token routing by the adapters' singular vectors, no training) and the MoE at top-2/top-4.
``OUT/methods.json`` lists how to run each one (``trace rollout --agent hf --model ...``).
An adapter's name (its folder, or the parent of a folder called ``adapter``; or NAME=DIR) labels the
episodes of the env with that capability; --adapter-env NAME=ENV_ID adds others.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import CommandError, format_table


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compose", help="token-level top-1 mixture of the capability LoRA adapters",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, metavar="MODEL", help="base model folder the adapters were trained on")
    p.add_argument("--adapters", required=True, nargs="+", metavar="DIR", help="PEFT LoRA adapter folders (or NAME=DIR)")
    p.add_argument("--data", nargs="+", metavar="TRAJECTORIES",
                   help="trajectory JSONL files or folders (without: fresh gates, i.e. the base model)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder")
    p.add_argument("--top-k", type=int, default=1, help="slots per token (default: 1; 2 or 4 for the ablation)")
    p.add_argument("--gate-input", choices=("token", "context", "request"), default="token",
                   help="what each gate reads: the block input at the token (default, the paper's gate), that "
                        "and the causal mean of the block inputs so far (context; for shallow models), or that mean "
                        "restarted at each user request (request; so a conversation's second request can switch)")
    p.add_argument("--gate-weight", choices=("prob", "one"), default="prob",
                   help="forward weight of a chosen slot's update: its gate probability (default, the paper's "
                        "gating) or one (top-1 adds the adapter's whole update; straight-through gradient)")
    p.add_argument("--routing", choices=("token", "segment"), default="token",
                   help="how the gates' choices apply: per token (default, the paper's) or per chat message (the "
                        "choice at each message's first token held to its end)")
    p.add_argument("--epochs", type=int, default=3, help="router training epochs (default: 3)")
    p.add_argument("--lr", type=float, default=5e-4, help="gate learning rate (default: 5e-4)")
    p.add_argument("--load-balance-coef", type=float, default=0.001, help="Switch balancing weight (default: 0.001)")
    p.add_argument("--label-coef", type=float, default=0.5, help="label loss weight (default: 0.5; 0 = off)")
    p.add_argument("--accumulate", type=int, default=4, help="episodes per optimizer step (default: 4)")
    p.add_argument("--prefit-steps", type=int, default=0,
                   help="full-batch steps fitting the gates to the labels before the joint training "
                        "(default: 0 = none; 300 on the tiny CPU models, see docs/compose.md)")
    p.add_argument("--adapter-env", action="append", default=[], metavar="NAME=ENV_ID",
                   help="label ENV_ID's episodes with adapter NAME (repeatable)")
    p.add_argument("--base-env", action="append", default=[], metavar="ENV_ID",
                   help="label this env's episodes with the base slot (repeatable): tasks the base should answer")
    p.add_argument("--keep-zero-updates", action="store_true",
                   help="keep adapters whose LoRA update is exactly zero (default: left out, they are the base slot)")
    p.add_argument("--baselines", nargs="*", default=["linear", "ties", "per_episode"],
                   help="baselines to build (default: linear ties per_episode; none: pass the flag alone)")
    p.add_argument("--composers", nargs="*", default=[], choices=("per_task", "arrow", "top2", "top4"),
                   help="routers to build beside the MoE: per_task (the TRACE authors' routing: one adapter per task, "
                        "chosen by the base), arrow (PEFT's Arrow), top2 / top4 (the MoE's gates at top-2 / top-4); "
                        "default: none")
    p.add_argument("--task-choice", choices=("nearest", "zero_shot"), default="nearest",
                   help="per_task: choose by the nearest successful trajectories of --data (default) or by the "
                        "base's zero-shot answer")
    p.add_argument("--task-neighbours", type=int, default=5,
                   help="per_task nearest: trajectories that vote (default 5)")
    p.add_argument("--task-description", action="append", default=[], metavar="NAME=TEXT",
                   help="per_task zero_shot: the option text of adapter NAME (default: its name as words; repeatable)")
    p.add_argument("--arrow-top-k", type=int, default=3, help="arrow: adapters mixed per token (default: 3, at most K)")
    p.add_argument("--arrow-temperature", type=float, default=1.0, help="arrow: router temperature (default: 1.0)")
    p.add_argument("--min-reward", type=float, help="successful = reward >= this (default: the success flag)")
    p.add_argument("--max-length", type=int, default=4096, help="tokens per episode at most (default: 4096)")
    p.add_argument("--stats-episodes", type=int, default=64, help="episodes per env for routing stats (default: 64)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1; 0 = leave alone)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_compose)


def cmd_compose(args) -> int:
    from trace_train.compose import ComposeError, RouterTrainConfig, compose

    if not Path(args.base).is_dir():
        raise CommandError(f"--base {args.base}: no such model folder")
    adapter_envs: dict[str, list[str]] = {}
    for pair in args.adapter_env:
        if "=" not in pair:
            raise CommandError(f"--adapter-env {pair!r} must look like NAME=ENV_ID")
        name, env = pair.split("=", 1)
        adapter_envs.setdefault(name, []).append(env)
    descriptions: dict[str, str] = {}
    for pair in args.task_description:
        if "=" not in pair:
            raise CommandError(f"--task-description {pair!r} must look like NAME=TEXT")
        name, text = pair.split("=", 1)
        descriptions[name] = text
    try:
        cfg = RouterTrainConfig(epochs=args.epochs, lr=args.lr, load_balance_coef=args.load_balance_coef,
                                label_coef=args.label_coef, accumulate=args.accumulate,
                                prefit_steps=args.prefit_steps)
        result = compose(args.base, args.adapters, args.data, args.out, top_k=args.top_k, train=cfg,
                         adapter_envs=adapter_envs or None, baselines=args.baselines, min_reward=args.min_reward,
                         max_length=args.max_length, stats_episodes=args.stats_episodes,
                         gate_input=args.gate_input, gate_weight=args.gate_weight, routing=args.routing,
                         threads=args.threads or None,
                         device=args.device,
                         base_envs=args.base_env, drop_zero_updates=not args.keep_zero_updates,
                         composers=args.composers, task_choice=args.task_choice,
                         task_neighbours=args.task_neighbours, task_descriptions=descriptions or None,
                         arrow_top_k=args.arrow_top_k, arrow_temperature=args.arrow_temperature,
                         progress=not args.no_progress)
    except ComposeError as exc:
        raise CommandError(str(exc)) from exc
    for name in result.dropped:
        print(f"left out {name}: {result.dropped_why[name]}; the router's base slot takes its envs")
    if not args.data:
        print("no --data: the gates are untrained (every token goes to the base slot)")
    else:
        print(f"router trained on {result.episodes} successful episodes; labels: "
              + (", ".join(f"{e} -> {a}" for e, a in result.labelled_envs.items()) or "none"))
    if result.routing_csv is not None:
        import csv

        with open(result.routing_csv) as f:
            rows = [r for r in csv.DictReader(f) if r["role"] == "all"]
        if rows:
            slots = [k for k in rows[0] if k not in ("env_id", "role", "tokens")]
            print("\nshare of tokens per slot (all roles, all blocks):")
            print(format_table(["env", "tokens", *slots], [[r["env_id"], r["tokens"], *(r[s] for s in slots)]
                                                           for r in rows]))
    written = [result.out_dir, result.routing_csv, result.heatmap_png, result.loss_png, result.methods_json,
               *result.baselines.values()]
    print("\nwritten: " + ", ".join(str(p) for p in written if p is not None))
    return 0
