"""Speed of ``trace serve``: step latency, throughput and server CPU over WebSocket and HTTP vs in-process ``env.step``.

The server is ``trace serve`` in its own process (as users run it, default limits). Clients are asyncio
coroutines in this process, one connection (session) each, at 1, 16 and 64 concurrent sessions; each plays
oracle episodes of a τ² env (the oracle's actions are precomputed per seed from a local env, so the clients
spend no time choosing). Two kinds of run, each at every session count:

* (a) ``think``: between an observation and its next action each session waits an agent's think time
  (``--think-ms``, 50 ms by default, uniform in ±50%; sessions start spread over one think time), as an
  agent whose LLM takes a turn would. Reported: the latency of one step as the client sees it (send → the
  observation parsed), p50 and p99, and its overhead over the in-process ``env.step``. This is what the
  issue's goal means: with 16 closed-loop clients and no think time, a step's latency is mostly queueing
  behind the other 15 sessions' steps on one server process, not per-step overhead.
* (b) ``saturated``: closed loop, no think time. Reported: steps per second, all sessions together (resets
  included), against the in-process steps per second.

and in both (c) the server process's CPU time per step (from /proc, resets included): its own work, which the
machine's other load barely changes, against the in-process CPU per step.

The anchor is the in-process ``env.step`` of the same episodes, measured in this run on one thread (in-process
sessions add no parallelism under the GIL): its latency p50/p99 and its steps per second. WebSocket steps send
the assistant message (``{"type": "step", "data": {"message": ...}}``), in each transcript mode
(``--transcripts``: ``delta``, the default, sends what is new each step; ``full`` the whole transcript and the
tool schemas); the client keeps the transcript as an agent would. HTTP steps are JSON-RPC ``tools/call`` POSTs
in an OpenEnv session (reset over a WebSocket attached to the session, untimed; their results carry the tool's
output, not the transcript).

Goal (issue 29): p50 overhead ≤ 1 ms per step on a τ² env at 16 sessions (WebSocket, with the think time).

Usage::

    python bench/serve_speed.py                       # trace/tau_airline-v0, 1/16/64 sessions, both runs
    python bench/serve_speed.py --sessions 1 16 --episodes 4 --env-id trace/tau_retail-v0 --think-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium as gym  # noqa: E402
import httpx  # noqa: E402
from websockets.asyncio.client import connect  # noqa: E402

import trace_envs  # noqa: E402,F401
from trace_envs.core.parsing import parse_action  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
USER_TOOL = "send_message_to_user"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def oracle_plans(env_id: str, seeds: range) -> tuple[dict, list[float], float]:
    """Each seed's oracle actions, the in-process step latencies and the in-process throughput (steps/s)."""
    env = gym.make(env_id)
    plans, latencies, steps = {}, [], 0
    for _ in range(2):  # the first pass warms caches; the second is timed
        latencies, steps = [], 0
        start = time.perf_counter()
        for seed in seeds:
            obs, info = env.reset(seed=seed)
            policy = env.unwrapped.oracle()
            actions = []
            while True:
                action = policy(obs, info)
                actions.append(action)
                t = time.perf_counter()
                obs, reward, terminated, truncated, info = env.step(action)
                latencies.append(time.perf_counter() - t)
                steps += 1
                if terminated or truncated:
                    break
            assert reward == 1.0, (seed, reward)
            plans[seed] = actions
        wall = time.perf_counter() - start
    env.close()
    return plans, latencies, steps / wall


def as_mcp(action) -> tuple[str, dict]:
    parsed = parse_action(action)
    if parsed.tool_calls:
        return parsed.tool_calls[0].name, dict(parsed.tool_calls[0].arguments)
    return USER_TOOL, {"message": parsed.content}


async def _think(rng: random.Random, think_s: float) -> None:
    """The agent's turn between two steps: ``think_s`` on average (uniform in ±50%, so sessions drift apart)."""
    if think_s > 0:
        await asyncio.sleep(rng.uniform(0.5, 1.5) * think_s)


