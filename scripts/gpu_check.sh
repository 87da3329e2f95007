#!/usr/bin/env bash
# GPU check of `trace train` (issue 15): 2 GRPO steps in bf16 on CUDA with a ~0.5B-parameter Qwen3 built
# offline (Qwen3-0.6B's shape, random init) and the tiny model's tokenizer, through the same
# trace_train.train.grpo.train code as the CPU runs. Prints seconds per step (with its phases) and peak GPU
# memory; writes gpu_check.json, the run's train_log.csv and the log under $OUT when it is set.
#
#   bash scripts/gpu_check.sh            # bf16 + HF generation (the part that runs on a machine without vLLM)
#   bash scripts/gpu_check.sh --vllm     # also TRL's vLLM colocate path, only if `import vllm` works
#
# Needs torch with CUDA, transformers, peft, accelerate; TRL is installed from a carried wheel
# (wheels/trl-*.whl, e.g. `pip download trl==1.16.0 --no-deps -d wheels`) when it is missing.
# Whole script: well under 8 minutes (each Python part runs under `timeout`).
set -euo pipefail

OUT="${OUT:-$(mktemp -d /tmp/gpu-check.XXXXXX)}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
WANT_VLLM=0
[ "${1:-}" = "--vllm" ] && WANT_VLLM=1
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 TOKENIZERS_PARALLELISM=false TRACE_CACHE="$OUT/cache"
exec > >(tee "$OUT/gpu_check.log") 2>&1

cd "$(dirname "$0")/.."
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: torch sees no CUDA GPU here; nothing to check (run it on a GPU machine)"
    exit 2
fi
if ! "$PY" -c "import trl" 2>/dev/null; then
    wheel="$(ls wheels/trl-*.whl shared/wheels/trl-*.whl 2>/dev/null | head -1 || true)"
    if [ -z "$wheel" ]; then
        echo "gpu_check: trl is not installed and no wheels/trl-*.whl was carried (pip download trl==1.16.0 --no-deps -d wheels)"
        exit 2
    fi
    "$PY" -m pip install -q --no-deps "$wheel"
fi
# The project itself, from this checkout (its other dependencies are on the GPU machine already, or light).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
for pkg in gymnasium faker datasets; do
    "$PY" -c "import $pkg" 2>/dev/null || "$PY" -m pip install -q "$pkg" || echo "gpu_check: could not install $pkg"
done

run_check() {  # $1 = hf | vllm
    timeout 330 "$PY" - "$1" <<'PYEOF'
import json, os, statistics, sys, time
from pathlib import Path

import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

from trace_train.train.grpo import TrainConfig, read_log, train
from trace_train.tiny.build import build_model
from trace_train.tiny.metadata import prompt_env_kwargs

mode = sys.argv[1]
out = Path(os.environ["OUT"])
env = "trace/precondition_verification-v0"
model_dir = out / "qwen3-0.5b"
if not (model_dir / "config.json").exists():
    t0 = time.perf_counter()
    tiny = build_model("tiny", env_ids=[env])  # only its tokenizer (TRL's Qwen3 template) is used
    tok = AutoTokenizer.from_pretrained(tiny.path)
    # Qwen3-0.6B's shape (28 layers, hidden 1024, 16 query / 8 key-value heads of 128), random init.
    config = Qwen3Config(vocab_size=len(tok) + (-len(tok)) % 64, hidden_size=1024, intermediate_size=3072,
                         num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                         max_position_embeddings=8192, tie_word_embeddings=True,
                         eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id)
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    print(f"built {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M-parameter Qwen3 in "
          f"{time.perf_counter() - t0:.0f}s")
extra = dict(rollout="trl", use_vllm=True, vllm_mode="colocate",
             trl_args={"vllm_gpu_memory_utilization": 0.3}) if mode == "vllm" else {}
cfg = TrainConfig(env_ids=[env], env_kwargs={**prompt_env_kwargs(env), "difficulty": 1}, model=str(model_dir),
                  output_dir=str(out / f"run-{mode}"), device="cuda", max_steps=2, group_size=4, groups_per_step=2,
                  learning_rate=1e-5, max_turn_tokens=64, max_tool_calling_iterations=4, max_completion_length=1024,
                  calibration_groups=0, save_steps=1000, progress=False, **extra)
torch.cuda.reset_peak_memory_stats()
t0 = time.perf_counter()
result = train(cfg)
rows = read_log(result.log_csv)
peak = torch.cuda.max_memory_allocated() / 2**30
summary = {"mode": mode, "steps": result.steps, "seconds": time.perf_counter() - t0, "peak_gib": peak,
           "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "step_s": [r["step_s"] for r in rows],
           "phases_last_step": {k: rows[-1].get(k) for k in ("generation_s", "env_s", "forward_backward_s",
                                                             "optimizer_s")} if rows else {}}
print(json.dumps(summary, indent=1))
print(f"{mode}: {result.steps} steps, {statistics.mean(summary['step_s']):.2f} s/step, peak {peak:.2f} GiB")
(out / f"gpu_check_{mode}.json").write_text(json.dumps(summary, indent=1))
PYEOF
}

run_check hf
if [ "$WANT_VLLM" = 1 ]; then
    if "$PY" -c "import vllm" 2>/dev/null; then
        run_check vllm
    else
        echo "vLLM path: not run (vllm is not installed on this machine; TRL 1.16 supports vllm<=0.31)"
    fi
fi
echo "gpu_check: results under $OUT"
