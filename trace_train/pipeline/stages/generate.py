"""The ``generate`` stage: one env per retained capability, admitted into a workspace -> ``generate/``, ``workspace/``."""

from __future__ import annotations

import json

from .common import SECONDS_PER_ADMISSION, _selected


def run_generate(ctx) -> tuple[list[str], dict]:
    from generators import generate

    g = ctx.cfg.generate
    specs = [ctx.path("diagnosis", "specs", f"{c}.json") for c in _selected(ctx)]
    specs = [s for s in specs if s.exists()]
    ctx.path("generate").mkdir(parents=True, exist_ok=True)
    ctx.workspace.mkdir(parents=True, exist_ok=True)
    results = generate(specs, ctx.workspace, run_dir=ctx.path("generate"), llm_url=g.llm_url, model=g.llm_model,
                       attempts=g.attempts, progress=ctx.progress, focus_share=g.focus_share) if specs else []
    rows = [{"capability": r.capability, "admitted": bool(r.admitted), "env_id": r.env_id,
             "module": str(r.module) if r.module else None, "report_json": str(r.report_json),
             "report_md": str(r.report_md), "attempts": r.attempts, "reason": r.reason} for r in results]
    (ctx.path("generate", "results.json")).write_text(json.dumps(rows, indent=2) + "\n")
    outputs = ["generate"]
    if ctx.workspace.resolve().is_relative_to(ctx.run_dir.resolve()):
        outputs.append(str(ctx.workspace.resolve().relative_to(ctx.run_dir.resolve())))
    return outputs, {"admitted": {r["capability"]: r["env_id"] for r in rows if r["admitted"]},
                     "rejected": [r["capability"] for r in rows if not r["admitted"]],
                     "workspace": str(ctx.workspace), "generator": "llm" if g.llm_url else "offline"}


def estimate_generate(ctx) -> tuple[float | None, str]:
    n = _selected(ctx)
    k = len(n) if ctx.done("diagnose") else ctx.cfg.diagnose.max_capabilities
    g = ctx.cfg.generate
    if g.llm_url:
        return None, f"LLM generation on {g.llm_url}, up to {g.attempts} attempts per capability"
    return k * SECONDS_PER_ADMISSION, f"offline generation + admission of {'≤' if not ctx.done('diagnose') else ''}{k} envs"
