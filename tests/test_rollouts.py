"""Resumable, batched rollouts: kill a run mid-way, resume it, every episode exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from trace_envs import OracleAgent

EXAMPLE = "examples/warehouse_stock-v0"
ROOT = Path(__file__).resolve().parent.parent

# A child process that runs 30 seeds x 2 samples with a deliberately slow oracle, so it can be killed mid-run.
CHILD = """
import sys, time
from trace_envs import OracleAgent
from trace_train.rollouts import run_rollouts

class SlowOracle(OracleAgent):
    name = "slow-oracle"
    def __call__(self, observation, info):
        time.sleep(0.01)
        return super().__call__(observation, info)

run_rollouts("examples/warehouse_stock-v0", SlowOracle(), range(30), samples=2, out=sys.argv[1], in_flight=4,
             progress=False)
"""


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_killed_run_resumes_with_every_episode_exactly_once(tmp_path):
    from trace_train.rollouts import read_trajectories, run_rollouts

    out = tmp_path / "traj.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], cwd=ROOT, env=os.environ.copy())
    deadline = time.time() + 60
    while _lines(out) < 10:
        assert proc.poll() is None, "the rollout process ended before it could be killed"
        assert time.time() < deadline, "the rollout process wrote nothing in 60 s"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = _lines(out)
    assert 10 <= written < 60, "the run was not interrupted mid-way"
    # What a kill during a write leaves behind: a torn last line.
    with open(out, "ab") as f:
        f.write(b'{"env_id": "examples/warehouse_stock-v0", "seed": 29, "sam')

    class Oracle(OracleAgent):
        name = "slow-oracle"

    summary = run_rollouts(EXAMPLE, Oracle(), range(30), samples=2, out=out, in_flight=4, progress=False)
    assert summary.skipped == written and summary.ran == 60 - written
    records = read_trajectories(out)
    keys = Counter((r["env_id"], r["seed"], r["sample"]) for r in records)
    assert set(keys) == {(EXAMPLE, s, k) for s in range(30) for k in range(2)}
    assert max(keys.values()) == 1
    assert all(r["success"] and r["reward"] == 1.0 for r in records)
    assert out.read_bytes().endswith(b"\n")
    # A third run has nothing left to do.
    again = run_rollouts(EXAMPLE, Oracle(), range(30), samples=2, out=out, progress=False)
    assert again.ran == 0 and again.skipped == 60 and _lines(out) == 60


def test_records_follow_the_trajectory_contract(tmp_path):
    from trace_train.rollouts import read_trajectories, run_rollouts

    out = tmp_path / "t.jsonl"
    run_rollouts(EXAMPLE, OracleAgent(), [3, 4], out=out, progress=False)
    for r in read_trajectories(out):
        for field in ("env_id", "seed", "sample", "agent", "messages", "tools", "reward", "reward_breakdown",
                      "success", "termination", "steps", "timing", "task", "scenario", "agent_errors"):
            assert field in r, field
        assert r["agent"] == "oracle" and r["termination"] == "agent_stop"
        assert r["messages"][0]["role"] == "system" and r["tools"]
        assert set(r["timing"]) >= {"reset_s", "env_s", "agent_s", "wall_s"}


def test_stateful_agents_get_one_copy_per_open_episode():
    from trace_train.rollouts import run_rollouts

    # The oracle keeps a per-episode plan: with 8 episodes in flight, sharing one would mix plans.
    summary = run_rollouts(EXAMPLE, OracleAgent(), range(16), in_flight=8, progress=False, keep_records=True)
    assert summary.ran == 16 and summary.success_rate == 1.0


def test_batched_agent_gets_every_open_episode_at_once():
    from trace_train.rollouts import run_rollouts

    class Batched:
        name = "batched"

        def __init__(self):
            self.sizes = []

        def act_batch(self, observations, infos):
            self.sizes.append(len(observations))
            return ["I cannot help with that."] * len(observations)  # a message to the user ends the episode

    agent = Batched()
    summary = run_rollouts([EXAMPLE], agent, range(10), samples=1, in_flight=4, progress=False, keep_records=True)
    assert agent.sizes == [4, 4, 2]
    assert summary.ran == 10 and summary.mean_reward == 0.0
    assert {r["termination"] for r in summary.records} == {"agent_stop"}


def test_truncation_and_step_cap():
    from trace_train.rollouts import run_rollouts
    from trace_envs.core.conversation import hermes_tool_call

    class Looper:
        name = "looper"

        def __call__(self, observation, info):
            return hermes_tool_call("list_warehouses", {})

    summary = run_rollouts(EXAMPLE, Looper(), [0], progress=False, keep_records=True)
    record = summary.records[0]
    assert record["termination"] == "max_steps" and record["steps"] == 20 and not record["success"]
    capped = run_rollouts(EXAMPLE, Looper(), [0], progress=False, keep_records=True, max_steps=5).records[0]
    assert capped["steps"] == 5 and capped["termination"] == "max_steps"


def test_two_runs_cannot_write_the_same_file(tmp_path):
    from trace_train.rollouts import _Lock, run_rollouts

    out = tmp_path / "t.jsonl"
    with _Lock(out):
        with pytest.raises(RuntimeError, match="another rollout run"):
            run_rollouts(EXAMPLE, OracleAgent(), [0], out=out, progress=False)


def test_parquet_export(tmp_path):
    import pyarrow.parquet as pq

    from trace_train.rollouts import export_parquet, run_rollouts

    out = tmp_path / "t.jsonl"
    run_rollouts(EXAMPLE, OracleAgent(), range(4), samples=2, out=out, progress=False)
    table = pq.read_table(export_parquet(out))
    assert table.num_rows == 8
    rows = table.to_pylist()
    assert {(r["seed"], r["sample"]) for r in rows} == {(s, k) for s in range(4) for k in range(2)}
    assert all(r["success"] for r in rows)
    assert json.loads(rows[0]["messages"])[0]["role"] == "system"


def test_cli_rollout_resumes_and_exports(tmp_path, capsys):
    from trace_train.cli import main

    out = tmp_path / "cli.jsonl"
    args = ["rollout", "--env", EXAMPLE, "--agent", "oracle", "--samples", "2", "--out", str(out), "--no-progress"]
    assert main(args + ["--seeds", "0:4"]) == 0
    assert "8 episodes run, 0 already" in capsys.readouterr().out
    assert main(args + ["--seeds", "0:6", "--parquet"]) == 0
    text = capsys.readouterr().out
    assert "4 episodes run, 8 already" in text and "parquet:" in text
    assert out.with_suffix(".parquet").exists()
    assert main(["rollout", "--env", "nope/missing-v0", "--out", str(out)]) == 2
    assert main(["rollout", "--env", EXAMPLE, "--agent", "hf", "--out", str(out)]) == 2
    assert main(["rollout", "--env", EXAMPLE, "--seeds", "x:y", "--out", str(out)]) == 2


# ------------------------------------------------------------------ infrastructure failures (env_error)
class _Machine:
    """What the flaky env's infrastructure does: the seeds whose episodes it fails, and whether it is there."""

    failing_seeds: set[int] = set()
    available = True


