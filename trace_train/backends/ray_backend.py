"""The ``ray`` rollout backend: Ray actors host the envs, this process writes the trajectory file.

Each job gets ``ray.num_actors`` actors (:class:`RolloutActor`), each reserving ``ray.env_cpus`` CPUs. An
actor builds the job's agent once from its factory (a local model is loaded once per actor; an endpoint
agent is one more client of the shared server) and plays chunks of (env id, seed, sample) keys with
:func:`~trace_train.rollouts.run_rollouts`, ``ray.max_concurrent_per_actor`` episodes open at once, handing
every finished episode back as it ends (a Ray streaming generator). This process is the only writer of the
file: it appends each record and fsyncs it, as ``run_rollouts`` does, skips the keys the file already holds
(a resumed run) and writes a key at most once, so every episode lands exactly once.

Faults:

* an actor that dies (``ray.kill``, its node lost: ``RayActorError``) is replaced by a new one, and the
  keys of its chunk that had not come back run again there; a key whose actor died three times is recorded
  as an ``env_error`` episode instead of killing actors forever;
* a chunk that raises an ordinary exception (bad env input: a kwarg the env does not take, a broken task)
  is split: its keys run again one by one, and a key that fails alone is recorded as an ``env_error``
  episode with the exception as its reason — tried twice, never forever;
* an env whose ``preflight()`` raises :class:`~trace_envs.core.EnvError` (its image cannot be built on the
  actor's node) stops the rollout with that error, as the local backend does.

SWE envs (a registry entry that ``requires: [docker]``) run on actors that ask for the custom resource
``docker`` (1 per actor), so only nodes that declare it take them, and every container start of the cluster
passes a named semaphore actor (``ray.max_container_starts`` at once), installed on the actors as
:func:`trace_envs.swe.sandbox.set_start_gate`. A new SWE actor first removes the containers whose owner
process is gone (a dead actor's, on its node).

Ray is imported here only, when a job runs.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import socket
import threading
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import RolloutJob

logger = logging.getLogger(__name__)

#: The semaphore actor of container starts (a detached actor in this namespace, shared by every driver).
SEMAPHORE_NAME, NAMESPACE = "trace-container-starts", "trace"
#: Times a key may be in flight on an actor that dies before it is recorded as an env_error episode.
MAX_DEATHS_PER_KEY = 3
#: Environment variables an actor gets from the driver (registries, caches, offline hub), when set.
FORWARDED_ENV = ("TRACE_REGISTRY", "TRACE_CACHE", "TRACE_HOME", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                 "OMP_NUM_THREADS", "PYTHONPATH")


class RayBackendError(RuntimeError):
    """The Ray backend cannot run: no cluster at the address, no node for SWE actors, actors that keep dying."""


def connect(address: str | None) -> None:
    """Connect this process to the Ray cluster at ``address`` (see :class:`~trace_train.backends.ray_config.RaySection`),
    unless it already is; an address where no cluster answers fails at once with the address named."""
    import ray

    from trace_train.backends.ray_config import ConfigError, check_ray_address

    if ray.is_initialized():
        return
    try:
        check_ray_address("ray.address", address)
    except ConfigError as exc:
        raise RayBackendError(str(exc)) from None
    if address not in (None, "auto"):  # fail in seconds, not after Ray's long reconnect loop
        host, _, port = address.removeprefix("ray://").rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise RayBackendError(f"ray.address {address!r}: no Ray cluster answers there ({exc}); start one with "
                                  "`ray start --head` on the head node, or use --ray without an address for a "
                                  "local one") from None
    try:
        if address is None:
            ray.init(include_dashboard=False, logging_level=logging.WARNING)
        else:
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise RayBackendError(f"ray.address {address!r}: cannot connect ({exc}); start a cluster with "
                              "`ray start --head`, or use --ray without an address for a local one") from None


def needs_docker(env_id: str) -> bool:
    """Whether ``env_id``'s registry entry requires Docker (an SWE env: its actors go to Docker nodes)."""
    import trace_envs

    try:
        return "docker" in trace_envs.get_entry(env_id).requires
    except KeyError:
        return False


