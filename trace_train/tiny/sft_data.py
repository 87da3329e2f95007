"""The warm-up's training data: oracle episodes turned into SFT rows on the assistant turns.

:func:`oracle_trajectories` plays an env's oracle on training seeds, leaving out (or keeping a share of) named
scenario families; :func:`sft_rows` renders each episode with the chat template exactly as
:class:`~trace_train.agents.HFAgent` renders it at inference (:func:`render_prompt`, :func:`assistant_turns`)
and labels the assistant turns as targets; :func:`shared_prefix_length` finds the prompt prefix every row
shares (encoded once per batch by :func:`trace_train.tiny.sft_forward.sft_loss`). GRPO re-tokenises its
episodes with the same functions (:func:`trace_train.train.grpo.encode_episode`).
"""

from __future__ import annotations

import hashlib
import json
import random
from itertools import islice
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")


def scenario_of(env: Any) -> str | None:
    """The scenario family of the env's current task (``task_info()`` or ``task_spec()``), if it has one."""
    for hook in ("task_info", "task_spec"):
        try:
            labels = getattr(env.unwrapped, hook)()
        except Exception:
            continue
        if isinstance(labels, dict) and labels.get("scenario") is not None:
            return str(labels["scenario"])
    return None


def scenario_families(scenario: str) -> list[str]:
    """The families a scenario label names: ``"bundle:cancel+booking"`` → cancel, booking (and the label)."""
    if scenario.startswith("bundle:"):
        return [scenario] + scenario[len("bundle:"):].split("+")
    return [scenario]


def target_families(task: dict | None, scenario: str | None = None) -> set[str]:
    """The target families an episode is about: its task's request kinds (``task_info()["families"]``), each as
    the family the generator matches (:func:`~trace_envs.domains.task.request_family`:
    ``sdr_question:flight_status`` → ``flight_status``), so that a capability env's episodes and the target's
    compare; without them, the families its scenario label names (:func:`scenario_families`); else none."""
    from trace_envs.domains.task import request_family

    kinds = (task or {}).get("families")
    if isinstance(kinds, (list, tuple)) and kinds:
        return {request_family(str(k)) for k in kinds}
    return set(scenario_families(str(scenario))) if scenario is not None else set()


def _kept_at_share(seed: int, share: float) -> bool:
    """Whether episode ``seed`` is among the ``share`` of its family that is kept (a pure function of the seed)."""
    digest = hashlib.sha256(f"scenario-share:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def oracle_trajectories(target: str, seeds: Iterable[int], exclude_scenarios: Sequence[str] = (),
                        env_kwargs: dict | None = None,
                        scenario_shares: dict[str, float] | None = None) -> tuple[list[dict], dict]:
    """Oracle episodes of ``target`` on ``seeds``, without the excluded scenarios.

    A task is left out when its scenario, or any family of a ``bundle:a+b`` scenario, is excluded. A family
    in ``scenario_shares`` keeps only that share of its episodes (the smallest share of its families, for a
    bundle), chosen by seed, so the same settings always keep the same episodes.

    Returns:
        (records, counts) where counts maps each scenario (or ``None``) to kept/excluded/failed numbers.
    """
    import gymnasium as gym

    import trace_envs
    from trace_envs import OracleAgent

    env = gym.make(target, **(env_kwargs or {}))
    records, counts = [], {}
    excluded = set(exclude_scenarios)
    try:
        for seed in seeds:
            record = trace_envs.rollout(env, OracleAgent(), seed=seed)
            scenario = scenario_of(env)
            c = counts.setdefault(str(scenario), {"kept": 0, "excluded": 0, "failed": 0})
            if scenario is not None and excluded & set(scenario_families(scenario)):
                c["excluded"] += 1
                continue
            share = min([(scenario_shares or {}).get(f, 1.0) for f in scenario_families(scenario or "")] or [1.0])
            if share < 1.0 and not _kept_at_share(seed, share):
                c["excluded"] += 1
                continue
            if not record["success"]:
                c["failed"] += 1  # an oracle that fails is an env bug; never train on it
                continue
            record["scenario"] = scenario
            try:
                task = env.unwrapped.task_info()
            except Exception:
                task = None
            record["families"] = sorted(target_families(task if isinstance(task, dict) else None, scenario))
            records.append(record)
            c["kept"] += 1
    finally:
        env.close()
    return records, counts


