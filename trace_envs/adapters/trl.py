"""TRACE environments inside TRL's ``GRPOTrainer(environment_factory=...)``.

TRL 1.16 runs multi-turn, tool-using rollouts itself when it is given an
``environment_factory``: a zero-argument callable (here: a class) whose
instances it pools and reuses. For every rollout it calls
``instance.reset(**row)`` with the dataset row and appends the returned text to
the row's last prompt message; it renders the instance's public methods as the
tools of the chat template (their schemas come from
``transformers.utils.get_json_schema``), calls them as the model emits tool
calls, and, once the rollout is over, calls ``get_reward()`` once; that value is
a reward column named after the class (weight 1). A text answer without a tool
call ends the rollout. A ``dict`` of factories routes each row by its
``environment`` column (which is then not passed to ``reset``).

This module turns a registered TRACE env into such a class::

    from trl import GRPOConfig, GRPOTrainer
    from trace_envs.adapters.trl import environment_factory, make_dataset

    env_id = "trace/tau_airline-v0"
    trainer = GRPOTrainer(model=..., args=GRPOConfig(num_generations=8, ...),
                          train_dataset=make_dataset(env_id, seeds=range(256)),
                          environment_factory=environment_factory(env_id))

What the class does:

* **Tools.** One method per tool of the env, generated from the env's own tool
  specs: same name, a signature with type hints, a Google docstring. The model
  sees exactly ``info["tools"]``: each generated method carries the env's
  schema, and a small hook makes transformers' ``get_json_schema`` return it
  (type hints alone cannot express nested objects such as τ²'s
  ``passengers[{first_name, last_name, dob}]``, and transformers writes
  ``required``/``nullable`` differently). Without the hook the hint-derived
  schema is used, which matches up to those differences. A call steps the real
  env with that tool call and returns the tool's output text; argument errors
  are the env's own error messages, so the transcript, the error budget and the
  reward see every call exactly as in :func:`trace_envs.rollout`.
* **The user.** ``send_message_to_user(message) -> reply`` steps the env with
  the message as a plain-text turn (the env's contract for "talk to the user")
  and returns the user's reply, so conversational tasks run inside TRL's tool
  loop. (A final text answer with no tool call ends TRL's rollout and never
  reaches the env: TRL does not pass it to ``get_reward``.)
* **Reward.** ``get_reward()`` returns the env's verifiable reward when the
  episode terminated. If TRL stopped first (a text answer, ``max_completion_length``,
  ``max_tool_calling_iterations``) or the registry's ``max_episode_steps`` cut the
  episode, the episode is truncated, and a truncated episode scores 0 under the
  env contract (reward is 0 before the last step; :func:`trace_envs.rollout`
  records such episodes with termination ``max_steps`` and reward 0; τ²-bench
  scores non-terminal endings 0). The adapter never evaluates an unfinished
  episode and never invents a reward.

Importing this module imports neither torch nor trl nor transformers;
``datasets`` is imported by :func:`make_dataset` and transformers by the schema
hook when a factory is built.
"""

from __future__ import annotations

import copy
import inspect
import json
import keyword
import logging
import re
import types
import typing
from typing import Any, Callable, Iterable, Literal, Sequence

import gymnasium as gym

import trace_envs  # noqa: F401 - registers the env ids with gymnasium
from trace_envs.core.conversation import USER_TOOL, unwrap_tool_response as _unwrap_tool_response
from trace_envs.core.parsing import parse_action
from trace_envs.core.registry import get_entry

logger = logging.getLogger(__name__)

#: Method names TRL treats specially; a tool cannot be called like this.
RESERVED_NAMES = ("reset", "get_reward")
#: ``termination`` of an episode TRL ended before the env did (reward 0, see the module docstring).
UNFINISHED = "unfinished"
#: ``termination`` of an episode cut by the registry's ``max_episode_steps`` (as :func:`trace_envs.rollout` names it).
MAX_STEPS = "max_steps"

_IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


# ----------------------------------------------------------------------------- schema -> Python hints


