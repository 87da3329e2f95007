"""scripts/learning_curve.py: the learning link's curve reads a run's checkpoints in step order and gives each
point its success rate with a bootstrap interval (the rollouts themselves are the evaluate stage's machinery,
tested with it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "learning_curve.py"


@pytest.fixture(scope="module")
def curve():
    spec = importlib.util.spec_from_file_location("learning_curve", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checkpoints_come_in_step_order_not_name_order(curve, tmp_path):
    folder = tmp_path / "train" / "cap" / "run" / "checkpoints"
    for name in ("checkpoint-10", "checkpoint-5", "checkpoint-75", "checkpoint-final-notes", "README.md"):
        (folder / name).mkdir(parents=True)
    assert [step for step, _ in curve.checkpoints(tmp_path, "cap")] == [5, 10, 75]


def test_a_run_without_checkpoints_says_which_capability(curve, tmp_path):
    with pytest.raises(SystemExit, match="no checkpoint under .*'other'"):
        curve.checkpoints(tmp_path, "other")


def test_the_success_interval_brackets_the_rate(curve):
    rate, lo, hi = curve.success_interval([True, False, True, True] * 25)
    assert rate == 0.75 and lo < 0.75 < hi and hi - lo < 0.25
    assert curve.success_interval([True] * 10) == (1.0, 1.0, 1.0)
