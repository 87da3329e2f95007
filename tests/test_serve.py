"""``trace serve``: real clients against a real server on 127.0.0.1.

The server is OpenEnv's app (``create_app`` over :class:`TraceOpenEnv`) run by uvicorn in a thread
(one process, so the tests can count its sessions and envs) and, once, ``trace serve`` itself in a
subprocess. Episodes are played by each env's oracle: a local env of the same id and seed gives the
oracle policy, which is fed the *server's* observations, and the server's reward must be 1.0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import httpx
import pytest
from websockets.sync.client import connect

pytest.importorskip("openenv", reason="the serve extra (pip install 'trace-rl[serve]') is part of `all`")

from openenv.core import GenericEnvClient  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction  # noqa: E402
from openenv.core.mcp_client import MCPToolClient  # noqa: E402

from trace_envs.adapters.openenv_server import (  # noqa: E402
    ServerThread,
    TraceAction,
    TraceEnvClient,
    build_app,
)
from trace_envs.adapters.trl import USER_TOOL  # noqa: E402

from test_trl_adapter import trace_cache  # noqa: E402,F401 - the warmed-model cache fixture

TAU = "trace/tau_airline-v0"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server():
    with ServerThread(build_app(max_sessions=3, idle_timeout_s=60, max_message_bytes=64 * 1024)) as srv:
        yield srv


def _stats(srv) -> dict:
    return httpx.get(srv.url + "/trace/stats", timeout=10).json()


def _wait_idle(srv, sessions: int = 0, timeout: float = 20.0) -> dict:
    """Poll until the server holds ``sessions`` sessions (a disconnect is processed asynchronously)."""
    deadline = time.monotonic() + timeout
    while True:
        stats = _stats(srv)
        if stats["sessions"] == sessions or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def _ws_url(srv) -> str:
    return srv.url.replace("http://", "ws://") + "/ws"


class _Oracle:
    """The oracle of ``env_id``/``seed``, fed what the server shows (messages and tools as the env's info)."""

    def __init__(self, env_id: str, seed: int, **kwargs):
        self.env = gym.make(env_id, **kwargs)
        self.env.reset(seed=seed)
        self.policy = self.env.unwrapped.oracle()

    def __call__(self, text: str, messages: list, tools: list):
        return self.policy(text, {"messages": messages, "tools": tools})

    def close(self):
        self.env.close()


def _play_typed(client, env_id: str, seed: int, **reset_kwargs):
    oracle = _Oracle(env_id, seed)
    result = client.reset(env_id=env_id, seed=seed, **reset_kwargs)
    obs = result.observation
    assert obs.env_id == env_id and obs.seed == seed and obs.tool_schemas and obs.messages
    for _ in range(60):
        result = client.step(TraceAction(message=oracle(obs.text, obs.messages, obs.tool_schemas)))
        obs = result.observation
        if result.done:
            break
    oracle.close()
    return result


# ----------------------------------------------------------------------------- oracle episodes, every client


def test_openenv_client_plays_an_oracle_episode_to_reward_1(server):
    before = _stats(server)
    with TraceEnvClient(base_url=server.url).sync() as client:
        result = _play_typed(client, TAU, 3)
        assert result.done and result.reward == 1.0
        obs = result.observation
        assert obs.success is True and obs.termination == "user_stop"
        assert obs.reward_breakdown["db"] == 1.0 and obs.reward_breakdown["communicate"] == 1.0
        state = client.state()
        assert state.env_id == TAU and state.done and state.reward == 1.0 and state.step_count >= 2
        # After the end, a step is an error and the session still serves a new episode.
        with pytest.raises(RuntimeError, match="episode has ended"):
            client.step(TraceAction(message="hello?"))
        assert client.reset(env_id=TAU, seed=4).observation.seed == 4
    assert _wait_idle(server, before["sessions"])["gym_envs"] == before["gym_envs"] == 0


def test_generic_openenv_client_needs_no_trace_code(server):
    """OpenEnv's GenericEnvClient (plain dicts) plays the same episode: the wire format is OpenEnv's. With
    ``transcript: full`` every observation carries the whole transcript and the tools (no TRACE code to rebuild
    them from deltas)."""
    oracle = _Oracle(TAU, 5)
    with GenericEnvClient(base_url=server.url).sync() as client:
        result = client.reset(env_id=TAU, seed=5, transcript="full")
        for _ in range(60):
            o = result.observation
            result = client.step({"message": oracle(o["text"], o["messages"], o["tool_schemas"])})
            if result.done:
                break
    oracle.close()
    assert result.done and result.reward == 1.0 and result.observation["reward_breakdown"]["db"] == 1.0
    _wait_idle(server)


def _as_mcp_call(action) -> tuple[str, dict]:
    """An oracle action (an OpenAI message dict or text) as an MCP tool call."""
    from trace_envs.core.parsing import parse_action

    parsed = parse_action(action)
    if parsed.tool_calls:
        call = parsed.tool_calls[0]
        return call.name, dict(call.arguments)
    return USER_TOOL, {"message": parsed.content}


def test_mcp_tool_client_plays_an_oracle_episode_with_mcp_tool_calls(server):
    oracle = _Oracle(TAU, 6)
    with MCPToolClient(base_url=server.url).sync() as client:
        result = client.reset(env_id=TAU, seed=6)
        names = [t.name for t in client.list_tools(use_cache=False)]
        assert USER_TOOL in names and "get_reservation_details" in names and "reset" not in names
        text = result.observation.text
        messages, tools = result.observation.messages, result.observation.tool_schemas
        for _ in range(60):
            name, arguments = _as_mcp_call(oracle(text, messages, tools))
            result = client.step(CallToolAction(tool_name=name, arguments=arguments))
            obs = result.observation
            assert obs.error is None and obs.tool_name == name
            if result.done:
                break
            text = obs.result["data"]  # the tool's output or the user's reply (MCPToolClient keeps OpenEnv's fields)
    oracle.close()
    assert result.done and result.reward == 1.0
    _wait_idle(server)


def test_raw_websocket_client_plays_an_oracle_episode(server):
    oracle = _Oracle(TAU, 7)
    with connect(_ws_url(server)) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 7}}))
        reply = json.loads(ws.recv())
        assert reply["type"] == "observation"
        o = reply["data"]["observation"]
        transcript, tools = o["messages"], o["tool_schemas"]  # whole at reset
        for _ in range(60):
            action = oracle(o["text"], transcript, tools)
            ws.send(json.dumps({"type": "step", "data": {"message": action}}))
            reply = json.loads(ws.recv())
            assert reply["type"] == "observation", reply
            o = reply["data"]["observation"]
            # A step sends what is new (the default transcript mode, 'delta'): rebuild the transcript from it.
            transcript = transcript[:o["messages_from"]] + o["new_messages"]
            tools = o["tool_schemas"] or tools
            if reply["data"]["done"]:
                break
        data = reply["data"]
        assert data["done"] and data["reward"] == 1.0 and data["observation"]["success"] is True
        ws.send(json.dumps({"type": "close"}))
    oracle.close()
    _wait_idle(server)


