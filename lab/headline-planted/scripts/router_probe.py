"""Can a linear gate on the composer's context features tell the target's families apart?

An experiment of lab/headline-planted/history.md ("The router did not learn its own data"), kept so that it can be repeated:

    python lab/headline-planted/scripts/router_probe.py RUN            # a planted run with a compose stage
    python lab/headline-planted/scripts/router_probe.py RUN --steps 80 --batch 2   # the composer's schedule

It reads what a context gate reads (each block's input, RMS-normalised, and the causal running mean of it,
centred on the router data's mean; computed here with the base model) on the run's router data (the oracle
episodes in ``RUN/compose/data``, labelled with their env's adapter) and on the base's evaluation episodes of the
target (``RUN/eval/base``: a cancellation should go to the precondition adapter, a flight-status request to the
status one). A gate of the composer's shape (K + 1 slots, the base slot's bias at 5) is fitted with AdamW on the
label loss alone, from the end of the first user message on, then tested on the assistant tokens of the target.
``--batch 0`` (the default) fits on every router episode at once; ``--batch 2`` takes 2 episodes a step, as the
composer's joint training does. It prints, per block, the share of each family's assistant tokens per slot.

Measured on the read-back run (lab/headline-planted/history.md): full-batch, 300 steps, 86-90% right on both families;
80 steps of 2 episodes, block 0 splits the flight-status tokens 51/49 between the two adapters.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trace_train.compose.data import encode
from trace_train.compose.model import _rms as rms  # the gates' own normalisation

FAMILY_SLOT = {"cancel": 1, "flight_status": 2}  # slots as the planted run's compose stage orders the adapters
ROUTER_DATA = ("precondition_verification", "structured_data_reasoning")


def features(model, tokenizer, record: dict, slot: int, block: int):
    """(block input, running mean) at every token of one episode, and the encoded episode."""
    ep = encode(tokenizer, record, slot)
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([ep.ids]), output_hidden_states=True).hidden_states[block][0]
    x = rms(hidden.float())
    mean = torch.cumsum(x, 0) / torch.arange(1, len(x) + 1).unsqueeze(1)
    return x, mean, ep


def read_jsonl(path: Path, limit: int | None = None, family: str | None = None) -> list[dict]:
    rows = [json.loads(line) for line in path.open()]
    if family is not None:
        rows = [r for r in rows if r.get("scenario") == family]
    return rows[:limit] if limit else rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a planted run directory (compose and evaluate done)")
    ap.add_argument("--steps", type=int, default=300, help="optimizer steps (full-batch) or epochs x episodes / batch")
    ap.add_argument("--batch", type=int, default=0, help="episodes per step; 0: all at once")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--test-episodes", type=int, default=20, help="base episodes of each target family")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    base = json.loads((args.run / "stages.json").read_text())["stages"]["base"]["summary"]["model_path"]
    tokenizer, model = AutoTokenizer.from_pretrained(base), AutoModelForCausalLM.from_pretrained(base).eval()
    train = [(r, slot) for slot, name in enumerate(ROUTER_DATA, start=1)
             for r in read_jsonl(args.run / "compose" / "data" / f"{name}.jsonl")]
    test = [(r, slot) for family, slot in FAMILY_SLOT.items()
            for r in read_jsonl(args.run / "eval" / "base" / "trajectories.jsonl", args.test_episodes, family)]
    for block in range(model.config.num_hidden_layers):
        tr = [features(model, tokenizer, r, s, block) for r, s in train]
        center = torch.cat([m for _, m, _ in tr]).mean(0)
        gate = torch.nn.Linear(2 * tr[0][0].shape[1], len(ROUTER_DATA) + 1)
        with torch.no_grad():
            gate.weight.mul_(0.01)
            gate.bias.zero_()
            gate.bias[0] = 5.0
        opt = torch.optim.AdamW(gate.parameters(), lr=args.lr, weight_decay=0.0)

        def loss_of(items):
            total = 0.0
            for x, m, ep in items:
                logits = gate(torch.cat([x, rms(m - center)], -1))[ep.first_observation:]
                total = total + torch.nn.functional.cross_entropy(logits, torch.full((len(logits),), ep.slot))
            return total / len(items)

        rng = random.Random(0)
        order = list(range(len(tr)))
        for step in range(args.steps):
            if args.batch:
                if step % (len(order) // args.batch) == 0:
                    rng.shuffle(order)
                k = step % (len(order) // args.batch)
                items = [tr[i] for i in order[k * args.batch:(k + 1) * args.batch]]
            else:
                items = tr
            loss = loss_of(items)
            opt.zero_grad()
            loss.backward()
            opt.step()
        shares: dict[str, list[torch.Tensor]] = {}
        with torch.no_grad():
            for (record, slot) in test:
                x, m, ep = features(model, tokenizer, record, slot, block)
                picks = gate(torch.cat([x, rms(m - center)], -1))[torch.tensor(ep.targets)].argmax(-1)
                shares.setdefault(record["scenario"], []).append(picks)
        table = {family: [round(float((torch.cat(p) == s).float().mean()), 3) for s in range(len(ROUTER_DATA) + 1)]
                 for family, p in shares.items()}
        print(f"block {block}: share of assistant tokens per slot (base, {', '.join(ROUTER_DATA)}): {table}",
              flush=True)


if __name__ == "__main__":
    main()
