"""Property-based fuzzing of every registered environment, through ``gym.make`` and ``step``.

Hypothesis drives each id that runs without Docker (ids whose registry ``requires`` names ``docker``
are left out of the parametrization, by that field) with whole episodes of hostile turns: random text with lone surrogates
and control characters; tool calls in every action shape (Hermes blocks, bare and fenced JSON,
OpenAI assistant dicts, plain text) that are random, malformed or half right; wrong-typed, deeply
nested, non-finite and huge arguments; many calls in one turn; turns after the episode ended. Every
step must hold the environment contract (docs/design.md): no exception, no ``env_error``, a reward in
[0, 1], an observation inside the observation space, ``info["messages"]`` JSON- and UTF-8-
serialisable, and a step time under :data:`STEP_TIME_LIMIT_S` (a bound that says "never hangs", not
a speed target: CPU seconds of this process, so that a loaded, shared machine does not fail it, plus a
much looser wall-clock bound for a step that would block without computing). After each fuzzed episode the oracle must still score 1.0 on a fresh reset.

Profiles: the default (``ci``) is derandomized and sized for CI (about a minute on two cores);
``TRACE_FUZZ_PROFILE=thorough`` runs many more, random examples per id.

The second half holds targeted regression tests, one per class of input that once broke an env,
each over several variants of the class and over every id.
"""

from __future__ import annotations

import json
import math
import os
import re
import reprlib
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trace_envs
from trace_envs.agents import OracleAgent
from trace_envs.core.parsing import MAX_ACTION_CHARS, MAX_INT_DIGITS, MAX_JSON_DEPTH

#: Any single step that computes longer than this (CPU seconds) counts as a hang.
STEP_TIME_LIMIT_S = 5.0
#: ... or that takes longer than this on the wall clock (generous: CI machines are shared and noisy).
STEP_WALL_LIMIT_S = 60.0

PROFILES = {
    "ci": dict(max_examples=120, derandomize=True, database=None),
    "thorough": dict(max_examples=300, derandomize=False),
}
PROFILE = os.environ.get("TRACE_FUZZ_PROFILE", "ci")
if PROFILE not in PROFILES:
    raise ValueError(f"TRACE_FUZZ_PROFILE must be one of {sorted(PROFILES)}, got {PROFILE!r}")
FUZZ_SETTINGS = settings(
    deadline=None,  # each step is timed by the test itself, with STEP_TIME_LIMIT_S
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
    print_blob=True,
    **PROFILES[PROFILE],
)


def _fuzzable_ids() -> list[str]:
    """Every registered id that runs without Docker (by its registry ``requires``), at its newest version; the
    SWE target's sandbox has its own adversarial suite (tests/test_swe_adversarial.py, tests/test_swe_sandbox_limits.py).

    An older version of the same entry point runs the same parser, tools and episode loop (versions change the
    reward and the task mix), so fuzzing the newest covers it; the conformance suite still runs every id.
    """
    entries = [e for e in trace_envs.registered() if "docker" not in e.requires]
    newest: dict[tuple[str, str], str] = {}
    for e in entries:
        name, _, version = e.id.rpartition("-v")
        key = (name, e.entry_point)
        if key not in newest or int(version or 0) > int(newest[key].rpartition("-v")[2] or 0):
            newest[key] = e.id
    return [e.id for e in entries if e.id in newest.values()]


_ENVS: dict[str, gym.Env] = {}


@pytest.fixture(scope="module", autouse=True)
def _close_envs():
    yield
    for env in _ENVS.values():
        env.close()
    _ENVS.clear()


def _env(env_id: str) -> gym.Env:
    """One env per id for the whole module (gym.make is the costly part; reset gives a fresh episode)."""
    if env_id not in _ENVS:
        _ENVS[env_id] = gym.make(env_id)
    return _ENVS[env_id]


# ---------------------------------------------------------------- the contract, checked on every step