async def ws_session(url: str, env_id: str, plans: dict, seeds: list[int], lat: list[float], think_s: float,
                     rng: random.Random, transcript: str) -> int:
    steps = 0
    await _think(rng, think_s)  # sessions start spread over one think time
    async with connect(url.replace("http://", "ws://") + "/ws", max_size=None, compression=None) as ws:
        for seed in seeds:
            # 'delta' is the server's default: not named, so the script also measures servers older than the option
            extra = {"transcript": transcript} if transcript != "delta" else {}
            await ws.send(json.dumps({"type": "reset", "data": {"env_id": env_id, "seed": seed, **extra}}))
            obs = json.loads(await ws.recv())["data"]["observation"]
            messages = obs["messages"]
            for action in plans[seed]:
                await _think(rng, think_s)
                t = time.perf_counter()
                await ws.send(json.dumps({"type": "step", "data": {"message": action}}))
                reply = json.loads(await ws.recv())
                lat.append(time.perf_counter() - t)
                steps += 1
                assert reply["type"] == "observation", reply
                obs = reply["data"]["observation"]  # the client keeps the transcript, as an agent would
                messages = obs["messages"] or messages[:obs["messages_from"]] + obs["new_messages"]
            assert reply["data"]["done"] and reply["data"]["reward"] == 1.0, reply["data"]
            assert messages[-1]["role"] == "user", messages[-1]
    return steps


async def http_session(url: str, client: httpx.AsyncClient, env_id: str, plans: dict, seeds: list[int],
                       lat: list[float], think_s: float, rng: random.Random, transcript: str) -> int:
    steps, rid = 0, 0

    async def rpc(method: str, params: dict) -> dict:
        nonlocal rid
        rid += 1
        r = await client.post(url + "/mcp", json={"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return r.json()

    await _think(rng, think_s)
    sid = (await rpc("openenv/session/create", {}))["result"]["session_id"]
    try:
        for seed in seeds:
            async with connect(url.replace("http://", "ws://") + f"/ws?session_id={sid}", max_size=None,
                               compression=None) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {"env_id": env_id, "seed": seed}}))
                json.loads(await ws.recv())
            for action in plans[seed]:
                name, arguments = as_mcp(action)
                await _think(rng, think_s)
                t = time.perf_counter()
                reply = await rpc("tools/call", {"session_id": sid, "name": name, "arguments": arguments})
                lat.append(time.perf_counter() - t)
                steps += 1
                assert "result" in reply, reply
            meta = reply["result"]["meta"]
            assert meta["done"] and meta["reward"] == 1.0, meta
    finally:
        await rpc("openenv/session/close", {"session_id": sid})
    return steps


