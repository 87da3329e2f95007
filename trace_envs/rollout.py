"""``rollout``: run one episode and return its trajectory record (docs/design.md, "Trajectories")."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


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
    if owns_env:
        import trace_envs  # noqa: F401 - registers the ids

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
