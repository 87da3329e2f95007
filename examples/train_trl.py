"""GRPO with LoRA on a TRACE env, in plain TRL: ``GRPOTrainer(environment_factory=...)``.

The adapter (:mod:`trace_envs.adapters.trl`) turns the env into the class TRL wants: the env's
tools as methods, ``send_message_to_user`` for the conversation, ``reset(**row)`` from the dataset
row's seed, and ``get_reward()`` = the env's verifiable reward. Every GRPO group shares one seed,
because TRL repeats each dataset row ``num_generations`` times.

Launch on CPU with the tiny offline model (built on first use, no hub access; a random model makes
few valid tool calls, so this checks the pipeline rather than learning much)::

    python examples/train_trl.py          # the worked example env (examples/registry.yaml), 4 steps, a nano model

On a GPU with a real model::

    python examples/train_trl.py --env trace/tau_airline-v0 --model Qwen/Qwen3-1.7B \\
        --num-generations 16 --prompts-per-step 4 --max-steps 40 --max-completion-length 4096 --lr 1e-5
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Args:
    """Command-line settings (see ``--help``)."""

    env: str
    model: str | None
    seeds: int
    num_generations: int
    prompts_per_step: int
    max_steps: int
    lr: float
    lora_r: int
    lora_alpha: int
    max_completion_length: int
    temperature: float
    output_dir: str
    threads: int


def parse_args(argv: list[str] | None = None) -> Args:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="examples/warehouse_stock-v0", help="registered env id")
    p.add_argument("--model", default=None,
                   help="a causal LM folder or hub id; default: the tiny offline model (trace_train.tiny)")
    p.add_argument("--seeds", type=int, default=256, help="task seeds: range(SEEDS), one dataset row each")
    p.add_argument("--num-generations", type=int, default=4, help="GRPO group size (rollouts per seed)")
    p.add_argument("--prompts-per-step", type=int, default=2, help="groups per optimiser step")
    p.add_argument("--max-steps", type=int, default=4, help="optimiser steps")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate")
    p.add_argument("--lora-r", type=int, default=16, help="LoRA rank")
    p.add_argument("--lora-alpha", type=int, default=16, help="LoRA alpha")
    p.add_argument("--max-completion-length", type=int, default=256,
                   help="token budget of a whole multi-turn rollout (tool outputs included)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
    p.add_argument("--output-dir", default="runs/train_trl", help="where the LoRA adapter is saved")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for tiny models)")
    ns = p.parse_args(argv)
    return Args(**vars(ns))


def register_examples(env_id: str) -> None:
    """Register ``examples/registry.yaml`` (this folder's workspace) when ``env_id`` is one of its ids, so that the
    example runs from any folder without ``TRACE_REGISTRY=examples``."""
    from trace_envs.core.registry import load_registry, registered

    if env_id.startswith("examples/") and env_id not in {e.id for e in registered()}:
        load_registry(Path(__file__).resolve().with_name("registry.yaml"))


def tiny_model(env_id: str) -> str:
    """The tiny offline Qwen3 model (random init, TRL's Qwen3 chat template), built once and cached."""
    from trace_train.tiny.build import build_model

    return str(build_model("nano", env_ids=[env_id]).path)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    register_examples(args.env)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import trace_envs
    from trace_envs.adapters.trl import environment_factory, make_dataset

    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        torch.set_num_threads(args.threads)
    entry = trace_envs.get_entry(args.env)
    env_kwargs: dict = {}
    if args.model is None:
        from trace_train.tiny.metadata import prompt_env_kwargs

        env_kwargs = prompt_env_kwargs(args.env)  # compact prompts where the env has them: a tiny context
        args.model = tiny_model(args.env)
    factory = environment_factory(args.env, **env_kwargs)
    dataset = make_dataset(args.env, seeds=args.seeds, env_kwargs=env_kwargs or None)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if on_gpu else torch.float32)
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.num_generations * args.prompts_per_step,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=entry.max_episode_steps,
        temperature=args.temperature,
        learning_rate=args.lr,
        beta=0.0,  # no KL term (the reference settings), so no reference model is kept
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=not on_gpu,
        bf16=on_gpu,
        gradient_checkpointing=False,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tokenizer, args=config, train_dataset=dataset,
        environment_factory=factory,
        peft_config=LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha, target_modules="all-linear",
                               task_type="CAUSAL_LM"),
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    key = f"rewards/{factory.__name__}/mean"
    curve = [entry_[key] for entry_ in trainer.state.log_history if key in entry_]
    print(f"{args.env}: env reward per step {['%.3f' % r for r in curve]}; LoRA adapter in {args.output_dir}")
    return {"rewards": curve, "output_dir": args.output_dir}


if __name__ == "__main__":
    main(sys.argv[1:])
    sys.exit(0)
