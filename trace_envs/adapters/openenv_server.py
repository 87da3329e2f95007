"""``trace serve``: any registered TRACE env id over OpenEnv's HTTP and WebSocket API.

Built on the ``openenv`` package (PyPI ``openenv``, 0.10): :class:`TraceOpenEnv` is an
``openenv`` ``MCPEnvironment`` (itself an ``Environment[Action, Observation, State]``) and the
app comes from ``openenv``'s own factory, ``create_app``, so the wire protocol is OpenEnv's:
``WS /ws`` (one env per connection: ``reset`` / ``step`` / ``state`` / ``mcp`` / ``close``
messages), ``POST /mcp`` (JSON-RPC ``tools/list`` / ``tools/call``, with
``openenv/session/create`` for a session kept across HTTP requests), ``/health``,
``/schema``, ``/metadata``. This module adds only what a shared server needs around it:
the limits (sessions, idle time, message size), an optional bearer token, container cleanup
at shutdown and ``GET /trace/stats`` (live sessions and envs, for tests and operators).

One server serves every registered id (built-in, ``TRACE_REGISTRY``, a workspace of
generated envs). A session picks its env at reset::

    {"type": "reset", "data": {"env_id": "trace/tau_airline-v0", "seed": 3,
                               "env_kwargs": {"user": "scripted"}}}

(keys other than ``env_id``, ``seed``, ``episode_id``, ``options``, ``env_kwargs`` and
``transcript`` are env kwargs as well). Observations (:class:`TraceObservation`) carry the new
``text``; the transcript (OpenAI format) as a delta: ``new_messages``, the messages from index
``messages_from`` on (the client keeps ``transcript[:messages_from] + new_messages``), with the
whole transcript in ``messages`` at reset; the episode's tool schemas (``tool_schemas``, OpenAI
function format: not ``tools``, which OpenEnv's MCP client reads as an MCP tool list) at reset and
when they change; ``reward`` (0 until the last step), ``done``, ``reward_breakdown``, ``success``,
``termination``; every other key of the env's ``info`` is in ``metadata``. A session reset with
``"transcript": "full"`` (or a server started with ``--transcript full``) gets ``messages`` and
``tool_schemas`` whole on every step instead. :class:`TraceEnvClient` rebuilds the whole transcript
either way, so its observations always carry all of ``messages`` and ``tool_schemas``.

Actions (:class:`TraceAction`) come in two forms:

* ``{"message": <assistant message>}``: what TRACE's own agents send: text, a Hermes
  ``<tool_call>`` string, or an OpenAI message dict with ``tool_calls``; read by the env's
  one parser (:mod:`trace_envs.core.parsing`), so malformed calls cost the agent a turn exactly
  as in-process;
* MCP: ``{"type": "call_tool", "tool_name": ..., "arguments": {...}}`` and
  ``{"type": "list_tools"}`` (what OpenEnv's ``MCPToolClient`` sends), or JSON-RPC
  ``tools/call`` over ``/mcp`` or a WS ``mcp`` message. There is one MCP tool per env tool
  (the env's own schema as ``inputSchema``) plus ``send_message_to_user(message)``, which
  sends a message to the simulated user and returns the reply. A JSON-RPC tool result carries
  ``done``, ``reward`` and ``reward_breakdown`` in its ``_meta``.

Importing :mod:`trace_envs` never imports this module; this module imports ``openenv`` (and
through it fastapi) at import time and says what to install when it is missing.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from typing import Any, Dict, List, Literal, Optional, Sequence, Union

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
    from openenv.core.env_server import MCPEnvironment, create_app
    from openenv.core.env_server.mcp_types import (
        RESERVED_TOOL_NAMES,
        CallToolObservation,
        ListToolsObservation,
        Tool as MCPTool,
    )
    from openenv.core.env_server.types import (
        Action,
        ConcurrencyConfig,
        EnvironmentMetadata,
        Observation,
        State,
    )
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(f"`trace serve` needs the openenv package ({exc}). Fix: pip install 'trace-rl[serve]'") from exc

import mcp.types as mcp_types
from fastmcp import FastMCP
from fastmcp.client.client import CallToolResult
from fastmcp.tools.base import Tool as FastMCPTool, ToolResult
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

import gymnasium as gym

import trace_envs  # noqa: F401 - registers the env ids with gymnasium
from trace_envs.core.conversation import USER_TOOL, unwrap_tool_response as _unwrap_tool_response
from trace_envs.core.parsing import parse_action
from trace_envs.core.registry import get_entry, registered

logger = logging.getLogger(__name__)

#: Defaults of ``trace serve`` (also the keyword defaults of :func:`build_app`).
DEFAULT_MAX_SESSIONS = 64
DEFAULT_IDLE_TIMEOUT_S = 600.0
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
TOKEN_ENV_VAR = "TRACE_SERVE_TOKEN"
#: Reset keys that are not env kwargs.
_RESET_KEYS = {"seed", "episode_id", "env_id", "env_kwargs", "options", "transcript"}
#: What an observation carries of the transcript (a reset's ``transcript`` key, ``trace serve --transcript``).
TRANSCRIPT_MODES = ("delta", "full")


# ----------------------------------------------------------------------------- wire models


class TraceAction(Action):
    """One assistant turn: a full assistant message, or an MCP tool call / tool listing."""

    type: Literal["message", "call_tool", "list_tools"] = Field(
        default="message", description="'message' (the default), or the MCP forms 'call_tool' / 'list_tools'")
    message: Union[str, Dict[str, Any], None] = Field(
        default=None, description="the assistant message: text, a Hermes <tool_call> string, or an OpenAI "
                                  "message dict {'role': 'assistant', 'content': ..., 'tool_calls': [...]}")
    tool_name: Optional[str] = Field(default=None, description="MCP: the tool to call (an env tool or "
                                                                f"{USER_TOOL!r})")
    arguments: Dict[str, Any] = Field(default_factory=dict, description="MCP: the tool's arguments")

    @model_validator(mode="after")
    def _complete(self) -> "TraceAction":
        # PydanticCustomError, not ValueError: OpenEnv sends e.errors() to the client as JSON, and a ValueError
        # in an error's ctx cannot be serialized (the session would end with SESSION_ERROR).
        if self.type == "message" and self.message is None:
            raise PydanticCustomError("trace_action", "a 'message' action needs the assistant message in 'message' (text or an OpenAI "
                             "assistant message dict); an MCP tool call is {'type': 'call_tool', 'tool_name': "
                             "..., 'arguments': {...}}")
        if self.type == "call_tool" and not self.tool_name:
            raise PydanticCustomError("trace_action", "a 'call_tool' action needs 'tool_name'")
        return self


class TraceObservation(Observation):
    """What the agent sees after a reset or a step (``reward`` and ``done`` come from ``Observation``)."""

    text: str = Field(default="", description="what the agent sees new this turn")
    messages: List[Dict[str, Any]] = Field(default_factory=list, description=(
        "the whole transcript, OpenAI format: at reset, and on every step with transcript 'full' (empty on a "
        "step with transcript 'delta', the default)"))
    new_messages: List[Dict[str, Any]] = Field(default_factory=list, description=(
        "the transcript from index messages_from on: the transcript is now transcript[:messages_from] + "
        "new_messages"))
    messages_from: int = Field(default=0, description="where new_messages starts in the transcript (0 at reset)")
    tool_schemas: List[Dict[str, Any]] = Field(default_factory=list, description=(
        "the episode's tools (OpenAI function schemas): at reset and when they change (every step with "
        "transcript 'full'); empty: unchanged"))
    env_id: Optional[str] = None
    seed: Optional[int] = None
    reward_breakdown: Optional[Dict[str, Any]] = None
    success: Optional[bool] = None
    termination: Optional[str] = None


class TraceToolObservation(CallToolObservation):
    """The answer to an MCP ``call_tool`` step: OpenEnv's tool observation plus TRACE's episode fields."""

    text: str = ""
    messages: List[Dict[str, Any]] = Field(default_factory=list)
    new_messages: List[Dict[str, Any]] = Field(default_factory=list)
    messages_from: int = 0
    tool_schemas: List[Dict[str, Any]] = Field(default_factory=list)
    reward_breakdown: Optional[Dict[str, Any]] = None
    success: Optional[bool] = None
    termination: Optional[str] = None


class TraceState(State):
    """The session's episode: which env, which seed, how far, and how it ended."""

    # The server sets these fields itself, with values of the right types, several times a step: OpenEnv's
    # State validates every assignment, which is a cost with nothing to catch here.
    model_config = ConfigDict(**{**State.model_config, "validate_assignment": False})

    env_id: Optional[str] = None
    seed: Optional[int] = None
    done: bool = False
    reward: Optional[float] = None
    termination: Optional[str] = None


