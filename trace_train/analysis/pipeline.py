"""``diagnose``: trajectories in, ``capabilities.json`` + report + figure + capability specs out.

The analysis stage of TRACE (docs/design.md, "The method's settings"). It reads the rollouts of an agent (a
run directory or a JSONL file), labels every (trajectory, capability) pair — with the offline
labeler by default, or with the LLM analysis agent over an OpenAI-compatible endpoint, the offline
labeler then serving as a cross-check — scores the capabilities contrastively (:mod:`.stats`) and
writes what the generator stage reads: one spec per retained capability.

The output is a pure function of the inputs and the seeds: running it twice on the same
trajectories with the same settings writes a byte-identical ``capabilities.json``.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .llm import LLMAnalyst, LLMConfig
from .offline import BUILTIN_CAPABILITIES, LACKING, NA, PRESENT, CapabilityDef, OfflineLabeler, Verdict
from .stats import CapabilityScore, Thresholds, contrastive_scores
from .transcript import trajectory_id

logger = logging.getLogger(__name__)
FORMAT_VERSION = 1


class AnalysisError(ValueError):
    """The input cannot be analysed (no trajectories, unreadable file...); the message says what to do."""


def load_trajectories(source: str | Path) -> tuple[list[dict], list[Path]]:
    """Trajectory records from a JSONL file or a run directory.

    A run directory's trajectories are its ``trajectories.jsonl`` if there is one, else every
    ``*.jsonl`` in it (sorted by name).
    """
    from trace_train.rollouts import read_trajectories

    path = Path(source)
    if path.is_dir():
        files = [path / "trajectories.jsonl"] if (path / "trajectories.jsonl").is_file() else \
            sorted(p for p in path.glob("*.jsonl") if p.is_file())
        if not files:
            raise AnalysisError(f"{path} holds no trajectories.jsonl and no *.jsonl file; "
                                "write rollouts there first (`trace rollout ... --out DIR/trajectories.jsonl`)")
    elif path.is_file():
        files = [path]
    else:
        raise AnalysisError(f"{path} does not exist; pass a run directory or a trajectories JSONL file")
    records: list[dict] = []
    for f in files:
        records.extend(read_trajectories(f))
    bad = [i for i, r in enumerate(records) if not isinstance(r.get("messages"), list) or "success" not in r]
    if bad:
        raise AnalysisError(f"{len(bad)} record(s) lack 'messages' or 'success' (first: #{bad[0]}); "
                            "they are not trajectory records (docs/design.md, 'Trajectories')")
    if not records:
        raise AnalysisError(f"no trajectory in {', '.join(map(str, files))}")
    return records, files


@dataclass
class DiagnoseResult:
    """What :func:`diagnose` produced."""

    out: Path
    capabilities_json: Path
    report: Path
    figure: Path | None
    specs: list[Path]
    scores: list[CapabilityScore]
    retained: list[str]
    data: dict = field(repr=False, default_factory=dict)


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return round(x, 6)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_round(v) for v in x]
    return x


def _majority(labels: list[str | None]) -> str | None:
    got = [lab for lab in labels if lab is not None]
    if not got:
        return None
    counts = Counter(got)
    best = max(counts.values())
    # ties resolve PRESENT over LACKING over NA (the method's "when unsure, PRESENT")
    return next(lab for lab in (PRESENT, LACKING, NA) if counts.get(lab) == best)


def unattributed_failures(records: list[dict], ids: list[str], success: list[bool], cap_entries: list[dict],
                          retained: list[str], examples: int = 5) -> dict:
    """The failures no retained capability explains, so a user sees how much of the failing the diagnosis covers.

    A failure is *attributed* when some retained capability labels it LACKING (majority over the
    runs). Of the rest, ``no_lacking_label`` counts those that no capability at all labels LACKING
    (random failures, or a deficit outside the dictionary); each example names the trajectory, its
    outcome and the LACKING labels it has, if any.
    """
    by_name = {c["name"]: c for c in cap_entries}
    failed = [i for i, ok in enumerate(success) if not ok]
    lacking = {i: [c["name"] for c in cap_entries if c["labels"].get(ids[i]) == LACKING] for i in failed}
    left = [i for i in failed if not set(lacking[i]) & set(retained)]
    out = {
        "count": len(left),
        "failed": len(failed),
        "share": len(left) / len(failed) if failed else None,
        "no_lacking_label": sum(1 for i in left if not lacking[i]),
        "examples": [],
    }
    for i in left[:examples]:
        r = records[i]
        out["examples"].append({
            "trajectory": ids[i], "env_id": r.get("env_id"), "seed": r.get("seed"), "reward": r.get("reward"),
            "termination": r.get("termination"), "lacking": lacking[i],
            "evidence": {n: (by_name[n].get("offline_evidence") or {}).get(ids[i], "") for n in lacking[i]},
            "last_agent_message": _last_agent_text(r)})
    return out


def _last_agent_text(record: dict, limit: int = 200) -> str:
    for m in reversed(record.get("messages") or []):
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"].strip():
            text = " ".join(m["content"].split())
            return text if len(text) <= limit else text[: limit - 3] + "..."
    return ""


def offline_labels(records: list[dict], labeler: OfflineLabeler | None = None
                   ) -> tuple[list[CapabilityDef], dict[str, list[Verdict]]]:
    """The offline labeler's verdicts for the built-in capabilities that apply to ``records``."""
    labeler = labeler or OfflineLabeler()
    caps = labeler.capabilities(records)
    verdicts: dict[str, list[Verdict]] = {c.name: [] for c in caps}
    for r in records:
        got = labeler.label(r)
        for c in caps:
            verdicts[c.name].append(got.get(c.name, Verdict(NA, "")))
    return caps, verdicts