def _local_episode(env_id: str, seed: int) -> tuple[list, list]:
    """The oracle's actions for ``seed`` and, after the reset and after each step, the local env's transcript
    and tools (as JSON, what a client receives)."""
    env = gym.make(env_id)
    obs, info = env.reset(seed=seed)
    policy = env.unwrapped.oracle()
    actions, infos = [], [json.loads(json.dumps({"messages": info["messages"], "tools": info["tools"]}))]
    while True:
        actions.append(policy(obs, info))
        obs, _, terminated, truncated, info = env.step(actions[-1])
        infos.append(json.loads(json.dumps({"messages": info["messages"], "tools": info["tools"]})))
        if terminated or truncated:
            break
    env.close()
    return actions, infos


def test_steps_send_the_transcript_as_a_delta_and_whole_on_request(server):
    """By default a step's observation carries only the messages new this turn (``new_messages`` from index
    ``messages_from``) and no tool schemas; the whole transcript and the tools come at reset. A reset with
    ``transcript: full`` gets both whole on every step. Either way the client's transcript equals the local
    env's after every step, and the typed client rebuilds it on its own."""
    actions, infos = _local_episode(TAU, 12)
    sizes = {}
    for mode in ("delta", "full"):
        with connect(_ws_url(server), max_size=None) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 12, "transcript": mode}}))
            o = json.loads(ws.recv())["data"]["observation"]
            assert o["messages"] == o["new_messages"] == infos[0]["messages"] and o["messages_from"] == 0
            assert o["tool_schemas"] == infos[0]["tools"]
            transcript, sizes[mode] = o["messages"], []
            for action, local in zip(actions, infos[1:]):
                ws.send(json.dumps({"type": "step", "data": {"message": action}}))
                raw = ws.recv()
                sizes[mode].append(len(raw))
                o = json.loads(raw)["data"]["observation"]
                assert o["messages_from"] == len(transcript) and o["new_messages"]  # only appends in a τ² episode
                transcript = transcript[:o["messages_from"]] + o["new_messages"]
                assert transcript == local["messages"]
                if mode == "full":
                    assert o["messages"] == local["messages"] and o["tool_schemas"] == local["tools"]
                else:
                    assert o["messages"] == [] and o["tool_schemas"] == []
    # A step's delta observation is a small fraction of the full one (the tool schemas alone are ~10 kB).
    assert max(sizes["delta"]) * 4 < min(sizes["full"]), sizes
    with TraceEnvClient(base_url=server.url).sync() as client:  # the typed client rebuilds the whole transcript
        result = client.reset(env_id=TAU, seed=12)
        for action, local in zip(actions, infos[1:]):
            result = client.step(action)
            obs = result.observation
            assert obs.messages == local["messages"] and obs.tool_schemas == local["tools"]
        assert result.done and result.reward == 1.0
        result = client.reset(env_id=TAU, seed=12, transcript="full")  # the same, whole on the wire
        result = client.step(actions[0])
        assert result.observation.messages == infos[1]["messages"]
        with pytest.raises(RuntimeError, match="'transcript' must be one of 'delta', 'full'"):
            client.reset(env_id=TAU, seed=12, transcript="everything")
    _wait_idle(server)


