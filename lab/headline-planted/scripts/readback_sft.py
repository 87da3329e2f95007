"""Is the planted cancellation decision learnable when the agent reads the cabin back right before deciding?

An experiment of lab/headline-planted/history.md ("The decision is not read"), kept so that it can be repeated:

    python lab/headline-planted/scripts/readback_sft.py --registry RUN/workspace --model BASE --out rb
    python lab/headline-planted/scripts/readback_sft.py --registry RUN/workspace --model BASE --out ctl --no-read-back

It plays the oracle of the planted precondition env (``gen/precondition_verification_tau_airline-v0`` in a
planted run's workspace) and rewrites each episode so that the decision is the first message after the
reservation record: an allowed cancellation keeps its confirmation, a forbidden one goes straight to its refusal
(the flight-status reads before it are dropped: with ``cancel_grounds: [business]`` they cannot change it). With
the read-back, that message opens with the cabin as the record writes it and the decision right after it
(``"cabin": "economy" does not allow a cancellation. I'm sorry, ...``); without it (the control) the message is
the oracle's own. A LoRA (r 16 on attention, as the train stage's) is fitted by SFT on the training seeds'
rewritten episodes, and the model, given each validation episode's history up to the record, writes the
decision message greedily; it is right when it takes the oracle's decision (and, with the read-back, copies the
cabin right).

It judges the read-back sentence alone (up to "a cancellation."), not the message after it, and its messages are
the first form of the read-back. In the recipe that form failed after the sentence (the allowed message went on
as a refusal); the airline target's ``size.read_back`` now writes messages that differ at every token from the
decision word on. The experiment that judges whole episodes is two commands (lab/headline-planted/history.md, "The read-back in
the recipe"): ``trace train --sft`` on the run's precondition env, then ``trace rollout --adapter`` on its
validation seeds.
"""

from __future__ import annotations

import argparse
import json
import random
import time
import warnings

ENV = "gen/precondition_verification_tau_airline-v0"
KWARGS = {"size": {"ask_details_prob": 1.0, "cancel_grounds": ["business"]}, "prompt": "compact"}
ALLOW, DENY = " allows a cancellation. ", " does not allow a cancellation. "


def rewrite(record: dict, read_back: bool) -> dict | None:
    """The episode with its decision as the first message after the reservation record (see the docstring)."""
    m = record["messages"]
    k = next((i for i, x in enumerate(m) if x["role"] == "tool" and x.get("name") == "get_reservation_details"), None)
    if k is None:
        return None
    act = record["task"]["decision"] == "act"
    j = next((i for i in range(k + 1, len(m)) if m[i]["role"] == "assistant" and (act or not m[i].get("tool_calls"))),
             None)
    if j is None or m[j].get("tool_calls"):
        return None  # an allowed cancellation whose next turn is a call: not this family's decision
    cabin = json.loads(m[k]["content"]).get("cabin")
    message = dict(m[j])
    if read_back:
        message["content"] = f'"cabin": "{cabin}"' + (ALLOW if act else DENY) + message["content"]
    return {**record, "messages": m[:k + 1] + [message] + m[j + 1:], "cut": k, "decision_text": message["content"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--registry", required=True, help="the planted run's workspace (holds the generated env)")
    p.add_argument("--model", required=True, help="the planted base model folder")
    p.add_argument("--out", required=True, help="where the LoRA is saved")
    p.add_argument("--no-read-back", action="store_true", help="the control: the oracle's own decision message")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--train", type=int, default=600, help="training episodes (seeds from 1,000,000)")
    args = p.parse_args()

    import gymnasium as gym
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trace_envs
    from trace_envs import OracleAgent
    from trace_train.tiny.sft_data import render_prompt, shared_prefix_length, sft_rows
    from trace_train.tiny.sft_forward import sft_loss

    torch.set_num_threads(1)
    trace_envs.load_registry(args.registry)
    env = gym.make(ENV, **KWARGS)

    def episodes(seeds):
        out = []
        for seed in seeds:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                record = rewrite(trace_envs.rollout(env, OracleAgent(), seed=seed), not args.no_read_back)
            if record:
                out.append(record)
        return out

    train, val = episodes(range(1_000_000, 1_000_000 + args.train)), episodes(range(100, 180))
    env.close()
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)

    def probe(tag: str) -> None:
        model.eval()
        right = {"act": [0, 0], "refuse": [0, 0]}
        with torch.no_grad():
            for r in val:
                ids = tok(render_prompt(tok, r["messages"][:r["cut"] + 1], r.get("tools")), return_tensors="pt",
                          add_special_tokens=False).input_ids
                g = model.generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=tok.pad_token_id or 0)
                said = tok.decode(g[0, ids.shape[1]:], skip_special_tokens=False)
                d = r["task"]["decision"]
                if args.no_read_back:  # the oracle's messages: "... can be cancelled" / "I'm sorry, ... cannot"
                    ok = said.startswith("Reservation") if d == "act" else said.startswith("I'm sorry")
                else:  # the read-back sentence: the cabin copied right, then the decision
                    ok = said.startswith(r["decision_text"].split(". ")[0] + ".")
                right[d][0] += ok
                right[d][1] += 1
        print(tag, {d: f"{a}/{n}" for d, (a, n) in right.items()}, flush=True)

    probe("base")
    peft = get_peft_model(model, LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0,
                                            target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    rows, _, _ = sft_rows(tok, train, 8192)
    prefix = shared_prefix_length(rows)
    optim = torch.optim.AdamW([w for w in peft.parameters() if w.requires_grad], lr=1e-3, weight_decay=0.0)
    rng, order, t0 = random.Random(0), [], time.time()
    model.train()
    for step in range(args.steps):
        batch = []
        for _ in range(4):
            if not order:
                order = list(range(len(rows)))
                rng.shuffle(order)
            batch.append(rows[order.pop()])
        for group in optim.param_groups:
            group["lr"] = 1e-3 * min(1.0, (step + 1) / 10)
        loss = sft_loss(model, batch, tok.pad_token_id, prefix)  # the LoRA is injected into the base's modules
        optim.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(peft.parameters(), 1.0)
        optim.step()
        if step % 50 == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    probe(f"after {args.steps} steps")
    peft.save_pretrained(args.out)


if __name__ == "__main__":
    main()