def check_step(env: gym.Env, action: Any) -> tuple[str, float, bool, dict]:
    """One step that must hold the environment contract; returns (obs, reward, ended, info)."""
    t0, c0 = time.perf_counter(), time.process_time()
    obs, reward, terminated, truncated, info = env.step(action)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    shown = _show(action)
    assert cpu < STEP_TIME_LIMIT_S, f"a step computed for {cpu:.1f} s (limit {STEP_TIME_LIMIT_S} s) on {shown}"
    assert wall < STEP_WALL_LIMIT_S, f"a step took {wall:.1f} s on the wall clock on {shown}"
    check_observation(env, obs, shown)
    assert isinstance(reward, float) and 0.0 <= reward <= 1.0, f"reward {reward!r} on {shown}"
    assert info.get("termination") != "env_error", f"env_error on {shown}: {obs[:300]!r}"
    check_info(info, shown)
    return obs, reward, bool(terminated or truncated), info


_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 200


def _show(action: Any) -> str:
    """A short repr of an action for failure messages (bounded depth and length)."""
    try:
        return _REPR.repr(action)
    except ValueError:  # an int beyond Python's digit limit somewhere inside
        return f"<a {type(action).__name__} holding an integer too long to print>"


def check_observation(env: gym.Env, obs: Any, shown: str = "") -> None:
    assert isinstance(obs, str), f"observation of type {type(obs).__name__} on {shown}"
    assert env.observation_space.contains(obs), (
        f"observation outside {env.observation_space} (length {len(obs):,}, well-formed "
        f"{obs.encode('utf-8', 'surrogatepass') == obs.encode('utf-8', 'replace')}) on {shown}")


def check_info(info: dict, shown: str = "") -> None:
    """``messages`` and ``tools`` must go to a trajectory file as they are: strict JSON, valid UTF-8."""
    for key in ("messages", "tools"):
        text = json.dumps(info[key], ensure_ascii=False, allow_nan=False)
        text.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate
    if "reward_breakdown" in info:
        json.dumps(info["reward_breakdown"], ensure_ascii=False, default=str).encode("utf-8")


def check_oracle(env: gym.Env, seed: int) -> None:
    record = trace_envs.rollout(env, OracleAgent(), seed=seed)
    assert record["reward"] == 1.0, (f"after fuzzing, the oracle scored {record['reward']} on seed {seed} "
                                     f"({record['termination']}, {record['reward_breakdown']})")


# ---------------------------------------------------------------- strategies

@dataclass(frozen=True)
class Raw:
    """A big value, kept as a small recipe until the action is built (so Hypothesis can print and shrink
    it): an integer beyond Python's digit limit, nesting thousands deep, a multi-megabyte string.
    ``text`` is its JSON, written verbatim into text actions; ``value()`` is the Python value for dicts."""

    kind: str
    size: int

    def __repr__(self) -> str:
        return f"Raw({self.kind!r}, {self.size})"

    @property
    def text(self) -> str:
        if self.kind == "int":
            return "9" * self.size
        if self.kind == "list":
            return "[" * self.size + "]" * self.size
        if self.kind == "dict":
            return '{"k": ' * self.size + "{}" + "}" * self.size
        return '"' + "x" * self.size + '"'

    def value(self) -> Any:
        if self.kind == "str":
            return "x" * self.size
        if self.kind == "int":
            return 10 ** (self.size - 1) + 7  # built by arithmetic: str() of it would raise
        if self.kind == "list":
            nested: Any = []
            for _ in range(self.size):
                nested = [nested]
            return nested
        nested = {}
        for _ in range(self.size):
            nested = {"k": nested}
        return nested


SURROGATES = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
CONTROLS = st.characters(min_codepoint=0x00, max_codepoint=0x1F) | st.characters(min_codepoint=0x7F,
                                                                                 max_codepoint=0x9F)