def agreement(llm: dict[str, list[list[str | None]]], offline: dict[str, list[Verdict]]) -> dict[str, dict]:
    """Per capability present in both: how often the LLM's majority label equals the offline label."""
    out = {}
    for name, runs in llm.items():
        if name not in offline:
            continue
        pairs = [(_majority([run[i] for run in runs]), v.label) for i, v in enumerate(offline[name])]
        pairs = [(a, b) for a, b in pairs if a is not None]
        same = sum(a == b for a, b in pairs)
        lacking = [(a, b) for a, b in pairs if b == LACKING]
        out[name] = {"agreement": same / len(pairs) if pairs else None, "compared": len(pairs),
                     "offline_lacking_recalled": (sum(a == LACKING for a, _ in lacking) / len(lacking)
                                                  if lacking else None)}
    return out


def diagnose(source: str | Path, out: str | Path | None = None, *, llm: LLMConfig | None = None,
             thresholds: Thresholds | None = None, dictionary: str = "induce", offline_runs: int = 1,
             figure: bool = True, progress: Callable[[int, int], None] | None = None) -> DiagnoseResult:
    """Run the analysis stage on ``source`` and write its outputs to ``out``.

    Args:
        source: a run directory or a trajectories JSONL file.
        out: the output folder (default: the run directory, or the JSONL file's folder).
        llm: label with the LLM analysis agent (the offline labeler then cross-checks it).
        thresholds: retention thresholds and bootstrap settings.
        dictionary: with ``llm``: ``induce`` (phase 1; falls back to the built-in dictionary, and says
            so, if no valid dictionary comes back) or ``builtin`` (label the built-in capabilities).
        offline_runs: labelling runs of the offline labeler (it is deterministic: runs are identical).
        figure: write the PNG (needs matplotlib).
        progress: ``progress(done, total)`` during LLM labelling.
    """
    th = thresholds or Thresholds()
    if dictionary not in ("induce", "builtin"):
        raise ValueError(f"dictionary must be 'induce' or 'builtin', got {dictionary!r}")
    src = Path(source)
    records, files = load_trajectories(src)
    out_dir = Path(out) if out else (src if src.is_dir() else src.parent)
    out_dir.mkdir(parents=True, exist_ok=True)
    ids = [trajectory_id(r, i) for i, r in enumerate(records)]
    success = [bool(r.get("success")) for r in records]

    off_caps, off_verdicts = offline_labels(records)
    notes: list[str] = []
    evidence: dict[str, list[str]] = {}
    llm_summary = None
    cross = None
    if llm is None:
        caps = off_caps
        labels = {c.name: [[v.label for v in off_verdicts[c.name]]] * offline_runs for c in caps}
        labeler_name = "offline"
        runs = offline_runs
        for c in caps:
            evidence[c.name] = [ids[i] for i, v in enumerate(off_verdicts[c.name])
                                if v.label == LACKING and not success[i]][:5]
    else:
        analyst = LLMAnalyst(llm, progress=progress)
        if dictionary == "builtin":
            caps = off_caps or list(BUILTIN_CAPABILITIES.values())
        else:
            try:
                caps, evidence = analyst.induce(records, ids, success)
            except RuntimeError as exc:
                caps = off_caps or list(BUILTIN_CAPABILITIES.values())
                notes.append(f"{exc}; the built-in dictionary was labelled instead")
        labels = {c.name: [] for c in caps}
        for run in range(llm.runs):
            got = analyst.label_run(records, ids, caps, run)
            for c in caps:
                labels[c.name].append(got[c.name])
        labeler_name = f"llm:{llm.model}"
        runs = llm.runs
        llm_summary = analyst.summary()
        missing = sum(lab is None for runs_ in labels.values() for run in runs_ for lab in run)
        total = sum(len(run) for runs_ in labels.values() for run in runs_)
        llm_summary["missing_labels"] = missing
        llm_summary["total_labels"] = total
        cross = agreement(labels, off_verdicts)

    scores = contrastive_scores(labels, success, th)
    by_name = {c.name: c for c in caps}
    retained = [s.name for s in scores if s.retained]
    reasons = {c.name: {ids[i]: v.reason for i, v in enumerate(off_verdicts.get(c.name, []))
                        if v.label == LACKING} for c in caps}

    cap_entries = []
    for s in scores:
        per_traj = [[run[i] for run in labels[s.name]] for i in range(len(records))]
        entry = {
            "name": s.name, "definition": by_name[s.name].definition, "retained": s.retained,
            "ER_minus": s.mean_er_minus, "ER_plus": s.mean_er_plus, "delta": s.mean_delta,
            "coverage": s.mean_coverage, "delta_ci": s.to_dict()["delta_ci"],
            "coverage_ci": s.to_dict()["coverage_ci"], "runs_passed": s.runs_passed, "runs": len(s.runs),
            "runs_needed": s.runs_needed, "per_run": [asdict(r) for r in s.runs], "notes": s.notes,
            "round": s.round, "pool_failed": s.pool_failed,
            "labels": {ids[i]: _majority(per_traj[i]) for i in range(len(records))},
        }
        if runs > 1:
            entry["run_labels"] = {ids[i]: per_traj[i] for i in range(len(records))}
        if reasons.get(s.name):
            entry["offline_evidence"] = reasons[s.name]
        cap_entries.append(entry)

    unattributed = unattributed_failures(records, ids, success, cap_entries, retained)

    data = {
        "format_version": FORMAT_VERSION,
        "source": [str(f) for f in files],
        "labeler": labeler_name,
        "runs": runs,
        "thresholds": asdict(th),
        "summary": {"trajectories": len(records), "failed": success.count(False), "succeeded": success.count(True),
                    "envs": dict(sorted(Counter(str(r.get("env_id")) for r in records).items())),
                    "agents": dict(sorted(Counter(str(r.get("agent")) for r in records).items()))},
        "dictionary": [{"name": c.name, "definition": c.definition, "evidence": evidence.get(c.name, [])}
                       for c in caps],
        "trajectories": [{"id": ids[i], "env_id": r.get("env_id"), "agent": r.get("agent"), "seed": r.get("seed"),
                          "success": success[i], "reward": r.get("reward")} for i, r in enumerate(records)],
        "capabilities": cap_entries,
        "retained": retained,
        "unattributed": unattributed,
        "notes": notes,
    }
    if cross is not None:
        data["cross_check"] = cross
    if llm_summary is not None:
        data["llm"] = llm_summary
    data = _round(data)
    cap_path = out_dir / "capabilities.json"
    cap_path.write_text(json.dumps(data, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")

    from .report import plot_capabilities, write_report, write_specs

    fig_path = plot_capabilities(data, out_dir / "capabilities.png") if figure else None
    specs = write_specs(data, records, ids, out_dir / "specs")
    report = write_report(data, out_dir / "report.md", fig_path, specs)
    return DiagnoseResult(out_dir, cap_path, report, fig_path, specs, scores, retained, data)
