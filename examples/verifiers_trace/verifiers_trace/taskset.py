"""TRACE environments as a verifiers (v1) taskset: seeds as tasks, env tools as native tool calls.

One task per seed of one registered TRACE id. A rollout's tools are served by
:class:`~verifiers_trace.toolset.TraceToolset`, a per-rollout MCP server that holds the
TRACE env of that seed (through TRACE's TRL adapter, the project's one env-side
tool mechanism); its rubric is one reward, ``trace_reward``: the TRACE env's own
verifiable reward for the episode (0 when the episode did not terminate, as in
``trace_envs.rollout``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gymnasium as gym
from pydantic import Field, field_validator

import verifiers.v1 as vf
from verifiers.v1.harnesses.null import NullHarnessConfig

import trace_envs  # noqa: F401 - registers the env ids with gymnasium
from trace_envs.core.registry import get_entry

#: The taskset id verifiers imports (the package name).
TASKSET_ID = "verifiers_trace"


class TraceData(vf.TaskData):
    """One task: a TRACE env id, a seed and the env's ``gym.make`` kwargs."""

    env_id: str
    seed: int
    env_kwargs: dict[str, Any] = Field(default_factory=dict)


class TraceState(vf.State):
    """What the tool server reports back to the host after each call (the env's view)."""

    done: bool = False
    reward: float | None = None
    reward_breakdown: dict[str, Any] = Field(default_factory=dict)
    termination: str | None = None
    steps: int = 0
    messages: list[dict[str, Any]] = Field(default_factory=list)
    """The TRACE env's own transcript of the episode (OpenAI format)."""


class TraceTasksetConfig(vf.TasksetConfig):
    id: vf.ID = TASKSET_ID
    env_id: str = "trace/tau_airline-v0"
    """A registered TRACE id (workspace ids need ``TRACE_REGISTRY`` set for vf-eval)."""
    seeds: list[int] = Field(default_factory=lambda: list(range(8)))
    """The task seeds, one task each (an integer ``n`` means ``range(n)``)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """``gym.make`` kwargs of the env (they override the registry's)."""

    @field_validator("seeds", mode="before")
    @classmethod
    def _count_means_range(cls, value: Any) -> Any:
        return list(range(value)) if isinstance(value, int) and not isinstance(value, bool) else value


class TraceTask(vf.Task[TraceData, TraceState]):
    """A seed of a TRACE env. Tools: the env's, plus ``send_message_to_user``."""

    @classmethod
    def toolsets(cls, config: vf.TaskConfig) -> list[vf.Toolset]:
        from verifiers_trace.toolset import TraceToolset, TraceToolsetConfig

        return [TraceToolset(TraceToolsetConfig())]

    async def validate(self, runtime: vf.Runtime) -> bool | None:
        """The gold check (``vf-validate``): TRACE's oracle solves this seed with reward 1.0."""
        from trace_envs import OracleAgent, rollout

        record = rollout(self.data.env_id, OracleAgent(), seed=self.data.seed, env_kwargs=self.data.env_kwargs)
        return record["reward"] == 1.0

    @vf.stop
    def episode_over(self, trace: vf.Trace) -> bool:
        """End the rollout once the TRACE env ended the episode (later calls could only be refused)."""
        return trace.state.done

    @vf.reward
    async def trace_reward(self, trace: vf.Trace) -> float:  # verifiers awaits every reward
        """The TRACE env's reward; 0 for an episode that did not terminate."""
        state = trace.state
        # traces.jsonl keeps info, not state: record the env's own account of the episode there.
        trace.info["trace_env"] = {
            "env_id": self.data.env_id, "seed": self.data.seed, "done": state.done,
            "reward": state.reward, "reward_breakdown": state.reward_breakdown,
            "termination": state.termination, "steps": state.steps, "messages": state.messages,
        }
        return float(state.reward) if state.reward is not None else 0.0


def _prompt(messages: list[dict]) -> tuple[str | None, str | list[dict]]:
    """The env's opening as (system prompt, prompt): TRACE opens with its policy, then the user."""
    system = None
    if messages and messages[0]["role"] == "system":
        system, messages = messages[0].get("content") or "", messages[1:]
    if len(messages) == 1 and messages[0]["role"] == "user":
        return system, messages[0].get("content") or ""
    return system, [{"role": m["role"], "content": m.get("content") or ""} for m in messages]


class TraceTaskset(vf.Taskset[TraceTask, TraceTasksetConfig]):
    """The seeds of one TRACE env id, each task opening with the env's own system prompt and user turn."""

    def load(self) -> Iterator[TraceTask]:
        config = self.config
        get_entry(config.env_id)  # a clear error for an unknown id
        env = gym.make(config.env_id, **config.env_kwargs)
        try:
            for seed in config.seeds:
                _, info = env.reset(seed=seed)
                system, prompt = _prompt(info.get("messages") or [])
                yield TraceTask(TraceData(id=f"{config.env_id}#{seed}", name=f"{config.env_id}#{seed}",
                                          prompt=prompt, system_prompt=system, env_id=config.env_id,
                                          seed=seed, env_kwargs=config.env_kwargs), config.task)
        finally:
            env.close()


class TraceEnvConfig(vf.SingleAgentEnvConfig):
    """Defaults that need nothing remote: the plain chat harness (``null``: chat completions plus
    MCP tools), run as a local subprocess."""

    agent: vf.AgentConfig = vf.AgentConfig(harness=NullHarnessConfig(id="null"), runtime=vf.SubprocessConfig(),
                                           max_turns=32)


class TraceEnv(vf.Env[TraceEnvConfig]):
    """One agent playing the taskset's tasks (the single-agent env, with local defaults)."""

    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        await agents.agent.run(task)


def load_environment(env_id: str = "trace/tau_airline-v0", seeds: int | list[int] = 8, **env_kwargs: Any) -> TraceEnv:
    """A verifiers environment playing ``env_id`` on ``seeds`` (``env_kwargs`` go to ``gym.make``)."""
    config = TraceEnvConfig(taskset=TraceTasksetConfig(env_id=env_id, seeds=seeds, env_kwargs=env_kwargs))
    return vf.load_environment(config)
