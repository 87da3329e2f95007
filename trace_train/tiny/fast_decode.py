"""A hand-written decode loop for the tiny Qwen3-architecture models (``decode: fast``).

At the size of the models ``trace_train.tiny`` builds (two layers, a few hundred wide), ``generate`` spends
most of each step outside arithmetic: per-token Python of the generation loop, logits processors, a
``DynamicCache`` that re-concatenates every layer's keys and values each token, and attention that reads
every row's own copy of the ~1.8k-token system prompt and tool schemas that all of them share. This module
decodes the same model with:

* the weights read once per call into plain tensors (a PEFT LoRA merged into its base weights; q/k/v and
  gate/up fused into one matrix each), and a forward of a few dozen torch ops per token; a token-level
  composed model (:class:`trace_train.compose.ComposedModel`) keeps its gates and routed experts apart, each
  block routing its tokens as the composer's own forward does (every expert stacked and masked by the
  tokens' gating weights, which at a few experts of rank 8-16 costs less than grouping the tokens); with
  context gates, each row carries the running sum of every block's normalised inputs, as the composer's
  :class:`~trace_train.compose.model.BlockRouter` does under a KV cache, and with request gates restarts it at
  each user request of its prompt;
* the prefix the rows of a batch share (the policy and tool schemas, and a group's common first prompt) held
  once and attended by every row together ("shared-prefix attention": one matmul over the prefix for all
  rows, a second over each row's own tokens, one softmax over both);
* each row's own tokens in a preallocated cache (no per-token concatenation), rows that finished dropped
  from the batch as they finish;
* a store of each conversation's keys and values between turns (:class:`KVStore`), so a turn encodes only
  the tokens the env added since the last one.

It is a second implementation of the same forward, so it is tested token-for-token against ``generate``
(greedy) in ``tests/test_fast_decode.py``; :func:`supported` says which models it takes and every other
model keeps ``generate`` (:class:`trace_train.agents.HFAgent` chooses). Sampling draws from
``softmax(logits / temperature)`` after the same top-k / top-p filtering ``generate`` applies, and returns the
log-probability of each sampled token under the distribution it was drawn from (the filtered one, renormalised).
Without filters that is ``log_softmax(logits / temperature)``, what TRL's GRPO loss recomputes for those tokens;
with them the two differ, and the trainer's mismatch metric (``mismatch_kl``, docs/train.md) shows by how much.

Torch is imported when a decoder is built, never at module import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

#: ``decode: auto`` takes the fast path only for models this small (the ``nano``/``tiny``/``small`` presets);
#: ``decode: fast`` takes it for any :func:`supported` model.
AUTO_MAX_HIDDEN = 512
AUTO_MAX_LAYERS = 8
#: Most tokens encoded in one piece (the attention scores of a piece are ``[heads, piece, context]``).
PREFILL_CHUNK = 1024


class Unsupported(Exception):
    """The model is not one :class:`FastDecoder` can run; the caller falls back to ``generate``."""


def _is_composed(model: Any) -> bool:
    """A :class:`trace_train.compose.ComposedModel` (gates and routed LoRA experts over a frozen base)."""
    return type(model).__name__ == "ComposedModel" and hasattr(model, "gates") and hasattr(model, "routers")


def _base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (LoRA layers stay injected in its modules) or under a
    composed model (its routed projections stay in its modules)."""
    if _is_composed(model):
        return model.model
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _episode_routings() -> tuple[str, ...]:
    from ..compose.model import EPISODE_ROUTINGS

    return EPISODE_ROUTINGS


def supported(model: Any) -> tuple[bool, str]:
    """Whether :class:`FastDecoder` can run ``model`` (a ``Qwen3ForCausalLM``, optionally with PEFT LoRA); why not."""
    try:
        _check(model)
    except Unsupported as exc:
        return False, str(exc)
    return True, ""


def auto_applies(model: Any) -> bool:
    """``decode: auto``: a supported model of the tiny presets' size."""
    if not supported(model)[0]:
        return False
    config = _base_model(model).config
    return config.hidden_size <= AUTO_MAX_HIDDEN and config.num_hidden_layers <= AUTO_MAX_LAYERS


