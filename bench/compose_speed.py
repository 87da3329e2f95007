"""What routing per token costs: the composed model (top-1, sparse) against one LoRA, the base, a dense
"compute every expert" version and PEFT's X-LoRA, at K = 2, 4 and 8 adapters.

Anchor: one LoRA through PEFT (every token pays for one adapter), measured in the same run on the same
inputs. Each row prints prefill latency (one forward over ``--batch`` x ``--length`` tokens, no cache)
and generation throughput (greedy ``generate`` of ``--new-tokens`` tokens for ``--batch`` prompts of
``--prompt`` tokens, with the KV cache), and both as a ratio against the anchor. Goal (issue 16):
composed <= 1.1x one LoRA at K = 4 on the ~100M config.

Models: the ``tiny`` preset (trace_train.tiny) and ``100m``, a random Qwen3 config of ~100M parameters
(hidden 768, 12 blocks, MLP 2048, vocab 32768). Adapters are random non-zero LoRAs (rank ``--rank`` on
every projection of every block, the costliest layout). The composed model's gates are set so that
every token goes to one of the K experts (none to the base slot), spread over all of them: each token
pays for exactly one adapter, the same LoRA work as the anchor, so the ratio shows the routing overhead.
Timings are medians over ``--repeats`` interleaved runs (variants take turns).

``--fast`` adds a second table on the configs the hand-written decode loop takes
(:mod:`trace_train.tiny.fast_decode`): generation throughput of one PEFT LoRA on that loop (the anchor of the
table) against the composed model with context gates (each gate also reads the centred running mean of its
block's inputs; centres fitted on the prefill inputs) on the same loop, and the same composed model through
``generate``, whose KV cache the context gates' running sums also ride on. With one CPU thread
(the default) the clock is the process's CPU time, so other jobs on a shared machine do not enter the
measurement; with more threads or on CUDA it is wall time.

Usage::

    python bench/compose_speed.py                        # tiny and 100m, K = 2 4 8
    python bench/compose_speed.py --configs tiny --ks 4 --repeats 9
    python bench/compose_speed.py --device cuda --threads 0
    python bench/compose_speed.py --configs tiny --ks 2 4 --fast --no-xlora   # + context gates on the fast loop
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def base_model(name: str, root: Path) -> str:
    """The model folder of a bench config (built once into ``root``)."""
    if name == "tiny":
        from trace_train.tiny.build import build_model

        return str(build_model("tiny").path)
    if name != "100m":
        raise SystemExit(f"unknown config {name!r}; choose tiny or 100m")
    path = root / "qwen3-100m"
    if not (path / "config.json").exists():
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(vocab_size=32768, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                             num_attention_heads=12, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True,
                             max_position_embeddings=4096, eos_token_id=0, pad_token_id=0, bos_token_id=None)
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(path)
    return str(path)


def make_adapters(base: str, k: int, root: Path, rank: int) -> list[str]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = []
    for i in range(k):
        path = root / f"{Path(base).name}-r{rank}-{i}"
        if not (path / "adapter_config.json").exists():
            torch.manual_seed(100 + i)
            model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                   LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS, init_lora_weights=False))
            model.save_pretrained(str(path))
        out.append(str(path))
    return out


def spread_gates(model, seed: int = 0) -> None:
    """Every token to one of the K experts (never the base), spread over all of them."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for g in model.gates:
            g.weight.copy_(torch.randn(g.weight.shape, generator=gen) * 4.0 / g.weight.shape[1] ** 0.5)
            g.bias.zero_()
            g.bias[0] = -1e4


