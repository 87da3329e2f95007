"""The contrastive statistics against hand-computed tables (docs/design.md, "The method's settings"), edge cases included."""

from __future__ import annotations

import math

import pytest

from trace_train.analysis.stats import Thresholds, contrastive_scores, run_stats

L, P, N = "LACKING", "PRESENT", "NA"


def test_hand_computed_table():
    # 6 failures: L L L P N missing ; 4 successes: L P P P
    labels = [L, L, L, P, N, None, L, P, P, P]
    success = [False] * 6 + [True] * 4
    s = run_stats(labels, success, Thresholds())
    assert (s.LF, s.PF, s.LP, s.PP, s.NA, s.missing) == (3, 1, 1, 3, 1, 1)
    assert s.er_minus == pytest.approx(3 / 4)      # LF / (LF + PF)
    assert s.er_plus == pytest.approx(1 / 4)       # LP / (LP + PP)
    assert s.delta == pytest.approx(0.5)
    assert s.coverage == pytest.approx(3 / 6)      # LF / #failed (NA and missing failures count in #failed)
    assert s.passed


def test_thresholds_are_inclusive_and_configurable():
    labels = [L, P, P, P, P, L] + [P] * 4    # 5 failures... built below
    success = [False, False, False, False, False, True, True, True, True, True]
    s = run_stats(labels, success, Thresholds())
    # LF=1 PF=4 -> ER- = 0.2 ; LP=1 PP=4 -> ER+ = 0.2 ; delta 0
    assert s.delta == pytest.approx(0.0) and not s.passed
    labels2 = [L, P, P, P, P] + [P] * 5
    one = Thresholds(min_lacking_failures=1)  # a single LACKING failure: below the default minimum evidence
    s2 = run_stats(labels2, success, one)
    assert s2.delta == pytest.approx(0.2) and s2.coverage == pytest.approx(0.2) and s2.passed  # exactly at 0.20
    assert not run_stats(labels2, success, Thresholds()).passed
    assert not run_stats(labels2, success, Thresholds(min_delta=0.25, min_lacking_failures=1)).passed
    assert not run_stats(labels2, success, Thresholds(min_coverage=0.3, min_lacking_failures=1)).passed


def test_no_failures():
    s = run_stats([L, P, P], [True, True, True], Thresholds())
    assert s.er_minus is None and s.coverage is None and s.delta is None and not s.passed
    assert s.er_plus == pytest.approx(1 / 3)
    [score] = contrastive_scores({"c": [[L, P, P]]}, [True, True, True], Thresholds(bootstrap=50))
    assert not score.retained and any("no failed" in n for n in score.notes)


def test_no_successes():
    s = run_stats([L, L, P], [False, False, False], Thresholds())
    assert s.er_minus == pytest.approx(2 / 3) and s.coverage == pytest.approx(2 / 3)
    assert s.er_plus is None and s.delta is None and not s.passed  # nothing to contrast with
    [score] = contrastive_scores({"c": [[L, L, P]]}, [False] * 3, Thresholds(bootstrap=50))
    assert not score.retained and any("no successful" in n for n in score.notes)


def test_all_na():
    s = run_stats([N, N, N, N], [False, True, False, True], Thresholds())
    assert (s.LF, s.PF, s.LP, s.PP, s.NA) == (0, 0, 0, 0, 4)
    assert s.er_minus is None and s.er_plus is None and s.delta is None
    assert s.coverage == 0.0 and not s.passed
    [score] = contrastive_scores({"c": [[N] * 4]}, [False, True, False, True], Thresholds(bootstrap=50))
    assert score.mean_delta is None and any("all NA" in n for n in score.notes)


def test_capability_never_lacking():
    s = run_stats([P, P, P, P], [False, False, True, True], Thresholds())
    assert s.er_minus == 0.0 and s.er_plus == 0.0 and s.delta == 0.0 and s.coverage == 0.0 and not s.passed


def test_k_of_r_stability_and_sorting():
    success = [False] * 5 + [True] * 5
    strong = [L] * 5 + [P] * 5                      # delta 1.0 coverage 1.0
    weak = [L] + [P] * 4 + [P] * 5                  # delta 0.2 coverage 0.2: passes
    fails = [P] * 10                                # delta 0
    # c1 passes in 8 of 10 runs -> retained; c2 in 7 of 10 -> not
    c1 = [strong] * 8 + [fails] * 2
    c2 = [weak] * 7 + [fails] * 3
    scores = contrastive_scores({"c2": c2, "c1": c1}, success, Thresholds(bootstrap=0, min_lacking_failures=1))
    assert [s.name for s in scores] == ["c1", "c2"]     # sorted by mean delta
    by = {s.name: s for s in scores}
    assert by["c1"].runs_passed == 8 and by["c1"].runs_needed == 8 and by["c1"].retained
    assert by["c2"].runs_passed == 7 and not by["c2"].retained
    assert by["c1"].mean_delta == pytest.approx(0.8)
    assert by["c2"].mean_delta == pytest.approx(0.7 * 0.2)
    # fewer runs scale the requirement: ceil(0.8 * 3) = 3; an explicit count overrides it
    assert Thresholds().runs_needed(3) == 3 and Thresholds(min_runs_passed=2).runs_needed(3) == 2
    assert contrastive_scores({"c": [strong, strong, fails]}, success,
                              Thresholds(bootstrap=0, min_runs_passed=2))[0].retained