def schema_to_hint(schema: dict) -> Any:
    """A Python annotation for a JSON schema produced by :mod:`trace_envs.core.tools`.

    Used for the generated methods' signatures (readable ``help()``, and the schema transformers
    derives when the schema hook is not installed). Objects with fixed properties (TypedDicts in the
    env) become ``dict``: transformers cannot express them from a type hint.
    """
    if not schema:
        return Any
    if "anyOf" in schema:
        members = tuple(schema_to_hint(s) for s in schema["anyOf"])
        return typing.Union[members] if len(members) > 1 else members[0]
    if "enum" in schema:
        return Literal[tuple(schema["enum"])]
    kind = schema.get("type")
    if isinstance(kind, list):
        members = tuple(schema_to_hint({**schema, "type": k}) for k in kind)
        return typing.Union[members] if len(members) > 1 else members[0]
    if kind == "string":
        return str
    if kind == "integer":
        return int
    if kind == "number":
        return float
    if kind == "boolean":
        return bool
    if kind == "null":
        return type(None)
    if kind == "array":
        return list[schema_to_hint(schema["items"])] if schema.get("items") else list
    if kind == "object":
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict) and "properties" not in schema:
            return dict[str, schema_to_hint(extra)]
        return dict
    return Any


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _docstring(description: str, parameters: dict) -> str:
    """A Google docstring whose parsing (by TRACE or by transformers) gives back ``description`` and the args."""
    doc = description.strip() or "(no description)"
    props = parameters.get("properties") or {}
    if props:
        doc += "\n\nArgs:\n" + "\n".join(f"    {name}: {_one_line(p.get('description', name))}"
                                         for name, p in props.items())
    return doc


# ----------------------------------------------------------------------------- transformers schema hook


def _schema_aware(original):
    def get_json_schema(func):
        schema = getattr(func, "__trace_schema__", None)
        if schema is not None:
            return copy.deepcopy(schema)
        return original(func)

    get_json_schema.__doc__ = original.__doc__
    get_json_schema.__wrapped__ = original
    get_json_schema.__trace_hook__ = True
    return get_json_schema


def install_schema_hook() -> bool:
    """Make transformers' ``get_json_schema`` return a generated tool's own schema.

    Only functions that carry a ``__trace_schema__`` attribute (the methods made by
    :func:`environment_factory`) are affected; every other function is converted as before.
    Patched: the name in ``transformers.utils`` and in the modules that call it (chat templates,
    the response parser, TRL's vLLM client). Returns whether the hook is in place (False when
    transformers is not installed or its layout changed; the hint-derived schemas are then used).
    """
    import importlib
    import sys

    try:
        ctu = importlib.import_module("transformers.utils.chat_template_utils")
    except Exception:  # transformers missing or broken: nothing to hook, nothing renders templates either
        return False
    current = getattr(ctu, "get_json_schema", None)
    if current is None:
        logger.warning("transformers.utils.chat_template_utils has no get_json_schema; TRL will see "
                       "hint-derived tool schemas (nested objects lose their fields)")
        return False
    hooked = current if getattr(current, "__trace_hook__", False) else _schema_aware(current)
    original = hooked.__wrapped__
    modules = ["transformers.utils.chat_template_utils", "transformers.utils.chat_parsing.response_parser",
               "transformers.utils", "trl.generation.vllm_client"]
    for name in modules:
        module = sys.modules.get(name)
        if module is None and name.startswith("transformers."):
            try:
                module = importlib.import_module(name)
            except Exception:
                continue
        if module is not None and getattr(module, "get_json_schema", None) in (original, hooked):
            module.get_json_schema = hooked
    return True


# ----------------------------------------------------------------------------- the generated class