def test_a_server_started_with_transcript_full_sends_it_whole_by_default():
    actions, infos = _local_episode(TAU, 13)
    with ServerThread(build_app([TAU], transcript="full", idle_timeout_s=None)) as srv:
        assert _stats(srv)["transcript"] == "full"
        with GenericEnvClient(base_url=srv.url).sync() as client:
            client.reset(seed=13)
            o = client.step({"message": actions[0]}).observation
            assert o["messages"] == infos[1]["messages"] and o["tool_schemas"] == infos[1]["tools"]
            client.reset(seed=13, transcript="delta")  # a session may still ask for deltas
            o = client.step({"message": actions[0]}).observation
            assert o["messages"] == [] and o["new_messages"] == infos[1]["messages"][o["messages_from"]:]
    with pytest.raises(ValueError, match="'transcript' must be one of"):
        build_app([TAU], transcript="all")


class _SlowUserModel:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers every request after ``delay`` seconds: the
    LLM user of a τ² env whose steps block (as a real user model's do)."""

    def __init__(self, delay: float):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay)
                body = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "user",
                                   "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                       "role": "assistant", "content": "Thanks, that is all. ###STOP###"}}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_step_that_blocks_does_not_stall_the_other_sessions(server):
    """A τ² env with the scripted user declares ``nonblocking_step`` and steps on the server's event loop; one
    with an LLM user does not (its step waits on the user model), so it steps in a worker thread and another
    session's steps go on meanwhile."""
    user = _SlowUserModel(delay=2.0)
    scripted, llm = gym.make(TAU), gym.make(TAU, user={"base_url": user.url, "model": "user"})
    assert scripted.unwrapped.nonblocking_step and not llm.unwrapped.nonblocking_step
    scripted.close(), llm.close()
    try:
        with connect(_ws_url(server)) as slow, connect(_ws_url(server)) as fast:
            slow.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 0, "env_kwargs": {
                "user": {"base_url": user.url, "model": "user"}}}}))
            assert json.loads(slow.recv())["type"] == "observation"
            fast.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 0}}))
            assert json.loads(fast.recv())["type"] == "observation"
            started = time.monotonic()
            slow.send(json.dumps({"type": "step", "data": {"message": "Hello! How can I help?"}}))
            time.sleep(0.2)  # the slow step is waiting on the user model now
            for _ in range(3):
                fast.send(json.dumps({"type": "step", "data": {"message": "Hello! How can I help?"}}))
                assert json.loads(fast.recv(timeout=10))["type"] == "observation"
            fast_done = time.monotonic() - started
            reply = json.loads(slow.recv(timeout=30))
            slow_done = time.monotonic() - started
        assert reply["type"] == "observation", reply
        assert reply["data"]["done"] and reply["data"]["observation"]["termination"] == "user_stop"
        assert slow_done >= 2.0 and fast_done < 1.5, (fast_done, slow_done)
    finally:
        user.close()
    _wait_idle(server)


