"""Seconds per GRPO step on CPU, split by phase: the fast path against today's path, in one run.

    python bench/grpo_speed.py [--env trace/precondition_verification-v0] [--steps 4] [--rounds 1] [--preset tiny]
                               [--model DIR] [--trl-anchor]

Both paths run ``trace_train.train.grpo.train`` with the training config of ``trace run``'s embedded default
(``pipeline_config.embedded_default().train.options``: group size, groups per step, tokens per turn, turns,
temperature, learning rate, env kwargs), the same model (the ``tiny`` preset built offline, unless
``--model``), LoRA, seeds, one torch thread and fp32:

* **today's path** (the anchor): ``decode: hf`` (rollouts through ``model.generate``) and
  ``loss_forward: trl`` (TRL's padded forward over every episode);
* **fast path**: ``decode: fast`` (:mod:`trace_train.tiny.fast_decode`) and ``loss_forward: shared_prefix``
  (:mod:`trace_train.train.prefix_logprobs`).

The runs alternate (today, fast, then fast, today with ``--rounds 2``, ...) so that both see the same load.
Each run's ``train_log.csv`` splits a step into generation (the model writing turns), env (tool calls, the
simulated user, the reward), forward/backward (TRL's loss and its gradient on the episodes' tokens) and
optimizer; the first step of a run is skipped (warm-up), the table shows medians. Both paths sample with
the same RNG in the same order, so they usually play the same episodes: the printed model tokens per
episode say whether they did. ``--trl-anchor`` adds the older anchor: TRL's own single-turn
``GRPOTrainer`` on the env's first prompts.

Printed: the per-phase table of both paths, seconds per step and episodes per second, and the ratio
today / fast. The machine is shared (2 cores): every time is under contention.
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

PATHS = {"today": {"decode": "hf", "loss_forward": "trl"}, "fast": {"decode": "fast", "loss_forward": "shared_prefix"}}
PHASES = ("generation_s", "env_s", "forward_backward_s", "optimizer_s")


def trl_anchor(model: str, env: str, env_kwargs: dict, steps: int, group: int, groups: int, turn_tokens: int,
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
                          processing_class=tok, args=args, train_dataset=dataset, reward_funcs=[length_reward],
                          peft_config=LoraConfig(r=16, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                      "o_proj"], task_type="CAUSAL_LM"))
    trainer.train()
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    return {"step_s": statistics.median(h["step_time"] for h in logs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env", default="trace/precondition_verification-v0")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--model", help="a model folder (default: build --preset)")
    ap.add_argument("--steps", type=int, default=4, help="GRPO steps per run (the first is skipped)")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each path, alternating")
    ap.add_argument("--trl-anchor", action="store_true", help="also time TRL's single-turn GRPOTrainer")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from trace_train.train.grpo import TrainConfig, read_log, train
    from trace_train.tiny.build import build_model
    from trace_train.tiny.metadata import prompt_env_kwargs
    from trace_train.pipeline.config import embedded_default

    options = dict(embedded_default().train.options)
    options.pop("save_steps", None)
    env_kwargs = {**prompt_env_kwargs(args.env), **options.pop("env_kwargs", {})}
    model = args.model or str(build_model(args.preset, env_ids=[args.env]).path)
    work = Path(tempfile.mkdtemp(prefix="grpo-speed-"))
    rows: dict[str, list[dict]] = {name: [] for name in PATHS}
    order = []
    for r in range(args.rounds):
        order += list(PATHS) if r % 2 == 0 else list(reversed(PATHS))
    for i, name in enumerate(order):
        cfg = TrainConfig(env_ids=[args.env], env_kwargs=env_kwargs, model=model, output_dir=str(work / f"{name}{i}"),
                          max_steps=args.steps, save_steps=10_000, progress=False, plot=False, **options,
                          **PATHS[name])
        t0 = time.perf_counter()
        train(cfg)
        log = read_log(Path(cfg.output_dir) / "train_log.csv")
        rows[name] += log[1:] or log
        print(f"  ran {name} ({PATHS[name]['decode']}, {PATHS[name]['loss_forward']}): {len(log)} steps in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)

    med = {name: {k: statistics.median(r[k] for r in rs) for k in PHASES + ("step_s", "completion_length",
                                                                            "episodes")}
           for name, rs in rows.items()}
    print(f"\n{args.env}, {Path(model).name}, {options['group_size']}x{options['groups_per_step']} episodes/step, "
          f"<= {options['max_tool_calling_iterations']} turns of <= {options['max_turn_tokens']} tokens, "
          f"temperature {options['temperature']} (embedded default's train options); median of "
          f"{len(rows['today'])} steps per path, each run's first skipped")
    print(f"  {'phase':18s} {'today (s)':>10s} {'share':>6s}  {'fast (s)':>9s} {'share':>6s}  {'today/fast':>10s}")
    for key in PHASES + ("other", "step_s"):
        vals = {}
        for name, m in med.items():
            vals[name] = m["step_s"] - sum(m[p] for p in PHASES) if key == "other" else m[key]
        label = "other (TRL glue)" if key == "other" else key[:-2]
        t, f = vals["today"], vals["fast"]
        ratio = f"{t / f:9.2f}x" if f > 0.005 else "        -"
        print(f"  {label:18s} {t:10.2f} {t / med['today']['step_s']:6.1%}  {f:9.2f} {f / med['fast']['step_s']:6.1%}  "
              f"{ratio}")
    for name, m in med.items():
        print(f"  {name}: {m['episodes'] / m['step_s']:.2f} episodes/s, {m['completion_length']:.0f} model tokens per "
              "episode")
    ratio = med["today"]["step_s"] / med["fast"]["step_s"]
    print(f"ratio today/fast: {ratio:.2f}x per GRPO step (same run; 2 shared cores: timings under contention)")
    if args.trl_anchor:
        ref = trl_anchor(model, args.env, env_kwargs, args.steps, options["group_size"], options["groups_per_step"],
                         options["max_turn_tokens"], work / "anchor")
        print(f"TRL single-turn GRPO anchor: {ref['step_s']:.2f} s/step; fast/anchor "
              f"{med['fast']['step_s'] / ref['step_s']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
