"""What running a generated env in its sandboxed worker costs: per step, and per worker start.

The offline generator renders a τ² capability env (default: precondition_verification on airline)
into a temporary workspace, which is loaded as a generated registry entry; ``gym.make`` of its id
returns the sandboxed proxy (:mod:`trace_envs.core.sandboxed`). The same module is also built in
this process (only the benchmark does that; a trainer never imports a generated module). Printed:

* the anchor, measured in the same run: seconds per step of the in-process env (the oracle's and a
  random agent's episodes over the same seeds, agent time excluded);
* seconds per step through the proxy, the overhead per step (proxy − in process; goal ≤ 1 ms) and
  the ratio proxy / in process;
* seconds per reset both ways;
* worker start: ``gym.make`` of the id until the env is ready (bubblewrap, the interpreter, importing
  ``trace_envs`` and the module, building the env; goal ≤ 0.5 s), median of ``--starts``.

* the use-time audit (:mod:`generators.audit`): GRPO-sized steps (``--step-episodes`` episodes, in groups of
  2 on a seed, as ``run_rollouts`` plays them) with the audit off and on (rate ``--audit-rate``, the first
  episode always): audit seconds per step, against the same step's play time measured in this run and
  against a GRPO step (``--grpo-step-s``; default 4.69 s, the tiny model's fast step measured by
  ``bench/grpo_speed.py`` in docs/speed.md; goal <= 5%).
* the env pool (:class:`trace_train.rollouts.EnvPool`, what a GRPO run plays its steps through): the same
  GRPO-sized steps with the envs made (and their workers started) every step, the anchor, and kept open in one
  pool from step to step; seconds per step both ways and the ratio.

Wall times depend on machine load (shared 2-core machines are slow); the ratio and the overhead in
milliseconds are the figures to compare.

Usage::

    python bench/sandbox_overhead.py
    python bench/sandbox_overhead.py --capability multi_step_completion --domain retail --episodes 40
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym  # noqa: E402

import trace_envs  # noqa: E402
from generators.offline import render  # noqa: E402
from generators.static import static_check  # noqa: E402
from generators.workspace import Workspace  # noqa: E402
from trace_envs import OracleAgent, RandomAgent  # noqa: E402
from trace_envs.core.sandboxed import bwrap_status  # noqa: E402


def episodes(env, seeds: list[int]) -> tuple[float, int, float, int]:
    """(step seconds, steps, reset seconds, resets) of the oracle's and a random agent's episodes."""
    step_s = reset_s = 0.0
    steps = resets = 0
    for seed in seeds:
        for agent in (OracleAgent(), RandomAgent(seed)):
            t0 = time.perf_counter()
            obs, info = env.reset(seed=seed)
            reset_s += time.perf_counter() - t0
            resets += 1
            agent.reset(env.unwrapped, obs, info)
            done = False
            while not done:
                action = agent(obs, info)
                t0 = time.perf_counter()
                obs, reward, terminated, truncated, info = env.step(action)
                step_s += time.perf_counter() - t0
                steps += 1
                done = terminated or truncated
    return step_s, steps, reset_s, resets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capability", default="precondition_verification")
    parser.add_argument("--domain", default="airline", choices=["airline", "retail"])
    parser.add_argument("--episodes", type=int, default=20, help="seeds (each played by the oracle and a random agent)")
    parser.add_argument("--starts", type=int, default=7, help="worker starts to time")
    parser.add_argument("--steps", type=int, default=30, help="GRPO-sized steps for the audit's cost")
    parser.add_argument("--step-episodes", type=int, default=8, help="episodes per step (4 groups x 2: grpo_speed's)")
    parser.add_argument("--audit-rate", type=float, default=0.05, help="the audit's sampled share")
    parser.add_argument("--grpo-step-s", type=float, default=4.69, help="seconds of a GRPO step to compare with")
    args = parser.parse_args()
    ok, why = bwrap_status()
    print(f"sandbox: {'bubblewrap' if ok else 'NONE (' + why + '): timing the unsandboxed worker'}")
    if not ok:
        os.environ["TRACE_UNSANDBOXED"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        env_id = f"gen/{args.capability}_tau_{args.domain}-v0"
        source = render({"name": args.capability, "target_env": f"trace/tau_{args.domain}-v0"}, env_id=env_id,
                        run_id="bench").source
        _, registration = static_check(source)
        ws = Workspace(Path(tmp) / "ws")
        module, _, _ = ws.install(source, registration, capability=args.capability,
                                  name=f"{args.capability}_tau_{args.domain}", version=0,
                                  target=f"tau_{args.domain}", origin="generated:bench")
        trace_envs.load_registry(ws.root)
        entry = trace_envs.get_entry(env_id)
        spec = importlib.util.spec_from_file_location("_bench_in_process", module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        local = gym.wrappers.TimeLimit(getattr(mod, registration["class"])(**entry.kwargs),
                                       max_episode_steps=entry.max_episode_steps)
        seeds = list(range(100, 100 + args.episodes))
        episodes(local, seeds[:2])  # warm both (caches, lazy imports)
        proxy = gym.make(env_id)
        episodes(proxy, seeds[:2])
        ls, ln, lr, lrn = episodes(local, seeds)
        ps, pn, pr, prn = episodes(proxy, seeds)
        proxy.close()
        local.close()
        starts = []
        for _ in range(args.starts):
            t0 = time.perf_counter()
            env = gym.make(env_id)
            starts.append(time.perf_counter() - t0)
            env.close()
        plain_s, audit_s, auditor = audit_cost(env_id, args)
        unpooled_s, pooled_s = pool_cost(env_id, args)
    local_step, proxy_step = ls / ln, ps / pn
    print(f"env: {env_id} ({args.episodes} seeds x oracle + random; {ln} steps)")
    print(f"anchor  in-process step: {local_step * 1e3:8.3f} ms   reset: {lr / lrn * 1e3:8.2f} ms")
    print(f"        proxy step:      {proxy_step * 1e3:8.3f} ms   reset: {pr / prn * 1e3:8.2f} ms")
    print(f"overhead per step: {(proxy_step - local_step) * 1e3:.3f} ms (goal <= 1 ms); "
          f"ratio proxy / in-process: {proxy_step / local_step:.2f}x")
    print(f"worker start (gym.make): median {statistics.median(starts):.3f} s, min {min(starts):.3f} s, "
          f"max {max(starts):.3f} s over {len(starts)} (goal <= 0.5 s)")
    per_step = auditor.seconds / args.steps
    wall = (audit_s - plain_s) / args.steps
    print(f"audit at use: {args.steps} steps x {args.step_episodes} episodes, rate {args.audit_rate}: "
          f"{sum(auditor.audited.values())} episodes audited")
    print(f"  play per step (anchor, this run): {plain_s / args.steps * 1e3:.1f} ms; audit per step: "
          f"{per_step * 1e3:.1f} ms (wall difference {wall * 1e3:.1f} ms)")
    print(f"  audit / GRPO step ({args.grpo_step_s:.2f} s): {per_step / args.grpo_step_s:.2%} (goal <= 5%); "
          f"audit / the step's play: {per_step / (plain_s / args.steps):.2f}x")
    print(f"env pool: {args.steps} steps x {args.step_episodes} episodes, audit off")
    print(f"  anchor, envs made every step: {unpooled_s / args.steps * 1e3:.1f} ms per step; one pool for all "
          f"steps: {pooled_s / args.steps * 1e3:.1f} ms per step; ratio pooled / anchor: {pooled_s / unpooled_s:.2f}x")


class Mixed:
    """Half the episodes the oracle's, half a random agent's (by the observation's hash)."""

    name = "mixed"

    def reset(self, env, observation, info):
        self.inner = OracleAgent() if hash(observation) % 2 else RandomAgent(len(observation))
        if hasattr(self.inner, "reset"):
            self.inner.reset(env, observation, info)

    def __call__(self, observation, info):
        return self.inner(observation, info)


def pool_cost(env_id: str, args) -> tuple[float, float]:
    """(seconds of the steps with the envs made each step, with one EnvPool across them): audit off both times."""
    from trace_train.rollouts import EnvPool, run_rollouts

    groups = args.step_episodes // 2
    out = []
    for pooled in (False, True):
        pool = EnvPool() if pooled else None
        t0 = time.perf_counter()
        for step in range(args.steps):
            seeds = range(2_000_000 + step * groups, 2_000_000 + (step + 1) * groups)
            run_rollouts(env_id, Mixed(), seeds=seeds, samples=2, in_flight=args.step_episodes, progress=False,
                         audit=False, env_pool=pool)
        if pool is not None:
            pool.close()
        out.append(time.perf_counter() - t0)
    return out[0], out[1]


def audit_cost(env_id: str, args) -> tuple[float, float, "Auditor"]:
    """(seconds of the steps without the audit, with it, the auditor): the same steps, audit off then on."""
    from generators.audit import AuditConfig, Auditor
    from trace_train.rollouts import run_rollouts

    groups = args.step_episodes // 2
    auditor = Auditor(AuditConfig(rate=args.audit_rate, seed=1))
    out = []
    for audit in (False, auditor):
        t0 = time.perf_counter()
        for step in range(args.steps):
            seeds = range(1_000_000 + step * groups, 1_000_000 + (step + 1) * groups)
            run_rollouts(env_id, Mixed(), seeds=seeds, samples=2, in_flight=args.step_episodes, progress=False,
                         audit=audit)
        out.append(time.perf_counter() - t0)
    auditor.close()
    return out[0], out[1], auditor


if __name__ == "__main__":
    main()
