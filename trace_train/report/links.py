"""The claim of a run as a chain of four links, each with its own measurement (the report's "Links").

TRACE claims that training exactly the capabilities a diagnosis found, and composing them, lifts the agent on
its target. When it does not, "the tiny model" is no answer: one of four links broke, and each is measured on
its own so that the failure points at it.

=====  ===================  =================================================================================
link   question             measured as (paired bootstrap over tasks, from the run's trajectory files)
=====  ===================  =================================================================================
L1     transfer ceiling     SFT on the capability env's oracle episodes vs the base, on the target, per family
                            (the GRPO run's SFT warm-up, on that env alone, where there is one; else the SFT
                            baseline on every env)
L2     learning             the GRPO adapter vs the base on its own env's held-out seeds: success, breakdown
                            (and vs the SFT warm-up it started from, where it had one: GRPO's own share)
L3     transfer             the adapter vs the base on the target: on its capability's families, and on the rest
                            (and vs its SFT warm-up on those families: what GRPO added to the transfer)
L4     composition          the MoE vs the base and vs the best single adapter, on the target, per family
=====  ===================  =================================================================================

A capability's *families* are the target's task families its diagnosed failures came from
(``failure_families`` of ``diagnosis/specs/<capability>.json``). A link *held* when its interval says so:

* L1, L3: the Δ pass@1 on the capability's families is above zero outside its interval (and, for L3, the Δ on
  the other families is not below zero outside its interval: a gain bought with the base's other wins is no
  transfer);
* L2: the Δ success on the env's held-out seeds is above zero outside its interval;
* L4: the MoE is above the base outside the interval and at least equal to the best single adapter (on the
  values; the paired interval against that adapter is shown beside).

A GRPO run that starts from an SFT warm-up (``train.options.sft_warmup_steps``) is judged as a whole, warm-up
included, as the recipe trains it; its rows also show GRPO over the warm-up, so that a reader sees which of the two
paid a gain (those rows inform, they do not decide a verdict).

Every input is a file the stages wrote (``eval/results.json``, ``eval/<method>/trajectories.jsonl``,
``eval/env/<capability>/<base|adapter|warmup>/trajectories.jsonl``, ``diagnosis/specs/*.json``), so the table is
rebuilt from them at any time: :func:`compute_links`.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

LINKS = {
    "L1": ("transfer ceiling", "does supervised training on the capability envs' oracle episodes lift the target "
                               "on the families each capability covers?"),
    "L2": ("learning", "does each capability's training (its GRPO run, from its SFT warm-up where it has one) "
                       "raise the env's own success on held-out env seeds?"),
    "L3": ("transfer", "does each capability's adapter lift the target on its capability's families, without "
                       "losing the others?"),
    "L4": ("composition", "does the token-level MoE beat the base, and match the best single adapter?"),
}


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def capability_families(run_dir: str | Path) -> dict[str, list[str]]:
    """Each capability the run went on with, and its target families, most failures first (from
    ``diagnosis/specs``). A capability the diagnosis retained but left out (``diagnose.max_capabilities``: no env,
    no adapter, no SFT of its own) is not a link of this run: the diagnose stage's ``selected`` list, where the run
    has one, says which went on."""
    selected = (((_load(Path(run_dir, "stages.json")) or {}).get("stages") or {}).get("diagnose", {})
                .get("summary") or {}).get("selected")
    out: dict[str, list[str]] = {}
    for path in sorted(Path(run_dir, "diagnosis", "specs").glob("*.json")):
        spec = _load(path) or {}
        name = str(spec.get("name", path.stem))
        families = spec.get("failure_families") or {}
        if isinstance(families, dict) and (not isinstance(selected, list) or name in selected):
            out[name] = [f for f, _ in sorted(families.items(), key=lambda kv: -kv[1])]
    return out


def _scenario(record: dict) -> str | None:
    s = record.get("scenario")
    if s is None and isinstance(record.get("task"), dict):
        s = record["task"].get("scenario")
    return None if s is None else str(s)


def _delta(base: list[dict], cand: list[dict], n_boot: int, seed: int, metric: str = "pass@1") -> dict | None:
    """The paired Δ of ``metric`` (candidate − base) over the tasks both have, with its interval and sizes."""
    from trace_train.evaluate import compare

    if not base or not cand:
        return None
    cmp = compare(base, cand, ks=(1,), n_boot=n_boot, seed=seed)
    d = cmp["delta"].get(metric)
    if not d:
        return None
    return {"value": d["value"], "ci": d.get("ci"), "tasks": cmp["shared_tasks"],
            "base": cmp["base"]["overall"].get(metric, {}).get("value"),
            "candidate": cmp["candidate"]["overall"].get(metric, {}).get("value")}


def _above(d: dict | None) -> bool | None:
    """Whether the interval of ``d`` lies above zero (None: not measured; no interval: the value decides)."""
    if d is None or d.get("value") is None:
        return None
    ci = d.get("ci")
    lo = ci[0] if ci and ci[0] is not None else d["value"]
    return bool(lo > 0)


def _not_below(d: dict | None) -> bool | None:
    if d is None or d.get("value") is None:
        return None
    ci = d.get("ci")
    hi = ci[1] if ci and ci[1] is not None else d["value"]
    return bool(hi >= 0)


def _select(records: list[dict], families: set[str], inside: bool) -> list[dict]:
    return [r for r in records if (_scenario(r) in families) == inside]


def _verdict(parts: list[bool | None]) -> str:
    if not parts or any(p is None for p in parts):
        return "not measured" if not parts or all(p is None for p in parts) else "partly measured"
    return "held" if all(parts) else "failed"


def _warmup_env_kwargs(run: Path) -> dict:
    """The run's ``train.options.sft_warmup_env_kwargs`` (its ``config.yaml``; {} when unset or absent)."""
    import yaml

    path = run / "config.yaml"
    if not path.is_file():
        return {}
    cfg = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return dict(((cfg.get("train") or {}).get("options") or {}).get("sft_warmup_env_kwargs") or {})


