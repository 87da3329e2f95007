"""Evaluation of trajectories: pass@1, pass^k, per-scenario breakdown, bootstrap CIs, comparisons.

The unit is the *task*: one ``(env_id, seed)``. Its K trajectories (``sample`` 0..K-1) are its trials.

* pass@1 is the mean over tasks of the fraction of successful trials (τ²-bench's pass^1).
* pass^k (τ²-bench, docs/design.md, "Target environments") is, per task with n trials and c successes, C(c, k) / C(n, k) — the
  chance that k trials drawn without replacement all succeed — averaged over the tasks with n ≥ k.
* Confidence intervals are percentile bootstraps over tasks (tasks resampled with replacement).
* :func:`compare` pairs a base and a candidate on the tasks both ran, and bootstraps the difference
  over those shared tasks (a paired bootstrap), so task difficulty cancels out.

The scenario of a trajectory is its ``scenario`` field (written by :mod:`trace_train.rollouts`), or
``task["scenario"]`` (the env's ``task_info()``, written by :func:`trace_envs.rollout`); trajectories
without one count only in the overall and per-env rows.

:func:`write_report` / :func:`write_comparison` write JSON, a Markdown table and a PNG chart.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

Task = tuple[str, int]


def pass_hat_k(successes: int, trials: int, k: int) -> float:
    """τ²-bench's per-task pass^k: C(successes, k) / C(trials, k)."""
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} and {trials}")
    if k < 1 or k > trials:
        raise ValueError(f"k must be in 1..trials ({trials}), got {k}")
    return math.comb(successes, k) / math.comb(trials, k)


def load_records(source: str | Path | Iterable[dict]) -> list[dict]:
    """Trajectory records from a JSONL file or an iterable of dicts."""
    if isinstance(source, (str, Path)):
        from .rollouts import read_trajectories

        return read_trajectories(source)
    return list(source)


def task_outcomes(records: Iterable[dict]) -> dict[Task, dict]:
    """Per task: trials, successes, summed reward, and its scenario. Episodes that ended in ``env_error`` (the
    machine failed, not the agent) are no trials: they are counted by :func:`env_error_count`."""
    tasks: dict[Task, dict] = {}
    seen: set[tuple[str, int, int]] = set()
    for r in records:
        if r.get("termination") == "env_error":
            continue
        key = (str(r["env_id"]), int(r["seed"]))
        trial = key + (int(r.get("sample", 0)),)
        if trial in seen:  # a duplicated line must not count twice
            continue
        seen.add(trial)
        scenario = r.get("scenario")
        if scenario is None and isinstance(r.get("task"), dict):
            scenario = r["task"].get("scenario")
        t = tasks.setdefault(key, {"trials": 0, "successes": 0, "reward": 0.0, "scenario": scenario})
        t["trials"] += 1
        t["successes"] += int(bool(r.get("success")))
        t["reward"] += float(r.get("reward", 0.0))
    return tasks


def env_error_count(records: Iterable[dict]) -> int:
    """Episodes that ended in ``env_error``: left out of every metric, reported beside them."""
    return sum(r.get("termination") == "env_error" for r in records)


