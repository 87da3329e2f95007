"""TRACE's GRPO rollout function (``trace_train.train.grpo.GroupRollouts``) without a model: real envs, a scripted
batched policy in place of the model's ``HFAgent`` (the one hook it has for that), a real tokenizer.

* every member of a group plays the group's seed; tokens come back as TRL's ``rollout_func`` wants them
  (the first prompt, then the rest of the episode with tool results and user replies masked out);
* dynamic sampling re-collects a group whose rewards are all equal on fresh training seeds, as often as
  configured, and reports the informative share before resampling;
* hint mode shows the hint to exactly ``hint_share`` of each group while it generates, and the tokens TRL
  trains on carry the plain prompt.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

ENV = "trace/precondition_verification-v0"
HINT = "HINT: check the reservation's fare rules before any change."


class ScriptedPolicy:
    """Looks a user up, then answers every turn with the same message to the user; records the system prompt
    it was shown."""

    name = "scripted"

    def __init__(self) -> None:
        self.systems: list[str] = []

    def reset(self, env, observation, info) -> None:
        pass

    def act_batch(self, observations, infos):
        self.systems.extend(i["messages"][0]["content"] for i in infos if i["messages"][0]["role"] == "system")
        lookup = '<tool_call>{"name": "get_user_details", "arguments": {"user_id": "nobody_1"}}</tool_call>'
        return ["I am sorry, I cannot do that." if any(m["role"] == "tool" for m in i["messages"]) else lookup
                for i in infos]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from trace_train.tiny.build import build_model

    return AutoTokenizer.from_pretrained(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-pv",
                                                     env_ids=[ENV], corpus_seeds=4).path)  # test_grpo's base


def _run(tokenizer, seeds: list[int], rows: list[dict] | None = None, **kw):
    from trace_train.train.grpo import GroupRollouts, TrainConfig, env_kwargs_for

    cfg = TrainConfig(env_ids=[ENV], env_kwargs={"difficulty": 1, "prompt": "compact"}, model="unused",
                      output_dir="unused", group_size=4, groups_per_step=len(seeds), max_steps=2, **kw)
    policy = ScriptedPolicy()

    class Scripted(GroupRollouts):
        def _agent(self, trainer):
            return policy

    rollouts = Scripted(cfg, {ENV: env_kwargs_for(cfg, ENV)}, "cpu")
    rows = rows or [{"seed": s, "environment": ENV} for s in seeds for _ in range(cfg.group_size)]
    trainer = SimpleNamespace(_trace_rows=rows, processing_class=tokenizer, state=SimpleNamespace(global_step=0),
                              model=SimpleNamespace(training=True))
    return cfg, policy, rollouts, rollouts([r for r in rows], trainer)


def test_groups_share_a_seed_and_env_tokens_are_masked(tokenizer):
    cfg, policy, rollouts, out = _run(tokenizer, [cfg_seed := 1_000_000, cfg_seed + 1])
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["env_mask"]) == 8
    assert out["logprobs"] is None and len(out["env_reward"]) == 8
    for g in range(2):  # the same seed, the same task: identical prompts within a group
        assert len({tuple(p) for p in out["prompt_ids"][4 * g:4 * g + 4]}) == 1
    assert out["prompt_ids"][0] != out["prompt_ids"][4]
    text = tokenizer.decode(out["prompt_ids"][0])
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>system" in text
    for ids, mask in zip(out["completion_ids"], out["env_mask"]):
        model_text = tokenizer.decode([t for t, m in zip(ids, mask) if m])
        env_text = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
        assert "I am sorry, I cannot do that." in model_text and "<|im_start|>user" not in model_text
        assert "get_user_details" in model_text and "<|im_start|>user" not in model_text
        assert 0 in mask and "<tool_response>" in env_text  # the tool's result is there, without gradient
    assert rollouts.last["episodes"] == 8 and rollouts.last["resampled_groups"] == 0


def test_flat_groups_are_resampled_on_fresh_seeds(tokenizer):
    cfg, policy, rollouts, out = _run(tokenizer, [1_000_000], resample_attempts=2)
    # A fixed reply earns every member the same reward: the group is flat, re-collected twice.
    assert rollouts.last["informative_before_resampling"] == 0.0
    assert rollouts.last["resampled_groups"] == 2 and rollouts.last["episodes"] == 12
    fresh = {rollouts._resample_seed(0, 0, a) for a in range(2)}
    lo, hi = cfg.train_seed_range()
    assert all(lo <= s < hi for s in fresh) and 1_000_000 not in fresh
    assert len({tuple(p) for p in out["prompt_ids"]}) == 1  # the last collection: one group, one seed


def test_hint_mode_hints_a_share_and_trains_on_the_plain_prompt(tokenizer):
    cfg, policy, rollouts, out = _run(tokenizer, [1_000_000], hint_share=0.5, hint_text=HINT)
    # Every episode takes two turns (the lookup, then the reply): 2 of the group's 4 episodes saw the hint.
    assert len(policy.systems) == 8 and sum(HINT in s for s in policy.systems) == 4
    assert all(HINT not in tokenizer.decode(p) for p in out["prompt_ids"])


def test_a_group_split_across_processes_plays_its_share(tokenizer):
    """With several processes TRL may give one process part of a group: it plays those members (same seed);
    dynamic sampling, which needs whole groups, stays off."""
    rows = [{"seed": 1_000_000, "environment": ENV}] * 3 + [{"seed": 1_000_001, "environment": ENV}]
    cfg, policy, rollouts, out = _run(tokenizer, [1_000_000], rows=rows, resample_attempts=2)
    assert len(out["prompt_ids"]) == 4 and rollouts.last["resampled_groups"] == 0
    assert len({tuple(p) for p in out["prompt_ids"][:3]}) == 1 and out["prompt_ids"][3] != out["prompt_ids"][0]


def test_an_env_error_episode_is_left_out_of_its_group(tokenizer):
    """An episode the machine failed (termination env_error) keeps its row, as TRL needs, but enters neither the
    loss (mask of zeros) nor the group's baseline (its reward is the mean of the others)."""
    from trace_train.train.grpo import GroupRollouts, TrainConfig, env_kwargs_for

    cfg = TrainConfig(env_ids=[ENV], env_kwargs={"difficulty": 1, "prompt": "compact"}, model="unused",
                      output_dir="unused", group_size=4, groups_per_step=1, max_steps=2)

    class FailedOnce(GroupRollouts):
        def _agent(self, trainer):
            return ScriptedPolicy()

        def _play(self, agent, groups):
            played = super()._play(agent, groups)
            for record, reward in zip(played[0], (0.0, 1.0, 0.0, 1.0)):
                record["reward"] = reward
            played[0][0].update(termination="env_error", env_error="the sandbox failed: container gone")
            return played

    rollouts = FailedOnce(cfg, {ENV: env_kwargs_for(cfg, ENV)}, "cpu")
    rows = [{"seed": 1_000_000, "environment": ENV}] * 4
    trainer = SimpleNamespace(_trace_rows=rows, processing_class=tokenizer, state=SimpleNamespace(global_step=0),
                              model=SimpleNamespace(training=True))
    out = rollouts(rows, trainer)
    assert out["env_reward"] == pytest.approx([2 / 3, 1.0, 0.0, 1.0])
    assert not any(out["env_mask"][0]) and all(any(m) for m in out["env_mask"][1:])
    assert rollouts.last["env_errors"] == 1