def _warmup_is_own_episodes(run: Path, cap: str) -> bool:
    """Whether ``cap``'s SFT warm-up, fitted with the run's ``sft_warmup_env_kwargs``, still saw its env's own oracle
    episodes: those kwargs changed none of the episodes the trainer compared (``overlay_changed`` in the warm-up's
    ``done.json``; e.g. ``size.blind_cabin_prob`` on an env that draws no cancellation). Unknown: not its own."""
    done = _load(run / "train" / cap / "run" / "sft_warmup" / "done.json") or {}
    changed = done.get("overlay_changed")
    return isinstance(changed, dict) and bool(changed) and all(int(c[0]) == 0 for c in changed.values())


def compute_links(run_dir: str | Path, n_boot: int = 1000, seed: int = 0) -> dict:
    """The four links of a run directory: per link its rows (one per capability or family), its verdict
    (``held``, ``failed``, ``not measured``) and a sentence saying so."""
    from trace_train.evaluate import load_records

    run = Path(run_dir)
    res = _load(run / "eval" / "results.json") or {}
    methods = res.get("methods") or {}

    @functools.cache  # L1 and L3 both read the warm-up rows, L3 and L4 the adapters: one read each
    def records_of(key: str) -> list[dict]:
        m = methods.get(key) or {}
        if not m.get("available") or not m.get("trajectories"):
            return []
        path = run / m["trajectories"]
        return load_records(path) if path.exists() else []

    families = capability_families(run)
    base = records_of("base")
    all_families = sorted({f for f in (_scenario(r) for r in base) if f is not None})
    out: dict[str, dict] = {}

    # L1: SFT vs base on each capability's families: SFT on that capability's env alone where the run has it (the
    # SFT warm-up of its GRPO run, evaluated as `sft:<capability>`), else the SFT baseline (every env at once). A
    # warm-up on episodes of its own (train.options.sft_warmup_env_kwargs, e.g. decision-blind ones) is no
    # transfer ceiling: L1 then reads the SFT baseline, unless those kwargs left that env's episodes as they were.
    sft = records_of("sft")
    overlaid = bool(_warmup_env_kwargs(run))
    rows, parts = [], []
    for cap, fams in families.items():
        own = records_of(f"sft:{cap}") if not overlaid or _warmup_is_own_episodes(run, cap) else []
        d = _delta(_select(base, set(fams), True), _select(own or sft, set(fams), True), n_boot, seed)
        rows.append({"capability": cap, "families": fams, "delta": d, "held": _above(d),
                     "sft": f"sft:{cap}" if own else "sft"})
        parts.append(_above(d))
    per_family = {f: _delta(_select(base, {f}, True), _select(sft, {f}, True), n_boot, seed) for f in all_families}
    out["L1"] = {"rows": rows, "per_family": per_family, "verdict": _verdict(parts)}

    # L2: each adapter vs the base on its own env's held-out seeds (success, and what paid the reward), and vs the
    # SFT warm-up its GRPO run started from (GRPO's own share of the gain).
    rows, parts = [], []
    for cap in families:
        env_dir = run / "eval" / "env" / cap
        before, after, warm = (load_records(env_dir / who / "trajectories.jsonl")
                               if (env_dir / who / "trajectories.jsonl").exists() else []
                               for who in ("base", "adapter", "warmup"))
        d = _delta(before, after, n_boot, seed)
        rows.append({"capability": cap, "delta": d, "held": _above(d), "grpo": _delta(warm, after, n_boot, seed),
                     "breakdown": {"base": _breakdown(before), "adapter": _breakdown(after)}
                     | ({"warmup": _breakdown(warm)} if warm else {})})
        parts.append(_above(d))
    out["L2"] = {"rows": rows, "verdict": _verdict(parts)}

    # L3: each adapter vs the base on its capability's families, and on every other family.
    rows, parts = [], []
    for cap, fams in families.items():
        adapter = records_of(f"adapter:{cap}")
        inside = _delta(_select(base, set(fams), True), _select(adapter, set(fams), True), n_boot, seed)
        others = _delta(_select(base, set(fams), False), _select(adapter, set(fams), False), n_boot, seed)
        held = None if inside is None else bool(_above(inside) and _not_below(others) is not False)
        warm = records_of(f"sft:{cap}")  # its GRPO run's SFT warm-up: what GRPO itself added on these families
        grpo = _delta(_select(warm, set(fams), True), _select(adapter, set(fams), True), n_boot, seed)
        rows.append({"capability": cap, "families": fams, "delta": inside, "others": others, "held": held,
                     "grpo": grpo})
        parts.append(held)
    out["L3"] = {"rows": rows, "verdict": _verdict(parts)}

    # L4: the MoE vs the base per family and overall, and vs the best single adapter.
    moe = records_of("trace_moe")
    per_family = {f: _delta(_select(base, {f}, True), _select(moe, {f}, True), n_boot, seed) for f in all_families}
    overall = _delta(base, moe, n_boot, seed)
    singles = {key: (m.get("overall", {}).get("pass@1") or {}).get("value") for key, m in methods.items()
               if key.startswith("adapter:") and m.get("available")}
    singles = {k: v for k, v in singles.items() if v is not None}
    best = max(singles.items(), key=lambda kv: kv[1]) if singles else None
    moe_value = ((methods.get("trace_moe") or {}).get("overall", {}).get("pass@1") or {}).get("value")
    # "At least equal" is read on the values; the paired interval against the best adapter says how far apart.
    versus_best = _delta(records_of(best[0]), moe, n_boot, seed) if best is not None else None
    parts = [_above(overall), None if best is None or moe_value is None else bool(moe_value >= best[1] - 1e-12)]
    out["L4"] = {"overall": overall, "per_family": per_family, "best_single": best, "moe": moe_value,
                 "versus_best": versus_best,
                 "routing": _routing_shares(run, methods.get("trace_moe") or {}), "verdict": _verdict(parts)}
    mix = res.get("mix")
    if mix:  # evaluate.mixed: every method on single and mixed conversations apart, against the MoE
        out["L4"]["split"] = _split(methods, records_of, mix["families"], n_boot, seed)
        out["L4"]["mix"] = {k: mix.get(k) for k in ("families", "share", "bundle_prob", "mixed", "single")}
        out["L4"]["turns"] = (methods.get("trace_moe") or {}).get("turn_routing")
    for link, entry in out.items():
        entry["name"], entry["question"] = LINKS[link]
        entry["sentence"] = _sentence(link, entry)
    return out


