"""Many episodes at once: N seeds × K samples over env ids, batched agents, resumable JSONL.

:func:`run_rollouts` keeps ``in_flight`` episodes open at the same time. Each round it asks the agent
for the next turn of every open episode in one call — ``agent.act_batch(observations, infos)`` when the
agent has it (:class:`~trace_train.agents.HFAgent` batches generation, :class:`~trace_train.agents.OpenAIChatAgent`
sends concurrent requests) — and steps the envs. A finished episode is appended to the JSONL file at
once, as one line in one ``write`` (docs/design.md, "Trajectories"), so a killed run loses at most the
episodes in flight. Running the same command again reads the file, skips every
``(env_id, seed, sample)`` already there (a torn last line from a kill is cut off first) and runs the
rest: each episode ends up in the file exactly once.

Agents without ``act_batch`` are called one episode at a time; stateful ones (the oracle, planted-deficit
agents) get one copy per open episode, so their per-episode state never mixes.

:class:`EnvPool` keeps the envs open from one call to the next: a trainer that plays a batch of episodes every
step would otherwise make (and, for a sandboxed env, start a worker process for) every env again each step.

:func:`export_parquet` turns a trajectory file into a Parquet table (nested fields as JSON strings).
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import gymnasium as gym

from trace_envs.core import EnvError

logger = logging.getLogger(__name__)

Key = tuple[str, int, int]


class EnvPool:
    """Envs kept open across :func:`run_rollouts` calls, by env id and ``gym.make`` kwargs.

    ``run_rollouts(..., env_pool=pool)`` takes its envs from the pool and gives them back when it ends, instead of
    making and closing them: a GRPO run plays every step's groups through one pool, so a sandboxed env's worker
    (a bubblewrap process that imports ``trace_envs`` and the env's module, about half a second each) starts once
    per open episode slot for the whole run, not once per episode slot per step. An env is reset before each
    episode and a sandboxed env whose worker died starts a new one at its next ``reset``, so an env that comes
    back mid-episode (a rollout that raised) is as good as a new one. :meth:`close` closes them all; the pool is a
    context manager.
    """

    def __init__(self) -> None:
        self._free: dict[tuple[str, str], list[gym.Env]] = {}
        self._made = 0

    @staticmethod
    def _key(env_id: str, kwargs: dict) -> tuple[str, str]:
        return env_id, json.dumps(kwargs, sort_keys=True, default=repr)

    def take(self, env_id: str, kwargs: dict) -> gym.Env:
        """A free env of ``env_id`` made with ``kwargs``, or a new one."""
        free = self._free.setdefault(self._key(env_id, kwargs), [])
        if free:
            return free.pop()
        self._made += 1
        return gym.make(env_id, **kwargs)

    def give(self, env_id: str, kwargs: dict, env: gym.Env) -> None:
        """Give back an env :meth:`take` returned."""
        self._free.setdefault(self._key(env_id, kwargs), []).append(env)

    @property
    def made(self) -> int:
        """How many envs the pool has made so far."""
        return self._made

    def close(self) -> None:
        """Close every env in the pool (a failing close is logged, never raised)."""
        for envs in self._free.values():
            for env in envs:
                try:
                    env.close()
                except Exception:  # closing must not hide the real error
                    logger.exception("closing an env failed")
        self._free.clear()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class RolloutSummary:
    """What :func:`run_rollouts` did."""

    path: Path | None
    total: int
    skipped: int
    ran: int
    mean_reward: float
    success_rate: float
    seconds: float
    episodes_per_second: float
    records: list[dict] = field(default_factory=list, repr=False)
    #: episodes (of the requested ones, this run's and the file's) that ended in ``env_error``: the machine
    #: failed, not the agent. ``mean_reward`` and ``success_rate`` leave them out.
    env_errors: int = 0
    #: the Ray backend: actors that died during the run (their unfinished episodes ran again on new ones).
    actor_deaths: int = 0


def record_key(record: dict) -> Key:
    return (str(record["env_id"]), int(record["seed"]), int(record.get("sample", 0)))


def read_trajectories(path: str | Path, repair: bool = False) -> list[dict]:
    """Read a trajectory JSONL file.

    A last line without its newline is what a killed writer leaves behind: with ``repair`` the file is
    cut back to the last complete line, otherwise that line is ignored. A broken line in the middle
    is skipped with a warning.
    """
    path = Path(path)
    if not path.exists():
        return []
    data = path.read_bytes()
    records: list[dict] = []
    complete = data.rfind(b"\n") + 1
    if complete < len(data):
        logger.warning("%s ends with a partial line (%d bytes), from an interrupted run; %s", path,
                       len(data) - complete, "removing it" if repair else "ignoring it")
        if repair:
            with open(path, "r+b") as f:
                f.truncate(complete)
    for n, line in enumerate(data[:complete].splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s line %d is not valid JSON; skipped", path, n)
    return records


def _task_labels(env: gym.Env) -> tuple[dict, str | None]:
    """The env's ``task_info()`` labels and the task's scenario (from them, or from ``task_spec()``)."""
    base = env.unwrapped
    try:
        info = dict(base.task_info()) if hasattr(base, "task_info") else {}
    except Exception:
        info = {}
    scenario = info.get("scenario")
    if scenario is None:
        try:
            spec = base.task_spec()
            scenario = spec.get("scenario") if isinstance(spec, dict) else None
        except Exception:
            scenario = None
    return info, None if scenario is None else str(scenario)


class _Episode:
    __slots__ = ("key", "env", "agent", "obs", "info", "steps", "reward", "done", "truncated", "t0", "reset_s",
                 "agent_s", "env_s", "agent_errors", "cap", "scenario", "task", "sampled", "actions")

    def __init__(self, key: Key, env: gym.Env, agent: Any, cap: int) -> None:
        self.key, self.env, self.agent, self.cap = key, env, agent, cap
        self.steps, self.reward, self.done, self.truncated = 0, 0.0, False, False
        self.agent_s = self.env_s = 0.0
        self.agent_errors = 0
        self.sampled: list[dict] = []
        self.actions: list = []  # what was sent: the use-time audit of generated envs replays it


def jsonl_line(record: dict) -> bytes:
    """One trajectory record as a JSON Lines line (UTF-8, ending in a newline); works for any record.

    The envs keep their transcripts valid Unicode, but a record also carries what agents and hooks put
    in it. Text that UTF-8 cannot encode (a lone surrogate) is written as a JSON ``\\uXXXX`` escape
    instead, which reads back to exactly the same string; non-finite floats become ``null`` (the file
    stays strict JSON for any reader), and keys and objects JSON has no type for are written as their ``str``.
    """
    try:
        text = json.dumps(record, ensure_ascii=False, default=str, allow_nan=False)
    except (ValueError, TypeError):  # NaN / Infinity (e.g. in a reward breakdown), or a non-string key
        text = json.dumps(_jsonable(record), ensure_ascii=False, default=str)
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:
        data = json.dumps(json.loads(text), ensure_ascii=True).encode("ascii")
    return data + b"\n"


def _jsonable(value: Any) -> Any:
    """``value`` with NaN / Infinity floats replaced by None and every dict key made a string."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k if isinstance(k, str) else str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _env_failed(record: dict) -> bool:
    """Whether an episode ended because the machine failed (termination ``env_error``), not the agent."""
    return record.get("termination") == "env_error"


def _rewrite(path: Path, records: list[dict]) -> None:
    """Replace the trajectory file by ``records``, atomically (a crash leaves the old file or the new one)."""
    tmp = path.with_name(path.name + ".rewrite")
    with open(tmp, "wb") as f:
        for record in records:
            f.write(jsonl_line(record))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _is_agent_error(action: Any) -> bool:
    return isinstance(action, str) and action.startswith("<tool_call>[agent error]")


def _generated(env_id: str) -> bool:
    import trace_envs

    try:
        return trace_envs.get_entry(env_id).generated
    except KeyError:
        return False


def _record(ep: _Episode, agent_name: str) -> dict:
    env_id, seed, sample = ep.key
    info = ep.info
    terminated = ep.done and not ep.truncated
    return {
        "env_id": env_id,
        "seed": seed,
        "sample": sample,
        "agent": agent_name,
        "task": ep.task,
        "scenario": ep.scenario,
        "messages": info.get("messages", []),
        "tools": info.get("tools", []),
        "reward": ep.reward,
        "reward_breakdown": info.get("reward_breakdown", {}),
        "success": bool(info.get("success", False)) if terminated else False,
        "termination": (info.get("termination") or "terminated") if terminated else "max_steps",
        "steps": ep.steps,
        "agent_errors": ep.agent_errors,
        **({"rejected_turns": info["rejected_turns"]} if info.get("rejected_turns") else {}),
        # An agent that records its samples (HFAgent's record_samples): each turn's sampled token ids, their
        # sampler log-probabilities, and whether the env took the turn into the transcript (a rejected turn is not).
        **({"sampled_turns": ep.sampled} if ep.sampled else {}),
        **({"env_error": str(info.get("env_error") or info.get("reward_breakdown", {}).get("error") or "")}
           if terminated and info.get("termination") == "env_error" else {}),
        "timing": {"reset_s": ep.reset_s, "env_s": ep.env_s, "agent_s": ep.agent_s,
                   "wall_s": time.perf_counter() - ep.t0},
    }


class _Lock:
    """An exclusive lock on ``<file>.lock`` so that two runs never append to the same file."""

    def __init__(self, path: Path) -> None:
        self.path = path.with_name(path.name + ".lock")
        self.fd: int | None = None

    def __enter__(self):
        import fcntl

        self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self.fd)
            raise RuntimeError(f"another rollout run is writing {self.path.with_suffix('')}; wait for it or use "
                               "another --out file") from None
        return self

    def __exit__(self, *exc) -> None:
        import fcntl

        if self.fd is not None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)


