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