def _as_mapping(value: Any, what: str) -> dict:
    """A row field that holds a mapping: a dict, a JSON object string, or empty."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the row's {what!r} is not valid JSON ({exc.msg}); store a JSON object") from exc
    if not isinstance(value, dict):
        raise ValueError(f"the row's {what!r} must be a mapping (or a JSON object string), got {type(value).__name__}")
    return value


class TraceTRLEnvironment:
    """Base of the classes :func:`environment_factory` generates (one per env id and kwargs).

    TRL treats every public function of the class as a tool, so the only public methods are
    ``reset``, ``get_reward`` and the generated tools; everything else is a property or private.

    Properties after a rollout: ``env`` (the gymnasium env), ``messages`` (the transcript, OpenAI
    format), ``reward``, ``termination``, ``done``, ``trajectory`` (a :func:`trace_envs.rollout`-style
    record).
    """

    #: Set on each generated class.
    env_id: str = ""
    env_kwargs: dict = {}
    tool_schemas: list = []
    user_tool: bool = True
    #: Set by ``environment_factory(..., server_url=...)``: episodes run on that ``trace serve`` server.
    server_url: str | None = None
    server_token: str | None = None

    def __init__(self) -> None:
        self._env: gym.Env | None = None
        self._made_with: dict | None = None
        self._seed: int | None = None
        self._info: dict = {}
        self._steps = 0
        self._terminated = False
        self._truncated = False
        self._final: dict | None = None
        self._reward: float | None = None

    # ------------------------------------------------------------------ TRL's interface

    def reset(self, **row: Any) -> str | None:
        """Start the episode of a dataset row and return its opening text.

        Args:
            **row: the dataset row: ``seed`` (required, so that every member of a GRPO group gets the
                same task), optional ``options`` (reset options) and ``env_kwargs`` (overrides of the
                factory's kwargs), each a mapping or a JSON object string. Other columns (``prompt``,
                ``environment``, …) are ignored, except that an ``environment`` naming another env
                is an error.
        """
        environment = row.get("environment")
        if environment and environment != self.env_id:
            raise ValueError(f"a row for environment {environment!r} reached the factory of {self.env_id!r}. "
                             "Pass environment_factories([...]) (a dict) to route rows by their 'environment' column")
        seed = row.get("seed")
        if seed is None or isinstance(seed, bool) or not isinstance(seed, int):
            try:
                import numpy as np

                ok = isinstance(seed, np.integer)
            except ImportError:  # pragma: no cover - numpy comes with gymnasium
                ok = False
            if not ok:
                raise ValueError(f"the row has no integer 'seed' (got {seed!r}); every member of a GRPO group must "
                                 "reset with the same seed. Build the rows with trace_envs.adapters.trl.make_dataset")
        seed = int(seed)
        kwargs = {**self.env_kwargs, **_as_mapping(row.get("env_kwargs"), "env_kwargs")}
        options = _as_mapping(row.get("options"), "options") or None
        if self._env is None or kwargs != self._made_with:
            self._close()
            self._env = _make_env(self.env_id, kwargs, self.server_url, self.server_token)
            self._made_with = kwargs
        _, info = self._env.reset(seed=seed, options=options)
        if info.get("tools", []) != self.tool_schemas:
            names = [t["function"]["name"] for t in info.get("tools", [])]
            expected = [t["function"]["name"] for t in self.tool_schemas]
            raise ValueError(f"{self.env_id} (seed {seed}, kwargs {kwargs}) exposes tools {names} with other schemas "
                             f"than the factory's {expected}. TRL needs one fixed tool set per factory: pin the env's "
                             "kwargs (e.g. domain=...) so that every episode has the same tools")
        self._seed = seed
        self._info = info
        self._steps = 0
        self._terminated = self._truncated = False
        self._final = None
        self._reward = None
        messages = info.get("messages") or []
        return messages[-1]["content"] if messages else None

    def get_reward(self) -> float:
        """The env's verifiable reward for the rollout; 0.0 for an episode that did not terminate."""
        if self._env is None:
            raise RuntimeError("get_reward() before reset(); TRL calls reset(**row) first")
        if self._reward is None:
            # Truncated (by TRL or by max_episode_steps): the env contract gives no final reward.
            self._reward = float(self._final["reward"]) if self._terminated and self._final else 0.0
        return self._reward

    # ------------------------------------------------------------------ state, for callers and tests

    @property
    def env(self) -> gym.Env | None:
        return self._env

    @property
    def messages(self) -> list[dict]:
        return list(self._info.get("messages") or [])

    @property
    def done(self) -> bool:
        return self._terminated or self._truncated

    @property
    def reward(self) -> float | None:
        """The final reward once known (terminated, or fixed by ``get_reward``), else None."""
        if self._reward is not None:
            return self._reward
        return float(self._final["reward"]) if self._terminated and self._final else None

    @property
    def reward_breakdown(self) -> dict:
        """The env's reward breakdown once the episode terminated, else ``{}``."""
        return dict((self._final or {}).get("reward_breakdown") or {}) if self._terminated else {}

    @property
    def termination(self) -> str | None:
        """The env's termination reason; ``max_steps`` if ``max_episode_steps`` cut the episode;
        ``unfinished`` once ``get_reward`` closed an episode TRL stopped early; None while running."""
        if self._terminated:
            return (self._final or {}).get("termination") or "terminated"
        if self._truncated:
            return MAX_STEPS
        return UNFINISHED if self._reward is not None else None

    @property
    def trajectory(self) -> dict:
        """The rollout as a trajectory record (the fields of :func:`trace_envs.rollout`, timing aside)."""
        final = self._final or {}
        return {"env_id": self.env_id, "seed": self._seed, "agent": "trl", "messages": self.messages,
                "tools": list(self.tool_schemas), "reward": self.get_reward() if self._env is not None else 0.0,
                "reward_breakdown": final.get("reward_breakdown", {}) if self._terminated else {},
                "success": bool(final.get("success", False)) if self._terminated else False,
                "termination": self.termination, "steps": self._steps}

    # ------------------------------------------------------------------ stepping

    def _step(self, action: Any) -> str:
        if self._env is None:
            raise RuntimeError(f"{type(self).__name__}: a tool was called before reset(**row)")
        if self._truncated:
            return (f"Error: this episode has ended (termination: {MAX_STEPS}, after {self._steps} steps). "
                    "No further actions are accepted.")
        if self._reward is not None and not self._terminated:
            return f"Error: this episode has ended (termination: {UNFINISHED}). No further actions are accepted."
        obs, _, terminated, truncated, info = self._env.step(action)
        self._steps += 1
        self._info = info
        if terminated and not self._terminated:
            self._terminated = True
            self._final = {k: info.get(k) for k in ("reward", "reward_breakdown", "success", "termination")}
        elif truncated and not self._terminated:
            self._truncated = True
        return obs

    def _call_tool(self, name: str, arguments: dict) -> str:
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}  # the env numbers the ids
        return _unwrap_tool_response(self._step({"role": "assistant", "content": "", "tool_calls": [call]}))

    def _send_message(self, message: Any) -> str:
        if isinstance(message, str) and parse_action(message).is_tool_call:
            return (f"Error: {USER_TOOL} sends plain text to the user, and this message is a tool call. "
                    "Call the tool directly instead.")
        reply = self._step({"role": "assistant", "content": message})
        if not reply and self._terminated:
            return f"(The conversation has ended: {self.termination}.)"
        return reply

    # ------------------------------------------------------------------ cleanup

    def _close(self) -> None:
        if self._env is not None:
            try:
                self._env.close()
            finally:
                self._env = None
                self._made_with = None

    def __del__(self) -> None:  # TRL never closes its pooled instances; free containers and the like here
        try:
            self._close()
        except Exception:
            pass


