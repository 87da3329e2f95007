"""Reference agents answer every observation: an oracle whose turns are mixed with another agent's
turns, or whose episode goes on after its plan, still answers, and its later answers still solve the task."""

from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids; puts examples/ on the registry path
from trace_envs.core import PlannedPolicy
from trace_envs.core.conversation import hermes_tool_call

FIXTURE = Path(__file__).parent / "fixtures"
MINICALC_KW = {"repos": ["minicalc"], "instances_dir": str(FIXTURE / "minicalc_instances")}


@pytest.fixture(scope="module", autouse=True)
def minicalc_repo():
    """The fixture repository the SWE envs here read (as tests/test_swe.py registers it)."""
    from trace_envs.swe.repos import RepoSpec, save_repo

    save_repo(RepoSpec("minicalc", f"dir:{FIXTURE / 'minicalc'}", ("tests",), (".",)))


def test_the_localization_oracle_answers_after_its_plan_and_still_solves_it():
    env = gym.make("trace/swe_localization-v0", **MINICALC_KW)
    for seed in range(3):
        obs, info = env.reset(seed=seed)
        target = env.unwrapped.target
        policy = env.unwrapped.oracle()
        obs, reward, terminated, _, info = env.step(policy(obs, info))  # its first planned turn: view the file
        assert not terminated
        policy(obs, info)  # its second (submit) is replaced by another agent's turn: the episode goes on
        obs, reward, terminated, _, info = env.step(hermes_tool_call("view_file", {"path": target["file"]}))
        assert not terminated
        for _ in range(3):  # past its plan: it answers every observation, and the answer is still the location
            action = policy(obs, info)
            assert "submit_location" in action
        obs, reward, terminated, _, info = env.step(action)
        assert terminated and reward == 1.0, (seed, info)
    env.close()


def test_the_worked_examples_oracle_answers_after_its_plan():
    import custom_env  # examples/ (the worked example)

    env = custom_env.WarehouseStockEnv()
    obs, info = env.reset(seed=0)
    policy = env.oracle()
    turns = [policy(obs, info) for _ in range(len(env.stock) + 5)]  # more observations than its plan has turns
    assert turns[-1] == turns[-2] and "submit_total" in turns[-1]
    env.close()


def test_a_planned_policy_repeats_its_last_turn_or_its_answer_after_the_plan():
    assert [PlannedPolicy(["a", "b"])("", {}) for _ in range(1)] == ["a"]
    policy = PlannedPolicy(["a", "b"])
    assert [policy("", {}) for _ in range(4)] == ["a", "b", "b", "b"]
    policy = PlannedPolicy(["a"], then="done")
    assert [policy("", {}) for _ in range(3)] == ["a", "done", "done"]
    with pytest.raises(ValueError, match="at least one turn"):
        PlannedPolicy([])