#: The order of the split table's rows: the MoE, the routers beside it, the merges and single-model baselines.
SPLIT_ORDER = ("trace_moe", "top2", "top4", "per_episode", "per_task", "arrow", "merge_linear", "merge_ties", "multi",
               "sft", "base")


def _split(methods: dict, records_of: Any, families: list[str], n_boot: int, seed: int) -> list[dict]:
    """One row per evaluated method: its ``mix`` scores (per conversation and per request, single and mixed
    conversations apart) and the paired Δ of the MoE over it on each kind (MoE − method, pass@1)."""
    from trace_train.mixed_eval import record_kind

    def order(key: str) -> tuple[int, str]:
        return (SPLIT_ORDER.index(key) if key in SPLIT_ORDER else len(SPLIT_ORDER) - 1, key)

    moe = records_of("trace_moe")
    rows = []
    for key in sorted((k for k, m in methods.items() if m.get("available") and m.get("mix")), key=order):
        row = {"method": key, "label": methods[key].get("label", key), "mix": methods[key]["mix"]}
        if key != "trace_moe" and moe:
            mine = records_of(key)
            for kind in ("single", "mixed"):
                row[f"moe_minus_{kind}"] = _delta([r for r in mine if record_kind(r, families) == kind],
                                                  [r for r in moe if record_kind(r, families) == kind], n_boot, seed)
        rows.append(row)
    return rows


