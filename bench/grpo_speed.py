"""Seconds per GRPO step on CPU, split by phase: ``trace train`` on a τ² capability env vs TRL's plain GRPO.

    python bench/grpo_speed.py [--env trace/precondition_verification-v0] [--steps 3] [--preset tiny]

Both runs use the same model (the ``tiny`` preset, built offline), LoRA, group size, groups per step, one
torch thread and fp32:

* **ours**: ``trace_train.grpo.train`` (multi-turn episodes in the env through TRACE's rollout function);
  its ``train_log.csv`` splits each step into generation (the model writing turns), env (tool calls, the
  simulated user and the reward, which the env computes at its last step), forward/backward (TRL's loss on
  the episode's tokens) and optimizer;
* **anchor**: TRL's own single-turn ``GRPOTrainer`` on the env's first prompts (the same dataset rows:
  the policy, then the user turn that ``reset`` would fill, left empty),
  completions of ``--turn-tokens`` tokens, a length reward — TRL's cheapest path, timed by its
  ``step_time`` metric.

Printed: the per-phase table, seconds per step of both, the ratio ours / anchor, and the ratio per
trained completion token. The machine is shared (2 cores): every time is under contention.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def anchor(model: str, env: str, env_kwargs: dict, steps: int, group: int, groups: int, turn_tokens: int,
           out: Path) -> dict:
    """TRL's plain single-turn GRPO on the env's opening prompts (reward: completion length, no env)."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trace_envs.adapters.trl import make_dataset

    dataset = make_dataset(env, seeds=range(2_000_000, 2_000_000 + steps * groups), env_kwargs=env_kwargs)
    dataset = dataset.remove_columns([c for c in dataset.column_names if c != "prompt"])

    def length_reward(completions, **kwargs):
        return [float(len(str(c))) / 100 for c in completions]

    tok = AutoTokenizer.from_pretrained(model)
    args = GRPOConfig(output_dir=str(out), max_steps=steps, per_device_train_batch_size=group * groups,
                      num_generations=group, max_completion_length=turn_tokens, learning_rate=1e-4, beta=0.0,
                      logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                      gradient_checkpointing=False, disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                          processing_class=tok, args=args, train_dataset=dataset,
                          reward_funcs=[length_reward],
                          peft_config=LoraConfig(r=16, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                      "o_proj"], task_type="CAUSAL_LM"))
    t0 = time.perf_counter()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    return {"step_s": statistics.median(h["step_time"] for h in logs), "wall_s": time.perf_counter() - t0,
            "completion_tokens": statistics.mean(h["completions/mean_length"] for h in logs) * group * groups}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="trace/precondition_verification-v0")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", help="a model folder (default: build --preset)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=1)
    ap.add_argument("--turn-tokens", type=int, default=64)
    ap.add_argument("--max-turns", type=int, default=6)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from trace_train.grpo import TrainConfig, read_log, train
    from trace_train.models import build_model, prompt_env_kwargs

    model = args.model or str(build_model(args.preset, env_ids=[args.env]).path)
    env_kwargs = {**prompt_env_kwargs(args.env), "difficulty": 1}
    work = Path(tempfile.mkdtemp(prefix="grpo-speed-"))
    cfg = TrainConfig(env_ids=[args.env], env_kwargs=env_kwargs, model=model, output_dir=str(work / "ours"),
                      max_steps=args.steps, group_size=args.group_size, groups_per_step=args.groups_per_step,
                      max_turn_tokens=args.turn_tokens, max_tool_calling_iterations=args.max_turns,
                      calibration_groups=0, save_steps=10_000, learning_rate=1e-4, progress=False, plot=False)
    train(cfg)
    rows = read_log(cfg.output_dir + "/train_log.csv")[1:] or read_log(cfg.output_dir + "/train_log.csv")
    phases = ("generation_s", "env_s", "forward_backward_s", "optimizer_s")
    med = {p: statistics.median(r[p] for r in rows) for p in phases + ("step_s", "completion_length")}
    other = med["step_s"] - sum(med[p] for p in phases)
    print(f"ours: {args.env}, {args.preset}, {args.group_size}x{args.groups_per_step} episodes/step, "
          f"<= {args.max_turns} turns of <= {args.turn_tokens} tokens (median of {len(rows)} steps, first skipped)")
    for p in phases:
        print(f"  {p[:-2]:18s} {med[p]:7.2f} s  {med[p] / med['step_s']:6.1%}")
    print(f"  {'other (TRL glue)':18s} {other:7.2f} s  {other / med['step_s']:6.1%}")
    print(f"  {'step':18s} {med['step_s']:7.2f} s   ({med['completion_length']:.0f} model tokens per episode)")
    ref = anchor(model, args.env, env_kwargs, args.steps, args.group_size, args.groups_per_step, args.turn_tokens,
                 work / "anchor")
    ours_tokens = med["completion_length"] * args.group_size * args.groups_per_step
    print(f"anchor (TRL single-turn GRPO, same model and batch, {args.turn_tokens}-token completions): "
          f"{ref['step_s']:.2f} s/step")
    print(f"ratio ours/anchor: {med['step_s'] / ref['step_s']:.2f}x per step; "
          f"{(med['step_s'] / max(1.0, ours_tokens)) / (ref['step_s'] / max(1.0, ref['completion_tokens'])):.2f}x per "
          "model token (2 shared cores: timings under contention)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
