"""Episodes: the agent interface, the family-independent reference agents and :func:`rollout`.

They sit in ``core`` because the conformance checker and the sandboxed worker play episodes too, and ``core``
imports nothing above it (docs/design.md, "Layout"). ``trace_envs.agents`` adds the agent registry and the
families' planted-deficit agents; ``trace_envs.rollout`` is :func:`rollout`. An agent is any callable
``agent(observation, info) -> action``; agents that need the episode's hidden task also define
``reset(env, observation, info)``, which :func:`rollout` calls after each ``env.reset``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np


@runtime_checkable
class Agent(Protocol):
    """The agent interface shared by scripted, model-backed and human agents."""

    name: str

    def __call__(self, observation: str, info: dict) -> Any: ...


class OracleAgent:
    """Plays the environment's own oracle, which earns reward 1.0 on every seed."""

    name = "oracle"

    def __init__(self) -> None:
        self._policy: Callable | None = None

    def reset(self, env: Any, observation: str, info: dict) -> None:
        self._policy = env.oracle()

    def __call__(self, observation: str, info: dict) -> Any:
        if self._policy is None:
            raise RuntimeError("OracleAgent.reset(env, ...) must be called after env.reset (rollout() does this)")
        return self._policy(observation, info)


class ScriptedAgent:
    """Replays a fixed list of actions (then repeats the last one)."""

    def __init__(self, actions: list[Any], name: str = "scripted") -> None:
        if not actions:
            raise ValueError("ScriptedAgent needs at least one action")
        self.actions, self.name, self._i = list(actions), name, 0

    def reset(self, env: Any, observation: str, info: dict) -> None:
        self._i = 0

    def __call__(self, observation: str, info: dict) -> Any:
        action = self.actions[min(self._i, len(self.actions) - 1)]
        self._i += 1
        return action


class RandomAgent:
    """Random turns: garbage text, messages, and tool calls with random or empty arguments.

    A baseline that must never crash an environment and should score near 0.
    """

    name = "random"

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def reset(self, env: Any, observation: str, info: dict) -> None:
        self.tools = [t["function"]["name"] for t in info.get("tools", [])]

    def __call__(self, observation: str, info: dict) -> Any:
        from .conversation import hermes_tool_call

        choice = int(self.rng.integers(4))
        tools = getattr(self, "tools", None) or [t["function"]["name"] for t in info.get("tools", [])]
        if choice == 0 or not tools:
            return "".join(chr(int(c)) for c in self.rng.integers(32, 127, size=int(self.rng.integers(1, 40))))
        if choice == 1:
            return "I am not sure. Could you tell me more?"
        name = tools[int(self.rng.integers(len(tools)))]
        args = {} if choice == 2 else {"id": str(self.rng.integers(1000)), "value": int(self.rng.integers(10))}
        return hermes_tool_call(name, args)


def rollout(env: str | gym.Env, agent: Any, seed: int | None = None, *, max_steps: int | None = None,
            options: dict | None = None, env_kwargs: dict | None = None) -> dict:
    """Run ``agent`` for one episode of ``env`` and return the trajectory record.

    Args:
        env: a registered id (``"trace/tau_airline-v0"``) or an env made by ``gym.make``.
            An env made here is closed at the end; one passed in is left open.
        agent: a callable ``(observation, info) -> action``; its ``reset(env, obs, info)``
            is called after ``env.reset`` when it has one.
        seed: the episode seed (the task is a pure function of it).
        max_steps: a step cap for envs without ``max_episode_steps`` (default 200).
        options: passed to ``env.reset``.
        env_kwargs: passed to ``gym.make`` when ``env`` is an id.

    Returns:
        A dict with ``env_id``, ``seed``, ``agent``, ``task`` (the env's ``task_info()``: scenario,
        needs, ...), ``messages``, ``tools``, ``reward``,
        ``reward_breakdown``, ``success``, ``termination``, ``steps`` and ``timing``.
    """
    owns_env = isinstance(env, str)
    if owns_env:  # the ids are registered: ``trace_envs``, this module's package, registered them on import
        env = gym.make(env, **(env_kwargs or {}))
    try:
        env_id = env.spec.id if env.spec is not None else type(env.unwrapped).__name__
        cap = max_steps or (env.spec.max_episode_steps if env.spec and env.spec.max_episode_steps else 200)
        t0 = time.perf_counter()
        obs, info = env.reset(seed=seed, options=options)
        t_reset = time.perf_counter() - t0
        task = env.unwrapped.task_info() if hasattr(env.unwrapped, "task_info") else {}
        if hasattr(agent, "reset"):
            agent.reset(env.unwrapped, obs, info)
        total, steps, agent_s, env_s = 0.0, 0, 0.0, 0.0
        terminated = truncated = False
        while not (terminated or truncated) and steps < cap:
            t1 = time.perf_counter()
            action = agent(obs, info)
            t2 = time.perf_counter()
            obs, reward, terminated, truncated, info = env.step(action)
            env_s += time.perf_counter() - t2
            agent_s += t2 - t1
            total += float(reward)
            steps += 1
        if terminated:
            termination = info.get("termination") or "terminated"
        else:
            termination = "max_steps"
        return {
            "env_id": env_id,
            "seed": seed,
            "agent": getattr(agent, "name", type(agent).__name__),
            "task": task,
            "messages": info.get("messages", []),
            "tools": info.get("tools", []),
            "reward": total,
            "reward_breakdown": info.get("reward_breakdown", {}),
            "success": bool(info.get("success", False)) if terminated else False,
            "termination": termination,
            "steps": steps,
            "timing": {"reset_s": t_reset, "env_s": env_s, "agent_s": agent_s,
                       "wall_s": time.perf_counter() - t0},
        }
    finally:
        if owns_env:
            env.close()


__all__ = ["Agent", "OracleAgent", "RandomAgent", "ScriptedAgent", "rollout"]
