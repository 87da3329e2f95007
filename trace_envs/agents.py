"""Reference agents: the ground truth for tests, calibration and the analysis stage.

An agent is any callable ``agent(observation, info) -> action``. Agents that
need the episode's hidden task (the oracle and planted-deficit agents) also
define ``reset(env, observation, info)``, which :func:`trace_envs.rollout`
calls after each ``env.reset``; ``env`` is the unwrapped :class:`TraceEnv`.

The family-independent agents are defined in :mod:`trace_envs.core.episode` and named here; each environment family
adds its own planted-deficit agents (e.g. ``trace_envs.domains.agents``) and
registers them by name with :func:`register_agent`, so the CLI can say
``--agent oracle`` or ``--agent tau:skip_precondition``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable


from .core.episode import Agent, OracleAgent, RandomAgent, ScriptedAgent  # noqa: F401 - the public names

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
