"""Does a router switch when one conversation needs two adapters? A small real measurement on a fitted pair.

    python lab/mixed-routing/probe.py --out /tmp/mixed_probe        # ~2-4 min on one CPU thread

Two rank-8 LoRAs on the ``nano`` model, each fitted (60 full-batch AdamW steps) on one request family to give that
family's answer: ``status`` ("Is flight X on time today?" -> "The flight is on time.") and ``cancel`` ("Please
cancel reservation X now." -> "Your reservation is cancelled."). Each alone answers its own family and not the
other's (the other adapter's answer, or nothing readable), so the right route is known. The routers learn from
single-family conversations only (4 per family, labelled with their adapter), as the planted recipe's do.

Held-out conversations on unseen codes: *single* (one request) and *mixed* (a request of one family, the model's
answer, then a request of the other family). A request is handled when the reply to it holds its family's answer.
Every router plays them through :class:`trace_train.agents.HFAgent`: the token-level MoE with token gates and with
context gates (label pre-fit, then joint training), each also with one choice per message (segment routing);
per-episode routing over the token-gated MoE's gates; the authors' per-task routing (nearest trajectories);
PEFT's Arrow (top-1 and top-2); each adapter alone; the base. For the MoEs the script also reads which expert
wrote each assistant turn (:func:`trace_train.compose.turns.turn_routing`) and counts switches between the
requests of a mixed conversation.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SYSTEM = "You are an airline agent."
FAMILIES = {"status": ("Is flight {} on time today?", "The flight is on time."),
            "cancel": ("Please cancel reservation {} now.", "Your reservation is cancelled.")}
TRAIN_CODES = ["HAT001", "HAT017", "HAT142", "QX9P2L", "ZZ41KD", "MM0307"]
HELD_OUT = ["HAT555", "KQ77PL", "PX31TT", "HAT808", "LM4Q0Z", "HAT260"]


def conversation(family: str, code: str, answered: bool = True) -> list[dict]:
    question, answer = FAMILIES[family]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question.format(code)}]
    return messages + ([{"role": "assistant", "content": answer}] if answered else [])


def fit_adapter(base: str, tok, family: str, out: Path) -> str:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=8, lora_alpha=16,
                                                                                   target_modules=TARGETS))
    batch = []
    for code in TRAIN_CODES:
        prompt = tok.apply_chat_template(conversation(family, code, False), add_generation_prompt=True, tokenize=False)
        ids = tok(prompt + FAMILIES[family][1] + "<|im_end|>", add_special_tokens=False).input_ids
        batch.append((ids, len(tok(prompt, add_special_tokens=False).input_ids)))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(60):
        loss = 0.0
        for ids, n in batch:
            x = torch.tensor([ids])
            labels = x.clone()
            labels[0, :n] = -100
            loss = loss + model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(out))
    return str(out)


def play(agent, first: str, second: str | None, code: str) -> list[str]:
    """The agent's reply to the first request and, for a mixed conversation, to the second after its own reply."""
    messages = conversation(first, code, False)
    replies = [agent.act_batch([""], [{"messages": messages}])[0]]
    if second is not None:
        messages = messages + [{"role": "assistant", "content": _clean(replies[0])},
                               {"role": "user", "content": FAMILIES[second][0].format(code)}]
        replies.append(agent.act_batch([""], [{"messages": messages}])[0])
    return replies


