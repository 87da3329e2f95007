"""The offline generator: the embedded default of ``trace generate`` (no LLM).

For a spec whose capability is one of the built-in families (the four τ² capabilities and
``swe_localization``) it renders a module from ``generators/templates/`` that instantiates that
family for the spec's target:

* the τ² domain from the target (``tau_airline`` → airline, ``tau_retail`` → retail);
* the scenario families the evidence points to: the request families of the failures the
  capability is lacking in (the spec's ``failure_families``, from the trajectories' ``task.families``);
  those the family can generate, most frequent first, become the env's focus (drawn in
  :data:`FOCUS_SHARE` of the episodes);
* the difficulty: the family's default, one lower when the capability is missing in at least
  half of the failures (coverage ≥ 0.5: the agent is far from it, start easier), and lower still
  when the family draws none of the evidence's families at that level (structured data reasoning
  asks for a flight's status only at its look-up levels, 1 and 2).

The module then goes through the same admission as LLM-written code. When it is rejected, the
next attempt renders a more conservative variant (:data:`VARIANTS`): a weaker focus, then the
family as it is at its default difficulty (a focus can skew a family's mix, e.g. towards tasks a
refusal solves, which the reward-hacking probes catch). A spec it cannot match raises
:class:`NoTemplate`, whose message names the ``--llm`` option.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from string import Template

TEMPLATES = Path(__file__).resolve().parent / "templates"
FOCUS_SHARE = 0.75
#: Offline attempts, in order: (share of episodes drawn from the focus families, use the evidence's difficulty).
VARIANTS = ((FOCUS_SHARE, True), (0.4, True), (0.0, False))
#: A family the evidence names in fewer than this share of its failures is not a focus family: a few stray labels
#: (a garbled id labelled a reading error) would otherwise draw part of the env away from the capability's
#: main failure, and a small model learns an env that mixes families slower (docs/generate.md).
FOCUS_MIN_SHARE = 0.1

#: capability -> (template, base module, base class)
FAMILIES = {
    "precondition_verification": ("tau_capability", "precondition_verification", "PreconditionVerificationEnv"),
    "multi_step_completion": ("tau_capability", "multi_step_completion", "MultiStepCompletionEnv"),
    "structured_data_reasoning": ("tau_capability", "structured_data_reasoning", "StructuredDataReasoningEnv"),
    "tool_calling_precision": ("tau_capability", "tool_calling_precision", "ToolCallingPrecisionEnv"),
    "swe_localization": ("swe_localization", "swe_localization", "SweLocalizationEnv"),
}
_TAU_DOMAINS = {"tau_airline": "airline", "tau_retail": "retail"}
#: Keyword arguments a family gets when it follows the evidence (variants that use it), with the sentence the
#: module's docstring says about them: the target's own conversation for tool-calling precision, where the
#: evidence's failures happened (an id read right, then garbled on its way into the write); stated in full, its
#: requests need no read and teach none.
EVIDENCE_KWARGS = {
    "tool_calling_precision": ({"flow": "target"}, 'The requests reach the agent as on the target (`flow="target"`): '
                                                   "the details given when asked, the reads before the write."),
}


class NoTemplate(ValueError):
    """The offline generator has no template for this spec."""


@dataclass
class Rendered:
    source: str
    notes: dict


def _builtin_entry(capability: str):
    from trace_envs.core.registry import get_entry, latest_capability_id

    return get_entry(latest_capability_id(capability))


def _safe_doc(text: str) -> str:
    return " ".join(str(text).replace("\\", "/").replace('"""', "'''").split())


