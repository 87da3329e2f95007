"""The analysis stage on agents whose deficits are known: planted-deficit recovery, reproducibility, CLI.

The planted-deficit agents (trace_envs.domains.agents.TauScriptedAgent) are the oracle with some
capabilities removed. Handed their rollouts (mixed with oracle episodes, so that there are
successes to contrast with), the offline labeler must retain exactly the planted capabilities.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs import rollout
from trace_envs.domains.agents import TauScriptedAgent
from trace_envs.domains.task import CAPABILITIES
from trace_train.analysis import OfflineLabeler, Thresholds, diagnose

TARGETS = ("trace/tau_airline-v0", "trace/tau_retail-v0")
DEFICIT_SEEDS = range(100, 150)
ORACLE_SEEDS = range(500, 525)
PLANTED = [
    ("precondition_verification",),
    ("multi_step_completion",),
    ("structured_data_reasoning",),
    ("tool_calling_precision",),
    ("precondition_verification", "structured_data_reasoning"),
    ("multi_step_completion", "tool_calling_precision"),
    ("structured_data_reasoning", "tool_calling_precision"),
    ("precondition_verification", "multi_step_completion", "structured_data_reasoning"),
    ("multi_step_completion", "structured_data_reasoning", "tool_calling_precision"),
    ("precondition_verification", "multi_step_completion"),
]
# Not planted together: precondition_verification with tool_calling_precision. The sloppy agent's
# forbidden writes are rejected by the tools, so the DB stays unchanged and many such episodes
# succeed: the precondition deficit then does not cause failures (ER⁺ ≈ ER⁻), and the contrastive
# method rightly does not retain it.


@pytest.fixture(scope="module")
def episodes() -> dict[tuple[str, ...], list[dict]]:
    """Rollouts per planted set (both τ² targets), plus the oracle's under the key ()."""
    out: dict[tuple[str, ...], list[dict]] = {}
    envs = {t: gym.make(t) for t in TARGETS}
    for lacks in [()] + PLANTED:
        seeds = ORACLE_SEEDS if not lacks else DEFICIT_SEEDS
        out[lacks] = [rollout(envs[t], TauScriptedAgent(lacks), s) for t in TARGETS for s in seeds]
    for env in envs.values():
        env.close()
    return out


def _write(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return path


@pytest.mark.parametrize("planted", PLANTED, ids=["+".join(p) for p in PLANTED])
def test_offline_labeler_retains_exactly_the_planted_capabilities(planted, episodes, tmp_path):
    records = episodes[planted] + episodes[()]
    result = diagnose(_write(tmp_path / "t.jsonl", records), tmp_path / "out", figure=False,
                      thresholds=Thresholds(bootstrap=200))
    print(f"\nplanted {'+'.join(planted)}: " + "; ".join(
        f"{s.name}: delta={s.mean_delta:.2f} coverage={s.mean_coverage:.2f}{' RETAINED' if s.retained else ''}"
        for s in result.scores))
    retained = set(result.retained)
    precision = len(retained & set(planted)) / max(1, len(retained))
    recall = len(retained & set(planted)) / len(planted)
    assert (precision, recall) == (1.0, 1.0), (planted, result.retained)
    assert len(result.specs) == len(planted)


def test_labels_do_not_read_the_hidden_task(episodes):
    """The labeler sees what an analyst sees: removing the task's ground truth changes nothing."""
    labeler = OfflineLabeler()
    for record in episodes[PLANTED[7]][:40] + episodes[()][:10]:
        blind = {k: v for k, v in record.items() if k not in ("task", "agent", "reward_breakdown")}
        assert {c: v.label for c, v in labeler.label(record).items()} == \
            {c: v.label for c, v in labeler.label(blind).items()}


def test_oracle_alone_has_no_failures_and_retains_nothing(episodes, tmp_path):
    result = diagnose(_write(tmp_path / "o.jsonl", episodes[()]), tmp_path / "o", figure=False,
                      thresholds=Thresholds(bootstrap=0))
    assert result.retained == []
    assert all(s.mean_coverage is None for s in result.scores)


def test_same_inputs_and_seeds_give_identical_capabilities_json(episodes, tmp_path):
    records = episodes[PLANTED[4]] + episodes[()]
    src = _write(tmp_path / "t.jsonl", records)
    a = diagnose(src, tmp_path / "a", thresholds=Thresholds(bootstrap=300, seed=7))
    b = diagnose(src, tmp_path / "b", thresholds=Thresholds(bootstrap=300, seed=7))
    assert a.capabilities_json.read_bytes() == b.capabilities_json.read_bytes()
    assert [p.read_bytes() for p in a.specs] == [p.read_bytes() for p in b.specs]
    data = json.loads(a.capabilities_json.read_text())
    # docs/design.md, "The method's settings"
    assert {d["name"] for d in data["dictionary"]} == set(CAPABILITIES)
    for cap in data["capabilities"]:
        for key in ("name", "definition", "labels", "ER_minus", "ER_plus", "delta", "coverage", "runs_passed",
                    "runs", "retained", "delta_ci", "coverage_ci"):
            assert key in cap
        assert set(cap["labels"].values()) <= {"NA", "PRESENT", "LACKING"}
        assert len(cap["labels"]) == len(records)
    assert data["retained"] == [c["name"] for c in data["capabilities"] if c["retained"]]
    spec = json.loads(a.specs[0].read_text())
    assert spec["target_env"] in TARGETS and spec["tool_schemas"] and spec["example_failures"]
    assert spec["name"] in PLANTED[4] and spec["example_failures"][0]["evidence"]
    assert a.figure.stat().st_size > 10_000 and "Retained" in a.report.read_text()


def test_cli_on_a_run_directory(episodes, tmp_path, capsys):
    from trace_train.cli import main

    run = tmp_path / "run"
    run.mkdir()
    _write(run / "trajectories.jsonl", episodes[PLANTED[3]] + episodes[()])
    assert main(["diagnose", str(run), "--bootstrap", "100", "--min-coverage", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "retained: tool_calling_precision" in out
    data = json.loads((run / "capabilities.json").read_text())
    assert data["thresholds"]["min_coverage"] == 0.05 and data["retained"] == ["tool_calling_precision"]
    assert (run / "report.md").exists() and (run / "capabilities.png").exists()
    assert (run / "specs" / "tool_calling_precision.json").exists()
    # user errors: one line, exit status 2
    assert main(["diagnose", str(tmp_path / "nope")]) == 2
    assert main(["diagnose", str(run), "--llm", "http://127.0.0.1:1/v1"]) == 2
    assert "does not exist" in capsys.readouterr().err