def _send_message_to_user(self: TraceTRLEnvironment, message: str) -> str:
    """Send a message to the user and return the user's reply.

    Use it to ask for missing information, to confirm an action before doing it, and to give the
    user the answer or result. Only text goes to the user; call other tools directly.

    Args:
        message: the text of the message to the user.
    """
    return self._send_message(message)


def _tool_method(name: str, schema: dict, defaults: dict) -> Any:
    """A method for one env tool, carrying the env's schema (see :func:`install_schema_hook`)."""
    function = schema["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    props = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    for arg, arg_schema in props.items():
        if not _IDENTIFIER.match(arg) or keyword.iskeyword(arg) or arg == "self":
            raise ValueError(f"tool {name!r}: argument {arg!r} is not a usable Python parameter name; TRL calls tools "
                             "as Python methods, so rename the argument in the env")
        hint = schema_to_hint(arg_schema)
        annotations[arg] = hint
        default = inspect.Parameter.empty if arg in required else defaults.get(arg)
        # Keyword-only: required and optional arguments keep the env's order.
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))

    def method(self: TraceTRLEnvironment, **arguments: Any) -> str:
        # The env validates the arguments (and answers a bad call with its own error message).
        return self._call_tool(name, arguments)

    method.__name__ = name
    method.__qualname__ = f"TraceTRLEnvironment.{name}"
    method.__doc__ = _docstring(function.get("description", ""), parameters)
    method.__signature__ = inspect.Signature(params)
    method.__annotations__ = annotations
    method.__trace_schema__ = copy.deepcopy(schema)
    return method


