"""The composed model: a frozen base, K frozen LoRA experts, and one small gate per transformer block.

Stage four of TRACE (docs/design.md "Composer", docs/design.md, "The method's settings"). Each block ``i`` gets a gate
``Linear(hidden, K + 1)`` with bias that reads the block's input hidden state (RMS-normalised, without
parameters, so its scale does not depend on depth or model); slot 0 is the base (no
adapter), slot ``k`` the k-th capability adapter. Its per-token choice applies to every adapted
projection of the block:

    out = W x + p_top · B_top A_top x            (top-1, multiplicative gating)

with ``p_top`` the chosen slot's softmax probability (top-k sums the k chosen slots, each scaled by its
own probability; choosing slot 0 adds nothing). With ``gate_weight="one"`` the chosen slots' probabilities are
renormalised to sum to 1 (top-1: ``p_top`` is 1 in the forward, its gradient still the probability's).
The base slot's bias starts at ``base_bias`` (5.0) and the gate weights near zero, so a fresh composed
model routes every token to the base and is the base.

What the gate reads (``gate_input``). ``"token"`` is the paper's gate: the block input at the token. On a
model as shallow as the tiny CPU presets that input carries the token and the few before it, not the task,
so a gate cannot tell a flight-status conversation from a cancellation (measured: docs/compose.md).
``"context"`` concatenates the causal mean of the block's (normalised) inputs over the sequence so far,
centred on the router data's mean context (:meth:`ComposedModel.fit_context_centers`): the choice is still
per token and top-1, but it can rest on what the conversation is about. The mean is exact
under a KV cache: each block keeps the running sum and count of its rows between the forwards of one
``generate`` (left padding excluded through the attention mask), so a context-gated model needs the whole
sequence from its first token in one generation (no prefix cache across calls; see :attr:`ComposedModel.stateful_routing`).
``"request"`` is ``"context"`` with the running mean restarted at every user message that is not a tool result (the
``<|im_start|>user`` that opens it; the ids are spec'd in ``compose.json``'s ``request_marker``): the gate reads the
request being served, not the whole conversation, so that a conversation whose second request needs another
adapter can switch (docs/compose.md, "Conversations that need two adapters").

The computation is sparse. A block's router turns its choices into one *dispatch* — the
(token, weight) assignments of every expert, sorted by expert into segments — and every adapted
projection of the block reuses it: one gather of the routed tokens, one pair of small matmuls per
expert segment, one ``index_add`` back. A token pays for its own adapter only, tokens sent to the base
pay nothing, and when every token goes to one expert (forced or per-episode routing) the gather is
skipped. ``mode="dense"`` computes every expert for every token and masks (the reference the tests
and ``bench/compose_speed.py`` compare against).

The model runs as the wrapped ``transformers`` model does — forward, ``generate``, caches — because
the routing lives in forward pre-hooks on the decoder blocks and in the replaced projections.

Segment routing (``routing="segment"``). The gates still score every token, but each token takes the choice
(slot and weight) its block's gate made at the first token of the chat message it belongs to (the
``<|im_start|>`` that opens it; before the first one, the sequence's first token): one decision per message
and block, held to its end, decoding included. On the tiny CPU models a per-token router that sends 8-17% of a
message's tokens to the other adapter lets the message drift into that adapter's words half-way (measured:
docs/compose.md); a message of one adapter cannot. The hold is state carried
between the forwards of one ``generate``, as the context gates' sums are.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable, Iterable, Iterator, Mapping, Sequence

import torch
from torch import nn

from .adapters import AdapterRef, ComposeError, block_of, check_same_base, extract_experts, folder_digest, \
    resolve_adapters

#: The file that marks a composed folder (what :class:`trace_train.agents.HFAgent` looks for).
COMPOSE_FILE = "compose.json"
GATES_FILE = "gates.safetensors"
FORMAT_VERSION = 1
#: How the gates' choices apply (:attr:`ComposedModel.routing`): ``token`` = each token its own choice (the paper's);
#: ``segment`` = the choice made at the first token of each chat message (``<|im_start|>``) held for the whole
#: message; ``per_episode`` = one adapter per episode, chosen by the gates from the first observation (a baseline);
#: ``per_task`` = one adapter per task chosen by the base (nearest trajectories or zero-shot), the TRACE authors'
#: routing (:class:`trace_train.compose.routers.PerTaskRouter`).
ROUTINGS = ("token", "segment", "per_episode", "per_task")
#: The routings that choose one adapter for a whole episode from its first observation.
EPISODE_ROUTINGS = ("per_episode", "per_task")
#: The routings of the gates themselves (``per_episode`` chooses without them).
GATE_ROUTINGS = ("token", "segment")
#: The token that opens a chat message (Qwen3's template, the tiny presets' too): where segment routing decides.
SEGMENT_TOKEN = "<|im_start|>"
#: What a gate reads: ``token`` = the block input at the token (the paper's gate, ``Linear(hidden, K + 1)``);
#: ``context`` = that and the causal mean of the block inputs so far (``Linear(2 · hidden, K + 1)``).
GATE_INPUTS = ("token", "context", "request")
#: The gate inputs that read a running mean of the block's inputs (and keep context centres).
CONTEXT_INPUTS = ("context", "request")
#: Where a ``request`` gate's running mean restarts: a user message (``<|im_start|>user`` and a newline), unless
#: its text opens with ``<tool_response>`` (a tool's result, which Qwen's chat template writes as a user message).
REQUEST_MARKER, TOOL_MARKER = "<|im_start|>user\n", "<tool_response>"
#: The forward weight of a chosen slot's update (``gate_weight``): ``prob`` = the gate's softmax probability (the
#: paper's multiplicative gating: a top-1 choice at p = 0.55 adds 55% of the adapter's update); ``one`` = the chosen
#: slots' probabilities renormalised to sum to 1 (top-1: the whole update, as the adapter alone would add it), with
#: the gradient of ``prob`` (straight-through), so that the next-token loss still trains the gates.
GATE_WEIGHTS = ("prob", "one")


@dataclass
class Dispatch:
    """One block's routing of the current forward's tokens, shared by all its adapted projections.

    Attributes:
        token_idx: flat token index of each assignment, sorted by expert (``None`` = all tokens in order).
        weights: gating weight of each assignment (``p`` of the chosen slot; 1.0 when forced).
        segments: ``(expert, start, end)`` over the sorted assignments, experts numbered from 0.
        dense: for a step of few tokens (decoding), the ``(tokens, K)`` gating weights instead of the
            sorted assignments: the projections then run every expert's stacked ``A`` and ``B`` as two
            matmuls and mask, since at a handful of tokens the cost is in the number of calls, not FLOPs.
    """

    token_idx: torch.Tensor | None
    weights: torch.Tensor | None
    segments: list[tuple[int, int, int]]
    dense: torch.Tensor | None = None
    _masks: dict | None = None

    def mask(self, ranks: tuple[int, ...]) -> torch.Tensor:
        """``dense`` spread over each expert's rank columns (cached per rank layout, shared in the block)."""
        if self._masks is None:
            self._masks = {}
        if ranks not in self._masks:
            reps = torch.tensor(ranks, device=self.dense.device)
            self._masks[ranks] = self.dense.repeat_interleave(reps, dim=1)
        return self._masks[ranks]