# ----------------------------------------------------------------------------- the environment


class ClientError(ValueError):
    """A client's mistake (an unknown env id, a step before reset, a bad argument): HTTP answers it with
    ``status`` (4xx) and the message, which names the fix; the WebSocket with an error frame. A ValueError, so
    OpenEnv's handlers treat it as they treat the env's own ValueErrors."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


#: What a step before reset over HTTP needs to know: the HTTP routes are stateless.
STATELESS_HTTP = ("HTTP POST /reset and /step are stateless (each request gets a fresh env, so a /step never follows "
                  "a /reset): play an episode over the WebSocket /ws, or an OpenEnv session over POST /mcp "
                  "(docs/serve.md, \"The protocol\")")


#: The client errors of the HTTP routes, as their OpenAPI schema documents them.
CLIENT_ERRORS = {
    "/reset": {400: "a bad argument (no env id, a kwarg the env does not take, a bad transcript mode)",
               404: "an env id that is not served here", 409: "the session has been closed"},
    "/step": {400: "a bad action", 409: "a step before reset (HTTP /step is stateless: see the message)"},
}


class ErrorDetail(BaseModel):
    """The body of a client error: what was wrong and how to fix it."""

    detail: str


class ServeConfig:
    """What a server allows (shared by all its sessions)."""

    def __init__(self, env_ids: Sequence[str] = (), default_env_id: str | None = None, transcript: str = "delta"):
        self.env_ids = tuple(env_ids)  # empty: every registered id
        self.default_env_id = default_env_id or (self.env_ids[0] if len(self.env_ids) == 1 else None)
        self.transcript = check_transcript(transcript)

    def check(self, env_id: str | None) -> str:
        env_id = env_id or self.default_env_id
        if not env_id:
            raise ClientError("reset needs 'env_id' (e.g. {'type': 'reset', 'data': {'env_id': "
                              "'trace/tau_airline-v0', 'seed': 0}}); served ids: " + self.served())
        if not isinstance(env_id, str):
            raise ClientError(f"'env_id' must be a string, got {type(env_id).__name__}")
        try:
            entry = get_entry(env_id)
        except KeyError:
            raise ClientError(f"unknown env id {env_id!r}; use one of the served ids: {self.served()}", 404) from None
        if self.env_ids and entry.id not in self.env_ids:
            raise ClientError(f"env id {env_id!r} is not served here; use one of the served ids: {self.served()}",
                              404)
        return entry.id

    def served(self) -> str:
        return ", ".join(self.env_ids or [e.id for e in registered()])


def check_transcript(mode: Any) -> str:
    """``mode`` if it names a transcript mode (``delta`` or ``full``), else a ValueError that says which do."""
    if mode not in TRANSCRIPT_MODES:
        raise ClientError(f"'transcript' must be one of {', '.join(map(repr, TRANSCRIPT_MODES))}, got {mode!r}")
    return mode


class _Live:
    """The server's live adapters (for ``/trace/stats``, the leak checks and closing everything at shutdown)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.adapters: set = set()

    def add(self, env: "TraceOpenEnv") -> None:
        with self.lock:
            self.adapters.add(env)

    def discard(self, env: "TraceOpenEnv") -> None:
        with self.lock:
            self.adapters.discard(env)

    def snapshot(self) -> list:
        with self.lock:
            return list(self.adapters)


