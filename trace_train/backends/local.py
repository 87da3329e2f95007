"""The ``local`` rollout backend: this process, or worker processes of this machine.

One worker runs every job here, one after the other, with :func:`~trace_train.rollouts.run_rollouts`.
Several run the jobs side by side in a pool of spawned processes (:func:`_worker_pool`, also what the train
stage's ``train.workers`` use), each building its own agent from the job's factory. A job whose agent
cannot be sent to a process (a closure: a scripted or endpoint base) runs in this process. The last round's
jobs are split by seeds into part files so that no worker idles (:func:`_split_last_round`) and joined
after; an interrupted split job resumes in its parts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

from . import RolloutJob

logger = logging.getLogger(__name__)


def run_job(job: RolloutJob):
    """One job's rollouts in this process (resumable: episodes already in ``job.out`` are kept)."""
    from trace_train.rollouts import run_rollouts

    if job.registries:  # a worker process starts with the built-in registry only
        import trace_envs

        for path in job.registries:
            trace_envs.load_registry(path)
    agent = job.make()
    try:
        # With retry_env_errors, episodes the machine failed (env_error) are rerun, here and when a run resumes;
        # what still fails after a second pass is left in the file, reported by trace_train.evaluate.
        for _ in range(2 if job.retry_env_errors else 1):
            summary = run_rollouts(job.targets, agent, job.seeds, samples=job.samples, out=job.out,
                                   in_flight=job.in_flight, env_kwargs=_kwargs_of(job.env_kwargs),
                                   max_steps=job.max_steps, progress=job.progress,
                                   agent_name=job.agent_name, retry_env_errors=job.retry_env_errors)
            if not summary.env_errors:
                break
    finally:
        close = getattr(agent, "close", None)
        if callable(close):
            close()
    return summary


class _kwargs_of:
    """``env_id -> gym.make kwargs`` of a job (a class, not a closure, so that it pickles)."""

    def __init__(self, per_env: dict[str, dict]) -> None:
        self.per_env = per_env

    def __call__(self, env_id: str) -> dict:
        return dict(self.per_env.get(env_id, {}))


def _die_with_parent() -> None:
    """Worker initializer: a worker gets SIGKILL when the run's process dies, so a killed run leaves no worker
    writing into its directory while the resumed run works there. (Each job sets its own torch threads.)"""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG (Linux)
    except (OSError, AttributeError):
        pass


def _worker_pool(workers: int):
    """The process pool of the local backend and of ``train.workers``: spawned (no torch state is forked), and
    each worker dies with the run (:func:`_die_with_parent`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_die_with_parent)


def _part_path(out: Path, i: int) -> Path:
    return out.with_name(f"{out.stem}.part{i}{out.suffix}")


def _split_last_round(jobs: list[RolloutJob], workers: int) -> list[list[RolloutJob]]:
    """The jobs as groups of parts: a job of the last round, which would leave workers idle (9 methods on 2
    workers end with one running alone), is split by seeds into parts that run side by side; every other
    job is one part. A job whose output file already exists (a run that stopped after it finished or while
    it ran unsplit) is never split: it resumes in its own file."""
    tail = len(jobs) % workers
    groups = [[job] for job in jobs]
    if workers <= 1 or tail == 0:
        return groups
    n_parts = workers // tail
    for g, job in enumerate(jobs[len(jobs) - tail:], len(jobs) - tail):
        seeds = list(job.seeds)
        if job.out.exists():  # whole already: parts left by a join that was interrupted are spent
            for i in range(n_parts):
                _part_path(job.out, i).unlink(missing_ok=True)
            continue
        if n_parts < 2 or len(seeds) < n_parts:
            continue
        size = math.ceil(len(seeds) / n_parts)
        groups[g] = [dataclasses.replace(job, seeds=seeds[i * size:(i + 1) * size], out=_part_path(job.out, i))
                     for i in range(n_parts) if seeds[i * size:(i + 1) * size]]
    return groups


def _join_parts(parts: list[RolloutJob], out: Path) -> None:
    """The parts' episodes into ``out``, part after part, then the parts removed."""
    tmp = out.with_name(out.name + ".joining")
    with open(tmp, "wb") as f:
        for part in parts:
            f.write(part.out.read_bytes())
    tmp.replace(out)
    for part in parts:
        part.out.unlink(missing_ok=True)
        part.out.with_name(part.out.name + ".lock").unlink(missing_ok=True)


def _merged(summaries: list, out: Path):
    """One summary of a job that ran in parts."""
    from trace_train.rollouts import RolloutSummary

    scored = [(s, s.total - s.env_errors) for s in summaries]
    n = sum(w for _, w in scored)
    seconds = max(s.seconds for s in summaries)
    ran = sum(s.ran for s in summaries)
    return RolloutSummary(path=out, total=sum(s.total for s in summaries), skipped=sum(s.skipped for s in summaries),
                          ran=ran, mean_reward=sum(s.mean_reward * w for s, w in scored) / n if n else 0.0,
                          success_rate=sum(s.success_rate * w for s, w in scored) / n if n else 0.0,
                          seconds=seconds, episodes_per_second=ran / seconds if seconds > 0 else 0.0,
                          env_errors=sum(s.env_errors for s in summaries))


def run_local(jobs: list[RolloutJob], workers: int = 1) -> list:
    """Every job's rollouts: in this process, or ``workers`` at a time in worker processes (see the module
    docstring); returns their summaries in the order of ``jobs``."""
    import pickle

    parallel = []
    for job in jobs:
        try:
            pickle.dumps(job.make)
            parallel.append(job)
        except (pickle.PicklingError, AttributeError, TypeError):
            pass
    groups = _split_last_round(parallel, workers) if workers > 1 else []
    if sum(len(group) for group in groups) <= 1:  # one process would do all of it: this one
        parallel, groups = [], []
    summaries: dict[int, object] = {}
    for i, job in enumerate(jobs):
        if not any(job is p for p in parallel):
            summaries[i] = run_job(job)
    if parallel:
        from concurrent.futures import as_completed

        logger.info("rolling out %d agents in %d worker processes", len(parallel), workers)
        index = {g: next(i for i, job in enumerate(jobs) if job is parallel[g]) for g in range(len(parallel))}
        with _worker_pool(workers) as pool:
            futures = {pool.submit(run_job, dataclasses.replace(part, progress=False)): g
                       for g, group in enumerate(groups) for part in group}
            left = [len(group) for group in groups]
            done: dict[int, list] = {g: [] for g in range(len(groups))}
            for future in as_completed(futures):
                g = futures[future]
                done[g].append(future.result())
                left[g] -= 1
                if left[g]:
                    continue
                if len(groups[g]) > 1:
                    _join_parts(groups[g], parallel[g].out)
                summaries[index[g]] = done[g][0] if len(done[g]) == 1 else _merged(done[g], parallel[g].out)
                if jobs[0].progress:
                    print(f"  rolled out {parallel[g].key} ({sum(n == 0 for n in left)}/{len(groups)})", flush=True)
    return [summaries[i] for i in range(len(jobs))]
