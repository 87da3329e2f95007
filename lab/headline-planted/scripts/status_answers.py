"""Does an agent read the flight's status, or answer a constant? And where did a MoE route the deciding token?

    python lab/headline-planted/scripts/status_answers.py runs/headline/eval/base/trajectories.jsonl \
        runs/headline/eval/adapter_structured_data_reasoning/trajectories.jsonl
    python lab/headline-planted/scripts/status_answers.py runs/headline/eval/trace_moe/trajectories.jsonl \
        --routing runs/headline/compose/moe

For each file, the airline target's ``flight_status`` episodes whose ``get_flight_status`` call returned a status
of *today* (``landed``, ``flying``, ``cancelled``, ``delayed``; a future flight's ``available`` follows from its
date, so it says nothing about reading): how many answers state the returned status, which statuses the answers
state, and how many episodes made no status call at all. A constant answer shows as one status stated every time
and right only as often as that status is the truth.

With ``--routing`` (the MoE's folder, ``compose/moe``), each such episode is teacher-forced through the MoE's
gates, and the slot chosen at the position that *predicts* the verb of the answer's status phrase (``has`` landed,
``was`` cancelled, ``is`` delayed: after the verb, little is left to decide) is counted per block, apart for
answers stated right and wrong, beside the share over every assistant token: a router can send most tokens
to an adapter and still hand the one deciding token to the base.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter

TODAY_STATUSES = ("landed", "flying", "cancelled", "delayed")
#: Every status an answer can state, in the words the oracle's answer uses.
STATED = ("landed", "flying", "cancelled", "delayed", "on time", "available")
_STATED_RX = re.compile("|".join(re.escape(w) for w in STATED))


def _scenario(record: dict) -> str | None:
    return record.get("scenario") or (record.get("task") or {}).get("scenario")


def returned_status(record: dict) -> str | None:
    """The first status of today that a ``get_flight_status`` result gave in this episode (None if none did)."""
    for m in record["messages"]:
        if m["role"] == "tool" and m.get("name") == "get_flight_status":
            text = str(m.get("content") or "").strip()
            if text in TODAY_STATUSES:
                return text
    return None


def stated_status(record: dict) -> str | None:
    """The last status word in the agent's last message that states one (None if no message does)."""
    for m in reversed(record["messages"]):
        if m["role"] == "assistant" and m.get("content"):
            found = _STATED_RX.findall(str(m["content"]).lower())
            if found:
                return found[-1]
    return None


def read_counts(records: list[dict]) -> dict:
    """``{"flight_status", "no_status_call", "today", "right", "stated": {status: n}}`` over ``records``."""
    out = {"flight_status": 0, "no_status_call": 0, "today": 0, "right": 0, "stated": Counter()}
    for r in records:
        if _scenario(r) != "flight_status":
            continue
        out["flight_status"] += 1
        if not any(m["role"] == "tool" and m.get("name") == "get_flight_status" for m in r["messages"]):
            out["no_status_call"] += 1
        truth = returned_status(r)
        if truth is None:
            continue
        said = stated_status(r)
        out["today"] += 1
        out["right"] += said == truth
        out["stated"][said or "none"] += 1
    out["stated"] = dict(out["stated"].most_common())
    return out


def status_routing(moe_dir: str, records: list[dict]) -> dict:
    """Per outcome (``right``/``wrong``): the share of blocks routing each slot at the position that predicts the
    verb of the answer's status phrase; ``all``: the share over every assistant token of those episodes."""
    import torch
    from transformers import AutoTokenizer

    from trace_train.compose import ComposedModel
    from trace_train.compose.data import encode

    torch.set_num_threads(1)
    model, tokenizer = ComposedModel.from_pretrained(moe_dir), AutoTokenizer.from_pretrained(moe_dir)
    names = model.slot_names()
    first_piece = {w: tokenizer(w, add_special_tokens=False)["input_ids"][0] for w in STATED}
    verb_pieces = {tokenizer(v, add_special_tokens=False)["input_ids"][0] for v in ("has", "was", "is")}
    counts = {"right": Counter(), "wrong": Counter(), "all": Counter()}
    episodes = Counter()
    for r in records:
        truth = returned_status(r) if _scenario(r) == "flight_status" else None
        if truth is None:
            continue
        ep = encode(tokenizer, r, None)
        answer = [i for i, (role, target) in enumerate(zip(ep.roles, ep.targets)) if role == "assistant" and target]
        hits = [(i, w) for i in answer for w, piece in first_piece.items() if ep.ids[i] == piece]
        if not hits or hits[-1][0] < 1:
            continue
        status_at, said = hits[-1]
        # The answer's status phrase opens with its verb ("has landed", "was cancelled", "is delayed"): the verb is
        # where the answer is decided (after "has" only "landed" follows), so the position that predicts it counts.
        verbs = [i for i in answer if i < status_at and ep.ids[i] in verb_pieces]
        pos = verbs[-1] if verbs else status_at
        outcome = "right" if said == truth else "wrong"
        with torch.no_grad(), model.recording(choices=True) as routers:
            model(input_ids=torch.tensor([ep.ids]), use_cache=False)
            choices = torch.stack([router.choice[0] for router in routers])  # (blocks, tokens)
        episodes[outcome] += 1
        counts[outcome].update(names[c] for c in choices[:, pos - 1].tolist())
        counts["all"].update(names[c] for c in choices[:, answer].flatten().tolist())
    return {k: {"episodes": episodes[k] if k != "all" else episodes["right"] + episodes["wrong"],
                "shares": {s: n / max(1, sum(c.values())) for s, n in c.most_common()}} for k, c in counts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trajectories", nargs="+",
                   help="trajectory JSONL files (e.g. a run's eval/<method>/trajectories.jsonl)")
    p.add_argument("--routing", metavar="MOE_DIR", help="also where this MoE routed the deciding token (compose/moe)")
    args = p.parse_args(argv)

    from trace_train.rollouts import read_trajectories

    for path in args.trajectories:
        records = read_trajectories(path)
        c = read_counts(records)
        if not c["flight_status"]:
            print(f"{path}: no flight_status episode")
            continue
        stated = ", ".join(f"{k} {v}" for k, v in c["stated"].items()) or "–"
        print(f"{path}: today's status stated right {c['right']} of {c['today']} (stated: {stated}); "
              f"no status call in {c['no_status_call']} of {c['flight_status']} flight-status episodes")
        if args.routing:
            for outcome, row in status_routing(args.routing, records).items():
                what = ("every assistant token" if outcome == "all"
                        else f"the position deciding a status stated {outcome}")
                shares = ", ".join(f"{s} {v:.2f}" for s, v in row["shares"].items()) or "–"
                print(f"  {what} ({row['episodes']} episodes): {shares}")
        print(json.dumps({"file": path, **c}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
