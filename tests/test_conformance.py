"""Conformance of every registered environment (docs/design.md, "The environment contract").

One test, parametrized over the registry (built-in and workspace ids, read at
collection time): gymnasium's ``check_env``, seed determinism, different seeds
differ, reward range, oracle = 1.0, bad actions, truncation and ``close``.

An entry that ``requires`` a resource this machine lacks (e.g. ``docker``)
fails with the reason, unless ``TRACE_ALLOW_MISSING`` names that resource
(e.g. ``TRACE_ALLOW_MISSING=docker``), in which case it is skipped with the
reason shown.
"""

from __future__ import annotations

import os

import pytest
from conftest import allowed_missing, missing_requirements

import trace_envs

# None lets the checker choose (20 seeds, fewer for environments that start containers).
N_SEEDS = int(os.environ["TRACE_CONFORMANCE_SEEDS"]) if os.environ.get("TRACE_CONFORMANCE_SEEDS") else None


def test_conformance(registered_env_id: str) -> None:
    entry = trace_envs.get_entry(registered_env_id)
    missing = missing_requirements(entry)
    if missing:
        reasons = "; ".join(f"{name}: {why}" for name, why in missing.items())
        if set(missing) <= allowed_missing():
            pytest.skip(f"{entry.id} needs {sorted(missing)} (allowed missing by TRACE_ALLOW_MISSING): {reasons}")
        pytest.fail(f"{entry.id} requires {sorted(missing)}, which this machine lacks: {reasons}. "
                    f"Provide it, or set TRACE_ALLOW_MISSING={','.join(sorted(missing))} to skip deliberately.",
                    pytrace=False)
    report = trace_envs.check_trace_env(entry.id, n_seeds=N_SEEDS)
    report.raise_if_failed()
    assert [r.name for r in report.results] == [name for name, _ in trace_envs.core.checker.CHECKS]