CHARS = st.one_of(st.characters(), st.characters(max_codepoint=0x7E), SURROGATES, CONTROLS)
TEXT = st.text(CHARS, max_size=30)
HUGE_TEXT = st.sampled_from([70_000, 1_000_000, 3_000_000]).map(lambda n: Raw("str", n))
RAW = st.one_of(
    st.sampled_from([MAX_INT_DIGITS + 1, 4_301, 6_000]).map(lambda n: Raw("int", n)),
    st.sampled_from([MAX_JSON_DEPTH + 1, 900, 5_000]).map(lambda n: Raw("list", n)),
    st.sampled_from([MAX_JSON_DEPTH + 1, 2_000]).map(lambda n: Raw("dict", n)),
)
NUMBERS = st.one_of(
    st.integers(),
    st.floats(),  # NaN, ±Infinity included
    st.sampled_from([0, -1, 10 ** 30, 2 ** 63, -(10 ** 300), 1e308, -0.0, 5e-324, math.inf, math.nan]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(TEXT, kids, max_size=3), max_leaves=8)
ODD_VALUES = st.one_of(JSON_VALUES, RAW, HUGE_TEXT)


def schema_value(schema: dict, words: list[str]) -> st.SearchStrategy:
    """Values shaped like ``schema`` (so calls reach the tools' own code), built from the episode's words."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema:
        return st.one_of([schema_value(option, words) for option in schema["anyOf"]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([schema_value({**schema, "type": k}, words) for k in kind])
    if kind == "string":
        return st.one_of(st.sampled_from(words), TEXT) if words else TEXT
    if kind == "integer":
        return st.one_of(st.integers(-3, 5), st.integers())
    if kind == "number":
        return st.one_of(st.integers(0, 500), NUMBERS)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(schema_value(schema.get("items", {}), words), max_size=3)
    if kind == "object" and "properties" in schema:
        props = {k: schema_value(v, words) for k, v in schema["properties"].items()}
        return st.fixed_dictionaries({}, optional=props)
    return JSON_VALUES


def arguments_for(tool: dict | None, words: list[str]) -> st.SearchStrategy:
    if tool is None:
        return st.dictionaries(TEXT, ODD_VALUES, max_size=3)
    good = schema_value(tool["function"]["parameters"], words)
    mutated = st.builds(lambda base, key, value: {**base, key: value}, good,
                        st.sampled_from(list(tool["function"]["parameters"]["properties"]) or ["x"]) | TEXT,
                        ODD_VALUES)
    return st.one_of(good, good, mutated, ODD_VALUES)


@st.composite
def tool_calls(draw, tools: list[dict], words: list[str]) -> dict:
    """One call object: a real tool (mostly) or a wrong name, with arguments right, wrong or hostile."""
    tool = draw(st.sampled_from(tools)) if tools and draw(st.integers(0, 9)) < 8 else None
    name: Any = tool["function"]["name"] if tool else draw(st.one_of(TEXT, JSON_VALUES, HUGE_TEXT))
    call: dict[str, Any] = {"name": name, "arguments": draw(arguments_for(tool, words))}
    twist = draw(st.integers(0, 12))
    if twist == 0:
        del call["name"]
    elif twist == 1:
        call["parameters"] = call.pop("arguments")
    elif twist == 2:
        call[draw(TEXT)] = draw(JSON_VALUES)
    elif twist == 3:
        call["id"] = draw(st.one_of(TEXT, JSON_VALUES, HUGE_TEXT))
    return call


def dump(value: Any, ascii_only: bool) -> str:
    """JSON text of a generated value; :class:`Raw` fragments verbatim, NaN and Infinity as Python writes them."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ", ".join(f"{dump(str(k), ascii_only)}: {dump(v, ascii_only)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dump(v, ascii_only) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ascii_only)


def build(value: Any) -> Any:
    """The action itself: every :class:`Raw` recipe (also in keys) replaced by its value."""
    if isinstance(value, Raw):
        return value.value()
    if isinstance(value, dict):
        return {build(k): build(v) for k, v in value.items()}
    if isinstance(value, list):
        return [build(v) for v in value]
    return value


@st.composite
def actions(draw, tools: list[dict], words: list[str]) -> Any:
    """One agent turn in any shape, usually hostile."""
    shape = draw(st.sampled_from(["hermes", "hermes", "bare", "openai", "openai", "plain", "words", "other"]))
    calls = draw(st.lists(tool_calls(tools, words), min_size=1,
                          max_size=draw(st.sampled_from([1, 1, 2, 12]))))
    # ensure_ascii=True turns lone surrogates into \\udXXX escapes, False leaves them raw in the text
    ascii_only = draw(st.booleans())
    if shape in ("hermes", "bare"):
        blocks = [dump(c, ascii_only) for c in calls]
        if shape == "bare":
            text = blocks[0]
            if draw(st.booleans()):
                text = f"```json\n{text}\n```"
        else:
            fence = draw(st.booleans())
            text = draw(TEXT) + "".join(
                "<tool_call>\n" + (f"```json\n{b}\n```" if fence else b) + "\n</tool_call>" for b in blocks)
            if draw(st.booleans()):
                text = "<think>" + draw(TEXT) + "</think>" + text
        cut = draw(st.integers(0, 6))
        if cut == 0:  # a truncated generation
            text = text[:draw(st.integers(0, max(0, len(text) - 1)))]
        return text
    if shape == "openai":
        content = draw(st.one_of(st.none(), TEXT, st.lists(st.fixed_dictionaries(
            {"type": st.just("text"), "text": st.one_of(TEXT, JSON_VALUES)}), max_size=3), JSON_VALUES))
        entries = []
        for c in calls:
            fn: dict[str, Any] = {k: v for k, v in c.items() if k in ("name", "arguments", "parameters")}
            if "arguments" in fn and draw(st.booleans()):
                fn["arguments"] = dump(fn["arguments"], ascii_only)
            entries.append({"id": c.get("id", draw(TEXT)), "type": "function", "function": fn})
        message: dict[str, Any] = {"role": draw(st.sampled_from(["assistant", "assistant", "user"])),
                                   "content": content}
        if draw(st.integers(0, 4)):
            message["tool_calls"] = entries
        return message
    if shape == "plain":
        return draw(st.one_of(TEXT, HUGE_TEXT, st.text(CHARS, min_size=200, max_size=2_000)))
    if shape == "words":  # plausible talk, so user simulators and message hooks are reached
        picked = draw(st.lists(st.sampled_from(words + ["yes", "no", "ok", "?", "thanks"]), min_size=1, max_size=8))
        return " ".join(picked)
    return draw(st.one_of(st.none(), st.integers(), st.binary(max_size=20), st.lists(SCALARS, max_size=2),
                          st.dictionaries(TEXT, JSON_VALUES, max_size=2)))


_WORD = re.compile(r"[A-Za-z0-9_#.@-]{3,40}")


def episode_words(obs: str) -> list[str]:
    """Identifiers and words of the opening observation (user ids, order ids, paths...), deduplicated."""
    return list(dict.fromkeys(_WORD.findall(obs[-6_000:])))[:200]


# ---------------------------------------------------------------- the fuzz test

@pytest.mark.parametrize("env_id", _fuzzable_ids())
@FUZZ_SETTINGS
@given(data=st.data())
def test_fuzzed_episodes_keep_the_contract(env_id: str, data: st.DataObject) -> None:
    env = _env(env_id)
    seed = data.draw(st.integers(0, 10_000), label="seed")
    obs, info = env.reset(seed=seed)
    check_observation(env, obs)
    check_info(info)
    tools, words = info["tools"], episode_words(obs)
    ended = False
    for _ in range(data.draw(st.integers(1, 8), label="turns")):
        action = build(data.draw(actions(tools, words), label="action"))
        obs, reward, ended, info = check_step(env, action)
        words = list(dict.fromkeys(words + episode_words(obs)))[-300:]
        if ended:
            break
    if data.draw(st.booleans(), label="end and keep stepping"):
        for _ in range(env.unwrapped.max_invalid_actions + 1):
            if ended:
                break
            obs, reward, ended, info = check_step(env, "")
        assert ended
        for _ in range(2):
            action = build(data.draw(actions(tools, words), label="after end"))
            obs, reward, ended_again, info = check_step(env, action)
            assert ended_again and reward == 0.0
    check_oracle(env, seed)


# ---------------------------------------------------------------- targeted regressions, one per class

def _fresh(env_id: str, seed: int = 0) -> tuple[gym.Env, str, dict]:
    env = _env(env_id)
    obs, info = env.reset(seed=seed)
    return env, obs, info


def _state(env: gym.Env) -> str:
    return json.dumps(env.unwrapped.world_state(), sort_keys=True, default=str)


def _first_tool(info: dict) -> tuple[str, str]:
    """A tool of the env and one of its argument names (any: the point is where the hostile value goes)."""
    for schema in info["tools"]:
        props = schema["function"]["parameters"]["properties"]
        if props:
            return schema["function"]["name"], next(iter(props))
    if not info["tools"]:  # a tool-less env (the sanity tasks): a call to a tool it does not have
        return "lookup", "x"
    return info["tools"][0]["function"]["name"], "x"


def _hermes(payload: str) -> str:
    return f"<tool_call>\n{payload}\n</tool_call>"


def _openai(name: Any, arguments: Any, call_id: Any = "call_1", content: Any = "") -> dict:
    return {"role": "assistant", "content": content,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


def assert_rejected(env: gym.Env, action: Any, phrase: str) -> str:
    """The turn comes back as an error observation with ``phrase``; the episode and the state carry on."""
    state = _state(env)
    obs, reward, ended, info = check_step(env, action)
    assert "Error" in obs and phrase in obs, f"expected {phrase!r} in {obs[:400]!r}"
    assert not ended and reward == 0.0, "one bad turn must not end the episode"
    assert _state(env) == state
    return obs


def assert_all_rejected(env: gym.Env, turns: dict[str, tuple[Any, str]]) -> None:
    """Each turn rejected with its phrase (a fresh episode every few turns, under the too-many-errors limit)."""
    for n, (where, (action, phrase)) in enumerate(turns.items()):
        if n and n % (env.unwrapped.max_invalid_actions - 1) == 0:
            env.reset(seed=0)
        try:
            assert_rejected(env, action, phrase)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}") from None


SURROGATE_ESCAPES = ["\\ud800", "\\udfff", "\\udbff", "a\\ud83d", "\\ude00b"]


def surrogate_turns(name: str, arg: str, esc: str) -> dict[str, Any]:
    """The same lone surrogate in every place of a turn that the env keeps or echoes."""
    raw = json.loads(f'"{esc}"')  # the Python string with the lone surrogate in it
    return {
        "Hermes argument value": _hermes(f'{{"name": "{name}", "arguments": {{"{arg}": "{esc}"}}}}'),
        "Hermes argument key": _hermes(f'{{"name": "{name}", "arguments": {{"{esc}": 1}}}}'),
        "Hermes tool name": _hermes(f'{{"name": "{esc}{name}", "arguments": {{}}}}'),
        "Hermes call id": _hermes(f'{{"name": "{name}", "arguments": {{}}, "id": "{esc}"}}'),
        "bare JSON value": f'{{"name": "{name}", "arguments": {{"{arg}": ["{esc}"]}}}}',
        "OpenAI arguments string": _openai(name, f'{{"{arg}": "{esc}"}}'),
        "OpenAI arguments dict": _openai(name, {arg: raw}),
        "OpenAI argument key": _openai(name, {raw: "x"}),
        "OpenAI tool name": _openai(raw, {}),
        "OpenAI call id": _openai(name, {}, call_id=raw),
        "OpenAI content": {"role": "assistant", "content": "hello " + raw},
        "OpenAI content part": {"role": "assistant", "content": [{"type": "text", "text": raw}]},
    }


@pytest.mark.parametrize("env_id", _fuzzable_ids())
@pytest.mark.parametrize("esc", SURROGATE_ESCAPES)
def test_lone_surrogates_are_rejected_everywhere(env_id: str, esc: str) -> None:
    env, _, info = _fresh(env_id)
    name, arg = _first_tool(info)
    assert_all_rejected(env, {where: (action, "surrogate") for where, action in surrogate_turns(name, arg, esc).items()})
    check_oracle(env, 0)


LONG_INTEGERS = [MAX_INT_DIGITS + 1, 4_301, 20_000]
DEPTHS = [MAX_JSON_DEPTH + 1, 1_000, 5_000, 30_000]  # 30,000 nested lists are just under the length limit


def unreadable_turns(name: str, arg: str) -> dict[str, tuple[Any, str]]:
    """Turns that once ended the episode with env_error, each with the phrase its error must contain."""
    turns: dict[str, tuple[Any, str]] = {}
    for digits in LONG_INTEGERS:
        text = "7" * digits
        turns[f"{digits}-digit integer in a Hermes block"] = (
            _hermes(f'{{"name": "{name}", "arguments": {{"{arg}": {text}}}}}'), "digits")
        turns[f"{digits}-digit integer in bare JSON"] = (f'{{"name": "{name}", "arguments": {{"{arg}": [{text}]}}}}',
                                                         "digits")
        turns[f"{digits}-digit integer in an arguments string"] = (_openai(name, f'{{"{arg}": {text}}}'), "digits")
        turns[f"{digits}-digit Python int in a dict"] = (_openai(name, {arg: 10 ** digits}), "digits")
    for value in (5, None, 1.5, ["a"], {"t": "x"}):
        turns[f"content part text {type(value).__name__}"] = (
            {"role": "assistant", "content": [{"type": "text", "text": value}]}, "must be a string")
    turns["content part not an object"] = ({"role": "assistant", "content": ["hi"]}, "content part 0")
    for depth in DEPTHS:
        lists = "[" * depth + "]" * depth
        objects = '{"a": ' * min(depth, 5_000) + "1" + "}" * min(depth, 5_000)
        nested: Any = 1
        for _ in range(depth * 3):  # a Python value can be deeper than any text within the length limit
            nested = {"a": [nested]}
        turns[f"lists {depth} deep in a Hermes block"] = (
            _hermes(f'{{"name": "{name}", "arguments": {{"{arg}": {lists}}}}}'), "nested too deeply")
        turns[f"objects {depth} deep in bare JSON"] = (f'{{"name": "{name}", "arguments": {objects}}}',
                                                       "nested too deeply")
        turns[f"lists {depth} deep in an arguments string"] = (_openai(name, f'{{"{arg}": {lists}}}'),
                                                              "nested too deeply")
        turns[f"Python value {depth} deep in a dict"] = (_openai(name, {arg: nested}), "nested too deeply")
    return turns


@pytest.mark.parametrize("env_id", _fuzzable_ids())
def test_unreadable_turns_are_error_observations(env_id: str) -> None:
    env, _, info = _fresh(env_id)
    name, arg = _first_tool(info)
    assert_all_rejected(env, unreadable_turns(name, arg))
    check_oracle(env, 0)


@pytest.mark.parametrize("env_id", _fuzzable_ids())
def test_oversized_dict_actions_are_rejected_and_never_echoed(env_id: str) -> None:
    env, _, info = _fresh(env_id)
    name, arg = _first_tool(info)
    for size in (MAX_ACTION_CHARS + 1, 3_000_000):
        big = "n" * size
        turns = {"tool name": _openai(big, {}), "call id": _openai(name, {}, call_id=big),
                 "argument value": _openai(name, {arg: big}), "argument key": _openai(name, {big: 1}),
                 "content": {"role": "assistant", "content": big},
                 "content beside a call": _openai(name, {}, content=big),
                 "content part": {"role": "assistant", "content": [{"type": "text", "text": big}]}}
        assert_all_rejected(env, {where: (action, f"{MAX_ACTION_CHARS:,}") for where, action in turns.items()})
        assert len(env.unwrapped.messages[-1].get("content") or "") < 1_000
        env.reset(seed=0)
    # Within the limit, an unknown name is echoed only in part.
    obs = assert_rejected(env, _openai("n" * 60_000, {}), "unknown tool")
    assert len(obs) < 2_000


def _number_paths(schema: dict, path: tuple = ()) -> list[tuple]:
    """Paths (keys, and ``0`` for an array item) to every argument of type number in a tool's schema."""
    kinds = schema.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "number" in kinds:
        return [path]
    found = []
    for key, sub in (schema.get("properties") or {}).items():
        found += _number_paths(sub, path + (key,))
    if "items" in schema:
        found += _number_paths(schema["items"], path + (0,))
    for option in schema.get("anyOf", ()):
        found += _number_paths(option, path)
    return found


def _example(schema: dict) -> Any:
    """A small value of the right type for ``schema`` (required fields filled)."""
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return _example(schema["anyOf"][0])
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _example(props[k]) for k in schema.get("required", ())}
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "array": [], "null": None}.get(kind, "x")