def test_json_rpc_over_http_in_an_openenv_session(server):
    """HTTP: an OpenEnv MCP session (openenv/session/create), reset over a WebSocket attached to it, tool
    calls as JSON-RPC POSTs carrying ``done``/``reward`` in ``_meta``; closing the session frees its env."""
    rpc = lambda method, params, i: httpx.post(server.url + "/mcp", json={  # noqa: E731
        "jsonrpc": "2.0", "method": method, "params": params, "id": i}, timeout=30).json()
    sid = rpc("openenv/session/create", {}, 1)["result"]["session_id"]
    with connect(_ws_url(server) + f"?session_id={sid}") as ws:
        ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 8}}))
        assert json.loads(ws.recv())["type"] == "observation"
    listed = rpc("tools/list", {"session_id": sid}, 2)["result"]["tools"]
    assert {t["name"] for t in listed} >= {"get_user_details", USER_TOOL}
    schema = next(t for t in listed if t["name"] == "get_user_details")["inputSchema"]
    assert schema["required"] == ["user_id"]
    reply = rpc("tools/call", {"session_id": sid, "name": "get_user_details",
                               "arguments": {"user_id": "nobody_0000"}}, 3)["result"]
    assert "Error" in reply["content"][0]["text"] and reply["meta"]["done"] is False
    reply = rpc("tools/call", {"session_id": sid, "name": USER_TOOL, "arguments": {"message": "Hello!"}}, 4)
    assert reply["result"]["content"][0]["text"]  # the user's reply
    assert _stats(server)["sessions"] == 1
    assert rpc("openenv/session/close", {"session_id": sid}, 5)["result"]["closed"] is True
    assert _wait_idle(server)["gym_envs"] == 0


# ----------------------------------------------------------------------------- bad input: clear errors, still serving


def _error(ws) -> dict:
    reply = json.loads(ws.recv())
    assert reply["type"] == "error", reply
    return reply["data"]


def test_bad_input_gets_clear_errors_and_the_session_keeps_serving(server):
    before = _stats(server)
    with connect(_ws_url(server)) as ws:
        ws.send("{not json")
        assert _error(ws)["code"] == "INVALID_JSON"
        ws.send(json.dumps({"type": "reset", "data": {"env_id": "trace/no_such_env-v0", "seed": 0}}))
        err = _error(ws)
        assert "unknown env id 'trace/no_such_env-v0'" in err["message"] and TAU in err["message"]
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert "reset needs 'env_id'" in _error(ws)["message"]
        ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": "zero"}}))
        assert "'seed' must be an integer" in _error(ws)["message"]
        ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "no_such_kwarg": 1}}))
        assert "does not take these kwargs" in _error(ws)["message"]
        ws.send(json.dumps({"type": "step", "data": {"message": "hi"}}))
        assert "step before reset" in _error(ws)["message"]
        ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 1}}))
        assert json.loads(ws.recv())["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"action": "hi"}}))  # wrong shape: no such field
        err = _error(ws)
        assert err["code"] == "VALIDATION_ERROR" and err["errors"]
        ws.send(json.dumps({"type": "step", "data": {"message": 42}}))
        assert _error(ws)["code"] == "VALIDATION_ERROR"
        ws.send(json.dumps({"type": "step", "data": {"type": "call_tool"}}))
        assert "needs 'tool_name'" in json.dumps(_error(ws))
        ws.send(json.dumps({"type": "dance"}))
        assert _error(ws)["code"] == "UNKNOWN_TYPE"
        # A malformed tool call inside a valid action is the agent's mistake: an observation, not an error.
        ws.send(json.dumps({"type": "step", "data": {"message": "<tool_call>{broken</tool_call>"}}))
        reply = json.loads(ws.recv())
        assert reply["type"] == "observation" and reply["data"]["observation"]["text"].startswith("Error:")
        assert reply["data"]["done"] is False
    assert _wait_idle(server, before["sessions"])["gym_envs"] == 0


def test_an_oversized_message_is_refused_and_the_server_keeps_serving(server):
    with connect(_ws_url(server), max_size=None) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 0}}))
        assert json.loads(ws.recv())["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {"message": "x" * (100 * 1024)}}))
        err = _error(ws)
        assert err["code"] == "MESSAGE_TOO_LARGE" and "exceeds the limit of 65536 bytes" in err["message"]
        with pytest.raises(Exception):
            ws.recv(timeout=10)  # closed by the server
    assert _wait_idle(server)["gym_envs"] == 0
    big = httpx.post(server.url + "/mcp", content=b"{" + b" " * (70 * 1024) + b"}", timeout=10,
                     headers={"content-type": "application/json"})
    assert big.status_code == 413 and "exceeds the limit" in big.json()["detail"]
    assert httpx.get(server.url + "/health", timeout=10).json()["status"] == "healthy"


def test_sessions_past_the_cap_are_refused_and_freed_slots_are_reused(server):
    clients = [connect(_ws_url(server)).__enter__() for _ in range(3)]
    try:
        for ws in clients:
            ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 0}}))
            assert json.loads(ws.recv())["type"] == "observation"
        assert _stats(server)["sessions"] == 3
        with connect(_ws_url(server)) as extra:  # refused at connect: the error frame, then the close
            err = _error(extra)
            assert err["code"] == "CAPACITY_REACHED" and err["max_sessions"] == 3
    finally:
        clients[0].close()
    _wait_idle(server, 2)
    with connect(_ws_url(server)) as again:  # the freed slot serves a new client
        again.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 0}}))
        assert json.loads(again.recv())["type"] == "observation"
    for ws in clients[1:]:
        ws.close()
    assert _wait_idle(server)["gym_envs"] == 0