def test_bootstrap_interval_contains_the_estimate_and_is_seeded():
    success = [False] * 20 + [True] * 20
    labels = [L] * 12 + [P] * 8 + [L] * 2 + [P] * 18
    a = contrastive_scores({"c": [labels]}, success, Thresholds(bootstrap=400, seed=3))[0]
    b = contrastive_scores({"c": [labels]}, success, Thresholds(bootstrap=400, seed=3))[0]
    assert a.delta_ci == b.delta_ci and a.coverage_ci == b.coverage_ci
    assert a.delta_ci[0] <= a.mean_delta <= a.delta_ci[1]
    assert a.coverage_ci[0] <= a.mean_coverage <= a.coverage_ci[1]
    assert a.mean_delta == pytest.approx(0.6 - 0.1)
    assert a.delta_ci[1] - a.delta_ci[0] > 0.05


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError):
        run_stats(["maybe"], [True], Thresholds())
    with pytest.raises(ValueError):
        run_stats([L], [True, False], Thresholds())
    with pytest.raises(ValueError):
        Thresholds(min_coverage=1.5)
    assert math.isclose(Thresholds().min_delta, 0.2)


def test_minimum_evidence_one_failure_out_of_forty():
    """One LACKING failure among 40 trajectories gives Δ = 1.00 and a degenerate interval: not evidence."""
    success = [False] + [True] * 39
    labels = [L] + [P] * 39
    [thin] = contrastive_scores({"c": [labels]}, success, Thresholds(bootstrap=300))
    assert thin.mean_delta == 1.0 and thin.runs[0].LF == 1
    assert not thin.retained and any("minimum evidence of 3" in n for n in thin.notes)
    [old] = contrastive_scores({"c": [labels]}, success, Thresholds(bootstrap=300, min_lacking_failures=1))
    assert old.retained  # the rule off: the paper's thresholds alone retain it
    # the boundary is inclusive, and every run is held to it
    success = [False] * 3 + [True] * 37
    assert contrastive_scores({"c": [[L] * 3 + [P] * 37]}, success, Thresholds(bootstrap=0))[0].retained
    assert not contrastive_scores({"c": [[L] * 3 + [P] * 37]}, success,
                                  Thresholds(bootstrap=0, min_lacking_failures=4))[0].retained
    with pytest.raises(ValueError, match="min_lacking_failures"):
        Thresholds(min_lacking_failures=0)


def test_explain_away_by_hand():
    """a explains 6 of 10 failures; b the other 4, and is PRESENT on a's, which dilutes it.

    Paper's rule: Δ(b) = ER⁻ 4/10 − ER⁺ 5/20 = 0.15 < 0.20: lost. Explain-away: after a, the pool holds
    b's 4 failures (all LACKING): Δ(b) = 1.0 − 0.25 = 0.75, coverage 1.0: retained.
    """
    success = [False] * 10 + [True] * 20
    a = [L] * 6 + [P] * 4 + [P] * 20
    b = [P] * 6 + [L] * 4 + [L] * 5 + [P] * 15
    paper = {s.name: s for s in contrastive_scores({"a": [a], "b": [b]}, success, Thresholds(bootstrap=0))}
    assert paper["a"].retained and paper["b"].mean_delta == pytest.approx(0.4 - 0.25) and not paper["b"].retained
    ea = contrastive_scores({"a": [a], "b": [b]}, success, Thresholds(bootstrap=0, explain_away=True))
    assert [s.name for s in ea] == ["a", "b"] and all(s.retained for s in ea)
    assert (ea[0].round, ea[0].pool_failed) == (0, 10) and (ea[1].round, ea[1].pool_failed) == (1, 4)
    assert ea[1].mean_delta == pytest.approx(1.0 - 0.25) and ea[1].mean_coverage == pytest.approx(1.0)
    # a capability that explains nothing new is not retained in a later round
    c = list(a)
    ea3 = {s.name: s for s in contrastive_scores({"a": [a], "b": [b], "c": [c]}, success,
                                                 Thresholds(bootstrap=0, explain_away=True))}
    assert sum(s.retained for s in ea3.values()) == 2 and ea3["b"].retained
