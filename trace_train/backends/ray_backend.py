"""The ``ray`` rollout backend: Ray actors host the envs, this process writes the trajectory file.

Each job gets ``ray.num_actors`` actors (:class:`RolloutActor`), each reserving ``ray.env_cpus`` CPUs. An
actor builds the job's agent once from its factory (a local model is loaded once per actor; an endpoint
agent is one more client of the shared server) and plays chunks of (env id, seed, sample) keys with
:func:`~trace_train.rollouts.run_rollouts`, ``ray.max_concurrent_per_actor`` episodes open at once, handing
every finished episode back as it ends (a Ray streaming generator). This process is the only writer of the
file: it appends each record and fsyncs it, as ``run_rollouts`` does, skips the keys the file already holds
(a resumed run) and writes a key at most once, so every episode lands exactly once.

Chunks go only to actors that have started: an actor the cluster cannot place (more CPUs asked than it has)
takes no work, and a rollout where none starts within ``ray.start_timeout_s`` fails naming what they ask.

Faults:

* an actor that dies (``ray.kill``, its node lost: ``RayActorError``) is replaced by a new one, and the
  keys of its chunk that had not come back run again there; a key whose actor died three times is recorded
  as an ``env_error`` episode instead of killing actors forever;
* a chunk that raises an ordinary exception (bad env input: a kwarg the env does not take, a broken task)
  is split: its keys run again one by one, and a key that fails alone is recorded as an ``env_error``
  episode with the exception as its reason — tried twice, never forever;
* a chunk that goes quiet (nothing handed back) has its actor asked about it (:meth:`_Run._check_stalls`); dead,
  silent for ``ray.stall_s``, not playing it, or playing it with no step for ``ray.stall_s``, its unfinished keys
  run again on a new actor, counted as that actor's death;
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
#: Seconds a chunk may hand back nothing before the driver asks its actor about it (the liveness rule; ``ray.stall_s``
#: bounds how long an actor that does not answer, or whose episodes take no step, is waited for).
PROBE_S = 30.0
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
    """Hosts envs and one agent; :meth:`run` plays a chunk of keys and yields each record as its episode ends.

    It runs its methods on a few threads (``max_concurrency``), so that :meth:`chunk_state` answers the
    driver's liveness question while a chunk plays."""

    def __init__(self, make, registries: list[str], docker: bool) -> None:
        import trace_envs

        for path in registries:
            trace_envs.load_registry(path)
        if docker:
            from trace_envs.swe import sandbox

            sandbox.cleanup_containers(only_dead_owners=True)  # a dead actor's containers on this node
            sandbox.set_start_gate(_cluster_start_gate)
        self.agent = make()
        self.chunks: dict[int, str] = {}  # chunk id -> "playing" | "done" | "failed"
        self.stepped: dict[int, float] = {}  # chunk id -> when its episodes last took a step

    def run(self, chunk_id: int, keys: list, env_kwargs: dict, in_flight: int, max_steps: int | None,
            agent_name: str | None):
        from trace_train.rollouts import run_rollouts

        from .local import _kwargs_of

        self.chunks[chunk_id] = "playing"
        out: queue.SimpleQueue = queue.SimpleQueue()

        def stepped() -> None:
            self.stepped[chunk_id] = time.monotonic()

        def work() -> None:
            try:
                run_rollouts(None, self.agent, None, keys=keys, in_flight=in_flight, env_kwargs=_kwargs_of(env_kwargs),
                             max_steps=max_steps, progress=False, agent_name=agent_name, on_record=out.put,
                             on_step=stepped)
                out.put(_Done())
            except BaseException as exc:  # handed to the driver, which decides
                out.put(_Failed(exc))

        threading.Thread(target=work, daemon=True, name=f"rollouts-{chunk_id}").start()
        while True:
            item = out.get()
            if isinstance(item, _Done):
                self.chunks[chunk_id] = "done"
                return
            if isinstance(item, _Failed):
                self.chunks[chunk_id] = "failed"
                raise item.exc
            yield item

    def chunk_state(self, chunk_id: int) -> tuple[str, float | None]:
        """The driver's liveness check of chunk ``chunk_id``: ``playing`` while it is played here, ``done`` or
        ``failed`` once it ended, ``unknown`` when it never reached this actor; and the seconds since its episodes
        last took a step (None while its envs are still being made and checked: an SWE image build is not timed)."""
        at = self.stepped.get(chunk_id)
        return self.chunks.get(chunk_id, "unknown"), None if at is None else time.monotonic() - at

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


