"""verifiers (0.4, PyPI) evaluates TRACE envs through the example taskset ``examples/verifiers_trace``.

verifiers 0.4 pins ``mcp==2.0.0`` and ``openai<3``, which the project's own environment cannot take
beside openenv (``mcp<2``), so the evaluation runs in a venv of its own: built once with
``python -m venv`` under ``~/.cache/trace/verifiers-venv/<hash>`` (keyed by the example's and the
repository's dependency lists), holding verifiers, uv and TRACE's core dependencies; this checkout's
code reaches it through ``PYTHONPATH``. ``vf-eval`` runs there in a subprocess against a model on
127.0.0.1 and writes ``traces.jsonl``, which is checked here against TRACE itself:

* the tiny model, served by ``transformers serve``: every seed's rollout completes, and its reward is
  what a fresh TRACE env gives the same tool calls replayed through TRACE's TRL adapter, with the
  same transcript;
* a scripted endpoint that answers with the oracle's tool calls: every seed reaches reward 1.0.

``transformers serve`` (5.x) ends a chat stream without the ``data: [DONE]`` sentinel that
verifiers' interception requires, so the model is reached through :class:`OpenAIEndpoint`, a
loopback relay that forwards every request and adds the sentinel (nothing else changes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from trace_envs import OracleAgent, rollout
from trace_envs.adapters import trl as adapter

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "examples" / "verifiers_trace"
EXAMPLE = "examples/warehouse_stock-v0"
SEEDS = [0, 1, 2]


# ----------------------------------------------------------------------------- the verifiers venv


def _venv_requirements() -> list[str]:
    """verifiers' side of the example package plus TRACE's core dependencies (the repo itself comes by PYTHONPATH)."""
    example = tomllib.loads((PACKAGE / "pyproject.toml").read_text())["project"]["dependencies"]
    core = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d for d in example if not d.startswith("trace-rl")] + core


@pytest.fixture(scope="module")
def verifiers_python() -> Path:
    """The venv's python, built on first use (a few minutes: verifiers has many dependencies) and then reused."""
    requirements = _venv_requirements()
    key = hashlib.sha256(json.dumps([requirements, sys.version_info[:2]]).encode()).hexdigest()[:16]
    venv = Path(os.environ.get("TRACE_VERIFIERS_VENV", Path.home() / ".cache" / "trace" / "verifiers-venv")) / key
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session may be building the same venv
        if not (venv / ".ready").exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            out = subprocess.run([str(python), "-m", "pip", "install", "-q", *requirements],
                                 capture_output=True, text=True, timeout=1800)
            if out.returncode != 0:
                raise RuntimeError(f"installing {requirements} into {venv} failed:\n{out.stderr[-3000:]}")
            (venv / ".ready").write_text("\n".join(requirements) + "\n")
    return python


# ----------------------------------------------------------------------------- an OpenAI endpoint on loopback


