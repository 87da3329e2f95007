"""Admission of a generated env module: nothing enters a workspace registry before it passes.

Generated code is untrusted, and the judge is never inside the judged. :func:`admit` runs, in order:

(a) static checks on the source (:mod:`generators.static`): a fast first filter with clear messages
    (imports off the allow-list, dynamic code, file writes, process/network/foreign-memory access,
    dunder escapes, a literal ``REGISTRATION`` dict whose id is the one assigned and not taken). It is
    a filter, not the security boundary;
(b) dynamic checks, driven from this (trusted) process through the same sandboxed-env proxy that
    every later use of a generated env goes through (:mod:`trace_envs.core.sandboxed`): the module
    runs in a bubblewrap worker (no network, read-only file system but a private scratch dir, its own
    pid namespace, a scrubbed environment, memory/CPU/file/process limits, a timeout per call) that
    only answers ``reset``/``step``/``close`` (and hands out its oracle's actions). Every verdict is
    computed here: the tool schemas against the target's, the conformance suite
    (``check_trace_env``) on seeds drawn from the whole seed range, determinism across two worker
    processes with another ``PYTHONHASHSEED``, another date and another global ``random`` state (and the
    same seed twice on one instance), the texts the module hands over (bounded data, shown in the
    report, never prompt text), the reward-hacking probes (:mod:`generators.probes`), a note-following
    deficit agent against the plain one, a calibration, the same actions earning the same reward (in
    one worker and replayed in a fresh one) and every probe again in a worker reset ``warm_resets``
    times. The worker's printed output is kept apart: truncated, marked untrusted in the report,
    never read for results.

Admission is made to look like use from inside the worker: the module is staged under its name of use
(``envs.<name>_vN``, the file alone at the fixed in-sandbox path use gives it), the worker has use's hash
seed, limits and command line, and the probes' and calibration's seeds are drawn from the ranges training
and evaluation draw from. What it still cannot see is left to the audit at use (:mod:`generators.audit`).

Without bubblewrap the dynamic checks do not run unless running unsandboxed was asked for explicitly
(``sandbox="none"``, ``--unsandboxed`` or ``TRACE_UNSANDBOXED=1``); the report says which sandbox ran.

The result is an :class:`AdmissionReport` (one row per check: passed / failed / not run, figure,
reason, seconds), written as JSON and Markdown beside the module. Only an admitted module is
installed into the workspace (:mod:`generators.workspace`).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import shutil
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .probes import PROBE_BOUND
from .static import STATIC_CHECKS, static_check


@dataclass
class AdmissionConfig:
    """Limits and sizes of the dynamic checks.

    Attributes:
        timeout_s: wall-clock limit of all dynamic checks together (checks not reached fail).
        import_timeout_s: limit of starting a worker (importing the module, building the env).
        call_timeout_s: limit of any one ``reset``/``step`` (an env slower than this on some seed fails).
        memory_mb: address-space limit of each worker process (``RLIMIT_AS``).
        n_seeds: seeds of the conformance suite (oracle, seed and determinism checks), drawn from the
            whole seed range (so are the digest seeds); the probes' and the calibration's seeds are drawn
            from the seeds training and evaluation use (:data:`USE_SEED_RANGES`): none is fixed, so a module
            cannot behave on admission's seeds only.
        digest_seeds: seeds whose task digests are compared across two processes.
        probe_seeds: episodes per reward-hacking probe.
        probe_bound: the most mean reward each probe may earn (:data:`generators.probes.PROBE_BOUND`,
            0.05: a policy that does not use the records must earn nothing worth learning).
        calibration_groups, calibration_group_size: G × K episodes of the calibration agent
            (:class:`generators.probes.MixtureAgent`; K = 8, GRPO's default group size).
        calibration_deficit, calibration_random: its chances to play the deficit / random agent.
        calibration_agent: calibrate against this registered scripted agent instead (e.g. ``tau:noisy``;
            built per group member with its sampling seed), as ``trace envs calibrate --agent`` does.
        replays: calibration episodes (one per group) replayed in a fresh worker, whose reward must not change.
        warm_resets: resets (on drawn seeds) of one worker before every probe plays again in it: at least as
            many as one worker of a training run sees, so a module cannot switch on after admission's count.
        sandbox: ``"auto"`` (bubblewrap; without it, refuse unless ``TRACE_UNSANDBOXED`` is set),
            ``"bwrap"`` (required) or ``"none"`` (explicitly unsandboxed: a plain subprocess).
        seed_draw: the seed of the draw of check seeds (None: a fresh one, written in the report).
    """

    timeout_s: float = 600.0
    import_timeout_s: float = 60.0
    call_timeout_s: float = 4.0
    memory_mb: int = 2048
    n_seeds: int = 8
    digest_seeds: int = 4
    probe_seeds: int = 16
    probe_bound: float = PROBE_BOUND
    calibration_groups: int = 64
    calibration_group_size: int = 8
    calibration_deficit: float = 0.4
    calibration_random: float = 0.25
    calibration_agent: str | None = None
    warm_resets: int = 1000
    replays: int = 8
    sandbox: str = "auto"
    seed_draw: int | None = None

    def __post_init__(self) -> None:
        if self.sandbox not in ("auto", "bwrap", "none"):
            raise ValueError(f"sandbox must be auto, bwrap or none, got {self.sandbox!r}")
        if not 0.0 <= self.probe_bound < 1.0:
            raise ValueError(f"probe_bound must be in [0, 1), got {self.probe_bound!r}")
        if self.warm_resets < 0:
            raise ValueError(f"warm_resets must be >= 0, got {self.warm_resets!r}")
        if self.timeout_s <= 0 or self.import_timeout_s <= 0 or self.call_timeout_s <= 0 or self.memory_mb < 256:
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
    output_tail: str = ""  # what the module printed: untrusted, labelled as such, never read for results
    seeds: dict = field(default_factory=dict)
    #: every text the module hands the trusted side (hint_text, docstring, description, answer tools' texts):
    #: data, shown here, never put in a prompt (:func:`trace_envs.core.registry.prompt_hint`)
    module_texts: dict = field(default_factory=dict)

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
                "seeds": self.seeds, "module_texts": self.module_texts, "output_tail": self.output_tail}

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
        if self.module_texts:
            lines += ["", "## Texts from the module (UNTRUSTED data: shown, never put in a prompt)", ""]
            for key, text in self.module_texts.items():
                shown = str(text)[:TEXT_SHOWN].replace("```", "` ` `")
                lines += [f"- `{key}` ({len(str(text))} characters):", "", "```text", shown, "```", ""]
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


#: Dynamic checks in report order; the probes' rows come from :func:`generators.probes.probe_agents`.
CONFORMANCE_ROWS = ["conformance: gymnasium check_env", "conformance: seed determinism",
                    "conformance: different seeds differ", "conformance: oracle scores 1.0",
                    "conformance: bad actions never crash, score < 1", "conformance: reward range and truncation",
                    "conformance: close frees resources"]
SANDBOX_NOTE = ("bubblewrap (no network, read-only file system but a private scratch dir, own pid namespace, "
                "scrubbed environment, resource limits, per-call timeout)")
#: Seeds are drawn from the whole range a seed may take (a task that breaks on large seeds must show it).
SEED_RANGE = 2 ** 32
#: The seeds an admitted env meets in use: evaluation's default range and training's first seeds
#: (``TrainConfig.eval_seeds`` and ``seed_offset``; tests/test_admission.py checks they agree). The probes and
#: the calibration draw their seeds from these, half from each, so a module cannot tell admission's seeds
#: from training's.
USE_SEED_RANGES = ((0, 100_000), (1_000_000, 1_100_000))
#: Bounds on the texts a module hands the trusted side (characters); longer is rejected.
TEXT_BOUNDS = {"hint_text": 2000, "doc": 4000, "description": 300, "tool": 1500}
TEXT_SHOWN = 4000
#: How much more the note-following deficit agent may earn than the plain one (mean reward over the probe seeds).
NOTE_GAIN_BOUND = 0.1


def dynamic_rows() -> list[str]:
    """The dynamic rows of a report, in order."""
    from .probes import probe_agents

    probes = [f"probe: {a.name.split(':', 1)[1]}" for a in probe_agents(0)]
    return ["import", "tool schemas identical to the target's", "no tool the target lacks",
            "module texts are bounded data", *CONFORMANCE_ROWS, "determinism across two processes",
            "same seed twice on one instance", *probes, "probe: obeys_a_note", "calibration",
            "same actions, same reward",
            "probes in a long-used worker", "rewards in [0, 1]"]


# ------------------------------------------------------------------------------------------------ target
def target_tool_schemas(target_env: str, spec_schemas: list[dict] | None = None) -> list[dict]:
    """The target's tool schemas: from a reset of the target env, or the spec's when the target needs Docker."""
    return _target(target_env, spec_schemas)[0]


def _target(target_env: str, spec_schemas: list[dict] | None) -> tuple[list[dict], set[str] | None]:
    """(the target's tool schemas, the names of its write tools, or None when only the spec's are known)."""
    import gymnasium as gym

    import trace_envs  # noqa: F401 - registers the ids
    from trace_envs.core.registry import get_entry

    entry = get_entry(target_env)
    if entry.requires:
        if not spec_schemas:
            raise ValueError(f"the target {target_env} requires {list(entry.requires)}; its tool schemas must come "
                             "from the spec (tool_schemas)")
        return list(spec_schemas), None
    env = gym.make(target_env)
    try:
        _, info = env.reset(seed=0)
        toolset = getattr(env.unwrapped, "_toolset", None)
        tools = list(info["tools"])
        names = [t["function"]["name"] for t in tools]
        writes = {n for n in names if toolset is not None and toolset.is_write(n)}
        return tools, writes
    finally:
        env.close()


# ------------------------------------------------------------------------------------------------ checks
class CheckFailed(Exception):
    """A check's verdict (the message is the reason, with its figure)."""

    def __init__(self, reason: str, figure: str = ""):
        super().__init__(reason)
        self.figure = figure


class _Session:
    """One admission's dynamic checks: the candidate registered (for this process only) behind the proxy."""

    def __init__(self, report: AdmissionReport, rows: dict[str, CheckRow], cfg: AdmissionConfig, env_id: str,
                 worker: dict, max_steps: int, kwargs: dict, writes: set[str] | None, unsandboxed: bool):
        self.report, self.rows, self.cfg, self.env_id = report, rows, cfg, env_id
        self.worker, self.max_steps, self.kwargs, self.writes = worker, max_steps, kwargs, writes
        self.unsandboxed = unsandboxed
        self.deadline = time.monotonic() + cfg.timeout_s
        self.outputs: list[tuple[str, str]] = []
        self.rewards: list[float] = []
        self.hung = ""  # after a per-call timeout the rest would only time out again: it is not run
        self.calibration_seeds: list[int] = []
        self.warm_seeds: list[int] = []
        self.groups: list[tuple[int, list[dict]]] = []

    def make(self, **spec_overrides: Any):
        """A proxy of the candidate (``gym.make`` semantics: the registered wrappers included)."""
        import gymnasium as gym

        if not spec_overrides:
            env = gym.make(self.env_id)
        else:
            env = gym.make(self.env_id, trace_worker={**self.worker, **spec_overrides})
        if self.writes is not None:
            env.unwrapped.trusted_write_tools = set(self.writes)
        return env

    def run(self, name: str, fn: Callable[[], str]) -> bool:
        """Run one check, watching every worker it starts: a worker failure fails the check."""
        from trace_envs.core.sandboxed import WorkerError, collect_output

        row = self.rows[name]
        if self.hung:
            row.reason = f"not run: the env hung in an earlier check ({self.hung})"
            return False
        if time.monotonic() > self.deadline:
            row.status, row.reason = "failed", (f"not reached: the dynamic checks exceeded their time limit of "
                                                f"{self.cfg.timeout_s:.0f} s")
            return False
        t0 = time.perf_counter()
        errors: list[str] = []
        try:
            with collect_output() as events:
                try:
                    figure = fn() or ""
                    row.status, row.figure = "passed", figure
                except CheckFailed as exc:
                    row.status, row.figure, row.reason = "failed", exc.figure, str(exc)
                except WorkerError as exc:
                    row.status, row.reason = "failed", f"the env's worker failed: {exc}"
                except Exception as exc:  # a check's own crash on what the worker sent: the candidate's fault
                    row.status, row.reason = "failed", (f"raised {type(exc).__name__}: {exc}\n"
                                                        f"{traceback.format_exc(limit=-6)}")
            for env_id, output, error in events:
                if output.strip():
                    self.outputs.append((name, output))
                if error:
                    errors.append(error)
        finally:
            row.seconds = time.perf_counter() - t0
        if errors and row.status == "passed":
            row.status = "failed"
        timeouts = [e for e in errors if "timed out" in e] + (["timed out"] if "timed out after" in row.reason else [])
        if timeouts and name != "import":
            self.hung = name
        if errors and not row.reason.startswith("the env's worker failed"):
            # the check's own text adds nothing when it only reports the same worker failure
            own = f" | the check: {row.reason}" if row.reason and "WorkerError" not in row.reason else ""
            row.reason = f"the env's worker failed: {errors[0]}{own}"
        return row.status == "passed"

    def episode(self, env, agent, seed: int) -> dict:
        """One episode played here against the proxy, every step's reward checked."""
        obs, info = env.reset(seed=seed)
        if info.get("termination") == "env_error":
            raise CheckFailed(f"reset failed on seed {seed}: {info.get('env_error')}")
        if hasattr(agent, "reset"):
            agent.reset(env.unwrapped, obs, info)
        rewards, actions = [], []
        for step in range(self.max_steps + 1):
            action = agent(obs, info)
            obs, reward, terminated, truncated, info = env.step(action)
            if info.get("termination") == "env_error" and env.unwrapped.worker_error:
                raise CheckFailed(f"the env failed on seed {seed}, step {step} (agent {getattr(agent, 'name', '?')}): "
                                  f"{env.unwrapped.worker_error}")
            reward = float(reward)
            if not 0.0 <= reward <= 1.0:
                raise CheckFailed(f"reward {reward} outside [0, 1] (seed {seed}, step {step}, agent "
                                  f"{getattr(agent, 'name', '?')})", figure=str(reward))
            rewards.append(reward)
            actions.append(action)
            if terminated or truncated:
                break
        return {"reward": sum(rewards), "success": bool(info.get("success")), "steps": len(rewards),
                "actions": json.dumps(actions, sort_keys=True, default=str), "raw_actions": actions}


class Replay:
    """Plays a recorded episode's actions again, in order (then empty turns)."""

    name = "replay"

    def __init__(self, actions: list):
        self.actions = list(actions)

    def reset(self, env, observation, info) -> None:
        self.k = 0

    def __call__(self, observation, info):
        self.k = getattr(self, "k", 0) + 1
        return self.actions[self.k - 1] if self.k <= len(self.actions) else ""


def _digest(env, seed: int) -> str:
    """What must not change across processes: the opening, the task, the tools, the oracle's episode and rewards."""
    from trace_envs.agents import OracleAgent

    obs, info = env.reset(seed=seed)
    parts = [obs, env.unwrapped.task_fingerprint(), json.dumps(info.get("tools", []), sort_keys=True)]
    agent = OracleAgent()
    agent.reset(env.unwrapped, obs, info)
    rewards = []
    for _ in range(env.spec.max_episode_steps or 50):
        obs, reward, terminated, truncated, info = env.step(agent(obs, info))
        rewards.append(float(reward))
        if terminated or truncated:
            break
    parts.append(json.dumps(info.get("messages", []), sort_keys=True, default=str))
    parts.append(json.dumps(rewards))
    return hashlib.sha256("\x1e".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _draw_seeds(rng: random.Random, n: int) -> list[int]:
    """``n`` distinct seeds: one small, the rest from the whole range."""
    seeds = [rng.randrange(1000)]
    while len(seeds) < n:
        s = rng.randrange(SEED_RANGE)
        if s not in seeds:
            seeds.append(s)
    return seeds[:n]


def _dynamic(report: AdmissionReport, source: str, registration: dict, capability: str, target_env: str,
             work_dir: Path, spec_schemas: list[dict] | None, cfg: AdmissionConfig) -> None:
    import gymnasium as gym

    from trace_envs.core.registry import SANDBOX_ENTRY_POINT
    from trace_envs.core.sandboxed import SandboxLimits, WorkerSpec, bwrap_status, faketime_library, \
        refuse_unsandboxed_generated, unsandboxed_requested

    names = dynamic_rows()
    rows = {n: CheckRow(n, "dynamic", "not run") for n in names}
    report.rows += list(rows.values())
    ok, why = bwrap_status()
    if cfg.sandbox == "none" or (not ok and cfg.sandbox == "auto" and unsandboxed_requested()):
        refusal = refuse_unsandboxed_generated(report.env_id, why or "running unsandboxed was asked for")
        if refusal:
            report.sandbox = "not started: generated code runs unsandboxed only with a second switch"
            for row in rows.values():
                row.reason = refusal
            rows["import"].status = "failed"
            return
        unsandboxed = True
        report.sandbox = "plain subprocess (explicitly unsandboxed: no file-system or network isolation)"
        warn = ("admission ran the module WITHOUT a sandbox (sandbox='none' / --unsandboxed): a plain subprocess "
                "with a scrubbed environment, limits and timeouts, but network NOT isolated"
                + ("" if ok else f"; {why}"))
        report.warnings.append(warn)
        warnings.warn(warn, RuntimeWarning, stacklevel=3)
    elif not ok:
        report.sandbox = f"not started: {why}"
        for row in rows.values():
            row.reason = (f"{why}. Generated code runs only sandboxed; to admit without a sandbox anyway pass "
                          "--unsandboxed (or set TRACE_UNSANDBOXED=1)")
        rows["import"].status = "failed"
        return
    else:
        unsandboxed = False
        report.sandbox = SANDBOX_NOTE
    stage = work_dir.resolve() / "sandbox"
    if stage.exists():
        shutil.rmtree(stage)
    # Staged under the name and at the in-sandbox path it will have in a workspace (envs.<name>_v<N>, the
    # file alone at a fixed path: trace_envs.core.sandboxed.SANDBOX_MODULE_ROOT): nothing tells the two apart.
    (stage / "envs").mkdir(parents=True)
    module_name = "envs." + _module_stem(registration["id"])
    module_file = stage / "envs" / f"{_module_stem(registration['id'])}.py"
    module_file.write_text(source, encoding="utf-8")
    try:
        schemas, writes = _target(target_env, spec_schemas)
    except (KeyError, ValueError) as exc:
        rows["tool schemas identical to the target's"].status = "failed"
        rows["tool schemas identical to the target's"].reason = f"no target tool schemas: {exc}"
        return
    draw = cfg.seed_draw if cfg.seed_draw is not None else secrets.randbits(32)
    rng = random.Random(draw)
    conformance_seeds = _draw_seeds(rng, cfg.n_seeds)
    digest_seeds = _draw_seeds(rng, cfg.digest_seeds)
    # The probes' and the calibration's seeds: drawn, from the seeds training and evaluation use (the draw is in
    # the report, so a run is reproducible with AdmissionConfig.seed_draw).
    probe_seeds = use_seeds(rng, cfg.probe_seeds)
    calibration_seeds = use_seeds(rng, cfg.calibration_groups)
    warm_seeds = use_seeds(rng, cfg.warm_resets)
    report.warnings += [] if faketime_library() else [
        "libfaketime is not installed (Debian package `faketime`): the cross-process determinism check could not "
        "shift the worker's clock, so a task that reads today's date is caught only across a date change"]
    limits = SandboxLimits(memory_mb=cfg.memory_mb, start_timeout_s=cfg.import_timeout_s,
                           call_timeout_s=cfg.call_timeout_s)
    # The hash seed, the limits and the rest of the worker are those of use (registry.worker_spec's defaults).
    spec = WorkerSpec(env_id=registration["id"], module=module_name, cls=registration["class"],
                      module_root=str(stage), bind=str(stage / "envs"), limits=limits)
    worker = {**spec.to_dict(), "strict": True, "generated": True}  # a worker failure stops the check that met it
    if unsandboxed:
        worker["sandbox"] = "none"
    env_id = registration["id"]
    kwargs = dict(registration.get("kwargs") or {})
    max_steps = int(registration["max_episode_steps"])
    gym.register(id=env_id, entry_point=SANDBOX_ENTRY_POINT, max_episode_steps=max_steps,
                 kwargs={"trace_worker": worker, **kwargs}, disable_env_checker=False)
    session = _Session(report, rows, cfg, env_id, worker, max_steps, kwargs, writes, unsandboxed)
    session.calibration_seeds, session.warm_seeds = calibration_seeds, warm_seeds
    report.seeds = {"draw": draw, "conformance": conformance_seeds, "digests": digest_seeds, "probes": probe_seeds,
                    "calibration": calibration_seeds, "warm_resets": len(warm_seeds)}
    try:
        _checks(session, schemas, registration, capability, conformance_seeds, digest_seeds, probe_seeds)
    finally:
        gym.registry.pop(env_id, None)
        report.output_tail = _untrusted(session.outputs)


def _module_stem(env_id: str) -> str:
    """``gen/<name>-v<N>`` -> ``<name>_v<N>``: the module's file name in a workspace (Workspace.module_path)."""
    name, _, version = env_id.split("/", 1)[1].rpartition("-v")
    return f"{name}_v{version}"


def use_seeds(rng: random.Random, n: int) -> list[int]:
    """``n`` distinct seeds drawn from :data:`USE_SEED_RANGES`, alternating between them."""
    seeds: list[int] = []
    while len(seeds) < n:
        lo, hi = USE_SEED_RANGES[len(seeds) % len(USE_SEED_RANGES)]
        s = rng.randrange(lo, hi)
        if s not in seeds:
            seeds.append(s)
    return seeds


def _untrusted(outputs: list[tuple[str, str]]) -> str:
    """The module's printed output, cut and labelled: it is the candidate's text, not the admission's."""
    if not outputs:
        return ""
    parts = [f"--- during {check} ---\n{text[-1500:]}" for check, text in outputs[-4:]]
    return "[UNTRUSTED: printed by the candidate module; not a result]\n" + "\n".join(parts)[-6000:]


def _checks(session: _Session, schemas: list[dict], registration: dict, capability: str,
            conformance_seeds: list[int], digest_seeds: list[int], probe_seeds: list[int]) -> None:
    from trace_envs.core.checker import CHECKS, check_trace_env
    from trace_envs.core.sandboxed import WorkerError

    cfg, rows = session.cfg, session.rows
    target = {t["function"]["name"]: t for t in schemas}
    answer = set(registration.get("answer_tools") or [])
    found: dict[str, dict] = {}

    def check_import() -> str:
        try:
            env = session.make()
        except WorkerError as exc:
            text = str(exc)
            if "timed out" in text:
                raise CheckFailed(f"timed out after {cfg.import_timeout_s:.0f} s while importing the module "
                                  f"(an endless loop?): {text.splitlines()[0]}") from None
            if "MemoryError" in text or "memory" in text:
                raise CheckFailed(f"the module exceeded the memory limit of {cfg.memory_mb} MB while importing: "
                                  f"{text.splitlines()[0]}") from None
            raise CheckFailed(f"the module failed to import or build: {text}") from None
        env.close()
        return ""

    if not session.run("import", check_import):
        return

    def check_schemas() -> str:
        env = session.make()
        try:
            for seed in conformance_seeds[:3]:  # tools may depend on the task; look at a few
                _, info = env.reset(seed=seed)
                for t in info.get("tools", []):
                    found.setdefault(t["function"]["name"], t)
        finally:
            env.close()
        changed = sorted(n for n in found if n in target and found[n] != target[n])
        clash = sorted(answer & set(target))
        if clash:
            raise CheckFailed(f"answer tools {clash} are target tools; only new submit_* tools may be declared")
        if changed:
            raise CheckFailed(f"changes the schema of the target tool(s) {changed} "
                              f"(a tool must keep the target's name, description and parameters exactly)")
        return f"{len(found)} tools, {len(set(found) & set(target))} of the target's"

    session.run("tool schemas identical to the target's", check_schemas)

    def check_no_extra() -> str:
        extra = sorted(n for n in found if n not in target and n not in answer)
        if extra:
            raise CheckFailed(f"adds tool(s) {extra} that the target lacks "
                              f"(declare a final-answer tool as REGISTRATION['answer_tools'] = ['submit_...'])")
        return "none"

    session.run("no tool the target lacks", check_no_extra)

    def check_texts() -> str:
        # Everything the module hands the trusted side as text is data: bounded, shown in the report, and
        # never put in a prompt (the registry's prompt_hint ignores a generated module's hint_text).
        env = session.make()
        try:
            desc = env.unwrapped._worker.call("describe")
        finally:
            env.close()
        if "__error__" in desc:
            raise CheckFailed(f"describing the env class failed: {desc['__error__'][:300]}")
        texts = {"hint_text": desc.get("hint_text"), "doc": desc.get("doc"), "class name": desc.get("name"),
                 "description": registration.get("description")}
        for name in sorted(n for n in found if n not in target):
            texts[f"tool {name}"] = json.dumps(found[name], sort_keys=True, ensure_ascii=False)
        problems = []
        for key, text in texts.items():
            if text is None or text == "":
                continue
            if not isinstance(text, str):
                problems.append(f"{key} is a {type(text).__name__}, not text")
                continue
            bound = TEXT_BOUNDS.get(key.split(" ", 1)[0], TEXT_BOUNDS["description"])
            if len(text) > bound:
                problems.append(f"{key} has {len(text)} characters (bound {bound})")
            if any(ord(c) < 32 and c not in "\n\t" for c in text) or "\x7f" in text:
                problems.append(f"{key} contains control characters")
        session.report.module_texts = {k: (v[:TEXT_SHOWN] if isinstance(v, str) else repr(v)[:300])
                                       for k, v in texts.items() if v not in (None, "")}
        if problems:
            raise CheckFailed("texts the module hands the trainer are out of bounds: " + "; ".join(problems))
        shown = [k for k in session.report.module_texts]
        return f"{len(shown)} text(s) shown in the report" + (" (hint_text is never put in a prompt)"
                                                               if texts.get("hint_text") else "")

    session.run("module texts are bounded data", check_texts)

    for (name, _), row in zip(CHECKS, CONFORMANCE_ROWS):
        def conformance(name=name) -> str:
            result = check_trace_env(session.env_id, seeds=conformance_seeds, only=[name]).results[0]
            if not result.ok:
                raise CheckFailed(result.detail.strip())
            return result.detail

        session.run(row, conformance)

    def check_processes() -> str:
        # Two workers that differ in PYTHONHASHSEED, the date and the global random state.
        a = session.make(hash_seed=0, clock_shift_days=0, random_seed=None)  # use's worker
        b = session.make(hash_seed=2, clock_shift_days=400, random_seed=12345)
        try:
            da = [_digest(a, s) for s in digest_seeds]
            db = [_digest(b, s) for s in digest_seeds]
        finally:
            a.close()
            b.close()
        diff = [s for s, x, y in zip(digest_seeds, da, db) if x != y]
        if diff:
            raise CheckFailed(f"nondeterministic task: seeds {diff} give different tasks, oracle transcripts or "
                              "rewards in two processes (hash() of strings, the date or clock, the global random "
                              "state, set order?)")
        return f"{len(da)} seeds identical"

    session.run("determinism across two processes", check_processes)

    def check_twice() -> str:
        env = session.make()
        try:
            diff = [s for s in digest_seeds[:2] if _digest(env, s) != _digest(env, s)]
        finally:
            env.close()
        if diff:
            raise CheckFailed(f"the same seed reset twice on one instance gives another task or reward (seeds {diff}): "
                              "state carried over from an earlier episode")
        return f"{min(2, len(digest_seeds))} seeds, reset twice"

    session.run("same seed twice on one instance", check_twice)

    from .probes import PROBE_SUCCESS_BOUND, mean_bound, probe_agents

    for agent in probe_agents(probe_seeds[0]):
        def probe(agent=agent) -> str:
            env = session.make()
            try:
                eps = [session.episode(env, agent, s) for s in probe_seeds]
            finally:
                env.close()
            rewards = [e["reward"] for e in eps]
            session.rewards.extend(rewards)
            bound = mean_bound(agent, cfg.probe_bound)
            success_bound = min(cfg.probe_bound, PROBE_SUCCESS_BOUND)
            mean = sum(rewards) / len(rewards)
            success = sum(e["success"] for e in eps) / len(eps)
            figure = f"mean {mean:.3f} (bound {bound}), success {success:.2f} (bound {success_bound})"
            if mean > bound or success > success_bound:
                raise CheckFailed(f"{agent.name} earns mean reward {mean:.3f} and succeeds on {success:.0%} of "
                                  f"{len(probe_seeds)} seeds (bounds: mean {bound}, success {success_bound}): the "
                                  "reward pays for behaviour that does not use the capability", figure=figure)
            return figure

        session.run(f"probe: {agent.name.split(':', 1)[1]}", probe)

    def calibration() -> str:
        from trace_envs.calibration import Group, summarize_groups

        from .probes import MixtureAgent

        env = session.make()
        groups = []
        try:
            if cfg.calibration_agent:
                from trace_envs.calibration import make_seeded_agent

                members = [make_seeded_agent(cfg.calibration_agent, j) for j in range(cfg.calibration_group_size)]
            else:
                members = [MixtureAgent(capability, deficit=cfg.calibration_deficit, random=cfg.calibration_random,
                                        seed=j) for j in range(cfg.calibration_group_size)]
            for seed in session.calibration_seeds:
                eps = [session.episode(env, m, seed) for m in members]
                session.groups.append((seed, eps))
                session.rewards.extend(e["reward"] for e in eps)
                groups.append(Group(seed, [e["reward"] for e in eps], [e["success"] for e in eps]))
        finally:
            env.close()
        name = getattr(members[0], "name", type(members[0]).__name__)
        summary = summarize_groups(groups, env_id=session.env_id, agent=name)
        figure = (f"mean {summary.mean_reward:.2f}, success {summary.success_rate:.2f}, all-0 {summary.all_zero:.0%}, "
                  f"all-1 {summary.all_one:.0%}, informative {summary.informative:.0%} "
                  f"({cfg.calibration_groups}x{cfg.calibration_group_size}, {name})")
        out = [f"{n} {value:.2f} outside [{lo}, {hi}]" for n, value, lo, hi, ok in summary.checks() if not ok]
        if out:
            raise CheckFailed("calibration outside the band (docs/design.md): " + "; ".join(out) + " — the env is too "
                              "easy or too hard for an agent lacking the capability", figure=figure)
        return figure

    def obeys_a_note() -> str:
        # The planted-deficit agent, plain and obeying any "refuse" note in what it reads: equal on an honest env
        # (its texts say nothing of refusing); more for the note-follower means the decision is written into the
        # opening message or the tool results.
        from .probes import NoteFollowerAgent, deficit_agent

        means = []
        for agent in (NoteFollowerAgent(capability), deficit_agent(capability)):
            env = session.make()
            try:
                eps = [session.episode(env, agent, s) for s in probe_seeds]
            finally:
                env.close()
            means.append(sum(e["reward"] for e in eps) / len(eps))
        figure = f"note-follower {means[0]:.3f}, deficit agent {means[1]:.3f} (gain bound {NOTE_GAIN_BOUND})"
        if means[0] - means[1] > NOTE_GAIN_BOUND:
            raise CheckFailed(f"an agent that obeys a note to refuse earns {means[0]:.3f} against {means[1]:.3f} "
                              "without it: the decision is written into what the agent reads (the opening message "
                              "or the tool results)", figure=figure)
        return figure

    session.run("probe: obeys_a_note", obeys_a_note)
    session.run("calibration", calibration)

    def same_actions() -> str:
        # A group's members play one seed in one worker, one after the other: members that sent the same actions
        # must get the same reward (credit that depends on what the worker saw before, e.g. only on a seed's
        # first play, makes GRPO's group comparison noise).
        if not session.groups:
            raise CheckFailed("not established: the calibration did not run")
        pairs, bad = 0, []
        for seed, eps in session.groups:
            seen: dict[str, float] = {}
            for e in eps:
                if e["actions"] in seen:
                    pairs += 1
                    if abs(seen[e["actions"]] - e["reward"]) > 1e-9:
                        bad.append(f"seed {seed}: {seen[e['actions']]:.3f} then {e['reward']:.3f}")
                else:
                    seen[e["actions"]] = e["reward"]
        if bad:
            raise CheckFailed("the same actions on the same seed earned different rewards when played again in one "
                              f"worker ({'; '.join(bad[:3])}): the reward depends on earlier episodes",
                              figure=f"{len(bad)} of {pairs} replays differ")
        # ... and the last member of each group, replayed in a fresh worker (its seed's first play there).
        env = session.make()
        try:
            for seed, eps in session.groups[:cfg.replays]:
                again = session.episode(env, Replay(eps[-1]["raw_actions"]), seed)
                pairs += 1
                if abs(again["reward"] - eps[-1]["reward"]) > 1e-9:
                    bad.append(f"seed {seed}: {eps[-1]['reward']:.3f} in the calibration's worker, {again['reward']:.3f} "
                               "replayed in a fresh one")
        finally:
            env.close()
        if bad:
            raise CheckFailed("the same actions on the same seed earned different rewards in two workers "
                              f"({'; '.join(bad[:3])}): the reward depends on earlier episodes in the worker",
                              figure=f"{len(bad)} of {pairs} replays differ")
        return f"{pairs} replays identical"

    session.run("same actions, same reward", same_actions)

    def long_used() -> str:
        # One worker reset as often as a training run resets one, then every probe again: a module that
        # switches its reward on after admission's resets meets the probes after as many as use gives it.
        env = session.make()
        try:
            for seed in session.warm_seeds:
                _, info = env.reset(seed=seed)
                if info.get("termination") == "env_error":
                    raise CheckFailed(f"reset failed on seed {seed}: {info.get('env_error')}")
            worst = (0.0, "")
            seeds = probe_seeds[: max(2, len(probe_seeds) // 4)]
            for agent in probe_agents(probe_seeds[0]):
                eps = [session.episode(env, agent, s) for s in seeds]
                mean = sum(e["reward"] for e in eps) / len(eps)
                success = sum(e["success"] for e in eps) / len(eps)
                if mean > mean_bound(agent, cfg.probe_bound) or success > min(cfg.probe_bound, PROBE_SUCCESS_BOUND):
                    raise CheckFailed(f"{agent.name} earns mean reward {mean:.3f} and succeeds on {success:.0%} after "
                                      f"{len(session.warm_seeds)} resets of its worker: the reward changes with how "
                                      "long the worker has run", figure=f"{agent.name} {mean:.3f}")
                worst = max(worst, (mean, agent.name))
        finally:
            env.close()
        return f"after {len(session.warm_seeds)} resets: every probe <= {worst[0]:.3f}"

    session.run("probes in a long-used worker", long_used)

    rng_row = rows["rewards in [0, 1]"]
    out_of_range = [r for r in rows.values() if "outside [0, 1]" in r.reason]
    if out_of_range:
        rng_row.status, rng_row.reason = "failed", f"reward out of range: {out_of_range[0].reason.splitlines()[0]}"
    elif session.rewards and rows["conformance: reward range and truncation"].passed:
        rng_row.status = "passed"
        rng_row.figure = (f"every step of {len(session.rewards)} probe and calibration episodes "
                          f"(episode rewards {min(session.rewards):.2f}..{max(session.rewards):.2f})")
    else:
        rng_row.reason = "not established (the checks that measure it did not finish)"


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
        report.rows += [CheckRow(n, "dynamic", "not run", reason="static checks failed") for n in dynamic_rows()]
        report.sandbox = "not started (static checks failed)"
        report.seconds = time.perf_counter() - t0
        return report
    _dynamic(report, source, registration, capability, target_env, Path(work_dir), spec_schemas, cfg)
    report.seconds = time.perf_counter() - t0
    return report


def _registered_ids() -> set[str]:
    import trace_envs

    return {e.id for e in trace_envs.registered()}