class _EnvTool(FastMCPTool):
    """One MCP tool of a session: calls the session's env (its schema is the env's own)."""

    _owner: Any = PrivateAttr(default=None)

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        owner: TraceOpenEnv = self._owner
        # The env is synchronous (an SWE tool waits on a container): keep the event loop free.
        text, obs = await owner._run_step(owner._tool_call, self.name, dict(arguments or {}))
        meta = {"done": obs.done, "reward": obs.reward, "reward_breakdown": obs.reward_breakdown,
                "success": obs.success, "termination": obs.termination}
        return ToolResult(content=text, meta=meta)


class _DirectMCPClient:
    """The session's in-process MCP client: what OpenEnv's MCP routes call (``/mcp`` JSON-RPC, WS ``mcp``
    messages, ``step(CallToolAction)``), answering from the env directly.

    It stands in for ``fastmcp.Client(server)``, with the same results (``mcp.types.Tool`` lists,
    ``fastmcp`` ``CallToolResult``): the session's FastMCP server lists the same tools, but a call through
    FastMCP's in-memory transport costs about 1.5 ms, several times an env step (bench/serve_speed.py).
    """

    def __init__(self, owner: "TraceOpenEnv"):
        self._owner = owner

    async def __aenter__(self) -> "_DirectMCPClient":
        return self

    async def __aexit__(self, *exc) -> bool:
        return False

    def is_connected(self) -> bool:
        return True

    async def list_tools(self) -> list:
        return [mcp_types.Tool(name=t.name, description=t.description, inputSchema=t.input_schema)
                for t in self._owner._mcp_tools()]

    async def call_tool(self, name: str, arguments: dict | None = None, **_: Any) -> CallToolResult:
        owner = self._owner
        if owner._env is not None and name not in owner._tool_names:  # before a reset: _tool_call says so
            raise ClientError(f"unknown tool {name!r}; this episode's tools: " + ", ".join(owner._tool_names))
        text, obs = await owner._run_step(owner._tool_call, name, dict(arguments or {}))
        meta = {"done": obs.done, "reward": obs.reward, "reward_breakdown": obs.reward_breakdown,
                "success": obs.success, "termination": obs.termination}
        return CallToolResult(content=[mcp_types.TextContent(type="text", text=text)], structured_content=None,
                              meta=meta, data=text, is_error=False)