async def run_config(transport: str, url: str, env_id: str, plans: dict, n: int, episodes: int,
                     think_s: float = 0.0, transcript: str = "delta") -> dict:
    seeds = sorted(plans)
    lat: list[float] = []
    per = [[seeds[(i * episodes + k) % len(seeds)] for k in range(episodes)] for i in range(n)]
    rngs = [random.Random(i) for i in range(n)]
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.perf_counter()
        if transport == "ws":
            counts = await asyncio.gather(*(ws_session(url, env_id, plans, s, lat, think_s, r, transcript)
                                            for s, r in zip(per, rngs)))
        else:
            counts = await asyncio.gather(*(http_session(url, client, env_id, plans, s, lat, think_s, r, transcript)
                                            for s, r in zip(per, rngs)))
        wall = time.perf_counter() - start
    steps = sum(counts)
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "throughput": steps / wall, "steps": steps}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc): the server's own work, whatever the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(max_sessions: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "trace_train.cli", "serve", "--port", str(port), "--max-sessions",
                             str(max_sessions), "--log-level", "warning"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RuntimeError("trace serve exited")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("trace serve did not come up")
        time.sleep(0.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-id", default="trace/tau_airline-v0")
    ap.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--episodes", type=int, default=6, help="episodes per session at least (default: 6)")
    ap.add_argument("--seeds", type=int, default=64, help="distinct seeds (default: 64)")
    ap.add_argument("--transports", nargs="+", default=["ws", "http"], choices=["ws", "http"])
    ap.add_argument("--transcripts", nargs="+", default=["delta", "full"], choices=["delta", "full"],
                    help="WebSocket sessions' transcript modes to measure (default: both)")
    ap.add_argument("--think-ms", type=float, default=50.0,
                    help="the agent's mean time between a step's observation and its next action in the latency "
                         "runs (uniform in ±50%%; default: 50 ms, a fast LLM turn)")
    ap.add_argument("--runs", nargs="+", default=["think", "saturated"], choices=["think", "saturated"],
                    help="'think': latency with the think time; 'saturated': closed loop, no think time")
    ap.add_argument("--min-steps", type=int, default=300,
                    help="steps per configuration at least (fewer sessions play more episodes; default: 300)")
    args = ap.parse_args()

    load0 = os.getloadavg()
    plans, inproc_lat, inproc_tp = oracle_plans(args.env_id, range(args.seeds))
    in50, in99, in_cost = pct(inproc_lat, 0.5), pct(inproc_lat, 0.99), 1 / inproc_tp
    steps_per_episode = len(inproc_lat) / len(plans)
    print(f"{args.env_id}: {len(plans)} oracle episodes, {len(inproc_lat)} steps "
          f"({len(inproc_lat) / len(plans):.1f} per episode); load average {load0[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"in-process env.step (the anchor): p50 {in50 * 1e3:.3f} ms, p99 {in99 * 1e3:.3f} ms; {inproc_tp:.0f} "
          f"steps/s on one thread, i.e. {in_cost * 1e3:.3f} ms of CPU per step with its share of the resets\n")
    proc, url = start_server(max(args.sessions) + 4)
    rows = []
    try:
        for run in args.runs:
            think = args.think_ms / 1e3 if run == "think" else 0.0
            for transport in args.transports:
                for transcript in (args.transcripts if transport == "ws" else ["-"]):
                    mode = transcript if transport == "ws" else "delta"
                    for n in args.sessions:
                        # warm-up (connections, caches), closed loop
                        asyncio.run(run_config(transport, url, args.env_id, plans, n, 1, 0.0, mode))
                        episodes = max(args.episodes, math.ceil(args.min_steps / (n * steps_per_episode)))
                        cpu = cpu_seconds(proc.pid)
                        r = asyncio.run(run_config(transport, url, args.env_id, plans, n, episodes, think, mode))
                        r["server_cpu"] = (cpu_seconds(proc.pid) - cpu) / r["steps"]
                        rows.append((run, transport, transcript, n, r))
                        stats = httpx.get(url + "/trace/stats", timeout=10).json()
                        assert stats["sessions"] == 0, stats  # every session was freed
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    load1 = os.getloadavg()

    think_rows = [row for row in rows if row[0] == "think"]
    if think_rows:
        print(f"\n(a) step latency with a think time of {args.think_ms:g} ms (±50%) between steps; anchor: in-process "
              f"env.step p50 {in50 * 1e3:.3f} ms, p99 {in99 * 1e3:.3f} ms")
        head = (f"{'transport':9} {'transcript':10} {'sessions':>8} {'steps':>6} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'p50 +ms':>8} {'p99 +ms':>8} {'p50 ×':>6} {'srv cpu':>8} {'cpu ×':>6}")
        print(head + "\n" + "-" * len(head))
        for _, transport, transcript, n, r in think_rows:
            print(f"{transport:9} {transcript:10} {n:8d} {r['steps']:6d} {r['p50'] * 1e3:8.3f} {r['p99'] * 1e3:8.3f} "
                  f"{(r['p50'] - in50) * 1e3:8.3f} {(r['p99'] - in99) * 1e3:8.3f} {r['p50'] / in50:6.1f} "
                  f"{r['server_cpu'] * 1e3:8.3f} {r['server_cpu'] / in_cost:6.2f}")
    sat_rows = [row for row in rows if row[0] == "saturated"]
    if sat_rows:
        print(f"\n(b) saturated: closed loop, no think time; anchor: in-process {inproc_tp:.0f} steps/s, "
              f"{in_cost * 1e3:.3f} ms/step (resets included)")
        head = (f"{'transport':9} {'transcript':10} {'sessions':>8} {'steps':>6} {'steps/s':>8} {'tput ×':>7} "
                f"{'srv cpu':>8} {'cpu ×':>6} {'cpu +ms':>8} {'p50 ms':>8}")
        print(head + "\n" + "-" * len(head))
        for _, transport, transcript, n, r in sat_rows:
            print(f"{transport:9} {transcript:10} {n:8d} {r['steps']:6d} {r['throughput']:8.0f} "
                  f"{r['throughput'] / inproc_tp:7.3f} {r['server_cpu'] * 1e3:8.3f} {r['server_cpu'] / in_cost:6.2f} "
                  f"{(r['server_cpu'] - in_cost) * 1e3:8.3f} {r['p50'] * 1e3:8.3f}")
    print(f"\n+ms: beyond in-process; ×: ratio to in-process. srv cpu: the server process's CPU ms per step (resets "
          f"included; /proc), (c) in the issue; cpu ×: against the in-process ms/step. In (b), p50 is mostly queueing "
          f"behind the other sessions' steps on one server process. Clients run in this process, on the same "
          f"{os.cpu_count()} CPUs. Load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end.")
    goal = next((r for run, t, m, n, r in rows if run == "think" and t == "ws" and m == "delta" and n == 16), None)
    if goal is not None:
        over = (goal["p50"] - in50) * 1e3
        print(f"goal (issue 29: p50 overhead ≤ 1 ms per step at 16 sessions, WebSocket, {args.think_ms:g} ms think "
              f"time): {over:.3f} ms, {'met' if over <= 1.0 else 'NOT met'}")


if __name__ == "__main__":
    main()