def replay_episodes(path: str | Path, drawn: Iterable[str], count: int,
                    seed: int = 0) -> tuple[list[dict], dict]:
    """``count`` rows of the agent's own episodes in a trajectories file, for SFT *replay*.

    A LoRA fitted on one capability env's oracle episodes forgets what the base did on the target's other
    requests (measured on the planted recipe: the precondition adapter answered 0 of 130 flight-status and info
    requests, the base 46; docs/train.md). Mixing the base's own episodes of those requests into the SFT rows
    asks the adapter to keep the base's behaviour there. The episodes are :func:`left_out_episodes`, repeated in a
    seeded order until ``count`` rows are drawn. Returns ``(records, summary)``; ``records`` is empty when no
    episode is kept.
    """
    kept, summary = left_out_episodes(path, drawn)
    rows = list(islice(seeded_epochs(kept, seed), count))
    return rows, {**summary, "rows": len(rows)}


def seeded_epochs(items: Sequence[T], seed: int = 0) -> Iterator[T]:
    """``items`` over and over, each epoch every item once in a fresh order drawn from one ``random.Random(seed)``
    (nothing when ``items`` is empty). SFT replay takes its first rows from it; GRPO replay a batch a step."""
    rng = random.Random(seed)
    while items:
        order = list(range(len(items)))
        rng.shuffle(order)
        yield from (items[i] for i in order)


def left_out_episodes(path: str | Path, drawn: Iterable[str]) -> tuple[list[dict], dict]:
    """The episodes of a trajectories file none of whose target families (:func:`target_families`) is in
    ``drawn``, the families the training envs' own episodes draw: on those the env teaches the skill, and the
    base's own answers (which the skill corrects) would pull against it. When ``drawn`` is empty (training
    episodes without family labels) every episode is kept; otherwise an episode without labels is left out.
    They are the agent's episodes as recorded, failures included: replaying them keeps the base's behaviour; it
    adds no reward. An unreadable line (the last line of a rollout killed while writing it) is counted and
    skipped. Returns ``(records, summary)``; each record keeps ``messages``, ``tools`` and ``scenario``.
    """
    drawn = set(drawn)
    kept, families, total, unreadable = [], {}, 0, 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            total += 1
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                unreadable += 1
                continue
            scenario = record.get("scenario")
            found = target_families(record.get("task"), scenario)
            if drawn and (not found or found & drawn):
                continue
            if not record.get("messages") or not any(m.get("role") == "assistant" for m in record["messages"]):
                continue
            kept.append({"messages": record["messages"], "tools": record.get("tools"), "scenario": scenario})
            for family in sorted(found) or ["(none)"]:
                families[family] = families.get(family, 0) + 1
    return kept, {"path": str(path), "episodes_in_file": total, "episodes_kept": len(kept),
                  "unreadable_lines": unreadable, "families": families, "left_out_families": sorted(drawn)}


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None) -> str:
    """The generation prompt for the next assistant turn (the same one :class:`HFAgent` uses).

    No ``enable_thinking`` switch is passed: the prompt ends with ``<|im_start|>assistant\n`` and the
    model writes its turn (a ``<tool_call>`` block or a message) directly, exactly as past assistant
    turns appear in the history. TRL's GRPO rollouts render prompts the same way.
    """
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


_DUMMY_USER = {"role": "user", "content": "."}


