"""``trace diagnose`` beyond the planted sets of tests/test_analysis.py: small samples, random failures,
and four deficits that dilute each other.

Every trajectory here is a real rollout of a reference agent on a τ² target; the analysis runs through
:func:`trace_train.analysis.diagnose` and the CLI.
"""

from __future__ import annotations

import json

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs import ScriptedAgent, rollout
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import NoisyTauAgent, TauScriptedAgent
from trace_envs.domains.task import CAPABILITIES
from trace_train.analysis import Thresholds, diagnose

TARGETS = ("trace/tau_airline-v0", "trace/tau_retail-v0")


@pytest.fixture(scope="module")
def envs():
    made = {t: gym.make(t) for t in TARGETS}
    yield made
    for e in made.values():
        e.close()


def _write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _failing_seed(env, agent, seeds):
    return next(s for s in seeds if not rollout(env, agent, s)["success"])


def test_one_failure_out_of_forty_is_not_evidence(envs, tmp_path, capsys):
    from trace_train.cli import main

    env = envs[TARGETS[0]]
    sloppy = TauScriptedAgent(["tool_calling_precision"])
    bad = _failing_seed(env, sloppy, range(300, 400))
    records = [rollout(env, sloppy, bad)] + [rollout(env, TauScriptedAgent(), s) for s in range(600, 639)]
    src = _write(tmp_path / "t.jsonl", records)
    small = diagnose(src, tmp_path / "a", figure=False, thresholds=Thresholds(bootstrap=200))
    tcp = next(s for s in small.scores if s.name == "tool_calling_precision")
    assert tcp.runs[0].LF == 1 and tcp.mean_delta == pytest.approx(1.0)
    assert small.retained == [] and any("minimum evidence" in n for n in tcp.notes)
    report = small.report.read_text()
    assert "LF (min 3)" in report and "1 (too few)" in report and "at least 3 failed trajectories" in report
    # the rule is configurable; at 1 the paper's thresholds alone retain it again
    loose = diagnose(src, tmp_path / "b", figure=False, thresholds=Thresholds(bootstrap=0, min_lacking_failures=1))
    assert loose.retained == ["tool_calling_precision"]
    assert main(["diagnose", str(src), "--out", str(tmp_path / "c"), "--no-figure", "--bootstrap", "0",
                 "--min-lacking-failures", "1"]) == 0
    out = capsys.readouterr().out
    assert "retained: tool_calling_precision" in out and "LF (min 1)" in out
    assert json.loads((tmp_path / "c" / "capabilities.json").read_text())["thresholds"]["min_lacking_failures"] == 1


def test_random_failures_are_reported_as_unattributed(envs, tmp_path, capsys):
    """An agent that hands every customer to a human fails without any LACKING label: the report says so."""
    from trace_train.cli import main

    transfer = hermes_tool_call("transfer_to_human_agents", {"summary": "The customer needs help."})
    records = []
    for t, env in envs.items():
        records += [rollout(env, TauScriptedAgent(), s) for s in range(700, 715)]
        records += [rollout(env, ScriptedAgent([transfer], name="transfer_all"), s) for s in range(800, 815)]
    failed = sum(not r["success"] for r in records)
    assert failed >= 25
    src = _write(tmp_path / "t.jsonl", records)
    result = diagnose(src, tmp_path / "out", figure=False, thresholds=Thresholds(bootstrap=0))
    un = result.data["unattributed"]
    assert result.retained == []
    assert un["count"] == failed == un["failed"] and un["share"] == 1.0 and un["no_lacking_label"] == failed
    assert len(un["examples"]) == 5 and all(e["lacking"] == [] and e["termination"] == "transfer" for e in un["examples"])
    report = result.report.read_text()
    assert f"Unattributed failures: {failed} of {failed} (100%)" in report and "## Unattributed failures" in report
    assert main(["diagnose", str(src), "--out", str(tmp_path / "cli"), "--no-figure", "--bootstrap", "0"]) == 0
    assert f"unattributed failures: {failed} of {failed} (100%)" in capsys.readouterr().out


def _four_deficit_mixture(envs, kind: str) -> list[dict]:
    """About 10% of the episodes lack each of the four capabilities."""
    records = []
    for env in envs.values():
        for s in range(300):
            if kind == "single":  # one deficit per episode, 10% each, 60% oracle
                agent = TauScriptedAgent([CAPABILITIES[s % 10]] if s % 10 < 4 else [])
            else:  # each capability dropped independently with probability 0.1
                agent = NoisyTauAgent(p=0.1, seed=3)
            records.append(rollout(env, agent, 1000 + s))
    return records


@pytest.mark.parametrize("kind", ["single", "independent"])
def test_explain_away_recovers_four_diluted_deficits(envs, tmp_path, kind, capsys):
    from trace_train.cli import main

    src = _write(tmp_path / "t.jsonl", _four_deficit_mixture(envs, kind))
    paper = diagnose(src, tmp_path / "paper", figure=False, thresholds=Thresholds(bootstrap=0))
    by = {s.name: s for s in paper.scores}
    print(f"\n{kind}, paper's rule: " + "; ".join(f"{s.name} Δ={s.mean_delta:.2f} cov={s.mean_coverage:.2f}"
                                                 for s in paper.scores))
    # The paper's rule, as the default: the failures of the other three dilute precondition_verification's ER⁻.
    assert set(paper.retained) == set(CAPABILITIES) - {"precondition_verification"}
    assert by["precondition_verification"].mean_delta < 0.20 and by["precondition_verification"].runs[0].LF >= 5
    ea = diagnose(src, tmp_path / "ea", figure=False, thresholds=Thresholds(bootstrap=0, explain_away=True))
    print(f"{kind}, explain-away: " + "; ".join(f"{s.name} round {s.round} Δ={s.mean_delta:.2f}" for s in ea.scores))
    assert set(ea.retained) == set(CAPABILITIES) and len(ea.specs) == 4
    assert [s.round for s in ea.scores] == [0, 1, 2, 3]
    assert ea.scores[0].name == paper.scores[0].name  # round 0 is the paper's strongest
    assert ea.data["unattributed"]["count"] < paper.data["unattributed"]["count"]
    if kind == "single":
        assert main(["diagnose", str(src), "--out", str(tmp_path / "cli"), "--no-figure", "--bootstrap", "0",
                     "--explain-away"]) == 0
        out = capsys.readouterr().out
        assert "(explain-away)" in out and "precondition_verification" in out.split("retained:")[1]
        assert "explain-away" in (tmp_path / "cli" / "report.md").read_text()