def _with(schema: dict, path: tuple, value: Any) -> Any:
    """A valid-looking value for ``schema`` with ``value`` placed at ``path`` (the only thing wrong with it)."""
    if not path:
        return value
    key, rest = path[0], path[1:]
    if key == 0:
        return [_with(schema["items"], rest, value)]
    base = _example(schema)
    base[key] = _with(schema["properties"][key], rest, value)
    return base


def _ids_with_number_arguments() -> list[str]:
    """The fuzzable ids with at least one ``number`` argument in their tool schemas (read at collection)."""
    ids = []
    for env_id in _fuzzable_ids():
        env = gym.make(env_id)
        try:
            _, info = env.reset(seed=0)
            if any(_number_paths(s["function"]["parameters"]) for s in info["tools"]):
                ids.append(env_id)
        finally:
            env.close()
    return ids


@pytest.mark.parametrize("env_id", _ids_with_number_arguments())
def test_non_finite_numbers_are_rejected_for_every_number_argument(env_id: str) -> None:
    env, _, info = _fresh(env_id)
    paths = [(s["function"]["name"], p) for s in info["tools"] for p in _number_paths(s["function"]["parameters"])]
    schemas = {s["function"]["name"]: s["function"]["parameters"] for s in info["tools"]}
    for name, path in paths:
        for literal in ("NaN", "Infinity", "-Infinity", "1e999", "-1e400"):
            env.reset(seed=0)
            args = json.dumps(_with(schemas[name], path, "__X__")).replace('"__X__"', literal)
            obs = assert_rejected(env, _hermes(f'{{"name": "{name}", "arguments": {args}}}'), "must be a finite number")
            assert obs.count("must be") == 1, f"the non-finite number should be the only problem: {obs[:300]}"
        env.reset(seed=0)
        assert_rejected(env, _openai(name, _with(schemas[name], path, math.nan)), "must be a finite number")