def _routing_shares(run: Path, moe: dict) -> dict[str, dict[str, float]]:
    """Family -> {slot: share of the family's assistant tokens} over the blocks, from the MoE's
    ``routing_by_family.csv`` (written beside its episodes by the evaluate stage); {} when absent. The tokens
    the agent writes are the ones its choices rest on; the system prompt, the same in every family, would
    otherwise outweigh them."""
    import csv

    name, traj = moe.get("routing_by_family"), moe.get("trajectories")
    path = run / Path(traj).parent / name if name and traj else None
    if path is None or not path.exists():
        return {}
    out: dict[str, dict[str, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("role") == "assistant":
                out[row["env_id"]] = {k: float(v) for k, v in row.items() if k not in ("env_id", "role", "tokens")}
    return out


def _breakdown(records: list[dict]) -> dict[str, float]:
    from trace_train.evaluate import breakdown_summary

    return breakdown_summary(records) if records else {}


def _fmt(d: dict | None) -> str:
    if d is None or d.get("value") is None:
        return "–"
    ci = d.get("ci")
    if ci and ci[0] is not None:
        return f"{d['value']:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"
    return f"{d['value']:+.3f}"


def _sentence(link: str, entry: dict) -> str:
    verdict = entry["verdict"]
    if link == "L4":
        best = entry.get("best_single")
        best_text = f"the best single adapter ({best[0].split(':', 1)[-1]}, {best[1]:.3f})" if best else \
            "no single adapter"
        moe = f"{entry['moe']:.3f}" if entry.get("moe") is not None else "–"
        versus = f" (Δ {_fmt(entry['versus_best'])})" if entry.get("versus_best") else ""
        text = (f"L4 {verdict}: the MoE scores {moe}, Δ vs base {_fmt(entry.get('overall'))}, against "
                f"{best_text}{versus}.")
        by_key = {row["method"]: row for row in entry.get("split") or []}
        versus = [f"{name} {_fmt(by_key[key].get('moe_minus_mixed'))} on mixed and "
                  f"{_fmt(by_key[key].get('moe_minus_single'))} on single conversations"
                  for key, name in (("per_episode", "per-episode routing"),
                                    ("per_task", "the authors' per-task routing"))
                  if key in by_key]
        if versus:
            text += " MoE − " + "; MoE − ".join(versus) + "."
        return text
    rows = entry.get("rows") or []
    if not rows:
        return f"{link} not measured: the run diagnosed no capability."
    parts = []
    for row in rows:
        text = f"{row['capability']} {_fmt(row.get('delta'))}"
        if link == "L1":
            text += " (SFT on its env alone)" if row.get("sft", "sft") != "sft" else " (the SFT baseline, every env)"
        if link == "L3":
            text += f" (other families {_fmt(row.get('others'))})"
        if link in ("L2", "L3") and row.get("grpo") is not None:
            text += f" (GRPO over its SFT warm-up {_fmt(row['grpo'])})"
        if row.get("held") is not None:
            text += ", held" if row["held"] else ", failed"
        parts.append(text)
    what = {"L1": "SFT vs base on the capabilities' families", "L2": "success on the envs' held-out seeds",
            "L3": "adapter vs base on its families"}[link]
    return f"{link} {verdict}: {what}: " + "; ".join(parts) + "."


def _summary_rows(links: dict) -> list[list[str]]:
    """One row per measured (link, subject): the link's figure with its interval, and whether it held."""
    def held(v: bool | None) -> str:
        return "–" if v is None else ("yes" if v else "no")

    rows = []
    for row in links["L1"]["rows"]:
        which = f"SFT on {row['capability']}'s env" if row.get("sft", "sft") != "sft" else "SFT (every env)"
        rows.append(["L1", f"{which}, on its families ({', '.join(row['families'])})",
                     _fmt(row["delta"]), held(row["held"])])
    for row in links["L2"]["rows"]:
        rows.append(["L2", f"{row['capability']} adapter on its env", _fmt(row["delta"]), held(row["held"])])
        if row.get("grpo") is not None:
            rows.append(["L2", f"{row['capability']}: GRPO over its SFT warm-up, on its env", _fmt(row["grpo"]), "–"])
    for row in links["L3"]["rows"]:
        rows.append(["L3", f"{row['capability']} adapter on its families ({', '.join(row['families'])})",
                     _fmt(row["delta"]), held(row["held"])])
        if row.get("grpo") is not None:
            rows.append(["L3", f"{row['capability']}: GRPO over its SFT warm-up, on its families", _fmt(row["grpo"]),
                         "–"])
        if row.get("others") is not None:
            rows.append(["L3", f"{row['capability']} adapter on the other families", _fmt(row["others"]),
                         held(_not_below(row["others"]))])
    l4 = links["L4"]
    rows.append(["L4", "MoE vs base", _fmt(l4.get("overall")), held(_above(l4.get("overall")))])
    best = l4.get("best_single")
    if best is not None and l4.get("moe") is not None:
        rows.append(["L4", f"MoE vs the best single adapter ({best[0].split(':', 1)[-1]})",
                     _fmt(l4["versus_best"]) if l4.get("versus_best") else f"{l4['moe'] - best[1]:+.3f}",
                     held(l4["moe"] >= best[1] - 1e-12)])
    return [r for r in rows if r[2] != "–"]  # what was not measured, the link's sentence says


def links_section(doc, links: dict) -> None:
    """The "Links" section of a run report (``doc``: :class:`trace_train.report.document.Document`)."""
    doc.h(1, "Links: where the claim holds and where it breaks")
    doc.p("Each link of the claim is measured on its own (paired bootstrap intervals over tasks), so that a "
          "result that does not reach the target names the link that failed.")
    for link in ("L1", "L2", "L3", "L4"):
        doc.p(f"**{link} {links[link]['name']}** — {links[link]['question']} {links[link]['sentence']}")
    summary = _summary_rows(links)
    if summary:
        doc.table(["link", "subject", "Δ [95% CI]", "held"], summary,
                  "Δ pass@1 on the target (L1, L3, L4) or Δ success on the capability env (L2), candidate − "
                  "base, paired over tasks; a link holds when every one of its rows does. Rows marked – show what "
                  "GRPO added over the SFT warm-up it started from: they say who paid a gain, not whether the "
                  "link held.")
    l1, l4 = links["L1"], links["L4"]
    families = sorted(set(l1.get("per_family") or {}) | set(l4.get("per_family") or {}))
    if families:
        doc.table(["family", "SFT on every env − base", "MoE − base (L4)"],
                  [[f, _fmt((l1.get("per_family") or {}).get(f)), _fmt((l4.get("per_family") or {}).get(f))]
                   for f in families],
                  "Δ pass@1 per target family, with 95% paired bootstrap intervals.")
    split = l4.get("split") or []
    if split:
        mix = l4.get("mix") or {}

        def score(row: dict, kind: str, what: str) -> str:
            v = (row["mix"].get(kind) or {}).get(what)
            return "–" if v is None else f"{v:.3f}"

        doc.table(["method", "single: conversations", "single: requests", "mixed: conversations", "mixed: requests",
                   "MoE − it, single", "MoE − it, mixed"],
                  [[r["method"], score(r, "single", "success"), score(r, "single", "request_success"),
                    score(r, "mixed", "success"), score(r, "mixed", "request_success"),
                    _fmt(r.get("moe_minus_single")) if r["method"] != "trace_moe" else "",
                    _fmt(r.get("moe_minus_mixed")) if r["method"] != "trace_moe" else ""] for r in split],
                  f"L4 on single and mixed conversations ({mix.get('single')} single, {mix.get('mixed')} mixed: "
                  f"requests of {' and '.join(mix.get('families') or [])} in one conversation): the share of "
                  "conversations solved and of requests handled, and the MoE's paired Δ pass@1 over each method "
                  "on each kind, with 95% bootstrap intervals.")
    turns = l4.get("turns") or {}
    if turns.get("shares_by_family"):
        slots = list(next(iter(turns["shares_by_family"].values())))
        doc.table(["request family", "assistant tokens", *slots],
                  [[f, turns["tokens_by_family"].get(f, 0), *(f"{shares.get(s, 0.0):.2f}" for s in slots)]
                   for f, shares in turns["shares_by_family"].items()],
                  "L4, mixed conversations: which expert wrote the assistant turns serving each request (share of "
                  "their tokens per slot, over the blocks). The slot with the most tokens changed between two "
                  f"requests of different families in {turns.get('switched', 0)} of {turns.get('pairs', 0)} such "
                  f"pairs (per turn: `{turns.get('csv')}` beside the MoE's episodes).")
    routing = l4.get("routing") or {}
    if routing:
        slots = list(next(iter(routing.values())))
        doc.table(["family", *slots], [[f, *(f"{shares.get(s, 0.0):.2f}" for s in slots)]
                                       for f, shares in sorted(routing.items())],
                  "L4: where the MoE's router sent each target family's assistant tokens (share per slot, "
                  "averaged over the blocks), on the evaluation's own episodes.")
    l2 = [r for r in links["L2"]["rows"] if r.get("delta")]
    if l2:
        warmed = any(r.get("grpo") for r in l2)
        doc.table(["capability", "success before", *(["after the SFT warm-up"] if warmed else []), "success after",
                   "Δ success [95% CI]", *(["GRPO over the warm-up"] if warmed else [])],
                  [[r["capability"], f"{r['delta']['base']:.3f}",
                    *([f"{r['grpo']['base']:.3f}" if r.get("grpo") else "–"] if warmed else []),
                    f"{r['delta']['candidate']:.3f}", _fmt(r["delta"]), *([_fmt(r.get("grpo"))] if warmed else [])]
                   for r in l2],
                  "L2 on each capability env's held-out seeds: the base (before) and the capability's adapter "
                  "(after)" + ("; between them, the SFT warm-up its GRPO run started from, and GRPO's own Δ over "
                               "it." if warmed else "."))
        rows = []
        for r in l2:
            before, after = r["breakdown"].get("base", {}), r["breakdown"].get("adapter", {})
            warm = r["breakdown"].get("warmup", {})
            for k in sorted(set(before) | set(after) | set(warm)):
                values = [_finite(before.get(k)), *([_finite(warm.get(k))] if warmed else []), _finite(after.get(k))]
                if all(v is None for v in values):  # a component this env never reports
                    continue
                rows.append([r["capability"], k, *("–" if v is None else f"{v:.2f}" for v in values)])
        if rows:
            doc.table(["capability", "reward component", "before", *(["after the warm-up"] if warmed else []),
                       "after"], rows,
                      "L2 reward breakdown: the mean of each component the env reports, over the same held-out "
                      "seeds (read which component moved before reading a gain in reward).")


def _finite(x: Any) -> float | None:
    """``x`` as a float, or None when it is missing or not a finite number."""
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if x == x and abs(x) != float("inf") else None
