"""Episodes per second of the Ray rollout backend against its actors, beside the local backend (issue 30).

Two measurements, in one run:

1. **Scaling of waiting work**: an env whose every step waits like a slow tool or an LLM call (a sleep of
   ``--step-s`` seconds, ``--steps`` steps an episode; no CPU), played by a trivial agent. One process steps
   its open envs one after the other, so a process plays ``1 / (steps × step_s)`` episodes a second whatever
   its batch: what more of them buys is what a cluster buys. Ray runs it on 1, 2, 4, 8 and 16 actors of
   ``2 / 16`` CPU (fractional: 16 actors share the 2 cores); the local backend runs it in this process and
   in 2 worker processes. Episodes per second are measured in the steady state (between 40% and 90% of the
   episodes in the file, when every actor is up: starting the actors is left out, and the wall time with it
   is printed too). The
   goal: within 80% of linear up to 16 actors (``ratio`` = rate / (actors × the 1-actor rate)).
2. **Per-episode overhead** of the Ray path on a τ² env with a scripted agent (the oracle on
   ``trace/tau_airline-v0``): the marginal seconds per episode (``(wall(N2) − wall(N1)) / (N2 − N1)``, which
   drops the fixed cost of starting actors) of Ray with one actor against the local backend in this
   process. Goal: ≤ 5 ms an episode.

Wall times depend on the machine's load (the 2-core machines are shared); the ratios are what to compare.

Usage::

    python bench/ray_scale.py
    python bench/ray_scale.py --actors 1 2 4 --episodes-per-actor 8 --step-s 0.05
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import gymnasium as gym

ROOT = Path(__file__).resolve().parent.parent
SLEEPY = "bench.ray_scale:SleepyTool-v0"  # "module:id": gym.make imports this module first, on any actor


class SleepyToolEnv(gym.Env):
    """Each step waits ``step_s`` seconds (a tool, an LLM call) and does nothing else; ``steps`` steps, reward 1."""

    metadata: dict = {}

    def __init__(self, steps: int = 5, step_s: float = 0.1) -> None:
        self.steps, self.step_s, self.t = steps, step_s, 0
        self.observation_space = gym.spaces.Text(64)
        self.action_space = gym.spaces.Text(64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return "call the tool", {"messages": [{"role": "user", "content": "call the tool"}], "tools": []}

    def step(self, action):
        time.sleep(self.step_s)
        self.t += 1
        done = self.t >= self.steps
        return "done" if done else "again", float(done), done, False, {"success": done, "messages": []}


if "SleepyTool-v0" not in gym.registry:
    gym.register("SleepyTool-v0", entry_point=SleepyToolEnv)


class CallTool:
    """The trivial agent of the waiting env."""

    name = "call-tool"

    def __call__(self, observation, info):
        return "call"


class _Lines:
    """Samples how many lines a file has, every 20 ms, in a thread: when the episodes landed."""

    def __init__(self, path: Path) -> None:
        self.path, self.samples, self.stop = path, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            n = self.path.read_bytes().count(b"\n") if self.path.exists() else 0
            self.samples.append((time.perf_counter(), n))
            time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        self.samples.append((time.perf_counter(), self.path.read_bytes().count(b"\n")))  # the file is complete

    def steady_rate(self, total: int) -> float:
        """Episodes per second between 40% and 90% of ``total`` in the file: by then every actor has started
        (on a busy 2-core machine actors come up about a second apart) and none has run out of work."""
        lo, hi = max(1, int(total * 0.4)), max(2, int(total * 0.9))
        t_lo, n_lo = next((t, n) for t, n in self.samples if n >= lo)
        t_hi, n_hi = next((t, n) for t, n in self.samples if n >= hi)
        return (n_hi - n_lo) / (t_hi - t_lo) if t_hi > t_lo else float("nan")


def _sleepy_job(out: Path, episodes: int, args, in_flight: int):
    from trace_train.backends import RolloutJob

    return RolloutJob(key="call-tool", make=CallTool, targets=[SLEEPY], seeds=list(range(episodes)), out=out,
                      in_flight=in_flight, progress=False,
                      env_kwargs={SLEEPY: {"steps": args.steps, "step_s": args.step_s}})


def _timed(fn, out: Path, total: int) -> tuple[float, float]:
    with _Lines(out) as lines:
        t0 = time.perf_counter()
        fn()
        wall = time.perf_counter() - t0
    return lines.steady_rate(total), wall


def scaling(args, tmp: Path) -> None:
    from trace_train.backends import run_jobs
    from trace_train.pipeline.config import RaySection

    per_process = 1 / (args.steps * args.step_s)
    print(f"\n1. waiting env: {args.steps} steps of {args.step_s * 1000:.0f} ms an episode; one process plays "
          f"{per_process:.2f} episodes/s at most\n")
    print(f"{'backend':<28}{'episodes':>9}{'steady ep/s':>13}{'wall s':>9}{'ratio':>8}")
    for workers in (1, 2):
        n = args.episodes_per_actor * workers
        out = tmp / f"local{workers}.jsonl"
        jobs = [_sleepy_job(out if workers == 1 else tmp / f"local{workers}_{i}.jsonl", n // workers, args,
                            args.per_actor) for i in range(workers)]
        if workers == 1:
            rate, wall = _timed(lambda: run_jobs(jobs, "local"), out, n)
        else:  # two jobs side by side in two worker processes: watch the first one's file
            rate, wall = _timed(lambda: run_jobs(jobs, "local", workers=2), jobs[0].out, n // workers)
            rate *= workers
        print(f"{f'local, {workers} process(es)':<28}{n:>9}{rate:>13.2f}{wall:>9.1f}{rate / (workers * per_process):>8.2f}")
    base = None
    for actors in args.actors:
        n = args.episodes_per_actor * actors
        out = tmp / f"ray{actors}.jsonl"
        cfg = RaySection(num_actors=actors, env_cpus=args.cpus / max(args.actors), max_concurrent_per_actor=args.per_actor)
        rate, wall = _timed(lambda: run_jobs([_sleepy_job(out, n, args, args.per_actor)], "ray", ray=cfg), out, n)
        base = base or rate
        print(f"{f'ray, {actors} actors':<28}{n:>9}{rate:>13.2f}{wall:>9.1f}{rate / (actors * base):>8.2f}")
    print("\nratio: steady rate / (processes or actors × the one-process / one-actor rate); goal ≥ 0.80")


def overhead(args, tmp: Path) -> None:
    from trace_envs import OracleAgent
    from trace_train.backends import RolloutJob, run_jobs
    from trace_train.pipeline.config import RaySection

    n1, n2 = args.tau_episodes
    walls: dict[tuple[str, int], float] = {}
    for engine in ("local", "ray"):
        for n in (n1, n2):
            job = RolloutJob(key="oracle", make=OracleAgent, targets=["trace/tau_airline-v0"], seeds=list(range(n)),
                             out=tmp / f"tau_{engine}_{n}.jsonl", in_flight=8, progress=False)
            t0 = time.perf_counter()
            run_jobs([job], engine, ray=RaySection(num_actors=1, env_cpus=1, max_concurrent_per_actor=8))
            walls[engine, n] = time.perf_counter() - t0
    per = {e: (walls[e, n2] - walls[e, n1]) / (n2 - n1) for e in ("local", "ray")}
    print(f"\n2. per-episode cost, trace/tau_airline-v0 with the oracle ({n1} and {n2} episodes)\n")
    for e in ("local", "ray"):
        print(f"{e:<8} wall {walls[e, n1]:6.2f} s / {walls[e, n2]:6.2f} s   marginal {per[e] * 1000:7.2f} ms/episode")
    print(f"Ray overhead: {(per['ray'] - per['local']) * 1000:+.2f} ms/episode (goal ≤ 5 ms); starting the actor "
          f"and the cluster connection: {walls['ray', n1] - walls['local', n1] - n1 * (per['ray'] - per['local']):.2f} s "
          "once a rollout")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--cpus", type=float, default=2.0, help="CPUs the largest actor count shares (default: 2)")
    p.add_argument("--episodes-per-actor", type=int, default=40)
    p.add_argument("--per-actor", type=int, default=4, help="episodes open at once per actor / process")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--step-s", type=float, default=0.1)
    p.add_argument("--tau-episodes", type=int, nargs=2, default=[100, 400])
    p.add_argument("--num-cpus", type=float, default=2, help="CPUs of the local Ray cluster started here")
    args = p.parse_args()
    # The actors import this module (the waiting env's "module:id"): the repository root goes on their path.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    sys.path.insert(0, str(ROOT))
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, logging_level="WARNING")
    print(f"a one-node Ray cluster of {args.num_cpus:g} CPUs started in {time.perf_counter() - t0:.1f} s; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as tmp:
        scaling(args, Path(tmp))
        overhead(args, Path(tmp))
    ray.shutdown()


if __name__ == "__main__":
    main()
