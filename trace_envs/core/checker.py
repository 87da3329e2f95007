"""``check_trace_env``: the conformance checks every TRACE environment must pass.

Contributors run it on a hand-written env, the test suite runs it over the
whole registry, and the generator runs it before admitting a generated env.
The checks are those of docs/design.md ("The environment contract"):

* gymnasium's ``check_env``;
* seed determinism (same seed → same task, same opening, same oracle transcript);
* different seeds give different tasks;
* rewards stay in [0, 1];
* the oracle scores 1.0 on every checked seed;
* empty, garbage and random actions never raise out of ``step`` and score < 1;
* episodes end within ``max_episode_steps`` (truncation is registered);
* ``close()`` releases everything (it is idempotent and ``open_resources()`` is empty after it).
"""

from __future__ import annotations

import json
import time
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

from .episode import OracleAgent, RandomAgent, ScriptedAgent, rollout

GARBAGE_ACTIONS: list[Any] = [
    "",
    "   ",
    "{",
    "<tool_call>{\"name\": \"no_such_tool\", \"arguments\": {}}</tool_call>",
    "<tool_call>not json</tool_call>",
    "<tool_call>",
    {"role": "user", "content": "hi"},
    {"not": "a message"},
    "\x00\x01",
    "a" * 70_000,
    12345,
    None,
]


def hostile_actions(tool_name: str, argument: str) -> list[Any]:
    """Turns that once broke environments through the shared core (issue 18), aimed at one real tool.

    Lone surrogates as JSON escapes, integers past Python's digit limit, non-string content parts, nesting
    thousands deep, a multi-megabyte tool name in a dict action, a non-finite number. Each must come back
    as an error observation inside the observation space, never as ``env_error``.
    """
    deep: Any = {}
    for _ in range(20_000):
        deep = {"a": deep}
    call = '{"name": "%s", "arguments": {"%s": %s}}'
    return [
        "<tool_call>" + call % (tool_name, argument, '"\\ud800"') + "</tool_call>",
        "<tool_call>" + call % (tool_name, "\\udfff", "1") + "</tool_call>",
        '{"name": "\\udbff", "arguments": {}}',
        {"role": "assistant", "content": "hi " + json.loads('"\\ud800"')},
        call % (tool_name, argument, "9" * 5_000),
        "<tool_call>" + call % (tool_name, argument, "[" * 5_000 + "]" * 5_000) + "</tool_call>",
        call % (tool_name, argument, "NaN"),
        {"role": "assistant", "content": [{"type": "text", "text": 5}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": tool_name, "arguments": {argument: 10 ** 5_000}}}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": tool_name, "arguments": {argument: deep}}}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "n" * 3_000_000, "arguments": {}}}]},
    ]


def _check_step_result(env: gym.Env, what: str, obs: Any, reward: float, info: dict) -> None:
    """The contract every step keeps, whatever the action: text inside the space, a writable transcript."""
    if not isinstance(obs, str) or not env.observation_space.contains(obs):
        raise ConformanceError(f"{what} gave an observation outside the observation space ({obs!r:.80})")
    if not (0.0 <= reward < 1.0):
        raise ConformanceError(f"{what} gave reward {reward}")
    if info.get("termination") == "env_error":
        raise ConformanceError(f"{what} ended the episode with env_error ({obs!r:.120})")
    try:
        json.dumps(info.get("messages", []), ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        raise ConformanceError(f"after {what}, info['messages'] cannot be written as UTF-8 JSON ({exc})") from None


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0


@dataclass
class CheckReport:
    env_id: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if not r.ok]

    def summary(self) -> str:
        lines = [f"Conformance of {self.env_id}: {'PASS' if self.ok else 'FAIL'}"]
        for r in self.results:
            lines.append(f"  [{'ok' if r.ok else 'FAIL'}] {r.name} ({r.seconds:.2f}s){': ' + r.detail if r.detail else ''}")
        return "\n".join(lines)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise AssertionError(self.summary())


class ConformanceError(AssertionError):
    pass


def _make(env_id: str, **kwargs: Any) -> gym.Env:
    return gym.make(env_id, **kwargs)


def _run(env: gym.Env, agent: Any, seed: int) -> dict:
    return rollout(env, agent, seed)


