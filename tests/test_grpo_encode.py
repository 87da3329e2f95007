"""What GRPO trains on: an episode's tokens, and the sampler's log-probabilities of them
(``trace_train.train.grpo.encode_episode_sampled``).

* a turn whose rendering is exactly what was sampled carries the sampler's log-probs, token for token;
* the episode's last turn is trained on the tokens it sampled, even where the transcript renders it otherwise;
* an earlier turn sampled as another tokenisation of the transcript's text is trained on its sampled tokens;
* an episode that ended on rejected turns trains the last of them (mask 1, with its advantage), after the
  generation prompt it was sampled from: a malformed reply is pushed down like any other wrong one.
"""

from __future__ import annotations

import math

import pytest

from trace_train.tiny.shipped import BASES


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(BASES / "embedded-default")


def _record(messages, sampled):
    return {"messages": messages, "tools": [], "sampled_turns": sampled}


SYSTEM = {"role": "system", "content": "Answer with one word."}
USER = {"role": "user", "content": "Word: north"}


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_a_turn_rendered_as_sampled_carries_its_sampler_logprobs(tokenizer):
    from trace_train.train.grpo import encode_episode_sampled

    tokens = _ids(tokenizer, "north: south<|im_end|>")
    logprobs = [-0.5 - i for i in range(len(tokens))]
    record = _record([SYSTEM, USER, {"role": "assistant", "content": "north: south"}],
                     [{"tokens": tokens, "logprobs": logprobs, "accepted": True}])
    enc = encode_episode_sampled(tokenizer, record, 64)
    assert enc.completion_ids == tokens and enc.env_mask == [1] * len(tokens)
    assert enc.sampler_logprobs == logprobs
    assert enc.agent_tokens == enc.sampled_tokens == len(tokens)


def test_the_last_turn_is_trained_on_the_tokens_it_sampled(tokenizer):
    from trace_train.train.grpo import encode_episode_sampled

    # Sampled with a trailing space and no end token (the turn cap), which the transcript does not keep.
    tokens = _ids(tokenizer, "north: south ")
    record = _record([SYSTEM, USER, {"role": "assistant", "content": "north: south"}],
                     [{"tokens": tokens, "logprobs": [-1.0] * len(tokens), "accepted": True}])
    enc = encode_episode_sampled(tokenizer, record, 64)
    assert enc.completion_ids == tokens
    assert enc.sampled_tokens == enc.agent_tokens == len(tokens)


def test_an_episode_that_ended_on_a_rejected_turn_trains_it(tokenizer):
    from trace_train.tiny.sft_data import render_prompt
    from trace_train.train.grpo import encode_episode_sampled

    bad = _ids(tokenizer, "<tool_call>{oops<|im_end|>")
    record = _record([SYSTEM, USER], [{"tokens": bad, "logprobs": [-2.0] * len(bad), "accepted": False}])
    enc = encode_episode_sampled(tokenizer, record, 64)
    assert enc.prompt_ids == _ids(tokenizer, render_prompt(tokenizer, [SYSTEM, USER], None))
    assert enc.completion_ids == bad and enc.env_mask == [1] * len(bad)
    assert enc.sampler_logprobs == [-2.0] * len(bad)
    # Without recorded samples nothing of it can be trained: a masked end token shapes the baseline only.
    enc = encode_episode_sampled(tokenizer, {"messages": [SYSTEM, USER], "tools": []}, 64)
    assert enc.env_mask == [0] and math.isnan(enc.sampler_logprobs[0])


def test_a_rejected_turn_after_a_tool_result_follows_its_generation_prompt(tokenizer):
    from trace_train.tiny.sft_data import render_prompt
    from trace_train.train.grpo import encode_episode_sampled

    call = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": {"word": "north"}}}]}
    messages = [SYSTEM, USER, call, {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "south"}]
    bad = _ids(tokenizer, "???<|im_end|>")
    record = _record(messages, [{"tokens": [1], "logprobs": [0.0], "accepted": True},
                                {"tokens": bad, "logprobs": [-3.0] * len(bad), "accepted": False}])
    enc = encode_episode_sampled(tokenizer, record, 256)
    full = enc.prompt_ids + enc.completion_ids
    context = _ids(tokenizer, render_prompt(tokenizer, messages, None))
    assert tokenizer.decode(full[:-len(bad)]) == tokenizer.decode(context)  # the prompt the rejected turn saw
    assert enc.completion_ids[-len(bad):] == bad and enc.env_mask[-len(bad):] == [1] * len(bad)
    assert enc.sampler_logprobs[-len(bad):] == [-3.0] * len(bad)


def test_an_earlier_turn_sampled_as_another_split_of_its_text_is_trained_as_sampled(tokenizer):
    from trace_train.train.grpo import encode_episode_sampled

    # "south" sampled as two tokens where the tokenizer writes one: same text, other ids.
    canonical = _ids(tokenizer, "north: south<|im_end|>")
    split = _ids(tokenizer, "north: ") + _ids(tokenizer, "sou") + _ids(tokenizer, "th<|im_end|>")
    assert split != canonical and tokenizer.decode(split) == tokenizer.decode(canonical)
    second = _ids(tokenizer, "done<|im_end|>")
    record = _record([SYSTEM, USER, {"role": "assistant", "content": "north: south"}, USER,
                      {"role": "assistant", "content": "done"}],
                     [{"tokens": split, "logprobs": [-1.0] * len(split), "accepted": True},
                      {"tokens": second, "logprobs": [-0.5] * len(second), "accepted": True}])
    enc = encode_episode_sampled(tokenizer, record, 256)
    trained = [t for t, m in zip(enc.completion_ids, enc.env_mask) if m]
    assert trained == split + second
    assert enc.sampled_tokens == enc.agent_tokens == len(split) + len(second)
    # A turn whose sampled text differs from the transcript's (not the last) keeps the transcript's ids.
    record["sampled_turns"][0]["tokens"] = _ids(tokenizer, "north: south <|im_end|>")
    enc = encode_episode_sampled(tokenizer, record, 256)
    assert [t for t, m in zip(enc.completion_ids, enc.env_mask) if m] == canonical + second
    assert enc.sampled_tokens == len(second)
