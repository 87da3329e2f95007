"""The per-rollout MCP tool server of a TRACE task (verifiers starts it as ``python -m verifiers_trace.toolset``).

It holds the rollout's TRACE env, built by TRACE's TRL adapter
(:func:`trace_envs.adapters.trl.environment_factory`): one tool per env tool with the env's
own JSON schema, plus ``send_message_to_user``; each call steps the real env, exactly as a
TRL rollout does. The arguments reach the env as the model sent them (the env answers a bad
call with its own error, which costs the episode a turn as in-process), so MCP's own
argument validation is bypassed. After every call the env's view (done, reward, breakdown,
termination, transcript) is pushed to the rollout's state.
"""

from __future__ import annotations

import copy
import inspect
from typing import Any

from mcp.server.mcpserver.utilities.func_metadata import FuncMetadata

import verifiers.v1 as vf

from trace_envs.adapters.trl import USER_TOOL, TraceTRLEnvironment, environment_factory
from verifiers_trace.taskset import TraceData, TraceState


class TraceToolsetConfig(vf.ToolsetConfig):
    pass


class _ArgumentsAsSent(FuncMetadata):
    """Pass a call's arguments through unvalidated: the TRACE env validates them itself."""

    async def call_fn_with_arg_validation(self, fn, fn_is_async, arguments_to_validate, arguments_to_pass_directly,
                                          pre_validated=None):
        return await fn(dict(arguments_to_validate or {}))


def call_tool(episode: TraceTRLEnvironment, name: str, arguments: dict[str, Any]) -> str:
    """Play one tool call of the model on the episode and return the text the model gets back."""
    if name == USER_TOOL:
        if set(arguments) != {"message"}:
            return f"Error: {USER_TOOL} takes one argument, 'message' (got {sorted(arguments)})."
        return episode.send_message_to_user(arguments["message"])
    return getattr(episode, name)(**arguments)


class TraceToolset(vf.Toolset[TraceToolsetConfig, TraceState]):
    TOOL_PREFIX = None  # the model sees the env's tool names as they are

    def __init__(self, config: TraceToolsetConfig) -> None:
        super().__init__(config)
        self.episode: TraceTRLEnvironment | None = None
        self.schemas: list[dict] = []

    async def setup_task(self, task: TraceData) -> None:
        factory = environment_factory(task.env_id, probe_seed=task.seed, **task.env_kwargs)
        self.episode = factory()
        self.episode.reset(seed=task.seed)
        user = {"type": "function", "function": {
            "name": USER_TOOL, "description": inspect.cleandoc(factory.send_message_to_user.__doc__ or ""),
            "parameters": {"type": "object", "properties": {"message": {
                "type": "string", "description": "the text of the message to the user."}}, "required": ["message"]}}}
        self.schemas = [*factory.tool_schemas, user]

    def register(self, mcp) -> None:
        for schema in self.schemas:
            function = schema["function"]
            name = function["name"]
            mcp.add_tool(self._with_state(self._tool(name)), name=name,
                         description=function.get("description") or None, structured_output=False)
            tool = mcp._tool_manager.get_tool(name)
            tool.parameters = copy.deepcopy(function.get("parameters") or {"type": "object", "properties": {}})
            tool.fn_metadata = _ArgumentsAsSent.model_construct(**dict(tool.fn_metadata))

    def _tool(self, name: str):
        def play(arguments: dict) -> str:
            result = call_tool(self.episode, name, arguments)
            self._report()
            return result

        play.__name__ = name
        return play

    def _report(self) -> None:
        episode, state = self.episode, self.state
        state.done = episode.done
        state.reward = episode.reward
        state.reward_breakdown = episode.reward_breakdown
        state.termination = episode.termination
        state.steps = len([m for m in episode.messages if m["role"] == "assistant"])
        state.messages = episode.messages


if __name__ == "__main__":
    TraceToolset.run()
