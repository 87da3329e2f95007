"""Evaluation statistics against hand-computed values."""

from __future__ import annotations

import json
import math

import pytest


def _records(outcomes: dict[tuple[str, int], list[bool]], scenario_of=None, agent="a") -> list[dict]:
    out = []
    for (env_id, seed), trials in outcomes.items():
        for k, ok in enumerate(trials):
            r = {"env_id": env_id, "seed": seed, "sample": k, "agent": agent, "success": ok,
                 "reward": 1.0 if ok else 0.25}
            if scenario_of:
                r["task"] = {"scenario": scenario_of(seed)}
            out.append(r)
    return out


# Three tasks with four trials each: 3/4, 1/4 and 4/4 successes.
OUTCOMES = {("e", 0): [True, True, False, True], ("e", 1): [False, False, True, False], ("e", 2): [True] * 4}


def test_pass_hat_k_matches_tau2_definition():
    from trace_train.evaluate import pass_hat_k

    assert pass_hat_k(3, 4, 1) == 0.75
    assert pass_hat_k(3, 4, 2) == 0.5  # C(3,2)/C(4,2) = 3/6
    assert pass_hat_k(3, 4, 3) == 0.25  # 1/4
    assert pass_hat_k(3, 4, 4) == 0.0
    assert pass_hat_k(4, 4, 4) == 1.0
    assert pass_hat_k(0, 5, 1) == 0.0
    with pytest.raises(ValueError):
        pass_hat_k(2, 3, 4)
    with pytest.raises(ValueError):
        pass_hat_k(4, 3, 1)