class TraceOpenEnv(MCPEnvironment):
    """An OpenEnv environment that hosts one TRACE gymnasium env per session (chosen at reset).

    Thread-safe for one session's calls (a lock serializes reset/step), so the WebSocket and the
    HTTP MCP route of one session may interleave.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: ServeConfig | None = None, live: _Live | None = None):
        super().__init__(FastMCP("trace"))
        self.mcp_client = _DirectMCPClient(self)
        self._config = config or ServeConfig()
        self._live = live
        self._lock = threading.RLock()
        self._env: gym.Env | None = None
        self._made: tuple | None = None
        self._state = TraceState()
        self._tool_names: list[str] = []
        self._info: dict = {}
        self._full = self._config.transcript == "full"
        # What the client holds: the transcript (references to the messages sent) and the tool schemas last sent.
        self._sent_messages: list = []
        self._sent_tools: Any = None
        self._inline = False  # steps run on the event loop (the env's nonblocking_step), not in a worker thread
        self._closed = False
        if live is not None:
            live.add(self)

    # ------------------------------------------------------------------ OpenEnv interface

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, env_id: Optional[str] = None,
              env_kwargs: Optional[dict] = None, options: Optional[dict] = None, transcript: Optional[str] = None,
              **kwargs: Any) -> TraceObservation:
        """Start an episode of ``env_id`` (the server's default when it serves one id) with ``seed``.

        ``transcript`` (``delta`` or ``full``; the server's default when not given) says what this episode's
        step observations carry of the transcript and the tool schemas (see :class:`TraceObservation`).
        """
        with self._lock:
            self._check_open()
            env_id = self._config.check(env_id)
            full = self._config.transcript == "full" if transcript is None else check_transcript(transcript) == "full"
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise ClientError(f"'seed' must be an integer, got {seed!r}")
            if env_kwargs is not None and not isinstance(env_kwargs, dict):
                raise ClientError(f"'env_kwargs' must be an object, got {type(env_kwargs).__name__}")
            if options is not None and not isinstance(options, dict):
                raise ClientError(f"'options' must be an object, got {type(options).__name__}")
            made_with = {**kwargs, **(env_kwargs or {})}
            key = (env_id, json.dumps(made_with, sort_keys=True, default=str))
            if self._env is None or self._made != key:
                self._close_env()
                try:
                    self._env = gym.make(env_id, **made_with)
                except (TypeError, ValueError) as exc:  # a kwarg it does not take, or a value it refuses
                    raise ClientError(f"{env_id} does not take these kwargs ({exc}); its registry kwargs: "
                                      f"{get_entry(env_id).kwargs}") from exc
                self._made = key
                self._inline = bool(getattr(self._env.unwrapped, "nonblocking_step", False))
            obs, info = self._env.reset(seed=seed, options=options)
            self._state = TraceState(episode_id=episode_id or str(uuid.uuid4()), step_count=0, env_id=env_id,
                                     seed=seed)
            self._info = info
            self._full, self._sent_messages, self._sent_tools = full, [], None
            self._sync_tools()
            return self._observation(obs, 0.0, False, info, reset=True)

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        if not isinstance(action, TraceAction):
            raise ClientError(f"expected a TraceAction, got {type(action).__name__}")
        if action.type == "list_tools":
            return ListToolsObservation(tools=self._mcp_tools())
        if action.type == "call_tool":
            text, obs = self._tool_call(action.tool_name or "", action.arguments)
            return TraceToolObservation(
                tool_name=action.tool_name or "", done=obs.done, reward=obs.reward, metadata=obs.metadata,
                result={"content": [{"type": "text", "text": text}], "structured_content": None, "data": text,
                        "is_error": False},
                text=obs.text, messages=obs.messages, new_messages=obs.new_messages,
                messages_from=obs.messages_from, tool_schemas=obs.tool_schemas, reward_breakdown=obs.reward_breakdown, success=obs.success, termination=obs.termination)
        return self._step_env(action.message)

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        """OpenEnv's WebSocket handler awaits this for every step. An env whose ``step`` neither blocks nor takes
        long (its ``nonblocking_step``, e.g. a τ² env with the scripted user) steps right here, on the event
        loop: handing a 0.05 ms step to a worker thread and back costs more than the step (docs/serve.md,
        "Speed"). Any other env steps in a worker thread, as OpenEnv does, so that the loop keeps serving."""
        if self._inline and isinstance(action, TraceAction):
            return self._step_impl(action, timeout_s=timeout_s, **kwargs)
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    async def _run_step(self, fn, *args: Any) -> Any:
        """``fn(*args)`` (a step of the env) on the event loop when the env's steps do not block, else in a thread."""
        if self._inline:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    @property
    def state(self) -> TraceState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("trace-rl")
        except PackageNotFoundError:
            v = "0"
        return EnvironmentMetadata(name="trace", version=v,
                                   description="TRACE environments (reset with env_id and seed); served ids: "
                                               + self._config.served())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._close_env()
        if self._live is not None:
            self._live.discard(self)
        super().close()

    # ------------------------------------------------------------------ internals

    @property
    def gym_env(self) -> gym.Env | None:
        return self._env

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError("this session has been closed (idle timeout or server shutdown); open a new one", 409)

    def _close_env(self) -> None:
        if self._env is not None:
            env, self._env, self._made, self._inline = self._env, None, None, False
            try:
                env.close()  # an SWE env removes its sandbox container here
            except Exception:
                logger.exception("closing %s failed", self._state.env_id)

    def _step_env(self, message: Any) -> TraceObservation:
        with self._lock:
            self._check_open()
            if self._env is None:
                raise ClientError("step before reset: send {'type': 'reset', 'data': {'env_id': ..., 'seed': ...}} "
                                  "first. " + STATELESS_HTTP, 409)
            if self._state.done:
                raise ClientError(f"this episode has ended (termination: {self._state.termination}); reset to "
                                  "start another", 409)
            obs, reward, terminated, truncated, info = self._env.step(message)
            self._state.step_count += 1
            done = bool(terminated or truncated)
            if truncated and not terminated:
                # Cut by the registry's max_episode_steps: an unfinished episode scores 0 (as trace_envs.rollout).
                info = {**info, "termination": "max_steps", "reward": 0.0, "success": False}
                reward = 0.0
            return self._observation(obs, float(reward), done, info)

    def _tool_call(self, name: str, arguments: dict) -> tuple[str, TraceObservation]:
        """One MCP tool call: an env tool as a tool-call turn, the reply tool as a message to the user."""
        if name == USER_TOOL:
            message = arguments.get("message")
            if not isinstance(message, str):
                raise ClientError(f"{USER_TOOL} takes {{'message': <text>}}")
            if parse_action(message).is_tool_call:
                raise ClientError(f"{USER_TOOL} sends plain text to the user, and this message is a tool call; "
                                 "call the tool directly")
            obs = self._step_env({"role": "assistant", "content": message})
            text = obs.text if obs.text or not obs.done else f"(The conversation has ended: {obs.termination}.)"
            return text, obs
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        obs = self._step_env({"role": "assistant", "content": "", "tool_calls": [call]})
        return _unwrap_tool_response(obs.text), obs

    def _observation(self, text: str, reward: float, done: bool, info: dict, reset: bool = False) -> TraceObservation:
        self._info = info
        if done:
            self._state.done, self._state.reward = True, float(info.get("reward", reward))
            self._state.termination = info.get("termination")
        else:
            self._state.done, self._state.reward, self._state.termination = False, None, None
        extra = {k: v for k, v in info.items()
                 if k not in ("messages", "tools", "reward", "reward_breakdown", "success", "termination")}
        breakdown = info.get("reward_breakdown")
        messages, tools = info.get("messages") or [], info.get("tools") or []
        # The transcript as a delta against what this client holds: what the env appended since the last
        # observation. Dumping and sending the whole transcript and the tool schemas on every step was most of
        # the server's work per step (docs/serve.md, "Speed"). A transcript that is not an extension of what
        # was sent (an env that rewrote its history) goes whole, from index 0.
        held = self._sent_messages
        start = len(held) if (not reset and len(messages) >= len(held) and messages[:len(held)] == held) else 0
        new = messages[start:] if start else messages
        self._sent_messages = list(messages)  # a copy: an env may keep appending to the list it returned
        if reset or self._full or (tools is not self._sent_tools and tools != self._sent_tools):
            self._sent_tools, send_tools = tools, tools
        else:
            send_tools = []
        # model_construct: the fields come from the env (already valid), and validating the whole transcript
        # again on every step costs more than the env's own step.
        return TraceObservation.model_construct(
            text=text, done=done, reward=reward, messages=messages if reset or self._full else [],
            new_messages=new, messages_from=start, tool_schemas=send_tools,
            env_id=self._state.env_id, seed=self._state.seed,
            reward_breakdown=_jsonable(breakdown) if breakdown is not None else None,
            success=info.get("success"), termination=info.get("termination"), metadata=_jsonable(extra))

    def _mcp_tools(self) -> list:
        return [MCPTool(name=t["function"]["name"], description=t["function"].get("description", ""),
                        input_schema=t["function"].get("parameters") or {"type": "object", "properties": {}})
                for t in self._mcp_schemas()]

    def _mcp_schemas(self) -> list[dict]:
        schemas = [t for t in (self._info.get("tools") or [])
                   if t.get("function", {}).get("name") not in RESERVED_TOOL_NAMES | {USER_TOOL}]
        schemas.append({"type": "function", "function": {
            "name": USER_TOOL, "description": "Send a message to the user and return the user's reply.",
            "parameters": {"type": "object", "properties": {"message": {"type": "string",
                                                                         "description": "the message"}},
                           "required": ["message"]}}})
        return schemas

    def _sync_tools(self) -> None:
        """Make the session's MCP server list exactly this episode's tools (plus the reply tool)."""
        names = [t["function"]["name"] for t in self._mcp_schemas()]
        if names == self._tool_names:
            return
        server = self._require_mcp_server()
        for name in self._tool_names:
            try:
                server.local_provider.remove_tool(name)
            except Exception:
                pass
        for schema in self._mcp_schemas():
            fn = schema["function"]
            tool = _EnvTool(name=fn["name"], description=fn.get("description", ""),
                            parameters=fn.get("parameters") or {"type": "object", "properties": {}})
            tool._owner = self
            server.add_tool(tool)
        self._tool_names = names


def _jsonable(value: Any) -> Any:
    """``value`` with numpy scalars and other odd leaves turned into JSON types (info dicts are small)."""
    if isinstance(value, (str, bool)) or value is None:
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_jsonable(v) for v in value]
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item):
        try:
            return _jsonable(item())
        except Exception:
            pass
    return str(value)


