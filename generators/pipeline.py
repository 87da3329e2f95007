"""``generate``: capability specs in, admitted env modules in a workspace registry out.

The second stage of TRACE (docs/design.md): for each spec that ``trace diagnose`` wrote
(``specs/<capability>.json``), write an env module — with the offline generator (templates of the
built-in families, the default) or the LLM generator agent (``llm_url`` + ``model``) — admit it
(:func:`generators.admit.admit`) and install it into the workspace (:class:`Workspace`). Every
attempt (prompt, reply, module, report) is kept in the run directory; only admitted modules and
their reports go to the workspace.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .admit import AdmissionConfig, AdmissionReport, admit
from .workspace import Workspace, WorkspaceError


class GenerationError(ValueError):
    """Bad input to :func:`generate` (no spec found, malformed spec); the message says the fix."""


@dataclass
class GenerationResult:
    """The outcome of one spec.

    Attributes:
        capability: the spec's capability.
        admitted: whether an attempt was admitted and registered.
        env_id: the registered id (``gen/<capability>_<target>-vN``), None if nothing was admitted.
        module: the module in the workspace (None if nothing was admitted).
        report_json, report_md: the last attempt's admission report (beside the module when admitted,
            else in the run directory).
        attempts: attempts made.
        reason: why nothing was admitted (None when admitted).
        run_dir: this spec's folder in the run directory (one ``attempt_<k>/`` each).
    """

    capability: str
    admitted: bool
    env_id: str | None
    module: Path | None
    report_json: Path
    report_md: Path
    attempts: int
    reason: str | None
    run_dir: Path | None = None


def load_specs(spec: str | os.PathLike | Sequence[str | os.PathLike]) -> list[tuple[Path, dict]]:
    """Specs from a spec file, a folder of specs, a diagnosis or run folder (``specs/``, ``diagnosis/specs/``)."""
    if isinstance(spec, (list, tuple)):
        return [item for s in spec for item in load_specs(s)]
    path = Path(spec)
    if path.is_dir():
        for folder in (path / "specs", path / "diagnosis" / "specs", path):
            files = sorted(folder.glob("*.json")) if folder.is_dir() else []
            if files:
                return [item for f in files for item in load_specs(f)]
        raise GenerationError(f"{path}: no spec JSON files in it, nor in specs/ or diagnosis/specs/. Fix: run "
                              "`trace diagnose` first, or pass a spec file")
    if not path.is_file():
        raise GenerationError(f"{path}: no such spec file or folder")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise GenerationError(f"{path}: not valid JSON ({exc})") from None
    missing = [k for k in ("name", "definition", "target_env") if not data.get(k)] if isinstance(data, dict) else []
    if not isinstance(data, dict) or missing:
        raise GenerationError(f"{path}: not a capability spec (missing {missing or 'everything'}). Fix: pass a "
                              "specs/<capability>.json written by `trace diagnose`")
    return [(path, data)]


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def _taken_ids(workspace: Workspace) -> set[str]:
    import trace_envs

    return {e.id for e in trace_envs.registered()} | set(workspace.ids())


def _capability(spec: dict) -> str:
    import re

    return re.sub(r"[^a-z0-9_]+", "_", str(spec["name"]).strip().lower()).strip("_") or "capability"


def generate(spec, workspace, run_dir=None, llm_url: str | None = None, model: str | None = None,
             attempts: int = 3, progress: bool = True, *, api_key: str = "EMPTY",
             config: AdmissionConfig | None = None, run_id: str | None = None,
             llm_options: dict | None = None, focus_share: float | None = None) -> list[GenerationResult]:
    """Generate, admit and register one env per spec (see the module docstring).

    Args:
        spec: a spec JSON path, a diagnosis/run folder holding ``specs/``, or a list of spec paths.
        workspace: the workspace folder (created if missing).
        run_dir: where attempts are kept (default: ``<workspace>/../generate-runs/<run id>`` — beside,
            never inside, the workspace).
        llm_url, model: an OpenAI-compatible endpoint and model for the generator agent; without them
            the offline generator is used.
        attempts: attempts per spec (the offline generator has at most three variants to try).
        progress: a progress bar over the specs.
        api_key: the endpoint's API key.
        config: admission limits and sizes.
        run_id: the run's id (``origin: generated:<run id>``); default: a timestamp.
        llm_options: extra keyword arguments for :class:`generators.agent.GeneratorAgent`.
        focus_share: the offline generator's first attempt draws this share of the episodes from the
            evidence's families (default :data:`generators.offline.FOCUS_SHARE`); later attempts fall back to
            the weaker variants as before.
    """
    if (llm_url is None) != (model is None):
        raise GenerationError("llm_url and model go together (both, or neither for the offline generator)")
    if attempts < 1:
        raise GenerationError(f"attempts must be >= 1, got {attempts}")
    if focus_share is not None and not 0.0 <= focus_share <= 1.0:
        raise GenerationError(f"focus_share must be in [0, 1], got {focus_share}")
    specs = load_specs(spec)
    ws = Workspace(workspace).init()
    run_id = run_id or new_run_id()
    run_dir = Path(run_dir) if run_dir is not None else ws.root.parent / "generate-runs" / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg = config or AdmissionConfig()
    agent = None
    if llm_url is not None:
        from .agent import GeneratorAgent

        agent = GeneratorAgent(llm_url, model, api_key=api_key, **(llm_options or {}))
    bar = _bar(len(specs), progress)
    results = []
    for spec_path, data in specs:
        if bar is not None:
            bar.set_postfix_str(data["name"])
        results.append(_one(spec_path, data, ws, run_dir, run_id, agent, attempts, cfg, focus_share))
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    (run_dir / "generation.json").write_text(json.dumps([{k: (str(v) if isinstance(v, Path) else v)
                                                       for k, v in r.__dict__.items()} for r in results],
                                                     indent=2) + "\n", encoding="utf-8")
    if any(r.admitted for r in results):
        from trace_envs.core.registry import load_registry

        load_registry(ws.registry)  # gym.make works on the new ids in this process
    return results


def _one(spec_path: Path, spec: dict, ws: Workspace, run_dir: Path, run_id: str, agent, attempts: int,
         cfg: AdmissionConfig, focus_share: float | None = None) -> GenerationResult:
    from .admit import target_tool_schemas
    from .agent import LLMGenerationError
    from .offline import NoTemplate, render

    capability = _capability(spec)
    folder = run_dir / capability
    folder.mkdir(parents=True, exist_ok=True)
    target_env = spec["target_env"]
    taken = _taken_ids(ws)
    name = ws.env_name(capability, _target_name(target_env))
    version = ws.next_version(name, taken)
    env_id = ws.env_id(name, version)
    result: GenerationResult | None = None
    history: list[tuple[str, AdmissionReport]] = []
    from .offline import VARIANTS

    limit = attempts if agent is not None else min(attempts, len(VARIANTS))
    for n in range(1, limit + 1):  # noqa: B007 - n is the attempt number
        attempt_dir = folder / f"attempt_{n}"
        if agent is None:
            try:
                rendered = render(spec, env_id=env_id, run_id=run_id, spec_name=spec_path.name, variant=n - 1,
                                  focus_share=focus_share)
                source = rendered.source
                if any(source == previous for previous, _ in history):
                    break  # this family has no more conservative variant to try
                attempt_dir.mkdir(parents=True, exist_ok=True)
                (attempt_dir / "template.json").write_text(json.dumps(rendered.notes, indent=2) + "\n",
                                                           encoding="utf-8")
            except NoTemplate as exc:
                return _failed(capability, attempt_dir, env_id, target_env, str(exc), n, folder)
        else:
            attempt_dir.mkdir(parents=True, exist_ok=True)
            try:
                schemas = target_tool_schemas(target_env, spec.get("tool_schemas"))
            except (KeyError, ValueError) as exc:
                return _failed(capability, attempt_dir, env_id, target_env, f"no target tool schemas: {exc}", n,
                               folder)
            try:
                source = agent.write_module(spec, env_id=env_id, capability=capability, target_schemas=schemas,
                                            history=history, attempt_dir=attempt_dir)
            except LLMGenerationError as exc:
                result = _failed(capability, attempt_dir, env_id, target_env, str(exc), n, folder)
                continue
        result, report = _admit_attempt(source, capability=capability, target_env=target_env, ws=ws,
                                        attempt_dir=attempt_dir, env_id=env_id, name=name, version=version,
                                        taken=taken, hint=spec.get("hint") if isinstance(spec.get("hint"), str) else None,
                                        spec_schemas=spec.get("tool_schemas"), run_id=run_id, cfg=cfg)
        result.attempts, result.run_dir = n, folder
        history.append((source, report))
        if result.admitted or (result.reason or "").startswith("registry:"):
            return result
    assert result is not None
    return result


def admit_module(source: str, *, capability: str, target_env: str, workspace, run_dir=None,
                 spec_schemas: list[dict] | None = None, config: AdmissionConfig | None = None,
                 run_id: str | None = None) -> GenerationResult:
    """Admit one module (written by hand, by an LLM or a template) and register it if it passes.

    The module's ``REGISTRATION["id"]`` must be the workspace's next id for ``capability`` on ``target_env``
    (``gen/<capability>_<target>-vN``, e.g. ``gen/precondition_verification_tau_airline-v0``;
    :meth:`Workspace.next_version`). The attempt (module and report) is kept in
    ``run_dir`` (default: beside the workspace); only an admitted module goes to the workspace.
    """
    ws = Workspace(workspace).init()
    run_id = run_id or new_run_id()
    attempt_dir = Path(run_dir) if run_dir is not None else ws.root.parent / "generate-runs" / run_id / capability
    taken = _taken_ids(ws)
    name = ws.env_name(capability, _target_name(target_env))
    version = ws.next_version(name, taken)
    result, _ = _admit_attempt(source, capability=capability, target_env=target_env, ws=ws, attempt_dir=attempt_dir,
                               env_id=ws.env_id(name, version), name=name, version=version, taken=taken,
                               spec_schemas=spec_schemas, run_id=run_id, cfg=config or AdmissionConfig())
    return result


def _admit_attempt(source: str, *, capability: str, target_env: str, ws: Workspace, attempt_dir: Path, env_id: str,
                   name: str, version: int, taken: set[str], spec_schemas, run_id: str,
                   cfg: AdmissionConfig, hint: str | None = None) -> tuple[GenerationResult, AdmissionReport]:
    attempt_dir.mkdir(parents=True, exist_ok=True)
    (attempt_dir / "module.py").write_text(source, encoding="utf-8")
    report = admit(source, env_id=env_id, capability=capability, target_env=target_env, work_dir=attempt_dir,
                   taken_ids=taken, spec_schemas=spec_schemas, config=cfg)
    report_json, report_md = report.write(attempt_dir / "module")
    if not report.admitted:
        return GenerationResult(capability, False, None, None, report_json, report_md, 1, report.reason,
                                attempt_dir), report
    try:
        module, rj, rm = ws.install(source, report.registration, capability=capability, name=name,
                                    version=version, target=_target_name(target_env), origin=f"generated:{run_id}",
                                    report=report, hint=hint[:2000] if hint else None)
    except (WorkspaceError, FileExistsError) as exc:
        return GenerationResult(capability, False, None, None, report_json, report_md, 1, f"registry: {exc}",
                                attempt_dir), report
    return GenerationResult(capability, True, env_id, module, rj, rm, 1, None, attempt_dir), report


def _target_name(target_env: str) -> str:
    from trace_envs.core.registry import get_entry

    try:
        return get_entry(target_env).target or target_env
    except KeyError:
        return target_env


def _failed(capability: str, attempt_dir: Path, env_id: str, target_env: str, reason: str, n: int,
            folder: Path) -> GenerationResult:
    from .admit import CheckRow

    report = AdmissionReport(env_id=env_id, capability=capability, target_env=target_env,
                             rows=[CheckRow("generator", "generate", "failed", reason=reason)],
                             sandbox="not started")
    j, m = report.write(attempt_dir / "module")
    return GenerationResult(capability, False, None, None, j, m, n, reason, folder)


def _bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="generate", unit="spec", dynamic_ncols=True)
