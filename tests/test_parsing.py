"""Malformed and well-formed agent turns, through ``gym.make`` and through ``parse_action``.

Every malformed turn must come back as an observation that says ``Error`` and
what was wrong; ``step`` never raises, the reward is 0, a single bad turn does
not end the episode, and neither the world state nor the task changes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.core.parsing import parse_action

ENV_ID = "examples/warehouse_stock-v0"
SEED = 4


def _hermes_raw(payload: str) -> str:
    return f"<tool_call>\n{payload}\n</tool_call>"


def _openai(function: Any, content: Any = "") -> dict:
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": "call_x", "type": "function", "function": function}]}


GET = hermes_tool_call("get_stock", {"warehouse_id": "WH-01"})
DEEP = "[" * 5000 + "]" * 5000


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


NESTED = _nested(5000)


@dataclass
class Bad:
    """One malformed turn: the action, a phrase the error must contain, and where it is caught."""

    name: str
    action: Any
    phrase: str
    #: "parser": parse_action returns an error; "env": the parser reads a call that the env then rejects
    #: (tool validation, a precondition inside the tool, the per-turn call limit, the episode state).
    caught_by: str = "parser"
    #: run before the bad turn (e.g. end the episode first)
    setup: Callable[[gym.Env], None] | None = None


def _end_episode(env: gym.Env) -> None:
    total = sum(items.get(env.unwrapped.product, 0) for items in env.unwrapped.stock.values())
    *_, terminated, _, _ = env.step(hermes_tool_call("submit_total", {"total": total}))
    assert terminated


BAD_ACTIONS = [
    Bad("invalid JSON in a Hermes block", _hermes_raw('{"name": "get_stock", "arguments": {"warehouse_id": }}'),
        "the <tool_call> block is not valid JSON"),
    Bad("invalid bare JSON", '{"name": "get_stock", "arguments": {"warehouse_id": }}',
        "Your JSON tool call is not valid JSON"),
    Bad("unknown tool", hermes_tool_call("delete_everything", {}), "unknown tool 'delete_everything'", "env"),
    Bad("tool name not a string", _hermes_raw('{"name": 5, "arguments": {}}'), "unknown tool 'integer 5'", "env"),
    Bad("missing argument", hermes_tool_call("get_stock", {}), "missing required argument 'warehouse_id'", "env"),
    Bad("wrong type", hermes_tool_call("get_stock", {"warehouse_id": 7}),
        "warehouse_id must be string, got integer 7", "env"),
    Bad("wrong type on a write tool", hermes_tool_call("submit_total", {"total": "12"}),
        "total must be integer, got string", "env"),
    Bad("extra argument", hermes_tool_call("get_stock", {"warehouse_id": "WH-01", "verbose": True}),
        "unexpected argument 'verbose'", "env"),
    Bad("precondition inside a tool (ToolError)", hermes_tool_call("get_stock", {"warehouse_id": "WH-99"}),
        "no warehouse 'WH-99'", "env"),
    Bad("precondition inside a write tool", hermes_tool_call("submit_total", {"total": -3}),
        "a stock total cannot be negative", "env"),
    Bad("nested <tool_call> tags", "<tool_call><tool_call>" + '{"name": "list_warehouses", "arguments": {}}'
        + "</tool_call></tool_call>", "nested or out of order"),
    Bad("unclosed <tool_call>", '<tool_call>{"name": "list_warehouses", "arguments": {}}',
        "1 <tool_call> and 0 </tool_call> tags"),
    Bad("stray </tool_call>", '{"name": "list_warehouses", "arguments": {}}</tool_call>',
        "0 <tool_call> and 1 </tool_call> tags"),
    Bad("two tool calls in one turn", GET + "\n" + hermes_tool_call("list_warehouses", {}),
        "2 tool calls in one turn", "env"),
    Bad("call is not a JSON object", _hermes_raw("[1, 2]"), "must be a JSON object like"),
    Bad("call without a name", _hermes_raw('{"arguments": {}}'), 'has no "name" field'),
    Bad("call with an unexpected field", _hermes_raw('{"name": "list_warehouses", "arguments": {}, "priority": 1}'),
        "unexpected field(s) ['priority']"),
    Bad("empty string", "", "Your turn is empty"),
    Bad("whitespace only", " \n\t  ", "Your turn is empty"),
    Bad("only a <think> block", "<think>I should list the warehouses.</think>", "Your turn is empty"),
    Bad("a 1 MB string", "x" * 1_000_000, "1,000,000 characters long"),
    Bad("lone surrogate", "Hello \ud800 there", "lone surrogate"),
    Bad("control character", "Hello\x07 there", "control character U+0007"),
    Bad("action after the episode ended", GET, "this episode has ended", "env", setup=_end_episode),
    Bad("dict that is not a message", {"foo": "bar"}, "must be an OpenAI assistant message"),
    Bad("dict with role user", {"role": "user", "content": "hi"}, "must be an OpenAI assistant message"),
    Bad("message content not a string", {"role": "assistant", "content": 42}, '"content" must be a string'),
    Bad("tool_calls not a list", {"role": "assistant", "content": "", "tool_calls": {"name": "get_stock"}},
        '"tool_calls" must be a list'),
    Bad("tool_calls with a non-dict function", _openai("get_stock"), "tool_calls[0] must look like"),
    Bad("arguments a string of invalid JSON", _openai({"name": "get_stock", "arguments": "{warehouse_id: WH-01"}),
        "are a string that is not valid JSON"),
    Bad("arguments a list", hermes_tool_call("get_stock", ["WH-01"]),  # type: ignore[arg-type]
        "must be a JSON object, got array", "env"),
    Bad("arguments a list in an OpenAI message", _openai({"name": "get_stock", "arguments": '["WH-01"]'}),
        "must be a JSON object, got array", "env"),
    Bad("None", None, "got NoneType"),
    Bad("an int", 12345, "got int"),
    Bad("bytes that are not UTF-8", b"\xff\xfe\xfa", "bytes that are not valid UTF-8"),
    Bad("deeply nested JSON", _hermes_raw('{"name": "get_stock", "arguments": {"warehouse_id": ' + DEEP + "}}"),
        "nested too deeply"),
    Bad("JSON nested just past the depth limit", _hermes_raw(
        '{"name": "get_stock", "arguments": {"warehouse_id": ' + "[" * 64 + "]" * 64 + "}}"), "nested too deeply"),
    Bad("a dict action nested thousands deep", _openai({"name": "get_stock", "arguments": {"warehouse_id": NESTED}}),
        "nested too deeply"),
    Bad("lone surrogate escape in an argument", _hermes_raw('{"name": "get_stock", "arguments": '
                                                            '{"warehouse_id": "WH-\\ud800"}}'), "lone surrogate (\\ud800)"),
    Bad("lone surrogate escape in a key", '{"name": "get_stock", "arguments": {"\\udfff": "WH-01"}}',
        "a key with a lone surrogate (\\udfff)"),
    Bad("lone surrogate escape in the tool name", _hermes_raw('{"name": "get_stock\\udbff", "arguments": {}}'),
        "lone surrogate"),
    Bad("lone surrogate in an OpenAI arguments string", _openai({"name": "get_stock",
                                                                 "arguments": '{"warehouse_id": "\\ud83d"}'}),
        "lone surrogate"),
    Bad("lone surrogate in an OpenAI call id", {"role": "assistant", "content": "", "tool_calls": [
        {"id": "\ud800", "type": "function", "function": {"name": "get_stock", "arguments": "{}"}}]}, "lone surrogate"),
    Bad("integer past the digit limit in JSON text", '{"name": "get_stock", "arguments": {"warehouse_id": '
        + "9" * 5000 + "}}", "5,000 digits"),
    Bad("integer past Python's own digit limit", _openai({"name": "get_stock", "arguments": '{"warehouse_id": '
                                                          + "9" * 4301 + "}"}), "4,301 digits"),
    Bad("huge Python int in a dict action", _openai({"name": "get_stock", "arguments": {"warehouse_id": 10 ** 5000}}),
        "integer with about 5,001 digits"),
    Bad("content part whose text is not a string", {"role": "assistant", "content": [{"type": "text", "text": 5}]},
        'the "text" of content part 0 must be a string, got int'),
    Bad("content part that is not an object", {"role": "assistant", "content": ["hi"]}, "content part 0 must be"),
    Bad("a 3 MB tool name in a dict action", _openai({"name": "n" * 3_000_000, "arguments": {}}),
        "longer than 65,536 characters"),
    Bad("a 3 MB call id in a dict action", {"role": "assistant", "content": "", "tool_calls": [
        {"id": "i" * 3_000_000, "type": "function", "function": {"name": "get_stock", "arguments": "{}"}}]},
        "longer than 65,536 characters"),
    Bad("a non-JSON object in a dict action", _openai({"name": "get_stock", "arguments": {"warehouse_id": {1, 2}}}),
        "is a set, which is not JSON data"),
    Bad("a non-string key in a dict action", _openai({"name": "get_stock", "arguments": {("a",): 1}}),
        "that is not a string"),
]


@pytest.fixture
def env():
    env = gym.make(ENV_ID)
    env.reset(seed=SEED)
    yield env
    env.close()


def test_table_is_large_enough() -> None:
    assert len(BAD_ACTIONS) >= 20
    assert len({row.name for row in BAD_ACTIONS}) == len(BAD_ACTIONS)


@pytest.mark.filterwarnings("error")  # gymnasium's passive checker warns on shared info objects, bad spaces...
@pytest.mark.parametrize("row", BAD_ACTIONS, ids=[row.name for row in BAD_ACTIONS])
def test_malformed_action_through_env(env: gym.Env, row: Bad) -> None:
    if row.setup is not None:
        row.setup(env)
    state = json.dumps(env.unwrapped.world_state(), sort_keys=True)
    fingerprint = env.unwrapped.task_fingerprint()
    ended = env.unwrapped.ended

    obs, reward, terminated, truncated, info = env.step(row.action)

    assert isinstance(obs, str)
    assert "Error" in obs, obs[:300]
    assert row.phrase in obs, f"expected {row.phrase!r} in the observation, got {obs[:300]!r}"
    assert reward == 0.0
    assert terminated is ended, "one bad turn must not end a running episode"
    assert truncated is False
    assert json.dumps(env.unwrapped.world_state(), sort_keys=True) == state
    assert env.unwrapped.task_fingerprint() == fingerprint
    assert isinstance(info["messages"], list) and info["tools"]


@pytest.mark.parametrize("row", BAD_ACTIONS, ids=[row.name for row in BAD_ACTIONS])
def test_malformed_action_through_parser(row: Bad) -> None:
    parsed = parse_action(row.action)
    if row.caught_by == "parser":
        assert parsed.error is not None, f"the parser accepted {row.name}: {parsed}"
        assert row.phrase in parsed.error, parsed.error
        assert not parsed.tool_calls and not parsed.is_message and not parsed.is_tool_call
    else:
        # Well-formed as a turn; the environment rejects it afterwards.
        assert parsed.error is None, parsed.error
        assert parsed.is_tool_call


def test_bad_turns_then_recovery(env: gym.Env) -> None:
    """Errors reset nothing: after bad turns the same episode can still be solved."""
    for row in BAD_ACTIONS[:5]:
        env.step(row.action)
    oracle = env.unwrapped.oracle()
    obs, info = "", {}
    for _ in range(20):
        obs, reward, terminated, truncated, info = env.step(oracle(obs, info))
        if terminated or truncated:
            break
    assert terminated and reward == 1.0 and info["success"] is True


def test_too_many_errors_ends_the_episode(env: gym.Env) -> None:
    limit = env.unwrapped.max_invalid_actions
    for i in range(limit):
        obs, reward, terminated, truncated, info = env.step("")
        assert reward == 0.0
        assert terminated is (i == limit - 1)
    assert "Too many errors" in obs
    assert info["termination"] == "too_many_errors" and info["success"] is False


def test_a_rejected_turn_stays_out_of_the_conversation_and_its_text_is_kept_beside_it(env: gym.Env) -> None:
    before = len(env.unwrapped._info()["messages"])
    garbled = '<tool_call>{"name": "get_stock", "arguments": {"warehouse_id": </tool_call>'
    obs, _, _, _, info = env.step(garbled)
    assert obs.startswith("Error:") and len(info["messages"]) == before  # the agent sees the error only
    [kept] = info["rejected_turns"]
    assert kept["text"] == garbled and kept["error"] in obs and kept["after_message"] == before
    env.step({"role": "assistant", "content": 7})  # not a string: kept as its JSON
    obs, _, _, _, info = env.step("<tool_call>" + "x" * 100_000)  # a huge turn: rejected, its text cut, not dropped
    assert obs.startswith("Error:")
    dict_turn, huge_turn = info["rejected_turns"][1:]
    assert json.loads(dict_turn["text"]) == {"role": "assistant", "content": 7}
    assert huge_turn["text"].startswith("<tool_call>xxx") and 100 < len(huge_turn["text"]) <= 2000
    env.reset(seed=1)
    assert "rejected_turns" not in env.unwrapped._info()  # a new episode starts clean


# ---------------------------------------------------------------- accepted shapes

ACCEPTED_CALLS = {
    "Hermes block": GET,
    "Hermes block with text and <think> around it": "<think>WH-01 first.</think>Let me check.\n" + GET,
    "Hermes block with fenced JSON": "<tool_call>\n```json\n" + json.dumps(
        {"name": "get_stock", "arguments": {"warehouse_id": "WH-01"}}) + "\n```\n</tool_call>",
    "Hermes block using 'parameters'": _hermes_raw('{"name": "get_stock", "parameters": {"warehouse_id": "WH-01"}}'),
    "bare JSON": json.dumps({"name": "get_stock", "arguments": {"warehouse_id": "WH-01"}}),
    "```json fenced JSON": "```json\n" + json.dumps({"name": "get_stock", "arguments": {"warehouse_id": "WH-01"}})
                           + "\n```",
    "OpenAI dict, arguments as a string": _openai({"name": "get_stock", "arguments": '{"warehouse_id": "WH-01"}'}),
    "OpenAI dict, arguments as a dict": _openai({"name": "get_stock", "arguments": {"warehouse_id": "WH-01"}}),
    "OpenAI dict, content None": _openai({"name": "get_stock", "arguments": {"warehouse_id": "WH-01"}}, None),
    "bytes in UTF-8": GET.encode("utf-8"),
}


@pytest.mark.parametrize("action", list(ACCEPTED_CALLS.values()), ids=list(ACCEPTED_CALLS))
def test_accepted_tool_call_shapes(env: gym.Env, action: Any) -> None:
    parsed = parse_action(action)
    assert parsed.error is None and parsed.is_tool_call
    assert len(parsed.tool_calls) == 1
    call = parsed.tool_calls[0]
    assert (call.name, call.arguments) == ("get_stock", {"warehouse_id": "WH-01"})
    assert "<think>" not in parsed.content and "WH-01 first" not in parsed.content

    obs, reward, terminated, truncated, info = env.step(action)
    assert obs.startswith("<tool_response>") and "Error" not in obs
    assert json.loads(obs.removeprefix("<tool_response>\n").removesuffix("\n</tool_response>")) \
        == env.unwrapped.stock["WH-01"]
    assert (reward, terminated, truncated) == (0.0, False, False)
    assistant, tool_msg = info["messages"][-2:]
    assert assistant["role"] == "assistant" and tool_msg["role"] == "tool"
    fn = assistant["tool_calls"][0]["function"]
    assert fn["name"] == "get_stock" and json.loads(fn["arguments"]) == {"warehouse_id": "WH-01"}
    assert tool_msg["tool_call_id"] == assistant["tool_calls"][0]["id"]


@pytest.mark.parametrize("action", [
    "The total is 12 units.",
    "<think>I will just guess.</think>The total is 12 units.",
    {"role": "assistant", "content": "The total is 12 units."},
    {"role": "assistant", "content": [{"type": "text", "text": "The total is 12 units."}]},
], ids=["plain text", "plain text after <think>", "OpenAI dict without tool calls", "OpenAI content parts"])
def test_plain_text_is_a_message_to_the_user(env: gym.Env, action: Any) -> None:
    parsed = parse_action(action)
    assert parsed.error is None and parsed.is_message
    assert parsed.content == "The total is 12 units."

    obs, reward, terminated, truncated, info = env.step(action)
    assert "Error" not in obs
    # The example's scripted user has nothing to add: a message ends the episode, unscored.
    assert terminated and reward == 0.0 and info["termination"] == "agent_stop"
    assert info["messages"][-1] == {"role": "assistant", "content": "The total is 12 units."}
