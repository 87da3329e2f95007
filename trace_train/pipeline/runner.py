"""``trace run``: the whole TRACE loop in one run directory, resumable stage by stage.

The stages (docs/design.md, "Run directory"), each reading only the files of earlier stages::

    base      the base agent: the tiny model warmed up here (cached by content), a model folder,
              an OpenAI-compatible endpoint or a scripted agent            -> base/base.json
    rollout   the base agent on the target's seeds                         -> rollouts/trajectories.jsonl
    diagnose  contrastive analysis: which capabilities are missing         -> diagnosis/ (capabilities.json, specs/)
    generate  one env per retained capability, admitted into a workspace  -> generate/, workspace/
    train     GRPO, one LoRA adapter per capability (+ the SFT and
              multi-capability baselines)                                  -> train/<capability>/
    compose   token-level top-1 MoE over the adapters (+ merges,
              per-episode routing)                                         -> compose/
    evaluate  every method on held-out target seeds                        -> eval/<method>/
    (then)    report.md and a self-contained report.html                   -> report.md, report.html

``stages.json`` records per stage its status, inputs (the config section's fingerprint and the hashes of the
earlier stages' outputs it reads), outputs (with hashes) and seconds. Running again resumes: a stage whose
inputs are unchanged and whose outputs are on disk is skipped; the first other stage runs, and inside it the
work already done is kept where the stage can resume (rollouts and evaluation episodes are appended to JSONL
files, finished adapters are not retrained). ``from_stage`` re-runs a stage and everything after it.

A stage whose part of TRACE is missing from this installation is recorded as ``unavailable`` with the
reason, in the plan and in the report; nothing stands in for it.

    from trace_train.pipeline import Pipeline
    from trace_train.pipeline.config import load_config
    Pipeline(load_config("examples/configs/gpu_qwen3.yaml")).run()
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import importlib
import importlib.util
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..run_dir import rebase_summaries
from ..text_table import format_table
from .config import STAGES, ConfigError, RunConfig, dump_config

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1

#: Files above this size are fingerprinted by size and modification time instead of their bytes
#: (multi-GB checkpoints of a GPU base model would otherwise take minutes to hash on every resume).
HASH_LIMIT_BYTES = 64 * 2**20


class PipelineError(RuntimeError):
    """A stage cannot run with what the earlier stages produced; the message says why and what to change."""


# ----------------------------------------------------------------------------- hashing


def file_digest(path: Path) -> str:
    st = path.stat()
    if st.st_size > HASH_LIMIT_BYTES:
        return f"stat:{st.st_size}:{st.st_mtime_ns}"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def path_digest(path: Path) -> str | None:
    """A content hash of a file or of a folder's files (names and bytes); None if it does not exist."""
    if path.is_file():
        return file_digest(path)
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for p in sorted(q for q in path.rglob("*") if q.is_file() and "__pycache__" not in q.parts):
        h.update(str(p.relative_to(path)).encode() + b"\0" + file_digest(p).encode() + b"\n")
    return h.hexdigest()[:16]


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (a kill leaves the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- stages


@dataclass
class Stage:
    """One stage: what it needs, how long it should take, how to run it.

    ``run(ctx)`` returns ``(outputs, summary)``: the paths it wrote (relative to the run directory, or
    absolute for a model kept in the cache) and a small JSON-able summary for ``stages.json`` and the report.
    """

    name: str
    needs: tuple[str, ...]
    what: str
    run: Callable[["Context"], tuple[list[str], dict]]
    estimate: Callable[["Context"], tuple[float | None, str]]
    requires: Callable[[], str | None] = lambda: None  # a reason the stage is unavailable, or None
    #: folders of the run directory this stage alone writes (cleared when it re-runs on new inputs)
    owns: tuple[str, ...] = ()


def _module_missing(module: str, attr: str | None, issue: str) -> Callable[[], str | None]:
    def check() -> str | None:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if found and attr is not None:
            try:
                found = hasattr(importlib.import_module(module), attr)
            except Exception as exc:  # a half-installed part must not take the other stages down
                return f"not available in this build: importing {module} failed ({type(exc).__name__}: {exc})"
        if not found:
            return (f"not available in this build: {module}{'.' + attr if attr else ''} is not installed "
                    f"({issue} has not landed)")
        return None

    return check


@dataclass
class Context:
    """What a stage sees: the config, the run directory and the outputs of the stages before it."""

    cfg: RunConfig
    run_dir: Path
    state: dict
    progress: bool = True
    #: set by the runner: whether this stage continues an interrupted attempt with the same inputs
    resuming: bool = False

    def path(self, *parts: str) -> Path:
        return self.run_dir.joinpath(*parts)

    def summary(self, stage: str) -> dict:
        return self.state["stages"].get(stage, {}).get("summary") or {}

    def done(self, stage: str) -> bool:
        return self.state["stages"].get(stage, {}).get("status") == "done"

    @property
    def workspace(self) -> Path:
        ws = self.cfg.generate.workspace
        return Path(ws) if ws else self.path("workspace")


# The stage implementations live in trace_train.pipeline.stages, one module each; they are imported lazily so
# that `trace run --help` stays fast.
def _stage_list() -> list[Stage]:
    from . import stages as s

    return [
        Stage("base", (), "prepare the base agent (the tiny model's warm-up is cached by content)",
              s.run_base, s.estimate_base, owns=("base",)),
        Stage("rollout", ("base",), "roll out the base agent on the target seeds", s.run_rollout, s.estimate_rollout,
              owns=("rollouts",)),
        Stage("diagnose", ("rollout",), "contrast successes and failures; retain the missing capabilities",
              s.run_diagnose, s.estimate_diagnose, owns=("diagnosis",)),
        # The run's own workspace is the generate stage's; a workspace the user named is never cleared.
        Stage("generate", ("diagnose",), "generate and admit one env per retained capability",
              s.run_generate, s.estimate_generate, _module_missing("generators", "generate", "issue 14"),
              owns=("generate", "workspace")),
        Stage("train", ("base", "diagnose", "generate"), "GRPO: one LoRA adapter per capability, and the baselines",
              s.run_train, s.estimate_train, _module_missing("trace_train.train.grpo", "train", "issue 15"),
              owns=("train",)),
        Stage("compose", ("base", "train"), "token-level top-1 MoE over the adapters, merges, per-episode routing",
              s.run_compose, s.estimate_compose, _module_missing("trace_train.compose", "compose", "issue 16"),
              owns=("compose",)),
        Stage("evaluate", ("base", "train", "compose"), "every method on the held-out target seeds",
              s.run_evaluate, s.estimate_evaluate, owns=("eval",)),
    ]


# ----------------------------------------------------------------------------- the runner


@dataclass
class PlanRow:
    stage: str
    action: str  # "run", "skip (done)", "unavailable"
    estimate_s: float | None
    note: str


@dataclass
class RunResult:
    run_dir: Path
    stages: dict
    report_md: Path | None
    report_html: Path | None
    seconds: float
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Pipeline:
    """The TRACE loop over one run directory (see the module docstring)."""

    def __init__(self, cfg: RunConfig, progress: bool = True) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.out)
        self.progress = progress
        self.stages = _stage_list()
        self.by_name = {s.name: s for s in self.stages}
        assert tuple(self.by_name) == STAGES

    # -- state
    @property
    def state_path(self) -> Path:
        return self.run_dir / "stages.json"

    def load_state(self) -> dict:
        if self.state_path.exists():
            try:
                state = _read_json(self.state_path)
                if state.get("format_version") == FORMAT_VERSION:
                    return rebase_summaries(state, self.run_dir)
            except (OSError, json.JSONDecodeError):
                logger.warning("%s is unreadable; starting the run's bookkeeping afresh", self.state_path)
        return {"format_version": FORMAT_VERSION, "run_dir": str(self.run_dir),
                "run_dir_abs": str(self.run_dir.resolve()), "stages": {}}

    def save_state(self, state: dict) -> None:
        _write_json(self.state_path, state)

    def _abs(self, p: str) -> Path:
        q = Path(p)
        return q if q.is_absolute() else self.run_dir / q

    def inputs_of(self, stage: Stage, state: dict) -> dict:
        """The stage's inputs now: its config section and the hashed outputs of the stages it reads."""
        inputs = {"config": self.cfg.section_hash(stage.name)}
        if stage.name == "evaluate":  # the held-out target is the rollout section's targets and env kwargs
            inputs["config:rollout"] = self.cfg.section_hash("rollout")
        for need in stage.needs:
            entry = state["stages"].get(need, {})
            if entry.get("status") == "done":
                inputs[need] = {p: path_digest(self._abs(p)) for p in entry.get("outputs", [])}
            else:
                inputs[need] = entry.get("status", "pending")
        return inputs

    def up_to_date(self, stage: Stage, state: dict) -> bool:
        entry = state["stages"].get(stage.name)
        if not entry or entry.get("status") != "done":
            return False
        if entry.get("inputs") != self.inputs_of(stage, state):
            return False
        return all(self._abs(p).exists() for p in entry.get("outputs", []))

    def plan(self, from_stage: str | None = None) -> list[PlanRow]:
        """What :meth:`run` would do now, with a time estimate per stage (nothing is run)."""
        if from_stage is not None and from_stage not in STAGES:
            raise ConfigError(f"--from {from_stage!r} is not a stage; choose one of {', '.join(STAGES)}")
        state = self.load_state()
        ctx = Context(self.cfg, self.run_dir, state, self.progress)
        rows, forced = [], False
        for stage in self.stages:
            forced = forced or stage.name == from_stage
            reason = stage.requires()
            est, why = stage.estimate(ctx)
            if reason:
                rows.append(PlanRow(stage.name, "unavailable", None, reason))
            elif not forced and self.up_to_date(stage, state):
                rows.append(PlanRow(stage.name, "skip (done)", 0.0, "inputs unchanged, outputs on disk"))
            else:
                rows.append(PlanRow(stage.name, "run", est, why))
                forced = True  # later stages' inputs will change: plan them as runs
        return rows

    @contextlib.contextmanager
    def _lock(self):
        import fcntl

        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PipelineError(f"another `trace run` is using {self.run_dir}; wait for it or use another --out") \
                    from None
            yield
        finally:
            os.close(fd)

    def run(self, from_stage: str | None = None, stop_after: str | None = None) -> RunResult:
        """Run the stages that are not up to date, in order, then write the report.

        Args:
            from_stage: re-run this stage and every later one even if up to date.
            stop_after: stop after this stage (the report is still written).
        """
        for key, value in (("--from", from_stage), ("stop_after", stop_after)):
            if value is not None and value not in STAGES:
                raise ConfigError(f"{key} {value!r} is not a stage; choose one of {', '.join(STAGES)}")
        t0 = time.perf_counter()
        result = RunResult(self.run_dir, {}, None, None, 0.0)
        with self._lock():
            (self.run_dir / "config.yaml").write_text(dump_config(self.cfg), encoding="utf-8")
            state = self.load_state()
            state["config_file"] = "config.yaml"
            forced = False
            try:
                for stage in self.stages:
                    forced = forced or stage.name == from_stage
                    self._run_stage(stage, state, forced, result)
                    if stage.name == stop_after:
                        break
            finally:
                self.save_state(state)
                result.stages = state["stages"]
                result.report_md, result.report_html = self.write_report()
        result.seconds = time.perf_counter() - t0
        return result

    def _run_stage(self, stage: Stage, state: dict, forced: bool, result: RunResult) -> None:
        entries = state["stages"]
        reason = stage.requires()
        if reason:
            entries[stage.name] = {"status": "unavailable", "reason": reason, "what": stage.what}
            self.save_state(state)
            print(f"[trace run] {stage.name}: {reason}", flush=True)
            result.skipped.append(stage.name)
            return
        if not forced and self.up_to_date(stage, state):
            print(f"[trace run] {stage.name}: done already (inputs unchanged), skipped", flush=True)
            result.skipped.append(stage.name)
            return
        inputs = self.inputs_of(stage, state)
        previous = entries.get(stage.name, {})
        # The same inputs as an interrupted attempt: keep its partial work (the stage resumes inside).
        # Different inputs: the stage's old outputs describe something else, so they go.
        resuming = not forced and previous.get("status") in ("running", "failed") and previous.get("inputs") == inputs
        if not resuming:
            owned = [o for o in stage.owns if not (o == "workspace" and self.cfg.generate.workspace)]
            for p in [*previous.get("outputs", []), *owned]:
                self._remove_output(p)
        entries[stage.name] = {"status": "running", "what": stage.what, "inputs": inputs, "started": _now(),
                               "resumed": resuming, "outputs": previous.get("outputs", []) if resuming else []}
        self.save_state(state)
        print(f"[trace run] {stage.name}: {stage.what}{' (resuming)' if resuming else ''}", flush=True)
        ctx = Context(self.cfg, self.run_dir, state, self.progress, resuming)
        t = time.perf_counter()
        try:
            outputs, summary = stage.run(ctx)
        except BaseException as exc:
            entries[stage.name].update(status="failed", error=f"{type(exc).__name__}: {exc}",
                                       seconds=round(time.perf_counter() - t, 2), finished=_now())
            self.save_state(state)
            raise
        entries[stage.name].update(
            status="done", outputs=outputs, output_hashes={p: path_digest(self._abs(p)) for p in outputs},
            summary=summary, seconds=round(time.perf_counter() - t, 2), finished=_now())
        self.save_state(state)
        result.ran.append(stage.name)
        print(f"[trace run] {stage.name}: done in {entries[stage.name]['seconds']:.1f} s", flush=True)

    def _remove_output(self, p: str) -> None:
        path = self._abs(p)
        # Only what lives inside the run directory is ours to delete (a cached base model is shared).
        try:
            path.resolve().relative_to(self.run_dir.resolve())
        except ValueError:
            return
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.exists():
            path.unlink()

    def write_report(self) -> tuple[Path | None, Path | None]:
        """Write ``report.md`` and ``report.html`` from what the run directory holds now."""
        from .stages.report import run_report

        return run_report(self.run_dir)


def format_plan(rows: list[PlanRow]) -> str:
    """The plan as a text table, with the total of the estimates."""
    def est(s: float | None) -> str:
        if s is None:
            return "-"
        return f"{s / 60:.1f} min" if s >= 90 else f"{s:.0f} s"

    table = format_table(["stage", "action", "estimate", "note"], [[r.stage, r.action, est(r.estimate_s), r.note]
                                                                  for r in rows])
    known = [r.estimate_s for r in rows if r.action == "run" and r.estimate_s is not None]
    unknown = [r.stage for r in rows if r.action == "run" and r.estimate_s is None]
    total = f"estimated total: {est(sum(known))}" + (f" + unestimated: {', '.join(unknown)}" if unknown else "")
    return table + "\n" + total + " (rough: per-unit times measured on a 2-core CPU; a loaded machine is slower)"


__all__ = ["Context", "Pipeline", "PipelineError", "PlanRow", "RunResult", "Stage", "format_plan", "path_digest"]
