"""Contrastive capability analysis (TRACE's first stage after the rollouts; docs/design.md, "The method's settings").

Failures are not random: contrasting an agent's successful and failed trajectories names the
capabilities it lacks. This package labels every (trajectory, capability) pair NA / PRESENT /
LACKING — with rules (:class:`OfflineLabeler`, the embedded default) or with an LLM analysis agent
over any OpenAI-compatible endpoint (:class:`LLMAnalyst`) — scores each capability by
ER⁻, ER⁺, Δ, coverage and k-of-R stability (:func:`contrastive_scores`, docs/design.md, "The method's settings"), and writes
``capabilities.json``, a report, a figure and one spec per retained capability (:func:`diagnose`).

    from trace_train.analysis import diagnose
    result = diagnose("runs/base")            # offline labeler
    print(result.retained)
"""

from .llm import LLMAnalyst, LLMConfig, extract_json, validate
from .offline import BUILTIN_CAPABILITIES, LABELS, LACKING, NA, PRESENT, CapabilityDef, OfflineLabeler, Verdict
from .pipeline import AnalysisError, DiagnoseResult, diagnose, load_trajectories
from .stats import CapabilityScore, RunStats, Thresholds, contrastive_scores, run_stats

__all__ = [
    "AnalysisError", "BUILTIN_CAPABILITIES", "CapabilityDef", "CapabilityScore", "DiagnoseResult", "LABELS",
    "LACKING", "LLMAnalyst", "LLMConfig", "NA", "OfflineLabeler", "PRESENT", "RunStats", "Thresholds", "Verdict",
    "contrastive_scores", "diagnose", "extract_json", "load_trajectories", "run_stats", "validate",
]
