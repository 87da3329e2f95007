"""The report of a ``trace run`` directory, the way the paper shows its results.

Sections: the stages (status, seconds); the headline (TRACE MoE vs. the base on held-out target seeds);
the diagnosis (capability table with Δ, coverage and stability, and its figure); the generated environments
and their admission; each adapter's training (reward curve); the routing of the composed model (heat map);
the paper-style table of every method with pass@1, pass^k, intervals and the rollouts each spent; and the
links of the claim, L1–L4, each with its verdict (:mod:`trace_train.report.links`).
A row or section the run does not have is shown and marked (with the reason), never dropped.

It reads only the files the stages wrote, so it can be rebuilt at any time: ``write_report(run_dir)``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .document import Document

STAGE_ORDER = ("base", "rollout", "diagnose", "generate", "train", "compose", "evaluate")


@dataclass
class ReportPaths:
    markdown: Path
    html: Path
    document: Document


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _ci(m: dict | None, signed: bool = False) -> str:
    """``0.425 [0.300, 0.550]``; – when missing."""
    if not m or m.get("value") is None:
        return "–"
    v = m["value"]
    lo, hi = (m.get("ci") or [float("nan")] * 2)[:2]
    sign = "+" if signed else ""
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        return f"{v:{sign}.3f}"
    return f"{v:{sign}.3f} [{lo:{sign}.3f}, {hi:{sign}.3f}]"


def _num(x: Any, fmt: str = ".2f") -> str:
    return "–" if x is None else format(x, fmt)


def _stage_status(stages: dict, name: str) -> str:
    return stages.get(name, {}).get("status", "pending")


def _missing_note(stages: dict, name: str) -> str:
    entry = stages.get(name, {})
    status = entry.get("status", "pending")
    if status == "unavailable":
        return f"The `{name}` stage is not available in this build: {entry.get('reason', '')}"
    if status == "failed":
        return f"The `{name}` stage failed: {entry.get('error', '')}"
    if status == "done":
        return f"The `{name}` stage ran but wrote nothing for this section."
    return f"The `{name}` stage has not run yet ({status})."


def build_document(run_dir: str | Path) -> Document:
    run = Path(run_dir)
    from ..run_dir import rebase_summaries

    state = rebase_summaries(_load(run / "stages.json") or {"stages": {}}, run)
    stages = state.get("stages", {})
    doc = Document(f"TRACE run report — `{run.name}`")
    base = stages.get("base", {}).get("summary") or {}
    targets = (stages.get("rollout", {}).get("summary") or {}).get("targets") or []
    doc.p(f"Run directory `{run}`; base agent: **{_base_label(base)}**; target: "
          f"{', '.join(f'`{t}`' for t in targets) or '–'}. Configuration as resolved: `config.yaml`.")

    _headline(doc, run, stages)
    _stages_table(doc, stages)
    _base_section(doc, run, base)
    _diagnosis_section(doc, run, stages)
    _generate_section(doc, run, stages)
    _train_section(doc, run, stages)
    _compose_section(doc, run, stages)
    _results_section(doc, run, stages)
    _links_section(doc, run, stages)
    return doc


def _links_section(doc: Document, run: Path, stages: dict) -> None:
    from .links import compute_links, links_section

    if _load(run / "eval" / "results.json") is None:
        doc.h(1, "Links: where the claim holds and where it breaks")
        doc.note(_missing_note(stages, "evaluate"))
        return
    links_section(doc, compute_links(run))
    # Curves of held-out success along an adapter's checkpoints (scripts/learning_curve.py), where measured:
    # the budget of a recipe is read off them.
    for png in sorted((run / "eval" / "curve").glob("*/curve.png")):
        target = png.parent.name.endswith("-target")
        name = png.parent.name.removesuffix("-target")
        doc.image(png, f"{'L3' if target else 'L2'} along GRPO: held-out success of the {name} adapter's "
                       f"checkpoints on {'the target' if target else 'its env'} (step 0 = the base)")


def _base_label(base: dict) -> str:
    kind = base.get("kind")
    if kind in ("tiny", "hf"):
        return f"{kind} model `{Path(str(base.get('model_path'))).name}`"
    if kind == "openai":
        return f"`{base.get('model')}` at {base.get('base_url')}"
    if kind == "scripted":
        if base.get("mixture"):
            return "a mixture of scripted agents " + ", ".join(f"`{n}` ({w})" for n, w in base["mixture"].items())
        return f"scripted agent `{base.get('agent')}`"
    return "–"


def _headline(doc: Document, run: Path, stages: dict) -> None:
    doc.h(1, "Headline")
    res = _load(run / "eval" / "results.json")
    methods = (res or {}).get("methods", {})
    moe, base = methods.get("trace_moe", {}), methods.get("base", {})
    if not (moe.get("available") and base.get("available")):
        why = (moe.get("note") or "").replace("not in this run: ", "") if res else ""
        why = f"TRACE MoE: {why}." if why else _missing_note(stages, "evaluate")
        doc.note("No headline yet: TRACE MoE and the base were not both evaluated. " + why)
        if base.get("available"):
            doc.p(f"Base on the held-out target seeds: pass@1 {_ci(base['overall'].get('pass@1'))}.")
        return
    d = (moe.get("delta_vs_base") or {}).get("pass@1")
    singles = {k: v for k, v in methods.items() if k.startswith("adapter:") and v.get("available")}
    best = max(singles.items(), key=lambda kv: kv[1]["overall"]["pass@1"]["value"], default=None)
    verdict = ""
    if d and d.get("ci") and d["ci"][0] is not None and not math.isnan(d["ci"][0]):
        from .links import _above, _not_below  # the links' rule for an interval against zero

        verdict = (" — above the base, outside the interval" if _above(d) else
                   " — below the base, outside the interval" if _not_below(d) is False else
                   " — within the interval (not significant)")
    text = (f"On {res['n_seeds']} held-out target seeds × {res['samples']} trials: TRACE MoE pass@1 "
            f"**{_ci(moe['overall'].get('pass@1'))}** vs. base **{_ci(base['overall'].get('pass@1'))}**; "
            f"paired difference {_ci(d, signed=True)}{verdict}.")
    if best:
        bv = best[1]["overall"]["pass@1"]["value"]
        mv = moe["overall"]["pass@1"]["value"]
        text += (f" Best single adapter ({best[0].split(':', 1)[1]}): {bv:.3f} — TRACE MoE "
                 f"{'beats' if mv > bv else 'does not beat'} it.")
    doc.p(text)


def _stages_table(doc: Document, stages: dict) -> None:
    doc.h(1, "Stages")
    rows = []
    for name in STAGE_ORDER:
        e = stages.get(name, {})
        status = e.get("status", "pending")
        note = e.get("reason") or e.get("error") or ("resumed after an interruption" if e.get("resumed") else "")
        rows.append([name, status, _num(e.get("seconds"), ".1f") if "seconds" in e else "–", note or e.get("what", "")])
    doc.table(["stage", "status", "seconds", "note"], rows)


def _base_section(doc: Document, run: Path, base: dict) -> None:
    warm = base.get("warmup")
    if not warm:
        return
    doc.h(1, "Base model")
    counts = warm.get("scenario_counts") or {}
    meta = _load(Path(str(base.get("model_path")), "trace_model.json")) or {}
    shares = (meta.get("bootstrap") or {}).get("scenario_shares") or {}
    under = f"; under-represented: {', '.join(f'{f} ({v:.0%} kept)' for f, v in sorted(shares.items()))}" if shares else ""
    doc.p(f"The tiny model, warmed up by SFT on oracle episodes of `{warm.get('target')}` "
          f"({warm.get('examples')} episodes, {warm.get('steps')} steps, "
          f"{_num(warm.get('train_seconds'), '.0f')} s of training{', cached' if base.get('cached') else ''}); "
          f"left out of the warm-up: {', '.join(warm.get('exclude_scenarios') or []) or 'nothing'}{under}.")
    mixture = (meta.get("bootstrap") or {}).get("mixture") or {}
    if counts or mixture:
        rows = [[f"`{warm.get('target')}`: {s}", c.get("kept", 0), c.get("excluded", 0)]
                for s, c in sorted(counts.items())]
        rows += [[f"`{env}` (warm-up mixture)", m.get("episodes", 0), 0] for env, m in sorted(mixture.items())]
        doc.table(["warm-up data", "episodes kept", "left out"], rows,
                  "What the base was warmed up on: its gaps come from what it saw little or nothing of.")
    doc.image(run / "base" / "warmup_loss.png", "Warm-up loss of the base model")


def _diagnosis_section(doc: Document, run: Path, stages: dict) -> None:
    doc.h(1, "Diagnosis: which capabilities are missing")
    caps = _load(run / "diagnosis" / "capabilities.json")
    if not caps:
        doc.note(_missing_note(stages, "diagnose"))
        return
    s = caps.get("summary", {})
    roll = stages.get("rollout", {}).get("summary") or {}
    doc.p(f"{s.get('trajectories')} base-agent trajectories ({s.get('succeeded')} succeeded, {s.get('failed')} "
          f"failed; mean reward {_num(roll.get('mean_reward'), '.3f')}), labelled by `{caps.get('labeler')}` in "
          f"{caps.get('runs')} run(s). Retained if Δ ≥ {caps['thresholds']['min_delta']} and coverage ≥ "
          f"{caps['thresholds']['min_coverage']} in enough runs.")
    if not s.get("succeeded") or not s.get("failed"):
        which = "succeeded" if not s.get("succeeded") else "failed"
        doc.note(f"The base never {which} on these seeds, so successes and failures cannot be contrasted and no "
                 "capability can be retained. Give the base a longer warm-up (`base.bootstrap.steps` / "
                 "`max_seconds`), a stronger model, or targets with tasks it sometimes solves.")
    selected = set((stages.get("diagnose", {}).get("summary") or {}).get("selected", []))
    rows = []
    for c in caps.get("capabilities", []):
        rows.append([f"`{c['name']}`", _ci({"value": c.get("delta"), "ci": c.get("delta_ci")}, signed=True),
                     _num(c.get("ER_minus"), ".3f"), _num(c.get("ER_plus"), ".3f"),
                     _ci({"value": c.get("coverage"), "ci": c.get("coverage_ci")}),
                     f"{c.get('runs_passed')}/{c.get('runs')}",
                     ("yes" if c.get("retained") else "no") + (" (trained)" if c["name"] in selected else "")])
    doc.table(["capability", "Δ [95% CI]", "ER⁻", "ER⁺", "coverage [95% CI]", "stability (runs passed)", "retained"],
              rows, "Δ = ER⁻ − ER⁺ (how much more often the capability is lacking in failures than in successes); "
                    "coverage = share of failures where it is lacking.")
    doc.image(run / "diagnosis" / "capabilities.png", "Diagnosis: Δ and coverage per capability")


def _generate_section(doc: Document, run: Path, stages: dict) -> None:
    doc.h(1, "Generated environments and admission")
    rows_json = _load(run / "generate" / "results.json")
    train = _load(run / "train" / "results.json") or {}
    if rows_json is None:
        doc.note(_missing_note(stages, "generate"))
        used = train.get("adapters", {})
        if used:
            doc.table(["capability", "env trained on", "source", "admission"],
                      [[f"`{c}`", f"`{a['env_ids'][0]}`", a.get("source", ""), "not run"] for c, a in used.items()],
                      "The environments the adapters trained on instead.")
        return
    if not rows_json:
        doc.p("No capability was retained, so no environment was generated.")
        return
    rows = []
    for r in rows_json:
        report = _load(Path(r["report_json"])) if r.get("report_json") else None
        checks = [c for c in (report or {}).get("checks") or [] if isinstance(c, dict)]
        passed = sum(1 for c in checks if c.get("status") == "passed" or c.get("passed") is True)
        rows.append([f"`{r['capability']}`", f"`{r['env_id']}`" if r.get("env_id") else "–",
                     "admitted" if r["admitted"] else "rejected", r.get("attempts"),
                     f"{passed}/{len(checks)}" if checks else "–", r.get("reason") or ""])
    doc.table(["capability", "env id", "admission", "attempts", "checks passed", "reason"], rows,
              "Every admitted env passed the static checks, the conformance suite, determinism, the oracle, schema "
              "identity with the target, the reward-hacking probes and calibration (reports beside each module).")


def _train_log(log_csv: str | None) -> dict:
    """First and last logged mean reward of a training log (TRL's ``reward`` column or ours), and the share of
    GRPO groups that carried an advantage (reward not constant across the group), over all steps."""
    if not log_csv or not Path(log_csv).is_file():
        return {}
    with open(log_csv, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    out: dict = {}
    for col in ("reward", "reward_mean", "rewards/mean"):
        vals = [float(r[col]) for r in rows if r.get(col) not in (None, "")]
        if vals:
            out.update(first=vals[0], last=vals[-1])
            break
    flat = [float(r["frac_reward_zero_std"]) for r in rows if r.get("frac_reward_zero_std") not in (None, "")]
    if flat:
        out["informative"] = 1.0 - sum(flat) / len(flat)
    return out


def _train_section(doc: Document, run: Path, stages: dict) -> None:
    doc.h(1, "Training: one adapter per capability")
    res = _load(run / "train" / "results.json")
    if res is None:
        doc.note(_missing_note(stages, "train"))
        return
    everything = {**res.get("adapters", {}), **{f"baseline: {k}": v for k, v in res.get("baselines", {}).items()}}
    if not everything:
        doc.p("No adapter was trained (no capability was retained, or none had an environment).")
        return
    rows, flat = [], []
    for name, a in everything.items():
        log = _train_log(a.get("log_csv"))
        if not a.get("sft") and log.get("informative") == 0.0:
            flat.append(name)
        rows.append([f"`{name}`", ", ".join(f"`{e}`" for e in a.get("env_ids", [])), "SFT" if a.get("sft") else "GRPO",
                     a.get("steps"), a.get("rollouts"), _num(log.get("first"), ".3f"), _num(log.get("last"), ".3f"),
                     "–" if a.get("sft") else _num(log.get("informative"), ".0%"), _num(a.get("seconds"), ".0f")])
    doc.table(["adapter", "env(s)", "objective", "steps", "rollouts", "reward (first step)", "reward (last step)",
               "informative groups", "seconds"], rows,
              "Informative groups: the share of GRPO groups whose rewards were not all equal, the only groups "
              "with an advantage to learn from.")
    lead_in = (stages.get("train", {}).get("summary") or {}).get("lead_in")
    if lead_in:  # train.options.env_kwargs.lead_in: auto, resolved from the base's rollouts
        record = ", ".join(f"{f} {won} of {n}" for f, (won, n) in sorted(lead_in.get("base_rollouts", {}).items()))
        chosen_families = ", ".join(f"`{f}`" for f in lead_in.get("families", [])) or "none"
        rule = (f"in at least {lead_in['min_success']:.0%} of at least {lead_in['min_episodes']} rollout episodes"
                if "min_success" in lead_in and "min_episodes" in lead_in else "in its rollouts")
        doc.p(f"Lead-in questions (`lead_in: auto`): {chosen_families}, the target families the base answered {rule} "
              f"and that can be asked without a write (its rollouts: {record}).")
    if flat:
        doc.p("Every group was flat for " + ", ".join(f"`{n}`" for n in flat) + ": the base was never (or always) "
              "right in its env, so GRPO had no advantage and the adapter is the base. A base that is sometimes "
              "right there, or an easier `train.options.env_kwargs.difficulty`, gives GRPO something to learn.")
    chosen = {n: a["selected"] for n, a in everything.items() if a.get("selected")}
    if chosen:
        played = next((c["seeds"] for c in chosen.values() if c.get("seeds")), None)
        seeds = f"seeds {played[0]}-{played[1] - 1}" if played else "validation seeds"
        doc.p(f"Checkpoint selection (`train.select_seeds`): the base and the saved checkpoints of each GRPO run "
              f"played {seeds} of the run's own envs (validation seeds, apart from training and from the "
              "evaluation's), greedy; the best checkpoint is the adapter evaluated below. Its validation "
              "episodes count in the rollouts above.")
        doc.table(["adapter", "chosen step", "of", "validation success: base", "chosen", "last step", "note"],
                  [[f"`{n}`", c["step"], c["final_step"], _num(c.get("base_success"), ".2f"),
                    _num(c.get("success"), ".2f"), _num(c.get("final_success"), ".2f"), c.get("skipped") or ""]
                   for n, c in chosen.items()])
    for name, a in everything.items():
        doc.image(a.get("curve_png"), f"Reward curve: {name}")
        if a.get("selected"):
            doc.image(a["selected"].get("curve_png"), f"Validation success along training: {name}")


def _compose_section(doc: Document, run: Path, stages: dict) -> None:
    doc.h(1, "Composition: token-level top-1 routing")
    res = _load(run / "compose" / "results.json")
    if res is None:
        doc.note(_missing_note(stages, "compose"))
        return
    moe = res.get("moe")
    if not moe:
        doc.p(res.get("note", "Nothing was composed."))
        return
    dropped = res.get("dropped", res.get("dropped_zero_updates")) or []
    why = res.get("dropped_why") or {}
    for name in dropped:  # the composition (MoE, merges, per-episode routing) is over the others
        doc.p(f"Left out of the composition: {name}: {why.get(name, 'a zero update, the base itself')}. "
              "Its envs' episodes label the router's base slot; it keeps its own row in the results.")
    csv_path = moe.get("routing_csv")
    if csv_path and Path(csv_path).is_file():
        with open(csv_path, newline="", encoding="utf-8") as f:
            table = list(csv.reader(f))
        if len(table) > 1:
            doc.table(table[0], [[_short(v) for v in r] for r in table[1:]],
                      "Share of tokens routed to each expert (slot 0 = the base, no adapter).")
    if not doc.image(moe.get("heatmap_png"), "Routing heat map: share of tokens per expert"):
        doc.p("No routing heat map was written.")


def _short(v: str) -> str:
    try:
        x = float(v)
    except ValueError:
        return v
    return str(int(x)) if x.is_integer() and abs(x) > 1 else f"{x:.3f}"  # counts stay counts, shares get 3 digits


def _results_section(doc: Document, run: Path, stages: dict) -> None:
    doc.h(1, "Results on held-out target seeds")
    res = _load(run / "eval" / "results.json")
    if res is None:
        doc.note(_missing_note(stages, "evaluate"))
        return
    ks = [k for k in res.get("ks", [1]) if k != 1]
    headers = ["method", "pass@1 [95% CI]"] + [f"pass^{k} [95% CI]" for k in ks] + \
        ["mean reward", "Δ pass@1 vs. base [95% CI]", "rollouts spent", "note"]
    rows = []
    for key, m in res["methods"].items():
        if not m.get("available"):
            rows.append([m["label"]] + ["not in this run"] + ["–"] * (len(ks) + 2) + [m.get("rollouts_spent", "–"),
                                                                                     m.get("note", "")])
            continue
        o = m["overall"]
        d = (m.get("delta_vs_base") or {}).get("pass@1")
        rows.append([m["label"], _ci(o.get("pass@1"))] + [_ci(o.get(f"pass^{k}")) for k in ks]
                    + [_ci(o.get("mean_reward")), "(reference)" if key == "base" else _ci(d, signed=True),
                       m.get("rollouts_spent", 0), m.get("note", "")])
    doc.table(headers, rows, f"{res['n_seeds']} held-out seeds × {res['samples']} trials, temperature "
                             f"{res['temperature']}; intervals are bootstrap CIs over tasks, the Δ column a paired "
                             "bootstrap. Rollouts spent = training episodes behind each method (the paper's "
                             "sample-efficiency axis).")
    fig = run / "eval" / "results.png"
    if _plot_results(res, fig):
        doc.image(fig, "pass@1 per method on the held-out target seeds (95% CI)")


def _plot_results(res: dict, path: Path) -> bool:
    avail = [(m["label"], m["overall"].get("pass@1")) for m in res["methods"].values()
             if m.get("available") and m["overall"].get("pass@1")]
    if not avail:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(5.0, 0.9 * len(avail) + 2), 3.4), dpi=120)
    vals = [m["value"] for _, m in avail]
    lo = [max(0.0, m["value"] - m["ci"][0]) if m.get("ci") and m["ci"][0] is not None else 0.0 for _, m in avail]
    hi = [max(0.0, m["ci"][1] - m["value"]) if m.get("ci") and m["ci"][1] is not None else 0.0 for _, m in avail]
    colors = ["#c44e52" if label.startswith("TRACE") else "#4c72b0" for label, _ in avail]
    ax.bar(range(len(avail)), vals, yerr=[lo, hi], capsize=3, color=colors)
    ax.set_xticks(range(len(avail)))
    ax.set_xticklabels([label for label, _ in avail], rotation=25, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("pass@1")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> ReportPaths:
    """Write ``report.md`` (figures copied beside it under ``report_figures/``) and the self-contained
    ``report.html`` into ``out_dir`` (default: the run directory)."""
    run = Path(run_dir)
    out = Path(out_dir) if out_dir else run
    out.mkdir(parents=True, exist_ok=True)
    doc = build_document(run)
    md = out / "report.md"
    md.write_text(doc.markdown(out / "report_figures", "report_figures"), encoding="utf-8")
    page = out / "report.html"
    page.write_text(doc.html(), encoding="utf-8")
    return ReportPaths(md, page, doc)
