"""The human-readable outputs of the analysis: a Markdown report, a figure, and capability specs.

The figure has two panels: each capability's mean Δ against its mean coverage (bootstrap intervals
as error bars, the thresholds drawn, the retained region shaded) and its stability (runs passed out
of R, with the number needed). A capability spec (``specs/<name>.json``) is what the generator stage
reads to build an environment for one retained capability: name, definition, the target env id,
that env's tool schemas, its statistics and example failures with their evidence.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from .transcript import condense


def _fmt(x, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _ci(ci) -> str:
    return "" if not ci else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def plot_capabilities(data: dict, path: Path) -> Path:
    """Δ vs coverage with the thresholds, and runs passed per capability; saved as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caps = data["capabilities"]
    th = data["thresholds"]
    runs = data["runs"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5), gridspec_kw={"width_ratios": [1.25, 1]})
    ax.axvspan(th["min_coverage"], 1.05, ymin=0, ymax=1, color="none")
    ax.fill_between([th["min_coverage"], 1.05], th["min_delta"], 1.05, color="#d9f2d9", zorder=0,
                    label="retained region")
    ax.axhline(th["min_delta"], color="#555", ls="--", lw=1)
    ax.axvline(th["min_coverage"], color="#555", ls="--", lw=1)
    ax.text(1.03, th["min_delta"] + 0.015, f"Δ ≥ {th['min_delta']:.2f}", ha="right", va="bottom", fontsize=9,
            color="#333")
    ax.text(th["min_coverage"] + 0.01, -0.98, f"coverage ≥ {th['min_coverage']:.2f}", ha="left", va="bottom",
            fontsize=9, color="#333", rotation=90)
    placed: list[tuple[float, float]] = []
    for c in caps:
        if c["delta"] is None or c["coverage"] is None:
            continue
        x, y = c["coverage"], c["delta"]
        color = "#1a7f37" if c["retained"] else "#8c8c8c"
        xerr = [[x - c["coverage_ci"][0]], [c["coverage_ci"][1] - x]] if c.get("coverage_ci") else None
        yerr = [[y - c["delta_ci"][0]], [c["delta_ci"][1] - y]] if c.get("delta_ci") else None
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="o", ms=8, color=color, ecolor=color, elinewidth=1,
                    capsize=3, zorder=3)
        dy = 0.06
        while any(abs(px - x) < 0.2 and abs(py - (y + dy)) < 0.06 for px, py in placed):
            dy -= 0.09
        placed.append((x, y + dy))
        ax.annotate(c["name"], (x, y), xytext=(x + 0.015, y + dy), fontsize=9, color=color,
                    ha="left" if x < 0.7 else "right", zorder=4)
    ax.set_xlim(-0.02, 1.05)
    ax.set_ylim(-1.0, 1.05)
    ax.set_xlabel("coverage = LF / #failed")
    ax.set_ylabel("Δ = ER⁻ − ER⁺")
    ax.set_title(f"Capabilities: mean over {runs} run(s), {data['summary']['trajectories']} trajectories "
                 f"({data['summary']['failed']} failed)", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)

    names = [c["name"] for c in caps][::-1]
    passed = [c["runs_passed"] for c in caps][::-1]
    needed = caps[0]["runs_needed"] if caps else 1
    colors = ["#1a7f37" if c["retained"] else "#8c8c8c" for c in caps][::-1]
    bars = bx.barh(names, passed, color=colors, height=0.6)
    for bar, k in zip(bars, passed):
        bx.text(bar.get_width() + 0.02 * max(runs, 1), bar.get_y() + bar.get_height() / 2, f"{k}/{runs}",
                va="center", fontsize=9)
    bx.axvline(needed, color="#b00", ls="--", lw=1.2, label=f"needed: {needed} of {runs}")
    bx.set_xlim(0, max(runs, 1) * 1.15)
    bx.set_xticks(range(0, max(runs, 1) + 1, max(1, runs // 10)))
    bx.set_xlabel(f"runs passed (of {runs})")
    bx.set_title("Stability: runs in which Δ and coverage pass", fontsize=10)
    bx.legend(loc="lower right", fontsize=8)
    bx.tick_params(axis="y", labelsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


def _target_env(data: dict, cap: dict) -> str | None:
    envs = {t["id"]: t["env_id"] for t in data["trajectories"]}
    fails = {t["id"] for t in data["trajectories"] if not t["success"]}
    counts = Counter(envs[i] for i, lab in cap["labels"].items() if lab == "LACKING" and i in fails)
    if not counts:
        counts = Counter(envs.values())
    return sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))[0][0] if counts else None


def _request_families(record: dict) -> list[str]:
    """The request families of a trajectory's task: ``task.families``; for a record written before those were
    recorded, its ``scenario`` label (a ``bundle:a+b`` label names its families, any other label is one)."""
    from trace_train.tiny.sft_data import scenario_families

    task = record.get("task") or {}
    if task.get("families"):
        return [str(f) for f in task["families"]]
    label = str(task.get("scenario") or record.get("scenario") or "")
    if not label:
        return []
    families = scenario_families(label)
    return families[1:] or families


def write_specs(data: dict, records: list[dict], ids: list[str], folder: Path, examples: int = 3) -> list[Path]:
    """One JSON spec per retained capability, for the generator stage."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.json"):
        old.unlink()
    index = {tid: i for i, tid in enumerate(ids)}
    paths = []
    for cap in data["capabilities"]:
        if not cap["retained"]:
            continue
        target = _target_env(data, cap)
        failing = [tid for tid, lab in cap["labels"].items()
                   if lab == "LACKING" and not records[index[tid]].get("success")]
        same_env = [t for t in failing if records[index[t]].get("env_id") == target] or failing
        tools = next((records[index[t]].get("tools") for t in same_env if records[index[t]].get("tools")), None)
        if tools is None:
            tools = next((r.get("tools") for r in records if r.get("env_id") == target and r.get("tools")), [])
        families = Counter(f for t in same_env for f in _request_families(records[index[t]]))
        spec = {
            "name": cap["name"],
            "definition": cap["definition"],
            "target_env": target,
            "tool_schemas": tools,
            "statistics": {k: cap[k] for k in ("delta", "coverage", "ER_minus", "ER_plus", "delta_ci", "coverage_ci",
                                               "runs_passed", "runs")},
            "source": {"labeler": data["labeler"], "trajectories": data["source"]},
            # Request families of every failure this capability is lacking in (the generator's focus).
            "failure_families": dict(sorted(families.items(), key=lambda kv: (-kv[1], kv[0]))),
            "example_failures": [
                {"trajectory": t, "env_id": records[index[t]].get("env_id"), "seed": records[index[t]].get("seed"),
                 "families": _request_families(records[index[t]]),
                 "evidence": (cap.get("offline_evidence") or {}).get(t, ""),
                 "transcript": condense(records[index[t]], max_chars=2500)}
                for t in same_env[:examples]],
        }
        path = folder / f"{re.sub(r'[^a-z0-9_]+', '_', cap['name'].lower())}.json"
        path.write_text(json.dumps(spec, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        paths.append(path)
    return paths


def write_report(data: dict, path: Path, figure: Path | None, specs: list[Path]) -> Path:
    """The Markdown report: data, thresholds, the capability table, cross-check, evidence."""
    th, s = data["thresholds"], data["summary"]
    lines = [
        "# Capability analysis",
        "",
        f"{s['trajectories']} trajectories ({s['failed']} failed, {s['succeeded']} succeeded) from "
        f"{', '.join(f'`{e}` ({n})' for e, n in s['envs'].items())}; agents: "
        f"{', '.join(f'`{a}` ({n})' for a, n in s['agents'].items())}.",
        "",
        f"Labeler: **{data['labeler']}**, {data['runs']} labelling run(s). A capability is retained when "
        f"Δ ≥ {th['min_delta']:.2f}, coverage ≥ {th['min_coverage']:.2f} and at least "
        f"{th.get('min_lacking_failures', 1)} failed trajectories labelled LACKING (minimum evidence) in at least "
        f"{data['capabilities'][0]['runs_needed'] if data['capabilities'] else '?'} of {data['runs']} run(s)"
        + ("; **explain-away**: retained one at a time, each later one scored on the failures the earlier ones "
           "do not explain" if th.get("explain_away") else " (the paper's rule)")
        + f". Intervals: {th['confidence']:.0%} bootstrap over trajectories ({th['bootstrap']} resamples).",
        "",
        f"**Retained ({len(data['retained'])}):** " + (", ".join(f"`{n}`" for n in data["retained"]) or "none"),
    ]
    un = data.get("unattributed")
    if un and un["failed"]:
        lines += ["", f"**Unattributed failures: {un['count']} of {un['failed']} ({un['share']:.0%})** — failed "
                      f"trajectories no retained capability labels LACKING; {un['no_lacking_label']} of them carry "
                      f"no LACKING label at all."]
    explain = bool(th.get("explain_away"))
    lines += [
        "",
        "| capability | retained | Δ [CI] | coverage [CI] | ER⁻ | ER⁺ | runs passed | LF (min " +
        f"{th.get('min_lacking_failures', 1)}) | PF | LP | PP | NA |" + (" round (failures in pool) |" if explain else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if explain else ""),
    ]
    for c in data["capabilities"]:
        r0 = c["per_run"][0]
        thin = "" if r0["LF"] >= th.get("min_lacking_failures", 1) else " (too few)"
        lines.append(f"| `{c['name']}` | {'yes' if c['retained'] else 'no'} | {_fmt(c['delta'])}{_ci(c['delta_ci'])} | "
                     f"{_fmt(c['coverage'])}{_ci(c['coverage_ci'])} | {_fmt(c['ER_minus'])} | {_fmt(c['ER_plus'])} | "
                     f"{c['runs_passed']}/{c['runs']} | {r0['LF']}{thin} | {r0['PF']} | {r0['LP']} | {r0['PP']} | "
                     f"{r0['NA']} |" + (f" {c.get('round')} ({c.get('pool_failed')}) |" if explain else ""))
    lines.append("")
    lines.append("(LF … NA: counts of the first run; Δ, coverage, ER: means over the runs.)")
    if un and un["examples"]:
        lines += ["", "## Unattributed failures", "",
                  f"{un['count']} failed trajectories are not explained by a retained capability. First examples:", ""]
        for ex in un["examples"]:
            why = "; ".join(f"{n}: {e[:120]}" for n, e in ex["evidence"].items()) or "no LACKING label"
            lines.append(f"- `{ex['trajectory']}` (reward {ex['reward']}, {ex['termination']}): {why}. "
                         f"Last agent message: \"{ex['last_agent_message'][:160]}\"")
    if figure is not None:
        lines += ["", f"![capabilities]({figure.name})"]
    notes = list(data.get("notes", [])) + [f"`{c['name']}`: {n}" for c in data["capabilities"] for n in c["notes"]]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    if data.get("cross_check"):
        lines += ["", "## Cross-check with the offline labeler", "",
                  "| capability | agreement | pairs compared | offline LACKING also LACKING by the LLM |",
                  "|---|---|---|---|"]
        for name, v in data["cross_check"].items():
            lines.append(f"| `{name}` | {_fmt(v['agreement'])} | {v['compared']} | {_fmt(v['offline_lacking_recalled'])} |")
    if data.get("llm"):
        llm = data["llm"]
        lines += ["", "## LLM analysis agent", "",
                  f"{llm['requests']} requests, {llm['rejected_replies']} replies rejected by the schema check, "
                  f"{llm['retries']} retries; {llm['missing_labels']} of {llm['total_labels']} labels missing "
                  f"(recorded as missing, never guessed). Structured output: {llm['structured_output']}."]
        if llm.get("errors"):
            lines += ["", "First rejection reasons:", ""] + [f"- {e[:200]}" for e in llm["errors"][:5]]
    lines += ["", "## Dictionary", ""]
    for d in data["dictionary"]:
        lines.append(f"- **`{d['name']}`**: {d['definition']}")
    for c in data["capabilities"]:
        ev = c.get("offline_evidence") or {}
        if c["retained"] and ev:
            lines += ["", f"### Evidence: `{c['name']}`", ""]
            for tid, why in list(ev.items())[:5]:
                lines.append(f"- `{tid}`: {why}")
    if specs:
        lines += ["", "## Capability specs (for `trace generate`)", ""] + [f"- `specs/{p.name}`" for p in specs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
