"""The airline domain of the τ²-style target environments (``trace/tau_airline-v0``).

:class:`AirlineDomain` bundles what :class:`~trace_envs.domains.base.TauEnv` needs: the database
generator (:mod:`.db`), the tools (:mod:`.tools`), the policy (``policy.md``, ``policy_compact.md``)
and the task generator with τ²-bench's data loader (:mod:`.tasks`).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ..db import Layer
from ..task import TauTask
from . import db as _db
from . import tasks as _tasks
from .tools import AirlineTools

_HERE = Path(__file__).resolve().parent


@lru_cache(maxsize=2)
def _policy_text(compact: bool) -> str:
    return (_HERE / ("policy_compact.md" if compact else "policy.md")).read_text(encoding="utf-8").strip()


class AirlineDomain:
    """The airline domain (see the package docstring)."""

    name = "airline"
    toolkit_cls = AirlineTools
    scenarios = _tasks.SCENARIOS
    sizes = {name: {**preset, **_tasks.DEFAULT_MIX} for name, preset in _db.SIZES.items()}

    def policy(self, compact: bool = False) -> str:
        return _policy_text(compact)

    def generate_db(self, rng: np.random.Generator, size: dict) -> dict[str, dict[str, dict]]:
        return _db.generate_db(rng, size)

    def generate_task(self, rng: np.random.Generator, db: Layer, scenarios: list[str], size: dict) -> TauTask:
        return _tasks.generate_task(rng, db, scenarios, size)

    def load_tau2(self, path: Path) -> tuple[dict[str, dict[str, dict]], list[TauTask]]:
        return _tasks.load_tau2(path)


__all__ = ["AirlineDomain", "AirlineTools"]