@pytest.mark.parametrize("env_id", _fuzzable_ids())
def test_info_tools_is_each_episodes_own_copy(env_id: str) -> None:
    first, second = gym.make(env_id), gym.make(env_id)
    try:
        _, info = first.reset(seed=0)
        pristine = json.dumps(info["tools"], sort_keys=True)
        if info["tools"]:  # a tool-less env (the sanity tasks) has only the list to change
            info["tools"][0]["function"]["name"] = "hijacked"
            info["tools"][0]["function"]["parameters"]["properties"].clear()
        info["tools"].append({"type": "function", "function": {"name": "extra"}})
        _, other = second.reset(seed=0)
        assert json.dumps(other["tools"], sort_keys=True) == pristine, "another env saw the change"
        _, again = first.reset(seed=1)
        assert json.dumps(again["tools"], sort_keys=True) == pristine, "the next episode saw the change"
        assert "hijacked" not in json.dumps(first.unwrapped.tools)
        obs, *_ = second.step(_hermes(json.dumps({"name": "extra", "arguments": {}})))
        assert "unknown tool 'extra'" in obs
    finally:
        first.close()
        second.close()


# Patterns that backtrack exponentially on the lines below (the first also on ordinary code): Python's
# re would run each for hours, and cannot be interrupted while it matches.
BACKTRACKING_PATTERNS = [r"(.*){1,32000}[bc]", r"(a|aa)+$", r"(a|a)+$"]
HOSTILE_LINES = "\n".join(["a" * 40 + "!", "x" * 40, "def " + "word " * 30 + "(self)"] * 50)


