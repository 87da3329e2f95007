"""Which expert wrote each assistant turn: a composed model's routing per assistant message of played episodes.

For a conversation that needs two capabilities (a flight-status question, then a cancellation), the question
that decides between token-level and per-episode routing is whether the router switches at the request
boundary. :func:`turn_routing` reads it off an episode the model played: the conversation is read once more
(teacher-forced, the same tokens the model wrote) and each block's top-1 choice at every token of an assistant
message is counted, per message. Token and context gates route a token on the tokens up to it only, and segment
routing holds the choice made at a message's first token: the choices read this way are the ones made while
generating. Each assistant message is attributed to the request the user had raised last before it.
"""

from __future__ import annotations

from typing import Any, Sequence

from .data import encode


def _request_of_turns(messages: Sequence[dict], request_texts: Sequence[str]) -> list[int]:
    """For each assistant message, the index of the last request whose text a user message before it holds."""
    current, out = 0, []
    for m in messages:
        content = m.get("content") if isinstance(m.get("content"), str) else ""
        if m.get("role") == "user":
            for i in range(current + 1, len(request_texts)):
                if request_texts[i] and request_texts[i] in content:
                    current = i
        elif m.get("role") == "assistant":
            out.append(current)
    return out


def turn_routing(model: Any, tokenizer: Any, record: dict, request_texts: Sequence[str],
                 max_length: int = 16384) -> list[dict]:
    """One row per assistant message of ``record``: ``turn`` (its index among the assistant messages),
    ``request`` (the index of the request it serves), ``family`` (that request's family, from the record's task
    info), ``tokens``, and the share of its tokens (over the blocks) each slot of ``model`` got, by slot name.

    Args:
        model: a :class:`~trace_train.compose.ComposedModel` routing by its gates (token or segment routing).
        tokenizer: its tokenizer.
        record: a played episode (a trajectory record: ``messages``, ``tools``, ``task.families``).
        request_texts: the texts of the task's requests, in order (how the user raised each).
    """
    import torch

    enc = encode(tokenizer, record, None, max_length)
    device = next(model.gates.parameters()).device
    with torch.no_grad(), model.recording(choices=True) as routers:
        model(input_ids=torch.tensor([enc.ids], device=device), use_cache=False)
        choices = torch.stack([r.choice[0] for r in routers])  # (blocks, T)
    runs, start = [], None  # [start, end) of each assistant message's written tokens
    for i, target in enumerate(list(enc.targets) + [False]):
        if target and start is None:
            start = i
        elif not target and start is not None:
            runs.append((start, i))
            start = None
    requests = _request_of_turns(record.get("messages") or [], request_texts)
    families = (record.get("task") or {}).get("families") or []
    names = model.slot_names()
    rows = []
    for turn, (a, b) in enumerate(runs):
        counts = torch.bincount(choices[:, a:b].flatten(), minlength=len(names)).float()
        request = requests[turn] if turn < len(requests) else None
        rows.append({"turn": turn, "request": request,
                     "family": families[request] if request is not None and request < len(families) else None,
                     "tokens": b - a, **{n: float(counts[i] / counts.sum()) for i, n in enumerate(names)}})
    return rows


def switch_summary(rows_by_episode: Sequence[Sequence[dict]], slot_names: Sequence[str]) -> dict[str, Any]:
    """Over episodes' :func:`turn_routing` rows: per request family, the mean share of each slot over its
    assistant tokens; and how often the slot with the most tokens differs between two requests of different
    families in one conversation (``switched`` of ``pairs``): does the router switch at the request boundary?"""
    totals: dict[str, dict[str, float]] = {}
    tokens: dict[str, int] = {}
    pairs = switched = 0
    for rows in rows_by_episode:
        per_request: dict[int, dict[str, float]] = {}
        family_of: dict[int, str] = {}
        for row in rows:
            if row.get("request") is None or row.get("family") is None:
                continue
            f, n = str(row["family"]), int(row["tokens"])
            tokens[f] = tokens.get(f, 0) + n
            totals.setdefault(f, {s: 0.0 for s in slot_names})
            acc = per_request.setdefault(int(row["request"]), {s: 0.0 for s in slot_names})
            for s in slot_names:
                totals[f][s] += float(row[s]) * n
                acc[s] += float(row[s]) * n
            family_of[int(row["request"])] = f
        order = sorted(per_request)
        for i in order:
            for j in order:
                if i < j and family_of[i] != family_of[j]:
                    pairs += 1
                    top_i = max(slot_names, key=lambda s: per_request[i][s])
                    top_j = max(slot_names, key=lambda s: per_request[j][s])
                    switched += int(top_i != top_j)
    shares = {f: {s: v / max(tokens[f], 1) for s, v in acc.items()} for f, acc in sorted(totals.items())}
    return {"shares_by_family": shares, "tokens_by_family": dict(sorted(tokens.items())), "pairs": pairs,
            "switched": switched}
