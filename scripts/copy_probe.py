"""Can a base copy an id into a tool call when the call itself is given? A teacher-forced probe.

    python scripts/copy_probe.py MODEL runs/headline/rollouts/trajectories.jsonl \
        --tool get_reservation_details --arg reservation_id --pattern 'reservation ([A-Z0-9]{6})'
    python scripts/copy_probe.py MODEL TRAJ.jsonl --tool get_flight_status --arg flight_number \
        --pattern 'flight (HAT[0-9]{3})'

For each episode whose first user message matches ``--pattern`` (its first group is the id), the conversation
is cut after the ``--after`` tool's result (default ``get_user_details``: the point where the agent must make
the call), the assistant turn is started with the call to ``--tool`` up to the opening quote of ``--arg``, and
the model decodes greedily from there. A copy is right when the decoded argument equals the id.

Why: an agent that never makes a call with the right id earns nothing from it, so no GRPO group on such a task
has an advantage, and the adapter stays the base (the headline run's tool_calling_precision adapter: every group
flat). This separates "the base does not choose the call" (learnable by GRPO when the copy works) from "the base
cannot copy the id" (nothing to sample): a base for a capability should pass the probe on that capability's ids.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter


def forced_prompts(records: list[dict], tokenizer, tool: str, arg: str, pattern: str, after: str):
    """``(id, family, prompt)`` for each record whose first user message names an id (see the module docstring)."""
    rx = re.compile(pattern)
    for record in records:
        first = next((m.get("content") or "" for m in record["messages"] if m["role"] == "user"), "")
        found = rx.search(first)
        if not found:
            continue
        cut = []
        for message in record["messages"]:
            cut.append(message)
            if message["role"] == "tool" and message.get("name") == after:
                break
        else:
            continue  # the episode never reached that tool's result
        prompt = tokenizer.apply_chat_template(cut, tools=record.get("tools") or None, add_generation_prompt=True,
                                               tokenize=False)
        prompt += '<tool_call>\n{"name": "%s", "arguments": {"%s": "' % (tool, arg)
        family = record.get("scenario") or (record.get("task") or {}).get("scenario") or "?"
        yield found.group(1), family, prompt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the base model folder")
    p.add_argument("trajectories", help="a trajectory JSONL file (e.g. a run's rollouts/trajectories.jsonl)")
    p.add_argument("--tool", required=True, help="the tool whose call is forced")
    p.add_argument("--arg", required=True, help="the argument whose value the model must copy")
    p.add_argument("--pattern", required=True, help="regex on the first user message; group 1 is the id")
    p.add_argument("--after", default="get_user_details", help="cut the conversation after this tool's result")
    p.add_argument("--adapter", help="a LoRA adapter folder to apply to the model (e.g. a run's SFT warm-up)")
    p.add_argument("--limit", type=int, default=200, help="episodes at most")
    p.add_argument("--show", type=int, default=5, help="print this many decoded arguments")
    args = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.rollouts import read_trajectories

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter).merge_and_unload().eval()
    right, total = Counter(), Counter()
    prompts = list(forced_prompts(read_trajectories(args.trajectories), tokenizer, args.tool, args.arg,
                                  args.pattern, args.after))[:args.limit]
    if not prompts:
        raise SystemExit(f"copy_probe: no episode's first user message matches {args.pattern!r} and reaches "
                         f"{args.after!r}'s result")
    for i, (wanted, family, prompt) in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=4 + len(wanted), do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        decoded = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
        copied = decoded.split('"')[0]
        right[family] += copied == wanted
        total[family] += 1
        if i < args.show:
            print(f"{wanted} -> {copied!r}")
    print(f"\ncopied {sum(right.values())}/{sum(total.values())} {args.arg} values right; by family: "
          + ", ".join(f"{f} {right[f]}/{n}" for f, n in sorted(total.items())))
    print(json.dumps({"right": sum(right.values()), "episodes": sum(total.values()),
                      "by_family": {f: [right[f], n] for f, n in sorted(total.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
