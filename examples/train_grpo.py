"""One LoRA adapter per capability with GRPO: ``trace_train.train.grpo.train`` (what ``trace train`` runs).

CPU, the tiny offline model (no hub access; ~10 s per step of 8 short episodes on 2 idle cores). First a
base that is sometimes right on the capability env: the bootstrap on the target plus a low share of the
env's own oracle episodes (a base warmed up on the target alone scores ~0 there, and GRPO learns nothing
from groups that are all 0)::

    trace model bootstrap --target trace/tau_airline-v0 --env-kwarg 'size={"bundle_prob": 0}' \\
        --mix trace/precondition_verification-v1=0.05 --mix-env-kwarg difficulty=1 --minutes 10
    python examples/train_grpo.py --model <the folder it printed> --env trace/precondition_verification-v1

With no arguments it prints this text. The same from the shell: ``trace train --env trace/precondition_verification-v1 --model M --out DIR
--difficulty 1 --steps 20 --lr 1e-3 --group-size 4 --groups-per-step 2``.

GPU, a Qwen3 model (bf16; generation through HF ``generate`` in TRACE's rollout loop)::

    python examples/train_grpo.py --model Qwen/Qwen3-1.7B --device cuda --group-size 16 --groups-per-step 4 \\
        --lr 1e-5 --steps 40

GPU with TRL's vLLM generation (``pip install 'vllm<=0.31'``): colocate mode on one GPU; ``--vllm-mode
server`` with ``trl vllm-serve --model Qwen/Qwen3-8B`` on other GPUs. Several GPUs / nodes go through
``accelerate launch`` with a DeepSpeed ZeRO-2 or FSDP config (TRL ships ``zero2.yaml`` and ``fsdp2.yaml``
under ``trl/accelerate_configs/``; for several nodes add ``--num_machines``, ``--machine_rank`` and
``--main_process_ip`` on each)::

    python examples/train_grpo.py --model Qwen/Qwen3-1.7B --device cuda --vllm --steps 40
    CONFIGS=$(python -c "import os, trl; print(os.path.dirname(trl.__file__))")/accelerate_configs
    CUDA_VISIBLE_DEVICES=0 trl vllm-serve --model Qwen/Qwen3-8B &
    CUDA_VISIBLE_DEVICES=1,2,3 accelerate launch --config_file $CONFIGS/zero2.yaml --num_processes 3 \\
        examples/train_grpo.py --model Qwen/Qwen3-8B --device cuda --vllm --vllm-mode server --steps 40
    # FSDP instead of ZeRO-2: --config_file $CONFIGS/fsdp2.yaml
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="base model folder or hub id (without it: how to run this example)")
    ap.add_argument("--env", action="append", default=None, help="capability env id (repeatable)")
    ap.add_argument("--out", default="runs/train_grpo")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--difficulty", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--vllm", action="store_true", help="TRL's vLLM generation (GPU; TRL's tool loop)")
    ap.add_argument("--vllm-mode", default="colocate", choices=["colocate", "server"])
    args = ap.parse_args()
    if not args.model:  # a GRPO run needs a base that is sometimes right on the env: say how to make one
        print(__doc__)
        return 0

    from trace_train.train.grpo import TrainConfig, train

    cfg = TrainConfig(env_ids=args.env or ["trace/precondition_verification-v1"],
                      env_kwargs={"difficulty": args.difficulty}, model=args.model, output_dir=args.out,
                      device=args.device, max_steps=args.steps, group_size=args.group_size,
                      groups_per_step=args.groups_per_step, learning_rate=args.lr,
                      resample_attempts=0 if args.vllm else 1, calibration_groups=2,
                      rollout="trl" if args.vllm else "trace", use_vllm=args.vllm, vllm_mode=args.vllm_mode)
    result = train(cfg)
    print(f"{result.steps} steps, {result.rollouts} rollouts; adapter {result.adapter_dir}; log {result.log_csv}; "
          f"curve {result.curve_png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
