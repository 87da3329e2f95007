"""Does TRACE's GRPO learn from reward? Five arms on the trainer sanity tasks, side by side, in one run.

    python bench/grpo_learning.py [--tasks trace/sanity_cabin-v0 trace/sanity_pair-v0] [--steps 40] [--every 10]
                                  [--groups 8] [--group-size 8] [--lr 3e-3] [--eval-seeds 64] [--seed 0]
                                  [--arms trl fast hf sft shuffled] [--out bench/out/grpo_learning]

Each task (:mod:`trace_envs.sanity`: a one-turn answer readable from the prompt) starts from the same model, made
by :func:`trace_train.train.sanity.near_chance_start` (the embedded default's shipped tiny base, fitted on random
answers in the task's format: it answers in format, at chance). Then, with the same prompts (training seeds in the same order), the same LoRA (r 8 on
q/k/v/o), the same learning rate, steps, groups and group size, one torch thread:

* ``trl``: **TRL's stock ``GRPOTrainer``** on the task's prompts, rewarded by the env (the anchor);
* ``fast``: TRACE's trainer (``trace_train.train.grpo.train``), ``decode: fast``, ``loss_forward: shared_prefix``;
* ``hf``: TRACE's trainer, ``decode: hf``, ``loss_forward: trl`` (``generate`` and TRL's forward);
* ``sft``: SFT on the oracle answers of the same number of prompts per step (the positive control);
* ``shuffled``: TRACE's fast trainer with each step's rewards dealt at random (``shuffle_rewards``: the negative
  control; it must not learn).

Every ``--every`` steps each arm's model is probed on held-out seeds (:func:`trace_train.train.sanity.answer_metrics`):
greedy balanced accuracy (chance: 0.5 for the cabin task, 0.25 for the pair task) and the teacher-forced
log-prob margin of the right answer over the best wrong one. Printed per task: one table with the arms side by
side, each arm's training seconds and, for TRACE's GRPO arms, the mean train/inference mismatch KL of its steps
(``train_log.csv``); then the ratio of each arm's final balanced accuracy gain over TRL's (the anchor, measured in
the same run). Results go to ``--out/<task>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trace_train.train.sanity import SANITY_TASKS  # noqa: E402

ARMS = ("trl", "fast", "hf", "sft", "shuffled")
#: The embedded default's base (shipped with the package): a tiny Qwen3 that has read airline conversations.
EMBEDDED_BASE = Path(__file__).resolve().parent.parent / "trace_train" / "tiny" / "bases" / "embedded-default"
#: First training seed (held-out evaluation seeds are 0 .. --eval-seeds).
TRAIN_SEED = 100_000
LORA = {"lora_r": 8, "lora_alpha": 16, "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}


def trace_config(args, task: str, model: str, out: Path, **kw):
    from trace_train.train.config import TrainConfig

    settings = dict(env_ids=[task], model=model, output_dir=str(out), max_steps=args.steps, group_size=args.group_size,
                    groups_per_step=args.groups, learning_rate=args.lr, seed_offset=TRAIN_SEED,
                    eval_seeds=[0, args.eval_seeds], calibration_groups=0, save_steps=10_000, max_turn_tokens=12,
                    max_tool_calling_iterations=1, max_completion_length=64, seed=args.seed, device="cpu", threads=1,
                    plot=False, progress=False, lr_scheduler_type=args.schedule,
                    trl_args={"warmup_steps": args.warmup}, **LORA)
    settings.update(kw)
    return TrainConfig(**settings)


def run_trace(args, task: str, model: str, out: Path, **kw) -> tuple[list[dict], list[dict]]:
    """TRACE's GRPO: (probe rows, train_log rows)."""
    from transformers import AutoTokenizer

    from trace_train.train.grpo import read_log, train
    from trace_train.train.sanity import AnswerProbe

    probe = AnswerProbe(AutoTokenizer.from_pretrained(model), task, range(args.eval_seeds), args.every)
    result = train(trace_config(args, task, model, out, **kw), callbacks=[probe])
    return probe.log.rows, read_log(result.log_csv)


