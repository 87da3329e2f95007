"""The audit at use: a generated env is watched while GRPO, evaluation and ``trace rollout`` play it.

Admission judges a module under conditions made to look like use (:mod:`generators.admit`), but a module
that behaves only while it is judged could still tell some difference. So, while
:func:`trace_train.rollouts.run_rollouts` plays a generated env (every GRPO step, evaluation, ``trace
rollout``), an :class:`Auditor` takes a seeded sample of its finished episodes (always the first one) and

* **replays** the episode's actions on the same seed, with the kwargs the episode was played with, in a second
  worker that differs in ``PYTHONHASHSEED`` and the global ``random`` state and has never played that seed: a
  reward or a transcript that differs means the reward depends on the worker (``hash()``, global ``random``) or
  on earlier episodes (credit that depends on replays);
* plays **every reward-hacking probe** (:func:`generators.probes.probe_agents`) on that seed in a probe
  worker that has been reset at least as often as any worker of the run so far (one reset per episode
  played): a probe whose summed reward exceeds admission's bound over admission's window
  (``probe_bound × max(episodes, window)``) means the env pays for nothing now.

Either stops the run with :class:`AuditFailure` naming the env, the probe (or the replay) and the seed,
and quarantines the module in its workspace (:meth:`generators.workspace.Workspace.quarantine`): a
quarantined env refuses to start until it is taken out of ``quarantine.json`` by hand.
``TRACE_AUDIT_RATE`` sets the sampled share (default 0.05; 0 audits only the first episode of each env).
``run_rollouts`` uses one auditor per process (:func:`shared_auditor`), so a GRPO run's steps share it.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .probes import PROBE_BOUND, PROBE_SUCCESS_BOUND, mean_bound, probe_agents

#: Environment variable overriding :attr:`AuditConfig.rate`.
AUDIT_RATE_ENV = "TRACE_AUDIT_RATE"


class AuditFailure(RuntimeError):
    """A generated env failed its audit at use; the message names the env, the probe or replay and the seed."""

    def __init__(self, message: str, env_id: str, what: str):
        super().__init__(message)
        self.env_id, self.what = env_id, what

    def __reduce__(self):
        # Raised in a worker process (a GRPO run, an evaluation job), it crosses back by pickle: without this,
        # unpickling calls __init__ with the message alone and the verdict is lost in a TypeError.
        return type(self), (str(self), self.env_id, self.what)


@dataclass
class AuditConfig:
    """How much of a run is audited.

    Attributes:
        rate: share of each generated env's episodes audited after the first (which always is).
        seed: seed of the sample and of the replay worker's hash seed and random state.
        probe_bound: the most mean reward a probe may earn (admission's ``probe_bound``).
        window: admission's probe episodes: a probe fails when its summed reward exceeds
            ``probe_bound × max(its episodes, window)`` (one full success fails it at once).
        quarantine: write the failing module into its workspace's quarantine.
    """

    rate: float = 0.05
    seed: int = 0
    probe_bound: float = PROBE_BOUND
    window: int = 16
    quarantine: bool = True

    @classmethod
    def from_env(cls) -> "AuditConfig":
        raw = os.environ.get(AUDIT_RATE_ENV, "").strip()
        try:
            rate = float(raw) if raw else cls.rate
        except ValueError:
            raise ValueError(f"{AUDIT_RATE_ENV} must be a number in [0, 1], got {raw!r}") from None
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{AUDIT_RATE_ENV} must be a number in [0, 1], got {raw!r}")
        return cls(rate=rate)


class _Replay:
    name = "replay"

    def __init__(self, actions: list):
        self.actions, self.k = list(actions), 0

    def __call__(self, observation: str, info: dict) -> Any:
        self.k += 1
        return self.actions[self.k - 1] if self.k <= len(self.actions) else ""


def _play(env, agent, seed: int, cap: int) -> dict:
    obs, info = env.reset(seed=seed)
    if hasattr(agent, "reset"):
        agent.reset(env.unwrapped, obs, info)
    total, steps = 0.0, 0
    while steps < cap:
        obs, reward, terminated, truncated, info = env.step(agent(obs, info))
        total += float(reward)
        steps += 1
        if terminated or truncated:
            break
    return {"reward": total, "success": bool(info.get("success")), "messages": info.get("messages", []),
            "termination": info.get("termination"),
            "env_error": info.get("env_error")}


def _same_messages(a: list, b: list) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


class Auditor:
    """Audits the generated envs among the episodes it is shown (:meth:`observe`); close it at the end."""

    def __init__(self, config: AuditConfig | None = None):
        self.cfg = config or AuditConfig.from_env()
        self.episodes: dict[str, int] = {}
        self.audited: dict[str, int] = {}
        self.probe_sums: dict[tuple[str, str], float] = {}
        self.probe_counts: dict[tuple[str, str], int] = {}
        self.probe_wins: dict[tuple[str, str], int] = {}
        self._probe_envs: dict[str, Any] = {}
        self._probe_resets: dict[str, int] = {}
        self._replay_envs: dict[str, tuple[Any, set[int], str]] = {}  # env id -> (worker, seeds played, kwargs)
        self._sources: dict[str, tuple[str, str]] = {}
        self.seconds = 0.0

    @staticmethod
    def watches(env_id: str) -> bool:
        """Whether ``env_id`` is a generated env (the only kind audited)."""
        from trace_envs.core.registry import get_entry

        try:
            return get_entry(env_id).generated
        except KeyError:
            return False

    def _sampled(self, env_id: str, seed: int, sample: int) -> bool:
        if self.episodes[env_id] == 1:
            return True
        draw = random.Random(f"{self.cfg.seed}:{env_id}:{seed}:{sample}:{self.episodes[env_id]}").random()
        return draw < self.cfg.rate

    def observe(self, record: dict, actions: list, env_kwargs: dict | None = None) -> None:
        """One finished episode (its record, the actions that were sent and the ``gym.make`` kwargs its env was
        made with); audits it if sampled."""
        env_id = str(record.get("env_id"))
        if not self.watches(env_id) or record.get("termination") == "env_error":
            return
        self._follow(env_id)
        self.episodes[env_id] = self.episodes.get(env_id, 0) + 1
        if not self._sampled(env_id, int(record["seed"]), int(record.get("sample", 0))):
            return
        import time

        t0 = time.perf_counter()
        try:
            self.audit(env_id, int(record["seed"]), record, actions, env_kwargs)
        finally:
            self.seconds += time.perf_counter() - t0

    def _follow(self, env_id: str) -> None:
        """Start afresh for ``env_id`` when its registry entry now names another module (a reloaded registry)."""
        from trace_envs.core.registry import get_entry

        entry = get_entry(env_id)
        where = (entry.source, entry.entry_point)
        if self._sources.get(env_id, where) != where:
            for envs in (self._probe_envs, self._replay_envs):
                env = envs.pop(env_id, None)
                try:
                    (env[0] if isinstance(env, tuple) else env).close() if env is not None else None
                except Exception:  # noqa: BLE001 - an old worker's close must not stop the run
                    pass
            for table in (self.episodes, self.audited, self._probe_resets):
                table.pop(env_id, None)
            for table in (self.probe_sums, self.probe_counts, self.probe_wins):
                for key in [k for k in table if k[0] == env_id]:
                    del table[key]
        self._sources[env_id] = where

    # ------------------------------------------------------------------------------------ the two checks
    def audit(self, env_id: str, seed: int, record: dict, actions: list, env_kwargs: dict | None = None) -> None:
        self.audited[env_id] = self.audited.get(env_id, 0) + 1
        replay = self._replay_env(env_id, seed, env_kwargs or {})
        # Exactly the actions that were sent: an episode the rollout's own step cap cut (GRPO's
        # max_tool_calling_iterations) ends there in the replay too, not one empty turn later.
        again = _play(replay, _Replay(actions), seed, max(len(actions), 1))
        if again["termination"] == "env_error":
            self._fail(env_id, "replay", seed, f"the replay's worker failed: {str(again['env_error'])[:300]}")
        if abs(again["reward"] - float(record["reward"])) > 1e-9 or not _same_messages(again["messages"],
                                                                                       record.get("messages", [])):
            self._fail(env_id, "replay", seed,
                       f"the same actions replayed on seed {seed} in a second worker (another PYTHONHASHSEED and "
                       f"global random state) earned {again['reward']:.3f} against {float(record['reward']):.3f} in "
                       "use" + ("" if _same_messages(again["messages"], record.get("messages", [])) else
                                ", and the transcripts differ") + ": the reward depends on the worker or on earlier "
                       "episodes")
        env = self._probe_env(env_id)
        # at least as many resets as any worker of the run has seen, before the probes play
        behind = self.episodes[env_id] - self._probe_resets[env_id]
        for _ in range(max(0, behind)):
            env.reset(seed=seed)
        self._probe_resets[env_id] += max(0, behind)
        max_steps = env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 50
        for agent in probe_agents(seed):
            ep = _play(env, agent, seed, max_steps)
            self._probe_resets[env_id] += 1
            key = (env_id, agent.name)
            self.probe_sums[key] = self.probe_sums.get(key, 0.0) + ep["reward"]
            self.probe_wins[key] = self.probe_wins.get(key, 0) + int(ep["success"])
            self.probe_counts[key] = self.probe_counts.get(key, 0) + 1
            n, window = self.probe_counts[key], max(self.probe_counts[key], self.cfg.window)
            bound = mean_bound(agent, self.cfg.probe_bound)
            if self.probe_sums[key] > bound * window or \
                    self.probe_wins[key] > min(self.cfg.probe_bound, PROBE_SUCCESS_BOUND) * window:
                self._fail(env_id, agent.name, seed,
                           f"{agent.name} earned {self.probe_sums[key]:.3f} and succeeded {self.probe_wins[key]} "
                           f"time(s) in {n} audited episode(s) (seed {seed} last), above admission's bounds (mean "
                           f"{bound}, success {min(self.cfg.probe_bound, PROBE_SUCCESS_BOUND)}, over at least "
                           f"{self.cfg.window} episodes): the env pays for behaviour that does not use the capability")

    def _replay_env(self, env_id: str, seed: int, env_kwargs: dict):
        """A second worker (another hash seed and random state), made with ``env_kwargs`` (those of the episode it
        replays: another task size or prompt is another transcript), that has not played ``seed`` yet."""
        import gymnasium as gym

        from trace_envs.core.registry import get_entry, worker_spec

        key = json.dumps(env_kwargs, sort_keys=True, default=str)
        env, seen, made_with = self._replay_envs.get(env_id, (None, set(), key))
        if env is None or seed in seen or made_with != key:
            if env is not None:
                env.close()
            rng = random.Random(f"replay:{self.cfg.seed}:{env_id}:{len(seen)}")
            spec = worker_spec(get_entry(env_id), hash_seed=rng.randrange(1, 2 ** 31),
                               random_seed=rng.randrange(2 ** 31)).to_dict()
            env, seen = gym.make(env_id, **env_kwargs, trace_worker=spec), set()
        seen.add(seed)
        self._replay_envs[env_id] = (env, seen, key)
        return env

    def _probe_env(self, env_id: str):
        import gymnasium as gym

        if env_id not in self._probe_envs:
            self._probe_envs[env_id] = gym.make(env_id)
            self._probe_resets[env_id] = 0
        return self._probe_envs[env_id]

    def _fail(self, env_id: str, what: str, seed: int, detail: str) -> None:
        if self in _SHARED:
            _SHARED.remove(self)  # the next run starts a fresh auditor
        where = ""
        if self.cfg.quarantine:
            where = quarantine(env_id, f"audit at use: {what} on seed {seed}: {detail}")
        self.close()
        raise AuditFailure(f"generated env {env_id} failed its audit at use ({what}, seed {seed}): {detail}."
                           + (f" Its module is quarantined ({where}); it will not start again until it is removed "
                              "from that file." if where else ""), env_id, what)

    def close(self) -> None:
        for env in list(self._probe_envs.values()) + [e[0] for e in self._replay_envs.values()]:
            try:
                env.close()
            except Exception:  # noqa: BLE001 - closing must not hide the audit's verdict
                pass
        self._probe_envs.clear()
        self._replay_envs.clear()


_SHARED: list[Auditor] = []


def shared_auditor() -> Auditor:
    """The process's auditor: one for every ``run_rollouts`` call of a run (GRPO calls it once per step), so the
    first episode of each generated env is audited once per process, the sample is spread over the run, and
    its workers (probe, replay) start once; they end with the process (or when an audit fails)."""
    if not _SHARED:
        _SHARED.append(Auditor())
    return _SHARED[0]


def quarantine(env_id: str, reason: str) -> str:
    """Quarantine a generated env in its workspace; returns the quarantine file's path ('' if none is known)."""
    from trace_envs.core.registry import get_entry

    from .workspace import Workspace

    try:
        entry = get_entry(env_id)
    except KeyError:
        return ""
    if not entry.source:
        return ""
    ws = Workspace(Path(entry.source).parent)
    return str(ws.quarantine(env_id, reason))
