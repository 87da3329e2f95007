"""Does the trainer learn? Sanity tasks, a near-chance start, and the probes that watch a policy learn them.

The field trusts an RL trainer when, on a task whose answer is readable from the prompt and from a start near
chance, reward alone lifts greedy accuracy, while the same trainer fed shuffled rewards does not move (docs/train.md,
"Does the trainer learn?"). This module holds the pieces TRACE's check is made of; ``bench/grpo_learning.py`` runs
them as five arms side by side and ``tests/test_grpo_learning.py`` asserts the outcome:

* the tasks are the one-turn envs of :mod:`trace_envs.sanity` (``trace/sanity_cabin-v0``,
  ``trace/sanity_pair-v0``);
* :func:`near_chance_start` makes the start: a tiny model fitted by SFT on the task's prompts with **random**
  answers, so that it answers in the task's format, with each answer about equally often, whatever the prompt
  says. Every answer is then sampled, so every group carries a signal, and reading the prompt is exactly what is
  left to learn (a base that never samples the right answer gives GRPO nothing to reinforce);
* :func:`answer_metrics` scores a model on held-out seeds: greedy accuracy, balanced accuracy (the mean of the
  per-answer accuracies: a policy that always gives one answer scores chance), the share of answers from the set,
  and the teacher-forced log-probability margin of the right answer over the best wrong one;
* :class:`AnswerProbe` records those every few optimiser steps of a ``transformers``/TRL trainer (TRACE's GRPO and
  TRL's stock ``GRPOTrainer`` alike), and :func:`sft_probe` does the same for the SFT loop.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from transformers import TrainerCallback

#: The sanity tasks of :mod:`trace_envs.sanity`.
SANITY_TASKS = ("trace/sanity_cabin-v0", "trace/sanity_pair-v0")


@dataclass
class StartModel:
    """What :func:`near_chance_start` made: the model folder and its metrics on held-out seeds."""

    path: Path
    metrics: dict
    seconds: float


def _episode(env, seed: int, rng: random.Random) -> dict:
    """A one-turn record of ``env``'s task ``seed`` given a uniformly drawn answer (right or not), in the env's own
    reply format."""
    _, info = env.reset(seed=seed)
    reply = env.unwrapped.reply(rng.choice(env.unwrapped.answers()))
    return {"messages": [*info["messages"], {"role": "assistant", "content": reply}], "tools": []}


def near_chance_start(env_id: str, out: str | Path, preset: str = "nano", steps: int = 120, batch_size: int = 16,
                      lr: float = 3e-3, train_seeds: int = 512, seed: int = 0, env_kwargs: dict | None = None,
                      eval_seeds: Sequence[int] = range(64), base: str | Path | None = None) -> StartModel:
    """A tiny model that answers ``env_id``'s tasks in format but at chance: SFT on random answers.

    The model is ``base`` (a model folder, e.g. the shipped ``trace_train/tiny/bases/embedded-default``, which the
    bench and the test use), or one built offline (:func:`trace_train.tiny.build.build_model` with ``preset``, its
    tokenizer trained on the task's own text; a random ``nano`` learnt neither task in a sanity run's budget, by GRPO
    or by SFT), then fitted (all weights) for ``steps`` steps on ``train_seeds`` episodes whose answers are drawn
    uniformly from the env's answer set, independently of the prompt. The folder is reused when it holds a start
    with the same settings.

    Returns:
        A :class:`StartModel`; its ``metrics`` are :func:`answer_metrics` on ``eval_seeds``.
    """
    import gymnasium as gym
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trace_envs  # noqa: F401  (registers the envs)

    from ..tiny.build import build_model
    from ..tiny.sft_data import sft_rows

    out = Path(out)
    settings = {"env_id": env_id, "preset": preset, "base": str(base) if base else None, "steps": steps, "batch_size": batch_size, "lr": lr,
                "train_seeds": train_seeds, "seed": seed, "env_kwargs": env_kwargs or {}}
    env = gym.make(env_id, **(env_kwargs or {}))
    rng = random.Random(seed)
    # Training seeds far from the evaluation's (which start at 0).
    records = [_episode(env, 1_000_000 + i, rng) for i in range(train_seeds)]
    env.close()
    settings["episodes"] = hashlib.sha256(json.dumps(records, sort_keys=True).encode()).hexdigest()[:16]
    done = out / "sanity_start.json"
    if done.exists() and json.loads(done.read_text()).get("settings") == settings:
        saved = json.loads(done.read_text())
        return StartModel(out, saved["metrics"], saved["seconds"])
    t0 = time.perf_counter()
    source = Path(base) if base else build_model(preset, out=out / "built", env_ids=[env_id], corpus_seeds=64,
                                                 seed=seed).path
    tokenizer = AutoTokenizer.from_pretrained(source)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    rows, _, _ = sft_rows(tokenizer, records, max_length=1024)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    model.train()
    for step in range(steps):
        batch = [rows[(step * batch_size + i) % len(rows)] for i in range(batch_size)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in batch])
        labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in batch])
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r, _ in batch])
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    metrics = answer_metrics(model, tokenizer, env_id, eval_seeds, env_kwargs)
    seconds = round(time.perf_counter() - t0, 1)
    done.write_text(json.dumps({"settings": settings, "metrics": metrics, "seconds": seconds,
                                "final_loss": float(loss)}, indent=2))
    return StartModel(out, metrics, seconds)


def _answer_logprob(model, prompt_ids: list[int], answer_ids: list[int]) -> float:
    import torch

    ids = torch.tensor([prompt_ids + answer_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(answer_ids)[:, None]).sum())


def answer_metrics(model, tokenizer, env_id: str, seeds: Sequence[int], env_kwargs: dict | None = None,
                   max_new_tokens: int = 12) -> dict:
    """A model's answers to ``env_id``'s tasks on ``seeds``, greedy and teacher-forced.

    Returns ``accuracy``, ``balanced_accuracy`` (the mean over the gold answers of their accuracy), ``in_set``
    (the share of greedy answers that are one of the env's answers), ``margin`` (the log-probability of the right
    answer, ``<|im_end|>`` included, minus that of the most likely wrong one, averaged per gold answer and then
    over the answers, so that a bias toward one answer does not pass for reading the prompt) and ``per_answer``
    accuracies. The model's training mode is restored afterwards.
    """
    import gymnasium as gym
    import torch

    import trace_envs  # noqa: F401

    from ..tiny.sft_data import render_prompt

    env = gym.make(env_id, **(env_kwargs or {}))
    answers = env.unwrapped.answers()
    end = "<|im_end|>"
    was_training = model.training
    model.eval()
    hits: dict[str, list[int]] = {a: [] for a in answers}
    margins: dict[str, list[float]] = {}
    in_set = 0
    try:
        with torch.no_grad():
            for seed in seeds:
                _, info = env.reset(seed=int(seed))
                gold = env.unwrapped.gold
                prompt = tokenizer(render_prompt(tokenizer, info["messages"], None),
                                   add_special_tokens=False)["input_ids"]
                ids = torch.tensor([prompt])
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=max_new_tokens, do_sample=False,
                                     pad_token_id=tokenizer.pad_token_id,
                                     eos_token_id=tokenizer.convert_tokens_to_ids(end))
                said = env.unwrapped.answer_of(tokenizer.decode(out[0, len(prompt):], skip_special_tokens=True))
                hits[gold].append(int(said == gold))
                in_set += int(said in answers)
                # Each answer's whole reply in the env's format (a read-back included), <|im_end|> included.
                scores = {a: _answer_logprob(model, prompt, tokenizer(env.unwrapped.reply(a) + end,
                                                                      add_special_tokens=False)["input_ids"])
                          for a in answers}
                margins.setdefault(gold, []).append(scores[gold] - max(v for a, v in scores.items() if a != gold))
    finally:
        model.train(was_training)
        env.close()
    per_answer = {a: sum(h) / len(h) for a, h in hits.items() if h}
    n = sum(len(h) for h in hits.values())
    return {"accuracy": sum(sum(h) for h in hits.values()) / n,
            "balanced_accuracy": sum(per_answer.values()) / len(per_answer),
            "in_set": in_set / n, "margin": sum(sum(m) / len(m) for m in margins.values()) / len(margins),
            "per_answer": per_answer, "n": n}


@dataclass
class ProbeLog:
    """Rows of :func:`answer_metrics` taken during training: ``step`` and ``seconds`` (training time so far) added."""

    rows: list[dict] = field(default_factory=list)

    def add(self, step: int, seconds: float, metrics: dict) -> None:
        self.rows.append({"step": step, "seconds": round(seconds, 1), **metrics})


class AnswerProbe(TrainerCallback):
    """:func:`answer_metrics` of the model being trained at step 0 and every ``every`` optimiser steps (and at the
    last), for any ``transformers`` trainer (TRACE's GRPO, TRL's stock ``GRPOTrainer``); rows in ``log``. Their
    ``seconds`` count training time only (the probes excluded)."""

    def __init__(self, tokenizer, env_id: str, seeds: Sequence[int], every: int,
                 env_kwargs: dict | None = None) -> None:
        self.tokenizer, self.env_id, self.seeds, self.every = tokenizer, env_id, list(seeds), every
        self.env_kwargs = env_kwargs
        self.log = ProbeLog()
        self.t0 = time.perf_counter()
        self.probe_s = 0.0

    def _probe(self, step: int, model) -> None:
        seconds = time.perf_counter() - self.t0 - self.probe_s
        t = time.perf_counter()
        metrics = answer_metrics(model, self.tokenizer, self.env_id, self.seeds, self.env_kwargs)
        self.probe_s += time.perf_counter() - t
        self.log.add(step, seconds, metrics)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.t0 = time.perf_counter()
        self._probe(state.global_step, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step >= state.max_steps:
            self._probe(state.global_step, model)


def sft_probe(env_id: str, seeds: Sequence[int], env_kwargs: dict | None = None):
    """``(on_checkpoint, log)`` for the SFT loop's ``on_checkpoint`` hook (:func:`trace_train.train.sft.fit_sft_lora`):
    each call records :func:`answer_metrics` at that step."""
    log = ProbeLog()

    def on_checkpoint(step: int, model, tokenizer, seconds: float) -> None:
        log.add(step, seconds, answer_metrics(model, tokenizer, env_id, seeds, env_kwargs))

    return on_checkpoint, log