def evidence_families(spec: dict, limit: int = 12) -> list[tuple[str, int]]:
    """Request families of the spec's failed evidence, with counts, most frequent first.

    The spec's ``failure_families`` (counted over every failure the capability is lacking in) when it
    has them, else the families its example failures name. A spec written before trajectories recorded
    their families has neither: its examples are then replayed on their target (``reset(seed)``), which
    rebuilds the task only if the rollout used the target's default kwargs.
    """
    if spec.get("failure_families"):
        counts = Counter({str(k): int(v) for k, v in spec["failure_families"].items()})
        return _ranked(counts)
    examples = (spec.get("example_failures") or [])[:limit]
    if any(ex.get("families") for ex in examples):
        counts = Counter(f for ex in examples for f in ex.get("families") or [])
        return _ranked(counts)
    return _replayed_families(examples)


def _ranked(counts: Counter) -> list[tuple[str, int]]:
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def _replayed_families(examples: list[dict]) -> list[tuple[str, int]]:
    import gymnasium as gym

    counts: Counter = Counter()
    envs: dict = {}
    try:
        for ex in examples:
            env_id, seed = ex.get("env_id"), ex.get("seed")
            if not env_id or seed is None or "tau_" not in env_id:
                continue
            if env_id not in envs:
                envs[env_id] = gym.make(env_id)
            env = envs[env_id]
            env.reset(seed=int(seed))
            task = getattr(env.unwrapped, "task", None)
            for r in getattr(task, "requests", None) or []:
                counts[r.kind] += 1
    finally:
        for env in envs.values():
            env.close()
    return _ranked(counts)


def _supported_families(base_cls: type, domain: str, difficulty: int, seeds: int = 40) -> set[str]:
    from trace_envs.domains.task import request_family

    env = base_cls(domain=domain, difficulty=difficulty)
    kinds: set[str] = set()
    try:
        for s in range(seeds):
            env.reset(seed=90_000 + s)
            kinds.update(request_family(r.kind) for r in env.task.requests)
    finally:
        env.close()
    return kinds


