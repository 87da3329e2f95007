"""TRACE environments: a suite of Gymnasium environments for training LLM agents.

``import trace_envs`` registers every environment in ``registry.yaml`` (and in
the workspace registries named by ``TRACE_REGISTRY``) with Gymnasium::

    import gymnasium as gym
    import trace_envs

    env = gym.make("trace/tau_airline-v0")
    obs, info = env.reset(seed=0)

Importing this package never imports torch, transformers or docker.
"""

from .agents import OracleAgent, RandomAgent, ScriptedAgent, make_agent, register_agent
from .core import (
    EnvEntry,
    EnvError,
    RegistryError,
    ToolError,
    TraceEnv,
    UnicodeText,
    get_entry,
    load_registry,
    registered,
    tool,
)
from .core.checker import check_trace_env
from .core.registry import latest_capability_id, load_default_registries
from .rollout import rollout

__version__ = "0.1.0"

load_default_registries()

__all__ = [
    "EnvEntry", "EnvError", "OracleAgent", "RandomAgent", "RegistryError", "ScriptedAgent", "ToolError", "TraceEnv",
    "UnicodeText", "check_trace_env", "get_entry", "latest_capability_id", "load_registry", "make_agent",
    "register_agent", "registered",
    "rollout", "tool",
]