# ----------------------------------------------------------------------------- limits and token (ASGI)


class _Guard:
    """ASGI middleware: bearer token, message size limit and WebSocket idle timeout.

    Written against ASGI itself so that it wraps OpenEnv's routes without changing them: an
    oversized or idle WebSocket gets an OpenEnv-shaped error frame and a close, and OpenEnv's
    handler sees a disconnect, so it frees the session (and closes its env) as for any client
    that leaves.
    """

    def __init__(self, app, token: str | None, max_message_bytes: int, idle_timeout_s: float | None):
        self.app, self.token = app, token or None
        self.max_bytes, self.idle = int(max_message_bytes), idle_timeout_s

    def _authorized(self, scope) -> bool:
        if not self.token:
            return True
        for key, value in scope.get("headers") or []:
            if key == b"authorization":
                given = value.decode("latin-1")
                return given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), self.token)
        if scope["type"] == "websocket" or scope.get("path") == "/ui":
            # Browsers cannot set headers on a WebSocket or on the page they open: the playground uses ?token=
            from urllib.parse import parse_qs

            given = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("token", [""])[0]
            return bool(given) and hmac.compare_digest(given, self.token)
        return False

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            return await self._http(scope, receive, send)
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        return await self.app(scope, receive, send)

    @staticmethod
    async def _json_response(send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _http(self, scope, receive, send):
        if not self._authorized(scope):
            return await self._json_response(send, 401, "missing or wrong bearer token: send the header "
                                                        "'Authorization: Bearer <token>'")
        length = next((v for k, v in scope.get("headers") or [] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._json_response(send, 413, f"request body of {int(length)} bytes exceeds the limit of "
                                                        f"{self.max_bytes} bytes")
        if length is None and scope.get("method") in ("POST", "PUT", "PATCH"):
            # No length given (chunked): read the body up to the limit before the app sees it.
            chunks, size = [], 0
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    break
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
                if size > self.max_bytes:
                    return await self._json_response(send, 413, f"request body exceeds the limit of "
                                                                f"{self.max_bytes} bytes")
                if not message.get("more_body"):
                    break
            body, replayed = b"".join(chunks), False

            async def receive():  # noqa: F811 - replays the body that was read
                nonlocal replayed
                if not replayed:
                    replayed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return {"type": "http.disconnect"}

        return await self.app(scope, receive, send)

    async def _websocket(self, scope, receive, send):
        accepted = closed = False

        async def guarded_send(message):
            nonlocal accepted, closed
            if closed:  # we closed the socket already: the app's own close or error frame goes nowhere
                return
            if message["type"] == "websocket.accept":
                accepted = True
            elif message["type"] == "websocket.close":
                closed = True
            await send(message)

        async def refuse(code: int, error_code: str, text: str) -> dict:
            nonlocal accepted, closed
            if not closed:
                if not accepted:
                    await send({"type": "websocket.accept"})
                    accepted = True
                frame = {"type": "error", "data": {"message": text, "code": error_code}}
                await send({"type": "websocket.send", "text": json.dumps(frame)})
                await send({"type": "websocket.close", "code": code, "reason": text[:120]})
                closed = True
            return {"type": "websocket.disconnect", "code": code}

        if not self._authorized(scope):
            first = await receive()  # websocket.connect
            if first["type"] == "websocket.connect":
                await refuse(1008, "UNAUTHORIZED", "missing or wrong bearer token: send the header "
                                                   "'Authorization: Bearer <token>'")
            return

        async def guarded_receive():
            if closed:
                return {"type": "websocket.disconnect", "code": 1000}
            try:
                if self.idle and accepted:
                    # asyncio.timeout, not wait_for: wait_for wraps every receive in a new task (~10 µs a message).
                    async with asyncio.timeout(self.idle):
                        message = await receive()
                else:
                    message = await receive()
            except TimeoutError:
                return await refuse(4408, "IDLE_TIMEOUT", f"session closed after {self.idle:g} s without a message; "
                                                          "open a new connection")
            if message["type"] == "websocket.receive":
                data = message.get("text")
                size = len(data.encode("utf-8")) if data is not None and len(data) * 4 > self.max_bytes \
                    else (len(data) if data is not None else len(message.get("bytes") or b""))
                if size > self.max_bytes:
                    return await refuse(1009, "MESSAGE_TOO_LARGE", f"message of {size} bytes exceeds the limit of "
                                                                   f"{self.max_bytes} bytes")
            return message

        return await self.app(scope, guarded_receive, guarded_send)


# ----------------------------------------------------------------------------- the app


def build_app(env_ids: Sequence[str] = (), *, max_sessions: int = DEFAULT_MAX_SESSIONS,
              idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
              max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, token: str | None = None, ui: bool = False,
              transcript: str = "delta"):
    """The ASGI app of ``trace serve``: OpenEnv's ``create_app`` over :class:`TraceOpenEnv`, behind the guard.

    ``env_ids`` limits the ids a session may reset to (empty: every registered id; one id: also the
    default when reset names none). ``transcript`` is what a step's observation carries of the transcript
    when the session's reset does not say: ``delta`` (what is new) or ``full`` (see
    :class:`TraceObservation`). Returns the guarded ASGI app; the FastAPI app inside is its
    ``.fastapi`` attribute and the live adapters its ``.live`` (what ``/trace/stats`` counts).
    """
    if max_sessions < 1:
        raise ValueError(f"max_sessions must be at least 1, got {max_sessions}")
    config = ServeConfig(env_ids, transcript=transcript)
    for env_id in config.env_ids:
        config.check(env_id)  # an unknown id fails at start, not at the first reset
    live = _Live()
    factory = functools.partial(TraceOpenEnv, config, live)
    concurrency = ConcurrencyConfig(max_concurrent_envs=int(max_sessions), session_timeout=idle_timeout_s)
    # ENABLE_WEB_INTERFACE would swap in OpenEnv's Gradio UI; TRACE's playground is `--ui`.
    previous = os.environ.pop("ENABLE_WEB_INTERFACE", None)
    try:
        app = create_app(factory, TraceAction, TraceObservation, env_name="trace", concurrency_config=concurrency,
                         state_cls=TraceState, mode="simulation")
    finally:
        if previous is not None:
            os.environ["ENABLE_WEB_INTERFACE"] = previous
    started = time.time()

    async def client_error(request, exc: ClientError):
        # The client's mistake, not the server's: a 4xx whose message names the fix (OpenEnv's HTTP routes would
        # let the env's exception through as a 500 with a traceback in the log).
        from fastapi.responses import JSONResponse

        return JSONResponse(status_code=exc.status, content={"detail": str(exc)})

    app.add_exception_handler(ClientError, client_error)

    @app.middleware("http")
    async def strict_seed(request, call_next):
        # OpenEnv's ResetRequest reads `seed: false` as seed 0 (pydantic's lax mode); the schema says an integer.
        if request.method == "POST" and request.url.path == "/reset":
            try:
                seed = json.loads(await request.body()).get("seed")
            except (ValueError, AttributeError):  # not a JSON object: the route's validation answers it
                seed = None
            if isinstance(seed, bool):
                from fastapi.responses import JSONResponse

                return JSONResponse(status_code=422, content={"detail": [{
                    "type": "int_type", "loc": ["body", "seed"], "input": seed,
                    "msg": "Input should be a valid integer, not a boolean (the episode's seed, e.g. 0)"}]})
        return await call_next(request)
    # OpenEnv's Task API (/{env_name}/splits, /tasks, ...) needs splits of tasks that TRACE's seeded envs do not
    # have: it would answer every call with 501. Not offered, it is not in the schema either (a 404 names no route).
    app.router.routes[:] = [r for r in app.router.routes if not getattr(r, "path", "").startswith("/{env_name}/")]
    for route in app.router.routes:  # the schema names the client errors these routes answer (ClientError)
        if getattr(route, "path", None) in CLIENT_ERRORS:
            route.responses = {**route.responses, **{code: {"model": ErrorDetail, "description": what}
                                                     for code, what in CLIENT_ERRORS[route.path].items()}}
    app.openapi_schema = None

    @app.get("/trace/stats", tags=["TRACE"])
    def stats() -> dict:
        """Live sessions and envs of this server (what the leak checks count)."""
        adapters = live.snapshot()
        return {"sessions": len(adapters), "gym_envs": sum(a.gym_env is not None for a in adapters),
                "max_sessions": int(max_sessions), "idle_timeout_s": idle_timeout_s,
                "max_message_bytes": int(max_message_bytes), "transcript": config.transcript, "uptime_s": round(time.time() - started, 3),
                "env_ids": list(config.env_ids) or [e.id for e in registered()]}

    if ui:
        from trace_envs.adapters.playground import add_playground

        add_playground(app, config)

    def close_all(announce: bool = False) -> None:
        # At shutdown (SIGTERM/SIGINT): every session's env, so SWE containers go with the server.
        adapters = live.snapshot()
        for adapter in adapters:
            try:
                adapter.close()
            except Exception:
                logger.exception("closing a session at shutdown failed")
        if announce:
            import sys

            print(f"trace serve: stopped; closed {len(adapters)} open session(s)", file=sys.stderr, flush=True)

    app.router.on_shutdown.append(lambda: close_all(announce=True))

    guarded = _Guard(app, token, max_message_bytes, idle_timeout_s)
    guarded.fastapi, guarded.live, guarded.close_all = app, live, close_all
    return guarded


def serve(env_ids: Sequence[str] = (), *, host: str = "127.0.0.1", port: int = 8000,
          max_sessions: int = DEFAULT_MAX_SESSIONS, idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
          max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, token: str | None = None, ui: bool = False,
          ws_compression: bool = False, log_level: str = "info", transcript: str = "delta") -> None:
    """Run the server until SIGINT/SIGTERM (then every session's env is closed).

    ``ws_compression`` offers permessage-deflate to WebSocket clients (OpenEnv's client accepts it). Off by
    default: deflating costs the server CPU on every message to save bandwidth a local or cluster network
    does not need (with ``transcript="full"``, about 0.5 ms a step: several times an env step).
    """
    import uvicorn

    app = build_app(env_ids, max_sessions=max_sessions, idle_timeout_s=idle_timeout_s,
                    max_message_bytes=max_message_bytes, token=token, ui=ui, transcript=transcript)
    try:
        # The guard answers oversized messages itself; uvicorn's own cap only stops a flood beyond it.
        # Keep-alive beyond uvicorn's 5 s: a trainer's HTTP session may pause between steps while it generates.
        uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=max_message_bytes * 2 + 65536,
                    ws_ping_interval=20.0, ws_ping_timeout=20.0, timeout_keep_alive=75,
                    ws_per_message_deflate=ws_compression)
    finally:
        app.close_all()


# ----------------------------------------------------------------------------- the typed client


class TraceEnvClient(EnvClient[TraceAction, TraceObservation, TraceState]):
    """OpenEnv client of ``trace serve`` (an ``openenv`` ``EnvClient``: one WebSocket session)::

        with TraceEnvClient(base_url="http://127.0.0.1:8000").sync() as env:
            result = env.reset(env_id="trace/tau_airline-v0", seed=0)
            result = env.step(TraceAction(message="Hello!"))

    ``step`` also takes a plain assistant message (text or an OpenAI message dict). The server sends the
    transcript as a delta; this client rebuilds it, so every observation it returns carries the whole
    transcript in ``messages`` and the episode's tools in ``tool_schemas``, whatever the session's
    ``transcript`` mode.
    """

    _transcript: list = []
    _tools: list = []
    _resetting = False

    async def _reset_async(self, **kwargs: Any) -> StepResult[TraceObservation]:
        self._resetting = True  # _parse_result starts the transcript and the tools afresh
        try:
            return await super()._reset_async(**kwargs)
        finally:
            self._resetting = False

    def _step_payload(self, action: Any) -> Dict[str, Any]:
        if not isinstance(action, TraceAction):
            action = TraceAction(message=action)
        return action.model_dump(exclude_defaults=True) or {"message": action.message}

    def _parse_result(self, payload: Dict[str, Any]) -> StepResult[TraceObservation]:
        data = dict(payload.get("observation") or {})
        data = {k: v for k, v in data.items() if k in TraceObservation.model_fields}
        messages, new, start = data.get("messages"), data.get("new_messages") or [], data.get("messages_from") or 0
        if self._resetting or messages:  # a reset, or a step of a session with transcript 'full'
            self._transcript = list(messages or [])
        else:
            if start > len(self._transcript):
                raise RuntimeError(f"the server sent the transcript from message {start} on, and this client holds "
                                   f"{len(self._transcript)} messages")
            self._transcript = self._transcript[:start] + list(new)
        if self._resetting or data.get("tool_schemas"):
            self._tools = list(data.get("tool_schemas") or [])
        data["messages"], data["tool_schemas"] = self._transcript, self._tools
        obs = TraceObservation(**data, done=payload.get("done", False), reward=payload.get("reward"))
        return StepResult(observation=obs, reward=payload.get("reward"), done=payload.get("done", False),
                          metadata=payload.get("metadata"))

    def _parse_state(self, payload: Dict[str, Any]) -> TraceState:
        return TraceState(**payload)


# ----------------------------------------------------------------------------- in-process server (tests, benches)


class ServerThread:
    """``app`` served by uvicorn in a background thread on ``host`` and a free port (for tests and benches)::

        with ServerThread(build_app()) as server:
            client = TraceEnvClient(base_url=server.url)

    Entering returns once the socket listens (readiness, not a sleep); leaving stops the server and
    closes every session's env.
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, max_message_bytes: int | None = None):
        import uvicorn

        limit = max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                    ws_max_size=limit * 2 + 65536, lifespan="on",
                                                    ws_per_message_deflate=False))
        self.thread = threading.Thread(target=self.server.run, name="trace-serve", daemon=True)
        self.url = ""

    def __enter__(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start (see the log above)")
            time.sleep(0.01)
        host, port = self.server.servers[0].sockets[0].getsockname()[:2]
        self.url = f"http://{host}:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        close_all = getattr(self.app, "close_all", None)
        if close_all is not None:
            close_all()


def app_from_environment():
    """The app configured by environment variables (for ``uvicorn trace_envs.adapters.openenv_server:app``, the
    ``app`` that ``openenv.yaml`` names): TRACE_SERVE_ENV_IDS (comma-separated), TRACE_SERVE_MAX_SESSIONS,
    TRACE_SERVE_IDLE_TIMEOUT_S (0: none), TRACE_SERVE_MAX_MESSAGE_BYTES, TRACE_SERVE_TOKEN, TRACE_SERVE_UI,
    TRACE_SERVE_TRANSCRIPT (delta or full)."""
    env = os.environ
    ids = [i.strip() for i in env.get("TRACE_SERVE_ENV_IDS", "").split(",") if i.strip()]
    idle = float(env.get("TRACE_SERVE_IDLE_TIMEOUT_S", DEFAULT_IDLE_TIMEOUT_S))
    return build_app(ids, max_sessions=int(env.get("TRACE_SERVE_MAX_SESSIONS", DEFAULT_MAX_SESSIONS)),
                     idle_timeout_s=idle or None,
                     max_message_bytes=int(env.get("TRACE_SERVE_MAX_MESSAGE_BYTES", DEFAULT_MAX_MESSAGE_BYTES)),
                     token=env.get(TOKEN_ENV_VAR) or None, ui=env.get("TRACE_SERVE_UI", "") in ("1", "true", "yes"),
                     transcript=env.get("TRACE_SERVE_TRANSCRIPT", "delta"))


def __getattr__(name: str):
    if name == "app":  # built on first use, so importing this module starts no server machinery
        value = app_from_environment()
        globals()["app"] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- a Gymnasium env over the server


class RemoteTraceEnv(gym.Env):
    """A Gymnasium env whose episodes run on a ``trace serve`` server (one WebSocket session).

    ``reset``/``step`` return what a local TRACE env returns (the observation text; ``info`` with
    ``messages``, ``tools`` and, at the end, ``reward``, ``reward_breakdown``, ``success`` and
    ``termination``), so code written against ``gym.make`` (``trace_envs.rollout``, the TRL adapter's
    ``environment_factory(..., server_url=...)``) plays remote episodes unchanged. An episode the server
    cut at ``max_episode_steps`` comes back truncated, not terminated.
    """

    metadata = {"render_modes": []}

    def __init__(self, base_url: str, env_id: str, env_kwargs: dict | None = None, token: str | None = None,
                 message_timeout_s: float = 300.0):
        from trace_envs.core.spaces import UnicodeText

        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._client = TraceEnvClient(base_url=base_url, headers=headers,
                                      message_timeout_s=message_timeout_s).sync()
        self.observation_space = UnicodeText(max_length=2_000_000)
        self.action_space = UnicodeText(max_length=2_000_000)

    @staticmethod
    def _info(obs: TraceObservation, done: bool) -> dict:
        info = {**(obs.metadata or {}), "messages": obs.messages, "tools": obs.tool_schemas}
        if done:
            info.update(reward=float(obs.reward or 0.0), reward_breakdown=obs.reward_breakdown,
                        success=bool(obs.success), termination=obs.termination)
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        result = self._client.reset(env_id=self.env_id, seed=seed, options=options, env_kwargs=self.env_kwargs)
        return result.observation.text, self._info(result.observation, False)

    def step(self, action: Any):
        result = self._client.step(TraceAction(message=action))
        obs, done = result.observation, bool(result.done)
        cut = done and obs.termination == "max_steps"
        return obs.text, float(result.reward or 0.0), done and not cut, cut, self._info(obs, done)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # the server may be gone already; nothing is left to free on this side
            pass
