"""Shared test setup.

* No hub access, ever: ``HF_HUB_OFFLINE=1``.
* The worked example's workspace registry (``examples/``) is added to
  ``TRACE_REGISTRY`` before ``trace_envs`` is imported, so the registry-wide
  tests cover it like any contributed environment.
* ``registered_env_id``: a test that takes this argument runs once per
  registered id (built-in + workspace), read from the registry at collection
  time, never hard-coded.
* ``missing_requirements(entry)``: which of an entry's ``requires`` this
  machine lacks, and ``allowed_missing()``: those ``TRACE_ALLOW_MISSING``
  (comma-separated, e.g. ``docker``) lets the suite skip.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

os.environ["HF_HUB_OFFLINE"] = "1"
_workspaces = [p for p in os.environ.get("TRACE_REGISTRY", "").split(os.pathsep) if p]
if not any(Path(p).resolve() in (EXAMPLES, EXAMPLES / "registry.yaml") for p in _workspaces):
    _workspaces.insert(0, str(EXAMPLES))
os.environ["TRACE_REGISTRY"] = os.pathsep.join(_workspaces)

import pytest  # noqa: E402

from trace_envs.domains.agents import TauScriptedAgent  # noqa: E402


def registered_ids() -> list[str]:
    """Every id in the registry (built-in, then workspace registries), in registration order."""
    import trace_envs

    return [entry.id for entry in trace_envs.registered()]


@functools.lru_cache(maxsize=None)
def _docker_available() -> tuple[bool, str]:
    if importlib.util.find_spec("docker") is None:
        return False, "the docker Python package is not installed (pip install 'trace-rl[swe]')"
    import docker

    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # no daemon, no socket permission, ...
        return False, f"no Docker engine is reachable ({type(exc).__name__}: {exc})"
    return True, ""


#: How to tell whether a requirement named in a registry entry's ``requires`` is met.
REQUIREMENT_CHECKS = {"docker": _docker_available}


def missing_requirements(entry) -> dict[str, str]:
    """``{requirement: why it is missing}`` for an entry's unmet ``requires``."""
    missing = {}
    for requirement in entry.requires:
        check = REQUIREMENT_CHECKS.get(requirement)
        if check is None:
            ok, why = False, (f"unknown requirement {requirement!r}; teach tests/conftest.py "
                              "(REQUIREMENT_CHECKS) how to detect it")
        else:
            ok, why = check()
        if not ok:
            missing[requirement] = why
    return missing


def allowed_missing() -> set[str]:
    return {part.strip() for part in os.environ.get("TRACE_ALLOW_MISSING", "").split(",") if part.strip()}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "registered_env_id" in metafunc.fixturenames:
        ids = registered_ids()
        metafunc.parametrize("registered_env_id", ids, ids=ids)


@pytest.fixture(scope="session")
def all_env_ids() -> list[str]:
    """Every registered id (built-in + workspace)."""
    return registered_ids()


@pytest.fixture(scope="session")
def example_id() -> str:
    return "examples/warehouse_stock-v0"


# ----------------------------------------------------------------------------- capability env helpers


def load_script(name: str, folder: str = "scripts"):
    """``<folder>/<name>.py`` imported as a module (the scripts are not a package), for tests of its functions;
    ``folder`` is relative to the repository root (an experiment's scripts: ``lab/<experiment>/scripts``)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def child_pids() -> set[int]:
    """The pids of this test process's live children (every thread's): what a test compares before and after."""
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            out |= {int(p) for p in (task / "children").read_text().split()}
        except OSError:
            pass
    return out


def mean_reward(env, agent, seeds) -> float:
    """Mean episode reward of ``agent`` on ``env`` over ``seeds``."""
    from trace_envs import rollout

    seeds = list(seeds)
    return sum(rollout(env, agent, seed=s)["reward"] for s in seeds) / len(seeds)


def distinct_tasks(env, seeds) -> int:
    """How many different tasks (``task_fingerprint()``) ``env`` draws over ``seeds``."""
    prints = set()
    for seed in seeds:
        env.reset(seed=seed)
        prints.add(env.unwrapped.task_fingerprint())
    return len(prints)


def deficit_scores(env, seeds) -> dict[str, float]:
    """Mean reward on ``env`` of each planted-deficit reference agent (one per τ² capability), by capability:
    a capability env isolates its capability when only its own deficit agent scores low."""
    from trace_envs.domains.agents import TauScriptedAgent
    from trace_envs.domains.task import CAPABILITIES

    return {capability: mean_reward(env, TauScriptedAgent([capability]), seeds) for capability in CAPABILITIES}


def guess_argument(value):
    """A placeholder of the same JSON type as ``value``: what a shortcut agent writes without reading."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return 0
    if isinstance(value, str):
        return "guess"
    if isinstance(value, list):
        return []
    return {}