def _class_name(env_id: str) -> str:
    namespace, _, rest = env_id.partition("/")
    words = re.split(r"[^A-Za-z0-9]+", rest if namespace == "trace" else f"{namespace}_{rest}")
    name = "".join(w[:1].upper() + w[1:] for w in words if w)
    return name if name[:1].isalpha() else f"Env{name}"


def _make_env(env_id: str, env_kwargs: dict, server_url: str | None, server_token: str | None) -> gym.Env:
    """The env of a rollout: local (``gym.make``), or a session on a ``trace serve`` server."""
    if server_url:
        from trace_envs.adapters.openenv_server import RemoteTraceEnv

        return RemoteTraceEnv(server_url, env_id, env_kwargs, token=server_token)
    return gym.make(env_id, **env_kwargs)


def _probe(env_id: str, env_kwargs: dict, seed: int, options: dict | None, server_url: str | None = None,
           server_token: str | None = None) -> tuple[list[dict], dict]:
    """The tool schemas (and specs' defaults) of one episode of the env."""
    env = _make_env(env_id, env_kwargs, server_url, server_token)
    try:
        _, info = env.reset(seed=seed, options=options)
        toolset = getattr(env.unwrapped, "_toolset", None)
        defaults = {name: dict(spec.defaults) for name, spec in (toolset.specs.items() if toolset else ())}
        return list(info.get("tools") or []), defaults
    finally:
        env.close()


def environment_factory(env_id: str, *, user_tool: bool = True, probe_seed: int = 0,
                        probe_options: dict | None = None, server_url: str | None = None,
                        server_token: str | None = None, **env_kwargs: Any) -> type[TraceTRLEnvironment]:
    """A class for ``trl.GRPOTrainer(environment_factory=...)`` that plays ``env_id``.

    Args:
        env_id: a registered id, e.g. ``"trace/tau_airline-v0"`` (``import trace_envs`` registers them;
            workspace envs need ``TRACE_REGISTRY``).
        user_tool: expose ``send_message_to_user(message) -> reply`` (the env's plain-text turn).
        probe_seed: the seed of the one episode reset here to read the tool schemas.
        probe_options: reset options for that episode (use the options your rows carry).
        server_url: run the episodes on this ``trace serve`` server (``http://host:port``; one session per
            instance, see docs/serve.md) instead of in this process; the id need not be registered here.
        server_token: the server's bearer token, if it has one.
        **env_kwargs: passed to ``gym.make`` (they override the registry's ``kwargs``).

    Returns:
        A :class:`TraceTRLEnvironment` subclass named after the env (TRL logs its reward as
        ``rewards/<ClassName>/mean``), with one method per tool of the env.
    """
    if not server_url:
        get_entry(env_id)  # a clear error for an unknown id (a server checks its own ids)
    env_id = env_id.split(":", 1)[-1]
    schemas, defaults = _probe(env_id, env_kwargs, probe_seed, probe_options, server_url, server_token)
    namespace: dict[str, Any] = {
        "__doc__": f"{env_id} for TRL's GRPOTrainer (generated by trace_envs.adapters.trl.environment_factory).",
        "__module__": __name__,
        "env_id": env_id,
        "env_kwargs": dict(env_kwargs),
        "tool_schemas": schemas,
        "user_tool": user_tool,
        "server_url": server_url,
        "server_token": server_token,
    }
    taken = set(RESERVED_NAMES) | ({USER_TOOL} if user_tool else set())
    for schema in schemas:
        name = schema["function"]["name"]
        if not _IDENTIFIER.match(name) or keyword.iskeyword(name):
            raise ValueError(f"{env_id}: tool {name!r} is not a Python identifier; TRL calls tools as methods of "
                             "the environment class, so the tool needs an identifier name")
        if name in taken or hasattr(TraceTRLEnvironment, name):
            raise ValueError(f"{env_id}: tool {name!r} clashes with a name the TRL adapter needs "
                             f"({sorted(taken)}); rename the tool, or pass user_tool=False if it is {USER_TOOL!r}")
        taken.add(name)
        namespace[name] = _tool_method(name, schema, defaults.get(name, {}))
    if user_tool:
        send = types.FunctionType(_send_message_to_user.__code__, _send_message_to_user.__globals__, USER_TOOL)
        send.__doc__ = _send_message_to_user.__doc__
        send.__annotations__ = {"message": str}  # no return hint: env tool schemas carry none either
        send.__qualname__ = f"TraceTRLEnvironment.{USER_TOOL}"
        namespace[USER_TOOL] = send
    cls = type(_class_name(env_id), (TraceTRLEnvironment,), namespace)
    cls.__qualname__ = cls.__name__
    install_schema_hook()
    return cls