class OpenAIEndpoint:
    """``/v1/chat/completions`` on 127.0.0.1: relayed to ``upstream``, or answered by ``script(messages)``.

    ``script`` returns the assistant message to send (``content`` and/or ``tool_calls``); it is
    streamed as one chunk. Streams always end with ``data: [DONE]``.
    """

    def __init__(self, upstream: str | None = None, script=None):
        self.upstream, self.script, self.requests = upstream, script, 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, b'{"object": "list", "data": []}', "application/json")

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                endpoint.requests += 1
                request = json.loads(body)
                if endpoint.script is not None:
                    return self._scripted(request)
                upstream = urllib.request.Request(endpoint.upstream + self.path.removeprefix("/v1"), data=body,
                                                  headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(upstream, timeout=600) as reply:
                    data = reply.read()
                    kind = reply.headers.get("Content-Type", "application/json")
                if request.get("stream") and b"data: [DONE]" not in data:
                    data = data.rstrip(b"\n") + b"\n\ndata: [DONE]\n\n"
                self._send(200, data, kind)

            def _scripted(self, request):
                message = endpoint.script(request["messages"])
                calls = [{"index": i, "id": f"call_{endpoint.requests}_{i}", "type": "function",
                          "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                         for i, c in enumerate(message.get("tool_calls") or ())]
                finish = "tool_calls" if calls else "stop"
                head = {"id": "scripted", "object": "chat.completion.chunk", "created": 0, "model": request["model"]}
                delta = {"role": "assistant", "content": message.get("content") or ""}
                if calls:
                    delta["tool_calls"] = calls
                chunks = [{**head, "choices": [{"index": 0, "delta": delta}]},
                          {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}]
                data = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self._send(200, data.encode(), "text/event-stream")

            def _send(self, status, data, kind):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ----------------------------------------------------------------------------- running vf-eval


def run_eval(python: Path, tmp_path: Path, endpoint: str, model: str, *, max_turns: int, max_tokens: int) -> list[dict]:
    """``vf-eval verifiers_trace`` on EXAMPLE's SEEDS in the verifiers venv; the traces it wrote."""
    config = tmp_path / "eval.toml"
    config.write_text(f"""model = {json.dumps(model)}
push = false
output_dir = {json.dumps(str(tmp_path / "out"))}
max_concurrent = 1

[client]
base_url = {json.dumps(endpoint)}
api_key_var = "TRACE_VF_API_KEY"

[sampling]
max_tokens = {max_tokens}
temperature = 0.0

[env.agent]
max_turns = {max_turns}

[env.taskset]
id = "verifiers_trace"
env_id = "{EXAMPLE}"
seeds = {json.dumps(SEEDS)}
""")
    env = {**os.environ, "TRACE_VF_API_KEY": "local", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",  # uv, for verifiers' chat harness
           "PYTHONPATH": os.pathsep.join([str(REPO), str(PACKAGE)]),
           "TRACE_REGISTRY": os.pathsep.join(filter(None, [os.environ.get("TRACE_REGISTRY"), str(REPO / "examples")]))}
    env.pop("VIRTUAL_ENV", None)
    out = subprocess.run([str(python.parent / "vf-eval"), "@", str(config), "--no-rich"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    files = list((tmp_path / "out").glob("*/traces.jsonl"))
    assert len(files) == 1, f"expected one run directory, found {files}\n{out.stderr[-2000:]}"
    return [json.loads(line) for line in files[0].read_text().splitlines() if line.strip()]


def rollout_of(episode: dict) -> dict:
    """The one agent trace of an episode record, checked to have run without errors."""
    assert episode["ok"] and not episode["errors"], episode["errors"]
    (trace,) = episode["traces"]
    assert not trace.get("errors"), trace.get("errors")
    return trace


def model_calls(trace: dict) -> list[tuple[str, dict]]:
    """The tool calls the model made in a verifiers trace, in order (name, arguments as sent)."""
    calls = []
    for node in trace["nodes"]:
        message = node.get("message") or {}
        if message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or ():
            function = call.get("function") or call
            arguments = function.get("arguments") or {}
            calls.append((function["name"], json.loads(arguments) if isinstance(arguments, str) else arguments))
    return calls


def replay(seed: int, calls: list[tuple[str, dict]]):
    """The same calls played on a fresh TRACE env through its TRL adapter (the env's own scoring)."""
    env = adapter.environment_factory(EXAMPLE)()
    env.reset(seed=seed)
    for name, arguments in calls:
        if name == adapter.USER_TOOL:
            if set(arguments) == {"message"}:
                env.send_message_to_user(arguments["message"])
        else:
            getattr(env, name)(**arguments)
    return env


def check_against_trace(episodes: list[dict]) -> list[dict]:
    """Every seed has one completed rollout whose reward and transcript are the TRACE env's own."""
    assert sorted(e["task"]["data"]["seed"] for e in episodes) == SEEDS
    records = []
    for episode in episodes:
        trace = rollout_of(episode)
        seed = episode["task"]["data"]["seed"]
        reward = trace["rewards"]["trace_reward"]["score"]
        reported = trace["info"]["trace_env"]
        env = replay(seed, model_calls(trace))
        assert reward == env.get_reward(), (seed, reward, env.get_reward(), model_calls(trace))
        assert reported["seed"] == seed and reported["done"] == env.done
        if model_calls(trace):  # the tool server reports after each call
            assert reported["messages"] == env.messages
            assert reported["reward_breakdown"] == env.reward_breakdown
        records.append({"seed": seed, "reward": reward, "calls": len(model_calls(trace)),
                        "termination": reported["termination"], "stop": trace["stop_condition"]})
    return records


# ----------------------------------------------------------------------------- the tests


@pytest.mark.slow
def test_tiny_model_served_by_transformers_serve(verifiers_python, transformers_server, model_dir, tmp_path):
    """vf-eval of the tiny model on a TRACE env: it completes for every seed, scored as TRACE scores it."""
    relay = OpenAIEndpoint(upstream=transformers_server)
    try:
        started = time.time()
        episodes = run_eval(verifiers_python, tmp_path, relay.url, model_dir, max_turns=4, max_tokens=64)
        elapsed = time.time() - started
    finally:
        relay.close()
    records = check_against_trace(episodes)
    assert relay.requests >= len(SEEDS)  # the model was asked (at least once per rollout)
    print(f"tiny model over verifiers: {records} in {elapsed:.0f} s")


def _oracle_script():
    """A policy that answers each request with the oracle's next call, keyed by what the env said so far."""
    plans: dict[tuple, dict] = {}
    for seed in SEEDS:
        reference = rollout(EXAMPLE, OracleAgent(), seed=seed)
        assert reference["reward"] == 1.0
        opening = next(m["content"] for m in reference["messages"] if m["role"] == "user")
        said: list[str] = []
        for m in adapter.to_trl_messages(reference["messages"], reference["termination"]):
            if m["role"] == "tool":
                said.append(m["content"])
            elif m["role"] == "assistant" and m.get("tool_calls"):
                step = {"tool_calls": [{"name": tc["function"]["name"],
                                        "arguments": json.loads(tc["function"]["arguments"])}
                                       for tc in m["tool_calls"]]}
                key = (opening, tuple(said))
                assert plans.setdefault(key, step) == step, f"two oracle plans disagree at {key}"

    def script(messages: list[dict]) -> dict:
        opening = next(m["content"] for m in messages if m["role"] == "user")
        said = tuple(m["content"] if isinstance(m["content"], str) else "".join(p.get("text", "") for p in m["content"])
                     for m in messages if m["role"] == "tool")
        return plans.get((opening, said), {"content": "I have nothing more to do."})

    return script


@pytest.mark.slow
def test_oracle_through_the_verifiers_env_reaches_reward_one(verifiers_python, tmp_path):
    """The same taskset, harness and tool server, with a scripted model playing the oracle: 1.0 on every seed."""
    endpoint = OpenAIEndpoint(script=_oracle_script())
    try:
        episodes = run_eval(verifiers_python, tmp_path, endpoint.url, "oracle", max_turns=16, max_tokens=64)
    finally:
        endpoint.close()
    records = check_against_trace(episodes)
    assert [r["reward"] for r in records] == [1.0] * len(SEEDS), records
    assert all(r["termination"] == "agent_stop" and r["calls"] >= 2 for r in records), records


MISTAKES = [("list_warehouses", {}), ("get_stock", {"warehouse_id": 7}), ("get_stock", {"wid": "WH-01"}),
            (adapter.USER_TOOL, {"text": "?"}),
            ("submit_total", {"total": -1}), ("submit_total", {"total": 0})]


@pytest.mark.slow
def test_bad_calls_reach_the_env_as_sent(verifiers_python, tmp_path):
    """Wrong argument types, unknown arguments and a wrong answer go to the TRACE env unvalidated by MCP: the env
    answers them with its own errors, and the reward (0) and transcript are what the env gives those calls."""

    def script(messages):
        turn = sum(m["role"] == "assistant" for m in messages)
        if turn >= len(MISTAKES):
            return {"content": "Done."}
        name, arguments = MISTAKES[turn]
        return {"tool_calls": [{"name": name, "arguments": arguments}]}

    endpoint = OpenAIEndpoint(script=script)
    try:
        episodes = run_eval(verifiers_python, tmp_path, endpoint.url, "mistakes", max_turns=16, max_tokens=64)
    finally:
        endpoint.close()
    records = check_against_trace(episodes)
    assert all(r["reward"] == 0.0 and r["termination"] == "agent_stop" and r["calls"] == len(MISTAKES)
               for r in records), records
    tool_texts = [m["content"] for m in rollout_of(episodes[0])["info"]["trace_env"]["messages"] if m["role"] == "tool"]
    assert tool_texts[1].startswith("Error: invalid arguments for get_stock")
    assert "unexpected argument 'wid'" in tool_texts[2]