def resume_file(path: Path | None, todo: Sequence[Key], retry_env_errors: bool = False) -> tuple[list[dict], set[Key]]:
    """What a trajectory file already holds of the episodes ``todo``: ``(their records, every key in the file)``.

    A torn last line (a killed writer) is cut off first. With ``retry_env_errors`` the requested episodes
    that ended in ``env_error`` are removed from the file (atomically), so that they run again and each key
    stays in it once. The caller holds the file's lock (:class:`_Lock`).
    """
    if path is None:
        return [], set()
    existing = read_trajectories(path, repair=True)
    wanted = set(todo)
    if retry_env_errors:
        failed = [r for r in existing if _env_failed(r) and record_key(r) in wanted]
        if failed:
            existing = [r for r in existing if not (_env_failed(r) and record_key(r) in wanted)]
            _rewrite(path, existing)
            logger.info("%s: rerunning %d episodes that ended in env_error", path, len(failed))
    done = {record_key(r) for r in existing if "env_id" in r and "seed" in r}
    return [r for r in existing if record_key(r) in wanted], done


def run_rollouts(env_ids: str | Sequence[str], agent: Any, seeds: Iterable[int], samples: int = 1,
                 out: str | Path | None = None, in_flight: int = 8, reset_options: dict | None = None,
                 env_kwargs: dict | Callable[[str], dict] | None = None, max_steps: int | None = None, progress: bool = True,
                 agent_name: str | None = None, keep_records: bool = False,
                 retry_env_errors: bool = False, keys: Sequence[Key] | None = None,
                 on_record: Callable[[dict], None] | None = None, audit: Any = True,
                 on_step: Callable[[], None] | None = None,
                 env_pool: EnvPool | None = None) -> RolloutSummary:
    """Run every (env id, seed, sample) once and append the trajectories to ``out``.

    Args:
        env_ids: one registered id or several.
        agent: ``agent(observation, info) -> action``; with ``act_batch(observations, infos)`` it is
            called once per round for all open episodes; without it, it is deep-copied per open episode
            when it has per-episode state (a ``reset`` method).
        seeds: episode seeds (the task is a pure function of the seed).
        samples: K episodes per (env id, seed), numbered 0..K-1 (sampling agents give different ones).
        out: the JSONL file; existing episodes in it are skipped (resume). None keeps records in memory only.
        in_flight: episodes open at once.
        reset_options: passed to every ``env.reset``.
        env_kwargs: passed to ``gym.make``: one dict for every env id, or a function ``env_id -> dict``.
        max_steps: step cap for envs without ``max_episode_steps`` (default 200).
        progress: show a tqdm bar (episodes, mean reward so far, episodes/s).
        agent_name: name written into records (default ``agent.name``).
        keep_records: also return this run's records in the summary.
        retry_env_errors: rerun the requested episodes that ``out`` holds with termination ``env_error`` (the
            machine failed, not the agent); their old records are removed, so each key stays in the file once.
        keys: instead of every (env id, seed, sample) of ``env_ids`` × ``seeds`` × ``samples``, exactly these
            ``(env_id, seed, sample)`` episodes, in this order (what a Ray actor runs of a larger rollout);
            ``env_ids``, ``seeds`` and ``samples`` are then ignored.
        on_record: called with each finished episode's record as it ends (after it is written to ``out``).
        audit: audit the generated envs while they are played (:mod:`generators.audit`: a sample of episodes
            replayed in a second worker and by the reward-hacking probes; a failure raises ``AuditFailure``
            and quarantines the module). True (default) uses the process's auditor
            (``generators.audit.shared_auditor``, rate ``TRACE_AUDIT_RATE``); an ``Auditor`` is used as given;
            False turns it off.
        on_step: called once the envs are made and checked, and after each round of steps of the open episodes
            (a Ray actor's liveness clock).
        env_pool: take the envs from this :class:`EnvPool` and give them back at the end, open, instead of making
            and closing them here (a trainer calling this every step).

    Before the first episode every env id is made once and its ``preflight()`` called (an SWE env checks
    Docker and builds its base image there): an env that cannot run on this machine raises
    :class:`trace_envs.core.EnvError` with the reason, before any episode is played or written.

    Returns:
        A :class:`RolloutSummary`.
    """
    import trace_envs  # noqa: F401 - registers the ids

    from tqdm.auto import tqdm

    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    if keys is not None:
        todo: list[Key] = [(str(e), int(s), int(k)) for e, s, k in keys]
    else:
        ids = [env_ids] if isinstance(env_ids, str) else list(env_ids)
        todo = [(e, int(s), k) for e in ids for s in seeds for k in range(samples)]
    name = agent_name or getattr(agent, "name", type(agent).__name__)
    batched = hasattr(agent, "act_batch")
    stateful = not batched and hasattr(agent, "reset")

    path = Path(out) if out is not None else None
    lock = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = _Lock(path).__enter__()
    try:
        prior, done = resume_file(path, todo, retry_env_errors)
        pending = deque(k for k in todo if k not in done)
        skipped = len(todo) - len(pending)
        env_errors = sum(_env_failed(r) for r in prior)
        rewards = [float(r.get("reward", 0.0)) for r in prior if not _env_failed(r)]
        successes = [bool(r.get("success")) for r in prior if not _env_failed(r)]
        records: list[dict] = []
        free_envs: dict[str, list[gym.Env]] = {}
        all_envs: list[tuple[str, gym.Env]] = []
        open_eps: list[_Episode] = []
        sink = open(path, "ab") if path is not None else None
        t_start = time.perf_counter()
        ran = 0
        bar = tqdm(total=len(todo), initial=skipped, desc="rollouts", unit="ep", disable=not progress,
                   dynamic_ncols=True)

        def kwargs_of(env_id: str) -> dict:
            return env_kwargs(env_id) if callable(env_kwargs) else (env_kwargs or {})

        def take_env(env_id: str) -> gym.Env:
            pool = free_envs.setdefault(env_id, [])
            if pool:
                return pool.pop()
            env = env_pool.take(env_id, kwargs_of(env_id)) if env_pool is not None else \
                gym.make(env_id, **kwargs_of(env_id))
            all_envs.append((env_id, env))
            return env

        def start(key: Key) -> _Episode:
            env = take_env(key[0])
            cap = max_steps or (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 200)
            ep_agent = agent if not stateful else copy.deepcopy(agent)
            ep = _Episode(key, env, ep_agent, cap)
            ep.t0 = time.perf_counter()
            ep.obs, ep.info = env.reset(seed=key[1], options=reset_options)
            ep.reset_s = time.perf_counter() - ep.t0
            ep.task, ep.scenario = _task_labels(env)
            if hasattr(ep_agent, "reset"):
                ep_agent.reset(env.unwrapped, ep.obs, ep.info)
            return ep

        def finish(ep: _Episode) -> None:
            nonlocal ran, env_errors
            record = _record(ep, name)
            if sink is not None:
                sink.write(jsonl_line(record))
                sink.flush()
                os.fsync(sink.fileno())
            if keep_records:
                records.append(record)
            if on_record is not None:
                on_record(record)
            if auditor is not None:
                auditor.observe(record, ep.actions, kwargs_of(ep.key[0]))  # raises AuditFailure: the run stops
            free_envs.setdefault(ep.key[0], []).append(ep.env)
            if _env_failed(record):
                env_errors += 1
                logger.warning("%s seed %s: env_error (%s)", ep.key[0], ep.key[1], record.get("env_error", "")[:200])
            else:
                rewards.append(record["reward"])
                successes.append(record["success"])
            ran += 1
            elapsed = time.perf_counter() - t_start
            bar.update(1)
            bar.set_postfix(reward=f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
                            success=f"{sum(successes) / len(successes):.2f}" if successes else "-",
                            **({"env_errors": env_errors} if env_errors else {}),
                            eps=f"{ran / elapsed:.2f}/s" if elapsed > 0 else "-")

        auditor = None
        if audit and any(_generated(e) for e in dict.fromkeys(k[0] for k in pending)):
            from generators.audit import shared_auditor

            auditor = audit if not isinstance(audit, bool) else shared_auditor()
        try:
            for env_id in dict.fromkeys(k[0] for k in pending):  # every env can run here, before any episode
                env = take_env(env_id)
                free_envs[env_id].append(env)
                check = getattr(env.unwrapped, "preflight", None)
                if callable(check):
                    try:
                        check()
                    except EnvError as exc:
                        raise EnvError(f"{env_id} cannot run on this machine: {exc}") from exc
            if on_step is not None:
                on_step()
            while pending or open_eps:
                while pending and len(open_eps) < in_flight:
                    open_eps.append(start(pending.popleft()))
                t1 = time.perf_counter()
                if batched:
                    actions = list(agent.act_batch([e.obs for e in open_eps], [e.info for e in open_eps]))
                    if len(actions) != len(open_eps):
                        raise RuntimeError(f"{name}.act_batch returned {len(actions)} actions for "
                                           f"{len(open_eps)} episodes")
                    share = (time.perf_counter() - t1) / len(open_eps)
                    for e in open_eps:
                        e.agent_s += share
                    samples = getattr(agent, "last_samples", None) if getattr(agent, "record_samples", False) else None
                    if samples is not None and len(samples) != len(open_eps):
                        samples = None
                else:
                    samples = None
                    actions = []
                    for e in open_eps:
                        t2 = time.perf_counter()
                        actions.append(e.agent(e.obs, e.info))
                        e.agent_s += time.perf_counter() - t2
                still_open = []
                for i, (e, action) in enumerate(zip(open_eps, actions)):
                    e.agent_errors += int(_is_agent_error(action))
                    if auditor is not None:
                        e.actions.append(action)
                    t3 = time.perf_counter()
                    before = len(e.info.get("messages") or ())
                    e.obs, r, terminated, truncated, e.info = e.env.step(action)
                    e.env_s += time.perf_counter() - t3
                    if samples is not None:
                        tokens, logprobs = samples[i]
                        e.sampled.append({"tokens": tokens, "logprobs": logprobs,
                                          "accepted": len(e.info.get("messages") or ()) > before})
                    e.reward += float(r)
                    e.steps += 1
                    if terminated or truncated or e.steps >= e.cap:
                        e.done, e.truncated = True, not terminated
                        finish(e)
                    else:
                        still_open.append(e)
                open_eps = still_open
                if on_step is not None:
                    on_step()
        finally:
            bar.close()
            if sink is not None:
                sink.close()
            for env_id, env in all_envs:
                if env_pool is not None:
                    env_pool.give(env_id, kwargs_of(env_id), env)
                    continue
                try:
                    env.close()
                except Exception:  # closing must not hide the real error
                    logger.exception("closing an env failed")
        seconds = time.perf_counter() - t_start
        return RolloutSummary(
            path=path, total=len(todo), skipped=skipped, ran=ran,
            mean_reward=sum(rewards) / len(rewards) if rewards else 0.0,
            success_rate=sum(successes) / len(successes) if successes else 0.0,
            seconds=seconds, episodes_per_second=ran / seconds if seconds > 0 else 0.0, records=records,
            env_errors=env_errors)
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)


