"""The learning and transfer links along GRPO: held-out success at each of one adapter's saved checkpoints.

    python scripts/learning_curve.py runs/headline structured_data_reasoning --seeds 0:100     # L2: its env
    python scripts/learning_curve.py runs/headline structured_data_reasoning --target \
        --env-kwarg 'scenarios=["flight_status"]' --seeds 0:100                               # L3: the target

The report's L2 row compares the base with the *final* adapter on the env's held-out seeds. This plays the base
(step 0) and every saved checkpoint (``train/<capability>/run/checkpoints/checkpoint-N``) on the same held-out
seeds of the capability's generated env, greedy, with the kwargs the run trained with, and writes
``curve.csv`` (step, success, its 95% interval, mean reward, episodes) and ``curve.png``: the GRPO budget of a
recipe is read off this curve instead of guessed. ``--target`` plays the run's target instead (its
``rollout.env_kwargs``, then each ``--env-kwarg``, e.g. only the capability's families): the transfer link
along the same checkpoints, since what raises the env's own success is not always what transfers. Episodes
go to ``<out>/<step>/trajectories.jsonl`` and a rerun plays only what is missing.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from trace_train.train.select import checkpoints as saved_checkpoints
from trace_train.train.select import curve_point, every_nth, step_episodes, write_curve

__all__ = ["checkpoints", "curve_point", "main"]


def checkpoints(run_dir: Path, capability: str) -> list[tuple[int, Path]]:
    """(step, folder) of each saved checkpoint of ``capability``'s GRPO run, by step."""
    folder = run_dir / "train" / capability / "run" / "checkpoints"
    found = saved_checkpoints(folder)
    if not found:
        raise SystemExit(f"learning_curve: no checkpoint under {folder} (did the train stage run for {capability!r}?)")
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="a `trace run` directory whose train stage ran")
    p.add_argument("capability", help="the capability whose adapter's checkpoints to play")
    p.add_argument("--seeds", default="0:100", help="held-out env seeds (default 0:100; training uses 1,000,000+)")
    p.add_argument("--target", action="store_true", help="play the run's target (L3) instead of the capability's env")
    p.add_argument("--env-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="gym.make kwarg (JSON value, else a string), repeatable, e.g. 'scenarios=[\"flight_status\"]'")
    p.add_argument("--every", type=int, default=1, help="play every n-th checkpoint (the last one always)")
    p.add_argument("--workers", type=int, default=2, help="checkpoints played at once, one process each")
    p.add_argument("--in-flight", type=int, default=50)
    p.add_argument("--out", type=Path, help="output folder (default: <run_dir>/eval/curve/<capability>)")
    args = p.parse_args(argv)

    from trace_train.agents import HFAgent
    from trace_train.backends import RolloutJob, run_jobs
    from trace_train.pipeline.config import ConfigError, load_config, parse_key_values, parse_seeds
    from trace_train.pipeline.stages.common import model_env_kwargs_fn, resolve_env_kwargs
    from trace_train.rollouts import read_trajectories
    from trace_envs.core.registry import load_registry

    run_dir = args.run_dir.resolve()
    cfg = load_config(run_dir / "config.yaml")
    stages = json.loads((run_dir / "stages.json").read_text())["stages"]
    model = stages["base"]["summary"]["model_path"]
    registry = run_dir / "workspace" / "registry.yaml"
    # Registered here, not only read: the kwargs a model was warmed up with (its prompt form, say) are found
    # through the env's target, which only the registry knows for a generated env.
    entries = [e for e in load_registry(registry) if e.capability == args.capability]
    if not entries:
        raise SystemExit(f"learning_curve: no generated env for {args.capability!r} in {registry}")
    if args.target:
        env_id = cfg.rollout.targets[0]
        kwargs = model_env_kwargs_fn(model, cfg.rollout.env_kwargs)(env_id)
    else:
        env_id = entries[0].id
        train_kwargs = resolve_env_kwargs((cfg.train.options or {}).get("env_kwargs"),
                                          run_dir / "rollouts" / "trajectories.jsonl")  # lead_in: auto
        kwargs = model_env_kwargs_fn(model, train_kwargs)(env_id)
    try:  # read as `trace rollout --env-kwarg` reads them: JSON, else a string
        kwargs.update(parse_key_values(args.env_kwarg, "--env-kwarg"))
    except ConfigError as exc:
        raise SystemExit(f"learning_curve: {exc}") from None
    seeds = parse_seeds("--seeds", args.seeds)
    out = (args.out or run_dir / "eval" / "curve" / (args.capability + ("-target" if args.target else ""))).resolve()

    points = checkpoints(run_dir, args.capability)
    chosen = every_nth(points, args.every)
    plays = [(0, None)] + [(step, str(path)) for step, path in chosen]
    jobs = [RolloutJob(key=f"step {step}", targets=[env_id], seeds=seeds, samples=1,
                       make=functools.partial(HFAgent, model, adapter=adapter, threads=1,
                                              max_new_tokens=cfg.base.max_new_tokens, temperature=0.0,
                                              seed=cfg.seed, name=f"step-{step}"),
                       out=step_episodes(out, step), in_flight=args.in_flight,
                       env_kwargs={env_id: kwargs}, registries=[str(registry)], retry_env_errors=True,
                       progress=True, agent_name=f"step-{step}")
            for step, adapter in plays]
    print(f"learning_curve: {env_id} {kwargs}, {len(seeds)} seeds x {len(plays)} checkpoints "
          f"(steps {', '.join(str(s) for s, _ in plays)})", flush=True)
    run_jobs(jobs, workers=args.workers)

    wanted = set(seeds)
    rows = [{"step": step, **curve_point([t for t in read_trajectories(job.out) if int(t["seed"]) in wanted])}
            for (step, _), job in zip(plays, jobs)]
    print(f"\n{'step':>5}  {'success [95% CI]':<24} {'mean reward':>11}  episodes")
    for r in rows:
        print(f"{r['step']:>5}  {r['success']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]{'':<4} {r['reward']:>11.3f}  "
              f"{r['episodes']}")
    write_curve(rows, out, f"{args.capability} adapter: held-out success on {env_id} along GRPO")
    print(f"\nlearning_curve: wrote {out / 'curve.csv'} and {out / 'curve.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