@pytest.mark.parametrize("pattern", BACKTRACKING_PATTERNS)
def test_a_backtracking_search_stops_at_its_time_limit(pattern: str) -> None:
    from trace_envs.swe.read_tools import grep_lines

    c0 = time.process_time()
    with pytest.raises(trace_envs.ToolError, match=r"stopped after 0.3 s of matching .*simpler pattern"):
        grep_lines(pattern, [("hostile.py", HOSTILE_LINES)], limit=200, time_limit=0.3)
    # The budget is CPU time (regex's own clock), checked every few thousand steps: bounded, not exact.
    assert time.process_time() - c0 < 0.3 + 0.5


def test_search_tool_is_bounded_and_keeps_working() -> None:
    from trace_envs.swe.read_tools import SEARCH_TIME_LIMIT_S

    assert SEARCH_TIME_LIMIT_S * 2 < STEP_TIME_LIMIT_S
    env, _, _ = _fresh("trace/swe_localization-v0")
    obs, *_ = check_step(env, _hermes(json.dumps({"name": "search", "arguments": {"pattern": BACKTRACKING_PATTERNS[0]}})))
    assert "the search stopped after" in obs
    obs, *_ = check_step(env, _hermes(json.dumps({"name": "search", "arguments": {"pattern": r"def \w+\("}})))
    assert ".py:" in obs and "Error" not in obs, "an ordinary search still works afterwards"
    check_oracle(env, 0)


