"""Trajectories as token sequences for the composer: targets, message roles and the expert label.

The router of stage four trains on successful trajectories (JSONL, docs/design.md "Trajectories"). Each
episode becomes one sequence rendered with the tokenizer's chat template exactly as the model sees it
at inference (the same rendering as the SFT warm-up, :func:`trace_train.tiny.sft_data.sft_segments`), with per
token: whether it is an assistant token (a next-token target), the role of its message (``system``,
``user``, ``assistant``, ``tool``; the routing statistics are kept per role) and, for the label loss,
the slot of the adapter whose capability env produced the episode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from .adapters import ComposeError

_START, _END = "<|im_start|>", "<|im_end|>"
_DUMMY_USER = {"role": "user", "content": "."}


@dataclass
class EncodedTrajectory:
    """One episode as tokens: ``ids``, ``targets`` (assistant tokens), ``roles`` (per token) and labels."""

    ids: list[int]
    targets: list[bool]
    roles: list[str]
    env_id: str
    slot: int | None  # the label slot (adapter index + 1), None when no adapter claims the env
    first_observation: int  # tokens up to the end of the first user message


def read_trajectories(paths: str | Path | Sequence[str | Path]) -> list[dict]:
    """Every episode of the given JSONL files (or folders of ``*.jsonl``), in order."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files.extend(sorted(p.rglob("*.jsonl")))
        elif p.is_file():
            files.append(p)
        else:
            raise ComposeError(f"{p}: no such trajectory file or folder")
    records = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ComposeError(f"{f}:{n}: not a JSON line ({exc.msg}); trajectory files hold one episode "
                                   "per line") from exc
            if "messages" not in rec or "env_id" not in rec:
                raise ComposeError(f"{f}:{n}: an episode needs 'env_id' and 'messages' (write it with "
                                   "`trace rollout`)")
            records.append(rec)
    return records


def capability_of(env_id: str) -> str:
    """The capability an env trains (its registry ``capability``, else the id's name without ``-vN``)."""
    try:
        from trace_envs.core.registry import get_entry

        cap = get_entry(env_id).capability
        if cap:
            return cap
    except Exception:  # an env id not registered in this process: fall back to its name
        pass
    name = env_id.rsplit("/", 1)[-1]
    return name.rsplit("-v", 1)[0] if "-v" in name else name


def label_slots(records: Iterable[dict], adapter_names: Sequence[str],
                adapter_envs: dict[str, Sequence[str]] | None = None) -> dict[str, int]:
    """Env id -> label slot: explicit ``adapter_envs`` first, else the adapter named as the env's capability."""
    slots: dict[str, int] = {}
    explicit = adapter_envs or {}
    unknown = set(explicit) - set(adapter_names)
    if unknown:
        raise ComposeError(f"adapter_envs names unknown adapters {sorted(unknown)}; adapters are {list(adapter_names)}")
    for name, envs in explicit.items():
        for env in envs:
            slots.setdefault(env, list(adapter_names).index(name) + 1)  # an env claimed twice: the first wins
    for rec in records:
        env = rec["env_id"]
        if env not in slots and capability_of(env) in adapter_names:
            slots[env] = list(adapter_names).index(capability_of(env)) + 1
    return slots


def trained_envs(adapter_dir: str | Path) -> list[str]:
    """The env ids an adapter was trained on, from the ``trace_adapter.json`` that ``trace train`` writes."""
    info = Path(adapter_dir) / "trace_adapter.json"
    if not info.is_file():
        return []
    try:
        return [str(e) for e in json.loads(info.read_text()).get("env_ids") or []]
    except (json.JSONDecodeError, AttributeError):
        return []


def _role_of(block: str) -> str:
    head, _, body = block[len(_START):].partition("\n")
    role = head.strip() or "other"
    if role == "user" and body.lstrip().startswith("<tool_response>"):
        return "tool"
    return role


def encode(tokenizer, record: dict, slot: int | None, max_length: int = 4096) -> EncodedTrajectory:
    """Render one episode with the chat template and tokenise it piece by piece (cut at ``max_length``)."""
    messages = record["messages"]
    full = tokenizer.apply_chat_template(list(messages) + [_DUMMY_USER], tools=record.get("tools") or None,
                                         tokenize=False)
    starts = [i for i in range(len(full)) if full.startswith(_START, i)]
    if not starts:
        raise ComposeError("the tokenizer's chat template has no <|im_start|> markers; the composer reads "
                           "Qwen-style (ChatML) templates")
    pieces: list[tuple[str, str, bool]] = []  # (text, role, is_target)
    if starts[0] > 0:
        pieces.append((full[:starts[0]], "system", False))
    bounds = starts[1:] + [len(full)]
    blocks = [full[s:e] for s, e in zip(starts, bounds)][:-1]  # the last block is the dummy user turn
    for block in blocks:
        role = _role_of(block)
        if role == "assistant":
            header = _START + "assistant\n"
            end = block.find(_END)
            stop = end + len(_END) if end >= 0 else len(block)
            pieces += [(header, role, False), (block[len(header):stop], role, True), (block[stop:], role, False)]
        else:
            pieces.append((block, role, False))
    ids: list[int] = []
    targets: list[bool] = []
    roles: list[str] = []
    first_obs = None
    seen_user = False
    for text, role, is_target in pieces:
        if not text:
            continue
        toks = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids += toks
        targets += [is_target] * len(toks)
        roles += [role] * len(toks)
        if role == "user" and not seen_user:
            seen_user = True
            first_obs = len(ids)
    n = min(len(ids), max_length)
    return EncodedTrajectory(ids[:n], targets[:n], roles[:n], record["env_id"], slot,
                             min(first_obs or n, n))


def is_successful(record: dict, min_reward: float | None = None) -> bool:
    """An episode to learn routing from: ``success`` true, or reward >= ``min_reward`` when given."""
    if min_reward is not None:
        return float(record.get("reward") or 0.0) >= min_reward
    if "success" in record and record["success"] is not None:
        return bool(record["success"])
    return float(record.get("reward") or 0.0) >= 1.0
