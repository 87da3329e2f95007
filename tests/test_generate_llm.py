"""The LLM generator agent against real OpenAI-compatible servers on loopback.

* A replay server answers with recorded replies in order: a wrong module first (its oracle fails),
  a correct one after it has been sent the admission report. The second is admitted and registered,
  the report of the first reached the second prompt, and ``gym.make`` works on the new id in a fresh
  process.
* ``transformers serve`` with the nano model (random weights): whatever it writes is rejected with a
  report and retried; nothing is registered; every attempt is on disk.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from generators import generate
from generators.admit import AdmissionConfig
from generators.workspace import Workspace
from trace_envs import rollout
from trace_envs.domains.agents import TauScriptedAgent
from trace_train.analysis import Thresholds, diagnose

pytestmark = pytest.mark.usefixtures("restore_registry")  # generated ids stay out of later tests

# 16 calibration groups: with 6, the share of all-1 groups of a decision env balanced 50/50 (-v1) is 2 groups
# away from its bound, a draw rather than a verdict.
LIGHT = AdmissionConfig(n_seeds=4, digest_seeds=3, probe_seeds=6, calibration_groups=16, warm_resets=200,
                        seed_draw=58)  # a fixed draw: 16 groups are few for the band on any draw

WRONG = '''Here is the environment.

```python
"""Precondition checks on the airline domain."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "{ENV_ID}", "class": "CheckFirstEnv", "max_episode_steps": 30,
                "kwargs": {"domain": "airline"}, "description": "check the policy before writing"}


class CheckFirstEnv(PreconditionVerificationEnv):
    def oracle(self):
        return lambda observation, info: "Let me check that for you."
```
'''

RIGHT = '''The oracle must play the task's gold path; I use the family's own oracle and a lower difficulty.

```python
"""Precondition checks on the airline domain: single-rule families first."""
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "{ENV_ID}", "class": "CheckFirstEnv", "max_episode_steps": 30,
                "kwargs": {"domain": "airline", "difficulty": 2}, "description": "check the policy before writing"}


class CheckFirstEnv(PreconditionVerificationEnv):
    default_difficulty = 2
```
'''


class ReplayServer:
    """A minimal OpenAI-compatible chat endpoint that answers with recorded replies, in order.

    ``{ENV_ID}`` in a reply is replaced by the id the prompt assigns (as a recorded run would have it).
    """

    def __init__(self, replies: list[str]):
        self.replies, self.requests = list(replies), []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                text = server.replies[min(len(server.requests), len(server.replies)) - 1]
                prompt = " ".join(str(m.get("content")) for m in body["messages"])
                env_id = re.search(r"module for `(gen/[\w-]+)`", prompt).group(1)
                payload = {"id": f"r{len(server.requests)}", "object": "chat.completion", "created": 0,
                           "model": body["model"],
                           "choices": [{"index": 0, "finish_reason": "stop",
                                        "message": {"role": "assistant", "content": text.replace("{ENV_ID}", env_id)}}],
                           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def precondition_spec(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("diagnosis")
    env = gym.make("trace/tau_airline-v0")
    records = [rollout(env, TauScriptedAgent(["precondition_verification"]), s) for s in range(100, 150)]
    records += [rollout(env, TauScriptedAgent(()), s) for s in range(500, 525)]
    env.close()
    path = root / "trajectories.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    result = diagnose(path, root, figure=False, thresholds=Thresholds(bootstrap=0))
    assert result.retained == ["precondition_verification"]
    return result.specs[0]


def _attempt_files(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def test_replayed_wrong_then_right_module_is_retried_with_the_report_and_admitted(precondition_spec, tmp_path):
    ws, run = tmp_path / "ws", tmp_path / "run"
    with ReplayServer([WRONG, RIGHT]) as server:
        [result] = generate(precondition_spec, ws, run_dir=run, llm_url=server.url, model="recorded", attempts=3,
                            progress=False, config=LIGHT)
    assert result.admitted, result.reason
    assert result.attempts == 2 and len(server.requests) == 2
    first = json.loads((run / "precondition_verification" / "attempt_1" / "module.admission.json").read_text())
    assert not first["admitted"] and first["reason"].startswith("conformance: oracle scores 1.0")
    # the first prompt has what the model needs; the second carries the first reply and its report
    task = server.requests[0]["messages"][1]["content"]
    for needle in ("precondition_verification", "cancel_reservation", "REGISTRATION",
                   "class PreconditionVerificationEnv",
                   "oracle", "## Evidence: failed trajectories", "## Evidence: successful trajectories"):
        assert needle in task, needle
    second = server.requests[1]["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "user"]
    assert "CheckFirstEnv" in second[2]["content"]
    assert "FAILED conformance: oracle scores 1.0" in second[3]["content"]
    assert "oracle below 1.0" in second[3]["content"]
    # every attempt on disk
    for n in (1, 2):
        files = _attempt_files(run / "precondition_verification" / f"attempt_{n}")
        assert {"prompt.json", "prompt.md", "reply.md", "module.py", "module.admission.json",
                "module.admission.md"} <= files
    # registered in the workspace; gym.make works on it in a fresh process
    assert Workspace(ws).ids() == [result.env_id]
    code = (f"import gymnasium as gym, trace_envs\nenv = gym.make({result.env_id!r})\n"
            "obs, info = env.reset(seed=1)\nprint('tools', len(info['tools']))\nenv.close()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TRACE_REGISTRY": str(ws)})
    assert proc.returncode == 0 and "tools " in proc.stdout, proc.stderr[-2000:]


def test_an_unreachable_endpoint_is_reported_per_attempt(precondition_spec, tmp_path):
    from conftest import free_port

    [result] = generate(precondition_spec, tmp_path / "ws", run_dir=tmp_path / "run",
                        llm_url=f"http://127.0.0.1:{free_port()}/v1", model="nobody", attempts=2, progress=False,
                        llm_options={"timeout": 5})
    assert not result.admitted and result.attempts == 2 and "failed" in result.reason
    assert (tmp_path / "run" / "precondition_verification" / "attempt_2" / "reply.md").exists()
    assert Workspace(tmp_path / "ws").ids() == []


@pytest.mark.slow
def test_transformers_serve_modules_are_rejected_retried_and_never_registered(precondition_spec, tmp_path,
                                                                             transformers_server, model_dir):
    ws, run = tmp_path / "ws", tmp_path / "run"
    [result] = generate(precondition_spec, ws, run_dir=run, llm_url=transformers_server, model=model_dir,
                        attempts=2, progress=False, config=LIGHT,
                        llm_options={"max_tokens": 48, "excerpt_chars": 300, "max_examples": 1, "example_chars": 1500,
                                     "timeout": 120})
    print(f"\ntransformers serve: {result.reason}")
    assert not result.admitted and result.env_id is None and result.attempts == 2
    assert result.reason
    folder = run / "precondition_verification"
    for n in (1, 2):
        files = _attempt_files(folder / f"attempt_{n}")
        assert {"prompt.json", "reply.md", "module.py", "module.admission.json", "module.admission.md"} <= files
        report = json.loads((folder / f"attempt_{n}" / "module.admission.json").read_text())
        assert report["admitted"] is False and report["reason"]
    # the retry carried the first attempt's report
    second = json.loads((folder / "attempt_2" / "prompt.json").read_text())
    assert second[-1]["role"] == "user" and "rejected by admission" in second[-1]["content"]
    assert Workspace(ws).ids() == [] and list((ws / "envs").iterdir()) == []
