"""The ``ray:`` section: the Ray cluster that ``rollout.engine: ray`` (and GRPO's endpoint rollouts on Ray) use.

Its schema lives with the backend that reads it, so that ``train/`` and ``backends/`` read it without importing
``pipeline/`` above them; ``trace_train.pipeline.config`` re-exports it as a section of a run's config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..schema import ConfigError, _at_least, _build


@dataclass
class RaySection:
    """The Ray cluster of ``rollout.engine: ray`` (docs/ray.md); unused with the local engine.

    Attributes:
        address: ``auto`` (the cluster this machine belongs to, started with ``ray start``), ``ray://HOST:PORT``
            (a remote cluster through Ray Client), ``HOST:PORT`` (a cluster's GCS address, what ``ray start
            --address`` takes), or null (the cluster of ``RAY_ADDRESS`` or one already running here, else a
            new one-node cluster started for this run).
        num_actors: actors that host the envs of a rollout; each builds its own agent once (a local model is
            loaded once per actor; an endpoint agent is a client of the one shared server).
        env_cpus: CPUs each actor reserves (fractions share a core: 16 actors of 0.125 CPU on 2 cores, for
            envs that mostly wait on a tool or an LLM call).
        max_concurrent_per_actor: episodes open at once in one actor (its agent's batch).
        max_container_starts: SWE sandbox containers starting at once in the whole cluster (a named Ray actor
            semaphore around every container start). SWE actors run only on nodes that declare the custom
            resource ``docker`` (``ray start --resources '{"docker": 4}'``: that node hosts 4 SWE actors).
        stall_s: the liveness bound of a chunk of episodes on an actor. A chunk that hands nothing back for 30 s
            (or ``stall_s``, if less) has its actor asked about it; it runs again on a new actor when the actor is
            dead, does not answer within ``stall_s``, is not playing it (a lost task or stream end), or plays it
            but none of its episodes took a step for ``stall_s`` (set it above the slowest single step or turn).
        start_timeout_s: seconds a rollout waits for its first actor to start (none can be placed while the
            cluster lacks the CPUs or resources they ask for) before it fails, naming what they ask and what the
            cluster has.
    """

    address: str | None = None
    num_actors: int = 4
    env_cpus: float = 1.0
    max_concurrent_per_actor: int = 8
    max_container_starts: int = 4
    stall_s: float = 300.0
    start_timeout_s: float = 300.0

    def validate(self) -> None:
        check_ray_address("ray.address", self.address)
        _at_least("ray.num_actors", self.num_actors, 1)
        if not self.env_cpus >= 0:
            raise ConfigError(f"ray.env_cpus must be >= 0 (a fraction shares a core), got {self.env_cpus}")
        _at_least("ray.max_concurrent_per_actor", self.max_concurrent_per_actor, 1)
        _at_least("ray.max_container_starts", self.max_container_starts, 1)
        for key in ("stall_s", "start_timeout_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
                raise ConfigError(f"ray.{key} must be a number of seconds > 0, got {value!r}")


def ray_section(data: Any, prefix: str = "ray.") -> RaySection:
    """A validated :class:`RaySection` from a mapping of its keys: a run config's ``ray:`` section, or
    ``TrainConfig.ray`` (GRPO's endpoint rollouts on Ray). An unknown key, a wrong type or a bad value raises
    :class:`ConfigError` naming the key, as at load time."""
    section = _build(RaySection, data, prefix)
    section.validate()
    return section


def check_ray_address(key: str, address: Any) -> None:
    """An address Ray can connect to: null, ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``; anything else names
    the value and the forms."""
    if address is None or address == "auto":
        return
    text = str(address)
    rest = text[len("ray://"):] if text.startswith("ray://") else text
    host, sep, port = rest.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536) or "/" in host:
        raise ConfigError(f"{key}: {text!r} is not a Ray cluster address; use auto (the cluster of this machine), "
                          "ray://HOST:PORT (Ray Client), HOST:PORT (the head's GCS address, e.g. 10.0.0.1:6379) "
                          "or null (start a local cluster)")


__all__ = ["RaySection", "check_ray_address", "ray_section"]