def expert_shares(model, ids) -> list[float]:
    import torch

    with torch.inference_mode(), model.recording() as routers:
        model(input_ids=ids, use_cache=False)
        choices = torch.cat([r.choice.flatten() for r in routers])
    counts = torch.bincount(choices, minlength=model.num_experts + 1).tolist()
    return [c / len(choices) for c in counts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["tiny", "100m"], help="model configs (default: tiny 100m)")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8], help="adapter counts (default: 2 4 8)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (default: 16, the paper's; docs/design.md)")
    parser.add_argument("--batch", type=int, default=4, help="sequences per forward (default: 4)")
    parser.add_argument("--length", type=int, default=256, help="prefill tokens per sequence (default: 256)")
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens before generating (default: 64)")
    parser.add_argument("--new-tokens", type=int, default=32, help="generated tokens per sequence (default: 32)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per variant (default: 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1; 0 = leave alone)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--no-xlora", action="store_true", help="skip PEFT's X-LoRA")
    parser.add_argument("--fast", action="store_true",
                        help="also time context-gated composed models on the fast decode loop against one LoRA on it")
    parser.add_argument("--work", help="folder for the built models and adapters (default: a temp folder)")
    args = parser.parse_args()

    import torch
    from peft import PeftModel, XLoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_train.compose import ComposedModel

    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="compose_speed-"))
    root.mkdir(parents=True, exist_ok=True)
    device = args.device
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    # On a CPU the clock is this process's CPU time: other jobs on a shared machine then slow every
    # variant without entering the measurement (with one torch thread, CPU time is the work done).
    # On CUDA it is wall time around synchronised calls.
    clock = time.perf_counter if device.startswith("cuda") or args.threads != 1 else time.process_time

    def timed(fn) -> float:
        sync()
        t0 = clock()
        fn()
        sync()
        return clock() - t0

    print(f"device {device}, {torch.get_num_threads()} thread(s), clock: "
          f"{'process CPU time' if clock is time.process_time else 'wall time'}; LoRA rank {args.rank} on {len(TARGETS)} "
          f"projections per block; prefill {args.batch} x {args.length} tokens, generate {args.batch} x "
          f"{args.new_tokens} new tokens after {args.prompt}; median of {args.repeats}\n")
    summary, fast_summary = [], []
    for config in args.configs:
        base = base_model(config, root)
        plain = AutoModelForCausalLM.from_pretrained(base).to(device).eval()
        vocab = plain.config.vocab_size
        params = sum(p.numel() for p in plain.parameters())
        gen = torch.Generator().manual_seed(0)
        prefill_ids = torch.randint(1, vocab - 64, (args.batch, args.length), generator=gen).to(device)
        prompt_ids = torch.randint(1, vocab - 64, (args.batch, args.prompt), generator=gen).to(device)
        adapters = make_adapters(base, max(args.ks), root, args.rank)
        one_lora = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapters[0]).to(device).eval()
        variants: dict[str, object] = {"base": plain, "one LoRA (PEFT)": one_lora}
        notes = {}
        for k in args.ks:
            composed = ComposedModel.build(base, adapters[:k], device=device)
            spread_gates(composed)
            shares = expert_shares(composed, prefill_ids)
            notes[k] = shares
            variants[f"composed top-1 K={k}"] = composed
            dense = ComposedModel.build(base, adapters[:k], device=device)
            spread_gates(dense)
            dense.mode = "dense"
            variants[f"dense every expert K={k}"] = dense
            if not args.no_xlora:
                xbase = AutoModelForCausalLM.from_pretrained(base)
                xbase.config.use_cache = False
                # PEFT's X-LoRA loads the adapters under the names "0".."K-1"; other names break its
                # scaling pass (KeyError in disable_adapter_layers), so they are named so here.
                xcfg = XLoraConfig(task_type="CAUSAL_LM", hidden_size=xbase.config.hidden_size,
                                   adapters={str(i): a for i, a in enumerate(adapters[:k])})
                variants[f"X-LoRA (PEFT) K={k}"] = get_peft_model(xbase, xcfg).to(device).eval()

        def prefill(model):
            return lambda: model(input_ids=prefill_ids, use_cache=False)

        def generate(model):
            kw = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                      pad_token_id=0, attention_mask=torch.ones_like(prompt_ids))
            if "X-LoRA" in name_of[id(model)]:
                kw["use_cache"] = False  # X-LoRA's scaling pass runs without a cache
            return lambda: model.generate(prompt_ids, **kw)

        name_of = {id(m): n for n, m in variants.items()}
        pre = {n: [] for n in variants}
        gen_s = {n: [] for n in variants}
        with torch.inference_mode():
            for name, model in variants.items():  # warm-up: first-call allocations out of the timings
                prefill(model)()
                generate(model)()
            for rep in range(args.repeats):
                for name, model in variants.items():
                    pre[name].append(timed(prefill(model)))
                    # X-LoRA generates without a KV cache (tens of times slower): two timed runs are plenty.
                    if "X-LoRA" not in name or rep < 2:
                        gen_s[name].append(timed(generate(model)))
        anchor_pre = statistics.median(pre["one LoRA (PEFT)"])
        anchor_gen = args.batch * args.new_tokens / statistics.median(gen_s["one LoRA (PEFT)"])
        print(f"== {config}: {params / 1e6:.1f}M parameters ({base})")
        print(f"{'variant':<26} {'prefill ms':>10} {'vs LoRA':>8} {'gen tok/s':>10} {'vs LoRA':>8}")
        for name in variants:
            p = statistics.median(pre[name])
            t = args.batch * args.new_tokens / statistics.median(gen_s[name])
            print(f"{name:<26} {p * 1e3:>10.1f} {p / anchor_pre:>7.2f}x {t:>10.1f} {anchor_gen / t:>7.2f}x")
            if name.startswith("composed"):
                summary.append((config, name, p / anchor_pre, anchor_gen / t))
        for k, shares in notes.items():
            print(f"  composed K={k}: share of tokens per slot (base first): "
                  + " ".join(f"{s:.2f}" for s in shares))
        print()
        if args.fast:
            fast_summary += fast_table(args, base, adapters, prefill_ids, prompt_ids, one_lora, timed, config)
    print("composed top-1 vs one LoRA (time ratios; goal <= 1.10 at K=4 on 100m):")
    for config, name, rp, rg in summary:
        print(f"  {config:<5} {name:<22} prefill {rp:.2f}x  generation {rg:.2f}x")
    if fast_summary:
        print("context-gated composed top-1 on the fast loop vs one LoRA on the fast loop (generation time ratios):")
        for config, name, r in fast_summary:
            print(f"  {config:<5} {name:<34} {r:.2f}x")


