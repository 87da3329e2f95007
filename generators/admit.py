"""Admission of a generated env module: nothing enters a workspace registry before it passes.

Generated code is untrusted. :func:`admit` runs, in order:

(a) static checks on the source (:mod:`generators.static`): it parses, imports only from the
    allow-list, no dynamic code, no file writes, no process/network/foreign-memory access, no dunder
    escapes, a literal ``REGISTRATION`` dict whose id is the one assigned and not already registered;
(b) dynamic checks in a separate process (:mod:`generators.admission_worker`) with a wall-clock
    timeout, a memory limit (``RLIMIT_AS``) and no network — under bubblewrap (``--unshare-net``,
    read-only file system, private ``/tmp``) where ``bwrap`` is installed, else a plain subprocess
    with a warning; the report says which. The worker imports the module, compares its tool
    schemas with the target's, runs the conformance suite (``check_trace_env``), the reward-hacking
    probes and a calibration; a second process computes the task digests of a few seeds with
    another ``PYTHONHASHSEED``, and the two must agree.

The result is an :class:`AdmissionReport` (one row per check: passed / failed / not run, figure,
reason, seconds), written as JSON and Markdown beside the module. Only an admitted module is
installed into the workspace (:mod:`generators.workspace`).
"""

from __future__ import annotations

import json
import os
import queue
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trace_envs.core.bwrap import rebind_hidden

from .probes import PROBE_BOUND, PROBE_NAMES
from .static import STATIC_CHECKS, static_check

WORKER = Path(__file__).resolve().parent / "admission_worker.py"
#: The folder that holds ``generators`` and ``trace_envs`` (put on the worker's PYTHONPATH).
_CODE_ROOTS = sorted({str(Path(__file__).resolve().parent.parent),
                      str(Path(__import__("trace_envs").__file__).resolve().parent.parent)})


@dataclass
class AdmissionConfig:
    """Limits and sizes of the dynamic checks.

    Attributes:
        timeout_s: wall-clock limit of the whole dynamic step (the worker is killed after it).
        import_timeout_s: wall-clock limit of importing the module (an import that hangs fails fast).
        memory_mb: address-space limit of each worker process (``RLIMIT_AS``).
        n_seeds: seeds of the conformance suite (oracle, seed and determinism checks).
        digest_seeds: seeds whose task digests are compared across two processes.
        probe_seeds: episodes per reward-hacking probe.
        probe_bound: the most mean reward each probe may earn (:data:`generators.probes.PROBE_BOUND`,
            0.05: a policy that does not use the records must earn nothing worth learning).
        calibration_groups, calibration_group_size: G × K episodes of the calibration agent
            (:class:`generators.probes.MixtureAgent`; K = 8, GRPO's default group size).
        calibration_deficit, calibration_random: its chances to play the deficit / random agent.
        calibration_agent: calibrate against this registered scripted agent instead (e.g. ``tau:noisy``;
            built per group member with its sampling seed), as ``trace envs calibrate --agent`` does.
        sandbox: ``"auto"`` (bubblewrap when installed), ``"bwrap"`` (required) or ``"none"``.
    """

    timeout_s: float = 300.0
    import_timeout_s: float = 30.0
    memory_mb: int = 2048
    n_seeds: int = 8
    digest_seeds: int = 4
    probe_seeds: int = 16
    probe_bound: float = PROBE_BOUND
    calibration_groups: int = 24
    calibration_group_size: int = 8
    calibration_deficit: float = 0.4
    calibration_random: float = 0.25
    calibration_seed_offset: int = 1000
    calibration_agent: str | None = None
    sandbox: str = "auto"

    def __post_init__(self) -> None:
        if self.sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be auto, bwrap or none, got {self.sandbox!r}")
        if not 0.0 <= self.probe_bound < 1.0:
            raise ValueError(f"probe_bound must be in [0, 1), got {self.probe_bound!r}")
        if self.timeout_s <= 0 or self.import_timeout_s <= 0 or self.memory_mb < 256:
            raise ValueError("timeouts must be positive and memory_mb at least 256")


