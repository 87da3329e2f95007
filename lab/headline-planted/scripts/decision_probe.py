"""Does the model's next turn depend on what it just read? A teacher-forced probe of one decision.

    trace rollout --env gen/precondition_verification_tau_airline-v0 --registry runs/X/workspace --agent oracle \
        --seeds 100:180 --env-kwarg 'size={"ask_details_prob": 1.0, "cancel_grounds": ["business"]}' \
        --out oracle.jsonl
    python lab/headline-planted/scripts/decision_probe.py MODEL oracle.jsonl --after get_reservation_details \
        --adapter runs/X/train/precondition_verification/run/sft_warmup/adapter

Each episode is cut after the ``--after`` tool's first result (the point where the decision is taken: after
the reservation record, go ahead or check further and refuse), and the model, given the oracle's own history,
is asked for the probability that its next turn opens with a tool call (``<tool_call>``). The episodes are
grouped by a label of their task (``--label``, default ``decision``: ``act`` or ``refuse``). A model that has
learnt the decision gives the groups different probabilities, in the direction the oracle's own next turns
go; one that gives every group the same probability, whatever the record says, has learnt the decision's
frequency and not the decision (its greedy turn is then the same in both groups).

Why: an SFT loss averaged over an episode's tokens barely sees a decision taken once per episode among
hundreds of copied tokens, and free-play success mixes the decision with everything else the agent must get
right. This isolates the decision's one token.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

CALL = "<tool_call>"


def decision_prompts(records: list[dict], tokenizer, after: str, label: str):
    """``(label value, prompt, oracle opens with a call)`` for each record that reaches ``after``'s result
    and has an assistant turn after it; the prompt is the generation prompt of that turn."""
    from trace_train.tiny.sft_data import render_prompt

    for record in records:
        messages = record["messages"]
        cut = next((i for i, m in enumerate(messages) if m["role"] == "tool" and m.get("name") == after), None)
        if cut is None:
            continue
        nxt = next((m for m in messages[cut + 1:] if m["role"] == "assistant"), None)
        if nxt is None:
            continue
        value = (record.get("task") or {}).get(label)
        yield str(value), render_prompt(tokenizer, messages[:cut + 1], record.get("tools")), bool(nxt.get("tool_calls"))


def summarize(rows: list[tuple[str, float, bool]]) -> dict:
    """Per label value: episodes, the oracle's share of calls, the model's mean/min/max P(call), and how often
    the model's more likely opening (call or message) is the oracle's."""
    groups: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for value, p_call, oracle_call in rows:
        groups[value].append((p_call, oracle_call))
    out = {}
    for value, items in sorted(groups.items()):
        ps = [p for p, _ in items]
        out[value] = {"episodes": len(items), "oracle_calls": sum(c for _, c in items) / len(items),
                      "p_call_mean": sum(ps) / len(ps), "p_call_min": min(ps), "p_call_max": max(ps),
                      "argmax_agrees": sum((p > 0.5) == c for p, c in items) / len(items)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the base model folder")
    p.add_argument("trajectories", help="a trajectory JSONL file, e.g. an env's oracle episodes (`trace rollout`)")
    p.add_argument("--after", required=True, help="cut each episode after this tool's first result")
    p.add_argument("--label", default="decision", help="the task field the episodes are grouped by")
    p.add_argument("--adapter", help="a LoRA adapter folder to apply to the model (e.g. a run's SFT warm-up)")
    p.add_argument("--limit", type=int, default=200, help="episodes at most")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.rollouts import read_trajectories

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    call_id = tokenizer.convert_tokens_to_ids(CALL)
    if call_id is None or call_id == tokenizer.unk_token_id:
        raise SystemExit(f"decision_probe: {CALL} is not one token of this tokenizer")
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload().eval()
    prompts = list(decision_prompts(read_trajectories(args.trajectories), tokenizer, args.after,
                                    args.label))[:args.limit]
    if not prompts:
        raise SystemExit(f"decision_probe: no episode reaches {args.after!r}'s result with a turn after it")
    rows = []
    for value, prompt, oracle_call in prompts:
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            p_call = float(model(input_ids=ids).logits[0, -1].float().softmax(-1)[call_id])
        rows.append((value, p_call, oracle_call))
    summary = summarize(rows)
    for value, s in summary.items():
        print(f"{args.label}={value}: {s['episodes']} episodes, oracle opens with a call {s['oracle_calls']:.0%}; "
              f"P(call) {s['p_call_mean']:.3f} (min {s['p_call_min']:.3f}, max {s['p_call_max']:.3f}); "
              f"the likelier opening is the oracle's {s['argmax_agrees']:.0%}")
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