#: Columns of the Parquet export; nested values (messages, tools, reward_breakdown, timing) are JSON strings.
PARQUET_COLUMNS = ("env_id", "seed", "sample", "agent", "scenario", "reward", "success", "termination", "steps",
                   "agent_errors", "wall_s", "messages", "tools", "reward_breakdown", "timing")


def export_parquet(jsonl: str | Path, parquet: str | Path | None = None) -> Path:
    """Write a trajectory JSONL file as Parquet (one row per episode); returns the Parquet path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = Path(jsonl)
    target = Path(parquet) if parquet else jsonl.with_suffix(".parquet")
    records = read_trajectories(jsonl)
    columns: dict[str, list] = {c: [] for c in PARQUET_COLUMNS}
    for r in records:
        columns["env_id"].append(str(r.get("env_id")))
        columns["seed"].append(None if r.get("seed") is None else int(r["seed"]))
        columns["sample"].append(int(r.get("sample", 0)))
        columns["agent"].append(str(r.get("agent", "")))
        columns["scenario"].append(None if r.get("scenario") is None else str(r["scenario"]))
        columns["reward"].append(float(r.get("reward", 0.0)))
        columns["success"].append(bool(r.get("success", False)))
        columns["termination"].append(str(r.get("termination", "")))
        columns["steps"].append(int(r.get("steps", 0)))
        columns["agent_errors"].append(int(r.get("agent_errors", 0)))
        columns["wall_s"].append(float((r.get("timing") or {}).get("wall_s", 0.0)))
        for c in ("messages", "tools", "reward_breakdown", "timing"):
            columns[c].append(json.dumps(r.get(c), ensure_ascii=False, default=str))
    schema = pa.schema([("env_id", pa.string()), ("seed", pa.int64()), ("sample", pa.int64()),
                        ("agent", pa.string()), ("scenario", pa.string()), ("reward", pa.float64()),
                        ("success", pa.bool_()), ("termination", pa.string()), ("steps", pa.int64()),
                        ("agent_errors", pa.int64()), ("wall_s", pa.float64()), ("messages", pa.string()),
                        ("tools", pa.string()), ("reward_breakdown", pa.string()), ("timing", pa.string())])
    pq.write_table(pa.table(columns, schema=schema), target)
    return target
