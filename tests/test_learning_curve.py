"""scripts/learning_curve.py: the learning link's curve reads a run's checkpoints in step order and gives each
point its pass@1 with the evaluation's bootstrap interval (the rollouts themselves are the evaluate stage's machinery,
tested with it)."""

from __future__ import annotations

import pytest
from conftest import load_script


@pytest.fixture(scope="module")
def curve():
    return load_script("learning_curve")


def test_checkpoints_come_in_step_order_not_name_order(curve, tmp_path):
    folder = tmp_path / "train" / "cap" / "run" / "checkpoints"
    for name in ("checkpoint-10", "checkpoint-5", "checkpoint-75", "checkpoint-final-notes", "README.md"):
        (folder / name).mkdir(parents=True)
    assert [step for step, _ in curve.checkpoints(tmp_path, "cap")] == [5, 10, 75]


def test_a_run_without_checkpoints_says_which_capability(curve, tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint under .*'other'"):
        curve.checkpoints(tmp_path, "other")


def _episode(seed: int, success: bool, reward: float) -> dict:
    return {"env_id": "gen/x-v0", "seed": seed, "sample": 0, "scenario": "s", "success": success, "reward": reward}


def test_a_point_is_pass_at_1_with_the_evaluations_interval_and_the_reward_apart(curve):
    episodes = [_episode(i, i % 4 != 1, 0.5 if i % 4 != 1 else 0.25) for i in range(100)]
    point = curve.curve_point(episodes)
    assert point["success"] == 0.75 and point["lo"] < 0.75 < point["hi"] and point["hi"] - point["lo"] < 0.25
    assert point["reward"] == 0.4375 and point["episodes"] == 100
    assert curve.curve_point([_episode(i, True, 1.0) for i in range(10)])["lo"] == 1.0
    assert curve.curve_point([])["episodes"] == 0
