"""The fast SFT forward of the tiny model: the full forward's loss and gradients at a fraction of its work.

:func:`sft_loss` is what every warm-up step calls. Three savings, each exact (the same loss and gradients as
the plain forward to float rounding; ``tests/test_models.py`` and ``tests/test_copy_circuit.py`` compare them):

* the prompt prefix every row of a batch shares (policy and tool schemas, thousands of tokens with a τ²
  policy) is encoded once per batch and its keys/values are shared by the rows; gradients flow through the
  shared cache;
* the last decoder layer and the LM head run only where a target token is predicted
  (:func:`_last_layer_at_targets`; every position's keys and values are still computed), for plain Qwen3
  decoders (:func:`_targets_only_supported`);
* the layers before the last run with banded attention (:func:`_local_decoder_layer`) when they are the copy
  circuit's previous-token layer held fixed (:mod:`trace_train.tiny.copy_circuit`), whose attention is local
  by construction: :func:`local_attention_mass` checks that on a training sequence first.

Torch and transformers are imported inside the functions.
"""

from __future__ import annotations

from typing import Any, Sequence


def _rotate(x, cos, sin):
    """Rotary position embedding as in Qwen3/Llama (halves rotated); ``cos``/``sin`` are [B, T, head_dim]."""
    import torch

    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)


def _project(attn, x, which: str, cos=None, sin=None):
    """Qwen3 attention ``attn``'s ``which`` projection ("q", "k" or "v") of ``x`` [B, T, H], as
    [B, heads, T, head_dim]: queries and keys with their per-head norm and RoPE (``cos``/``sin``)."""
    b, t, _ = x.shape
    out = getattr(attn, f"{which}_proj")(x).view(b, t, -1, attn.head_dim)
    if which == "v":
        return out.transpose(1, 2)
    return _rotate(getattr(attn, f"{which}_norm")(out).transpose(1, 2), cos, sin)