def assistant_turns(tokenizer, record: dict) -> Iterable[tuple[int, str, str, int]]:
    """Each assistant turn of a trajectory as ``(message index, prompt, full text, end)``.

    ``prompt`` is the generation prompt before the turn (as :func:`render_prompt` renders it at
    inference), ``full`` the whole conversation rendered once, and ``full[len(prompt):end]`` the turn
    as it appears in later prompts, ``<|im_end|>`` included. Qwen3's template gives the *last*
    assistant turn an empty ``<think>`` block; a throw-away user message after it keeps every turn
    uniform.
    """
    messages, tools = record["messages"], record["tools"] or None
    end = "<|im_end|>"
    full = tokenizer.apply_chat_template(messages + [_DUMMY_USER], tools=tools, tokenize=False)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render_prompt(tokenizer, messages[:i], tools)
        if not full.startswith(prompt):
            raise RuntimeError("the chat template is not prefix-preserving at an assistant turn; "
                               "cannot build SFT targets from it")
        yield i, prompt, full, full.index(end, len(prompt)) + len(end)


def sft_segments(tokenizer, record: dict) -> list[tuple[str, bool]]:
    """One trajectory as text segments ``(text, is_target)``: the assistant turns are the targets.

    The whole conversation is one training sequence (much cheaper than one sequence per turn). Each
    assistant turn is rendered as it appears in later prompts, so the context of every target matches
    what the model sees at inference (see :func:`assistant_turns`); the closing dummy turn is cut off.
    """
    segments: list[tuple[str, bool]] = []
    pos = 0
    for _, prompt, full, stop in assistant_turns(tokenizer, record):
        segments.append((full[pos:len(prompt)], False))
        segments.append((full[len(prompt):stop], True))
        pos = stop
    return segments


def teacher_forced_turns(model, tokenizer, records: list[dict], max_new_tokens: int = 96,
                         device: str = "cpu") -> dict:
    """How many assistant turns of ``records`` the model reproduces exactly, given the true history.

    Each turn is generated greedily from the oracle's own history (as :class:`HFAgent` prompts it), so
    one early mistake does not hide the later turns. Returns the exact-match rate of tool calls and of
    messages, plus the number of each: a diagnostic next to episode success, which stays at 0 until
    every turn of an episode is right (a model that has learnt the turn format but not yet to copy
    ids from the conversation into its calls gets its messages right and its tool calls wrong).
    """
    import torch

    hits = {"tool_call": [0, 0], "message": [0, 0]}
    end = "<|im_end|>"
    for record in records:
        for i, prompt, full, stop in assistant_turns(tokenizer, record):
            want = full[len(prompt):stop - len(end)]
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=max_new_tokens, do_sample=False)
            got = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False).split(end)[0]
            kind = "tool_call" if record["messages"][i].get("tool_calls") else "message"
            hits[kind][0] += int(got.strip() == want.strip())
            hits[kind][1] += 1
    return {**{k: (h / n if n else None) for k, (h, n) in hits.items()},
            **{f"n_{k}": n for k, (_, n) in hits.items()}}


def sft_rows(tokenizer, records: list[dict], max_length: int) -> tuple[list[tuple[list[int], list[int]]], int, int]:
    """Token ids and loss labels (-100 outside the targets) per trajectory.

    A trajectory longer than ``max_length`` keeps the turns that fit; returns (rows, turns, dropped turns).
    """
    rows, turns, dropped = [], 0, 0
    for record in records:
        ids: list[int] = []
        labels: list[int] = []
        for text, is_target in sft_segments(tokenizer, record):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) + len(piece) > max_length:
                dropped += 1 if is_target else 0
                if is_target:
                    continue
                break
            ids.extend(piece)
            labels.extend(piece if is_target else [-100] * len(piece))
            turns += int(is_target)
        if any(label != -100 for label in labels):
            rows.append((ids, labels))
    return rows, turns, dropped


def shared_prefix_length(rows: Sequence[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix all ``rows`` share and that holds no loss target (0 if none).

    It stops one token before the first target of any row, so that every row keeps at least that
    token after the prefix (its prediction is never lost).
    """
    if not rows:
        return 0
    first = rows[0][0]
    n = len(first)
    for ids, labels in rows:
        k = 0
        m = min(n, len(ids))
        while k < m and ids[k] == first[k]:
            k += 1
        n = k
        targets = [i for i, label in enumerate(labels) if label != -100]
        if targets:
            n = min(n, targets[0] - 1)
        n = min(n, len(ids) - 1)
    return max(0, n)
