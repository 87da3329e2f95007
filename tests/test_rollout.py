"""``trace_envs.rollout``: the trajectory record of docs/design.md ("Trajectories")."""

from __future__ import annotations

import json

import gymnasium as gym

import trace_envs
from trace_envs import OracleAgent, RandomAgent, ScriptedAgent, make_agent, rollout
from trace_envs.core.conversation import hermes_tool_call

ENV_ID = "examples/warehouse_stock-v0"
FIELDS = {"env_id", "seed", "agent", "messages", "tools", "reward", "reward_breakdown", "success", "termination",
          "steps", "timing"}


def test_record_has_every_trajectory_field_and_is_json() -> None:
    record = rollout(ENV_ID, OracleAgent(), seed=5)
    assert FIELDS <= set(record), FIELDS - set(record)
    assert set(record) - FIELDS <= {"task"}  # the env's task_info() labels
    assert isinstance(record.get("task", {}), dict)
    assert record["env_id"] == ENV_ID and record["seed"] == 5 and record["agent"] == "oracle"
    assert [m["role"] for m in record["messages"][:2]] == ["system", "user"]
    assert all(m["role"] in ("system", "user", "assistant", "tool") for m in record["messages"])
    assert [t["function"]["name"] for t in record["tools"]] == ["list_warehouses", "get_stock", "submit_total"]
    assert set(record["timing"]) >= {"reset_s", "env_s", "agent_s", "wall_s"}
    assert all(v >= 0 for v in record["timing"].values())
    line = json.dumps(record)  # one JSON Lines row
    assert json.loads(line)["messages"] == record["messages"]


def test_oracle_succeeds() -> None:
    for seed in range(5):
        record = rollout(ENV_ID, make_agent("oracle"), seed=seed)
        assert record["reward"] == 1.0 and record["success"] is True
        assert record["termination"] == "agent_stop"
        n_warehouses = 2 + 2  # difficulty 2 in examples/registry.yaml
        assert record["steps"] == 1 + n_warehouses + 1
        assert record["reward_breakdown"]["correct_total"] == 1.0
        calls = [m for m in record["messages"] if m.get("tool_calls")]
        assert calls[-1]["tool_calls"][0]["function"]["name"] == "submit_total"


def test_same_seed_same_record() -> None:
    a, b = (rollout(ENV_ID, OracleAgent(), seed=9) for _ in range(2))
    assert a["messages"] == b["messages"] and a["reward"] == b["reward"]


def test_truncated_episode_is_max_steps() -> None:
    looping = ScriptedAgent([hermes_tool_call("list_warehouses", {})], name="looping")
    record = rollout(ENV_ID, looping, seed=1)
    assert record["termination"] == "max_steps"
    assert record["steps"] == gym.spec(ENV_ID).max_episode_steps == 20
    assert record["reward"] == 0.0 and record["success"] is False
    assert record["agent"] == "looping"


def test_max_steps_cap_without_time_limit() -> None:
    env = gym.make(ENV_ID, max_episode_steps=None)
    looping = ScriptedAgent([hermes_tool_call("list_warehouses", {})])
    record = rollout(env, looping, seed=1, max_steps=3)
    assert (record["termination"], record["steps"], record["success"]) == ("max_steps", 3, False)
    env.reset(seed=0)  # a passed-in env is left open
    env.close()


def test_garbage_agent_ends_with_too_many_errors() -> None:
    record = rollout(ENV_ID, ScriptedAgent(["<tool_call>{bad"], name="garbage"), seed=2)
    assert record["termination"] == "too_many_errors" and record["reward"] == 0.0
    assert record["steps"] == trace_envs.get_entry(ENV_ID).load_class().max_invalid_actions


def test_random_agent_never_succeeds_or_crashes() -> None:
    for seed in range(5):
        record = rollout(ENV_ID, RandomAgent(seed), seed=seed)
        assert record["termination"] != "env_error" and record["success"] is False
