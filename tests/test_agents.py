"""Model-backed agents: OpenAIChatAgent against real loopback servers, HFAgent batched generation.

Two servers:
* ``transformers serve`` with the nano model (a real OpenAI-compatible server; needs fastapi + uvicorn);
* a small stdlib HTTP server that misbehaves on purpose (slow, 500s, malformed tool calls, non-JSON
  bodies), because a real model server cannot be made to fail on cue.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gymnasium as gym
import pytest

from trace_envs import OracleAgent

EXAMPLE = "examples/warehouse_stock-v0"


# ----------------------------------------------------------------------------- a misbehaving server


def _completion(message: dict, usage=(11, 7)) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "fake",
            "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}}


def _tool_message(name: str, arguments: str) -> dict:
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": "call_9", "type": "function", "function": {"name": name, "arguments": arguments}}]}


class FaultServer:
    """A loopback chat-completions server replaying a script of behaviours, one per request."""

    def __init__(self) -> None:
        self.script: list[str] = []
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner.lock:
                    owner.requests.append(body)
                    mode = owner.script.pop(0) if owner.script else "list"
                if mode == "slow":  # far slower than any client timeout in these tests
                    time.sleep(6)
                    mode = "list"
                if mode == "500":
                    self._send(500, {"error": {"message": "boom"}})
                elif mode == "400_unparsed":  # transformers serve (5.25) on a malformed tool call it generated
                    self._send(400, {"detail": "json parser could not parse region as JSON.\nContent: 'guess'"})
                elif mode == "400":  # transformers serve (5.25) on a prompt longer than the model's context
                    self._send(400, {"detail": "The prompt has 14965 tokens, but the model takes at most 8192, "
                                               "prompt and answer (`--max-model-len`)."})
                elif mode == "garbage":
                    self._send(200, b"<html>this is not json</html>")
                elif mode == "malformed_args":
                    self._send(200, _completion(_tool_message("get_stock", '{"warehouse_id": "WH-01"')))
                elif mode == "unknown_tool":
                    self._send(200, _completion(_tool_message("delete_everything", "{}")))
                elif mode == "text_call":
                    text = '<tool_call>\n{"name": "list_warehouses", "arguments": {}}\n</tool_call>'
                    self._send(200, _completion({"role": "assistant", "content": text}))
                else:
                    self._send(200, _completion(_tool_message("list_warehouses", "{}")))

            def _send(self, status, payload):
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def fault_server():
    server = FaultServer()
    yield server
    server.close()


def _env_after_reset(seed: int = 0):
    env = gym.make(EXAMPLE)
    obs, info = env.reset(seed=seed)
    return env, obs, info


def _agent(url: str, **kw):
    from trace_train.agents import OpenAIChatAgent

    kw.setdefault("timeout", 5.0)
    return OpenAIChatAgent("fake", base_url=url, backoff=0.01, **kw)


def test_openai_agent_tool_calls_and_token_accounting(fault_server):
    agent = _agent(fault_server.url)
    env, obs, info = _env_after_reset()
    action = agent(obs, info)
    assert action["tool_calls"][0]["function"]["name"] == "list_warehouses"
    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.startswith("<tool_response>") and "WH-01" in obs
    # The next request carries the tool call and its result in API form, and the schemas in `tools`.
    fault_server.script = ["text_call"]
    action = agent(obs, info)
    sent = fault_server.requests[-1]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][3]["tool_call_id"] == sent["messages"][2]["tool_calls"][0]["id"]
    assert {t["function"]["name"] for t in sent["tools"]} == {"list_warehouses", "get_stock", "submit_total"}
    assert "<tool_call>" in action  # a tool call written as text is passed on for the env's parser
    obs, *_ = env.step(action)
    assert obs.startswith("<tool_response>")
    assert agent.stats.calls == 2 and agent.stats.prompt_tokens == 22 and agent.stats.completion_tokens == 14
    env.close()
    agent.close()


def test_openai_agent_text_mode_replays_calls_as_text(fault_server):
    env, obs, info = _env_after_reset()
    oracle = OracleAgent()
    oracle.reset(env.unwrapped, obs, info)
    obs, _, _, _, info = env.step(oracle(obs, info))
    agent = _agent(fault_server.url, tool_mode="text")
    agent(obs, info)
    sent = fault_server.requests[-1]
    assert "tools" not in sent
    assert "<tools>" in sent["messages"][0]["content"]
    assert sent["messages"][2] == {"role": "assistant", "content":
                                   '<tool_call>\n{"name": "list_warehouses", "arguments": {}}\n</tool_call>'}
    assert sent["messages"][3]["role"] == "user" and sent["messages"][3]["content"].startswith("<tool_response>")
    env.close()


@pytest.mark.parametrize("mode, expect", [
    ("malformed_args", "not valid JSON"),
    ("unknown_tool", "delete_everything"),
])
def test_malformed_tool_calls_become_env_errors(fault_server, mode, expect):
    fault_server.script = [mode]
    agent = _agent(fault_server.url)
    env, obs, info = _env_after_reset()
    obs, reward, terminated, truncated, info = env.step(agent(obs, info))
    assert "Error" in obs or "error" in obs
    assert expect in obs
    assert not terminated and reward == 0.0
    env.close()


def test_server_errors_retry_then_become_readable_env_errors(fault_server):
    from trace_train.agents import is_agent_error

    # Two 500s then success: retried transparently.
    fault_server.script = ["500", "500"]
    agent = _agent(fault_server.url, max_retries=3)
    env, obs, info = _env_after_reset()
    action = agent(obs, info)
    assert isinstance(action, dict) and agent.stats.retries == 2 and agent.stats.errors == 0

    # A server that keeps failing: the turn becomes an error the env answers; nothing raises.
    fault_server.script = ["500"] * 10
    action = agent(obs, info)
    assert is_agent_error(action) and "500" in action and "4 attempts" in action
    obs2, reward, terminated, _, _ = env.step(action)
    assert obs2.startswith("Error:") and not terminated

    # A body that is not JSON.
    fault_server.script = ["garbage"]
    action = _agent(fault_server.url, max_retries=0)(obs, info)
    assert is_agent_error(action)
    assert env.step(action)[0].startswith("Error:")
    env.close()


def test_a_rejected_request_is_not_retried_and_says_why(fault_server):
    from trace_train.agents import is_agent_error

    env, obs, info = _env_after_reset()
    # A 400 for a reply the server generated and could not parse is the sample's fault: sampled again.
    fault_server.script = ["400_unparsed"]
    agent = _agent(fault_server.url, max_retries=2)
    assert isinstance(agent(obs, info), dict) and agent.stats.retries == 1 and len(fault_server.requests) == 2
    fault_server.requests.clear()
    # One request, and the server's reason (a FastAPI `detail`, which the SDK's own message leaves out) is in the
    # error the env answers.
    fault_server.script = ["400"]
    action = agent(obs, info)
    assert is_agent_error(action) and "(400)" in action and "takes at most 8192" in action
    assert len(fault_server.requests) == 1 and agent.stats.retries == 1
    assert env.step(action)[0].startswith("Error:")
    env.close()


def test_slow_server_times_out_and_the_episode_goes_on(fault_server):
    from trace_train.agents import is_agent_error
    from trace_train.rollouts import run_rollouts

    fault_server.script = ["slow", "slow"]
    agent = _agent(fault_server.url, timeout=0.4, max_retries=1)
    env, obs, info = _env_after_reset()
    t0 = time.perf_counter()
    action = agent(obs, info)
    # Two 0.4 s timeouts and one backoff, not the server's 6 s: the client gave up by itself.
    assert time.perf_counter() - t0 < 4.5
    assert is_agent_error(action) and "Timeout" in action
    env.close()
    # In a rollout, the server recovers after the slow replies: the episodes complete and count the errors.
    fault_server.script = ["slow"] * 4  # both episodes' first turn: the request and its retry time out
    summary = run_rollouts(EXAMPLE, agent, seeds=[0, 1], in_flight=2, progress=False, keep_records=True,
                           max_steps=4)
    assert summary.ran == 2
    assert [r["agent_errors"] for r in summary.records] == [1, 1]
    assert all(r["steps"] == 4 for r in summary.records)


def test_concurrency_limit_is_respected(fault_server):
    from trace_train.agents import OpenAIChatAgent

    active, peak = [0], [0]
    lock = threading.Lock()
    agent = OpenAIChatAgent("fake", base_url=fault_server.url, concurrency=2)
    real_create = agent.client.chat.completions.create

    def counting_create(**kw):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.05)
            return real_create(**kw)
        finally:
            with lock:
                active[0] -= 1

    agent.client.chat.completions.create = counting_create
    envs = [_env_after_reset(s) for s in range(6)]
    actions = agent.act_batch([o for _, o, _ in envs], [i for _, _, i in envs])
    assert len(actions) == 6 and all(isinstance(a, dict) for a in actions)
    assert peak[0] == 2
    for env, _, _ in envs:
        env.close()
    agent.close()


# ----------------------------------------------------------------------------- transformers serve


def test_openai_agent_against_transformers_serve(transformers_server, model_dir):
    from trace_train.agents import OpenAIChatAgent, is_agent_error
    from trace_train.rollouts import run_rollouts

    agent = OpenAIChatAgent(model_dir, base_url=transformers_server, max_tokens=12, timeout=60, concurrency=2)
    # A conversation with past tool calls and results is accepted by a real server.
    env, obs, info = _env_after_reset(5)
    oracle = OracleAgent()
    oracle.reset(env.unwrapped, obs, info)
    for _ in range(2):
        obs, _, _, _, info = env.step(oracle(obs, info))
    action = agent(obs, info)
    assert not is_agent_error(action), action
    env.step(action)  # whatever the random model said, the env answers
    env.close()
    # Whole episodes through the server, two in flight.
    summary = run_rollouts(EXAMPLE, agent, seeds=[0, 1, 2], in_flight=2, max_steps=3, progress=False,
                           keep_records=True)
    assert summary.ran == 3
    assert all(r["agent_errors"] == 0 for r in summary.records)
    assert agent.stats.errors == 0 and agent.stats.prompt_tokens > 100 and agent.stats.completion_tokens > 0
    agent.close()


# ----------------------------------------------------------------------------- HFAgent


def test_hf_agent_batched_equals_one_at_a_time(model_dir):
    from trace_train.agents import HFAgent

    agent = HFAgent(model_dir, max_new_tokens=12)
    envs = [_env_after_reset(s) for s in range(4)]
    obs, infos = [o for _, o, _ in envs], [i for _, _, i in envs]
    batched = agent.act_batch(obs, infos)
    single = [agent(o, i) for o, i in zip(obs, infos)]
    assert batched == single
    assert all(isinstance(a, str) for a in batched)
    assert "<|im_end|>" not in "".join(batched)
    assert agent.prompt(infos[0]).endswith("<|im_start|>assistant\n")
    assert "<tools>" in agent.prompt(infos[0])
    assert agent.stats.calls == 8 and agent.stats.prompt_tokens > 0
    for env, _, _ in envs:
        env.close()


def test_hf_agent_rollouts_are_batched(model_dir):
    from trace_train.agents import HFAgent
    from trace_train.rollouts import run_rollouts

    agent = HFAgent(model_dir, max_new_tokens=8, temperature=1.0, seed=1)
    sizes = []
    real = agent.act_batch
    agent.act_batch = lambda o, i: (sizes.append(len(o)), real(o, i))[1]
    summary = run_rollouts(EXAMPLE, agent, seeds=range(3), samples=2, in_flight=6, max_steps=3,
                           progress=False, keep_records=True)
    assert summary.ran == 6 and sizes[0] == 6
    assert sorted((r["seed"], r["sample"]) for r in summary.records) == [(s, k) for s in range(3) for k in range(2)]
    assert all(r["agent"].startswith("hf:") for r in summary.records)


def test_hf_agent_with_a_peft_adapter(model_dir, tmp_path):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_train.agents import HFAgent

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # make the adapter change the outputs (B starts at zero)
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    lora.save_pretrained(tmp_path / "adapter")
    env, obs, info = _env_after_reset(2)
    plain = HFAgent(model_dir, max_new_tokens=10)
    adapted = HFAgent(model_dir, adapter=str(tmp_path / "adapter"), max_new_tokens=10)
    assert adapted.name.endswith("+adapter") and type(adapted.model).__name__.startswith("PeftModel")
    assert adapted(obs, info) != plain(obs, info)
    env.close()


def test_hf_agent_prefix_cache_gives_the_same_turns(model_dir):
    """Reusing each conversation's keys/values between turns changes speed, not outputs."""
    from trace_train.agents import HFAgent

    cached = HFAgent(model_dir, max_new_tokens=8, prefix_cache=True)
    fresh = HFAgent(model_dir, max_new_tokens=8, prefix_cache=False)
    envs = [_env_after_reset(s) for s in range(3)]
    oracles = []
    for env, obs, info in envs:
        oracle = OracleAgent()
        oracle.reset(env.unwrapped, obs, info)
        oracles.append(oracle)
    states = [(obs, info) for _, obs, info in envs]
    for turn in range(3):  # the conversations grow by the oracle's turns; the agents answer each prefix
        obs, infos = [o for o, _ in states], [i for _, i in states]
        assert cached.act_batch(obs, infos) == fresh.act_batch(obs, infos)
        states = [env.step(oracle(o, i))[::4] for (env, _, _), oracle, (o, i) in zip(envs, oracles, states)]
    assert cached.cached_prompt_tokens > 0.5 * cached.stats.prompt_tokens * (2 / 3)
    assert fresh.cached_prompt_tokens == 0
    for env, _, _ in envs:
        env.close()