class _Echo(trace_envs.TraceEnv):
    """A minimal env whose tool output and user replies are whatever the test wants (for the core bounds)."""

    def __init__(self, max_obs: int = 500):
        super().__init__()
        self.observation_space = trace_envs.UnicodeText(max_length=max_obs)
        self.max_output_chars = 10_000_000

    def _generate_task(self, options: dict) -> str:
        return "Echo things."

    @trace_envs.tool
    def echo(self, text: str, times: int = 1) -> str:
        """Repeat a text.

        Args:
            text: what to repeat.
            times: how many times.
        """
        return json.loads('"\\ud800"') + text * times  # a lone surrogate of the tool's own making

    def _on_user_message(self, text: str) -> str:
        return "sure " + json.loads('"\\udfff"') * 3

    def _evaluate(self) -> tuple[float, dict]:
        return 0.0, {}


def test_every_observation_fits_the_space_and_every_transcript_string_encodes() -> None:
    env = _Echo(max_obs=500)
    obs, info = env.reset(seed=0)
    check_observation(env, obs)
    for action in (_hermes(json.dumps({"name": "echo", "arguments": {"text": "ab", "times": 100_000}})),
                   "hello there", {"role": "assistant", "content": "hi"}):
        obs, reward, terminated, truncated, info = env.step(action)
        check_observation(env, obs)
        assert len(obs) <= 500
        check_info(info)
    assert "\ufffd" in env.messages[-1]["content"]
    assert "cut:" in env.step(_hermes(json.dumps({"name": "echo", "arguments": {"text": "z", "times": 9_999}})))[0]


