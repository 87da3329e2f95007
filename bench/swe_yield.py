"""Yield of SWE-smith-style bug injection on the default libraries (issue: "a yield table").

For each repository: candidates tried, valid instances (FAIL_TO_PASS ≥ 1 and PASS_TO_PASS ≥ 1),
median FAIL_TO_PASS / PASS_TO_PASS counts, seconds per validation, and — as the anchor measured in
the same run — the seconds of one clean suite run, so "validation / clean run" is the ratio printed.

    python bench/swe_yield.py --candidates 20 --combine 2 [--save trace_envs/swe/data/instances]

Needs a Docker engine (scripts/setup_docker.sh) and PyPI access for the sdists.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from trace_envs.swe.repos import DEFAULT_REPOS, get_repo_spec, materialize
from trace_envs.swe.sandbox import DockerSandbox
from trace_envs.swe.tasks import generate_instances, run_tests, save_instances


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repos", nargs="*", default=list(DEFAULT_REPOS), help="repository keys")
    ap.add_argument("--candidates", type=int, default=20, help="candidate bugs per repository")
    ap.add_argument("--combine", type=int, default=0, help="two-bug instances per repository")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", type=Path, default=None, help="write the valid instances to DIR/<repo>.jsonl")
    args = ap.parse_args()
    rows = []
    for key in args.repos:
        repo = materialize(get_repo_spec(key))
        image = repo.image(verbose=True)
        boxes = [DockerSandbox(image)]

        def restart():
            boxes.append(DockerSandbox(image))
            return boxes[-1]

        try:
            anchor = run_tests(boxes[0], repo).seconds
            t0 = time.monotonic()
            instances, st = generate_instances(repo, boxes[0], args.candidates, seed=args.seed, combine=args.combine,
                                               progress=True, restart=restart)
            total = time.monotonic() - t0
        finally:
            for box in boxes:
                box.close()
        if args.save:
            save_instances(instances, key, args.save)
        per = statistics.median(st.validation_seconds) if st.validation_seconds else float("nan")
        rows.append((key, st.candidates, st.valid, st.combined,
                     statistics.median(st.f2p_counts) if st.f2p_counts else 0,
                     statistics.median(st.p2p_counts) if st.p2p_counts else 0, per, anchor, st.flaky, total))
    head = ("repo", "cand", "valid", "combo", "med F2P", "med P2P", "s/valid.", "clean s", "ratio", "flaky", "total s")
    print("\n" + " | ".join(f"{h:>10}" for h in head))
    for key, cand, valid, combo, f2p, p2p, per, anchor, flaky, total in rows:
        cells = (key[:18], cand, valid, combo, f"{f2p:.0f}", f"{p2p:.0f}", f"{per:.2f}", f"{anchor:.2f}",
                 f"{per / anchor:.2f}", flaky, f"{total:.0f}")
        print(" | ".join(f"{c:>10}" for c in cells))
    cand = sum(r[1] for r in rows)
    print(f"\nyield: {sum(r[2] for r in rows)}/{cand} candidates valid "
          f"({100 * sum(r[2] for r in rows) / max(cand, 1):.0f}%); ratio = seconds per validation / one clean run")


if __name__ == "__main__":
    main()