def environment_factories(env_ids: Sequence[str], **env_kwargs: Any) -> dict[str, type[TraceTRLEnvironment]]:
    """``{env_id: class}`` for TRL's multi-environment mode (rows routed by their ``environment`` column).

    Args:
        env_ids: registered ids; :func:`make_dataset` with the same ids writes the matching column.
        **env_kwargs: passed to every env (use one factory per id for per-env kwargs).
    """
    return {env_id: environment_factory(env_id, **env_kwargs) for env_id in env_ids}


def trl_tool_schemas(factory: type[TraceTRLEnvironment]) -> list[dict]:
    """The tool schemas TRL renders for a factory's class, in TRL's order.

    TRL lists an environment's public methods with ``inspect.getmembers`` (sorted by name), so the
    model sees the env's tools in alphabetical order, with ``send_message_to_user`` among them.
    Use this list (with :func:`to_trl_messages`) to render SFT data that matches GRPO prompts.
    """
    install_schema_hook()
    from transformers.utils import chat_template_utils

    methods = [fn for name, fn in inspect.getmembers(factory, predicate=inspect.isfunction)
               if name not in RESERVED_NAMES and not name.startswith("_")]
    return [chat_template_utils.get_json_schema(fn) for fn in methods]


def to_trl_messages(messages: list[dict], termination: str | None = None) -> list[dict]:
    """A TRACE transcript in the form a TRL rollout through this adapter produces.

    Plain-text assistant turns (messages to the user) become ``send_message_to_user`` tool calls;
    the user's reply becomes that call's tool message, and a message the episode ended on gets the
    text the adapter returns then (``termination`` names the ending). Tool calls and their results are
    kept. Use it to warm a model up on oracle trajectories before GRPO through the adapter.
    """
    out: list[dict] = []
    i = 0
    while i < len(messages):
        m = messages[i]
        if m["role"] == "assistant" and not m.get("tool_calls"):
            call_id = f"msg_{i}"
            out.append({"role": "assistant", "content": "", "tool_calls": [{
                "id": call_id, "type": "function",
                "function": {"name": USER_TOOL, "arguments": json.dumps({"message": m.get("content") or ""},
                                                                       ensure_ascii=False)}}]})
            nxt = messages[i + 1] if i + 1 < len(messages) else None
            if nxt is not None and nxt["role"] == "user":
                reply = nxt.get("content") or ""
                i += 1
            else:
                reply = f"(The conversation has ended: {termination or 'agent_stop'}.)"
            out.append({"role": "tool", "tool_call_id": call_id, "name": USER_TOOL, "content": reply})
        else:
            out.append(dict(m))
        i += 1
    return out


# ----------------------------------------------------------------------------- dataset


