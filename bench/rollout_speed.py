"""Rollout throughput of the tiny HFAgent at 1, 8 and 32 episodes in flight.

Anchor: one episode at a time (in flight = 1), measured in the same run on the same episodes.
Batched generation must beat it by a wide margin; the script prints episodes per second for each
setting and the ratio against the anchor.

The model is the ``tiny`` preset built offline (random init unless ``--model`` names a bootstrapped
one). Every episode is capped at ``--max-steps`` turns of ``--max-new-tokens`` tokens, so each setting
does the same amount of generation work; sampling is greedy. Episodes end early only when the model
sends a message to the user (a random model rarely does).

Usage::

    python bench/rollout_speed.py                                  # examples/warehouse_stock-v0
    python bench/rollout_speed.py --env trace/tau_airline-v0 --episodes 32
    python bench/rollout_speed.py --model ~/.cache/trace/models/bootstrap-... --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRACE_REGISTRY", str(Path(__file__).resolve().parent.parent / "examples"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="examples/warehouse_stock-v0", help="env id")
    parser.add_argument("--model", help="model folder (default: build the tiny preset)")
    parser.add_argument("--preset", default="tiny", help="preset to build when --model is not given")
    parser.add_argument("--episodes", type=int, default=32, help="episodes per setting (default: 32)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 8, 32], help="settings (default: 1 8 32)")
    parser.add_argument("--max-steps", type=int, default=4, help="turns per episode at most (default: 4)")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens per turn (default: 24)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()

    import trace_envs  # noqa: F401
    from trace_train.agents import HFAgent
    from trace_train.models import build_model, model_env_kwargs
    from trace_train.rollouts import run_rollouts

    model = args.model or str(build_model(args.preset, env_ids=[args.env]).path)
    agent = HFAgent(model, threads=args.threads, max_new_tokens=args.max_new_tokens)
    env_kwargs = model_env_kwargs(model, args.env)
    # Warm-up (first-call allocations, lazy imports) outside the timings.
    run_rollouts(args.env, agent, [0], max_steps=1, progress=False, env_kwargs=env_kwargs)

    print(f"env {args.env}, model {model}")
    print(f"{args.episodes} episodes per setting, <= {args.max_steps} turns x {args.max_new_tokens} tokens, "
          f"{args.threads} torch thread(s)\n")
    print(f"{'in flight':>9}  {'episodes/s':>10}  {'turns/s':>8}  {'tokens/s':>8}  {'mean reward':>11}  {'vs 1':>6}")
    anchor = None
    for n in args.in_flight:
        before = agent.stats.as_dict()
        t0 = time.perf_counter()
        summary = run_rollouts(args.env, agent, range(args.episodes), in_flight=n, max_steps=args.max_steps,
                               progress=False, keep_records=True, env_kwargs=env_kwargs)
        seconds = time.perf_counter() - t0
        after = agent.stats.as_dict()
        eps = summary.ran / seconds
        turns = sum(r["steps"] for r in summary.records) / seconds
        tokens = (after["completion_tokens"] - before["completion_tokens"]) / seconds
        anchor = anchor or eps
        print(f"{n:>9}  {eps:>10.2f}  {turns:>8.1f}  {tokens:>8.0f}  {summary.mean_reward:>11.3f}  "
              f"{eps / anchor:>5.1f}x")
    print("\nratio = episodes/s against one episode at a time (in flight = 1), same run, same episodes.")


if __name__ == "__main__":
    main()