def test_overall_metrics_by_hand():
    from trace_train.evaluate import evaluate

    result = evaluate(_records(OUTCOMES), ks=(1, 2, 4), n_boot=500, seed=1)
    o = result["overall"]
    assert o["tasks"] == 3 and o["trials"] == 12
    assert o["pass@1"]["value"] == pytest.approx((0.75 + 0.25 + 1.0) / 3)
    assert o["pass^2"]["value"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert o["pass^4"]["value"] == pytest.approx(1 / 3)
    # mean reward: task 0: (3 + 0.25)/4, task 1: (1 + 0.75)/4, task 2: 1
    assert o["mean_reward"]["value"] == pytest.approx((3.25 / 4 + 1.75 / 4 + 1.0) / 3)
    for name in ("pass@1", "pass^2", "pass^4", "mean_reward"):
        lo, hi = o[name]["ci"]
        assert lo <= o[name]["value"] <= hi
    # The bootstrap resamples tasks: its extremes are bounded by the best and worst task.
    assert o["pass@1"]["ci"][0] >= 0.25 and o["pass@1"]["ci"][1] <= 1.0
    # Reproducible for a seed.
    assert evaluate(_records(OUTCOMES), ks=(1, 2, 4), n_boot=500, seed=1) == result


def test_bootstrap_interval_by_hand():
    """With two tasks (success rates 0 and 1), a resampled mean is 0, 0.5 or 1 with probabilities 1/4, 1/2, 1/4."""
    from trace_train.evaluate import evaluate

    recs = _records({("e", 0): [False], ("e", 1): [True]})
    o = evaluate(recs, ks=(1,), n_boot=20000, level=0.4, seed=0)["overall"]["pass@1"]
    assert o["value"] == 0.5
    assert o["ci"] == [0.5, 0.5]  # the 30% and 70% quantiles both fall on 0.5
    wide = evaluate(recs, ks=(1,), n_boot=20000, level=0.95, seed=0)["overall"]["pass@1"]
    assert wide["ci"] == [0.0, 1.0]


def test_k_above_trials_skips_tasks_and_duplicates_do_not_count():
    from trace_train.evaluate import evaluate

    recs = _records({("e", 0): [True, True], ("e", 1): [True, False, False, True]})
    recs.append(dict(recs[0]))  # a duplicated line
    o = evaluate(recs, ks=(1, 4), n_boot=0)["overall"]
    assert o["trials"] == 6
    assert o["pass@1"]["value"] == pytest.approx((1.0 + 0.5) / 2)
    assert o["pass^4"]["value"] == 0.0 and o["pass^4"]["n_tasks"] == 1
    assert math.isnan(o["pass@1"]["ci"][0])


def test_per_scenario_breakdown():
    from trace_train.evaluate import evaluate

    recs = _records(OUTCOMES, scenario_of=lambda seed: "cancel" if seed < 2 else "book")
    result = evaluate(recs, ks=(1, 2), n_boot=100)
    assert set(result["by_scenario"]) == {"cancel", "book"}
    assert result["by_scenario"]["cancel"]["pass@1"]["value"] == pytest.approx(0.5)
    assert result["by_scenario"]["cancel"]["pass^2"]["value"] == pytest.approx(0.25)
    assert result["by_scenario"]["book"]["pass@1"]["value"] == 1.0
    # The top-level `scenario` field (written by trace_train.rollouts) is read too.
    for r in recs:
        r["scenario"] = r.pop("task")["scenario"]
    assert evaluate(recs, ks=(1, 2), n_boot=100)["by_scenario"] == result["by_scenario"]


def test_compare_pairs_tasks():
    from trace_train.evaluate import compare

    base = _records({("e", 0): [False, False], ("e", 1): [True, False], ("e", 2): [True, True],
                     ("e", 9): [True, True]}, agent="base")
    cand = _records({("e", 0): [True, False], ("e", 1): [True, True], ("e", 2): [True, False],
                     ("e", 7): [False, False]}, agent="cand")
    result = compare(base, cand, ks=(1, 2), n_boot=2000, seed=0)
    assert result["shared_tasks"] == 3 and result["only_base"] == 1 and result["only_candidate"] == 1
    # per-task deltas of pass@1: +0.5, +0.5, -0.5 -> mean 1/6
    assert result["delta"]["pass@1"]["value"] == pytest.approx(1 / 6)
    # pass^2 deltas: 0, +1, -1 -> 0
    assert result["delta"]["pass^2"]["value"] == pytest.approx(0.0)
    lo, hi = result["delta"]["pass@1"]["ci"]
    assert -0.5 <= lo <= 1 / 6 <= hi <= 0.5
    assert result["tasks"] == {"improved": 2, "regressed": 1, "same": 0}
    assert result["base"]["overall"]["pass@1"]["value"] == pytest.approx((0 + 0.5 + 1) / 3)


def test_reports_and_cli(tmp_path, capsys):
    from trace_train.cli import main
    from trace_train.evaluate import evaluate, write_report

    recs = _records(OUTCOMES, scenario_of=lambda seed: "cancel" if seed < 2 else "book")
    paths = write_report(evaluate(recs, ks=(1, 2)), tmp_path / "r")
    md = paths["md"].read_text()
    assert "| **all** | 3 | 12 | 0.667" in md and "scenario `cancel`" in md
    assert json.loads(paths["json"].read_text())["overall"]["tasks"] == 3
    assert paths["png"].stat().st_size > 1000

    cand = tmp_path / "cand.jsonl"
    base = tmp_path / "base.jsonl"
    cand.write_text("".join(json.dumps(r) + "\n" for r in recs))
    base.write_text("".join(json.dumps(dict(r, success=False)) + "\n" for r in recs))
    assert main(["eval", str(cand), "--base", str(base), "--k", "1", "2", "--out", str(tmp_path / "cmp")]) == 0
    out = capsys.readouterr().out
    assert "| **all** | pass@1 | 0.000" in out and "+0.667" in out
    for ext in ("json", "md", "png"):
        assert (tmp_path / "cmp" / f"compare.{ext}").exists()
    assert main(["eval", str(tmp_path / "missing.jsonl")]) == 2


def test_env_error_episodes_are_left_out_and_reported():
    from trace_train.evaluate import evaluate, markdown_table

    records = _records(OUTCOMES)
    failed = {"env_id": "e", "seed": 3, "sample": 0, "agent": "a", "success": False, "reward": 0.0,
              "termination": "env_error", "env_error": "the sandbox failed: container gone"}
    result = evaluate(records + [failed], ks=(1,), n_boot=0)
    assert result["env_errors"] == 1
    assert result["overall"]["tasks"] == 3 and result["overall"]["trials"] == 12  # seed 3 is no task at all
    assert result["overall"]["pass@1"]["value"] == pytest.approx((0.75 + 0.25 + 1.0) / 3)
    assert "1 episodes ended in `env_error`" in markdown_table(result)
    assert evaluate(records, ks=(1,), n_boot=0)["env_errors"] == 0
