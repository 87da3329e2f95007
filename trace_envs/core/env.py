"""``TraceEnv``: the base class of every TRACE environment.

An episode is a conversation. ``reset(seed)`` builds a task as a pure
function of (seed, config) and returns the opening observation; each
``step(action)`` takes the assistant's turn — a tool call or a message to the
user, in any of the shapes :mod:`trace_envs.core.parsing` reads — and returns
what the agent sees next. The full transcript (OpenAI format) and the tool
schemas travel in ``info``; the verifiable reward arrives on the last step
together with ``reward_breakdown``, ``success`` and ``termination``.

Subclasses implement a few hooks (see "Hooks" below); the base class owns
parsing, validation, the transcript, error handling and termination, so that
every environment — built-in, contributed or generated — behaves the same way
for the same malformed input. It also guarantees, whatever a hook returns, that
every observation lies inside ``observation_space`` (valid Unicode, cut to its
``max_length``), that every string in the transcript encodes to UTF-8, and that
``info["tools"]`` is the episode's own copy of the schemas.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
from typing import Any, Callable

import gymnasium as gym

from .conversation import (
    assistant_message,
    render_transcript,
    system_message,
    tool_call_entry,
    tool_message,
    tool_response_text,
    user_message,
)
from .parsing import MAX_ACTION_CHARS, ParsedAction, parse_action
from .spaces import UnicodeText, fit_text, well_formed
from .tools import EnvError, ToolResult, ToolSet

#: Rejected turns kept per episode (``info["rejected_turns"]``), and characters kept of each.
MAX_REJECTED_KEPT = 32
MAX_REJECTED_CHARS = 2000

logger = logging.getLogger(__name__)

Policy = Callable[[str, dict], Any]


class PlannedPolicy:
    """A policy that plays a fixed plan of turns, then answers every further observation with its last turn
    again (or ``then``): a reference agent answers every observation, also when an episode goes on after its
    plan (its turns mixed with another agent's, a turn the env rejected).

    Args:
        turns: the planned actions, in order (at least one).
        then: the answer after the plan (default: the plan's last turn).
    """

    def __init__(self, turns: list[Any], then: Any = None) -> None:
        if not turns:
            raise ValueError("PlannedPolicy needs at least one turn")
        self.turns, self.then, self.i = list(turns), turns[-1] if then is None else then, 0

    def __call__(self, observation: str, info: dict) -> Any:
        turn = self.turns[self.i] if self.i < len(self.turns) else self.then
        self.i += 1
        return turn


def canonical_hash(value: Any) -> str:
    """A stable hash of JSON-able data (sorted keys; identical across processes and machines)."""
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class TraceEnv(gym.Env):
    """Base class for text-in, text-out tool-using environments.

    Hooks for subclasses:
        ``_generate_task(options) -> str``: build the episode's task from ``self.np_random``
            and return the user's opening message (required).
        ``_tool_provider() -> object``: the object whose ``@tool`` methods are the tools
            (default: the env itself). Called after ``_generate_task``.
        ``_on_user_message(text) -> str | None``: react to a message to the user; return the
            user's reply, or call ``self._end(reason)`` (default: the episode ends with
            ``agent_stop``).
        ``_on_tool_result(name, arguments, result)``: after each tool call (e.g. end on ``submit``).
        ``_evaluate() -> (reward, breakdown)``: the final reward in [0, 1] and its components (required).
        ``system_prompt() -> str``: instructions and policy shown before the conversation.
        ``task_spec() -> dict``: the task as JSON-able data; its hash is the task fingerprint.
        ``world_state() -> Any``: the mutable state a tool call may change (for tests and evaluators).
        ``task_info() -> dict``: small labels of the task (``scenario``, ``difficulty``, ``needs``) for records.
        ``oracle() -> policy``: a ``(observation, info) -> action`` callable that solves this episode.
        ``task_count() -> int | None``: how many distinct tasks the env has, when that is small (a bandit).

    Args:
        render_mode: ``"ansi"`` (``render()`` returns the conversation so far as text) or None (gymnasium's
            default; every env takes it through ``gym.make(..., render_mode="ansi")``).

    Class attributes:
        max_invalid_actions: consecutive rejected turns (unreadable actions or failed tool calls)
            after which the episode ends with termination ``too_many_errors``.
        max_tool_calls_per_turn: more calls than this in one turn are rejected.
        max_repeated_calls: if set, this many identical tool calls in a row end the episode
            (termination ``repeated_calls``).
        max_output_chars: tool outputs are truncated beyond this.
        compact_tools: show short tool schemas (first sentence, no argument descriptions), for small models.
        nonblocking_step: True when ``step`` only computes in this process (no network, subprocess,
            container or disk wait) and returns within about a millisecond; a server (``trace serve``) then
            runs it on its event loop instead of handing it to a worker thread. Leave it False when in
            doubt: a step that blocks there stalls every session of the server.
    """

    metadata = {"render_modes": ["ansi"]}
    max_invalid_actions: int = 10
    max_tool_calls_per_turn: int = 1
    max_repeated_calls: int | None = None
    max_output_chars: int = 20_000
    compact_tools: bool = False
    nonblocking_step: bool = False

    def __init__(self, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']} or None, got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_length=2_000_000)
        self.action_space = UnicodeText(max_length=MAX_ACTION_CHARS)
        self._messages: list[dict] = []
        self._toolset: ToolSet | None = None
        self._ended = True
        self._termination: str | None = None
        self._env_error: str | None = None  # why the infrastructure failed, when termination is env_error
        self._final: dict = {}
        self._seed: int | None = None
        self._tools: list[dict] = []

    # ------------------------------------------------------------------ hooks

    def _generate_task(self, options: dict) -> str:
        raise NotImplementedError

    def _tool_provider(self) -> Any:
        return self

    def _on_user_message(self, text: str) -> str | None:
        self._end("agent_stop")
        return None

    def _on_tool_result(self, name: str, arguments: dict, result: ToolResult) -> None:
        pass

    def _evaluate(self) -> tuple[float, dict]:
        raise NotImplementedError

    def system_prompt(self) -> str:
        return ""

    def task_spec(self) -> dict:
        return {}

    def world_state(self) -> Any:
        return None

    def task_info(self) -> dict:
        """Small JSON-able labels of the current task (scenario family, difficulty, capabilities it needs),
        copied into trajectory records so evaluation can break results down by them."""
        return {}

    def oracle(self) -> Policy:
        raise NotImplementedError(f"{type(self).__name__} has no oracle")

    def task_count(self) -> int | None:
        """How many distinct tasks this env has, when that is a small number (None: practically unbounded). The
        conformance check asks for distinct tasks over its seeds, up to this many."""
        return None

    # ------------------------------------------------------------------ public API

    @property
    def tools(self) -> list[dict]:
        """OpenAI function schemas of this episode's tools (this episode's own copy: changing it changes
        what this episode reports, never another env's or a later episode's)."""
        return self._tools if self._toolset else []

    @property
    def messages(self) -> list[dict]:
        return self._messages

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def termination(self) -> str | None:
        return self._termination

    def task_fingerprint(self) -> str:
        """Hash of the current task; equal seeds and configs give equal fingerprints."""
        return canonical_hash({"cls": type(self).__name__, "task": self.task_spec(),
                               "first": self._messages[:2]})

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._seed = seed
        self._messages = []
        self._ended = False
        self._termination = None
        self._env_error: str | None = None
        self._final = {}
        self._invalid_streak = 0
        self._rejected: list[dict] = []
        self._call_counter = 0
        self._last_calls: list[str] = []
        opening = self._generate_task(dict(options or {}))
        self._toolset = ToolSet(self._tool_provider(), max_output_chars=self.max_output_chars,
                                compact=self.compact_tools)
        # The ToolSet's schemas are cached per class and shared by every env of that class.
        self._tools = copy.deepcopy(self._toolset.schemas)
        prompt = self.system_prompt()
        if prompt:
            self._append(system_message(prompt))
        self._append(user_message(opening))
        parts = [prompt] if prompt else []
        if self._toolset.schemas:
            parts.append("# Tools\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>.\n"
                         + self._toolset.prompt_block())
        parts.append(opening)
        return self._observation("\n\n".join(parts)), self._info()

    def step(self, action: Any):
        if self._ended:
            reason = self._termination or "not_started"
            obs = (f"Error: this episode has ended (termination: {reason}). Call reset() to start a new one."
                   if reason != "not_started" else "Error: call reset() before step().")
            return self._observation(obs), 0.0, True, False, self._info()
        try:
            obs = self._take_turn(action)
        except EnvError as exc:  # the machine failed, not the agent
            logger.warning("environment %s: infrastructure failure: %s", type(self).__name__, exc)
            obs = f"Error: the environment failed ({exc}). The episode has ended."
            self._env_error = str(exc)
            self._end("env_error")
        except Exception as exc:  # our bug, not the agent's: end cleanly instead of killing the caller's loop
            logger.exception("environment %s failed during step", type(self).__name__)
            obs = f"Error: the environment failed ({type(exc).__name__}). The episode has ended."
            self._env_error = f"{type(exc).__name__}: {exc}"
            self._end("env_error")
        reward = 0.0
        if self._ended:
            reward = self._finish()
        return self._observation(obs), reward, self._ended, False, self._info()

    def preflight(self) -> None:
        """Check, before a rollout's first episode, that what this env needs on the machine is there (images
        built, engines answering); raise :class:`EnvError` with the reason if not. The base needs nothing."""

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return render_transcript(self._messages)
        return None

    def close(self) -> None:
        self._toolset = None

    # ------------------------------------------------------------------ internals

    def _observation(self, text: str) -> str:
        """``text`` made to fit the observation space: valid Unicode, at most ``max_length`` characters.

        Whatever a tool or a hook produced, every observation is inside ``observation_space``.
        """
        limit = getattr(self.observation_space, "max_length", None)
        text = well_formed(text)
        return fit_text(text, limit) if limit else text

    def _append(self, message: dict) -> None:
        """Add a message to the transcript, made UTF-8-safe so that every record stays writable."""
        self._messages.append(_well_formed_message(message))

    def _end(self, termination: str) -> None:
        """End the episode with a τ²-style termination reason (``user_stop``, ``agent_stop``, ...)."""
        if not self._ended:
            self._ended = True
            self._termination = termination

    def _reject(self, message: str, action: Any = None) -> str:
        # The turn stays out of the conversation (the agent sees only the error), but its text is kept beside it
        # (``info["rejected_turns"]``, the trajectory's ``rejected_turns``): what a policy wrote when it drifted
        # off the format is what one reads to find out why.
        if len(self._rejected) < MAX_REJECTED_KEPT:
            text = action if isinstance(action, str) else _action_text(action)
            self._rejected.append({"after_message": len(self._messages), "error": message,
                                   "text": fit_text(well_formed(text), MAX_REJECTED_CHARS)})
        self._invalid_streak += 1
        if self._invalid_streak >= self.max_invalid_actions:
            self._end("too_many_errors")
            return f"Error: {message}\nToo many errors in a row; the episode has ended."
        return f"Error: {message}"

    def _take_turn(self, action: Any) -> str:
        parsed: ParsedAction = parse_action(action)
        if parsed.error is not None:
            return self._reject(parsed.error, action)
        if len(parsed.tool_calls) > self.max_tool_calls_per_turn:
            return self._reject(f"you made {len(parsed.tool_calls)} tool calls in one turn; make at most "
                                f"{self.max_tool_calls_per_turn} per turn and wait for its result.", action)
        if parsed.tool_calls:
            return self._tool_turn(parsed)
        self._invalid_streak = 0
        self._append(assistant_message(parsed.content))
        reply = self._on_user_message(parsed.content)
        if reply is None:
            return ""
        self._append(user_message(reply))
        return reply

    def _tool_turn(self, parsed: ParsedAction) -> str:
        call = parsed.tool_calls[0]
        self._call_counter += 1
        call_id = call.id or f"call_{self._call_counter}"
        name = call.name if isinstance(call.name, str) else json.dumps(call.name, default=str)
        result = self._toolset.call(call.name, call.arguments)
        self._append(assistant_message(parsed.content, [tool_call_entry(call_id, name, call.arguments)]))
        self._append(tool_message(call_id, name, result.content))
        self._invalid_streak = 0 if result.ok else self._invalid_streak + 1
        obs = tool_response_text(result.content)
        if self._invalid_streak >= self.max_invalid_actions:
            self._end("too_many_errors")
            return obs + "\nToo many errors in a row; the episode has ended."
        if self.max_repeated_calls:
            key = name + json.dumps(call.arguments, sort_keys=True, default=str)
            self._last_calls = (self._last_calls + [key])[-self.max_repeated_calls:]
            if len(self._last_calls) == self.max_repeated_calls and len(set(self._last_calls)) == 1:
                self._end("repeated_calls")
                return obs + "\nThe same call was repeated too many times; the episode has ended."
        if result.ok or self._toolset.specs.get(name) is not None:
            self._on_tool_result(name, call.arguments, result)
        return obs

    def _finish(self) -> float:
        if self._termination == "too_many_errors":
            reward, breakdown = 0.0, {"reason": self._termination}
        elif self._termination == "env_error":
            reward, breakdown = 0.0, {"reason": "env_error", "error": self._env_error}
        else:
            try:
                reward, breakdown = self._evaluate()
            except EnvError as exc:  # the grader's machine failed: not a score of the agent
                logger.warning("evaluation of %s: infrastructure failure: %s", type(self).__name__, exc)
                self._env_error, self._termination = str(exc), "env_error"
                reward, breakdown = 0.0, {"reason": "env_error", "error": self._env_error}
            except Exception:
                logger.exception("evaluation of %s failed", type(self).__name__)
                reward, breakdown = 0.0, {"reason": "evaluation_error"}
        reward = float(min(1.0, max(0.0, reward)))
        self._final = {"reward": reward, "reward_breakdown": breakdown, "success": reward >= 1.0 - 1e-9,
                       "termination": self._termination}
        if self._termination == "env_error":
            self._final["env_error"] = self._env_error
        return reward

    def _info(self) -> dict:
        info = {"messages": list(self._messages), "tools": self.tools}
        if self._rejected:
            info["rejected_turns"] = [dict(r) for r in self._rejected]
        if self._final:
            # A fresh copy each step: callers keep infos, and steps after the end must not share objects.
            info.update(copy.deepcopy(self._final))
        return info


def _action_text(action: Any) -> str:
    """A non-string action as JSON for the record of rejected turns; one too deep to encode is named, not kept."""
    try:
        return json.dumps(action, default=str)
    except (RecursionError, ValueError, TypeError) as exc:
        return f"<{type(action).__name__} action, not kept: {type(exc).__name__}>"


def _well_formed_message(value: Any) -> Any:
    """A message (or part of one) with every string made encodable (lone surrogates → U+FFFD)."""
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, dict):
        return {well_formed(k) if isinstance(k, str) else k: _well_formed_message(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_well_formed_message(v) for v in value]
    return value