def check_gymnasium_api(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    from gymnasium.utils.env_checker import check_env

    env = _make(env_id, disable_env_checker=True, **kwargs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # check_env warns about text spaces' dtype; failures still raise
            check_env(env.unwrapped, skip_render_check=False, skip_close_check=True)
    finally:
        env.close()
    return ""


def check_determinism(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    for seed in seeds[:3]:
        transcripts, prints, openings = [], [], []
        for _ in range(2):
            env = _make(env_id, **kwargs)
            obs, _ = env.reset(seed=seed)
            openings.append(obs)
            prints.append(env.unwrapped.task_fingerprint())
            transcripts.append(_run(env, OracleAgent(), seed)["messages"])
            env.close()
        if openings[0] != openings[1]:
            raise ConformanceError(f"seed {seed}: two resets gave different opening observations")
        if prints[0] != prints[1]:
            raise ConformanceError(f"seed {seed}: two resets gave different task fingerprints")
        if transcripts[0] != transcripts[1]:
            raise ConformanceError(f"seed {seed}: the oracle's transcript differs between two runs")
    return ""


def check_seeds_differ(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    env = _make(env_id, **kwargs)
    prints = set()
    for seed in seeds:
        env.reset(seed=seed)
        prints.add(env.unwrapped.task_fingerprint())
    env.close()
    # An env whose whole task space is small says how small (``task_count()``): it needs that many, not half the seeds.
    count = getattr(env.unwrapped, "task_count", lambda: None)()
    needed = max(2, len(seeds) // 2) if count is None else min(max(2, len(seeds) // 2), count)
    if len(prints) < needed:
        raise ConformanceError(f"only {len(prints)} distinct tasks over {len(seeds)} seeds")
    return f"{len(prints)} distinct tasks / {len(seeds)} seeds"


def check_oracle(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    env = _make(env_id, **kwargs)
    bad = []
    for seed in seeds:
        record = _run(env, OracleAgent(), seed)
        if record["reward"] != 1.0:
            bad.append((seed, record["reward"], record["termination"], record["reward_breakdown"]))
    env.close()
    if bad:
        raise ConformanceError(f"oracle below 1.0 on {len(bad)}/{len(seeds)} seeds, e.g. {bad[:3]}")
    return f"1.0 on {len(seeds)} seeds"


def check_bad_actions(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    env = _make(env_id, **kwargs)
    try:
        for seed in seeds[:3]:
            for i, action in enumerate(GARBAGE_ACTIONS):
                env.reset(seed=seed)
                obs, reward, terminated, truncated, info = env.step(action)
                _check_step_result(env, f"garbage action #{i}", obs, reward, info)
            _, info = env.reset(seed=seed)
            tools = [t["function"] for t in info.get("tools", [])]
            name = tools[0]["name"] if tools else "no_such_tool"
            props = list(tools[0]["parameters"].get("properties", {})) if tools else []
            for i, action in enumerate(hostile_actions(name, props[0] if props else "x")):
                env.reset(seed=seed)
                obs, reward, terminated, truncated, info = env.step(action)
                _check_step_result(env, f"hostile action #{i}", obs, reward, info)
            for agent in (ScriptedAgent([""], name="empty"), ScriptedAgent(["<tool_call>{bad"], name="garbage"),
                          RandomAgent(seed)):
                record = _run(env, agent, seed)
                if not (0.0 <= record["reward"] < 1.0):
                    raise ConformanceError(f"agent {agent.name} scored {record['reward']} on seed {seed}")
                if record["termination"] == "env_error":
                    raise ConformanceError(f"agent {agent.name} triggered an env_error on seed {seed}")
    finally:
        env.close()
    return ""


def check_reward_range_and_truncation(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    env = _make(env_id, **kwargs)
    limit = env.spec.max_episode_steps if env.spec else None
    if not limit:
        env.close()
        raise ConformanceError("no max_episode_steps in the registry entry: episodes could run forever")
    try:
        for seed in seeds[:5]:
            env.reset(seed=seed)
            agent = RandomAgent(seed + 1)
            obs, info = env.reset(seed=seed)
            agent.reset(env.unwrapped, obs, info)
            for step in range(limit + 1):
                obs, reward, terminated, truncated, info = env.step(agent(obs, info))
                if not 0.0 <= reward <= 1.0:
                    raise ConformanceError(f"reward {reward} outside [0, 1] (seed {seed}, step {step})")
                if terminated or truncated:
                    break
            else:
                raise ConformanceError(f"episode did not end within max_episode_steps={limit} (seed {seed})")
    finally:
        env.close()
    return f"max_episode_steps={limit}"


def check_close(env_id: str, kwargs: dict, seeds: list[int]) -> str:
    env = _make(env_id, **kwargs)
    env.reset(seed=seeds[0])
    env.close()
    env.close()  # idempotent
    leftover = getattr(env.unwrapped, "open_resources", lambda: [])()
    if leftover:
        raise ConformanceError(f"close() left resources open: {leftover}")
    return ""


CHECKS: list[tuple[str, Callable[[str, dict, list[int]], str]]] = [
    ("gymnasium check_env", check_gymnasium_api),
    ("seed determinism", check_determinism),
    ("different seeds differ", check_seeds_differ),
    ("oracle scores 1.0", check_oracle),
    ("bad actions never crash, score < 1", check_bad_actions),
    ("reward range and truncation", check_reward_range_and_truncation),
    ("close frees resources", check_close),
]


#: Seeds checked by default; environments that start containers (``requires: [docker]``) get fewer,
#: since each of their episodes costs seconds rather than milliseconds.
DEFAULT_SEEDS = 20
SANDBOXED_SEEDS = 4


def check_trace_env(env_id: str, *, n_seeds: int | None = None, env_kwargs: dict | None = None,
                    only: list[str] | None = None, seeds: list[int] | None = None) -> CheckReport:
    """Run every conformance check on ``env_id`` and return a report (``report.raise_if_failed()``).

    Args:
        env_id: a registered id, e.g. ``"trace/tau_airline-v0"``.
        n_seeds: how many seeds the oracle and seed checks use (default: 20, or 4 for
            environments whose registry entry requires docker).
        env_kwargs: extra keyword arguments for ``gym.make``.
        only: run only the checks with these names.
        seeds: check these seeds instead of ``range(n_seeds)`` (admission draws them from the whole range).
    """
    from .registry import get_entry  # the ids are registered: importing trace_envs (this package) did it

    if n_seeds is None and not seeds:
        try:
            sandboxed = "docker" in get_entry(env_id).requires
        except KeyError:
            sandboxed = False
        n_seeds = SANDBOXED_SEEDS if sandboxed else DEFAULT_SEEDS
    seeds = list(seeds) if seeds else list(range(n_seeds))
    report = CheckReport(env_id)
    for name, fn in CHECKS:
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        try:
            detail = fn(env_id, dict(env_kwargs or {}), seeds)
            report.results.append(CheckResult(name, True, detail, time.perf_counter() - t0))
        except Exception as exc:  # collect every failure, not just the first
            detail = str(exc) if isinstance(exc, AssertionError) else traceback.format_exc(limit=4)
            report.results.append(CheckResult(name, False, detail, time.perf_counter() - t0))
    return report