class _Done:
    """The end of an actor's chunk, on its queue."""


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class RolloutActor:
    """Hosts envs and one agent; :meth:`run` plays a chunk of keys and yields each record as its episode ends."""

    def __init__(self, make, registries: list[str], docker: bool) -> None:
        import trace_envs

        for path in registries:
            trace_envs.load_registry(path)
        if docker:
            from trace_envs.swe import sandbox

            sandbox.cleanup_containers(only_dead_owners=True)  # a dead actor's containers on this node
            sandbox.set_start_gate(_cluster_start_gate)
        self.agent = make()

    def run(self, keys: list, env_kwargs: dict, in_flight: int, max_steps: int | None, agent_name: str | None):
        from trace_train.rollouts import run_rollouts

        from .local import _kwargs_of

        out: queue.SimpleQueue = queue.SimpleQueue()

        def work() -> None:
            try:
                run_rollouts(None, self.agent, None, keys=keys, in_flight=in_flight, env_kwargs=_kwargs_of(env_kwargs),
                             max_steps=max_steps, progress=False, agent_name=agent_name, on_record=out.put)
                out.put(_Done())
            except BaseException as exc:  # handed to the driver, which decides
                out.put(_Failed(exc))

        threading.Thread(target=work, daemon=True, name="rollouts").start()
        while True:
            item = out.get()
            if isinstance(item, _Done):
                return
            if isinstance(item, _Failed):
                raise item.exc
            yield item

    def close(self) -> None:
        close = getattr(self.agent, "close", None)
        if callable(close):
            close()


class ContainerStartSemaphore:
    """At most ``limit`` container starts at once in the cluster. A permit is a lease: one whose holder died
    before releasing it (a killed actor) expires after ``lease_s``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.holders: dict[str, float] = {}

    async def acquire(self, token: str, lease_s: float = 300.0) -> None:
        import asyncio

        while True:
            now = time.monotonic()
            self.holders = {t: at for t, at in self.holders.items() if now - at < lease_s}
            if len(self.holders) < self.limit:
                self.holders[token] = now
                return
            await asyncio.sleep(0.05)

    async def release(self, token: str) -> None:
        self.holders.pop(token, None)

    async def held(self) -> int:
        return len(self.holders)


@contextmanager
def _cluster_start_gate():
    """The container-start gate of an SWE actor: a permit of the cluster's :class:`ContainerStartSemaphore`."""
    import uuid

    import ray

    semaphore = ray.get_actor(SEMAPHORE_NAME, namespace=NAMESPACE)
    token = uuid.uuid4().hex
    ray.get(semaphore.acquire.remote(token))
    try:
        yield
    finally:
        semaphore.release.remote(token)


def _start_semaphore(limit: int):
    import ray

    return ray.remote(ContainerStartSemaphore).options(
        name=SEMAPHORE_NAME, namespace=NAMESPACE, get_if_exists=True, lifetime="detached", num_cpus=0,
        max_concurrency=1000).remote(limit)


def _error_record(key: tuple, agent_name: str, reason: str) -> dict:
    """The record of an episode that could not be played (termination ``env_error``)."""
    env_id, seed, sample = key
    return {"env_id": env_id, "seed": seed, "sample": sample, "agent": agent_name, "task": {}, "scenario": None,
            "messages": [], "tools": [], "reward": 0.0, "reward_breakdown": {}, "success": False,
            "termination": "env_error", "steps": 0, "agent_errors": 0, "env_error": reason[:2000],
            "timing": {"reset_s": 0.0, "env_s": 0.0, "agent_s": 0.0, "wall_s": 0.0}}


def run_ray(jobs: list[RolloutJob], cfg: Any = None) -> list:
    """Every job on Ray actors, one job after the other; returns their summaries (see the module docstring)."""
    from trace_train.backends.ray_config import RaySection

    cfg = cfg or RaySection()
    cfg.validate()
    connect(cfg.address)
    return [_run_job(job, cfg) for job in jobs]


