"""TRACE's GRPO learns from reward, and only from reward (docs/train.md, "Does the trainer learn?").

On the sanity task ``trace/sanity_pair-v0`` (the system prompt lists four word pairs, the user names a first word,
the reply reads it back and gives its pair; chance 0.25), from a start that answers in format at chance
(:func:`trace_train.train.sanity.near_chance_start`: the shipped tiny base fitted on random pairs), the trainer as ``trace train`` runs it (fast decode, shared-prefix loss):

* 40 steps of 8 groups of 8 lift held-out greedy balanced accuracy from chance to at least 0.75
  (``bench/grpo_learning.py`` measured 1.00 at step 40 on this machine, the same run's TRL anchor within its
  margin), and the teacher-forced margin of the right pair from below zero to above 2 nats;
* the same run with each step's rewards shuffled (``shuffle_rewards``) stays at chance (≤ 0.5);
* every step logs the train/inference mismatch: the KL between the log-probs the rollouts sampled with and the
  loss's own log-probs of the same tokens stays ≤ 1e-3 (prime-rl's CI bound is 0.02) on at least 90% of the
  agent's tokens, which are exactly the sampled ones.

Seeded end to end (the start, the trainer's RNG, the held-out seeds): the same numbers every run on this machine.
"""

from __future__ import annotations

import math

import pytest

TASK = "trace/sanity_pair-v0"
HELD_OUT = range(48)
STEPS, GROUPS, GROUP_SIZE, LR = 40, 8, 8, 3e-3


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    from trace_train.tiny.shipped import BASES
    from trace_train.train.sanity import near_chance_start

    return near_chance_start(TASK, tmp_path_factory.mktemp("sanity-start"), base=BASES / "embedded-default",
                             eval_seeds=HELD_OUT)


def _train(start, out, **kw):
    from transformers import AutoTokenizer

    from trace_train.train.config import TrainConfig
    from trace_train.train.grpo import read_log, train
    from trace_train.train.sanity import AnswerProbe

    probe = AnswerProbe(AutoTokenizer.from_pretrained(start.path), TASK, HELD_OUT, every=STEPS)
    cfg = TrainConfig(env_ids=[TASK], model=str(start.path), output_dir=str(out), max_steps=STEPS,
                      group_size=GROUP_SIZE, groups_per_step=GROUPS, learning_rate=LR, seed_offset=100_000,
                      eval_seeds=[0, 1000], calibration_groups=0, save_steps=10_000, max_turn_tokens=12,
                      max_tool_calling_iterations=1, max_completion_length=64, lora_r=8, lora_alpha=16,
                      decode="fast", loss_forward="shared_prefix", device="cpu", threads=1, plot=False,
                      progress=False, **kw)
    result = train(cfg, callbacks=[probe])
    return probe.log.rows, read_log(result.log_csv)


@pytest.fixture(scope="module")
def learned(start, tmp_path_factory):
    return _train(start, tmp_path_factory.mktemp("grpo-sanity"))


@pytest.fixture(scope="module")
def shuffled(start, tmp_path_factory):
    return _train(start, tmp_path_factory.mktemp("grpo-sanity-shuffled"), shuffle_rewards=True)


def test_the_start_answers_in_format_at_chance(start):
    m = start.metrics
    assert m["in_set"] >= 0.95, m  # it answers with one of the pairs...
    assert m["balanced_accuracy"] <= 0.35 and m["margin"] < 0.5, m  # ...but not the right one more than by chance


@pytest.mark.slow
def test_grpo_lifts_held_out_greedy_accuracy_from_chance(learned):
    probes, log = learned
    first, last = probes[0], probes[-1]
    assert first["step"] == 0 and last["step"] == STEPS
    assert first["balanced_accuracy"] <= 0.35, first
    assert last["balanced_accuracy"] >= 0.75, (first, last)
    assert last["margin"] >= 2.0, (first, last)
    # What paid it: the env's reward on the training episodes rose too (first 5 steps against the last 5).
    rewards = [r["reward"] for r in log]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.2, rewards


@pytest.mark.slow
def test_shuffled_rewards_teach_nothing(shuffled):
    probes, log = shuffled
    assert len(log) == STEPS
    assert probes[-1]["balanced_accuracy"] <= 0.5, probes[-1]
    assert probes[-1]["margin"] < 1.0, probes[-1]


@pytest.mark.slow
def test_every_step_logs_a_small_train_inference_mismatch(learned):
    _, log = learned
    assert [int(r["step"]) for r in log] == list(range(1, STEPS + 1))
    kls = [r["mismatch_kl"] for r in log]
    shares = [r["sampled_token_share"] for r in log]
    assert all(k is not None and math.isfinite(k) and 0 <= k <= 1e-3 for k in kls), kls
    assert all(s is not None and 0.9 <= s <= 1.0 for s in shares), shares