def _flaky_env_class():
    from trace_envs.core import EnvError, TraceEnv, tool

    class Tools:
        def __init__(self, env):
            self.env = env

        @tool
        def ping(self) -> str:
            """Ask the backend for an answer."""
            if self.env.seed_now in _Machine.failing_seeds:
                raise EnvError("the backend container died")
            return "pong"

    class FlakyEnv(TraceEnv):
        """One tool call and a message; the reward is 1.0 when the agent pinged first."""

        def _generate_task(self, options):
            self.seed_now = self._seed
            return "Ping the backend, then tell me."

        def _tool_provider(self):
            return Tools(self)

        def preflight(self):
            if not _Machine.available:
                raise EnvError("the backend image cannot be built (log: /nowhere.log)")

        def _evaluate(self):
            pinged = any(m.get("role") == "tool" for m in self.messages)
            return float(pinged), {"pinged": pinged}

    return FlakyEnv


@pytest.fixture
def flaky_env():
    import gymnasium as gym

    env_id = "test/flaky_backend-v0"
    if env_id not in gym.registry:
        gym.register(env_id, entry_point=_flaky_env_class(), max_episode_steps=6)
    _Machine.failing_seeds, _Machine.available = set(), True
    yield env_id
    _Machine.failing_seeds, _Machine.available = set(), True


def _pinger():
    from trace_envs import ScriptedAgent
    from trace_envs.core.conversation import hermes_tool_call

    return ScriptedAgent([hermes_tool_call("ping", {}), "Done: pong."], name="pinger")


def test_env_errors_are_recorded_apart_and_rerun_once_each(tmp_path, flaky_env):
    from trace_train.rollouts import read_trajectories, run_rollouts

    out = tmp_path / "traj.jsonl"
    _Machine.failing_seeds = {1, 4}
    first = run_rollouts(flaky_env, _pinger(), range(6), out=out, progress=False)
    assert first.ran == 6 and first.env_errors == 2
    assert first.mean_reward == 1.0 and first.success_rate == 1.0  # the machine's failures are not scored
    failed = {r["seed"]: r for r in read_trajectories(out) if r["termination"] == "env_error"}
    assert set(failed) == {1, 4} and all("container died" in r["env_error"] for r in failed.values())
    assert all(r["reward"] == 0.0 and r["success"] is False for r in failed.values())

    _Machine.failing_seeds = set()  # the machine is mended
    plain = run_rollouts(flaky_env, _pinger(), range(6), out=out, progress=False)
    assert plain.ran == 0 and plain.env_errors == 2  # a plain resume keeps what the file says
    again = run_rollouts(flaky_env, _pinger(), range(6), out=out, progress=False, retry_env_errors=True)
    assert again.ran == 2 and again.env_errors == 0 and again.mean_reward == 1.0
    records = read_trajectories(out)
    assert Counter(r["seed"] for r in records) == Counter(range(6))  # every key exactly once
    assert all(r["termination"] != "env_error" for r in records)


def test_an_env_that_cannot_run_stops_the_rollout_before_its_first_episode(tmp_path, flaky_env):
    from trace_envs.core import EnvError
    from trace_train.rollouts import run_rollouts

    _Machine.available = False
    out = tmp_path / "traj.jsonl"
    with pytest.raises(EnvError, match="cannot run on this machine: the backend image cannot be built"):
        run_rollouts(flaky_env, _pinger(), range(4), out=out, progress=False)
    assert _lines(out) == 0