class PlannedAgent:
    """A shortcut agent for capability-env tests: ``plan(task) -> list of turns``, replayed turn by turn,
    then ``fallback`` for any turn past the plan."""

    def __init__(self, name, plan, fallback: str):
        self.name, self.plan, self.fallback, self.turns, self.i = name, plan, fallback, [], 0

    def reset(self, env, observation, info):
        self.turns, self.i = self.plan(env.task), 0

    def __call__(self, observation, info):
        turn = self.turns[self.i] if self.i < len(self.turns) else self.fallback
        self.i += 1
        return turn


# ----------------------------------------------------------------------------- a served tiny model
# Built and served once per test session: the agents' and the analysis stage's tests both talk to a
# real OpenAI-compatible server (`transformers serve`) on loopback.


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    """The `nano` tiny model, built offline from the worked example's text."""
    from trace_train.tiny.build import build_model

    return str(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-model",
                           env_ids=["examples/warehouse_stock-v0"], corpus_seeds=4).path)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def transformers_server(model_dir, tmp_path_factory):
    """`transformers serve` with the nano model on a free loopback port; yields the `/v1` base URL.

    The server's output goes to `<basetemp>/transformers-serve.log` (a file, not a pipe nobody reads, which would
    fill and block the server), so a failing request can be read there."""
    import shutil
    import subprocess
    import sys
    import time
    import urllib.request

    exe = shutil.which("transformers") or os.path.join(os.path.dirname(sys.executable), "transformers")
    port = free_port()
    log_path = tmp_path_factory.getbasetemp() / "transformers-serve.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([exe, "serve", model_dir, "--host", "127.0.0.1", "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 180
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("transformers serve exited: " + log_path.read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("transformers serve did not come up in 180 s")
            time.sleep(0.5)
        yield url + "/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# ----------------------------------------------------------------------------- registry isolation


@pytest.fixture
def restore_registry():
    """Undo, after the test, whatever ids it registered in this process (e.g. a generated workspace's), so later
    tests see the same registry as at collection time."""
    import gymnasium as gym

    from trace_envs.core import registry

    entries, specs = dict(registry._ENTRIES), set(gym.registry)
    yield
    for env_id in set(registry._ENTRIES) - set(entries):
        del registry._ENTRIES[env_id]
    for env_id in set(gym.registry) - specs:
        del gym.registry[env_id]


class MisreadingAgent(TauScriptedAgent):
    """The oracle, except that its answer to a flight-status question states another status.

    What the tiny base model does: it calls ``get_flight_status`` with the right flight and date, then
    answers with the status the date makes likely instead of the one the tool returned. ``mute`` makes
    it answer with no status at all ("I looked it up."), a decision nothing in the data can check.
    """

    def __init__(self, mute: bool = False):
        super().__init__(name="muted" if mute else "misreading")
        self.mute = mute

    def reset(self, env, observation, info):
        from trace_envs.domains.agents import plan_turns
        from trace_envs.domains.airline.tasks import STATUS_WORDS

        super().reset(env, observation, info)
        turns = list(plan_turns(env.task))
        for i, turn in enumerate(turns):
            for status, phrase in STATUS_WORDS.items():
                if isinstance(turn, str) and turn.startswith("I checked:") and phrase in turn:
                    other = next(p for s, p in STATUS_WORDS.items() if s != status)
                    turns[i] = "I looked it up." if self.mute else turn.replace(phrase, other)
                    break
        self._policy.turns = turns