def run_trl(args, task: str, model: str, out: Path) -> tuple[list[dict], list[dict]]:
    """TRL's stock GRPOTrainer on the same prompts: the env renders each seed's prompt and scores each completion."""
    import gymnasium as gym
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trace_envs.sanity import make_reply_scorer
    from trace_train.train.sanity import AnswerProbe

    torch.set_num_threads(1)
    env = gym.make(task)
    # The rows TRACE's trainer draws (trace_train.train.grpo._seed_dataset): one fresh seed per group of the run.
    seeds = [TRAIN_SEED + i for i in range(args.groups * args.steps)]
    prompts = [env.reset(seed=s)[1]["messages"] for s in seeds]
    env.close()
    score = make_reply_scorer(task)

    def env_reward(completions, seed, **kwargs):
        return [score(s, c[0]["content"] if isinstance(c, list) else c) for c, s in zip(completions, seed)]

    tokenizer = AutoTokenizer.from_pretrained(model)
    config = GRPOConfig(output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.groups * args.group_size,
                        num_generations=args.group_size, temperature=1.0, learning_rate=args.lr,
                        lr_scheduler_type=args.schedule, warmup_steps=args.warmup, epsilon=0.2, epsilon_high=0.28, beta=0.0,
                        loss_type="dapo", max_completion_length=12, logging_steps=1, save_strategy="no",
                        report_to="none", seed=args.seed, data_seed=args.seed, use_cpu=True, bf16=False,
                        gradient_checkpointing=False, disable_tqdm=True, top_k=0)
    probe = AnswerProbe(tokenizer, task, range(args.eval_seeds), args.every)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32),
                          reward_funcs=[env_reward], args=config, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": prompts, "seed": seeds}),
                          peft_config=LoraConfig(r=LORA["lora_r"], lora_alpha=LORA["lora_alpha"],
                                                 target_modules=LORA["lora_target_modules"], task_type="CAUSAL_LM"),
                          callbacks=[probe])
    trainer.train()
    return probe.log.rows, []


def run_sft(args, task: str, model: str, out: Path, start: dict) -> tuple[list[dict], list[dict]]:
    """SFT on the oracle answers: as many prompts per step as GRPO has groups, the same steps and learning rate."""
    from trace_train.train.sanity import sft_probe
    from trace_train.train.sft import fit_sft_lora

    cfg = trace_config(args, task, model, out, sft=True, sft_steps=args.steps, sft_batch_size=args.groups,
                       sft_episodes=args.groups * args.steps, sft_lr=args.lr)
    on_checkpoint, log = sft_probe(task, range(args.eval_seeds))
    log.add(0, 0.0, start)
    fit_sft_lora(cfg, {task: {}}, "cpu", out / "adapter", args.steps, on_checkpoint=on_checkpoint,
                 checkpoint_every=args.every)
    return log.rows, []


