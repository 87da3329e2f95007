"""Where rollouts run: one seam with two backends (docs/design.md, "Trajectories"; docs/ray.md).

A :class:`RolloutJob` is one agent's episodes into one trajectory file: env ids × seeds × samples, the agent
as a picklable factory (it is built where the episodes run), and the settings of
:func:`trace_train.rollouts.run_rollouts`. :func:`run_jobs` runs a list of them on a backend and returns
each job's :class:`~trace_train.rollouts.RolloutSummary`:

* ``local`` (:mod:`.local`, the default): this process, or a pool of worker processes of this machine
  (``rollout.workers``, ``evaluate.workers``).
* ``ray`` (:mod:`.ray_backend`): Ray actors of a cluster host the envs; this process stays the only writer
  of the trajectory files.

Either way the same seeds give the same file (per key, the same episode for a deterministic agent), every
(env id, seed, sample) lands in it exactly once, and a rerun skips what is there. Ray is imported only
by the ``ray`` backend, and only when it runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

#: The backends :func:`run_jobs` knows (``rollout.engine`` in a run config).
ENGINES = ("local", "ray")


@dataclass
class RolloutJob:
    """One agent's episodes into one trajectory file.

    Attributes:
        key: a name for logs and progress (the evaluate stage's method key).
        make: a no-argument callable that builds the agent, called where the episodes run (once per
            worker process or Ray actor); a partial of a class pickles to any process.
        targets: env ids.
        seeds: episode seeds.
        out: the trajectory JSONL file (appended; what it holds is skipped).
        samples: episodes per (env id, seed).
        in_flight: episodes open at once (per process; a Ray actor has ``ray.max_concurrent_per_actor``).
        env_kwargs: ``gym.make`` kwargs per env id.
        max_steps: step cap for envs without ``max_episode_steps``.
        agent_name: the name written into records (default: the agent's ``name``).
        retry_env_errors: rerun the file's ``env_error`` episodes, and once more those that fail again.
        registries: workspace registries to load where the episodes run (a fresh process knows only the
            built-in envs).
        progress: show a progress bar.
    """

    key: str
    make: Callable[[], Any]
    targets: list[str]
    seeds: list[int]
    out: Path
    samples: int = 1
    in_flight: int = 8
    env_kwargs: dict[str, dict] = field(default_factory=dict)
    max_steps: int | None = None
    agent_name: str | None = None
    retry_env_errors: bool = False
    registries: list[str] = field(default_factory=list)
    progress: bool = True

    def keys(self) -> list[tuple[str, int, int]]:
        """Every (env id, seed, sample) of this job, in the order ``run_rollouts`` plays them."""
        return [(e, int(s), k) for e in self.targets for s in self.seeds for k in range(self.samples)]


def run_jobs(jobs: list[RolloutJob], engine: str = "local", workers: int = 1, ray: Any = None) -> list:
    """Run every job on ``engine`` and return their summaries, in the order of ``jobs``.

    Args:
        jobs: the rollout jobs.
        engine: ``local`` or ``ray``.
        workers: ``local``: worker processes (1 = this process).
        ray: ``ray``: a :class:`trace_train.backends.ray_config.RaySection` (the cluster's address, actors, CPUs).
    """
    if engine == "local":
        from .local import run_local

        return run_local(jobs, workers)
    if engine == "ray":
        from .ray_backend import run_ray

        return run_ray(jobs, ray)
    raise ValueError(f"unknown rollout engine {engine!r}; use one of {', '.join(ENGINES)}")