def test_a_client_that_disconnects_mid_episode_frees_its_session_and_env(server):
    before = _stats(server)
    ws = connect(_ws_url(server)).__enter__()
    ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 2}}))
    ws.recv()
    ws.send(json.dumps({"type": "step", "data": {"message": "Hi, how can I help?"}}))
    ws.recv()
    assert _stats(server)["gym_envs"] == before["gym_envs"] + 1
    ws.socket.close()  # gone without a close handshake
    stats = _wait_idle(server, before["sessions"])
    assert stats["sessions"] == before["sessions"] and stats["gym_envs"] == before["gym_envs"]


def test_the_token_is_required_on_every_request_when_set():
    with ServerThread(build_app([TAU], token="s3cret", idle_timeout_s=None)) as srv:
        assert httpx.get(srv.url + "/health", timeout=10).status_code == 401
        wrong = httpx.get(srv.url + "/health", headers={"Authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401 and "bearer token" in wrong.json()["detail"]
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.get(srv.url + "/health", headers=auth, timeout=10).status_code == 200
        with connect(_ws_url(srv)) as ws:
            assert _error(ws)["code"] == "UNAUTHORIZED"
        with pytest.raises(Exception, match="bearer token"):
            with TraceEnvClient(base_url=srv.url).sync() as client:
                client.reset(seed=0)
        with TraceEnvClient(base_url=srv.url, headers=auth).sync() as client:
            assert client.reset(seed=0).observation.env_id == TAU  # the one served id is the default
            with pytest.raises(RuntimeError, match="not served here"):
                client.reset(env_id="trace/tau_retail-v0", seed=0)
        assert httpx.get(srv.url + "/trace/stats", headers=auth, timeout=10).json()["sessions"] == 0 or \
            _wait_idle_auth(srv, auth)


def _wait_idle_auth(srv, headers) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if httpx.get(srv.url + "/trace/stats", headers=headers, timeout=10).json()["sessions"] == 0:
            return True
        time.sleep(0.05)
    return False


def test_an_idle_session_is_closed_and_freed():
    with ServerThread(build_app(idle_timeout_s=0.5)) as srv:
        with connect(_ws_url(srv)) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"env_id": TAU, "seed": 0}}))
            assert json.loads(ws.recv())["type"] == "observation"
            assert _stats(srv)["gym_envs"] == 1
            err = _error(ws)  # nothing sent for 0.5 s
            assert err["code"] == "IDLE_TIMEOUT"
        assert _wait_idle(srv)["gym_envs"] == 0


# ----------------------------------------------------------------------------- a generated env, `trace serve` itself


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> tuple[Path, str]:
    """A workspace with one env rendered by the offline generator (admission is tests/test_generate.py's)."""
    from generators.offline import render
    from generators.static import static_check
    from generators.workspace import Workspace

    ws = Workspace(tmp_path_factory.mktemp("serve_ws") / "ws")
    name = ws.env_name("precondition_verification", "tau_airline")
    env_id = ws.env_id(name, 0)
    rendered = render({"name": "precondition_verification", "target_env": TAU, "definition": "check first"},
                      env_id=env_id, run_id="test-serve")
    findings, registration = static_check(rendered.source)
    assert registration is not None and not any(findings.values()), findings
    ws.install(rendered.source, registration, capability="precondition_verification", name=name, version=0,
               target="tau_airline", origin="generated:test-serve")
    return ws.root, env_id