def _clean(text: str) -> str:
    return text.split("<|im_end|>")[0].strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="work folder (model, adapters, composed folders, results.json)")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from trace_train.agents import HFAgent
    from trace_train.compose import ComposedModel, compose
    from trace_train.compose.turns import switch_summary, turn_routing
    from trace_train.tiny.build import build_model

    torch.set_num_threads(1)
    t0 = time.time()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    base = str(build_model("nano", out=root / "nano", env_ids=["trace/precondition_verification-v0"],
                           corpus_seeds=4).path)
    tok = AutoTokenizer.from_pretrained(base)
    adapters = {f: fit_adapter(base, tok, f, root / "adapters" / f) for f in FAMILIES}
    records = [{"env_id": f"fam/{f}-v0", "messages": conversation(f, code), "success": True, "reward": 1.0}
               for f in FAMILIES for code in TRAIN_CODES[:4]]
    data = root / "router_episodes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    envs = {f: [f"fam/{f}-v0"] for f in FAMILIES}
    train = {"prefit_steps": 300, "lr": 1e-2, "epochs": 3, "accumulate": 2, "label_from": "first_observation"}
    methods: dict[str, tuple[str, str | None]] = {"base": (base, None)}
    methods |= {f"adapter:{f}": (base, a) for f, a in adapters.items()}
    moes = {}
    for gate_input in ("token", "context", "request"):
        for routing in ("token", "segment"):
            name = f"moe:{gate_input} gates" + (", per message" if routing == "segment" else "")
            extra = {"baselines": ["per_episode"], "composers": ["per_task", "arrow"], "arrow_top_k": 1} \
                if (gate_input, routing) == ("token", "token") else {"baselines": []}
            res = compose(base, adapters, data, root / f"moe-{gate_input}-{routing}", adapter_envs=envs,
                          gate_input=gate_input, routing=routing, train=train, progress=False, **extra)
            m = json.loads(res.methods_json.read_text())
            methods[name] = (m["composed"]["model"], None)
            moes[name] = m["composed"]["model"]
            for key in ("per_episode", "per_task", "arrow"):
                if key in m:
                    methods[key + (" (top-1)" if key == "arrow" else "")] = (m[key]["model"], None)
    from trace_train.compose import write_arrow

    methods["arrow (top-2)"] = (str(write_arrow(base, adapters, root / "arrow-top2", top_k=2)), None)
    print(f"built in {time.time() - t0:.0f} s", flush=True)

    cases = [(f, None, c) for f in FAMILIES for c in HELD_OUT] + \
            [(a, b, c) for a in FAMILIES for b in FAMILIES if a != b for c in HELD_OUT]
    results = {}
    for name, (model, adapter) in methods.items():
        agent = HFAgent(model, adapter=adapter, max_new_tokens=12, decode="hf")
        single = mixed_first = mixed_second = both = 0
        turns = []
        for first, second, code in cases:
            replies = play(agent, first, second, code)
            ok = [FAMILIES[first][1] in replies[0]] + ([FAMILIES[second][1] in replies[1]] if second else [])
            if second is None:
                single += ok[0]
                continue
            mixed_first += ok[0]
            mixed_second += ok[1]
            both += all(ok)
            if name in moes:
                record = {"env_id": "mixed", "task": {"families": [first, second]},
                          "messages": conversation(first, code, False) + [
                              {"role": "assistant", "content": _clean(replies[0])},
                              {"role": "user", "content": FAMILIES[second][0].format(code)},
                              {"role": "assistant", "content": _clean(replies[1])}]}
                turns.append(turn_routing(agent.model, tok, record,
                                          [FAMILIES[first][0].format(code), FAMILIES[second][0].format(code)]))
        n_single, n_mixed = len(FAMILIES) * len(HELD_OUT), len(cases) - len(FAMILIES) * len(HELD_OUT)
        results[name] = {"single": single / n_single, "mixed_first": mixed_first / n_mixed,
                         "mixed_second": mixed_second / n_mixed, "mixed_both": both / n_mixed}
        if turns:
            results[name]["turns"] = switch_summary(turns, ComposedModel.slot_names(agent.model))
        print(name, json.dumps(results[name]), flush=True)
    (root / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"\n{len(HELD_OUT) * 2} single and {len(cases) - 2 * len(HELD_OUT)} mixed conversations (held-out codes)")
    print(f"{'method':<34} {'single':>7} {'mixed 1st':>9} {'mixed 2nd':>9} {'both':>6}  switched / pairs")
    for name, r in results.items():
        sw = f"  {r['turns']['switched']} / {r['turns']['pairs']}" if "turns" in r else ""
        print(f"{name:<34} {r['single']:>7.2f} {r['mixed_first']:>9.2f} {r['mixed_second']:>9.2f} "
              f"{r['mixed_both']:>6.2f}{sw}")
    for name, r in results.items():
        if "turns" in r:
            shares = "; ".join(f"{f}: " + " ".join(f"{s} {v:.2f}" for s, v in sh.items())
                               for f, sh in r["turns"]["shares_by_family"].items())
            print(f"  {name}: assistant-token shares by the request's family: {shares}")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
