"""On the precondition env's held-out seeds, what did each evaluated model decide: go ahead or refuse, per gold class?

    python lab/headline-planted/scripts/env_decisions.py runs/grpo-s0

Reads the evaluate stage's capability-env episodes (``eval/env/precondition_verification/<arm>/trajectories.jsonl``,
arms ``base``, ``warmup`` and ``adapter``) and prints, per arm, how often it went ahead (called the requested write
on an allowed request, ``attempted``, or the forbidden one on a must-refuse request, ``forbidden_write``) and how
often it succeeded, for allowed and must-refuse requests apart, with the balanced accuracy of the decision. A rise in
success that comes with going ahead on both classes is a prior learnt, not the decision.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def decisions(path: Path) -> dict[str, dict[str, int]]:
    """gold decision (``act`` / ``refuse``) -> counts of episodes, went ahead, succeeded."""
    counts = {g: {"episodes": 0, "went_ahead": 0, "success": 0} for g in ("act", "refuse")}
    for line in path.read_text().splitlines():
        episode = json.loads(line)
        gold = (episode.get("task") or {}).get("decision")
        if gold not in counts:
            continue
        breakdown = episode.get("reward_breakdown") or {}
        row = counts[gold]
        row["episodes"] += 1
        row["went_ahead"] += int(bool(breakdown.get("attempted") or breakdown.get("forbidden_write")))
        row["success"] += int(bool(episode.get("success")))
    return counts


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    root = Path(argv[0]) / "eval" / "env" / "precondition_verification"
    arms = [a for a in ("base", "warmup", "adapter") if (root / a / "trajectories.jsonl").exists()]
    if not arms:
        print(f"no capability-env episodes under {root}")
        return 1
    print("| arm | goes ahead: allowed | goes ahead: must-refuse | success: allowed | success: must-refuse | "
          "decision balanced acc. |")
    print("|---|---:|---:|---:|---:|---:|")
    for arm in arms:
        c = decisions(root / arm / "trajectories.jsonl")
        act, ref = c["act"], c["refuse"]
        ahead_act = act["went_ahead"] / max(act["episodes"], 1)
        ahead_ref = ref["went_ahead"] / max(ref["episodes"], 1)
        balanced = (ahead_act + (1 - ahead_ref)) / 2
        print(f"| {arm} | {act['went_ahead']}/{act['episodes']} | {ref['went_ahead']}/{ref['episodes']} | "
              f"{act['success']}/{act['episodes']} | {ref['success']}/{ref['episodes']} | {balanced:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
