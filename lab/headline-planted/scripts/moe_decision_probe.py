"""Which routing decides a MoE's flight-status answer? A teacher-forced, causal probe.

    python lab/headline-planted/scripts/moe_decision_probe.py runs/headline-s1/compose/moe \
        runs/headline-s1/eval/trace_moe/trajectories.jsonl

The airline target's answer states a status in a phrase that opens with its verb ("has landed", "was cancelled",
"is delayed"): once the verb is written, little is left to decide. For each flight-status episode whose status
call returned a status of today, the MoE's own conversation is cut before that verb and the MoE predicts it
again, with the position that predicts the verb routed in each of these ways (every other position as the gates
chose):

* ``gated``: as the gates chose (reproduces the episode);
* ``adapter at weight 1``: to the adapter, adding its whole update (as the adapter alone would);
* ``adapter at the gate's p``: to the adapter, scaled by the gate's probability for it (what top-1 multiplicative
  gating adds when it picks the adapter there);
* ``base``: to the base.

A verb that turns right at weight 1 and stays wrong at the gate's p was lost to the gating weight, not to the
choice of slot. The first adapter (slot 1) is probed; ``--slot`` picks another. The probe replaces
:meth:`trace_train.compose.model.BlockRouter.route` for its own forwards (it rebuilds the dispatch from the
gates' recorded logits), so it reads a composed folder as the evaluation loads it.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_answers import _scenario, returned_status  # noqa: E402

#: The verb that opens each status phrase of the airline target's answers (``STATUS_WORDS``).
VERB_OF = {"landed": "has", "cancelled": "was", "delayed": "is", "flying": "is", "on time": "is", "available": "is"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("moe", help="a composed folder (a run's compose/moe)")
    p.add_argument("trajectories", help="the MoE's own episodes (a run's eval/trace_moe/trajectories.jsonl)")
    p.add_argument("--slot", type=int, default=1, help="the adapter slot to route the decision to (default: 1)")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoTokenizer

    from trace_train.compose import ComposedModel
    from trace_train.compose import model as composed_model
    from trace_train.compose.data import encode
    from trace_train.rollouts import read_trajectories

    torch.set_num_threads(1)
    model, tokenizer = ComposedModel.from_pretrained(args.moe), AutoTokenizer.from_pretrained(args.moe)
    if not 1 <= args.slot <= model.num_experts:
        raise SystemExit(f"moe_decision_probe: --slot must be in 1..{model.num_experts}")
    verbs = {tokenizer(v, add_special_tokens=False)["input_ids"][0]: v for v in ("has", "was", "is")}
    override: dict = {}
    gated_route = composed_model.BlockRouter.route

    def route(self, hidden, cache=None):
        gated_route(self, hidden, cache)
        if not override:
            return
        n = hidden.shape[0] * hidden.shape[1]
        probs = torch.softmax(self.logits.float(), dim=-1).reshape(n, -1)  # kept: the probe records logits
        weights, slots = probs.topk(self.owner.top_k, dim=-1)
        at, slot = override["position"], override["slot"]
        slots[at, 0] = slot
        weights[at, 0] = 1.0 if override["weight"] == "one" else probs[at, slot]
        self.dispatch = composed_model._dispatch(slots, weights.to(hidden.dtype), self.owner.num_experts,
                                                 self.owner.small_step_tokens)

    ways = {"gated": None, "adapter at weight 1": (args.slot, "one"), "adapter at the gate's p": (args.slot, "p"),
            "base": (0, "one")}
    right, total = Counter(), Counter()
    composed_model.BlockRouter.route = route
    try:
        for record in read_trajectories(args.trajectories):
            truth = returned_status(record) if _scenario(record) == "flight_status" else None
            if truth is None:
                continue
            ep = encode(tokenizer, record, None)
            answer = [i for i, (role, t) in enumerate(zip(ep.roles, ep.targets)) if role == "assistant" and t]
            said = [i for i in answer if ep.ids[i] in verbs]
            if not said or said[-1] < 1:
                continue
            at = said[-1]
            outcome = "right" if verbs[ep.ids[at]] == VERB_OF[truth] else "wrong"
            total[outcome] += 1
            ids = torch.tensor([ep.ids[:at]])
            for way, how in ways.items():
                override.clear()
                if how is not None:
                    override.update(position=at - 1, slot=how[0], weight=how[1])
                with torch.no_grad(), model.recording(logits=True, choices=False):
                    logits = model(input_ids=ids, use_cache=False).logits[0, -1]
                verb = max(verbs, key=lambda t: float(logits[t]))
                right[(outcome, way)] += verbs[verb] == VERB_OF[truth]
    finally:
        composed_model.BlockRouter.route = gated_route
    for outcome in ("right", "wrong"):
        print(f"verbs the MoE wrote {outcome} ({total[outcome]}): right when the deciding position is routed "
              + ", ".join(f"{way}: {right[(outcome, way)]}" for way in ways))
    return 0


if __name__ == "__main__":
    sys.exit(main())
