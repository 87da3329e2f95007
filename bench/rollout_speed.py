"""Greedy evaluation throughput of the tiny HFAgent: the fast decode path against today's path, in one run.

Anchor: today's path, ``decode: hf`` (``model.generate`` with the per-conversation prefix cache), measured
in the same run on the same episodes as ``decode: fast`` (:mod:`trace_train.tiny.fast_decode`). The default
setting is the evaluation of ``trace run``'s embedded default: the airline target with the base's env
kwargs (its three scenarios, no bundles, at most 16 turns), turns of at most ``base.max_new_tokens`` (96)
tokens, 40 episodes with 40 in flight, greedy. Both paths play the same episodes (greedy, token-for-token
the same model outputs but for float ties), so the work is the same; the script prints episodes, turns
and tokens per second of each, the split between generation and the env, and the ratio fast / today.

The model is the ``tiny`` preset built offline (random init unless ``--model`` names a bootstrapped one;
a random model writes every turn to the token cap, a bootstrapped one writes shorter turns).
``--in-flight 1 8 40`` also shows the batching gain of each path against one episode at a time.

Usage::

    python bench/rollout_speed.py                                   # the embedded default's evaluation
    python bench/rollout_speed.py --episodes 16 --in-flight 1 16
    python bench/rollout_speed.py --model ~/.cache/trace/models/bootstrap-... --threads 1
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
    from trace_train.pipeline.config import embedded_default, parse_seeds

    default = embedded_default()
    target = default.rollout.targets[0]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default=target, help=f"env id (default: {target})")
    parser.add_argument("--model", help="model folder (default: build the tiny preset)")
    parser.add_argument("--preset", default="tiny", help="preset to build when --model is not given")
    parser.add_argument("--episodes", type=int, default=len(parse_seeds("evaluate.seeds", default.evaluate.seeds)),
                        help="episodes per setting (default: the embedded default's evaluation seeds, 40)")
    parser.add_argument("--in-flight", type=int, nargs="+", default=[default.evaluate.in_flight],
                        help="settings (default: 40)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="turns per episode at most (default: the env kwargs' max_episode_steps)")
    parser.add_argument("--max-new-tokens", type=int, default=default.base.max_new_tokens,
                        help="tokens per turn (default: base.max_new_tokens, 96)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    args = parser.parse_args()

    import trace_envs  # noqa: F401
    from trace_train.agents import HFAgent
    from trace_train.tiny.build import build_model
    from trace_train.tiny.metadata import model_env_kwargs, prompt_env_kwargs
    from trace_train.rollouts import run_rollouts

    model = args.model or str(build_model(args.preset, env_ids=[args.env]).path)
    # A bootstrapped model's own env kwargs (its compact prompt); a fresh build gets the compact prompt too.
    env_kwargs = {**prompt_env_kwargs(args.env), **model_env_kwargs(model, args.env)}
    if args.env == target:  # the embedded default's base episodes: its scenarios, its turn cap
        env_kwargs.update(default.rollout.env_kwargs)
    agents = {decode: HFAgent(model, threads=args.threads, max_new_tokens=args.max_new_tokens, decode=decode)
              for decode in ("hf", "fast")}
    for agent in agents.values():  # warm-up (first-call allocations, lazy imports) outside the timings
        run_rollouts(args.env, agent, [0], max_steps=1, progress=False, env_kwargs=env_kwargs)

    print(f"env {args.env} {env_kwargs}, model {model}")
    print(f"{args.episodes} episodes per setting, <= {args.max_steps or env_kwargs.get('max_episode_steps', 'env')} "
          f"turns x {args.max_new_tokens} tokens, greedy, {args.threads} torch thread(s)\n")
    print(f"{'in flight':>9}  {'decode':>6}  {'episodes/s':>10}  {'turns/s':>8}  {'tokens/s':>8}  {'gen s':>7}  "
          f"{'env s':>6}  {'reward':>6}  {'vs today':>8}  {'vs 1':>6}")
    single: dict[str, float] = {}
    for n in args.in_flight:
        today = None
        for decode, agent in agents.items():
            before = agent.stats.as_dict()
            t0 = time.perf_counter()
            summary = run_rollouts(args.env, agent, range(args.episodes), in_flight=n, max_steps=args.max_steps,
                                   progress=False, keep_records=True, env_kwargs=env_kwargs)
            seconds = time.perf_counter() - t0
            after = agent.stats.as_dict()
            gen = after["seconds"] - before["seconds"]
            eps = summary.ran / seconds
            turns = sum(r["steps"] for r in summary.records) / seconds
            tokens = (after["completion_tokens"] - before["completion_tokens"]) / seconds
            today = today or eps
            if n == 1:
                single[decode] = eps
            vs_one = f"{eps / single[decode]:5.1f}x" if decode in single else "     -"
            print(f"{n:>9}  {decode:>6}  {eps:>10.3f}  {turns:>8.2f}  {tokens:>8.0f}  {gen:>7.1f}  {seconds - gen:>6.1f}  "
                  f"{summary.mean_reward:>6.3f}  {eps / today:>7.2f}x  {vs_one}", flush=True)
    print("\nvs today = episodes/s against decode: hf at the same in-flight setting, same run, same episodes "
          "(2 shared cores: timings under contention).")


if __name__ == "__main__":
    main()