def test_trace_serve_serves_a_generated_workspace_env_and_stops_cleanly(workspace, restore_registry):
    """``trace serve`` in a subprocess, the workspace known only through TRACE_REGISTRY."""
    import socket

    root, env_id = workspace
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TRACE_REGISTRY": str(root), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trace_train.cli", "serve", "--port", str(port),
                             "--log-level", "warning"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:  # readiness: /health answers
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "trace serve did not come up"
            time.sleep(0.1)
        from trace_envs.core.registry import load_registry

        load_registry(root)  # the oracle's local copy of the env
        with TraceEnvClient(base_url=url).sync() as client:
            result = _play_typed(client, env_id, 11)
        assert result.done and result.reward == 1.0
        metadata = httpx.get(url + "/metadata", timeout=10).json()
        assert env_id in metadata["description"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
    # uvicorn shuts down gracefully (the lifespan hook closes the sessions), then re-raises the SIGTERM it caught.
    assert proc.returncode in (0, -signal.SIGTERM), out
    assert "trace serve: stopped; closed 0 open session(s)" in out, out


def test_trace_serve_help_and_argument_errors():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = lambda *a: subprocess.run([sys.executable, "-m", "trace_train.cli", "serve", *a],  # noqa: E731
                                    capture_output=True, text=True, env=env, timeout=120)
    help_ = run("--help")
    assert help_.returncode == 0 and "--max-sessions" in help_.stdout and "127.0.0.1" in help_.stdout
    bad = run("trace/no_such_env-v0")
    assert bad.returncode == 2 and "unknown env id 'trace/no_such_env-v0'" in bad.stderr


def test_openenv_yaml_is_valid_for_openenv():
    import yaml

    spec = yaml.safe_load((ROOT / "openenv.yaml").read_text())
    assert spec["name"] == "trace" and spec["app"] == "trace_envs.adapters.openenv_server:app"
    assert spec["port"] == 8000 and spec["runtime"] == "fastapi"
    from openenv.validation.parsers.openenv_yaml import OpenEnvYamlParser

    manifest = OpenEnvYamlParser().parse(ROOT)  # OpenEnv's own parser and schema
    assert manifest.name == "trace" and manifest.reward.range == (0.0, 1.0)
    from trace_envs.adapters import openenv_server

    assert callable(openenv_server.app_from_environment)  # what `app` resolves to (built lazily)


def test_trl_environment_factory_runs_its_episodes_on_the_server(server):
    """TRL's environment_factory class with ``server_url``: the tools and the user tool step a server
    session, and ``get_reward`` is the server's reward (the id need not be registered client-side)."""
    from trace_envs.adapters import trl as adapter
    from trace_envs.adapters.openenv_server import RemoteTraceEnv

    factory = adapter.environment_factory(TAU, server_url=server.url)
    local = adapter.environment_factory(TAU)
    assert factory.tool_schemas == local.tool_schemas  # the same tools, read from the server's episode
    env = factory()
    oracle = _Oracle(TAU, 9)
    opening = env.reset(seed=9, prompt=[])
    assert isinstance(env.env, RemoteTraceEnv) and opening and _stats(server)["gym_envs"] == 1
    for _ in range(60):
        name, arguments = _as_mcp_call(oracle("", env.messages, factory.tool_schemas))
        getattr(env, name)(**arguments)
        if env.done:
            break
    oracle.close()
    assert env.get_reward() == 1.0 and env.termination == "user_stop"
    assert env.trajectory["reward_breakdown"]["db"] == 1.0
    env._close()
    assert _wait_idle(server)["gym_envs"] == 0


def test_grpo_trainer_runs_two_steps_through_the_server(tmp_path, trace_cache):
    """TRL's GRPOTrainer, the nano model warmed as in tests/test_trl_adapter.py, every rollout a session of
    ``trace serve``: TRL logs the server's rewards, and each equals a local replay of the same turns."""
    pytest.importorskip("trl")
    import statistics

    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from test_trl_adapter import (COMPLETION_MARGIN, EXAMPLE, ROLLOUTS_PER_STEP, _grpo_env_kwargs, _replay_reward,
                                  _warm_model)
    from trace_envs.adapters import trl as adapter
    from trace_envs.adapters.openenv_server import RemoteTraceEnv

    torch.set_num_threads(1)
    env_kwargs = _grpo_env_kwargs(EXAMPLE)
    model_path, seeds, completion_tokens = _warm_model(EXAMPLE, adapter.environment_factory(EXAMPLE, **env_kwargs),
                                                       env_kwargs)
    calls: list[dict] = []
    with ServerThread(build_app([EXAMPLE])) as srv:
        base = adapter.environment_factory(EXAMPLE, server_url=srv.url, **env_kwargs)

        class Recorded(base):
            def get_reward(self):
                value = super().get_reward()
                calls.append({"reward": value, "seed": self._seed, "messages": self.messages,
                              "termination": self.termination, "remote": isinstance(self.env, RemoteTraceEnv)})
                return value

        Recorded.__name__ = Recorded.__qualname__ = base.__name__
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        steps = trace_envs_entry_steps(EXAMPLE)
        args = GRPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=ROLLOUTS_PER_STEP,
                          num_generations=2, max_completion_length=completion_tokens + COMPLETION_MARGIN,
                          max_tool_calling_iterations=steps, temperature=0.2, learning_rate=1e-4, beta=0.0,
                          logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                          gradient_checkpointing=False, seed=0, disable_tqdm=True)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args,
                              train_dataset=adapter.make_dataset(EXAMPLE, seeds=seeds, env_kwargs=env_kwargs),
                              environment_factory=Recorded,
                              peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     task_type="CAUSAL_LM"))
        trainer.train()
        assert _stats(srv)["sessions"] >= 1  # TRL keeps its pooled instances (their sessions) open
    assert len(calls) == 2 * ROLLOUTS_PER_STEP and all(c["remote"] for c in calls)
    key = f"rewards/{base.__name__}"
    logged = [entry for entry in trainer.state.log_history if f"{key}/mean" in entry]
    assert len(logged) == 2
    for step, entry in enumerate(logged):
        batch = [c["reward"] for c in calls[ROLLOUTS_PER_STEP * step: ROLLOUTS_PER_STEP * (step + 1)]]
        assert entry[f"{key}/mean"] == pytest.approx(statistics.fmean(batch), abs=1e-6)
    for c in calls:  # the server's reward is the env's: a local replay of the model's turns agrees
        assert c["reward"] == pytest.approx(_replay_reward(EXAMPLE, c["seed"], c["messages"], env_kwargs)[0])
    assert any(c["reward"] > 0 for c in calls), [(c["seed"], c["termination"]) for c in calls]


