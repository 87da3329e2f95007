"""On the precondition env's held-out seeds, what did each evaluated model decide: go ahead or refuse, per gold class?

    python lab/headline-planted/scripts/env_decisions.py runs/grpo-s0

Reads the evaluate stage's capability-env episodes (``eval/env/precondition_verification/<arm>/trajectories.jsonl``,
arms ``base``, ``warmup`` and ``adapter``) and prints, per arm, how often it went ahead and how often it succeeded,
for allowed and must-refuse requests apart, with the balanced accuracy of the decision: lab/grpo-alone's
``decision_row`` (went ahead = called the requested write on an allowed request, ``attempted``, or the forbidden
one on a must-refuse request, ``forbidden_write``). A rise in success that comes with going ahead on both classes
is a prior learnt, not the decision.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    sys.path.insert(0, str(ROOT / "lab" / "grpo-alone"))
    sys.path.insert(0, str(ROOT))
    from run import decision_row  # lab/grpo-alone/run.py

    from trace_train.rollouts import read_trajectories

    root = Path(argv[0]) / "eval" / "env" / "precondition_verification"
    arms = [a for a in ("base", "warmup", "adapter") if (root / a / "trajectories.jsonl").exists()]
    if not arms:
        print(f"no capability-env episodes under {root}")
        return 1
    print("| arm | goes ahead: allowed | goes ahead: must-refuse | success: allowed | success: must-refuse | "
          "decision balanced acc. |")
    print("|---|---:|---:|---:|---:|---:|")
    for arm in arms:
        r = decision_row(read_trajectories(root / arm / "trajectories.jsonl"))
        n_act, n_ref = r["n_act"], r["n_refuse"]
        print(f"| {arm} | {round(r['acc_act'] * n_act)}/{n_act} | {round((1 - r['acc_refuse']) * n_ref)}/{n_ref} | "
              f"{round(r['success_allowed'] * n_act)}/{n_act} | {round(r['success_must_refuse'] * n_ref)}/{n_ref} | "
              f"{r['balanced_acc']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
