"""Speed of ``trace serve``: step latency and throughput over WebSocket and HTTP vs in-process ``env.step``.

The server is ``trace serve`` in its own process (as users run it). Clients are asyncio coroutines in
this process, one connection (session) each, at 1, 16 and 64 concurrent sessions; each plays oracle
episodes of a τ² env (the oracle's actions are precomputed per seed from a local env, so the clients
spend no time choosing). Measured per configuration:

* latency of one step as the client sees it (send → the observation parsed), p50 and p99;
* throughput: steps per second of wall time, all sessions together (resets included, as in-process);
* cost per step: wall time / steps, i.e. what one step costs the saturated server (plus this process's
  client work, on the same cores);
* the server process's CPU time per step (from /proc): its own work, independent of the machine's load.

The anchor is the in-process ``env.step`` of the same episodes, measured in this run: its latency p50/p99
and its throughput (one thread: in-process sessions add no parallelism under the GIL). Printed: each
figure, the ratios to the anchor and the overhead in ms. WebSocket steps send the assistant message
(``{"type": "step", "data": {"message": ...}}``); HTTP steps are JSON-RPC ``tools/call`` POSTs in an
OpenEnv session (reset over a WebSocket attached to the session, untimed).

Goal (issue 29): p50 overhead ≤ 1 ms per step on a τ² env at 16 sessions. At 16 closed-loop sessions a
step's latency includes waiting for the other 15 sessions' steps (one server process, one GIL), so the
script prints both the latency overhead and the per-step cost overhead (the queue-free figure).

Usage::

    python bench/serve_speed.py                       # trace/tau_airline-v0, 1/16/64 sessions
    python bench/serve_speed.py --sessions 1 16 --episodes 4 --env-id trace/tau_retail-v0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
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


async def ws_session(url: str, env_id: str, plans: dict, seeds: list[int], lat: list[float]) -> int:
    steps = 0
    async with connect(url.replace("http://", "ws://") + "/ws", max_size=None, compression=None) as ws:
        for seed in seeds:
            await ws.send(json.dumps({"type": "reset", "data": {"env_id": env_id, "seed": seed}}))
            json.loads(await ws.recv())
            for action in plans[seed]:
                t = time.perf_counter()
                await ws.send(json.dumps({"type": "step", "data": {"message": action}}))
                reply = json.loads(await ws.recv())
                lat.append(time.perf_counter() - t)
                steps += 1
                assert reply["type"] == "observation", reply
            assert reply["data"]["done"] and reply["data"]["reward"] == 1.0, reply["data"]
    return steps


async def http_session(url: str, client: httpx.AsyncClient, env_id: str, plans: dict, seeds: list[int],
                       lat: list[float]) -> int:
    steps, rid = 0, 0

    async def rpc(method: str, params: dict) -> dict:
        nonlocal rid
        rid += 1
        r = await client.post(url + "/mcp", json={"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
        return r.json()

    sid = (await rpc("openenv/session/create", {}))["result"]["session_id"]
    try:
        for seed in seeds:
            async with connect(url.replace("http://", "ws://") + f"/ws?session_id={sid}", max_size=None, compression=None) as ws:
                await ws.send(json.dumps({"type": "reset", "data": {"env_id": env_id, "seed": seed}}))
                json.loads(await ws.recv())
            for action in plans[seed]:
                name, arguments = as_mcp(action)
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


async def run_config(transport: str, url: str, env_id: str, plans: dict, n: int, episodes: int) -> dict:
    seeds = sorted(plans)
    lat: list[float] = []
    per = [[seeds[(i * episodes + k) % len(seeds)] for k in range(episodes)] for i in range(n)]
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.perf_counter()
        if transport == "ws":
            counts = await asyncio.gather(*(ws_session(url, env_id, plans, s, lat) for s in per))
        else:
            counts = await asyncio.gather(*(http_session(url, client, env_id, plans, s, lat) for s in per))
        wall = time.perf_counter() - start
    steps = sum(counts)
    return {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99), "throughput": steps / wall, "cost": wall / steps,
            "steps": steps}


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
                             str(max_sessions), "--idle-timeout", "0", "--log-level", "warning"], env=env)
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
    ap.add_argument("--episodes", type=int, default=6, help="episodes per session (default: 6)")
    ap.add_argument("--seeds", type=int, default=64, help="distinct seeds (default: 64)")
    ap.add_argument("--transports", nargs="+", default=["ws", "http"], choices=["ws", "http"])
    args = ap.parse_args()

    plans, inproc_lat, inproc_tp = oracle_plans(args.env_id, range(args.seeds))
    in50, in99 = pct(inproc_lat, 0.5), pct(inproc_lat, 0.99)
    print(f"{args.env_id}: {len(plans)} oracle episodes, {len(inproc_lat)} steps "
          f"({len(inproc_lat) / len(plans):.1f} per episode)")
    print(f"in-process env.step: p50 {in50 * 1e3:.3f} ms, p99 {in99 * 1e3:.3f} ms, "
          f"{inproc_tp:.0f} steps/s (resets included), cost {1e3 / inproc_tp:.3f} ms/step\n")
    proc, url = start_server(max(args.sessions) + 4)
    rows = []
    try:
        for transport in args.transports:
            for n in args.sessions:
                asyncio.run(run_config(transport, url, args.env_id, plans, n, 1))  # warm-up (connections, caches)
                cpu = cpu_seconds(proc.pid)
                r = asyncio.run(run_config(transport, url, args.env_id, plans, n, args.episodes))
                r["server_cpu"] = (cpu_seconds(proc.pid) - cpu) / r["steps"]
                rows.append((transport, n, r))
                stats = httpx.get(url + "/trace/stats", timeout=10).json()
                assert stats["sessions"] == 0, stats  # every session was freed
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    head = (f"{'transport':9} {'sessions':>8} {'steps':>6} {'p50 ms':>8} {'p99 ms':>8} {'p50 ×':>7} "
            f"{'p50 +ms':>8} {'steps/s':>8} {'tput ×':>7} {'ms/step':>8} {'cost +ms':>8} {'srv cpu':>8}")
    print(head)
    print("-" * len(head))
    for transport, n, r in rows:
        print(f"{transport:9} {n:8d} {r['steps']:6d} {r['p50'] * 1e3:8.3f} {r['p99'] * 1e3:8.3f} "
              f"{r['p50'] / in50:7.0f} {(r['p50'] - in50) * 1e3:8.3f} {r['throughput']:8.0f} "
              f"{r['throughput'] / inproc_tp:7.3f} {r['cost'] * 1e3:8.3f} {(r['cost'] - 1 / inproc_tp) * 1e3:8.3f} "
              f"{r['server_cpu'] * 1e3:8.3f}")
    print("\np50 ×, tput ×: ratios to in-process env.step; p50 +ms: latency overhead (queueing behind the other "
          "sessions included);\ncost +ms: wall time per step beyond in-process (the saturated server's work per "
          "step, client work on the same cores included);\nsrv cpu: the server process's CPU ms per step (resets included; "
          "in-process, a step and its share of resets cost 'ms/step' of the anchor).")
    goal = next((r for t, n, r in rows if t == "ws" and n == 16), None)
    if goal is not None:
        print(f"goal (p50 overhead ≤ 1 ms at 16 sessions, WebSocket): latency overhead "
              f"{(goal['p50'] - in50) * 1e3:.3f} ms, cost overhead {(goal['cost'] - 1 / inproc_tp) * 1e3:.3f} ms, "
              f"server CPU {goal['server_cpu'] * 1e3:.3f} ms/step vs {1e3 / inproc_tp:.3f} in-process")


if __name__ == "__main__":
    main()
