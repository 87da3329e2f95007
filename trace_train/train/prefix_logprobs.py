"""Per-token log-probabilities of a GRPO batch with the shared prefix encoded once (``loss_forward: shared_prefix``).

TRL's GRPO loss runs the policy over every episode of the batch as one padded ``[B, prompt + completion]``
tensor. TRACE's episodes of a step all start with the same ~1.8k tokens (the env's policy and tool
schemas; a group's members share their whole first prompt) and differ in length by hundreds of tokens,
so most of that forward (and of its backward) recomputes one prefix B times and attends over padding.
:func:`shared_prefix_logprobs` computes the same numbers — the log-probability and entropy of each
completion token under ``softmax(logits / temperature)`` — by encoding the common prefix once (with
gradients: the LoRA shapes its keys and values too) and then each episode's own tokens, at their own
length, over the prefix's keys and values. Gradients flow through both, so the loss and its gradient are
TRL's (checked against TRL's own forward in ``tests/test_fast_decode.py``).

It uses the model's own modules through ``transformers``' cache interface, so it takes any causal LM whose
forward accepts a cache; :class:`trace_train.train.grpo` uses it where the fast decode path applies.
"""

from __future__ import annotations

import inspect
from typing import Any


def _backbone_and_head(model: Any):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.base_model, base.get_output_embeddings()


def shared_prefix_logprobs(model: Any, input_ids: Any, attention_mask: Any, logits_to_keep: int,
                           temperature: float = 1.0, compute_entropy: bool = False) -> tuple[Any, Any]:
    """(log-probs ``[B, logits_to_keep]``, entropies or None) of the completion tokens, as TRL's GRPO computes them.

    Args:
        model: the policy (a PEFT model or a transformers causal LM).
        input_ids: ``[B, P + C]``: prompts left-padded to P, completions right-padded to C (TRL's layout).
        attention_mask: ``[B, P + C]``, 1 on real tokens.
        logits_to_keep: C, the completion width.
        temperature: the logits are divided by it (TRL's ``temperature``).
        compute_entropy: also return each position's entropy.

    Positions outside a row's completion are 0 in both outputs (as in TRL's).
    """
    import torch
    from transformers import DynamicCache

    backbone, head = _backbone_and_head(model)
    # transformers 5.x renamed `past_key_values` to `cache`; an unknown keyword would be silently ignored
    cache_kwarg = "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"
    b, width = input_ids.shape
    c_width = logits_to_keep
    p_width = width - c_width
    prompt_len = attention_mask[:, :p_width].sum(dim=1).tolist()
    comp_len = attention_mask[:, p_width:].sum(dim=1).tolist()
    rows = [input_ids[i, p_width - prompt_len[i]:p_width + comp_len[i]] for i in range(b)]
    # The shared prefix stops before every row's last prompt token: that token's hidden state predicts the
    # first completion token, so it belongs to the row's own pass.
    shared = min(prompt_len) - 1
    for r in rows[1:]:
        n = min(shared, int(r.numel()))
        diff = (rows[0][:n] != r[:n]).nonzero()
        shared = n if diff.numel() == 0 else int(diff[0, 0])
    shared = max(shared, 0)
    prefix_kv = None
    if shared:
        out = backbone(input_ids=rows[0][None, :shared], use_cache=True)
        cache = getattr(out, "cache", None)
        if cache is None:  # transformers before the `cache` rename
            cache = out.past_key_values
        prefix_kv = [(layer.keys, layer.values) for layer in cache.layers]
    logps = input_ids.new_zeros((b, c_width), dtype=torch.float32)
    entropies = input_ids.new_zeros((b, c_width), dtype=torch.float32) if compute_entropy else None
    logp_rows, ent_rows = [], []
    for i, row in enumerate(rows):
        n_comp = comp_len[i]
        if n_comp == 0:
            logp_rows.append(None)
            ent_rows.append(None)
            continue
        own = row[shared:]
        kwargs: dict[str, Any] = {"use_cache": prefix_kv is not None}
        if prefix_kv is not None:
            cache = DynamicCache()
            for li, (k, v) in enumerate(prefix_kv):
                cache.update(k, v, li)
            kwargs[cache_kwarg] = cache
            kwargs["position_ids"] = torch.arange(shared, shared + own.numel(), device=own.device)[None]
        hidden = backbone(input_ids=own[None], **kwargs).last_hidden_state[0]
        # hidden state j predicts own token j + 1; the completion starts at own index prompt_len - shared
        first = prompt_len[i] - shared - 1
        logits = head(hidden[first:first + n_comp]).float() / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        targets = own[first + 1:first + 1 + n_comp]
        logp_rows.append(logp_all.gather(1, targets[:, None])[:, 0])
        ent_rows.append(-(logp_all.exp() * logp_all).sum(-1) if compute_entropy else None)
    # Assemble without in-place writes into a tensor autograd tracks.
    logps = torch.stack([torch.cat([lp, logps.new_zeros(c_width - lp.numel())]) if lp is not None
                         else logps.new_zeros(c_width) for lp in logp_rows])
    if compute_entropy:
        entropies = torch.stack([torch.cat([e, entropies.new_zeros(c_width - e.numel())]) if e is not None
                                 else entropies.new_zeros(c_width) for e in ent_rows])
    return logps, entropies