def _prompt_of(messages: list[dict]) -> list[dict]:
    """The row's prompt: the conversation before the opening, then the opening's role with empty content.

    TRL appends ``reset()``'s return value (the opening text) to the last prompt message, so the
    prompt holds an empty slot for it. Messages keep only the fields chat templates read.
    """
    prompt = []
    for m in messages[:-1]:
        kept = {"role": m["role"], "content": m.get("content") or ""}
        for key in ("tool_calls", "tool_call_id", "name"):
            if m.get(key):
                kept[key] = m[key]
        prompt.append(kept)
    if messages:
        prompt.append({"role": messages[-1]["role"], "content": ""})
    return prompt


def make_dataset(env_id: str | Sequence[str], seeds: int | Iterable[int], group_size: int = 1, *,
                 env_kwargs: dict | Callable[[str], dict] | None = None, options: dict | None = None,
                 progress: bool = False):
    """Rows for GRPO on TRACE envs: a ``datasets.Dataset`` with ``prompt``, ``seed`` and ``environment``.

    ``prompt`` is conversational (a list of ``{"role", "content"}``): the env's system prompt (its
    policy) and any conversation before the opening, then an empty user message that TRL fills
    with ``reset()``'s opening text. The tools are not in the prompt: TRL renders them from the
    factory's methods.

    GRPO groups: TRL's sampler repeats every row ``num_generations`` times and each repeat resets
    with the row's seed, so with TRL keep ``group_size=1`` and set ``GRPOConfig(num_generations=G)``.
    ``group_size=K`` writes each row K times in a row, for trainers that take flat batches.

    Args:
        env_id: a registered id, or several (rows of every id, in order; route them with
            :func:`environment_factories`).
        seeds: the task seeds (an int ``n`` means ``range(n)``).
        group_size: copies of each row, consecutive (all with the same seed).
        env_kwargs: ``gym.make`` kwargs; written to an ``env_kwargs`` column (JSON) that ``reset``
            applies on top of the factory's kwargs. A function ``env_id -> dict`` gives each env its
            own (several envs with different knobs in one dataset).
        options: reset options (e.g. ``{"prompt": "compact"}``), written to an ``options`` column (JSON).
        progress: show a progress bar.
    """
    from datasets import Dataset

    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    env_ids = [env_id] if isinstance(env_id, str) else list(env_id)
    if not env_ids:
        raise ValueError("make_dataset needs at least one env id")
    seed_list = list(range(seeds)) if isinstance(seeds, int) else [int(s) for s in seeds]
    if not seed_list:
        raise ValueError("make_dataset needs at least one seed")
    columns: dict[str, list] = {"prompt": [], "seed": [], "environment": []}
    kwargs_of = env_kwargs if callable(env_kwargs) else (lambda _: env_kwargs or {})
    if env_kwargs:
        columns["env_kwargs"] = []
    if options:
        columns["options"] = []
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(env_ids) * len(seed_list), desc="make_dataset", unit="row")
    for eid in env_ids:
        get_entry(eid)
        kwargs = dict(kwargs_of(eid) or {})
        env = gym.make(eid, **kwargs)
        try:
            for seed in seed_list:
                _, info = env.reset(seed=seed, options=options)
                prompt = _prompt_of(info.get("messages") or [])
                for _ in range(group_size):
                    columns["prompt"].append(prompt)
                    columns["seed"].append(seed)
                    columns["environment"].append(eid)
                    if env_kwargs:
                        columns["env_kwargs"].append(json.dumps(kwargs, sort_keys=True))
                    if options:
                        columns["options"].append(json.dumps(options, sort_keys=True))
                if bar is not None:
                    bar.update(1)
        finally:
            env.close()
    if bar is not None:
        bar.close()
    return Dataset.from_dict(columns)


__all__ = ["MAX_STEPS", "RESERVED_NAMES", "TraceTRLEnvironment", "UNFINISHED", "USER_TOOL", "environment_factories",
           "environment_factory", "install_schema_hook", "make_dataset", "schema_to_hint", "to_trl_messages",
           "trl_tool_schemas"]