def trace_envs_entry_steps(env_id: str) -> int:
    import trace_envs

    return trace_envs.get_entry(env_id).max_episode_steps or 20


# ----------------------------------------------------------------------------- SWE sessions: their sandboxes go with them


FIXTURE = Path(__file__).parent / "fixtures"
MINICALC_KW = {"repos": ["minicalc"], "instances_dir": str(FIXTURE / "minicalc_instances")}


@pytest.fixture(scope="module")
def minicalc():
    from trace_envs.swe.repos import RepoSpec, materialize, save_repo

    spec = RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",))
    save_repo(spec)
    return materialize(spec)


def _swe_session(srv, sandbox: str):
    """An SWE episode on the server, one tool call in; returns (socket, the session's env)."""
    ws = connect(_ws_url(srv), max_size=None).__enter__()
    ws.send(json.dumps({"type": "reset", "data": {"env_id": "trace/swe_repo-v0", "seed": 0,
                                                  "env_kwargs": {"sandbox": sandbox, **MINICALC_KW}}}))
    reply = json.loads(ws.recv(timeout=300))
    assert reply["type"] == "observation", reply
    names = [t["function"]["name"] for t in reply["data"]["observation"]["tool_schemas"]]
    tool = "list_files" if "list_files" in names else names[0]
    ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": tool, "arguments": {}}}))
    assert json.loads(ws.recv(timeout=120))["type"] == "observation"
    [adapter] = [a for a in srv.app.live.snapshot() if a.gym_env is not None]
    env = adapter.gym_env.unwrapped
    assert env.open_resources(), "the SWE episode holds a sandbox"
    return ws, env


def test_an_swe_session_closes_its_sandbox_when_the_client_disconnects(minicalc):
    with ServerThread(build_app(["trace/swe_repo-v0"])) as srv:
        with pytest.warns(RuntimeWarning):  # the local sandbox says it isolates nothing
            ws, env = _swe_session(srv, "local")
        ws.socket.close()  # gone mid-episode, no close handshake
        assert _wait_idle(srv)["gym_envs"] == 0
        assert env.open_resources() == []


def _need_docker() -> None:
    from conftest import REQUIREMENT_CHECKS, allowed_missing

    ok, why = REQUIREMENT_CHECKS["docker"]()
    if not ok:
        if "docker" in allowed_missing():
            pytest.skip(why)
        pytest.fail(f"this test needs Docker ({why}); run scripts/setup_docker.sh or set TRACE_ALLOW_MISSING=docker")
    from trace_envs.swe.images import base_image_tag, build_base_image, docker_client, image_exists

    if not image_exists(docker_client(), base_image_tag()):
        build_base_image(verbose=True)