def render(spec: dict, *, env_id: str, run_id: str, spec_name: str = "spec", variant: int = 0,
           focus_share: float | None = None) -> Rendered:
    """The module source for ``spec`` under ``env_id`` (raises :class:`NoTemplate` if no family matches).

    ``variant`` indexes :data:`VARIANTS` (0: the evidence's focus and difficulty; later: more conservative).
    ``focus_share`` replaces variant 0's share (:data:`FOCUS_SHARE`): 1.0 draws every episode from the
    evidence's families, an env that isolates the capability the way a small model can learn it from (the
    family's other requests, new to the base, otherwise carry most of an SFT loss; docs/generate.md).
    """
    import importlib

    import trace_envs  # noqa: F401 - registers the built-in ids

    capability = str(spec.get("name", "")).strip().lower().replace(" ", "_").replace("-", "_")
    if capability not in FAMILIES:
        raise NoTemplate(f"no built-in template matches the capability {spec.get('name')!r} (templates: "
                         f"{', '.join(FAMILIES)}). Fix: generate it with an LLM: "
                         "`trace generate --spec SPEC --workspace DIR --llm URL --model NAME`")
    template, base_module, base_class = FAMILIES[capability]
    target_env = spec.get("target_env") or ""
    builtin = _builtin_entry(capability)
    stats = spec.get("statistics") or {}
    coverage = stats.get("coverage")
    cls = getattr(importlib.import_module(f"trace_envs.capabilities.{base_module}"), base_class)
    default = int(getattr(cls, "default_difficulty", 1)) if template == "tau_capability" else 1
    share, use_evidence = VARIANTS[min(variant, len(VARIANTS) - 1)]
    if variant == 0 and focus_share is not None:
        share = float(focus_share)
    low = use_evidence and isinstance(coverage, (int, float)) and coverage >= 0.5
    difficulty = max(1, default - 1) if low and template == "tau_capability" else default
    reason = (f"the family's default {default} lowered by one: coverage {coverage:.2f} ≥ 0.5" if low and
              template == "tau_capability" else f"the family's default")
    values = {
        "env_id": env_id, "env_id_literal": json.dumps(env_id), "capability": capability,
        "target_env": target_env, "definition": _safe_doc(spec.get("definition", "")), "run_id": run_id,
        "spec_name": spec_name, "delta": _fmt(stats.get("delta")), "coverage": _fmt(coverage),
        "base_module": base_module, "base_class": base_class, "class_name": "Generated" + base_class,
        "max_episode_steps": int(builtin.max_episode_steps or 30), "difficulty": difficulty,
        "difficulty_reason": reason,
        # The family's reward version, pinned in the module: a published generated id keeps its reward when
        # the family gets a newer version.
        "reward_version": int(builtin.kwargs.get("version", 0)),
    }
    notes: dict = {"template": template, "difficulty": difficulty, "variant": variant, "focus_share": share}
    extra, note = EVIDENCE_KWARGS.get(capability, ({}, "")) if use_evidence else ({}, "")
    values["extra_kwargs"] = "".join(f", {json.dumps(k)}: {json.dumps(v)}" for k, v in extra.items())
    values["kwargs_note"] = f" {note}" if note else ""
    if extra:
        notes["kwargs"] = dict(extra)
    if template == "tau_capability":
        target = target_env.split(":")[-1].split("/")[-1].rsplit("-v", 1)[0]
        domain = _TAU_DOMAINS.get(target)
        if domain is None:
            raise NoTemplate(f"the {capability} template needs a τ² target (trace/tau_airline-v0 or "
                             f"trace/tau_retail-v0), got {target_env!r}. Fix: use --llm for other targets")
        found = evidence_families(spec)
        total = sum(n for _, n in found)
        supported = _supported_families(cls, domain, difficulty)
        if share > 0 and found:
            # The family may draw most of the evidence's requests only at easier levels (look-ups come first,
            # e.g. a flight's status): go down to the hardest level that draws the largest share of the
            # evidence's failures, rather than focus on a few of them (or on nothing).
            def drawn(families: set[str]) -> int:
                return sum(n for f, n in found if f in families)

            best, best_supported = difficulty, supported
            for easier in range(difficulty - 1, 0, -1):
                there = _supported_families(cls, domain, easier)
                if drawn(there) > drawn(best_supported):
                    best, best_supported = easier, there
            if best != difficulty:
                reason = (f"the hardest level at which the family draws the most of the evidence's failures: "
                          f"{drawn(best_supported)} of {total}, in "
                          f"{', '.join(f for f, _ in found if f in best_supported)}; its default is {default}")
                difficulty, supported = best, best_supported
                values.update({"difficulty": difficulty, "difficulty_reason": reason})
                notes["difficulty"] = difficulty
        focus = [f for f, n in found if f in supported and n >= FOCUS_MIN_SHARE * total] if share > 0 else []
        if share > 0 and not focus:  # evidence spread thin: its most frequent family the level draws
            focus = [f for f, _ in found if f in supported][:1]
        notes.update({"domain": domain, "evidence_families": dict(found), "focus_families": focus})
        values.update({
            "domain": domain, "focus_families": repr(tuple(focus)), "focus_share": share,
            "focus_percent": int(share * 100) if focus else 0,
            "focus_text": ", ".join(focus) if focus else "none of them is one this family generates",
            "description_literal": json.dumps(f"{capability} on {domain} (generated; focus: "
                                              f"{', '.join(focus) or 'all families'}; difficulty {difficulty})"),
        })
    else:
        if "swe" not in target_env:
            raise NoTemplate(f"the swe_localization template needs the swe_repo target, got {target_env!r}. "
                             "Fix: use --llm for other targets")
        values["description_literal"] = json.dumps("Name the file and function of an injected bug (generated).")
        _prefetch_repositories(cls)
    source = Template((TEMPLATES / f"{template}.py.tmpl").read_text(encoding="utf-8")).substitute(values)
    return Rendered(source, notes)


def _prefetch_repositories(cls: type) -> None:
    """Fetch the family's repositories into the cache here (trusted, with network): the admission sandbox has none."""
    env = cls()
    try:
        env.reset(seed=0)
    finally:
        env.close()


def _fmt(x) -> str:
    return "n/a" if x is None else f"{float(x):.2f}"