class BlockRouter:
    """The gate of one block and the dispatch it computed for the forward in progress.

    Not a module: the gate ``Linear`` is registered on :class:`ComposedModel` (``gates.<i>``), and the
    router is referenced by the block's :class:`RoutedLoRALinear` projections.
    """

    def __init__(self, gate: nn.Linear, index: int, owner: "ComposedModel") -> None:
        self.gate, self.index, self.owner = gate, index, owner
        self.dispatch: Dispatch | None = None
        self.logits: torch.Tensor | None = None  # (B, T, K+1), kept while owner.keep_logits
        self.choice: torch.Tensor | None = None  # (B, T) top-1 slot, kept while owner.keep_choices
        # Context gates: running (sum of normalised inputs, count, length) of each row of the sequence in progress.
        self.context_state: tuple[torch.Tensor, torch.Tensor, int] | None = None
        self.raw_context: torch.Tensor | None = None  # the uncentred context, kept while owner.capture_context
        self.raw_input: torch.Tensor | None = None  # what the gate read (B, T, width), kept while owner.capture_inputs
        # Segment routing: the (slots, weights, length) of each row's open message after the last forward.
        self.segment_state: tuple[torch.Tensor, torch.Tensor, int] | None = None

    def context(self, x: torch.Tensor, cache: Any) -> torch.Tensor:
        """The causal mean of the normalised block inputs up to each token (``x``: (B, T, hidden), normalised).

        A forward that starts a sequence (no cached tokens for this block) starts the running sums; one that
        continues it (decoding under a KV cache) adds to the sums it left. Padding (the model's attention mask,
        at the start of a sequence) does not count.
        """
        batch, seq = x.shape[:2]
        past = _past_length(cache, self.index)
        mask = self.owner.token_mask
        if past == 0:
            weight = x.new_ones(batch, seq)
            if mask is not None and tuple(mask.shape) == (batch, seq):
                weight = mask.to(device=x.device, dtype=x.dtype)
            total, count = x.new_zeros(batch, x.shape[-1]), x.new_zeros(batch)
        else:
            state = self.context_state
            if state is None or state[0].shape[0] != batch or state[2] != past:
                raise ComposeError("a context-gated composed model continued a sequence it did not start "
                                   f"({past} cached tokens, no running context for them): give it the whole "
                                   "sequence in one forward or generate (no prefix cache across calls)")
            weight = x.new_ones(batch, seq)
            total, count = state[0], state[1]
        sums = torch.cumsum(x * weight.unsqueeze(-1), dim=1) + total.unsqueeze(1)
        counts = torch.cumsum(weight, dim=1) + count.unsqueeze(1)
        if self.owner.gate_input == "request":  # restart the mean at each request (see request_starts)
            starts = self.owner.request_starts(batch, seq).to(x.device)
            positions = torch.arange(seq, device=x.device).expand(batch, seq)
            last = torch.where(starts, positions, torch.full_like(positions, -1)).cummax(dim=1).values
            index = last.clamp(min=0)
            before = sums - x * weight.unsqueeze(-1)  # the sums before each token
            before_n = counts - weight
            restarted = (last >= 0).unsqueeze(-1)
            sums = sums - torch.where(restarted, before.gather(1, index.unsqueeze(-1).expand_as(sums)),
                                      torch.zeros_like(sums))
            counts = counts - torch.where(restarted[..., 0], before_n.gather(1, index), torch.zeros_like(counts))
        self.context_state = (sums[:, -1].detach(), counts[:, -1].detach(), past + seq)
        # Centred on the mean context of the router's training data (ComposedModel.fit_context_centers): the means
        # of conversations that share a long system prompt differ little, and a gate learns the difference within
        # a few dozen steps only once the shared part is taken out (measured: docs/compose.md).
        mean = _rms(sums / counts.clamp(min=1.0).unsqueeze(-1))
        if self.owner.capture_context:
            self.raw_context = mean.detach()
        return _rms(mean - self.owner.context_centers[self.index].to(x.dtype))

    def gate_input(self, hidden: torch.Tensor, cache: Any = None) -> torch.Tensor:
        """What the gate reads at each token: the block input, and for context gates its centred causal mean."""
        # The gate reads the block's input RMS-normalised (no parameters): the residual stream's scale
        # grows with depth and differs between models, and a scale-free input gives every block's gate
        # the same effective learning rate.
        x = _rms(hidden.float())
        if self.owner.gate_input in CONTEXT_INPUTS:
            x = torch.cat([x, self.context(x, cache)], dim=-1)
        return x

    def hold(self, slots: torch.Tensor, weights: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Segment routing: each token's ``(slots, weights)`` (each ``(B, T, k)``) replaced by those chosen at the
        first token of its message (the last segment token at or before it). A forward that continues a sequence
        (decoding) carries the open message's choice over from the forward before."""
        owner = self.owner
        ids = owner.current_ids
        batch, seq = slots.shape[:2]
        if ids is None or tuple(ids.shape) != (batch, seq):
            raise ComposeError("segment routing needs the forward's input_ids (it decides at each message's first "
                               "token); inputs_embeds alone do not say where a message starts")
        past = _past_length(cache, self.index)
        starts = ids.to(slots.device) == owner.segment_token_id
        if past == 0:
            starts[:, 0] = True  # a sequence's first token opens its first segment
        positions = torch.arange(seq, device=slots.device).expand(batch, seq)
        last = torch.where(starts, positions, torch.full_like(positions, -1)).cummax(dim=1).values
        index = last.clamp(min=0).unsqueeze(-1).expand_as(slots)
        held_slots, held_weights = slots.gather(1, index), weights.gather(1, index)
        if past > 0:
            state = self.segment_state
            if state is None or state[0].shape[0] != batch or state[2] != past:
                raise ComposeError("a segment-routed composed model continued a sequence it did not start "
                                   f"({past} cached tokens, no open message for them): give it the whole "
                                   "sequence in one forward or generate (no prefix cache across calls)")
            carried = (last < 0).unsqueeze(-1)
            held_slots = torch.where(carried, state[0].unsqueeze(1), held_slots)
            held_weights = torch.where(carried, state[1].unsqueeze(1).to(held_weights.dtype), held_weights)
        self.segment_state = (held_slots[:, -1].detach(), held_weights[:, -1].detach(), past + seq)
        return held_slots, held_weights

    def route(self, hidden: torch.Tensor, cache: Any = None) -> None:
        owner = self.owner
        batch, seq = hidden.shape[:2]
        n = batch * seq
        forced = owner.forced
        if forced is not None:
            if owner.capture_inputs:  # what the gates would read under this routing (train.prefit_gates)
                self.raw_input = self.gate_input(hidden, cache).detach()
            slots = _forced_slots(forced, batch, seq, hidden.device)
            weights = torch.ones(n, 1, device=hidden.device, dtype=hidden.dtype)
            self.logits = None
            if owner.keep_choices:
                self.choice = slots.view(batch, seq)
            self.dispatch = _dispatch(slots.view(n, 1), weights, owner.num_experts, owner.small_step_tokens)
            return
        x = self.gate_input(hidden, cache)
        if owner.capture_inputs:
            self.raw_input = x.detach()
        logits = self.gate(x.to(self.gate.weight.dtype))
        self.logits = logits if owner.keep_logits else None
        probs = torch.softmax(logits.float(), dim=-1).to(hidden.dtype).reshape(n, -1)
        weights, slots = probs.topk(owner.top_k, dim=-1)
        if owner.gate_weight == "one":
            weights = (weights / weights.sum(-1, keepdim=True)).detach() + weights - weights.detach()
        if owner.spec.routing == "segment":
            slots, weights = self.hold(slots.view(batch, seq, -1), weights.view(batch, seq, -1), cache)
            slots, weights = slots.reshape(n, -1), weights.reshape(n, -1)
        if owner.keep_choices:
            self.choice = slots[:, 0].view(batch, seq).detach()
        self.dispatch = _dispatch(slots, weights, owner.num_experts, owner.small_step_tokens)


def _rms(x: torch.Tensor) -> torch.Tensor:
    """``x`` scaled to unit root-mean-square over its last dimension (no parameters)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def _past_length(cache: Any, index: int) -> int:
    """Tokens a KV cache already holds for block ``index`` (0 without a cache)."""
    if cache is None:
        return 0
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return int(layers[index].get_seq_length()) if index < len(layers) else 0
    return int(cache.get_seq_length(index))


def _forced_slots(forced: int | torch.Tensor, batch: int, seq: int, device) -> torch.Tensor:
    if isinstance(forced, int):
        return torch.full((batch * seq,), forced, dtype=torch.long, device=device)
    f = forced.to(device=device, dtype=torch.long)
    if f.dim() == 1:  # one slot per sequence, for every position (also every decoding step)
        if f.shape[0] != batch:
            raise ComposeError(f"forced routing has {f.shape[0]} rows for a batch of {batch}")
        return f.view(batch, 1).expand(batch, seq).reshape(-1)
    if tuple(f.shape) != (batch, seq):
        raise ComposeError(f"forced routing of shape {tuple(f.shape)} for tokens of shape {(batch, seq)}")
    return f.reshape(-1)


def _dispatch(slots: torch.Tensor, weights: torch.Tensor, num_experts: int, small_step: int = 0) -> Dispatch:
    """Sort the (token, slot) assignments by expert, dropping those sent to the base (slot 0).

    A step of at most ``small_step`` tokens gets the dense ``(tokens, K)`` weights instead (no sort,
    no host sync).
    """
    n, k = slots.shape
    if n <= small_step:
        dense = weights.new_zeros(n, num_experts + 1).scatter_add_(1, slots, weights)[:, 1:]
        return Dispatch(None, None, [], dense=dense)
    flat_slots = slots.reshape(-1)
    counts = torch.bincount(flat_slots, minlength=num_experts + 1).tolist()  # one host sync per block
    routed = n * k - counts[0]
    if routed == 0:
        return Dispatch(None, weights.new_zeros(0), [])
    if k == 1 and routed == n and max(counts[1:]) == n:  # every token to one expert: no gather
        expert = next(e for e, c in enumerate(counts[1:]) if c)
        return Dispatch(None, weights.reshape(-1), [(expert, 0, n)])
    order = torch.argsort(flat_slots, stable=True)[counts[0]:]
    token_idx = torch.div(order, k, rounding_mode="floor") if k > 1 else order
    segments, start = [], 0
    for e, c in enumerate(counts[1:]):
        if c:
            segments.append((e, start, start + c))
            start += c
    return Dispatch(token_idx, weights.reshape(-1)[order], segments)


class RoutedLoRALinear(nn.Module):
    """A frozen projection plus its K frozen LoRA experts, applied per token as its block's router says.

    ``lora_A_k`` is ``(r_k, in)`` and ``lora_B_k`` ``(out, r_k)`` with the adapter's ``alpha / r``
    folded in; both are buffers (never trained, moved with the module).
    """

    def __init__(self, base: nn.Linear, experts: list[tuple[torch.Tensor, torch.Tensor]], router: BlockRouter):
        super().__init__()
        self.base = base
        self.router = router
        self.num_experts = len(experts)
        for k, (a, b) in enumerate(experts):
            if a.shape[1] != base.in_features or b.shape[0] != base.out_features or a.shape[0] != b.shape[1]:
                raise ComposeError(f"expert {k}: LoRA shapes {tuple(a.shape)}, {tuple(b.shape)} do not fit a "
                                   f"Linear({base.in_features}, {base.out_features})")
            self.register_buffer(f"lora_A_{k}", a.to(base.weight.dtype), persistent=False)
            self.register_buffer(f"lora_B_{k}", b.to(base.weight.dtype), persistent=False)
        # Every expert stacked, for steps of few tokens (Dispatch.dense).
        self.ranks = tuple(int(a.shape[0]) for a, _ in experts)
        self.register_buffer("lora_A_all", torch.cat([a for a, _ in experts]).to(base.weight.dtype), persistent=False)
        self.register_buffer("lora_B_all", torch.cat([b for _, b in experts], dim=1).to(base.weight.dtype),
                             persistent=False)

    def expert(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        return getattr(self, f"lora_A_{k}"), getattr(self, f"lora_B_{k}")

    def expert_delta(self, x: torch.Tensor, k: int) -> torch.Tensor:
        a, b = self.expert(k)
        return (x @ a.t()) @ b.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.base(x)
        d = self.router.dispatch
        if d is None or (not d.segments and d.dense is None):
            return out
        flat = x.reshape(-1, x.shape[-1])
        if self.router.owner.mode == "dense":
            return out + self._dense(flat, d).view_as(out)
        # The gating weight scales the rank-r intermediate (r columns, not out_features).
        if d.dense is not None:  # a step of few tokens: stacked experts, masked
            h = (flat @ self.lora_A_all.t()) * d.mask(self.ranks).to(flat.dtype)
            return out + (h @ self.lora_B_all.t()).view_as(out)
        w = d.weights.to(flat.dtype).unsqueeze(-1)
        if d.token_idx is None:  # one expert for every token
            a, b = self.expert(d.segments[0][0])
            return out + (((flat @ a.t()) * w) @ b.t()).view_as(out)
        routed = flat.index_select(0, d.token_idx)
        flat_out = out.view(-1, out.shape[-1])
        if not torch.is_grad_enabled():  # inference: write each segment in place, add back in place
            delta = flat_out.new_empty(routed.shape[0], flat_out.shape[1])
            for k, s, e in d.segments:
                a, b = self.expert(k)
                torch.mm((routed[s:e] @ a.t()).mul_(w[s:e]), b.t(), out=delta[s:e])
            return flat_out.index_add_(0, d.token_idx, delta).view_as(out)
        parts = []
        for k, s, e in d.segments:
            a, b = self.expert(k)
            parts.append(((routed[s:e] @ a.t()) * w[s:e]) @ b.t())
        delta = parts[0] if len(parts) == 1 else torch.cat(parts)
        return flat_out.index_add(0, d.token_idx, delta.to(out.dtype)).view_as(out)

    def _dense(self, flat: torch.Tensor, d: Dispatch) -> torch.Tensor:
        """Every expert on every token, masked to the chosen ones (the dense reference)."""
        n = flat.shape[0]
        total = flat.new_zeros(n, self.base.out_features)
        idx = d.token_idx if d.token_idx is not None else torch.arange(n, device=flat.device)
        for k in range(self.num_experts):
            if d.dense is not None:
                w = d.dense[:, k].to(flat.dtype)
            else:
                w = flat.new_zeros(n)
                for e, s, t in d.segments:
                    if e == k:
                        w = w.index_add(0, idx[s:t], d.weights[s:t].to(flat.dtype))
            total = total + self.expert_delta(flat, k) * w.unsqueeze(-1)
        return total


@dataclass
class ComposeSpec:
    """What a composed folder's ``compose.json`` records (base, adapters with hashes, routing settings)."""

    base: str
    base_sha256: str
    adapters: list[dict]
    target_modules: list[str]
    top_k: int = 1
    base_bias: float = 5.0
    routing: str = "token"
    training: dict | None = None
    gate_input: str = "token"
    gate_weight: str = "prob"
    segment_token_id: int | None = None  # segment routing: the id of SEGMENT_TOKEN in the base's tokenizer
    request_marker: list | None = None  # request gates: [ids of REQUEST_MARKER, ids of TOOL_MARKER]
    task_routing: dict | None = None  # per-task routing: its settings (choice, neighbours, descriptions)

    def as_json(self) -> dict:
        extra = {"task_routing": self.task_routing} if self.task_routing is not None else {}
        if self.request_marker is not None:
            extra["request_marker"] = self.request_marker
        return {**extra, "format": "trace-compose", "version": FORMAT_VERSION, "base": self.base,
                "base_sha256": self.base_sha256, "adapters": self.adapters, "target_modules": self.target_modules,
                "top_k": self.top_k, "base_bias": self.base_bias, "routing": self.routing,
                "gate_input": self.gate_input, "gate_weight": self.gate_weight,
                "segment_token_id": self.segment_token_id, "training": self.training}


class ComposedModel(nn.Module):
    """A causal LM whose blocks route each token to the base or one of K LoRA experts.

    Build one with :meth:`build` (fresh gates) or :meth:`from_pretrained` (a folder written by
    :meth:`save_pretrained` or ``trace compose``). It is a ``torch.nn.Module``; ``forward`` and
    ``generate`` are the wrapped ``transformers`` model's, and other attributes (``config``,
    ``generation_config``, ``device`` …) are read from it. Only :meth:`gate_parameters` train.

    Attributes:
        top_k: slots each token is sent to (1 = the paper's top-1; 2 or 4 for the ablation).
        mode: ``"sparse"`` (grouped per expert, the default) or ``"dense"`` (every expert, masked).
        small_step_tokens: forwards of at most this many tokens (decoding steps) run the experts stacked
            and masked — two matmuls instead of a pair per expert — since there the number of calls,
            not FLOPs, is the cost (0 = always grouped).
        forced: ``None`` (the gates decide), a slot for every token, a ``(batch,)`` slot per sequence,
            or a ``(batch, seq)`` slot per token; set it with :meth:`force_routing`.
    """

    def __init__(self, model: nn.Module, experts: Mapping[str, list[tuple[torch.Tensor, torch.Tensor]]],
                 spec: ComposeSpec, adapter_names: list[str]) -> None:
        super().__init__()
        if spec.top_k < 1 or spec.top_k > len(adapter_names) + 1:
            raise ComposeError(f"top_k={spec.top_k} must be between 1 and K + 1 = {len(adapter_names) + 1}")
        if spec.gate_input not in GATE_INPUTS:
            raise ComposeError(f"gate_input must be one of {', '.join(GATE_INPUTS)}, got {spec.gate_input!r}")
        if spec.gate_weight not in GATE_WEIGHTS:
            raise ComposeError(f"gate_weight must be one of {', '.join(GATE_WEIGHTS)}, got {spec.gate_weight!r}")
        self.model = model
        self.spec = spec
        self.adapter_names = list(adapter_names)
        self.num_experts = len(adapter_names)
        self.top_k = spec.top_k
        self.mode = "sparse"
        self.forced: int | torch.Tensor | None = None
        self.keep_logits = False
        self.keep_choices = False
        self.small_step_tokens = 16
        self.token_mask: torch.Tensor | None = None  # the attention mask of the forward/generate in progress
        self.capture_context = False  # keep each block's uncentred context (fit_context_centers)
        self.capture_inputs = False  # keep each block's gate input (gate_inputs)
        self.current_ids: torch.Tensor | None = None  # the token ids of the forward in progress (segment routing)
        for p in model.parameters():
            p.requires_grad_(False)
        blocks = _decoder_layers(model)
        hidden = model.config.hidden_size
        dtype = next(model.parameters()).dtype
        width = hidden * (2 if spec.gate_input in CONTEXT_INPUTS else 1)
        if spec.gate_input == "request" and spec.request_marker is None:
            spec.request_marker = request_marker(spec.base)
        self.gates = nn.ModuleList(nn.Linear(width, self.num_experts + 1, bias=True, dtype=dtype)
                                   for _ in blocks)
        self.reset_gates(spec.base_bias)
        # Context gates: per block, the mean context of the router's training data (zeros until fitted).
        self.register_buffer("context_centers", torch.zeros(len(blocks), hidden, dtype=torch.float32))
        self.routers = [BlockRouter(g, i, self) for i, g in enumerate(self.gates)]
        self._hooks = []
        for i, block in enumerate(blocks):
            self._hooks.append(block.register_forward_pre_hook(self._make_hook(self.routers[i]), with_kwargs=True))
            # The dispatch lives for one block forward (it would otherwise keep the last graph alive).
            self._hooks.append(block.register_forward_hook(
                lambda module, args, out, router=self.routers[i]: setattr(router, "dispatch", None)))
        # Segment routing decides where a message starts, which the blocks' hidden states do not say: the ids of
        # each forward (generate's decoding steps included) are read where they enter the embedding.
        self._hooks.append(model.get_input_embeddings().register_forward_pre_hook(self._ids_hook))
        for name, pairs in experts.items():
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            base_linear = getattr(parent, attr)
            if not isinstance(base_linear, nn.Linear):
                raise ComposeError(f"{name} is a {type(base_linear).__name__}; only Linear projections can be routed")
            setattr(parent, attr, RoutedLoRALinear(base_linear, pairs, self.routers[block_of(name)]))

    def request_starts(self, batch: int, seq: int) -> torch.Tensor:
        """``(batch, seq)``: True at the first token of each user message of the forward in progress that is not a
        tool's result (where a ``request`` gate's running mean restarts). A marker is seen only whole within one
        forward: decoding steps (the model's own tokens) never open a user message."""
        ids = self.current_ids
        if ids is None or tuple(ids.shape) != (batch, seq):
            raise ComposeError("request gates need the forward's input_ids (they restart at each user message); "
                               "inputs_embeds alone do not say where a message starts")
        return request_start_flags(ids, self.spec.request_marker)

    def _ids_hook(self, module, args) -> None:
        ids = args[0] if args else None
        self.current_ids = ids if isinstance(ids, torch.Tensor) and not ids.is_floating_point() else None

    @staticmethod
    def _make_hook(router: BlockRouter):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            cache = kwargs.get("cache", kwargs.get("past_key_values", kwargs.get("past_key_value")))
            router.route(hidden, cache)
        return hook

    # ------------------------------------------------------------------ construction and persistence
    @classmethod
    def build(cls, base: str | Path, adapters: Mapping[str, Any] | Iterable[Any], top_k: int = 1,
              base_bias: float = 5.0, dtype: torch.dtype = torch.float32, device: str = "cpu",
              gate_input: str = "token", gate_weight: str = "prob") -> "ComposedModel":
        """A composed model with fresh gates (it starts as the base model).

        Args:
            base: the base model folder the adapters were trained on.
            adapters: K PEFT LoRA adapter folders (or ``name=folder`` strings, or a ``{name: folder}`` dict).
            top_k: slots per token (1, 2 or 4 in the paper's ablation).
            base_bias: initial bias of the base slot (5.0 → p_base ≈ 0.97 with near-zero gate weights).
            gate_input: ``"token"`` (the block input at the token), ``"context"`` (and the causal mean of the
                block inputs so far) or ``"request"`` (that mean since the last user request); see the module
                docstring.
            gate_weight: the forward weight of a chosen slot's update: ``"prob"`` (its gate probability, the
                paper's) or ``"one"`` (renormalised over the chosen slots, straight-through); see :data:`GATE_WEIGHTS`.
            dtype, device: of the loaded model.
        """
        from transformers import AutoModelForCausalLM

        base = Path(base)
        if not (base / "config.json").is_file():
            raise ComposeError(f"{base} is not a model folder (no config.json)")
        refs = resolve_adapters(adapters)
        base_digest = folder_digest(base)
        check_same_base(base, base_digest, refs)
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=dtype)
        plain, experts = extract_experts(model, refs)
        spec = ComposeSpec(base=str(base.resolve()), base_sha256=base_digest, adapters=[r.as_json() for r in refs],
                           target_modules=sorted({n.rpartition(".")[2] for n in experts}), top_k=top_k,
                           base_bias=base_bias, gate_input=gate_input, gate_weight=gate_weight)
        return cls(plain, experts, spec, [r.name for r in refs]).to(device).eval()

    def save_pretrained(self, out: str | Path, tokenizer: Any = None) -> Path:
        """Write ``compose.json`` (base and adapters by path and SHA-256), the gates, and the tokenizer."""
        from safetensors.torch import save_file

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {f"gates.{i}.{k}": v.detach().cpu().contiguous() for i, g in enumerate(self.gates)
                   for k, v in g.state_dict().items()}
        if self.gate_input in CONTEXT_INPUTS:
            tensors["context_centers"] = self.context_centers.detach().cpu().contiguous()
        save_file(tensors, str(out / GATES_FILE))
        spec = self.spec.as_json()
        spec["top_k"] = self.top_k
        spec["gate_parameters"] = self.gate_parameter_count()
        (out / COMPOSE_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.spec.base)
        tokenizer.save_pretrained(out)
        if getattr(self.model, "generation_config", None) is not None:
            self.model.generation_config.save_pretrained(out)
        # A base built here records the env kwargs it was trained with (trace_model.json, e.g. the compact
        # prompt); rollouts of the composed folder must use the same ones.
        meta = Path(self.spec.base) / "trace_model.json"
        if meta.is_file():
            shutil.copyfile(meta, out / "trace_model.json")
        return out

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32,
                        check_hashes: bool = True, top_k: int | None = None,
                        routing: str | None = None, gate_weight: str | None = None) -> "ComposedModel":
        """Load a composed folder: the base and adapters it references (hash-checked), then its gates.

        Args:
            path: a folder holding ``compose.json`` and ``gates.safetensors``.
            check_hashes: refuse a base or adapter whose files changed since composing (recommended).
            top_k: override the saved top-k (e.g. to evaluate a top-1-trained router at top-2).
            routing: override the saved routing (one of :data:`ROUTINGS`).
            gate_weight: override the saved forward weight of a chosen slot (``"prob"`` or ``"one"``; folders
                written before the setting existed are ``"prob"``).
        """
        from safetensors.torch import load_file

        path = Path(path)
        spec_file = path / COMPOSE_FILE
        if not spec_file.is_file():
            raise ComposeError(f"{path} is not a composed model folder (no {COMPOSE_FILE}); write one with "
                               "`trace compose` or ComposedModel.save_pretrained")
        raw = json.loads(spec_file.read_text())
        if raw.get("format") != "trace-compose" or raw.get("version", 0) > FORMAT_VERSION:
            raise ComposeError(f"{spec_file}: not a compose.json this version of TRACE reads "
                               f"(format {raw.get('format')!r}, version {raw.get('version')!r})")
        for what, folder, digest in [("base", raw["base"], raw["base_sha256"])] + [
                (f"adapter {a['name']!r}", a["path"], a["sha256"]) for a in raw["adapters"]]:
            if not Path(folder).is_dir():
                raise ComposeError(f"{path}: its {what} {folder} is missing; restore it or compose again")
            if check_hashes and folder_digest(folder) != digest:
                raise ComposeError(f"{path}: the {what} at {folder} changed since composing (SHA-256 differs); "
                                   "compose again, or load with check_hashes=False at your own risk")
        model = cls.build(raw["base"], {a["name"]: a["path"] for a in raw["adapters"]},
                          top_k=top_k or raw["top_k"], base_bias=raw["base_bias"], dtype=dtype, device=device,
                          gate_input=raw.get("gate_input", "token"),
                          gate_weight=gate_weight or raw.get("gate_weight", "prob"))
        model.spec.training = raw.get("training")
        model.spec.segment_token_id = raw.get("segment_token_id")
        if raw.get("request_marker") is not None:
            model.spec.request_marker = raw["request_marker"]
        model.spec.task_routing = raw.get("task_routing")
        model.routing = routing or raw.get("routing", "token")
        from .routers import TASK_INDEX_FILE

        if (path / TASK_INDEX_FILE).is_file():  # per-task routing's retrieval index
            model.__dict__["task_index"] = load_file(str(path / TASK_INDEX_FILE))
        state = load_file(str(path / GATES_FILE))
        expected = {f"gates.{i}.{k}" for i, g in enumerate(model.gates) for k in g.state_dict()}
        if model.gate_input in CONTEXT_INPUTS:
            expected.add("context_centers")
        if set(state) != expected:
            raise ComposeError(f"{path / GATES_FILE} holds gates for another model ({len(state)} tensors, "
                               f"{len(expected)} expected)")
        with torch.no_grad():
            for i, g in enumerate(model.gates):
                g.weight.copy_(state[f"gates.{i}.weight"])
                g.bias.copy_(state[f"gates.{i}.bias"])
            if "context_centers" in state:
                model.context_centers.copy_(state["context_centers"])
        model.config._name_or_path = str(path)
        return model

    # ------------------------------------------------------------------ use
    def forward(self, *args, **kwargs):
        with self._episode_routing(args, kwargs), self._token_mask(kwargs):
            return self.model(*args, **kwargs)

    def generate(self, *args, **kwargs):
        with self._episode_routing(args, kwargs), self._token_mask(kwargs):
            return self.model.generate(*args, **kwargs)

    @property
    def gate_input(self) -> str:
        """What the gates read: ``"token"``, ``"context"`` or ``"request"`` (see the module docstring)."""
        return self.spec.gate_input

    @property
    def stateful_routing(self) -> bool:
        """True when routing depends on earlier tokens of the sequence (context gates, segment routing): such a model must
        see a sequence from its first token within one ``forward``/``generate`` (callers turn their prefix
        caches off)."""
        if self.forced is not None:
            return False
        return self.spec.routing == "segment" or (self.spec.gate_input in CONTEXT_INPUTS
                                                  and self.spec.routing == "token")

    @contextlib.contextmanager
    def _token_mask(self, kwargs) -> Iterator[None]:
        """Expose the call's 2-D attention mask to the context gates (left padding must not count)."""
        mask = kwargs.get("attention_mask")
        previous = self.token_mask
        self.token_mask = mask if isinstance(mask, torch.Tensor) and mask.dim() == 2 else None
        try:
            yield
        finally:
            self.token_mask = previous

    @property
    def gate_weight(self) -> str:
        """The forward weight of a chosen slot's update: ``"prob"`` or ``"one"`` (:data:`GATE_WEIGHTS`)."""
        return self.spec.gate_weight

    @property
    def routing(self) -> str:
        """``"token"`` (the gates route every token), ``"segment"`` (per message), ``"per_episode"`` or
        ``"per_task"`` (one adapter per episode: :data:`EPISODE_ROUTINGS`)."""
        return self.spec.routing

    @routing.setter
    def routing(self, value: str) -> None:
        if value not in ROUTINGS:
            raise ComposeError(f"routing must be one of {', '.join(ROUTINGS)}, got {value!r}")
        if value == "segment" and self.spec.segment_token_id is None:
            self.spec.segment_token_id = segment_token_id(self.spec.base)
        self.spec.routing = value

    @property
    def segment_token_id(self) -> int | None:
        """The id of :data:`SEGMENT_TOKEN` (where segment routing decides); None until segment routing is set."""
        return self.spec.segment_token_id

    def episode_router(self):
        """The router of a routing in :data:`EPISODE_ROUTINGS`: :class:`~trace_train.compose.PerEpisodeRouter`
        (``per_episode``) or :class:`~trace_train.compose.routers.PerTaskRouter` (``per_task``)."""
        kept = self.__dict__.get("_episode_router")
        if kept is None or kept[0] != self.spec.routing:
            from .baselines import PerEpisodeRouter
            from .routers import PerTaskRouter

            cls = PerTaskRouter if self.spec.routing == "per_task" else PerEpisodeRouter
            kept = self.__dict__["_episode_router"] = (self.spec.routing, cls.for_model(self))
        return kept[1]

    def prefix_scope(self, tokens: Sequence[int]) -> Hashable:
        """Which cached keys/values a sequence may reuse: only those computed for a sequence of the same scope.

        Token routing depends on a sequence's tokens up to each position, so a shared prefix has the same
        keys/values in every sequence (scope ``None``). Per-episode routing sends every token, the system prompt
        included, through the adapter chosen from the first user message, which comes *after* the prefix that
        conversations share: two episodes with the same system prompt but different adapters have different
        keys/values for it. Their scope is the chosen slot, so a prefix cache (:class:`trace_train.agents.HFAgent`)
        never hands one episode's keys/values to an episode of another adapter.
        """
        if self.spec.routing not in EPISODE_ROUTINGS or self.forced is not None:
            return None
        return self.episode_router().slot_for(list(tokens))

    def _episode_routing(self, args, kwargs):
        if self.spec.routing not in EPISODE_ROUTINGS or self.forced is not None:
            return contextlib.nullcontext()
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            raise ComposeError("per-episode routing needs input_ids (the first observation decides the adapter)")
        return self.force_routing(self.episode_router().choose(ids, kwargs.get("attention_mask")))

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if name == "model" or "model" not in modules:
                raise
            return getattr(modules["model"], name)

    def reset_gates(self, base_bias: float = 5.0, std: float = 1e-3, seed: int = 0) -> None:
        """Near-zero gate weights and a base-slot bias of ``base_bias``: every token starts on the base."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for g in self.gates:
                g.weight.copy_(torch.randn(g.weight.shape, generator=gen) * std)
                g.bias.zero_()
                g.bias[0] = base_bias

    @torch.no_grad()
    def fit_context_centers(self, sequences: Iterable[Iterable[int]]) -> None:
        """Set each block's context centre to the mean of its running-mean context over every token of
        ``sequences`` (token id lists: the router's training episodes), read with the gates as they are.
        A statistic of the data, not a trained parameter; a no-op for token gates."""
        if self.gate_input not in CONTEXT_INPUTS:
            return
        device = self.context_centers.device
        sums = torch.zeros_like(self.context_centers)
        count = 0
        self.capture_context = True
        try:
            for ids in sequences:
                ids = list(ids)
                if not ids:
                    continue
                with self.force_routing(None):  # the gates route (forced routing computes no context)
                    self(input_ids=torch.tensor([ids], device=device), use_cache=False)
                for router in self.routers:
                    sums[router.index] += router.raw_context[0].float().sum(0)
                count += len(ids)
        finally:
            self.capture_context = False
            for router in self.routers:
                router.raw_context = None
        if count:
            self.context_centers.copy_(sums / count)

    @torch.no_grad()
    def gate_inputs(self, ids: Sequence[int], slot: int | None) -> list[torch.Tensor]:
        """What each block's gate reads at every token of ``ids`` (one ``(T, width)`` tensor per block) while the
        sequence is routed to ``slot`` (``None``: by the gates as they are). Context gates use the fitted centres."""
        device = self.context_centers.device
        self.capture_inputs = True
        try:
            with self.force_routing(slot):
                self(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
            return [router.raw_input[0].float() for router in self.routers]
        finally:
            self.capture_inputs = False
            for router in self.routers:
                router.raw_input = None

    def gate_parameters(self) -> list[nn.Parameter]:
        return [p for g in self.gates for p in g.parameters()]

    def gate_parameter_count(self) -> int:
        return sum(p.numel() for p in self.gate_parameters())

    def train(self, mode: bool = True) -> "ComposedModel":
        """Train mode for the gates only: the frozen base keeps eval behaviour (no dropout)."""
        super().train(mode)
        self.model.eval()
        return self

    @contextlib.contextmanager
    def force_routing(self, slots: int | torch.Tensor | Iterable[int] | None) -> Iterator[None]:
        """Route as told instead of by the gates, with weight 1 (slot k = exactly base + adapter k).

        ``slots``: one slot for all tokens, a ``(batch,)`` tensor (per sequence, also while generating)
        or a ``(batch, seq)`` tensor (per token); ``None`` gives the decision back to the gates.
        """
        if slots is not None and not isinstance(slots, (int, torch.Tensor)):
            slots = torch.tensor(list(slots), dtype=torch.long)
        if isinstance(slots, torch.Tensor) and (slots.min() < 0 or slots.max() > self.num_experts):
            raise ComposeError(f"forced slots must be in 0..{self.num_experts}")
        if isinstance(slots, int) and not 0 <= slots <= self.num_experts:
            raise ComposeError(f"forced slot {slots} is not in 0..{self.num_experts}")
        previous, self.forced = self.forced, slots
        try:
            yield
        finally:
            self.forced = previous

    @contextlib.contextmanager
    def recording(self, logits: bool = False, choices: bool = True) -> Iterator[list[BlockRouter]]:
        """Keep each block's gate logits (for losses) and/or top-1 choices (for routing statistics)."""
        prev = self.keep_logits, self.keep_choices
        self.keep_logits, self.keep_choices = logits, choices
        try:
            yield self.routers
        finally:
            self.keep_logits, self.keep_choices = prev
            for r in self.routers:
                r.logits = r.choice = None

    def slot_names(self) -> list[str]:
        return ["base"] + self.adapter_names


def segment_token_id(base: str | Path) -> int:
    """The id of :data:`SEGMENT_TOKEN` in the tokenizer of the model folder ``base``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    tid = tokenizer.convert_tokens_to_ids(SEGMENT_TOKEN)
    if not isinstance(tid, int) or tid == tokenizer.unk_token_id:
        raise ComposeError(f"segment routing decides at {SEGMENT_TOKEN}, which the tokenizer of {base} does not "
                           "have as one token (a chat template of another family); use routing 'token'")
    return tid


def request_start_flags(ids: torch.Tensor, marker_ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """``ids (batch, seq)`` -> bool ``(batch, seq)``: True at the first token of each :data:`REQUEST_MARKER` in
    ``ids`` that the :data:`TOOL_MARKER` does not follow (a user message that is a request, not a tool's result).
    ``marker_ids``: ``[marker ids, tool marker ids]`` (:func:`request_marker`). Shared by the composed model's
    forward and the fast decode loop, so that both restart a request gate at the same tokens."""
    marker, tool = (torch.tensor(list(m), dtype=ids.dtype, device=ids.device) for m in marker_ids)
    batch, seq = ids.shape
    n, t = len(marker), len(tool)
    starts = torch.zeros(batch, seq, dtype=torch.bool, device=ids.device)
    if seq < n:
        return starts
    hit = (ids.unfold(1, n, 1) == marker).all(-1)  # (batch, seq - n + 1)
    if t and seq >= n + t:
        is_tool = (ids[:, n:].unfold(1, t, 1) == tool).all(-1)  # the tokens right after each marker
        hit[:, :is_tool.shape[1]] &= ~is_tool
    starts[:, :hit.shape[1]] = hit
    return starts


def request_marker(base: str | Path) -> list[list[int]]:
    """The ids of :data:`REQUEST_MARKER` and :data:`TOOL_MARKER` in the tokenizer of the model folder ``base``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(base))
    marker = tokenizer(REQUEST_MARKER, add_special_tokens=False)["input_ids"]
    if not marker or marker[0] != tokenizer.convert_tokens_to_ids(SEGMENT_TOKEN):
        raise ComposeError(f"request gates restart at {REQUEST_MARKER!r}, which the tokenizer of {base} does not "
                           "open with <|im_start|> (a chat template of another family); use gate_input 'context'")
    return [list(marker), list(tokenizer(TOOL_MARKER, add_special_tokens=False)["input_ids"])]


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ComposeError(f"{type(model).__name__} has no model.layers; the composer supports decoder-only "
                           "transformers laid out like Qwen3 / Llama (model.model.layers)")
    return layers


def is_composed_dir(path: str | Path) -> bool:
    """True for a folder written by ``trace compose``: a composed model (``compose.json``) or an Arrow folder
    (``arrow.json``); :func:`trace_train.compose.load.load_composed` loads either."""
    from .routers import ARROW_FILE

    return (Path(path) / COMPOSE_FILE).is_file() or (Path(path) / ARROW_FILE).is_file()


__all__ = ["ComposedModel", "ComposeSpec", "RoutedLoRALinear", "BlockRouter", "Dispatch", "AdapterRef",
           "is_composed_dir", "COMPOSE_FILE", "EPISODE_ROUTINGS", "GATE_INPUTS", "ROUTINGS", "SEGMENT_TOKEN"]