def _per_task_values(tasks: list[dict], ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Arrays over tasks; NaN where a metric is undefined for a task (fewer trials than k)."""
    values = {"mean_reward": np.array([t["reward"] / t["trials"] for t in tasks], dtype=float)}
    for k in ks:
        values[f"pass^{k}"] = np.array([pass_hat_k(t["successes"], t["trials"], k) if t["trials"] >= k else np.nan
                                        for t in tasks], dtype=float)
    values["pass@1"] = values.pop("pass^1") if 1 in ks else np.array(
        [t["successes"] / t["trials"] for t in tasks], dtype=float)
    return values


def _bootstrap(values: np.ndarray, n_boot: int, rng: np.random.Generator, level: float) -> tuple[float, float]:
    valid = values[~np.isnan(values)]
    if len(valid) == 0:
        return (math.nan, math.nan)
    idx = rng.integers(0, len(valid), size=(n_boot, len(valid)))
    means = valid[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def _estimate(values: np.ndarray, n_boot: int, rng: np.random.Generator, level: float) -> dict | None:
    """Mean of the non-NaN per-task values with its bootstrap CI (None when there are none)."""
    valid = values[~np.isnan(values)]
    if len(valid) == 0:
        return None
    lo, hi = _bootstrap(values, n_boot, rng, level) if n_boot > 0 else (math.nan, math.nan)
    return {"value": float(valid.mean()), "ci": [lo, hi], "n_tasks": int(len(valid))}


def summarize(tasks: list[dict], ks: Sequence[int], n_boot: int, rng: np.random.Generator, level: float) -> dict:
    """Point estimates and bootstrap CIs of every metric over a list of task outcomes."""
    out: dict[str, Any] = {"tasks": len(tasks), "trials": int(sum(t["trials"] for t in tasks))}
    if not tasks:
        return out
    for name, vals in _per_task_values(tasks, ks).items():
        out[name] = _estimate(vals, n_boot, rng, level)
    return out


def evaluate(source: str | Path | Iterable[dict], ks: Sequence[int] = (1, 2, 4), n_boot: int = 1000,
             level: float = 0.95, seed: int = 0) -> dict:
    """Metrics of a set of trajectories, overall, per env id and per scenario.

    Args:
        source: a trajectory JSONL file or records.
        ks: the k of pass^k (1 is reported as ``pass@1``); a k above a task's trial count skips that task.
        n_boot: bootstrap resamples (0 disables CIs).
        level: confidence level of the intervals.
        seed: bootstrap RNG seed (results are reproducible).

    Returns:
        ``{"overall": {...}, "by_env": {env_id: {...}}, "by_scenario": {scenario: {...}}, "agents": [...], ...}``
        where each ``{...}`` has ``tasks``, ``trials`` and per metric ``{"value", "ci", "n_tasks"}``.
    """
    records = load_records(source)
    ks = sorted(set(int(k) for k in ks) | {1})
    tasks = task_outcomes(records)
    rng = np.random.default_rng(seed)
    values = list(tasks.values())
    result = {"ks": ks, "n_boot": n_boot, "level": level,
              "agents": sorted({str(r.get("agent", "")) for r in records}),
              "env_errors": env_error_count(records),
              "overall": summarize(values, ks, n_boot, rng, level), "by_env": {}, "by_scenario": {}}
    by_env: dict[str, list] = defaultdict(list)
    by_scenario: dict[str, list] = defaultdict(list)
    for (env_id, _), t in sorted(tasks.items()):
        by_env[env_id].append(t)
        if t["scenario"] is not None:
            by_scenario[str(t["scenario"])].append(t)
    for env_id, ts in by_env.items():
        result["by_env"][env_id] = summarize(ts, ks, n_boot, rng, level)
    for scenario, ts in sorted(by_scenario.items()):
        result["by_scenario"][scenario] = summarize(ts, ks, n_boot, rng, level)
    from trace_envs.calibration import decision_accuracy

    # A decision env (act or refuse): success on allowed and on must-refuse requests apart, so that learning
    # the decision shows apart from learning the prior.
    decisions = {env_id: decision_accuracy(r for r in records if str(r["env_id"]) == env_id) for env_id in by_env}
    result["decisions"] = {env_id: d for env_id, d in decisions.items() if d}
    return result


def breakdown_summary(source: str | Path | Iterable[dict]) -> dict[str, float]:
    """What paid the reward: per ``reward_breakdown`` key, the share of episodes where it is true (booleans) or
    its mean (numbers), plus ``reward`` and ``success``; read it before reading a gain in mean reward as a skill."""
    records = load_records(source)
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for r in records:
        values = {"reward": r.get("reward", 0.0), "success": bool(r.get("success")), **(r.get("reward_breakdown") or {})}
        for key, value in values.items():
            if isinstance(value, bool) or (isinstance(value, (int, float)) and key not in ("difficulty", "version")):
                sums[key] += float(value)
                counts[key] += 1
    return {key: sums[key] / counts[key] for key in sums}


def compare(base: str | Path | Iterable[dict], candidate: str | Path | Iterable[dict], ks: Sequence[int] = (1, 2, 4),
            n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
    """Base vs candidate on the tasks both ran (same env ids and seeds), with paired bootstrap CIs.

    Returns:
        ``{"shared_tasks", "only_base", "only_candidate", "base": eval, "candidate": eval (each with
        ``decisions``: a decision env's success on allowed and must-refuse requests apart),
        "delta": {metric: {"value", "ci"}}, "delta_by_scenario": {...}, "tasks": {"improved", "regressed", "same"}}``.
    """
    ks = sorted(set(int(k) for k in ks) | {1})
    b_records, c_records = load_records(base), load_records(candidate)
    b_tasks, c_tasks = task_outcomes(b_records), task_outcomes(c_records)
    shared = sorted(set(b_tasks) & set(c_tasks))
    rng = np.random.default_rng(seed)
    b_list, c_list = [b_tasks[t] for t in shared], [c_tasks[t] for t in shared]

    def deltas(bl: list[dict], cl: list[dict]) -> dict:
        out: dict[str, Any] = {}
        if not bl:
            return out
        bv, cv = _per_task_values(bl, ks), _per_task_values(cl, ks)
        for name in bv:
            out[name] = _estimate(cv[name] - bv[name], n_boot, rng, level)  # NaN where a side lacks trials
        return out

    rate = lambda t: t["successes"] / t["trials"]  # noqa: E731
    improved = sum(rate(c) > rate(b) for b, c in zip(b_list, c_list))
    regressed = sum(rate(c) < rate(b) for b, c in zip(b_list, c_list))
    result = {
        "ks": ks, "n_boot": n_boot, "level": level,
        "shared_tasks": len(shared), "only_base": len(set(b_tasks) - set(c_tasks)),
        "only_candidate": len(set(c_tasks) - set(b_tasks)),
        "base": {"overall": summarize(b_list, ks, n_boot, rng, level), "by_scenario": {}},
        "candidate": {"overall": summarize(c_list, ks, n_boot, rng, level), "by_scenario": {}},
        "delta": deltas(b_list, c_list), "delta_by_scenario": {},
        "tasks": {"improved": int(improved), "regressed": int(regressed),
                  "same": int(len(shared) - improved - regressed)},
    }
    scenarios = sorted({str(b_tasks[t]["scenario"]) for t in shared if b_tasks[t]["scenario"] is not None})
    for s in scenarios:
        sel = [t for t in shared if str(b_tasks[t]["scenario"]) == s]
        bl, cl = [b_tasks[t] for t in sel], [c_tasks[t] for t in sel]
        result["base"]["by_scenario"][s] = summarize(bl, ks, n_boot, rng, level)
        result["candidate"]["by_scenario"][s] = summarize(cl, ks, n_boot, rng, level)
        result["delta_by_scenario"][s] = deltas(bl, cl)
    from trace_envs.calibration import decision_accuracy

    keep = set(shared)
    for side, records in (("base", b_records), ("candidate", c_records)):
        envs = sorted({str(r["env_id"]) for r in records})
        on_shared = [r for r in records if (str(r["env_id"]), int(r["seed"])) in keep]
        decisions = {e: decision_accuracy(r for r in on_shared if str(r["env_id"]) == e) for e in envs}
        result[side]["decisions"] = {e: d for e, d in decisions.items() if d}
    return result


# ----------------------------------------------------------------------------- reports


def _metric_names(ks: Sequence[int]) -> list[str]:
    return ["pass@1"] + [f"pass^{k}" for k in ks if k != 1] + ["mean_reward"]


def _fmt(m: dict | None, signed: bool = False) -> str:
    if not m:
        return "–"
    v, (lo, hi) = m["value"], m["ci"]
    sign = "+" if signed else ""
    if math.isnan(lo):
        return f"{v:{sign}.3f}"
    return f"{v:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def markdown_table(result: dict) -> str:
    """The evaluation as a Markdown table (one row for all, per env id, per scenario)."""
    names = _metric_names(result["ks"])
    lines = [f"| group | tasks | trials | {' | '.join(names)} |", "|" + "---|" * (3 + len(names))]

    def row(label: str, s: dict) -> None:
        lines.append(f"| {label} | {s.get('tasks', 0)} | {s.get('trials', 0)} | "
                     + " | ".join(_fmt(s.get(n)) for n in names) + " |")

    row("**all**", result["overall"])
    if len(result["by_env"]) > 1:
        for env_id, s in result["by_env"].items():
            row(f"`{env_id}`", s)
    for scenario, s in result["by_scenario"].items():
        row(f"scenario `{scenario}`", s)
    pct = int(round(result["level"] * 100))
    text = "\n".join(lines) + f"\n\nValues with {pct}% bootstrap confidence intervals over tasks ({result['n_boot']} resamples).\n"
    for env_id, d in result.get("decisions", {}).items():
        text += (f"\nDecisions of `{env_id}`: success {d['allowed']['success']:.3f} on {d['allowed']['n']} allowed and "
                 f"{d['must_refuse']['success']:.3f} on {d['must_refuse']['n']} must-refuse requests; balanced "
                 f"accuracy {d['balanced_accuracy']:.3f}.\n")
    if result.get("env_errors"):
        text += (f"\n{result['env_errors']} episodes ended in `env_error` (the machine failed, not the agent) and "
                 "are left out of every value above.\n")
    return text


def comparison_table(result: dict) -> str:
    """Base vs candidate as a Markdown table (overall and per scenario)."""
    names = _metric_names(result["ks"])
    lines = ["| group | metric | base | candidate | Δ (paired) |", "|---|---|---|---|---|"]
    groups = [("**all**", result["base"]["overall"], result["candidate"]["overall"], result["delta"])]
    for s in result["delta_by_scenario"]:
        groups.append((f"scenario `{s}`", result["base"]["by_scenario"][s], result["candidate"]["by_scenario"][s],
                       result["delta_by_scenario"][s]))
    for label, b, c, d in groups:
        for n in names:
            lines.append(f"| {label} | {n} | {_fmt(b.get(n))} | {_fmt(c.get(n))} | {_fmt(d.get(n), signed=True)} |")
    t = result["tasks"]
    return ("\n".join(lines) + f"\n\n{result['shared_tasks']} shared tasks: {t['improved']} improved, "
            f"{t['regressed']} regressed, {t['same']} unchanged.\n")


def _bar_chart(groups: list[str], series: list[tuple[str, list[dict | None]]], metric: str, path: Path,
               title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(groups) * len(series) + 1.5), 3.6), dpi=120)
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    for i, (label, stats) in enumerate(series):
        vals = [s["value"] if s else 0.0 for s in stats]
        lo = [max(0.0, s["value"] - s["ci"][0]) if s and not math.isnan(s["ci"][0]) else 0.0 for s in stats]
        hi = [max(0.0, s["ci"][1] - s["value"]) if s and not math.isnan(s["ci"][1]) else 0.0 for s in stats]
        ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width, yerr=[lo, hi], capsize=3, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels(groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel(metric)
    ax.set_title(title, fontsize=9)
    ax.grid(axis="y", alpha=0.3)
    if len(series) > 1:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(result: dict, out_dir: str | Path, stem: str = "eval") -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (pass@1 per group with CIs)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["json"].write_text(json.dumps(result, indent=2))
    paths["md"].write_text(markdown_table(result))
    groups = ["all"] + list(result["by_scenario"])
    stats = [result["overall"]] + list(result["by_scenario"].values())
    series = [("pass@1", [s.get("pass@1") for s in stats])]
    for k in result["ks"]:
        if k != 1:
            series.append((f"pass^{k}", [s.get(f"pass^{k}") for s in stats]))
    _bar_chart(groups, series, "success", paths["png"], ", ".join(result["agents"]) or "evaluation")
    return paths


def write_comparison(result: dict, out_dir: str | Path, stem: str = "compare", base_label: str = "base",
                     candidate_label: str = "candidate") -> dict[str, Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and ``<stem>.png`` (pass@1, base vs candidate, per scenario)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["json"].write_text(json.dumps(result, indent=2))
    paths["md"].write_text(comparison_table(result))
    scen = list(result["delta_by_scenario"])
    groups = ["all"] + scen
    series = [(base_label, [result["base"]["overall"].get("pass@1")]
               + [result["base"]["by_scenario"][s].get("pass@1") for s in scen]),
              (candidate_label, [result["candidate"]["overall"].get("pass@1")]
               + [result["candidate"]["by_scenario"][s].get("pass@1") for s in scen])]
    _bar_chart(groups, series, "pass@1", paths["png"], f"{base_label} vs {candidate_label} "
               f"({result['shared_tasks']} shared tasks)")
    return paths