def _run_job(job: RolloutJob, cfg) -> Any:
    from trace_train.rollouts import RolloutSummary, _Lock, _env_failed, jsonl_line, resume_file

    import trace_envs

    for path in job.registries:
        trace_envs.load_registry(path)
    path = Path(job.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    todo = job.keys()
    t_start = time.perf_counter()
    ran, deaths, skipped = 0, 0, None
    with _Lock(path):
        for _ in range(2 if job.retry_env_errors else 1):  # a second pass reruns what ended in env_error
            prior, done = resume_file(path, todo, job.retry_env_errors)
            pending = [k for k in todo if k not in done]
            skipped = len(todo) - len(pending) if skipped is None else skipped
            if not pending:
                break
            with open(path, "ab") as sink:
                def write(record: dict) -> None:
                    sink.write(jsonl_line(record))
                    sink.flush()
                    os.fsync(sink.fileno())

                run = _Run(job, cfg, pending, write, skipped=len(todo) - len(pending))
                run.play()
            ran += run.ran
            deaths += run.deaths
            if not run.env_errors:
                break
        prior, _ = resume_file(path, todo)
    seconds = time.perf_counter() - t_start
    scored = [r for r in prior if not _env_failed(r)]
    return RolloutSummary(
        path=path, total=len(todo), skipped=skipped or 0, ran=ran,
        mean_reward=sum(float(r.get("reward", 0.0)) for r in scored) / len(scored) if scored else 0.0,
        success_rate=sum(bool(r.get("success")) for r in scored) / len(scored) if scored else 0.0,
        seconds=seconds, episodes_per_second=ran / seconds if seconds > 0 else 0.0,
        env_errors=len(prior) - len(scored), actor_deaths=deaths)


class _Run:
    """One pass of a job over its pending keys: actors, chunks, faults (the module docstring)."""

    def __init__(self, job: RolloutJob, cfg, pending: list, write, skipped: int) -> None:
        import ray

        self.ray, self.job, self.cfg, self.write = ray, job, cfg, write
        self.name = job.agent_name or job.key
        self.docker = any(needs_docker(e) for e in job.targets)
        per_actor = cfg.max_concurrent_per_actor
        # Chunks of a few actor batches: big enough that an actor refills its batch inside a chunk, small enough
        # that every actor gets work and a dead actor's chunk is little to redo.
        self.chunk = max(1, min(per_actor * 4, math.ceil(len(pending) / cfg.num_actors)))
        self.queue = deque(pending)
        self.solo: deque = deque()  # keys of a chunk that raised: each runs alone once
        self.written: set = set()
        self.key_deaths: dict = {}
        self.ran = self.deaths = self.env_errors = 0
        self.n_actors = min(cfg.num_actors, math.ceil(len(pending) / self.chunk))
        from tqdm.auto import tqdm

        self.bar = tqdm(total=skipped + len(pending), initial=skipped, desc=f"rollouts ({self.name}, ray)", unit="ep",
                        disable=not job.progress, dynamic_ncols=True)

    def _new_actor(self):
        ray = self.ray
        options: dict = {"num_cpus": self.cfg.env_cpus, "max_restarts": 0, "max_task_retries": 0}
        if self.docker:
            options["resources"] = {"docker": 1}
        env_vars = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        return ray.remote(RolloutActor).options(**options).remote(self.job.make, list(self.job.registries), self.docker)

    def _check_cluster(self) -> None:
        if not self.docker:
            return
        have = self.ray.cluster_resources().get("docker", 0)
        if have < 1:
            raise RayBackendError(f"{', '.join(self.job.targets)} need Docker, and no node of the Ray cluster declares "
                                  "the `docker` resource: start the Docker nodes with `ray start --resources "
                                  "'{\"docker\": 4}' ...` (4 = the SWE actors that node takes)")
        semaphore = _start_semaphore(self.cfg.max_container_starts)
        self.ray.get(semaphore.held.remote())  # up, and its name registered, before an actor looks it up

    def _record(self, record: dict) -> None:
        from trace_train.rollouts import _env_failed, record_key

        key = record_key(record)
        if key in self.written:  # a key that came back twice (never expected): the file keeps the first
            logger.warning("%s: episode %s came back twice; keeping the first", self.name, key)
            return
        self.write(record)
        self.written.add(key)
        self.ran += 1
        if _env_failed(record):
            self.env_errors += 1
            logger.warning("%s seed %s: env_error (%s)", key[0], key[1], str(record.get("env_error", ""))[:200])
        self.bar.update(1)

    def _next_chunk(self) -> tuple[list, bool] | None:
        if self.solo:
            return [self.solo.popleft()], True
        if self.queue:
            n = min(self.chunk, len(self.queue))
            return [self.queue.popleft() for _ in range(n)], False
        return None

    def play(self) -> None:
        ray = self.ray
        from ray.exceptions import ActorUnavailableError, RayActorError, RayTaskError

        from trace_envs.core import EnvError

        self._check_cluster()
        slots = [self._new_actor() for _ in range(self.n_actors)]
        running: dict = {}  # generator -> (slot, keys not yet back, solo)
        idle = list(range(len(slots)))
        max_deaths = MAX_DEATHS_PER_KEY * max(1, self.n_actors) + 2
        try:
            while True:
                while idle:
                    chunk = self._next_chunk()
                    if chunk is None:
                        break
                    keys, solo = chunk
                    slot = idle.pop()
                    gen = slots[slot].run.options(num_returns="streaming").remote(
                        keys, self.job.env_kwargs, self.cfg.max_concurrent_per_actor, self.job.max_steps, self.job.agent_name)
                    running[gen] = (slot, list(keys), solo)
                if not running:
                    return
                ready, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
                for gen in ready:
                    slot, left, solo = running[gen]
                    try:
                        record = ray.get(next(gen))
                    except StopIteration:
                        del running[gen]
                        idle.append(slot)
                        self.queue.extendleft(reversed([k for k in left if k not in self.written]))
                        continue
                    except (RayActorError, ActorUnavailableError) as exc:
                        del running[gen]
                        self.deaths += 1
                        logger.warning("%s: an actor died with %d episodes unfinished (%s); rerunning them on a new "
                                       "actor", self.name, len(left), type(exc).__name__)
                        if self.deaths > max_deaths:
                            raise RayBackendError(f"{self.name}: {self.deaths} actors died; giving up (last: {exc})") \
                                from exc
                        self._requeue_after_death(left, exc)
                        ray.kill(slots[slot], no_restart=True)
                        slots[slot] = self._new_actor()
                        idle.append(slot)
                        continue
                    except RayTaskError as exc:
                        del running[gen]
                        idle.append(slot)
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, EnvError):  # preflight: this env cannot run on that node
                            raise cause
                        self._chunk_failed(left, solo, cause or exc)
                        continue
                    left.remove(tuple(record_key_of(record)))
                    self._record(record)
        finally:
            self.bar.close()
            for actor in slots:
                try:
                    ray.get(actor.close.remote(), timeout=30)
                except Exception:  # a dead actor has nothing to close
                    pass
                ray.kill(actor, no_restart=True)

    def _requeue_after_death(self, left: list, exc: BaseException) -> None:
        for key in left:
            if key in self.written:
                continue
            self.key_deaths[key] = self.key_deaths.get(key, 0) + 1
            if self.key_deaths[key] >= MAX_DEATHS_PER_KEY:
                self._record(_error_record(key, self.name, f"its actor died {MAX_DEATHS_PER_KEY} times while "
                                                           f"running it (last: {type(exc).__name__}: {exc})"))
            else:
                self.queue.appendleft(key)

    def _chunk_failed(self, left: list, solo: bool, cause: BaseException) -> None:
        reason = f"{type(cause).__name__}: {cause}"
        if solo:
            for key in left:
                if key not in self.written:
                    self._record(_error_record(key, self.name, reason))
            return
        logger.warning("%s: a chunk of %d episodes failed (%s); running them one by one", self.name, len(left),
                       reason[:300])
        self.solo.extend(k for k in left if k not in self.written)


def record_key_of(record: dict) -> tuple:
    return (str(record["env_id"]), int(record["seed"]), int(record.get("sample", 0)))
