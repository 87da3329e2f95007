"""Reference agents: the ground truth for tests, calibration and the analysis stage.

An agent is any callable ``agent(observation, info) -> action``. Agents that
need the episode's hidden task (the oracle and planted-deficit agents) also
define ``reset(env, observation, info)``, which :func:`trace_envs.rollout`
calls after each ``env.reset``; ``env`` is the unwrapped :class:`TraceEnv`.

This module holds the family-independent agents; each environment family
adds its own planted-deficit agents (e.g. ``trace_envs.domains.agents``) and
registers them by name with :func:`register_agent`, so the CLI can say
``--agent oracle`` or ``--agent tau:skip_precondition``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Protocol, runtime_checkable

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
        from .core.conversation import hermes_tool_call

        choice = int(self.rng.integers(4))
        tools = getattr(self, "tools", None) or [t["function"]["name"] for t in info.get("tools", [])]
        if choice == 0 or not tools:
            return "".join(chr(int(c)) for c in self.rng.integers(32, 127, size=int(self.rng.integers(1, 40))))
        if choice == 1:
            return "I am not sure. Could you tell me more?"
        name = tools[int(self.rng.integers(len(tools)))]
        args = {} if choice == 2 else {"id": str(self.rng.integers(1000)), "value": int(self.rng.integers(10))}
        return hermes_tool_call(name, args)


_AGENT_FACTORIES: dict[str, Callable[..., Any]] = {}
# Family modules that register more agents when imported (kept lazy so `import trace_envs` stays light).
_AGENT_MODULES: list[str] = ["trace_envs.domains.agents"]


def register_agent(name: str, factory: Callable[..., Any]) -> None:
    """Make an agent constructible by name (``make_agent(name)``, ``--agent name`` in the CLI)."""
    _AGENT_FACTORIES[name] = factory


def register_agent_module(module: str) -> None:
    """Declare a module whose import registers more agents."""
    if module not in _AGENT_MODULES:
        _AGENT_MODULES.append(module)


def _load_agent_modules() -> None:
    for module in _AGENT_MODULES:
        importlib.import_module(module)


def agent_names() -> list[str]:
    _load_agent_modules()
    return sorted(_AGENT_FACTORIES)


def make_agent(name: str, **kwargs: Any) -> Any:
    """Build a registered agent by name."""
    _load_agent_modules()
    if name not in _AGENT_FACTORIES:
        raise KeyError(f"unknown agent {name!r}. Known agents: {', '.join(sorted(_AGENT_FACTORIES))}")
    return _AGENT_FACTORIES[name](**kwargs)


register_agent("oracle", OracleAgent)
register_agent("random", RandomAgent)
register_agent_module("trace_envs.swe.agents")  # SWE planted-deficit agents (lazy: no docker/libcst at import)
