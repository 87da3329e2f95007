"""``trace demo``: a half-minute tour of TRACE's first stages with a scripted base agent whose gaps are known.

The main job — the whole loop on the tiny model, with a report — is ``trace run`` (what ``make demo``
runs). This tour needs no model: it shows the diagnosis finding exactly the gaps planted in the base.

1. **Roll out** the base agent on the τ²-style targets (``trace/tau_airline-v0``,
   ``trace/tau_retail-v0``). The embedded base agent is the scripted reference agent that, in each
   episode, lacks each of two capabilities (``--base-lacks``) with probability ``--gap-rate``: an
   agent with real, known gaps that sometimes still gets things right, so the diagnosis can be
   checked against the truth.
2. **Diagnose** (``trace diagnose``): contrast its successes and failures, label every trajectory
   with the offline labeler, keep the capabilities with Δ ≥ 0.20 and coverage ≥ 0.10.
3. **Capability environments**: for each retained capability, its registered environment
   (``trace/<capability>-vN``, the newest) is calibrated against the base agent and the oracle — the base agent
   scores low where it lacks the capability, the oracle scores 1.0.

Training one LoRA adapter per capability with GRPO and composing them (stages 3–4 of TRACE) need a
model: ``trace run`` does them. Everything is written under ``--out`` (trajectories,
``capabilities.json``, report, figure, specs).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from . import CommandError, format_table

DEFAULT_TARGETS = ["trace/tau_airline-v0", "trace/tau_retail-v0"]
DEFAULT_LACKS = ["multi_step_completion", "tool_calling_precision"]


def register(subparsers) -> None:
    p = subparsers.add_parser("demo", help="a half-minute tour of the first stages (scripted base; no model)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", nargs="+", default=DEFAULT_TARGETS, help="target env ids")
    p.add_argument("--base-lacks", nargs="*", default=DEFAULT_LACKS, metavar="CAPABILITY",
                   help="capabilities the embedded base agent lacks (default: %(default)s)")
    p.add_argument("--gap-rate", type=float, default=0.7,
                   help="per-episode probability that each gap shows (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=100, help="episodes per target (default: %(default)s)")
    p.add_argument("--calibration-seeds", type=int, default=50,
                   help="episodes per capability environment in step 3 (default: %(default)s)")
    p.add_argument("--out", default="runs/demo", help="run directory (default: %(default)s)")
    p.set_defaults(func=run)


def _progress(iterable, desc: str, total: int):
    try:
        from tqdm import tqdm
    except ImportError:  # the suite-only install has no tqdm
        return iterable
    return tqdm(iterable, desc=desc, total=total, leave=False)


def run(args: argparse.Namespace) -> int:
    import gymnasium as gym

    import trace_envs
    from trace_envs import rollout
    from trace_envs.domains.agents import NoisyTauAgent
    from trace_envs.domains.task import CAPABILITIES

    known = {e.id for e in trace_envs.registered()}
    missing = [t for t in args.targets if t not in known]
    if missing:
        raise CommandError(f"unknown target env(s) {missing}; see `trace envs list`")
    unknown = sorted(set(args.base_lacks) - set(CAPABILITIES))
    if unknown:
        raise CommandError(f"unknown capabilities {unknown}; choose from {', '.join(CAPABILITIES)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    # 1. Rollouts of the base agent on the targets.
    def base_agent(seed: int = 0) -> NoisyTauAgent:
        return NoisyTauAgent(p=args.gap_rate, seed=seed, capabilities=args.base_lacks, name="base")

    base = base_agent()
    path = out / "trajectories.jsonl"
    rows = []
    with path.open("w", encoding="utf-8") as f:
        for target in args.targets:
            env = gym.make(target)
            rewards = []
            for seed in _progress(range(args.seeds), f"1/3 rollouts {target}", args.seeds):
                record = rollout(env, base, seed)
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                rewards.append(record["reward"])
            env.close()
            rows.append([target, len(rewards), f"{sum(rewards) / len(rewards):.2f}"])
    print(f"\n1. Base agent (gaps: {', '.join(args.base_lacks) or 'none'}, each shown with p={args.gap_rate}) "
          "on the targets\n")
    print(format_table(["target", "episodes", "success"], rows))

    # 2. Contrastive diagnosis.
    from trace_train.analysis.pipeline import diagnose

    result = diagnose(path, out / "diagnosis")
    print("\n2. Diagnosis (offline labeler; retained if Δ ≥ 0.20 and coverage ≥ 0.10)\n")
    print(format_table(["capability", "Δ", "coverage", "retained"],
                       [[s.name, _fmt(s.mean_delta), _fmt(s.mean_coverage), "yes" if s.retained else "no"]
                        for s in result.scores]))
    planted, found = set(args.base_lacks), set(result.retained)
    verdict = "exactly the planted gaps" if planted == found else \
        f"planted {sorted(planted)}, retained {sorted(found)}"
    print(f"\n   retained: {', '.join(result.retained) or 'none'} ({verdict})")
    print(f"   report: {result.report}   figure: {result.figure}")

    # 3. The capability environments of the retained capabilities.
    from trace_envs.calibration import run_calibration

    rows = []
    for capability in result.retained:
        env_id = _latest_id(capability)
        if env_id not in known:
            rows.append([env_id, "-", "-", "not registered yet (the generator stage writes it)"])
            continue
        base_report = run_calibration(env_id, base_agent,
                                      groups=args.calibration_seeds, group_size=1)
        oracle_report = run_calibration(env_id, "oracle", groups=args.calibration_seeds, group_size=1)
        rows.append([env_id, f"{base_report.mean_reward:.2f}", f"{oracle_report.mean_reward:.2f}", ""])
    print("\n3. Capability environments for the retained capabilities (mean reward)\n")
    print(format_table(["environment", "base agent", "oracle", "note"], rows))

    summary = {"base_lacks": args.base_lacks, "retained": result.retained, "seconds": time.perf_counter() - t0,
               "trajectories": str(path), "capabilities": str(result.capabilities_json)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\nDone in {summary['seconds']:.1f} s. Outputs in {out}/ "
          "(the whole loop — GRPO per capability, composition, evaluation — is `trace run`).")
    return 0


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _latest_id(capability: str) -> str:
    """The newest hand-written id of ``capability``, or its ``-v0`` name when none is registered yet."""
    from trace_envs.core.registry import latest_capability_id

    try:
        return latest_capability_id(capability)
    except KeyError:
        return f"trace/{capability}-v0"
