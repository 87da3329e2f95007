"""The contrastive statistics of TRACE (docs/design.md, "The method's settings"), exactly as the method defines them.

For one labelling run and one capability ``c``, over the trajectories labelled LACKING or PRESENT
(NA and missing labels are left out):

* ``LF``/``PF``: failed trajectories labelled LACKING / PRESENT; ``LP``/``PP``: successful ones;
* ``ER⁻ = LF / (LF + PF)`` — how often the capability is lacking when the agent fails;
* ``ER⁺ = LP / (LP + PP)`` — how often it is lacking when the agent succeeds anyway;
* ``Δ = ER⁻ − ER⁺``; ``coverage = LF / #failed`` (all failed trajectories, whatever their label).

A run *passes* for ``c`` when ``Δ ≥ min_delta``, ``coverage ≥ min_coverage`` and at least
``min_lacking_failures`` failed trajectories are labelled LACKING (the minimum-evidence rule: with a
small sample one LACKING failure out of 40 gives Δ = 1.00 and a degenerate interval [1.00, 1.00],
which is no evidence at all); ``c`` is *retained* when it passes in at least ``min_runs_passed`` of
the ``R`` runs (8 of 10 by default, scaled as ``ceil(0.8 R)`` for other ``R``). Capabilities are
sorted by mean Δ over the runs.

Explain-away (``Thresholds.explain_away``, off by default; the default is the paper's rule). When
several deficits each cause a share of the failures, the failures caused by the others are PRESENT
failures for a capability and dilute its ER⁻: with four deficits at ~10% each the paper's rule loses
one. Explain-away retains the strongest capability that passes, removes the failures it explains
(labelled LACKING by it in a majority of runs), recomputes every remaining capability's statistics on
the successes plus the unexplained failures, and repeats until none passes. Each retained
capability's statistics are those of the round that retained it (``CapabilityScore.round``).

Undefined quantities stay undefined (``None``), never 0: with no labelled failure ER⁻ is undefined,
with no labelled success ER⁺ is undefined, and Δ is undefined when either is. A run whose Δ or
coverage is undefined does not pass. Bootstrap confidence intervals resample trajectories (the same
resample for every run) and report percentile intervals of mean Δ and mean coverage.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

NA, PRESENT, LACKING, MISSING = "NA", "PRESENT", "LACKING", None


@dataclass
class Thresholds:
    """When a capability is retained (docs/design.md, "The method's settings" defaults).

    Attributes:
        min_delta: a run passes only if Δ = ER⁻ − ER⁺ is at least this.
        min_coverage: a run passes only if LF / #failed is at least this.
        min_runs_fraction: the share of runs that must pass (0.8 = 8 of 10); used when ``min_runs_passed`` is None.
        min_runs_passed: an explicit number of runs that must pass (overrides ``min_runs_fraction``).
        min_lacking_failures: minimum evidence: a run passes only if at least this many failed
            trajectories are labelled LACKING (LF); 1 turns the rule off.
        explain_away: retain iteratively, recomputing on the failures the retained capabilities do
            not explain (see the module docstring); False is the paper's rule.
        bootstrap: bootstrap resamples for the confidence intervals (0 = none).
        confidence: the two-sided confidence level of the intervals.
        seed: the bootstrap's random seed.
    """

    min_delta: float = 0.20
    min_coverage: float = 0.10
    min_runs_fraction: float = 0.8
    min_runs_passed: int | None = None
    min_lacking_failures: int = 3
    explain_away: bool = False
    bootstrap: int = 1000
    confidence: float = 0.95
    seed: int = 0

    def __post_init__(self) -> None:
        if not -1.0 <= self.min_delta <= 1.0:
            raise ValueError(f"min_delta must be in [-1, 1], got {self.min_delta}")
        if not 0.0 <= self.min_coverage <= 1.0:
            raise ValueError(f"min_coverage must be in [0, 1], got {self.min_coverage}")
        if not 0.0 < self.min_runs_fraction <= 1.0:
            raise ValueError(f"min_runs_fraction must be in (0, 1], got {self.min_runs_fraction}")
        if self.min_runs_passed is not None and self.min_runs_passed < 1:
            raise ValueError(f"min_runs_passed must be >= 1, got {self.min_runs_passed}")
        if self.min_lacking_failures < 1:
            raise ValueError(f"min_lacking_failures must be >= 1 (1 = no minimum), got {self.min_lacking_failures}")
        if self.bootstrap < 0 or not 0.0 < self.confidence < 1.0:
            raise ValueError("bootstrap must be >= 0 and confidence in (0, 1)")

    def runs_needed(self, runs: int) -> int:
        if self.min_runs_passed is not None:
            return min(self.min_runs_passed, runs) if runs else self.min_runs_passed
        return max(1, math.ceil(self.min_runs_fraction * runs - 1e-9))


@dataclass
class RunStats:
    """The counts and rates of one capability in one labelling run."""

    LF: int
    PF: int
    LP: int
    PP: int
    NA: int
    missing: int
    failed: int
    succeeded: int
    er_minus: float | None
    er_plus: float | None
    delta: float | None
    coverage: float | None
    passed: bool


def run_stats(labels: Sequence[str | None], success: Sequence[bool], thresholds: Thresholds) -> RunStats:
    """The statistics of one capability in one run (``labels[i]`` for trajectory ``i``; ``None`` = missing)."""
    if len(labels) != len(success):
        raise ValueError(f"{len(labels)} labels for {len(success)} trajectories")
    count = {"LF": 0, "PF": 0, "LP": 0, "PP": 0, "NA": 0, "missing": 0}
    for label, ok in zip(labels, success):
        if label is None:
            count["missing"] += 1
        elif label == NA:
            count["NA"] += 1
        elif label in (LACKING, PRESENT):
            count[("L" if label == LACKING else "P") + ("P" if ok else "F")] += 1
        else:
            raise ValueError(f"unknown label {label!r}; expected NA, PRESENT, LACKING or None (missing)")
    failed = sum(1 for ok in success if not ok)
    succeeded = len(success) - failed
    lf, pf, lp, pp = count["LF"], count["PF"], count["LP"], count["PP"]
    er_minus = lf / (lf + pf) if lf + pf else None
    er_plus = lp / (lp + pp) if lp + pp else None
    delta = er_minus - er_plus if er_minus is not None and er_plus is not None else None
    coverage = lf / failed if failed else None
    passed = (delta is not None and coverage is not None and delta >= thresholds.min_delta - 1e-12
              and coverage >= thresholds.min_coverage - 1e-12 and lf >= thresholds.min_lacking_failures)
    return RunStats(lf, pf, lp, pp, count["NA"], count["missing"], failed, succeeded, er_minus, er_plus, delta,
                    coverage, passed)


@dataclass
class CapabilityScore:
    """A capability's statistics over all runs."""

    name: str
    runs: list[RunStats]
    runs_passed: int
    runs_needed: int
    retained: bool
    mean_delta: float | None
    mean_coverage: float | None
    mean_er_minus: float | None
    mean_er_plus: float | None
    delta_ci: tuple[float, float] | None = None
    coverage_ci: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)
    round: int | None = None  # explain-away: the round whose pool these statistics come from (0 = all)
    pool_failed: int | None = None  # explain-away: failed trajectories in that round's pool

    def to_dict(self) -> dict:
        d = asdict(self)
        d["delta_ci"] = list(self.delta_ci) if self.delta_ci else None
        d["coverage_ci"] = list(self.coverage_ci) if self.coverage_ci else None
        return d


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def contrastive_scores(labels: dict[str, list[list[str | None]]], success: Sequence[bool],
                       thresholds: Thresholds | None = None) -> list[CapabilityScore]:
    """Score every capability and sort by mean Δ (undefined last).

    Args:
        labels: ``labels[capability][run][trajectory]`` = ``NA`` / ``PRESENT`` / ``LACKING`` / ``None`` (missing).
        success: whether each trajectory succeeded.
        thresholds: retention thresholds and bootstrap settings.
    """
    th = thresholds or Thresholds()
    success = [bool(s) for s in success]
    if th.explain_away:
        return explain_away_scores(labels, success, th)
    return _score_all(labels, success, th)


