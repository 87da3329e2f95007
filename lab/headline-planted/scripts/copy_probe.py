"""Can a base copy an id into a tool call when the call itself is given? A teacher-forced probe.

    python lab/headline-planted/scripts/copy_probe.py MODEL runs/headline/rollouts/trajectories.jsonl \
        --tool get_reservation_details --arg reservation_id --pattern 'reservation ([A-Z0-9]{6})'
    python lab/headline-planted/scripts/copy_probe.py MODEL TRAJ.jsonl --tool get_flight_status --arg flight_number \
        --pattern 'flight (HAT[0-9]{3})'
    python lab/headline-planted/scripts/copy_probe.py MODEL TRAJ.jsonl --after get_reservation_details \
        --pattern 'reservation id is ([A-Z0-9]{6})' --message 'Reservation '    # across the record just read

For each episode in which a user message before the cut matches ``--pattern`` (the first match's first group is
the id), the conversation is cut after the ``--after`` tool's first result (default ``get_user_details``: the point
where the agent must make the call), the assistant turn is started with the call to ``--tool`` up to the opening
quote of ``--arg`` (or, with ``--message``, with that text: a message that must state the id next, such as the
confirmation before a write), and the model decodes greedily from there. A copy is right when the decoded
argument equals the id (with ``--message``: when the decoded text starts with it).

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


def forced_prompts(records: list[dict], tokenizer, tool: str | None, arg: str | None, pattern: str, after: str,
                   message: str | None = None):
    """``(id, family, prompt)`` for each record whose user named an id before the cut (see the module docstring)."""
    rx = re.compile(pattern)
    for record in records:
        cut, found = [], None
        for m in record["messages"]:
            cut.append(m)
            if m["role"] == "user" and found is None:
                found = rx.search(m.get("content") or "")
            if m["role"] == "tool" and m.get("name") == after:
                break
        else:
            continue  # the episode never reached that tool's result
        if not found:
            continue
        prompt = tokenizer.apply_chat_template(cut, tools=record.get("tools") or None, add_generation_prompt=True,
                                               tokenize=False)
        prompt += message if message is not None else '<tool_call>\n{"name": "%s", "arguments": {"%s": "' % (tool, arg)
        family = record.get("scenario") or (record.get("task") or {}).get("scenario") or "?"
        yield found.group(1), family, prompt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="the base model folder")
    p.add_argument("trajectories", help="a trajectory JSONL file (e.g. a run's rollouts/trajectories.jsonl)")
    p.add_argument("--tool", help="the tool whose call is forced (required without --message)")
    p.add_argument("--arg", help="the argument whose value the model must copy (required without --message)")
    p.add_argument("--message", help="start a message with this text instead of a call; the id must come next")
    p.add_argument("--pattern", required=True, help="regex on the user's messages before the cut; group 1 is the id")
    p.add_argument("--after", default="get_user_details", help="cut the conversation after this tool's result")
    p.add_argument("--adapter", help="a LoRA adapter folder to apply to the model (e.g. a run's SFT warm-up)")
    p.add_argument("--limit", type=int, default=200, help="episodes at most")
    p.add_argument("--show", type=int, default=5, help="print this many decoded arguments")
    args = p.parse_args(argv)
    if args.message is None and not (args.tool and args.arg):
        p.error("--tool and --arg are required without --message")

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
                                  args.pattern, args.after, args.message))[:args.limit]
    if not prompts:
        raise SystemExit(f"copy_probe: no episode names an id matching {args.pattern!r} in a user message before "
                         f"{args.after!r}'s result")
    for i, (wanted, family, prompt) in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=4 + len(wanted), do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id)
        decoded = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
        copied = decoded[:len(wanted)] if args.message is not None else decoded.split('"')[0]
        right[family] += copied == wanted
        total[family] += 1
        if i < args.show:
            print(f"{wanted} -> {copied!r}")
    print(f"\ncopied {sum(right.values())}/{sum(total.values())} {args.arg or 'ids'} right; by family: "
          + ", ".join(f"{f} {right[f]}/{n}" for f, n in sorted(total.items())))
    print(json.dumps({"right": sum(right.values()), "episodes": sum(total.values()),
                      "by_family": {f: [right[f], n] for f, n in sorted(total.items())}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