def _check(model: Any) -> None:
    if _is_composed(model) and model.forced is not None:
        # Slots forced from outside (force_routing) may differ per row or per token: generate() takes them.
        raise Unsupported("forced routing")
    if _is_composed(model) and model.routing not in ("token", "segment", *_episode_routings()):
        raise Unsupported(f"{model.routing} routing")
    if _is_composed(model) and getattr(model, "gate_input", "token") not in ("token", "context", "request"):
        raise Unsupported(f"{model.gate_input} gates")
    base = _base_model(model)
    config = getattr(base, "config", None)
    if type(base).__name__ != "Qwen3ForCausalLM" or getattr(config, "model_type", None) != "qwen3":
        raise Unsupported(f"{type(base).__name__} is not a Qwen3ForCausalLM")
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        raise Unsupported("sliding-window layers")
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise Unsupported(f"RoPE type {rope.get('rope_type')!r}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise Unsupported(f"activation {config.hidden_act!r}")
    if getattr(config, "final_logit_softcapping", None):
        raise Unsupported("logit soft-capping")
    import torch

    if type(base.model.embed_tokens) is not torch.nn.Embedding:
        raise Unsupported("an adapted embedding")
    for layer in base.model.layers:
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj, layer.self_attn.o_proj,
                       layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            _linear(module, check_only=True)
    _linear(base.lm_head, check_only=True)


def _linear(module: Any, check_only: bool = False):
    """(weight, bias) of a ``nn.Linear`` or of a PEFT LoRA ``Linear`` with its active adapters merged in."""
    import torch

    if type(module) is torch.nn.Linear:
        return None if check_only else (module.weight.detach(), None if module.bias is None else module.bias.detach())
    if type(module).__name__ == "RoutedLoRALinear":  # a composed model's projection: its experts are routed
        return _linear(module.base, check_only)
    base = getattr(module, "base_layer", None)
    if base is None or type(base) is not torch.nn.Linear or not hasattr(module, "lora_A"):
        raise Unsupported(f"a {type(module).__name__} layer")
    adapters = [] if getattr(module, "merged", False) or getattr(module, "disable_adapters", False) else \
        [a for a in module.active_adapters if a in module.lora_A]
    for a in adapters:
        if getattr(module, "lora_variant", {}).get(a) is not None or getattr(module, "lora_bias", {}).get(a):
            raise Unsupported("a LoRA variant (DoRA, LoRA bias, ...)")
    if check_only:
        return None
    weight = base.weight.detach()
    for a in adapters:
        weight = weight + module.get_delta_weight(a).detach().to(weight.dtype)
    return weight, None if base.bias is None else base.bias.detach()


def weights_version(model: Any) -> int:
    """A number that changes whenever a parameter is changed in place (an optimiser step), or replaced."""
    return sum(p._version + id(p) for p in model.parameters())


@dataclass
class _Layer:
    ln1: Any
    wqkv: Any
    bqkv: Any
    q_norm: Any
    k_norm: Any
    qk_norm: Any  # [heads + kv_heads, D]: q_norm's weight times the attention scale for each query head, then
    # k_norm's for each kv head (RoPE is linear, so the queries leave _qkv already scaled)
    wo: Any
    bo: Any
    ln2: Any
    wgu: Any
    wd: Any
    router: "_Router | None" = None  # a composed model's gate and routed experts of this block


@dataclass
class _Routed:
    """The routed LoRA experts of one (possibly fused) projection: ``delta = ((x @ a.T) * mask) @ b.T``, with
    ``mask`` the token's gating weight of each expert spread over that expert's rank columns."""

    a: Any  # [R, in]: every expert's A of every part, stacked (experts' alpha / r folded into B)
    b: Any  # [out, R]: the parts' B side by side, block-diagonal over the parts of a fused projection
    reps: Any  # [parts * K] long: rank of expert k in part j at j * K + k
    parts: int


@dataclass
class _Router:
    """A block's gate (``Linear(hidden, K + 1)`` over the RMS-normalised block input; slot 0 = the base) and its
    routed projections (None where a projection has no experts)."""

    gate_w: Any
    gate_b: Any
    top_k: int
    experts: int
    qkv: _Routed | None
    o: _Routed | None
    gu: _Routed | None
    d: _Routed | None
    center: Any = None  # context gates: the block's context centre [hidden] (float32); None for token gates
    renormalise: bool = False  # gate_weight "one": the chosen slots' weights renormalised to sum to 1


@dataclass
class _Weights:
    embed: Any
    layers: list[_Layer]
    norm: Any
    lm_head: Any
    lm_bias: Any
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    inv_freq: Any
    rope_scale: float
    dtype: Any
    device: Any


def _routed(modules: list[Any], num_experts: int) -> _Routed | None:
    """The stacked experts of ``modules`` (one projection, or the parts of a fused one), None if none is routed."""
    import torch

    routed = [m for m in modules if type(m).__name__ == "RoutedLoRALinear"]
    if not routed:
        return None
    a_parts, reps, outs = [], [], []
    for m in modules:
        out_features = m.base.out_features if type(m).__name__ == "RoutedLoRALinear" else m.out_features
        outs.append(out_features)
        if type(m).__name__ == "RoutedLoRALinear":
            a_parts.append(m.lora_A_all.detach())
            reps += list(m.ranks)
        else:
            reps += [0] * num_experts
    a = torch.cat(a_parts)
    b = a.new_zeros(sum(outs), a.shape[0])
    row = col = 0
    for m, out_features in zip(modules, outs):
        if type(m).__name__ == "RoutedLoRALinear":
            width = m.lora_B_all.shape[1]
            b[row:row + out_features, col:col + width] = m.lora_B_all.detach()
            col += width
        row += out_features
    return _Routed(a=a, b=b, reps=torch.tensor(reps, dtype=torch.long, device=a.device), parts=len(modules))


def read_weights(model: Any) -> _Weights:
    """The model's weights as plain tensors (LoRA merged; q/k/v and gate/up fused; a composed model's gates and
    routed experts kept apart, since they act per token)."""
    import torch

    _check(model)
    base = _base_model(model)
    config = base.config
    gates = list(model.gates) if _is_composed(model) else None
    with torch.no_grad():
        layers = []
        for li, layer in enumerate(base.model.layers):
            att, mlp = layer.self_attn, layer.mlp
            (wq, bq), (wk, bk), (wv, bv) = _linear(att.q_proj), _linear(att.k_proj), _linear(att.v_proj)
            bqkv = None if bq is None else torch.cat([bq, bk, bv])
            wo, bo = _linear(att.o_proj)
            (wg, bg), (wu, bu), (wd, bd) = _linear(mlp.gate_proj), _linear(mlp.up_proj), _linear(mlp.down_proj)
            if bg is not None or bu is not None or bd is not None:
                raise Unsupported("MLP biases")
            layers.append(_Layer(ln1=layer.input_layernorm.weight.detach(), wqkv=torch.cat([wq, wk, wv]).contiguous(),
                                 bqkv=bqkv, q_norm=att.q_norm.weight.detach(), k_norm=att.k_norm.weight.detach(),
                                 qk_norm=torch.stack([att.q_norm.weight.detach() * att.scaling]
                                                     * config.num_attention_heads
                                                     + [att.k_norm.weight.detach()] * config.num_key_value_heads),
                                 wo=wo.contiguous(), bo=bo, ln2=layer.post_attention_layernorm.weight.detach(),
                                 wgu=torch.cat([wg, wu]).contiguous(), wd=wd.contiguous(),
                                 router=None if gates is None else _Router(
                                     gate_w=gates[li].weight.detach(), gate_b=gates[li].bias.detach(),
                                     top_k=int(model.top_k), experts=int(model.num_experts),
                                     qkv=_routed([att.q_proj, att.k_proj, att.v_proj], model.num_experts),
                                     o=_routed([att.o_proj], model.num_experts),
                                     gu=_routed([mlp.gate_proj, mlp.up_proj], model.num_experts),
                                     d=_routed([mlp.down_proj], model.num_experts),
                                     center=model.context_centers[li].detach().float()
                                     if getattr(model, "gate_input", "token") in ("context", "request") else None,
                                     renormalise=getattr(model, "gate_weight", "prob") == "one")))
        lm_w, lm_b = _linear(base.lm_head)
        rotary = base.model.rotary_emb
        embed = base.model.embed_tokens.weight.detach()
        return _Weights(embed=embed, layers=layers, norm=base.model.norm.weight.detach(), lm_head=lm_w, lm_bias=lm_b,
                        eps=float(config.rms_norm_eps), heads=config.num_attention_heads,
                        kv_heads=config.num_key_value_heads,
                        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
                        inv_freq=rotary.inv_freq.detach().float(), rope_scale=float(rotary.attention_scaling),
                        dtype=embed.dtype, device=embed.device)


# ----------------------------------------------------------------------------- keys/values between turns


@dataclass
class _Prefix:
    """Keys/values of a token prefix shared by several rows: per layer ``[kv_heads, n, head_dim]``."""

    tokens: Any  # 1-D long tensor
    keys: list[Any]
    values: list[Any]
    sums: list[Any] | None = None  # context gates: per layer, the sum of its normalised block inputs [hidden]
    count: int = 0  # context gates: how many tokens ``sums`` covers (request gates: since the last request)
    held: list[Any] | None = None  # segment routing: per layer, the gating weights of the open message [K]

    def __len__(self) -> int:
        return int(self.tokens.numel())


@dataclass
class _Entry:
    """One conversation's keys/values: ``prefix`` for its first ``len(prefix)`` tokens, ``tail`` for the rest."""

    tokens: Any  # 1-D long tensor, the whole conversation so far
    prefix: _Prefix | None
    tail_keys: list[Any]  # per layer [kv_heads, n - len(prefix), head_dim]
    tail_values: list[Any]

    def kv(self, layer: int, start: int, stop: int) -> tuple[Any, Any]:
        """Keys/values of positions ``[start, stop)`` of one layer."""
        import torch

        p = len(self.prefix) if self.prefix is not None else 0
        parts_k, parts_v = [], []
        if start < p:
            parts_k.append(self.prefix.keys[layer][:, start:min(stop, p)])
            parts_v.append(self.prefix.values[layer][:, start:min(stop, p)])
        if stop > p:
            parts_k.append(self.tail_keys[layer][:, max(start, p) - p:stop - p])
            parts_v.append(self.tail_values[layer][:, max(start, p) - p:stop - p])
        if len(parts_k) == 1:
            return parts_k[0], parts_v[0]
        return torch.cat(parts_k, dim=1), torch.cat(parts_v, dim=1)


def _common_length(a: Any, b: Any) -> int:
    """Length of the common prefix of two 1-D token tensors."""
    n = min(int(a.numel()), int(b.numel()))
    if n == 0:
        return 0
    diff = (a[:n] != b[:n]).nonzero()
    return n if diff.numel() == 0 else int(diff[0, 0])


@dataclass
class KVStore:
    """The keys/values of recent conversations, to encode only what is new in each one's next prompt.

    Bounded to ``limit`` entries (oldest out); an entry that a newer one extends is replaced by it.
    ``version`` is the model's :func:`weights_version` the entries were computed with: when the weights
    change, every entry is stale and the store empties itself.
    """

    limit: int = 128
    entries: list[_Entry] = field(default_factory=list)
    version: int | None = None

    def lookup(self, tokens: Any) -> tuple[_Entry | None, int]:
        best, best_len = None, 0
        for entry in self.entries:
            k = _common_length(entry.tokens, tokens)
            if k > best_len:
                best, best_len = entry, k
        return best, best_len

    def add(self, entry: _Entry) -> None:
        self.entries = [e for e in self.entries
                        if not (len(e.tokens) <= len(entry.tokens) and _common_length(e.tokens, entry.tokens)
                                == len(e.tokens))]
        self.entries.append(entry)
        if len(self.entries) > self.limit:
            del self.entries[:len(self.entries) - self.limit]

    def clear(self) -> None:
        self.entries.clear()


# ----------------------------------------------------------------------------- the decoder


@dataclass
class Generation:
    """What :meth:`FastDecoder.generate` returns per row."""

    tokens: list[int]  # new tokens, the stop token included when one was produced
    logprobs: list[float]  # log p(token) under the distribution it was drawn from (greedy: log_softmax(logits))
    cached_tokens: int  # prompt tokens whose keys/values came from the store (an earlier call), not encoded


class FastDecoder:
    """Greedy or sampled decoding of a Qwen3-architecture model with shared-prefix attention.

    Args:
        model: a ``Qwen3ForCausalLM`` or a PEFT model over one (see :func:`supported`).
        store_limit: conversations kept in the :class:`KVStore`.
    """

    def __init__(self, model: Any, store_limit: int = 128) -> None:
        _check(model)
        self.model = model
        # Context gates route each token on the running mean of every earlier token's block inputs: the store
        # keeps keys and values, not those sums at every position, so such a model re-encodes each prompt after
        # the batch's shared prefix (whose sums the prefill computes).
        gate_input = getattr(model, "gate_input", "token") if _is_composed(model) else None
        # Per-episode (and per-task) routing: one adapter for a whole conversation, chosen from its first
        # observation by the model's episode router. generate() groups the prompts by that slot and decodes each
        # group with every token on its adapter (the gates are not read, so no context sums), each slot with a
        # store of its own: a prefix's keys/values differ between adapters.
        self.episode = _is_composed(model) and model.routing in _episode_routings()
        self._slot: int | None = None  # the slot every token takes while a group decodes (episode routing)
        if self.episode:
            gate_input = None
        self.context = gate_input in ("context", "request")
        # Request gates restart the running mean at each user request (ComposedModel.request_starts): the loop
        # finds those tokens in each row's whole prompt with the composer's own function. Generated tokens never
        # open a user message.
        self.request_marker = model.spec.request_marker if gate_input == "request" else None
        # Segment routing holds each message's choice (ComposedModel, routing "segment"): the choice of the open
        # message is carried like the sums, and the store, which keeps neither, is off.
        self.segment_id = model.segment_token_id if _is_composed(model) and model.routing == "segment" else None
        self.store = KVStore(limit=0 if self.context or self.segment_id is not None else store_limit)
        self._stores: dict[int, KVStore] = {}  # episode routing: one store per slot
        self._version: int | None = None
        self._weights: _Weights | None = None
        self._rope: tuple[Any, Any] | None = None

    # -- weights
    def _refresh(self) -> _Weights:
        version = weights_version(self.model)
        if self._weights is None or version != self._version:
            self._weights = read_weights(self.model)
            for store in (self.store, *self._stores.values()):  # (the current one may be listed twice)
                store.clear()
                store.version = version
            self._version = version
        return self._weights

    def _rope_table(self, length: int):
        """cos and signed sin ``[length, head_dim]`` for positions ``0..length-1`` (Qwen3RotaryEmbedding's values)."""
        import torch

        w = self._weights
        if self._rope is None or self._rope[0].shape[0] < length:
            n = max(length, 2 * (self._rope[0].shape[0] if self._rope is not None else 1024))
            freqs = torch.arange(n, device=w.device).float()[:, None] * w.inv_freq.to(w.device)[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            sin = emb.sin() * w.rope_scale
            # rotate_half(x) * sin == roll(x, D/2) * (sin with its first half negated)
            sin = torch.cat([-sin[:, :w.head_dim // 2], sin[:, w.head_dim // 2:]], dim=-1)
            self._rope = ((emb.cos() * w.rope_scale).to(w.dtype), sin.to(w.dtype))
        return self._rope

    # -- pieces of the forward
    def _norm(self, x, weight):
        """Qwen3's RMSNorm (in float32, the weight applied in the input's dtype)."""
        import torch
        import torch.nn.functional as F

        if x.dtype == torch.float32:  # one fused op
            return F.rms_norm(x, (x.shape[-1],), weight, self._weights.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self._weights.eps)
        return weight * x.to(dtype)

    def _route(self, layer: _Layer, h, context=None):
        """A composed model's gating weights of this block for the tokens ``h [..., hidden]`` (the block's input):
        ``[..., K]``, the chosen slots' softmax probabilities and zeros elsewhere (slot 0, the base, dropped), as
        :class:`trace_train.compose.model.BlockRouter` computes them. None for a plain model. ``context``: for
        context gates, the tokens' centred context (:meth:`_context`)."""
        import torch
        import torch.nn.functional as F

        r = layer.router
        if r is None:
            return None
        if self._slot is not None:  # episode routing: every token on the chosen slot's adapter (0: the base)
            route = torch.zeros(*h.shape[:-1], r.experts, dtype=h.dtype, device=h.device)
            if self._slot > 0:
                route[..., self._slot - 1] = 1.0
            return route
        x = _unit_rms(h.float())
        if r.center is not None:
            x = torch.cat([x, context], dim=-1)
        probs = torch.softmax(F.linear(x.to(r.gate_w.dtype), r.gate_w, r.gate_b).float(), dim=-1).to(h.dtype)
        weights, slots = probs.topk(r.top_k, dim=-1)
        if r.renormalise:
            weights = weights / weights.sum(-1, keepdim=True)
        return torch.zeros_like(probs).scatter_add_(-1, slots, weights)[..., 1:]

    @staticmethod
    def _context(layer: _Layer, h, sums, counts, restarts=None):
        """Context gates: (the centred context of each token of ``h [..., n, hidden]``, the running sums after
        them). ``sums [..., hidden]`` is the sum of the block's normalised inputs
        before these tokens and ``counts`` (a number, or ``[...]``) how many tokens it covers; the context of a
        token is the RMS-normalised mean over every token up to it, less the block's centre, normalised again
        (``BlockRouter.context``). Request gates: ``restarts [..., n]`` marks the tokens where the mean starts
        again (each user request's first token), so a token averages from the last restart at or before it."""
        import torch

        if layer.router is None or layer.router.center is None:
            return None, sums
        x = _unit_rms(h.float())
        n = x.shape[-2]
        cums = torch.cumsum(x, dim=-2) + sums.unsqueeze(-2)
        steps = torch.arange(1, n + 1, device=x.device, dtype=x.dtype)
        totals = torch.as_tensor(counts, device=x.device, dtype=x.dtype).unsqueeze(-1) + steps
        if restarts is not None and bool(restarts.any()):
            positions = torch.arange(n, device=x.device)
            last = torch.where(restarts, positions, torch.full_like(positions, -1)).cummax(dim=-1).values
            restarted = last >= 0
            before = (cums - x).gather(-2, last.clamp(min=0).unsqueeze(-1).expand_as(cums))  # the sums before it
            cums = torch.where(restarted.unsqueeze(-1), cums - before, cums)
            totals = torch.where(restarted, (positions - last + 1).to(x.dtype), totals)
        mean = _unit_rms(cums / totals.unsqueeze(-1))
        return _unit_rms(mean - layer.router.center), cums[..., -1, :]

    @staticmethod
    def _hold(route, starts, held):
        """Segment routing: each token's gating weights ``route [n, K]`` replaced by those at the first token of its
        message (the last of ``starts [n]`` at or before it); tokens before any start keep ``held [K]``, the open
        message's weights (``BlockRouter.hold``). Returns them and the weights of the message left open."""
        import torch

        n = route.shape[0]
        positions = torch.arange(n, device=route.device)
        last = torch.where(starts, positions, torch.full_like(positions, -1)).cummax(dim=0).values
        out = route[last.clamp(min=0)]
        if held is not None:
            out = torch.where((last < 0)[:, None], held, out)
        return out, out[-1]

    @staticmethod
    def _delta(routed: _Routed | None, x, route):
        """The routed experts' contribution to a projection of ``x`` (None when it has none)."""
        if routed is None or route is None:
            return None
        mask = route.repeat(*([1] * (route.dim() - 1)), routed.parts).repeat_interleave(routed.reps, dim=-1)
        return ((x @ routed.a.t()) * mask.to(x.dtype)) @ routed.b.t()

    def _qkv(self, layer: _Layer, h, cos, sin, route=None):
        """q ``[..., heads, D]`` (times the attention scale), k and v ``[..., kv_heads, D]`` of hidden states
        ``h [..., hidden]``; ``sin`` is the signed table of :meth:`_rope_table` (so that rotate-half is one roll);
        ``route`` the block's gating weights (:meth:`_route`) when the model is composed."""
        import torch
        import torch.nn.functional as F

        w = self._weights
        d = w.head_dim
        x = self._norm(h, layer.ln1)
        qkv = F.linear(x, layer.wqkv, layer.bqkv)
        delta = self._delta(layer.router.qkv if layer.router else None, x, route)
        if delta is not None:
            qkv = qkv + delta
        qk, v = qkv.split([(w.heads + w.kv_heads) * d, w.kv_heads * d], dim=-1)
        qk = qk.unflatten(-1, (w.heads + w.kv_heads, d))
        # q_norm and k_norm over the heads together: normalise, then each head's own weight
        if qk.dtype == torch.float32:
            qk = F.rms_norm(qk, (d,), None, w.eps) * layer.qk_norm
        else:
            qk = torch.cat([self._norm(qk[..., :w.heads, :], layer.q_norm) * w.head_dim ** -0.5,
                            self._norm(qk[..., w.heads:, :], layer.k_norm)], dim=-2)
        cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
        q, k = qk.split([w.heads, w.kv_heads], dim=-2)
        return q, k, v.unflatten(-1, (w.kv_heads, d))

    def _mlp_out(self, layer: _Layer, h, attn, route=None):
        import torch.nn.functional as F

        r = layer.router
        o = F.linear(attn, layer.wo, layer.bo)
        if r is not None and r.o is not None and route is not None:
            o = o + self._delta(r.o, attn, route)
        h = h + o
        x = self._norm(h, layer.ln2)
        gu = F.linear(x, layer.wgu)
        if r is not None and r.gu is not None and route is not None:
            gu = gu + self._delta(r.gu, x, route)
        gate, up = gu.chunk(2, dim=-1)
        act = F.silu(gate) * up
        down = F.linear(act, layer.wd)
        if r is not None and r.d is not None and route is not None:
            down = down + self._delta(r.d, act, route)
        return h + down

    def _logits(self, h):
        import torch.nn.functional as F

        w = self._weights
        return F.linear(self._norm(h, w.norm), w.lm_head, w.lm_bias)

    def _prefill(self, tokens, past: list[tuple[Any, Any]], start: int, prefix: _Prefix | None = None,
                 sums: list[Any] | None = None, held: list[Any] | None = None, count: int | None = None,
                 restarts=None):
        """Encode ``tokens`` (1-D) at positions ``start..`` over ``past`` (per layer k/v ``[kv, start - P, D]``, after
        ``prefix`` of length P); returns (the new tokens' k/v per layer, logits of the last token, per layer the
        running sum of the normalised block inputs after them: context gates only, else None, the open message's
        gating weights after them: segment routing only, else None, how many tokens the sums cover). ``sums``:
        those sums over the ``count`` tokens before (context gates; default zeros over ``start`` tokens; request
        gates count from the last request). ``restarts`` (request gates): bool ``[n]``, the tokens where a user
        request starts. Segment routing: ``held`` is, per layer, the open message's gating weights before
        ``tokens`` (None at a sequence's start)."""
        import torch
        import torch.nn.functional as F

        w = self._weights
        n = int(tokens.numel())
        if self.context and sums is None:
            sums = [torch.zeros(w.embed.shape[1], dtype=torch.float32, device=w.device) for _ in w.layers]
        count = start if count is None else count
        if n > PREFILL_CHUNK:  # bound the [n, context] score matrix: encode in chunks, each over the ones before
            pieces: list[list[tuple[Any, Any]]] = []
            acc = list(past)
            for at in range(0, n, PREFILL_CHUNK):
                piece_kv, logits, sums, held, count = self._prefill(
                    tokens[at:at + PREFILL_CHUNK], acc, start + at, prefix, sums, held, count,
                    None if restarts is None else restarts[at:at + PREFILL_CHUNK])
                pieces.append(piece_kv)
                acc = [(nk if pk is None else torch.cat([pk, nk], dim=1), nv if pv is None else torch.cat([pv, nv], dim=1))
                       for (pk, pv), (nk, nv) in zip(acc, piece_kv)]
            new_kv = [(torch.cat([pc[li][0] for pc in pieces], dim=1), torch.cat([pc[li][1] for pc in pieces], dim=1))
                      for li in range(len(w.layers))]
            return new_kv, logits, sums, held, count
        g = w.heads // w.kv_heads
        cos, sin = self._rope_table(start + n)
        cos, sin = cos[start:start + n], sin[start:start + n]
        h = F.embedding(tokens, w.embed)
        p = len(prefix) if prefix is not None else 0
        m = start - p  # this row's own past tokens
        # causal mask over [own past, new]: new token i sees own past and new tokens <= i
        hidden = ~torch.ones(n, m + n, dtype=torch.bool, device=w.device).tril(diagonal=m)
        new_kv = []
        new_sums = list(sums) if sums is not None else None
        new_held, starts = None, None
        if self.segment_id is not None:
            new_held = list(held) if held is not None else [None] * len(w.layers)
            starts = tokens == self.segment_id
            if start == 0:
                starts[0] = True  # a sequence's first token opens its first segment
        new_count = count + n  # the tokens the sums cover after these: from the last restart among them, if any
        if restarts is not None and bool(restarts.any()):
            new_count = n - int(restarts.nonzero()[-1])
        for li, layer in enumerate(w.layers):
            context = None
            if new_sums is not None:
                context, new_sums[li] = self._context(layer, h, new_sums[li], count, restarts)
            route = self._route(layer, h, context)
            if new_held is not None and route is not None:
                route, new_held[li] = self._hold(route, starts, new_held[li])
            q, k, v = self._qkv(layer, h, cos, sin, route)  # [n, heads, D], [n, kv, D]
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [kv, n, D]
            new_kv.append((k, v))
            own_k = torch.cat([past[li][0], k], dim=1) if m else k
            own_v = torch.cat([past[li][1], v], dim=1) if m else v
            qg = q.transpose(0, 1).reshape(w.kv_heads, g * n, w.head_dim)  # [kv, g*n, D]: heads of a kv group
            scores = [torch.matmul(qg, own_k.transpose(1, 2)).view(w.kv_heads, g, n, m + n)
                      .masked_fill_(hidden, float("-inf"))]
            if p:
                scores.insert(0, torch.matmul(qg, prefix.keys[li].transpose(1, 2)).view(w.kv_heads, g, n, p))
            probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(w.dtype)
            out = torch.matmul(probs[..., p:].reshape(w.kv_heads, g * n, m + n), own_v)
            if p:
                out = out + torch.matmul(probs[..., :p].reshape(w.kv_heads, g * n, p), prefix.values[li])
            out = out.view(w.heads, n, w.head_dim).transpose(0, 1).reshape(n, w.heads * w.head_dim)
            h = self._mlp_out(layer, h, out, route)
        return new_kv, self._logits(h[-1:])[0], new_sums, new_held, new_count

    def _choose(self, logits, temperature: float, top_k: int | None, top_p: float, generator):
        """(token per row, its log-probability) from ``logits [B, V]``."""
        import torch

        if temperature <= 0:
            tokens = logits.argmax(dim=-1)
            logp = torch.log_softmax(logits.float(), dim=-1)
            return tokens, logp.gather(1, tokens[:, None])[:, 0]
        scores = logits.float() / temperature
        logp = torch.log_softmax(scores, dim=-1)
        filtered = scores
        if top_k is not None and 0 < top_k < scores.shape[-1]:
            kth = torch.topk(filtered, top_k, dim=-1).values[:, -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if top_p < 1.0:
            sorted_scores, order = torch.sort(filtered, descending=False, dim=-1)
            cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= (1 - top_p)
            drop[:, -1] = False  # keep at least the most likely token
            filtered = filtered.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        probs = torch.softmax(filtered, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator)[:, 0]
        if filtered is not scores:  # the sampler's own distribution is the filtered one
            logp = torch.log_softmax(filtered, dim=-1)
        return tokens, logp.gather(1, tokens[:, None])[:, 0]

    # -- generation
    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_ids: Sequence[int],
                 temperature: float = 0.0, top_k: int | None = None, top_p: float = 1.0,
                 generator: Any = None) -> list[Generation]:
        """New tokens for every prompt (token ids), until a token of ``eos_ids`` or ``max_new_tokens``.

        ``temperature`` 0 is greedy; otherwise tokens are drawn (from ``generator``, default torch's global RNG)
        after top-k (None: off) and top-p filtering, as ``generate`` does.
        """
        import torch

        if max_new_tokens < 1:
            raise ValueError(f"FastDecoder.generate: max_new_tokens must be >= 1, got {max_new_tokens}")
        if not prompts:
            return []
        with torch.inference_mode():
            if not self.episode:
                return self._generate(prompts, max_new_tokens, eos_ids, temperature, top_k, top_p, generator)
            router = self.model.episode_router()
            slots = [int(router.slot_for(list(p))) for p in prompts]
            router.last_slots = slots  # as its choose() records them for generate()
            out: list[Generation | None] = [None] * len(prompts)
            try:
                for slot in sorted(set(slots)):
                    rows = [i for i, s in enumerate(slots) if s == slot]
                    self._slot = slot
                    self.store = self._stores.setdefault(slot, KVStore(limit=self.store.limit, version=self._version))
                    for i, gen in zip(rows, self._generate([prompts[i] for i in rows], max_new_tokens, eos_ids,
                                                           temperature, top_k, top_p, generator)):
                        out[i] = gen
            finally:
                self._slot = None
            return out  # type: ignore[return-value]

    def _generate(self, prompts, max_new_tokens, eos_ids, temperature, top_k, top_p, generator):
        import torch
        import torch.nn.functional as F

        w = self._refresh()
        dev = w.device
        seqs = [torch.tensor(list(p), dtype=torch.long, device=dev) for p in prompts]
        if any(s.numel() == 0 for s in seqs):
            raise ValueError("FastDecoder.generate: an empty prompt")
        b = len(seqs)
        found = [self.store.lookup(s) for s in seqs]
        # The prefix every row shares, less the last token of the shortest (each row needs one token of its
        # own to produce its first logits).
        shared = min(int(s.numel()) for s in seqs) - 1
        for s in seqs[1:]:
            shared = min(shared, _common_length(seqs[0], s))
        restarts = None
        if self.request_marker is not None:  # request gates: where each row's prompt opens a user request
            from ..compose.model import request_start_flags

            restarts = [request_start_flags(s[None], self.request_marker)[0] for s in seqs]
            # Whether a marker is a request depends on the tokens after it (a tool's result is not): the prefix
            # stops short of any marker it could cut, so its flags are every row's.
            shared = max(0, shared - sum(len(m) for m in self.request_marker))
        prefix, prefix_stored = self._shared_prefix(seqs[0][:shared], found,
                                                    None if restarts is None else restarts[0][:shared])
        p = len(prefix) if prefix is not None else 0
        cached = [0] * b

        # Each row: its own tokens after the prefix, from the store where it has them, encoded where not.
        own: list[list[tuple[Any, Any]]] = []
        first_logits = []
        row_sums: list[list[Any]] = []  # context gates: per row, per layer, the running sum after its prompt
        row_counts: list[int] = []  # context gates: per row, how many tokens those sums cover
        row_held: list[list[Any]] = []  # segment routing: per row, per layer, the open message's weights
        for i, (seq, (entry, k)) in enumerate(zip(seqs, found)):
            n = int(seq.numel())
            k = min(k, n - 1) if entry is not None else 0
            start = max(p, k)
            past = [entry.kv(li, p, start) for li in range(len(w.layers))] if start > p else \
                [(None, None)] * len(w.layers)
            new_kv, logits, sums, held, count = self._prefill(
                seq[start:], past, start, prefix, prefix.sums if prefix is not None else None,
                prefix.held if prefix is not None else None, prefix.count if prefix is not None else None,
                None if restarts is None else restarts[i][start:])
            if sums is not None:
                row_sums.append(sums)
                row_counts.append(count)
            if held is not None:
                row_held.append(held)
            own.append([(torch.cat([pk, nk], dim=1) if pk is not None else nk,
                         torch.cat([pv, nv], dim=1) if pv is not None else nv)
                        for (pk, pv), (nk, nv) in zip(past, new_kv)])
            first_logits.append(logits)
            cached[i] = prefix_stored + (start - p)

        # The batch's own-token cache, preallocated for the whole generation.
        lengths = torch.tensor([int(s.numel()) - p for s in seqs], device=dev)  # own tokens with k/v, per row
        width = int(lengths.max()) + max_new_tokens
        cache_k = [torch.zeros(b, w.kv_heads, width, w.head_dim, dtype=w.dtype, device=dev) for _ in w.layers]
        cache_v = [torch.zeros_like(c) for c in cache_k]
        for i, kv in enumerate(own):
            for li, (k_, v_) in enumerate(kv):
                cache_k[li][i, :, :k_.shape[1]] = k_
                cache_v[li][i, :, :v_.shape[1]] = v_
        del own
        # context gates: per layer [B, hidden], the running sums of each row, and how many tokens they cover
        # (lengths + p, or for request gates the tokens since the row's last request)
        ctx_sums = [torch.stack([r[li] for r in row_sums]) for li in range(len(w.layers))] if row_sums else None
        ctx_counts = torch.tensor(row_counts, dtype=torch.float32, device=dev) if row_sums else None
        # segment routing: per layer [B, K], each row's open message's gating weights (None for an unrouted layer)
        seg_held = [None if row_held[0][li] is None else torch.stack([r[li] for r in row_held])
                    for li in range(len(w.layers))] if row_held else None

        eos = torch.tensor(sorted(set(int(e) for e in eos_ids)), dtype=torch.long, device=dev)
        eos_set = set(eos.tolist())
        prompt_own = [int(s.numel()) - p for s in seqs]
        out_tokens: list[list[int]] = [[] for _ in range(b)]
        out_logp: list[list[float]] = [[] for _ in range(b)]
        rows = list(range(b))  # original row of each batch row
        finished = [False] * b  # per original row: produced a stop token
        logits = torch.stack(first_logits)
        g = w.heads // w.kv_heads
        cos_t, sin_t = self._rope_table(p + width)
        for step in range(max_new_tokens):
            tok, lp = self._choose(logits, temperature, top_k, top_p, generator)
            for r, t, l in zip(rows, tok.tolist(), lp.tolist()):
                if not finished[r]:
                    out_tokens[r].append(t)
                    out_logp[r].append(l)
                    finished[r] = t in eos_set
            live = [j for j, r in enumerate(rows) if not finished[r]]
            if not live or step == max_new_tokens - 1:
                break
            if len(live) <= 0.75 * len(rows):  # drop finished rows (their keys/values go to the store first)
                self._store_rows(seqs, prompt_own, out_tokens, prefix, cache_k, cache_v,
                                 [(j, r) for j, r in enumerate(rows) if finished[r]])
                keep = torch.tensor(live, dtype=torch.long, device=dev)
                rows = [rows[j] for j in live]
                lengths, tok = lengths[keep], tok[keep]
                if ctx_sums is not None:
                    ctx_sums = [c[keep] for c in ctx_sums]
                    ctx_counts = ctx_counts[keep]
                if seg_held is not None:
                    seg_held = [None if c is None else c[keep] for c in seg_held]
                cache_k = [c[keep] for c in cache_k]
                cache_v = [c[keep] for c in cache_v]
            # else finished rows keep decoding (nothing they produce is kept)
            pos = lengths + p  # position of the token being fed
            cos, sin = cos_t[pos], sin_t[pos]
            h = F.embedding(tok, w.embed)  # [B, hidden]
            nb = len(rows)
            ar = torch.arange(nb, device=dev)
            span = int(lengths.max()) + 1
            hidden = (torch.arange(span, device=dev)[None, :] > lengths[:, None])[:, None, None, :]  # [B, 1, 1, span]
            for li, layer in enumerate(w.layers):
                context = None
                if ctx_sums is not None:
                    context, ctx_sums[li] = self._context(layer, h[:, None], ctx_sums[li], ctx_counts)
                    context = context[:, 0]
                route = self._route(layer, h, context)
                if seg_held is not None and route is not None:  # a fed message start opens a new choice
                    route = torch.where((tok == self.segment_id)[:, None], route, seg_held[li])
                    seg_held[li] = route
                q, k, v = self._qkv(layer, h, cos, sin, route)  # [B, heads, D], [B, kv, D]
                cache_k[li][ar, :, lengths] = k
                cache_v[li][ar, :, lengths] = v
                qg = q.view(nb, w.kv_heads, g, w.head_dim)
                own_scores = torch.matmul(qg, cache_k[li][:, :, :span].transpose(2, 3))  # [B, kv, g, span]
                own_scores.masked_fill_(hidden, float("-inf"))
                if p:
                    q_by_kv = qg.transpose(0, 1).reshape(w.kv_heads, nb * g, w.head_dim)
                    pre_scores = torch.matmul(q_by_kv, prefix.keys[li].transpose(1, 2))  # [kv, B*g, P]
                    pre_scores = pre_scores.view(w.kv_heads, nb, g, p).transpose(0, 1)
                    probs = torch.softmax(torch.cat([pre_scores, own_scores], dim=-1).float(), dim=-1).to(w.dtype)
                    out = torch.matmul(probs[..., p:], cache_v[li][:, :, :span])  # [B, kv, g, D]
                    pre_probs = probs[..., :p].transpose(0, 1).reshape(w.kv_heads, nb * g, p)
                    out = out + torch.matmul(pre_probs, prefix.values[li]).view(w.kv_heads, nb, g, w.head_dim) \
                        .transpose(0, 1)
                else:
                    probs = torch.softmax(own_scores.float(), dim=-1).to(w.dtype)
                    out = torch.matmul(probs, cache_v[li][:, :, :span])
                h = self._mlp_out(layer, h, out.reshape(nb, w.heads * w.head_dim), route)
            lengths = lengths + 1
            if ctx_counts is not None:
                ctx_counts = ctx_counts + 1
            logits = self._logits(h)
        self._store_rows(seqs, prompt_own, out_tokens, prefix, cache_k, cache_v, list(enumerate(rows)))
        return [Generation(tokens=t, logprobs=l, cached_tokens=c) for t, l, c in zip(out_tokens, out_logp, cached)]

    def _shared_prefix(self, tokens, found, restarts=None) -> tuple[_Prefix | None, int]:
        """The batch's shared prefix — an entry's prefix when it covers ``tokens``, else encoded (over what the
        store has of it) — and how many of its tokens came from the store. ``restarts``: request gates' restart
        flags of ``tokens``."""
        import torch

        n = int(tokens.numel())
        if n == 0:
            return None, 0
        for entry, _ in found:
            if entry is not None and entry.prefix is not None and len(entry.prefix) == n and \
                    _common_length(entry.prefix.tokens, tokens) == n:
                return entry.prefix, n
        best, k = None, 0
        for entry, kk in found:
            if entry is not None and kk > k:
                best, k = entry, kk
        k = min(k, n)
        layers = range(len(self._weights.layers))
        if best is not None and k == n:
            kv = [best.kv(li, 0, n) for li in layers]
            return _Prefix(tokens=tokens.clone(), keys=[a.contiguous() for a, _ in kv],
                           values=[b.contiguous() for _, b in kv]), n
        # (A context-gated model's store is empty, so its prefix is always encoded here, with its running sums.)
        past = [best.kv(li, 0, k) for li in layers] if k else [(None, None)] * len(layers)
        new_kv, _, sums, held, count = self._prefill(tokens[k:], past, k, None,
                                                     restarts=None if restarts is None else restarts[k:])
        keys = [torch.cat([pk, nk], dim=1) if pk is not None else nk for (pk, _), (nk, _) in zip(past, new_kv)]
        values = [torch.cat([pv, nv], dim=1) if pv is not None else nv for (_, pv), (_, nv) in zip(past, new_kv)]
        return _Prefix(tokens=tokens.clone(), keys=keys, values=values, sums=sums, held=held, count=count), k

    def _store_rows(self, seqs, prompt_own, out_tokens, prefix, cache_k, cache_v, which) -> None:
        """Put the conversations of ``which`` ((batch row, original row) pairs) into the store: the prompt and the
        tokens fed after it (every generated token but the last, which was never fed), with their keys/values."""
        import torch

        if self.store.limit <= 0:
            return
        for j, r in which:
            fed = out_tokens[r][:-1]
            n_own = prompt_own[r] + len(fed)
            tokens = torch.cat([seqs[r], torch.tensor(fed, dtype=torch.long, device=seqs[r].device)])
            self.store.add(_Entry(tokens=tokens, prefix=prefix,
                                  tail_keys=[c[j, :, :n_own].clone() for c in cache_k],
                                  tail_values=[c[j, :, :n_own].clone() for c in cache_v]))


def _unit_rms(x):
    """``x`` scaled to unit root-mean-square over its last dimension (the composer's parameter-free ``_rms``)."""
    import torch

    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