def _score_all(labels: dict[str, list[list[str | None]]], success: list[bool], th: Thresholds
               ) -> list[CapabilityScore]:
    out = []
    for name, runs in labels.items():
        if not runs:
            raise ValueError(f"capability {name!r} has no labelling run")
        stats = [run_stats(r, success, th) for r in runs]
        needed = th.runs_needed(len(runs))
        passed = sum(s.passed for s in stats)
        score = CapabilityScore(
            name=name, runs=stats, runs_passed=passed, runs_needed=needed, retained=passed >= needed,
            mean_delta=_mean([s.delta for s in stats]), mean_coverage=_mean([s.coverage for s in stats]),
            mean_er_minus=_mean([s.er_minus for s in stats]), mean_er_plus=_mean([s.er_plus for s in stats]))
        if not any(not s for s in success):
            score.notes.append("no failed trajectory: ER⁻ and coverage are undefined")
        elif not any(success):
            score.notes.append("no successful trajectory: ER⁺ and Δ are undefined (nothing to contrast with)")
        if all(s.LF + s.PF + s.LP + s.PP == 0 for s in stats):
            score.notes.append("never labelled PRESENT or LACKING (all NA or missing)")
        thin = [s.LF for s in stats if s.LF < th.min_lacking_failures]
        if thin and any(s.delta is not None and s.delta >= th.min_delta - 1e-12 for s in stats):
            score.notes.append(f"only {min(thin)} failed trajectory(ies) labelled LACKING in some run(s), below the "
                               f"minimum evidence of {th.min_lacking_failures}: those runs do not pass")
        if th.bootstrap:
            score.delta_ci, score.coverage_ci = bootstrap_ci(runs, success, th)
        out.append(score)
    out.sort(key=lambda s: (s.mean_delta is None, -(s.mean_delta or 0.0), s.name))
    return out