class StalledChunk(RuntimeError):
    """A chunk that handed nothing back while its actor was dead, silent or not playing it."""


class _Slot:
    """One actor of a run: its handle, the reference that resolves when it has started, and its chunk."""

    def __init__(self, actor, ready_ref) -> None:
        self.actor, self.ready_ref, self.ready, self.chunk = actor, ready_ref, False, None


class _Chunk:
    """A chunk being played: its id on the actor, its slot, the keys not back yet, and the liveness clock."""

    def __init__(self, cid: int, slot: _Slot, left: list, solo: bool, seen: float) -> None:
        self.id, self.slot, self.left, self.solo, self.seen = cid, slot, left, solo, seen
        self.back = seen  # when it last handed an episode back (or started)
        self.probe, self.asked = None, 0.0


def _resources(res: dict) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in res.items() if k in ("CPU", "GPU", "docker")) or "nothing"


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
        self.max_deaths = MAX_DEATHS_PER_KEY * max(1, self.n_actors) + 2
        from tqdm.auto import tqdm

        self.bar = tqdm(total=skipped + len(pending), initial=skipped, desc=f"rollouts ({self.name}, ray)", unit="ep",
                        disable=not job.progress, dynamic_ncols=True)

    def _new_actor(self) -> _Slot:
        ray = self.ray
        # Threads: `run` plays a chunk while `chunk_state` answers the driver's liveness check.
        options: dict = {"num_cpus": self.cfg.env_cpus, "max_restarts": 0, "max_task_retries": 0,
                         "max_concurrency": 4}
        if self.docker:
            options["resources"] = {"docker": 1}
        env_vars = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
        if env_vars:
            options["runtime_env"] = {"env_vars": env_vars}
        actor = ray.remote(RolloutActor).options(**options).remote(self.job.make, list(self.job.registries),
                                                                   self.docker)
        return _Slot(actor, actor.__ray_ready__.remote())

    def _check_cluster(self) -> None:
        total = self.ray.cluster_resources()
        asks = {"CPU": self.cfg.env_cpus, **({"docker": 1} if self.docker else {})}
        if self.docker and total.get("docker", 0) < 1:
            raise RayBackendError(f"{', '.join(self.job.targets)} need Docker, and no node of the Ray cluster declares "
                                  "the `docker` resource: start the Docker nodes with `ray start --resources "
                                  "'{\"docker\": 4}' ...` (4 = the SWE actors that node takes)")
        fit = min(math.floor(total.get(name, 0) / need + 1e-9) for name, need in asks.items() if need > 0) \
            if any(need > 0 for need in asks.values()) else self.n_actors
        if fit < self.n_actors:  # the others wait for room and take no work until they start (never, on a fixed cluster)
            logger.warning("%s: %d actors asking %s each do not fit the Ray cluster's %s: %s play at once; use fewer "
                           "or smaller actors (--ray-actors, --ray-cpus; ray.num_actors, ray.env_cpus)", self.name,
                           self.n_actors, _resources(asks), _resources({k: total.get(k, 0) for k in asks}),
                           fit or "none")
        if self.docker:
            semaphore = _start_semaphore(self.cfg.max_container_starts)
            self.ray.get(semaphore.held.remote())  # up, and its name registered, before an actor looks it up

    def _record(self, record: dict) -> None:
        from trace_train.rollouts import _env_failed, record_key

        key = record_key(record)
        if key in self.written:  # a key that came back twice (a chunk rerun after a stall): the file keeps the first
            logger.info("%s: episode %s came back twice; keeping the first", self.name, key)
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
        self.slots = [self._new_actor() for _ in range(self.n_actors)]
        self.running: dict = {}  # generator -> _Chunk
        chunk_ids = iter(range(1 << 62))
        waiting_since = time.monotonic()  # since when work waits and no actor plays it
        try:
            while True:
                self._admit_ready_actors()
                for slot in self.slots:
                    if not (slot.ready and slot.chunk is None):
                        continue
                    chunk = self._next_chunk()
                    if chunk is None:
                        break
                    keys, solo = chunk
                    cid = next(chunk_ids)
                    gen = slot.actor.run.options(num_returns="streaming").remote(
                        cid, keys, self.job.env_kwargs, self.cfg.max_concurrent_per_actor, self.job.max_steps,
                        self.job.agent_name)
                    slot.chunk = gen
                    self.running[gen] = _Chunk(cid, slot, list(keys), solo, time.monotonic())
                if not self.running:
                    if not (self.queue or self.solo):
                        return
                    self._check_start_timeout(waiting_since)
                else:
                    waiting_since = time.monotonic()
                watched = list(self.running) + [s.ready_ref for s in self.slots if not s.ready]
                if not watched:  # cannot happen (work left, every actor started and idle), but never spin
                    time.sleep(0.1)
                    continue
                ready, _ = ray.wait(watched, num_returns=1, timeout=1.0)
                for gen in ready:
                    if gen not in self.running:  # an actor that started: admitted at the top of the loop
                        continue
                    ch = self.running[gen]
                    try:
                        record = ray.get(next(gen))
                    except StopIteration:
                        self._end_chunk(gen)
                        self.queue.extendleft(reversed([k for k in ch.left if k not in self.written]))
                        continue
                    except (RayActorError, ActorUnavailableError) as exc:
                        self._end_chunk(gen)
                        logger.warning("%s: an actor died with %d episodes unfinished (%s); rerunning them on a new "
                                       "actor", self.name, len(ch.left), type(exc).__name__)
                        self._replace(ch.slot, exc, ch.left)
                        continue
                    except RayTaskError as exc:
                        self._end_chunk(gen)
                        cause = getattr(exc, "cause", None)
                        if isinstance(cause, EnvError):  # preflight: this env cannot run on that node
                            raise cause
                        self._chunk_failed(ch.left, ch.solo, cause or exc)
                        continue
                    key = record_key_of(record)
                    if key in ch.left:
                        ch.left.remove(key)
                    ch.seen = ch.back = time.monotonic()
                    self._record(record)
                self._check_stalls()
        finally:
            self.bar.close()
            for slot in self.slots:
                if slot.ready:  # an actor that never started has nothing to close, and would not answer
                    try:
                        ray.get(slot.actor.close.remote(), timeout=30)
                    except Exception:  # a dead actor has nothing to close
                        pass
                ray.kill(slot.actor, no_restart=True)

    def _end_chunk(self, gen) -> None:
        ch = self.running.pop(gen)
        ch.slot.chunk = None

    def _admit_ready_actors(self) -> None:
        """Mark the actors whose constructor finished as ready for chunks; one whose constructor failed dies."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        starting = [s for s in self.slots if not s.ready]
        if not starting:
            return
        done, _ = self.ray.wait([s.ready_ref for s in starting], num_returns=len(starting), timeout=0)
        for slot in starting:
            if slot.ready_ref not in done:
                continue
            try:
                self.ray.get(slot.ready_ref)
            except (RayActorError, ActorUnavailableError) as exc:
                logger.warning("%s: an actor failed to start (%s)", self.name, str(exc)[:300])
                self._replace(slot, exc, [])
                continue
            slot.ready = True

    def _replace(self, slot: _Slot, exc: BaseException, left: list) -> None:
        """``slot``'s actor is dead or stalled: its unfinished keys go back to the queue, a new actor takes its place."""
        self.deaths += 1
        if self.deaths > self.max_deaths:
            raise RayBackendError(f"{self.name}: {self.deaths} actors died or stalled; giving up (last: "
                                  f"{type(exc).__name__}: {str(exc)[:500]})") from exc
        self._requeue_after_death(left, exc)
        self.ray.kill(slot.actor, no_restart=True)
        fresh = self._new_actor()
        slot.actor, slot.ready_ref, slot.ready, slot.chunk = fresh.actor, fresh.ready_ref, False, None

    def _check_stalls(self) -> None:
        """The liveness rule. A chunk that handed back nothing for :data:`PROBE_S` (or ``ray.stall_s``, if less)
        has its actor asked about it. Its unfinished keys run again on a new actor, counted as that actor's
        death, when the actor is dead, gives no answer within ``ray.stall_s``, is not playing the chunk (its task
        or its stream's end was lost), or plays it but no episode of it took a step for ``ray.stall_s``."""
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        now, stall = time.monotonic(), self.cfg.stall_s
        probe_after = min(PROBE_S, stall)
        for gen, ch in list(self.running.items()):
            if ch.probe is None:
                if now - ch.seen >= probe_after:
                    ch.probe, ch.asked = ch.slot.actor.chunk_state.remote(ch.id), now
                continue
            done, _ = self.ray.wait([ch.probe], timeout=0)
            if done:
                try:
                    state, idle = self.ray.get(ch.probe, timeout=1)
                except (RayActorError, ActorUnavailableError, GetTimeoutError) as exc:
                    state, idle = f"dead ({type(exc).__name__})", None
                ch.probe = None
                if state == "playing" and (idle is None or idle < stall):
                    ch.seen = now  # busy: ask again after another probe interval
                    continue
                if state == "playing":
                    state = f"playing it with no step for {idle:.0f} s"
                else:
                    state = f"{state} (it is not playing the chunk)" if state in ("done", "failed", "unknown") \
                        else state
            elif now - ch.asked < stall:
                continue
            else:
                state = f"silent for {now - ch.asked:.0f} s"
            self._end_chunk(gen)
            reason = StalledChunk(f"a chunk with {len(ch.left)} episodes unfinished handed nothing back for "
                                  f"{now - ch.back:.0f} s and its actor is {state}")
            logger.warning("%s: %s; rerunning them on a new actor", self.name, reason)
            self._replace(ch.slot, reason, ch.left)

    def _check_start_timeout(self, waiting_since: float) -> None:
        """Work left, no chunk playing: fail once no actor has started for ``ray.start_timeout_s``."""
        waited = time.monotonic() - waiting_since
        if waited < self.cfg.start_timeout_s:
            return
        asks = {"CPU": self.cfg.env_cpus, **({"docker": 1} if self.docker else {})}
        raise RayBackendError(
            f"{self.name}: no Ray actor started in {waited:.0f} s with {len(self.queue) + len(self.solo)} episodes "
            f"left: each actor asks {_resources(asks)}, the cluster has {_resources(self.ray.cluster_resources())} "
            f"({_resources(self.ray.available_resources())} free). Fix: fewer or smaller actors (--ray-cpus, "
            "ray.env_cpus), more nodes, or free the cluster; ray.start_timeout_s sets the wait")

    def _requeue_after_death(self, left: list, exc: BaseException) -> None:
        for key in left:
            if key in self.written:
                continue
            self.key_deaths[key] = self.key_deaths.get(key, 0) + 1
            if self.key_deaths[key] >= MAX_DEATHS_PER_KEY:
                self._record(_error_record(key, self.name, f"its actor died or stalled {MAX_DEATHS_PER_KEY} "
                                                           f"times while running it (last: {type(exc).__name__}: {exc})"))
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