def test_records_with_any_content_are_written_and_read_back(tmp_path) -> None:
    from trace_train.rollouts import jsonl_line, read_trajectories

    record = {"env_id": "x", "seed": 0, "messages": [{"role": "user", "content": "a\ud800b é 😀"}],
              "reward_breakdown": {"nan": math.nan, "inf": -math.inf, (1, 2): {3}}, "reward": 0.5}
    path = tmp_path / "t.jsonl"
    path.write_bytes(jsonl_line(record) + jsonl_line({"env_id": "y", "seed": 1, "note": "ok"}))
    back = read_trajectories(path)
    assert [r["env_id"] for r in back] == ["x", "y"]
    assert back[0]["messages"][0]["content"] == "a\ud800b é 😀"  # lossless, through a \\ud800 escape
    assert back[0]["reward_breakdown"] == {"nan": None, "inf": None, "(1, 2)": "{3}"}
    path.read_bytes().decode("utf-8")  # the file itself is valid UTF-8 and strict JSON
    for line in path.read_bytes().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))


class _HostileThenOracle:
    """Sends every hostile turn of the regressions above, then solves the task like the oracle."""

    name = "hostile_then_oracle"

    def reset(self, env, obs, info) -> None:
        name, arg = _first_tool(info)
        turns = list(surrogate_turns(name, arg, "\\ud800").values())[:4]
        turns += [action for action, _ in list(unreadable_turns(name, arg).values())[::9]][:4]
        self.turns = turns
        self.oracle = OracleAgent()
        self.oracle.reset(env, obs, info)

    def __call__(self, obs, info):
        return self.turns.pop(0) if self.turns else self.oracle(obs, info)


def test_trace_rollout_keeps_every_episode_of_a_hostile_agent(tmp_path) -> None:
    from trace_envs.agents import register_agent
    from trace_train.cli import main
    from trace_train.rollouts import read_trajectories

    register_agent("hostile_then_oracle", _HostileThenOracle)
    out = tmp_path / "hostile.jsonl"
    assert main(["rollout", "--env", "trace/tau_airline-v0", "--agent", "hostile_then_oracle", "--seeds", "3",
                 "--out", str(out)]) == 0
    records = read_trajectories(out)
    assert len(records) == 3
    for r in records:
        assert r["reward"] == 1.0 and r["termination"] != "env_error", (r["termination"], r["reward_breakdown"])
        # rejected turns are not part of the transcript; the transcript itself encodes
        assert not any("surrogate" in (m.get("content") or "") for m in r["messages"])
        json.dumps(r["messages"], ensure_ascii=False).encode("utf-8")