@dataclass
class CheckRow:
    """One row of the admission report."""

    name: str
    stage: str  # static | dynamic | registry
    status: str  # passed | failed | not run
    figure: str = ""
    reason: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class AdmissionReport:
    """The outcome of :func:`admit`: every check's row, the sandbox used and the verdict."""

    env_id: str
    capability: str
    target_env: str
    rows: list[CheckRow] = field(default_factory=list)
    sandbox: str = ""
    warnings: list[str] = field(default_factory=list)
    registration: dict | None = None
    seconds: float = 0.0
    output_tail: str = ""

    @property
    def admitted(self) -> bool:
        return bool(self.rows) and all(r.status == "passed" for r in self.rows)

    @property
    def failures(self) -> list[CheckRow]:
        return [r for r in self.rows if r.status == "failed"]

    @property
    def reason(self) -> str | None:
        """The first failed check and why (None when admitted)."""
        f = self.failures
        return None if not f else f"{f[0].name}: {f[0].reason}"

    def row(self, name: str) -> CheckRow | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_dict(self) -> dict:
        return {"env_id": self.env_id, "capability": self.capability, "target_env": self.target_env,
                "admitted": self.admitted, "reason": self.reason, "sandbox": self.sandbox,
                "warnings": self.warnings, "seconds": round(self.seconds, 3), "registration": self.registration,
                "checks": [asdict(r) | {"seconds": round(r.seconds, 3)} for r in self.rows],
                "output_tail": self.output_tail}

    def to_markdown(self) -> str:
        verdict = "ADMITTED" if self.admitted else "REJECTED"
        lines = [f"# Admission of `{self.env_id}`: {verdict}", "",
                 f"- capability: `{self.capability}`, target: `{self.target_env}`",
                 f"- sandbox: {self.sandbox}", f"- seconds: {self.seconds:.1f}"]
        lines += [f"- warning: {w}" for w in self.warnings]
        if self.reason:
            lines.append(f"- first failure: {self.reason.splitlines()[0]}")
        lines += ["", "| check | stage | result | figure | reason | s |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            reason = r.reason.splitlines()[0] if r.reason else ""
            lines.append(f"| {r.name} | {r.stage} | {r.status} | {r.figure} | {_md(reason)} | {r.seconds:.2f} |")
        details = [r for r in self.rows if r.status == "failed" and "\n" in r.reason]
        for r in details:
            lines += ["", f"## {r.name}", "", "```", r.reason.strip(), "```"]
        return "\n".join(lines) + "\n"

    def feedback(self) -> str:
        """The report as the generator agent reads it before its next attempt."""
        lines = [f"Admission of {self.env_id}: {'ADMITTED' if self.admitted else 'REJECTED'}."]
        for r in self.rows:
            if r.status == "failed":
                lines.append(f"FAILED {r.name}: {r.reason.strip()}" + (f" [figure: {r.figure}]" if r.figure else ""))
        passed = [r.name for r in self.rows if r.status == "passed"]
        if passed:
            lines.append("Passed: " + ", ".join(passed) + ".")
        return "\n".join(lines)

    def write(self, stem: Path) -> tuple[Path, Path]:
        """Write ``<stem>.admission.json`` and ``<stem>.admission.md``; returns both paths."""
        stem.parent.mkdir(parents=True, exist_ok=True)
        j, m = Path(f"{stem}.admission.json"), Path(f"{stem}.admission.md")
        j.write_text(json.dumps(self.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
        m.write_text(self.to_markdown(), encoding="utf-8")
        return j, m


def _md(text: str) -> str:
    return text.replace("|", "\\|")[:300]


#: Dynamic checks in report order (the worker's names); the first three are derived here.
DYNAMIC_CHECKS = ["import", "tool schemas identical to the target's", "no tool the target lacks",
                  "conformance: gymnasium check_env", "conformance: seed determinism",
                  "conformance: different seeds differ", "conformance: oracle scores 1.0",
                  "conformance: bad actions never crash, score < 1", "conformance: reward range and truncation",
                  "conformance: close frees resources", "determinism across two processes",
                  *(f"probe: {name.split(':', 1)[1]}" for name in PROBE_NAMES),
                  "calibration", "rewards in [0, 1]"]


# ------------------------------------------------------------------------------------------------ target
def target_tool_schemas(target_env: str, spec_schemas: list[dict] | None = None) -> list[dict]:
    """The target's tool schemas: from a reset of the target env, or the spec's when the target needs Docker."""
    import gymnasium as gym

    import trace_envs  # noqa: F401 - registers the ids
    from trace_envs.core.registry import get_entry

    entry = get_entry(target_env)
    if entry.requires:
        if not spec_schemas:
            raise ValueError(f"the target {target_env} requires {list(entry.requires)}; its tool schemas must come "
                             "from the spec (tool_schemas)")
        return list(spec_schemas)
    env = gym.make(target_env)
    try:
        _, info = env.reset(seed=0)
        return list(info["tools"])
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ sandbox
def sandbox_kind(requested: str = "auto") -> tuple[str, list[str]]:
    """(``"bwrap"`` or ``"none"``, warnings) for the requested sandbox."""
    bwrap = shutil.which("bwrap")
    if requested == "none":
        return "none", ["sandbox disabled (sandbox='none'): the module ran in a plain subprocess with network"]
    if bwrap and _bwrap_works(bwrap):
        return "bwrap", []
    if requested == "bwrap":
        raise RuntimeError("bubblewrap was required but `bwrap` is missing or unusable; install it with "
                           "`apt-get install -y bubblewrap`")
    return "none", ["bubblewrap (bwrap) is not available: the module ran in a plain subprocess (timeout and "
                    "memory limit only, network NOT isolated). Install it with `apt-get install -y bubblewrap`"]


_BWRAP_OK: dict[str, bool] = {}


def _bwrap_works(bwrap: str) -> bool:
    if bwrap not in _BWRAP_OK:
        try:
            ok = subprocess.run([bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--unshare-net",
                                 "--unshare-pid", "true"], capture_output=True, timeout=20).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        _BWRAP_OK[bwrap] = ok
    return _BWRAP_OK[bwrap]


def _command(kind: str, stage: Path) -> list[str]:
    py = [sys.executable, str(WORKER)]
    if kind == "none":
        return py
    # /run is replaced by an empty tmpfs: a read-only bind does not stop connecting to a Unix socket
    # there (the Docker daemon's, D-Bus), and --unshare-net does not cover filesystem sockets.
    return ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run",
            *rebind_hidden(_CODE_ROOTS), "--ro-bind", str(stage), str(stage), "--chdir", str(stage),
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--new-session", "--die-with-parent", *py]


def _limits(memory_mb: int):
    def apply() -> None:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


class _Worker:
    """One worker process: started with a job, read line by line with deadlines, always killed at the end."""

    def __init__(self, job: dict, kind: str, stage: Path, cfg: AdmissionConfig, hash_seed: int):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACE_REGISTRY", "PYTHONPATH"))}
        env.update({"PYTHONHASHSEED": str(hash_seed), "PYTHONPATH": os.pathsep.join(_CODE_ROOTS),
                    "PYTHONDONTWRITEBYTECODE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
                    "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRACE_REGISTRY": ""})
        # TRACE_CACHE is kept: the worker reads the user's caches (e.g. SWE repositories, fetched
        # beforehand by the trusted process, since the sandbox has no network); under bubblewrap
        # they are read-only.
        self.nonce = job["nonce"]
        self.proc = subprocess.Popen(_command(kind, stage), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, cwd=str(stage), env=env, text=True,
                                     preexec_fn=_limits(cfg.memory_mb), start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.tail: list[str] = []
        self.proc.stdin.write(json.dumps(job))
        self.proc.stdin.close()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def events(self, deadline: float, import_deadline: float):
        """Yield events until the process ends; yields ``{"event": "timeout", ...}`` when a deadline passes."""
        importing = True
        while True:
            limit = import_deadline if importing else deadline
            try:
                line = self.lines.get(timeout=max(0.0, limit - time.monotonic()))
            except queue.Empty:
                yield {"event": "timeout", "importing": importing}
                return
            if line is None:
                return
            if line.startswith(self.nonce + " "):
                try:
                    event = json.loads(line[len(self.nonce) + 1:])
                except ValueError:
                    continue
                if event.get("event") == "result" and event.get("check") == "import":
                    importing = False
                yield event
            else:
                self.tail = (self.tail + [line.rstrip("\n")])[-40:]

    def kill(self) -> int | None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a kernel that does not reap
            return None


def _died(code: int | None, memory_mb: int) -> str:
    if code is not None and code < 0:
        sig = signal.Signals(-code).name
        hint = f" (likely past the memory limit of {memory_mb} MB)" if -code in (signal.SIGKILL, signal.SIGSEGV,
                                                                                   signal.SIGABRT) else ""
        return f"the worker process died of {sig}{hint}"
    return f"the worker process exited with status {code} before finishing"


# ------------------------------------------------------------------------------------------------ admit
def admit(source: str, *, env_id: str, capability: str, target_env: str, work_dir: str | os.PathLike,
          taken_ids: set[str] | None = None, spec_schemas: list[dict] | None = None,
          config: AdmissionConfig | None = None) -> AdmissionReport:
    """Admit (or reject) one generated env module; returns the full report.

    Args:
        source: the module's source text.
        env_id: the id the generator assigned (the module's ``REGISTRATION["id"]`` must be it).
        capability: the capability the env teaches (picks the calibration agent).
        target_env: the target env id whose tool schemas the module must keep.
        work_dir: a scratch folder for this attempt (the module is staged here, never in a workspace).
        taken_ids: ids already registered (built-in, ``TRACE_REGISTRY`` and the workspace's).
        spec_schemas: the spec's tool schemas (used when the target itself needs Docker).
        config: limits and sizes (:class:`AdmissionConfig`).
    """
    cfg = config or AdmissionConfig()
    t0 = time.perf_counter()
    report = AdmissionReport(env_id=env_id, capability=capability, target_env=target_env)
    findings, registration = static_check(source)
    report.registration = registration
    for name, what in STATIC_CHECKS:
        found = findings[name]
        report.rows.append(CheckRow(name, "static", "failed" if found else "passed",
                                    figure=f"{len(found)} finding(s)" if found else "",
                                    reason="; ".join(str(f) for f in found[:5])))
    taken = set(taken_ids if taken_ids is not None else _registered_ids())
    reg_row = CheckRow("id is new", "registry", "not run")
    report.rows.append(reg_row)
    if registration is not None:
        if registration["id"] in taken:
            reg_row.status, reg_row.reason = "failed", (f"duplicate id {registration['id']!r}: already registered "
                                                        "(ids never change once published; use the assigned id)")
        elif registration["id"] != env_id:
            reg_row.status, reg_row.reason = "failed", (f"REGISTRATION['id'] is {registration['id']!r}, but this "
                                                        f"attempt was assigned {env_id!r}")
        else:
            reg_row.status, reg_row.figure = "passed", env_id
    if not all(r.passed for r in report.rows):
        report.rows += [CheckRow(n, "dynamic", "not run", reason="static checks failed") for n in DYNAMIC_CHECKS]
        report.sandbox = "not started (static checks failed)"
        report.seconds = time.perf_counter() - t0
        return report
    _dynamic(report, source, registration, capability, target_env, Path(work_dir), spec_schemas, cfg)
    report.seconds = time.perf_counter() - t0
    return report


def _registered_ids() -> set[str]:
    import trace_envs

    return {e.id for e in trace_envs.registered()}


def _dynamic(report: AdmissionReport, source: str, registration: dict, capability: str, target_env: str,
             work_dir: Path, spec_schemas: list[dict] | None, cfg: AdmissionConfig) -> None:
    kind, warns = sandbox_kind(cfg.sandbox)
    report.sandbox = ("bubblewrap (--unshare-net, read-only root, private /tmp)" if kind == "bwrap"
                      else "plain subprocess (no network isolation)")
    report.warnings += warns
    for w in warns:
        warnings.warn(w, RuntimeWarning, stacklevel=3)
    stage = work_dir.resolve() / "sandbox"
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    module_name = "trace_candidate_" + registration["id"].split("/", 1)[1].replace("-", "_")
    (stage / f"{module_name}.py").write_text(source, encoding="utf-8")
    rows = {n: CheckRow(n, "dynamic", "not run") for n in DYNAMIC_CHECKS}
    report.rows += list(rows.values())
    try:
        schemas = target_tool_schemas(target_env, spec_schemas)
    except (KeyError, ValueError) as exc:
        rows["tool schemas identical to the target's"].status = "failed"
        rows["tool schemas identical to the target's"].reason = f"no target tool schemas: {exc}"
        return
    job = {"module_dir": str(stage), "module_name": module_name, "class": registration["class"],
           "env_id": registration["id"], "max_episode_steps": registration["max_episode_steps"],
           "kwargs": registration.get("kwargs") or {}, "answer_tools": registration.get("answer_tools") or [],
           "target_schemas": schemas, "capability": capability, "n_seeds": cfg.n_seeds,
           "digest_seeds": list(range(cfg.digest_seeds)), "probe_seeds": list(range(500, 500 + cfg.probe_seeds)), "probe_bound": cfg.probe_bound,
           "calibration": {"groups": cfg.calibration_groups, "group_size": cfg.calibration_group_size,
                           "deficit": cfg.calibration_deficit, "random": cfg.calibration_random,
                           "agent": cfg.calibration_agent, "seed_offset": cfg.calibration_seed_offset}}
    start = time.monotonic()
    deadline, import_deadline = start + cfg.timeout_s, start + cfg.import_timeout_s
    full = _Worker(dict(job, mode="full", nonce=secrets.token_hex(8)), kind, stage, cfg, hash_seed=1)
    second = _Worker(dict(job, mode="digest", nonce=secrets.token_hex(8)), kind, stage, cfg, hash_seed=2)
    digests: dict[str, Any] = {}
    current = None
    try:
        timed_out = False
        for event in full.events(deadline, import_deadline):
            if event["event"] == "start":
                current = event["check"]
            elif event["event"] == "result":
                current = None
                _record(rows, event)
            elif event["event"] == "digest":
                digests["full"] = event.get("digests")
            elif event["event"] == "rewards":
                digests["rewards"] = event
            elif event["event"] == "timeout":
                timed_out = True
                which = "importing the module" if event["importing"] else f"check {current!r}"
                limit = cfg.import_timeout_s if event["importing"] else cfg.timeout_s
                row = rows.get(_row_name(current)) if current else rows["import"]
                if row is None or row.status != "not run":
                    row = rows["import"] if event["importing"] else rows["calibration"]
                row.status, row.reason = "failed", f"timed out after {limit:.0f} s while {which} (an endless loop?)"
        code = full.kill()
        if not timed_out and (current is not None or rows["import"].status == "not run"):
            # the process ended in the middle of a check: a crash, the kernel's OOM killer, os._exit, ...
            row = rows.get(_row_name(current) or "import") or rows["import"]
            row.status, row.reason = "failed", _died(code, cfg.memory_mb) + (f" during {current!r}" if current else "")
        if not rows["import"].passed:
            second.kill()  # nothing to compare with; do not wait for a second hang
        for event in second.events(max(deadline, time.monotonic() + 30), time.monotonic() + cfg.import_timeout_s):
            if event["event"] == "digest":
                digests["second"] = event.get("digests")
                digests["error"] = event.get("error")
    finally:
        full.kill()
        second.kill()
    report.output_tail = "\n".join(full.tail[-20:])
    row = rows["determinism across two processes"]
    if rows["import"].passed:
        a, b = digests.get("full"), digests.get("second")
        if a is None or b is None:
            row.status, row.reason = "failed", ("could not compute task digests" +
                                                (f": {digests['error']}" if digests.get("error") else ""))
        elif a != b:
            diff = [s for s, (x, y) in enumerate(zip(a, b)) if x != y]
            row.status, row.reason = "failed", (f"nondeterministic task: seeds {diff} give different tasks or oracle "
                                                "transcripts in two processes (global random, the clock, hash() "
                                                "of strings or set order?)")
        else:
            row.status, row.figure = "passed", f"{len(a)} seeds identical"
    rng_row = rows["rewards in [0, 1]"]
    out_of_range = [r for r in rows.values() if "outside [0, 1]" in r.reason]
    if out_of_range:
        rng_row.status, rng_row.reason = "failed", f"reward out of range: {out_of_range[0].reason.splitlines()[0]}"
    elif digests.get("rewards") and rows["conformance: reward range and truncation"].passed:
        seen = digests["rewards"]
        rng_row.status = "passed"
        rng_row.figure = (f"every step of {seen['count']} probe and calibration episodes "
                          f"(episode rewards {seen['low']:.2f}..{seen['high']:.2f})")
    else:
        rng_row.reason = "not established (the checks that measure it did not finish)"


def _row_name(check: str | None) -> str | None:
    if check in ("tool schemas",):
        return "tool schemas identical to the target's"
    if check == "task digests (this process)":
        return "determinism across two processes"
    return check


def _record(rows: dict[str, CheckRow], event: dict) -> None:
    name = _row_name(event["check"])
    row = rows.get(name)
    if row is None:
        return
    if event["check"] == "task digests (this process)" and event["passed"]:
        return  # the cross-process row is decided once both digests are in
    if row.status == "failed" and not event["passed"]:
        return  # keep the first reason
    if event["check"] == "tool schemas" and event["passed"]:
        return
    row.status = "passed" if event["passed"] else "failed"
    row.figure, row.reason, row.seconds = event.get("figure", ""), event.get("reason", ""), event.get("seconds", 0.0)