def table(task: str, results: dict, chance: float) -> str:
    steps = sorted({r["step"] for rows, _ in results.values() for r in rows})
    arms = list(results)
    head = "| step | " + " | ".join(f"{a}: bal. acc / margin" for a in arms) + " |"
    lines = [f"### {task} (chance {chance:.2f})", "", head, "|" + "---|" * (len(arms) + 1)]
    for step in steps:
        cells = []
        for a in arms:
            row = next((r for r in results[a][0] if r["step"] == step), None)
            cells.append(f"{row['balanced_accuracy']:.2f} / {row['margin']:+.2f}" if row else "")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    lines.append("")
    for a in arms:
        rows, log = results[a]
        extra = ""
        kls = [r["mismatch_kl"] for r in log if r.get("mismatch_kl") is not None]
        shares = [r["sampled_token_share"] for r in log if r.get("sampled_token_share") is not None]
        if kls:
            extra = f", mismatch KL mean {statistics.mean(kls):.2e} (max {max(kls):.2e}), sampled-token share " \
                    f"{statistics.mean(shares):.3f}"
        lines.append(f"- {a}: {rows[-1]['seconds']:.0f} s of training, final accuracy {rows[-1]['accuracy']:.2f}, "
                     f"in-set answers {rows[-1]['in_set']:.2f}{extra}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(SANITY_TASKS))
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--schedule", default="constant", help="learning-rate schedule of every arm (transformers name)")
    parser.add_argument("--warmup", type=int, default=0, help="warm-up steps of the schedule")
    parser.add_argument("--eval-seeds", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--base", default=str(EMBEDDED_BASE),
                        help="the model the near-chance start is fitted from (default: the embedded default's shipped "
                             "base); 'none' builds a fresh one of --preset")
    parser.add_argument("--start-steps", type=int, default=120, help="SFT steps on random answers of the start")
    parser.add_argument("--start-lr", type=float, default=3e-3, help="their learning rate")
    parser.add_argument("--preset", default="nano", help="with --base none: the tiny preset to build")
    parser.add_argument("--lora-targets", nargs="+", default=LORA["lora_target_modules"])
    parser.add_argument("--out", default="bench/out/grpo_learning")
    args = parser.parse_args()

    import torch

    from trace_train.train.sanity import near_chance_start

    torch.set_num_threads(1)
    LORA["lora_target_modules"] = list(args.lora_targets)
    out_root = Path(args.out)
    out_root.mkdir(parents=True, exist_ok=True)
    print(f"steps {args.steps}, {args.groups} groups x {args.group_size}, lr {args.lr}, LoRA r{LORA['lora_r']}, "
          f"held-out seeds 0..{args.eval_seeds}, seed {args.seed}; arms {', '.join(args.arms)}\n")
    for task in args.tasks:
        name = task.split("/")[-1]
        base = None if args.base == "none" else args.base
        start = near_chance_start(task, out_root / "starts" / f"{name}-{Path(base).name if base else args.preset}",
                                  base=base, preset=args.preset, seed=args.seed, steps=args.start_steps,
                                  lr=args.start_lr,
                                  eval_seeds=range(args.eval_seeds))
        chance = 1.0 / len(start.metrics["per_answer"])
        results: dict[str, tuple[list[dict], list[dict]]] = {}
        with tempfile.TemporaryDirectory(prefix=f"grpo-learning-{name}-") as tmp:
            for arm in args.arms:
                where = Path(tmp) / arm
                if arm == "trl":
                    results[arm] = run_trl(args, task, str(start.path), where)
                elif arm == "sft":
                    results[arm] = run_sft(args, task, str(start.path), where, start.metrics)
                else:
                    kw = {"fast": dict(decode="fast", loss_forward="shared_prefix"),
                          "hf": dict(decode="hf", loss_forward="trl"),
                          "shuffled": dict(decode="fast", loss_forward="shared_prefix", shuffle_rewards=True)}[arm]
                    results[arm] = run_trace(args, task, str(start.path), where, **kw)
                last = results[arm][0][-1]
                print(f"  {name} {arm}: balanced accuracy {results[arm][0][0]['balanced_accuracy']:.2f} -> "
                      f"{last['balanced_accuracy']:.2f}, margin {last['margin']:+.2f}", flush=True)
        print()
        print(table(task, results, chance))
        if "trl" in results:
            anchor = results["trl"][0][-1]["balanced_accuracy"] - chance
            for arm in results:
                gain = results[arm][0][-1]["balanced_accuracy"] - chance
                ratio = f"{gain / anchor:.2f}" if abs(anchor) > 1e-9 else "n/a (TRL did not move)"
                print(f"  ratio {arm} / trl (final balanced accuracy above chance): {ratio}")
        print()
        (out_root / f"{name}.json").write_text(json.dumps(
            {"task": task, "args": vars(args), "start": start.metrics,
             "arms": {a: {"probes": rows, "train_log": log} for a, (rows, log) in results.items()}}, indent=2,
            default=str))


if __name__ == "__main__":
    main()