def _targets_only_supported(model) -> bool:
    """Whether :func:`_last_layer_at_targets` can run ``model``: a plain Qwen3 decoder of two layers or more
    (per-head q/k norms, RoPE, full attention in the last layer), not wrapped (PEFT), no attention dropout."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None or len(layers) < 2 or not hasattr(inner, "rotary_emb") or not hasattr(inner, "norm"):
        return False
    attn = getattr(layers[-1], "self_attn", None)
    config = model.config
    return (type(model).__name__ == "Qwen3ForCausalLM" and attn is not None and hasattr(attn, "q_norm")
            and getattr(attn, "sliding_window", None) is None and not getattr(config, "attention_bias", False)
            and float(getattr(config, "attention_dropout", 0.0) or 0.0) == 0.0)


def _hidden_before_last_layer(model, **kwargs):
    """Run the decoder without its last layer; the residual stream entering that layer (all positions).

    The layers before the last one run as transformers runs them (same masks, same cache); only the
    final norm's input is captured, so nothing of the model's own code is re-implemented here.
    """
    import torch

    inner = model.model
    layers = inner.layers
    captured: list[Any] = []
    hook = inner.norm.register_forward_pre_hook(lambda module, args: captured.append(args[0]))
    inner.layers = torch.nn.ModuleList(list(layers)[:-1])
    try:
        inner(**kwargs)
    finally:
        inner.layers = layers
        hook.remove()
    return captured[0]


def _last_layer_kv(model, hidden, positions):
    """Keys and values of the last layer for ``hidden`` [B, T, H] at ``positions`` [1, T] (RoPE applied)."""
    layer = model.model.layers[-1]
    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    cos, sin = model.model.rotary_emb(x, positions)
    return _project(attn, x, "k", cos, sin), _project(attn, x, "v")


def _local_decoder_layer(model, layer, hidden, start: int, before, window: int):
    """One decoder layer whose heads attend only to the last ``window`` positions (banded attention).

    For the copy circuit's previous-token layer, whose attention is local by construction (all of its
    mass within 4 positions, :mod:`trace_train.tiny.copy_circuit`): the band costs O(T·window) instead of
    O(T²) and gives the same result to float rounding. ``hidden`` [B, T, H] starts at position
    ``start``; ``before`` holds the keys/values ([1 or B, heads, n, d], RoPE applied) of the positions
    just before it (the shared prefix's tail) or is None. Returns (hidden out, (keys, values) of these T
    positions).
    """
    import torch

    attn = layer.self_attn
    x = layer.input_layernorm(hidden)
    b, t, _ = x.shape
    cos, sin = model.model.rotary_emb(x, torch.arange(start, start + t, device=x.device).unsqueeze(0))
    queries, keys, values = (_project(attn, x, which, cos, sin) for which in "qkv")
    need = window - 1
    n_before = 0
    parts_k, parts_v = [keys], [values]
    if before is not None and need:
        k0, v0 = before[0][:, :, -need:], before[1][:, :, -need:]
        n_before = k0.shape[2]
        parts_k.insert(0, k0.expand(b, -1, -1, -1))
        parts_v.insert(0, v0.expand(b, -1, -1, -1))
    if need - n_before:
        zeros = keys.new_zeros((b, keys.shape[1], need - n_before, keys.shape[3]))
        parts_k.insert(0, zeros)
        parts_v.insert(0, zeros)
    band_k = torch.cat(parts_k, dim=2).unfold(2, window, 1)  # [B, kv heads, T, d, window]
    band_v = torch.cat(parts_v, dim=2).unfold(2, window, 1)
    groups = queries.shape[1] // band_k.shape[1]
    if groups > 1:
        band_k, band_v = band_k.repeat_interleave(groups, dim=1), band_v.repeat_interleave(groups, dim=1)
    scores = torch.einsum("bhtd,bhtdw->bhtw", queries, band_k) * attn.scaling
    # Slot w of query t holds position t + w - need (relative to the first query); before the data: masked.
    rel = torch.arange(t, device=x.device).view(-1, 1) + torch.arange(window, device=x.device).view(1, -1) - need
    scores = scores.masked_fill((rel < -n_before).view(1, 1, t, window), float("-inf"))
    out = torch.einsum("bhtw,bhtdw->bhtd", scores.softmax(dim=-1), band_v)
    hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(b, t, -1))
    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
    return hidden, (keys, values)


def _local_stack(model, ids, start: int, tails, window: int):
    """Embeddings and every layer before the last with banded attention (:func:`_local_decoder_layer`).

    ``tails`` holds per layer the keys/values of the positions before ``start`` (or None); returns
    (hidden entering the last layer, per-layer keys/values of these positions).
    """
    hidden = model.model.embed_tokens(ids)
    kvs = []
    for i, layer in enumerate(list(model.model.layers)[:-1]):
        hidden, kv = _local_decoder_layer(model, layer, hidden, start, tails[i] if tails else None, window)
        kvs.append(kv)
    return hidden, kvs


def local_attention_mass(model, ids: Sequence[int], window: int) -> float:
    """Smallest share of its attention that any head of the layers before the last puts on the last
    ``window`` positions, over the token sequence ``ids`` (1.0: banded attention is exact for them)."""
    import torch

    with torch.no_grad():
        x = torch.tensor([list(ids)], device=model.device)
        states = model(input_ids=x, output_hidden_states=True, use_cache=False).hidden_states
        t = x.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        band = causal.triu(-(window - 1))
        worst = 1.0
        for i, layer in enumerate(list(model.model.layers)[:-1]):
            attn = layer.self_attn
            h = layer.input_layernorm(states[i])
            cos, sin = model.model.rotary_emb(h, torch.arange(t, device=x.device).unsqueeze(0))
            q, k = _project(attn, h, "q", cos, sin), _project(attn, h, "k", cos, sin)
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            probs = (q @ k.transpose(-1, -2) * attn.scaling).masked_fill(~causal, float("-inf")).softmax(-1)
            worst = min(worst, float((probs * band).sum(-1).min()))
    return worst


def _last_layer_at_targets(model, hidden, query_pos, prefix_kv, prefix_len: int):
    """The last decoder layer, final norm included, computed only at the query positions.

    Every position's keys and values are needed (any of them can be attended to), but the queries,
    the attention itself, the output projection and the MLP only where a target token is predicted:
    in SFT rows that is a few assistant turns out of a long conversation, so this skips most of the
    last layer's work. ``hidden`` [B, T, H] enters the last layer (row tokens after the shared prefix,
    right-padded); ``query_pos`` [B, Q] indexes into T (causal: a query at t sees row keys ≤ t and
    the whole prefix); ``prefix_kv`` holds the prefix's last-layer keys/values ([1, heads, P, d]) or is
    None. Matches the full forward to float rounding (tests/test_models.py).
    """
    import torch

    layer = model.model.layers[-1]
    attn = layer.self_attn
    b, t, _ = hidden.shape
    positions = torch.arange(prefix_len, prefix_len + t, device=hidden.device).unsqueeze(0)
    keys, values = _last_layer_kv(model, hidden, positions)
    if prefix_kv is not None:
        keys = torch.cat([prefix_kv[0].expand(b, -1, -1, -1), keys], dim=2)
        values = torch.cat([prefix_kv[1].expand(b, -1, -1, -1), values], dim=2)
    index = query_pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    h_q = torch.gather(hidden, 1, index)
    x_q = layer.input_layernorm(h_q)
    q_len = query_pos.shape[1]
    cos, sin = model.model.rotary_emb(x_q, query_pos + prefix_len)
    queries = _project(attn, x_q, "q", cos, sin)
    groups = queries.shape[1] // keys.shape[1]
    if groups > 1:
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    key_pos = torch.arange(t, device=hidden.device)
    visible = key_pos.view(1, 1, t) <= query_pos.unsqueeze(-1)  # [B, Q, T]
    if prefix_len:
        visible = torch.cat([visible.new_ones((b, q_len, prefix_len)), visible], dim=2)
    out = torch.nn.functional.scaled_dot_product_attention(queries, keys, values, attn_mask=visible.unsqueeze(1),
                                                           scale=attn.scaling)
    h_q = h_q + attn.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))
    h_q = h_q + layer.mlp(layer.post_attention_layernorm(h_q))
    return model.model.norm(h_q)


def sft_loss(model, batch: Sequence[tuple[list[int], list[int]]], pad_id: int, prefix_len: int = 0,
             device: str = "cpu", drop_prefix: bool = False, every_token: bool = False,
             targets_only: bool = True, local_window: int | None = None, head_weight: float = 1.0,
             head_tokens: int = 8):
    """Mean cross-entropy over the target tokens of ``batch`` (right-padded).

    With ``prefix_len > 0`` (every row starts with the same ``prefix_len`` tokens, none of them a
    target), the prefix is run once at batch size 1 and its keys/values are shared by the rows, whose
    remaining tokens are run on top; gradients flow through the shared cache. With ``drop_prefix``
    the rows are trained without it (the conversation alone, several times cheaper), and with
    ``every_token`` every token after the prefix is a target, not only the assistant turns — the
    language-model pre-training phase of :attr:`BootstrapConfig.pretrain_frac`. The LM head is
    applied only at positions that predict a target (the other logits are never needed), and with
    ``targets_only`` (Qwen3 models; the default) so is the whole last decoder layer except its
    keys and values (:func:`_last_layer_at_targets`): the same loss and gradients, a third less work
    per SFT step of the tiny preset on the airline target. ``local_window`` (with ``targets_only``)
    declares that every layer before the last attends only within that many positions — true of the
    copy circuit's previous-token layer while it is held fixed (check with
    :func:`local_attention_mass`) — and runs those layers with banded attention
    (:func:`_local_decoder_layer`), so the long shared prompt costs almost nothing below the last layer.
    ``head_weight`` (> 1) makes the mean a weighted one: the first ``head_tokens`` tokens of every target run
    (an assistant turn's opening: message or tool call, and which tool) count ``head_weight`` times — see
    :func:`turn_head_weights`.
    """
    import inspect

    import torch
    from transformers import DynamicCache

    # transformers 5 renamed ``past_key_values`` to ``cache``; use whichever the model takes.
    cache_kw = "cache" if "cache" in inspect.signature(model.model.forward).parameters else "past_key_values"
    cache = None
    if every_token:
        batch = [(ids, [-100] * prefix_len + ids[prefix_len:]) for ids, _ in batch]
    if drop_prefix:
        batch = [(ids[prefix_len:], labels[prefix_len:]) for ids, labels in batch]
        prefix_len = 0
    # Every token a target: the last layer runs everywhere anyway (the banded layers still pay off).
    sparse = targets_only and (local_window or not every_token) and _targets_only_supported(model)
    prefix_kv = prefix_tails = None
    if prefix_len > 0:
        prefix = torch.tensor([batch[0][0][:prefix_len]], dtype=torch.long, device=device)
        if sparse and local_window:  # the rows need only the tail of the prefix below the last layer
            hidden, prefix_tails = _local_stack(model, prefix, 0, None, local_window)
        else:
            shared = DynamicCache()
            if sparse:
                hidden = _hidden_before_last_layer(model, input_ids=prefix, use_cache=True, **{cache_kw: shared})
            else:
                model.model(input_ids=prefix, use_cache=True, **{cache_kw: shared})
            cache = DynamicCache()
            for i, layer in enumerate(shared.layers):
                cache.update(layer.keys.expand(len(batch), -1, -1, -1), layer.values.expand(len(batch), -1, -1, -1),
                             i)
        if sparse:
            prefix_kv = _last_layer_kv(model, hidden, torch.arange(prefix_len, device=device).unsqueeze(0))
    rows = [(ids[prefix_len:], labels[prefix_len:]) for ids, labels in batch]
    width = max(len(ids) for ids, _ in rows)
    ids_t = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels_t = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), prefix_len + width), dtype=torch.long)
    mask[:, :prefix_len] = 1
    for b, (ids, labels) in enumerate(rows):
        ids_t[b, :len(ids)] = torch.tensor(ids)
        labels_t[b, :len(ids)] = torch.tensor(labels)
        mask[b, prefix_len:prefix_len + len(ids)] = 1
    kwargs: dict[str, Any] = {cache_kw: cache, "use_cache": True} if cache is not None else {"use_cache": False}
    # Position t predicts token t+1: keep the positions whose next token is a target.
    next_labels = labels_t[:, 1:].to(device)
    keep = next_labels != -100
    if sparse:
        if local_window:
            hidden, _ = _local_stack(model, ids_t.to(device), prefix_len, prefix_tails, local_window)
        else:
            hidden = _hidden_before_last_layer(model, input_ids=ids_t.to(device), attention_mask=mask.to(device),
                                               **kwargs)
        counts = keep.sum(dim=1)
        query_pos = torch.zeros((len(rows), max(1, int(counts.max()))), dtype=torch.long, device=device)
        valid = torch.zeros_like(query_pos, dtype=torch.bool)
        for b in range(len(rows)):
            where = keep[b].nonzero().squeeze(-1)
            query_pos[b, :len(where)] = where
            valid[b, :len(where)] = True
        hidden_q = _last_layer_at_targets(model, hidden, query_pos, prefix_kv, prefix_len)
        targets = torch.gather(next_labels, 1, query_pos)[valid]
        logits = model.lm_head(hidden_q[valid])
        weights = None if head_weight == 1.0 else \
            torch.gather(turn_head_weights(keep, head_weight, head_tokens), 1, query_pos)[valid]
        return _mean_cross_entropy(logits, targets, weights)
    hidden = model.model(input_ids=ids_t.to(device), attention_mask=mask.to(device), **kwargs).last_hidden_state
    logits = model.lm_head(hidden[:, :-1][keep])
    weights = None if head_weight == 1.0 else turn_head_weights(keep, head_weight, head_tokens)[keep]
    return _mean_cross_entropy(logits, next_labels[keep], weights)


def turn_head_weights(keep, head_weight: float, head_tokens: int):
    """Loss weights [B, T] for the target mask ``keep`` [B, T]: ``head_weight`` on the first ``head_tokens``
    positions of every run of consecutive targets (one assistant turn), 1 on the rest of the run, 0 elsewhere.

    Why: a turn's decision sits in its first tokens (a message or a tool call, and which tool: refuse or go
    ahead), while most of its tokens are copied from the context (ids, the record's fields) or fixed by the
    format. Under a plain token mean a decision the model gets wrong half the time is a few percent of the
    loss of a well-fitted episode (the precondition env's warm-up fitted its oracle to 0.04 and still went
    ahead with 19 of 20 forbidden cancellations); weighting the openings makes it a large share again. It
    does not make a decision learnable that the model cannot see: on that env a weight of 10 moved how often
    the opening is a tool call, not when (docs/train.md).
    """
    import torch

    keep = keep.bool()
    starts = keep.clone()
    starts[:, 1:] &= ~keep[:, :-1]
    positions = torch.arange(keep.shape[1], device=keep.device).expand_as(keep)
    # The position where each position's run started: the largest start position so far.
    start_at = torch.cummax(torch.where(starts, positions, torch.zeros_like(positions)), dim=1).values
    offset = positions - start_at
    weights = torch.where(offset < head_tokens, float(head_weight), 1.0)
    return torch.where(keep, weights, 0.0)


def _mean_cross_entropy(logits, targets, weights=None):
    """Cross-entropy averaged over the targets, or weighted by ``weights`` (same length) when given."""
    import torch

    if weights is None:
        return torch.nn.functional.cross_entropy(logits.float(), targets)
    losses = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")
    return (losses * weights).sum() / weights.sum()