def _our_containers() -> list:
    from trace_envs.swe.sandbox import labelled_containers

    return [c for c in labelled_containers(all_owners=True) if c.status != "removing"]


def test_an_swe_sessions_container_is_removed_on_disconnect_and_after_a_sigkill(minicalc, tmp_path):
    """Docker sandboxes: a session's container goes when its client leaves; when the server is SIGKILLed, the
    existing cleanup (``trace swe cleanup --only-dead``: the owner pid label) finds and removes what it left."""
    _need_docker()
    from trace_envs.swe.sandbox import cleanup_containers

    before = {c.id for c in _our_containers()}
    with ServerThread(build_app(["trace/swe_repo-v0"])) as srv:
        ws, env = _swe_session(srv, "docker")
        assert {c.id for c in _our_containers()} - before, "the session started a container"
        ws.socket.close()
        assert _wait_idle(srv)["gym_envs"] == 0 and env.open_resources() == []
    deadline = time.monotonic() + 30
    while {c.id for c in _our_containers()} - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not {c.id for c in _our_containers()} - before

    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env_vars = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "trace_train.cli", "serve", "trace/swe_repo-v0", "--port",
                             str(port), "--log-level", "warning"], env=env_vars, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with connect(url.replace("http://", "ws://") + "/ws", max_size=None) as ws:
            ws.send(json.dumps({"type": "reset", "data": {"seed": 0, "env_kwargs": {"sandbox": "docker",
                                                                                    **MINICALC_KW}}}))
            assert json.loads(ws.recv(timeout=300))["type"] == "observation"
            ws.send(json.dumps({"type": "step", "data": {"type": "call_tool", "tool_name": "list_files",
                                                         "arguments": {}}}))
            assert json.loads(ws.recv(timeout=120))["type"] == "observation"
            left = {c.id for c in _our_containers()} - before
            assert left, "the server's session started a container"
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert left <= {c.id for c in _our_containers()}  # a SIGKILLed owner cleans up nothing itself
    cleanup_containers(only_dead_owners=True)
    deadline = time.monotonic() + 30
    while left & {c.id for c in _our_containers()} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left & {c.id for c in _our_containers()}


def test_http_client_mistakes_get_a_4xx_that_names_the_fix(server):
    # Issue 58: these were 500s with a traceback in the server's log.
    unknown = httpx.post(server.url + "/reset", json={"env_id": "trace/nope-v0", "seed": 0}, timeout=30)
    assert unknown.status_code == 404, unknown.text
    assert "unknown env id 'trace/nope-v0'; use one of the served ids: " in unknown.json()["detail"]
    assert "trace/tau_airline-v0" in unknown.json()["detail"]
    no_id = httpx.post(server.url + "/reset", json={"seed": 0}, timeout=30)
    assert no_id.status_code == 400 and "reset needs 'env_id'" in no_id.json()["detail"], no_id.text
    kwargs = httpx.post(server.url + "/reset", json={"env_id": "trace/tau_airline-v0", "bogus": 1}, timeout=30)
    assert kwargs.status_code == 400 and "does not take these kwargs" in kwargs.json()["detail"], kwargs.text
    boolean = httpx.post(server.url + "/reset", json={"env_id": "trace/tau_airline-v0", "seed": True}, timeout=30)
    assert boolean.status_code == 422 and boolean.json()["detail"][0]["loc"] == ["body", "seed"], boolean.text

    step = httpx.post(server.url + "/step", json={"action": {"type": "message", "message": "hi"}}, timeout=30)
    assert step.status_code == 409, step.text
    detail = step.json()["detail"]
    assert detail.startswith("step before reset") and "stateless" in detail and "/ws" in detail, detail
    # A reset over HTTP still plays (and closes) its env, and the schema documents the client errors.
    ok = httpx.post(server.url + "/reset", json={"env_id": "trace/tau_airline-v0", "seed": 1}, timeout=30)
    assert ok.status_code == 200 and ok.json()["observation"]["env_id"] == "trace/tau_airline-v0"
    paths = httpx.get(server.url + "/openapi.json", timeout=30).json()["paths"]
    assert {"400", "404", "409"} <= set(paths["/reset"]["post"]["responses"])
    assert "409" in paths["/step"]["post"]["responses"]
    assert not [p for p in paths if p.startswith("/{env_name}/")]  # OpenEnv's Task API (501 here) is not offered
    assert httpx.get(server.url + "/trace/splits", timeout=30).status_code == 404