def fast_table(args, base, adapters, prefill_ids, prompt_ids, one_lora, timed, config) -> list[tuple[str, str, float]]:
    """Generation on the fast decode loop: one LoRA (anchor) against context-gated composed models (and the same
    composed models through ``generate``). Returns (config, variant, time ratio against the anchor) per composed
    fast-loop row; prints the table. Configs the loop does not take are reported and skipped."""
    import torch

    from trace_train.compose import ComposedModel
    from trace_train.tiny.fast_decode import FastDecoder, supported

    ok, why = supported(one_lora)
    if not ok or args.device != "cpu":
        print(f"== {config}: fast loop skipped ({why or 'the fast loop runs on the CPU'})\n")
        return []
    prompts = prompt_ids.tolist()
    n_tokens = args.batch * args.new_tokens
    # Every row runs to --new-tokens (no stop token), as min_new_tokens does for generate() above.
    loops = {"one LoRA (PEFT), fast loop": FastDecoder(one_lora, store_limit=0)}
    hf = {}
    for k in args.ks:
        composed = ComposedModel.build(base, adapters[:k], device=args.device, gate_input="context").eval()
        spread_gates(composed)
        composed.fit_context_centers(prefill_ids.tolist()[:2])
        loops[f"context gates K={k}, fast loop"] = FastDecoder(composed, store_limit=0)
        hf[f"context gates K={k}, generate"] = composed

    def run_fast(decoder):
        return lambda: decoder.generate(prompts, args.new_tokens, eos_ids=[])

    def run_hf(model):
        return lambda: model.generate(prompt_ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                      do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt_ids))

    runs = {n: run_fast(d) for n, d in loops.items()} | {n: run_hf(m) for n, m in hf.items()}
    times = {n: [] for n in runs}
    with torch.inference_mode():
        for fn in runs.values():
            fn()  # warm-up
        for _ in range(args.repeats):
            for name, fn in runs.items():
                times[name].append(timed(fn))
    anchor = statistics.median(times["one LoRA (PEFT), fast loop"])
    print(f"== {config}: generation, {args.batch} x {args.new_tokens} new tokens after {args.prompt} "
          "(anchor: one LoRA on the fast loop)")
    print(f"{'variant':<34} {'gen tok/s':>10} {'vs LoRA':>8}")
    out = []
    for name, ts in times.items():
        t = statistics.median(ts)
        print(f"{name:<34} {n_tokens / t:>10.1f} {t / anchor:>7.2f}x")
        if name.endswith("fast loop") and name.startswith("context"):
            out.append((config, name, t / anchor))
    print()
    return out


if __name__ == "__main__":
    main()
