"""Where a composed model's expert choice sits within a request, in the mixed conversations of a run.

    python lab/headline-planted/scripts/mixed_turns.py runs/mixed-s0-request [runs/mixed-s0 ...]

For each run (a ``trace run`` of ``config_mixed.yaml``): the MoE's assistant turns of the mixed conversations
(``eval/trace_moe/turn_routing.csv``), grouped by the family of the request they serve and by what came right before
the turn: the request itself, a user reply (an id, a detail, "yes"), or a tool result; per group the share of the
turn's tokens the precondition adapter wrote (over the blocks). Request gates restart their mean at every user
message, so a turn after a reply reads the reply, not the request. Then, per method, the mixed conversations solved
and the requests handled per family (``eval/results.json``).
"""

from __future__ import annotations

import collections
import csv
import json
import re
import sys
from pathlib import Path

REQUEST_WORDS = re.compile(r"cancel|status|on time|delayed|landed|baggage|how many", re.I)


def turn_context(messages: list[dict], turn: int) -> str:
    """What came right before the ``turn``-th assistant message."""
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    prev = messages[assistant[turn] - 1]
    if prev["role"] == "tool":
        return "after a tool result"
    if prev["role"] == "user":
        return "after the request" if REQUEST_WORDS.search(prev.get("content") or "") else "after a user reply"
    return "other"


def main(runs: list[str]) -> None:
    for run in map(Path, runs):
        moe = run / "eval" / "trace_moe"
        records = {r["seed"]: r for r in map(json.loads, (moe / "trajectories.jsonl").open())}
        shares: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
        for row in csv.DictReader((moe / "turn_routing.csv").open()):
            if row["family"] not in ("cancel", "flight_status"):
                continue
            messages = records[int(row["seed"])]["messages"]
            acc = shares[(row["family"], turn_context(messages, int(row["turn"])))]
            acc[0] += float(row["precondition_verification"])
            acc[1] += 1
        print(f"== {run}: the MoE's turns in mixed conversations, share written by the precondition adapter")
        for (family, where), (total, n) in sorted(shares.items()):
            print(f"  {family:14s} {where:20s} {total / n:.2f}  ({n} turns)")
        methods = json.loads((run / "eval" / "results.json").read_text())["methods"]
        print("  method: mixed conversations solved; requests handled per family")
        for key, m in methods.items():
            mixed = (m.get("mix") or {}).get("mixed")
            if mixed:
                fams = ", ".join(f"{f} {v:.2f}" for f, v in sorted(mixed["request_success_by_family"].items()))
                print(f"  {key:36s} {round(mixed['success'] * mixed['conversations'])}/{mixed['conversations']}; {fams}")


if __name__ == "__main__":
    main(sys.argv[1:] or sys.exit(__doc__))
