"""One adapter over the planted base, greedily on held-out seeds of a cancellation env: success and the decision.

    python lab/grpo-alone/eval_adapter.py runs/ga-continue-lead-in/grpo/sft_warmup/adapter \
        --out runs/ga-continue-lead-in/warmup_eval.jsonl --lead-in-prob 0.5

What `run.py`'s curve prints for a checkpoint (success, and ``decision_row``: going ahead per gold class, the
balanced accuracy, the reward breakdown's shares), for an adapter that is not one of a GRPO run's checkpoints: a
warm-up GRPO continued (``--continue-warmup``, whose curve starts at the base), or a recipe run's adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("adapter", help="a LoRA folder over the planted base")
    p.add_argument("--out", required=True, help="trajectories file to write (resumed when present)")
    p.add_argument("--seeds", default="0:100", help="held-out env seeds, start:stop")
    p.add_argument("--lead-in-prob", type=float, default=0.0, help="as run.py's")
    p.add_argument("--env", default=None, help="as run.py's (default its env)")
    p.add_argument("--registry", default=None, help="as run.py's")
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE.parents[1]))
    import run as lab

    import trace_envs
    from trace_train.agents import HFAgent
    from trace_train.rollouts import read_trajectories, run_rollouts

    for registry in [lab.REGISTRY] + ([args.registry] if args.registry else []):
        trace_envs.load_registry(str(registry))
    a, b = (int(x) for x in args.seeds.split(":"))
    agent = HFAgent(str(lab.BASE), adapter=args.adapter, threads=1, max_new_tokens=160, temperature=0.0, seed=0)
    run_rollouts(args.env or lab.ENV, agent, seeds=range(a, b), in_flight=50, progress=False,
                 env_kwargs=lab.env_kwargs(args.lead_in_prob), out=args.out)
    episodes = read_trajectories(args.out)
    success = sum(bool(e["success"]) for e in episodes) / max(len(episodes), 1)
    print(json.dumps({"episodes": len(episodes), "success": success, **lab.decision_row(episodes)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
