"""Speed of the SWE sandbox: reset latency, ``run_tests`` overhead, parallel episode throughput.

Figures (medians), each printed with its goal and as a ratio to the anchor measured in the same run —
a bare ``docker run --rm IMAGE python3 -c 'print(1)'`` (docs/design.md, "Sandboxing": 350–480 ms on these machines):

* reset, cold: ``env.reset`` plus starting a new container and loading the bugged repository into it;
* reset, warm: ``env.reset`` with ``pool_size=1`` (a container from the ``ContainerPool``) — goal ≤ 300 ms;
* ``run_tests`` overhead: our wall time for one full-suite run minus the pytest process's own wall time
  measured inside the container (goal ≤ 100 ms); also shown against pytest's reported session time
  ("N passed in X s"), a gap that additionally holds interpreter start-up and ``import pytest``;
* episodes per minute of the oracle agent with 4 environments in parallel (threads, one env each);
* what the sandbox hardening costs: one command through the hardened wrapper (own process group, output
  to a file, ``kill -9 -1`` of every leftover process, OOM/pids/disk counters) against a bare round trip
  of the persistent shell; the grader's preparation (end every agent process from a fresh exec, restore
  tests and configuration from the clean tree); and the grader's test run (a fresh exec as the grader uid)
  minus its pytest process.

    python bench/swe_speed.py [--repo cachetools-5.5.2] [--n 10] [--parallel 4] [--episodes 16]

Needs a Docker engine (scripts/setup_docker.sh); never gates CI on wall time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import gymnasium as gym

import trace_envs  # noqa: F401 - registers the ids
from trace_envs import make_agent, rollout
from trace_envs.swe.envs import load_repo
from trace_envs.swe.sandbox import DockerSandbox
from trace_envs.swe.tasks import apply_patch, load_instances, prepare_sandbox, restore_for_grading, run_tests

ENV_ID = "trace/swe_repo-v0"


def anchor_docker_run(image: str, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", "--network", "none", image, "python3", "-c", "print(1)"],
                       check=True, capture_output=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def reset_cold(repo_key: str, n: int) -> float:
    env = gym.make(ENV_ID, repos=[repo_key], pool_size=0)
    times = []
    try:
        for seed in range(n):
            t0 = time.perf_counter()
            env.reset(seed=seed)
            env.unwrapped._sandbox()  # lazily started: the first tool call pays this
            times.append(time.perf_counter() - t0)
    finally:
        env.close()
    return statistics.median(times)


def reset_warm(repo_key: str, n: int) -> float:
    env = gym.make(ENV_ID, repos=[repo_key], pool_size=1)
    times = []
    try:
        env.reset(seed=0)
        pool = next(iter(env.unwrapped._pools.values()))
        for seed in range(1, n + 1):
            pool.wait_ready(60)
            t0 = time.perf_counter()
            env.reset(seed=seed)  # takes the pooled container and loads the bugged files into it
            times.append(time.perf_counter() - t0)
            assert env.unwrapped._box is not None
    finally:
        env.close()
    return statistics.median(times)


def measure_test_overhead(repo_key: str, n: int) -> tuple[float, float, float, float]:
    """(median wall, median pytest-process wall, median pytest-reported session, tests per run)."""
    repo = load_repo(repo_key)
    walls, procs, reported, counts = [], [], [], []
    with DockerSandbox(repo.image()) as box:
        run_tests(box, repo)  # warm the page cache
        for _ in range(n):
            run = run_tests(box, repo)
            walls.append(run.seconds)
            procs.append(run.process_seconds)
            found = re.findall(r" in ([0-9.]+)s", run.output)
            if found:
                reported.append(float(found[-1]))
            counts.append(len(run.statuses))
    return (statistics.median(walls), statistics.median(procs),
            statistics.median(reported) if reported else float("nan"), statistics.median(counts))


def measure_hardening(repo_key: str, n: int) -> dict[str, float]:
    """Medians (seconds) of the hardened command, a bare shell round trip, the grader's restore and the
    grader's test-run overhead."""
    repo = load_repo(repo_key)
    inst = load_instances([repo_key], max_bugs=1)[0]
    bugged = apply_patch(repo.files, inst["patch"])
    out: dict[str, list[float]] = {"command": [], "bare": [], "restore": [], "grader_overhead": []}
    with DockerSandbox(repo.image()) as box:
        prepare_sandbox(box, bugged)
        for _ in range(n):
            t0 = time.perf_counter()
            box.run("true")
            out["command"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            box._exchange("echo __BENCH_MARK 0\n", "__BENCH_MARK ", 30)
            out["bare"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            restore_for_grading(box, repo, bugged)
            out["restore"].append(time.perf_counter() - t0)
            run = run_tests(box, repo, as_grader=True)
            out["grader_overhead"].append(run.seconds - run.process_seconds)
    return {k: statistics.median(v) for k, v in out.items()}


def throughput(repos: list[str], parallel: int, episodes: int) -> tuple[float, float, int]:
    """(episodes per minute, median episode seconds, successes) of the oracle with ``parallel`` envs."""
    per_env = max(1, episodes // parallel)

    def worker(index: int) -> list[tuple[float, float]]:
        env = gym.make(ENV_ID, repos=repos, pool_size=1)
        out = []
        try:
            for k in range(per_env):
                t0 = time.perf_counter()
                record = rollout(env, make_agent("oracle"), seed=1000 * index + k)
                out.append((time.perf_counter() - t0, record["reward"]))
                if record["reward"] != 1.0:  # say why: a benchmark must not hide a grading failure
                    b = record["reward_breakdown"]
                    bad = {t: s for t, s in {**b.get("FAIL_TO_PASS", {}), **b.get("PASS_TO_PASS", {})}.items()
                           if s != "passed"}
                    print(f"oracle scored {record['reward']} on {b.get('instance_id')}: reason={b.get('reason')} "
                          f"termination={record['termination']} detail={str(b.get('detail', ''))[:300]} "
                          f"not passed={dict(list(bad.items())[:5])}", flush=True)
        finally:
            env.close()
        return out

    t0 = time.perf_counter()
    with ThreadPoolExecutor(parallel) as ex:
        results = [r for chunk in ex.map(worker, range(parallel)) for r in chunk]
    total = time.perf_counter() - t0
    return 60.0 * len(results) / total, statistics.median(s for s, _ in results), sum(r == 1.0 for _, r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", default="cachetools-5.5.2", help="repository for the reset and run_tests figures")
    ap.add_argument("--n", type=int, default=10, help="repetitions per latency figure")
    ap.add_argument("--parallel", type=int, default=4, help="environments in parallel for the throughput figure")
    ap.add_argument("--episodes", type=int, default=16, help="oracle episodes in total for the throughput figure")
    ap.add_argument("--throughput-repos", nargs="*", default=["default"], help="repositories of those episodes")
    args = ap.parse_args()

    image = load_repo(args.repo).image(verbose=True)
    anchor = anchor_docker_run(image, args.n)
    cold = reset_cold(args.repo, args.n)
    warm = reset_warm(args.repo, args.n)
    wall, proc, reported, ntests = measure_test_overhead(args.repo, args.n)
    hard = measure_hardening(args.repo, args.n)
    epm, ep_s, ok = throughput(args.throughput_repos, args.parallel, args.episodes)
    anchor_again = anchor_docker_run(image, max(3, args.n // 2))  # the machine's load can drift during the run
    anchor = statistics.median([anchor, anchor_again])

    def row(name, value, goal, unit="ms", scale=1000.0):
        shown = f"{value * scale:8.0f} {unit}" if unit == "ms" else f"{value:8.1f} {unit}"
        verdict = "" if goal is None else ("  ok" if value <= goal else "  MISSED")
        goal_s = "" if goal is None else f"goal ≤ {goal * scale:.0f} {unit}"
        print(f"{name:<46}{shown:>14}   {value / anchor:6.2f}× anchor   {goal_s}{verdict}")

    print(f"\nrepo {args.repo}: {ntests:.0f} tests per run; anchor `docker run --rm IMAGE python3 -c 'print(1)'` "
          f"= {anchor * 1000:.0f} ms (docs/design.md, Sandboxing: 350-480 ms)\n")
    row("reset, cold (new container + repository)", cold, None)
    row("reset, warm (ContainerPool)", warm, 0.300)
    row("run_tests wall time (full suite)", wall, None)
    row("  pytest process inside the container", proc, None)
    row("  pytest's reported session time", reported, None)
    row("run_tests overhead over the pytest process", wall - proc, 0.100)
    row("run_tests wall minus pytest's reported time", wall - reported, None)
    row("one command, hardened wrapper (`true`)", hard["command"], None)
    row("  bare round trip of the persistent shell", hard["bare"], None)
    row("grading: end agent processes + restore tree", hard["restore"], None)
    row("grading: test run overhead (grader uid exec)", hard["grader_overhead"], None)
    print(f"{'oracle episodes per minute, ' + str(args.parallel) + ' envs in parallel':<46}{epm:8.1f} /min"
          f"   median episode {ep_s:.2f} s = {ep_s / anchor:.1f}× anchor; {ok} of {args.episodes // args.parallel * args.parallel} "
          "scored 1.0")
    print("\nThe gap between pytest's reported time and the process is interpreter start-up, `import pytest` and "
          "plugin loading inside the container: paid by any harness that starts pytest, not by the sandbox.")


if __name__ == "__main__":
    main()
