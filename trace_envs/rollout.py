"""``rollout``: run one episode and return its trajectory record (docs/design.md, "Trajectories").

Defined in :mod:`trace_envs.core.episode`, where the conformance checker plays its episodes too.
"""

from __future__ import annotations

from .core.episode import rollout

__all__ = ["rollout"]