def bootstrap_ci(runs: list[list[str | None]], success: Sequence[bool], th: Thresholds
                 ) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """Percentile intervals of mean Δ and mean coverage, resampling trajectories with replacement."""
    n = len(success)
    if n == 0:
        return None, None
    rng = np.random.default_rng(th.seed)
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=th.bootstrap).astype(np.float64)  # B × N
    fail = np.array([not s for s in success], dtype=np.float64)
    failed = weights @ fail  # B
    deltas, coverages = [], []
    for labels in runs:
        lack = np.array([lab == LACKING for lab in labels], dtype=np.float64)
        pres = np.array([lab == PRESENT for lab in labels], dtype=np.float64)
        lf, pf = weights @ (lack * fail), weights @ (pres * fail)
        lp, pp = weights @ (lack * (1 - fail)), weights @ (pres * (1 - fail))
        with np.errstate(divide="ignore", invalid="ignore"):
            er_m = np.where(lf + pf > 0, lf / (lf + pf), np.nan)
            er_p = np.where(lp + pp > 0, lp / (lp + pp), np.nan)
            deltas.append(er_m - er_p)
            coverages.append(np.where(failed > 0, lf / failed, np.nan))
    alpha = (1 - th.confidence) / 2

    def interval(samples: list[np.ndarray]) -> tuple[float, float] | None:
        stacked = np.vstack(samples)  # R × B
        with np.errstate(invalid="ignore"):
            valid = ~np.isnan(stacked)
            counts = valid.sum(axis=0)
            sums = np.where(valid, stacked, 0.0).sum(axis=0)
        means = sums[counts > 0] / counts[counts > 0]
        if means.size < max(10, th.bootstrap // 2):  # mostly undefined: no honest interval
            return None
        lo, hi = np.quantile(means, [alpha, 1 - alpha])
        return round(float(lo), 6), round(float(hi), 6)

    return interval(deltas), interval(coverages)


def _explained(runs: list[list[str | None]], i: int) -> bool:
    """Whether trajectory ``i`` is labelled LACKING in a majority of the runs."""
    return sum(run[i] == LACKING for run in runs) * 2 > len(runs)


def explain_away_scores(labels: dict[str, list[list[str | None]]], success: Sequence[bool],
                        thresholds: Thresholds | None = None) -> list[CapabilityScore]:
    """Iterative retention: keep the strongest passing capability, explain its failures away, repeat.

    Round 0 is the paper's rule over every trajectory. After each round the capability with the
    highest mean Δ among those that pass is retained, the failures it labels LACKING (in a majority
    of runs) leave the pool, and the capabilities not yet retained are scored again on the successes
    plus the remaining failures. Stops when none passes. Returns the retained capabilities in the
    order they were retained (each with the statistics of its round), then the others with the
    statistics of the last round.
    """
    th = thresholds or Thresholds()
    success = [bool(s) for s in success]
    n = len(success)
    active = list(range(n))
    retained: list[CapabilityScore] = []
    last: dict[str, CapabilityScore] = {}
    remaining = dict(labels)
    for rnd in range(len(labels) + 1):
        sub = {name: [[run[i] for i in active] for run in runs] for name, runs in remaining.items()}
        pool_success = [success[i] for i in active]
        scores = _score_all(sub, pool_success, th) if sub else []
        failed = pool_success.count(False)
        for s in scores:
            s.round, s.pool_failed = rnd, failed
            if rnd:
                s.notes.append(f"explain-away round {rnd}: scored on the {failed} failure(s) the capabilities "
                               f"retained before it do not explain")
            last[s.name] = s
        best = next((s for s in scores if s.retained), None)
        if best is None:
            break
        retained.append(best)
        full = remaining.pop(best.name)
        active = [i for i in active if success[i] or not _explained(full, i)]
    others = [s for name, s in last.items() if name not in {r.name for r in retained}]
    for s in others:
        s.retained = False
    others.sort(key=lambda s: (s.mean_delta is None, -(s.mean_delta or 0.0), s.name))
    return retained + others
