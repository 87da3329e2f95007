"""A hand-set copy circuit for the tiny offline model.

Agents in τ²-style targets spend most of their tool-call tokens copying: the user id from the
user's message into ``get_user_details``, a reservation id or a flight number into the next call,
a status word from a tool result into the answer. Transformers copy with *induction heads*: a
previous-token head in one layer, and a head in the next layer that attends to the token that
followed an earlier occurrence of the current context, and writes it to the output. A 1 M-parameter
model trained for 20 CPU minutes never forms them (measured: ``bench/bootstrap_curve.py`` stayed at
0% success, every id in the calls a memorised one). So the ``tiny`` preset is built with the
circuit already in its weights — still a standard Qwen3 checkpoint, loadable anywhere — and SFT
then only has to learn *when* to copy, which it does in minutes.

The residual stream (``hidden_size = 4 * token_dim + 2 + free_dims``) is split into named subspaces:

====== ========================================================================================
``A``  the current token's identity (the random part of its embedding, ``token_dim`` wide)
``B``  the previous token's identity, written by layer 0 head 0
``C``  the identity of the token two back, written by layer 0 head 1
``D``  the copied token, written by layer 1; the LM head reads it back (``lm_head[t, D] = A(t)``)
const  a constant: the positional heads' queries and keys are built from it
sink   set only on ``<|im_start|>``: the "nothing to copy" key of layer 1 head 0
free   learned features (small random init); everything SFT needs besides copying
====== ========================================================================================

Layer 0 (positional heads): query and key come from the constant dimension only, so after Qwen3's
per-head RMSNorm they are the same vector at every position; RoPE then makes their dot product a
sum of cosines ``Σ_i cos(θ_i (m - n - s))`` over the ``positional_pairs`` fastest-rotating pairs,
peaked at offset ``s``. Head 0 uses ``s = 1``, head 1 ``s = 2``; both copy ``A`` of the position
they attend to into ``B`` and ``C``.

Layer 1 head 0 (induction): query ``[A, λ·B]`` at position *i*, key ``[B, C]`` at *j*, in RoPE pairs
that barely rotate over the context (``rope_theta`` is huge, so pairs from ``content_start_pair``
on turn less than a tenth of a radian over 8k tokens). The score is high where ``token[j-1]`` is
the current token and ``token[j-2]`` the one before it: the position right after an earlier
occurrence of the last two tokens. Its value is ``A`` of that position, written to ``D``. The
``sink`` key gives ``<|im_start|>`` positions a middling score, so a context seen nowhere before
copies nothing. Layer 1 head 1 has the same copying value but a learned query/key: SFT teaches it
which token starts a copy (the token after "user id is", after "flight", ...), which induction
alone cannot find.

The MLPs start with a zero output projection (they add nothing until trained). Every weight is a
trainable parameter; :func:`circuit_gradient_masks` names the ones a training run may hold fixed (the
SFT warm-up holds the positional part by default: ``BootstrapConfig.freeze_circuit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

SINK_TOKENS = ("<|im_start|>",)


@dataclass(frozen=True)
class CopyCircuit:
    """Layout of the copy circuit in a Qwen3 model (see the module docstring).

    Attributes:
        token_dim: width of each token-identity subspace (``A``, ``B``, ``C``, ``D``). Wider gives
            cleaner copies (random token vectors overlap less) at more compute.
        free_dims: learned residual dimensions besides the circuit.
        positional_pairs: RoPE pairs (the fastest) that the previous-token heads use.
        content_start_pair: first RoPE pair of the induction head's query/key; pairs from here to
            ``head_dim / 2`` must rotate little over the context (check with :meth:`max_content_angle`).
        positional_gain: q/k norm weight on the positional pairs (sharpness of the offset peak).
        content_gain: q/k norm weight on the content pairs (sharpness of the induction match).
        prev_weight: weight ``λ`` of the token-before match relative to the current-token match.
        sink_weight: key weight of the sink dimension (score of "nothing to copy").
        learned_head_gain: output scale of layer 1 head 1 relative to the induction head.
    """

    token_dim: int = 32
    free_dims: int = 62
    positional_pairs: int = 6
    content_start_pair: int = 7
    positional_gain: float = 4.0
    content_gain: float = 3.0
    prev_weight: float = 0.6
    sink_weight: float = 0.8
    learned_head_gain: float = 0.5

    @property
    def hidden_size(self) -> int:
        return 4 * self.token_dim + 2 + self.free_dims

    def min_head_dim(self) -> int:
        """Smallest head width that fits the positional and content pairs."""
        content_pairs = -(-(2 * self.token_dim + 1) // 2)
        return 2 * (self.content_start_pair + content_pairs)

    def max_content_angle(self, head_dim: int, rope_theta: float, context: int) -> float:
        """Largest RoPE angle (radians) a content pair turns through over ``context`` tokens."""
        return context * rope_theta ** (-2 * self.content_start_pair / head_dim)

    def check(self, config: Any) -> None:
        """Raise ``ValueError`` if a Qwen3 ``config`` cannot hold this circuit."""
        problems = []
        if config.hidden_size != self.hidden_size:
            problems.append(f"hidden_size must be 4*token_dim + 2 + free_dims = {self.hidden_size}")
        if config.num_hidden_layers < 2:
            problems.append("needs at least 2 layers")
        if config.num_attention_heads != 2 or config.num_key_value_heads != 2:
            problems.append("needs 2 query heads and 2 key/value heads per layer")
        if config.head_dim < self.min_head_dim():
            problems.append(f"head_dim must be >= {self.min_head_dim()}")
        if getattr(config, "tie_word_embeddings", False):
            problems.append("the LM head must be untied (it reads the copy subspace D, not A)")
        if self.positional_pairs > self.content_start_pair:
            problems.append("positional pairs overlap the content pairs")
        theta = (getattr(config, "rope_parameters", None) or {}).get("rope_theta") or getattr(config, "rope_theta")
        angle = self.max_content_angle(config.head_dim, theta, config.max_position_embeddings)
        if angle > 0.5:
            problems.append(f"rope_theta too small: content pairs turn {angle:.2f} rad over "
                            f"{config.max_position_embeddings} tokens (want <= 0.5)")
        if problems:
            raise ValueError("copy circuit does not fit the model config: " + "; ".join(problems))


def install_copy_circuit(model: Any, tokenizer: Any, circuit: CopyCircuit, seed: int = 0) -> None:
    """Overwrite ``model``'s embedding, first two layers and LM head with the copy circuit.

    ``model`` is a freshly initialised ``Qwen3ForCausalLM`` whose config passes
    ``circuit.check``; layers beyond the first two keep their attention initialisation, and every
    MLP starts with a zero output projection.
    """
    import torch

    config = model.config
    circuit.check(config)
    d, hd = circuit.token_dim, config.head_dim
    half = hd // 2
    A, B, C, D = (slice(i * d, (i + 1) * d) for i in range(4))
    const, sink = 4 * d, 4 * d + 1
    free = slice(4 * d + 2, circuit.hidden_size)
    theta = config.rope_parameters["rope_theta"]
    inv_freq = [theta ** (-2 * i / hd) for i in range(half)]
    pairs = range(circuit.content_start_pair, half)
    content = list(pairs) + [i + half for i in pairs]
    q_a, q_b, q_sink = content[:d], content[d:2 * d], content[2 * d]
    # Vectors of norm sqrt(d) in A; the constant matches that norm so neither dominates the RMSNorms.
    kappa = math.sqrt(d)
    gen = torch.Generator().manual_seed(seed)
    eye = torch.eye(d)

    with torch.no_grad():
        emb = model.model.embed_tokens.weight
        emb.zero_()
        emb[:, A] = torch.randn(emb.shape[0], d, generator=gen)
        emb[:, const] = kappa
        emb[:, free] = 0.1 * torch.randn(emb.shape[0], circuit.free_dims, generator=gen)
        for token in SINK_TOKENS:
            tid = tokenizer.convert_tokens_to_ids(token)
            emb[tid, A] = 0.0  # a sink copies nothing
            emb[tid, sink] = kappa
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.zero_()

        # Layer 0: previous-token heads (offset 1 -> B, offset 2 -> C).
        attn = model.model.layers[0].self_attn
        for w in (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight, attn.o_proj.weight):
            w.zero_()
        # RMS of a layer-0 input (A plus the constant) over the hidden size: the value a unit
        # copy comes out with after the input RMSNorm, undone by the output projection.
        scale0 = math.sqrt((d + kappa ** 2) / circuit.hidden_size)
        for head, (offset, target) in enumerate(((1, B), (2, C))):
            rows = head * hd
            for i in range(circuit.positional_pairs):
                attn.k_proj.weight[rows + i, const] = 1.0
                attn.q_proj.weight[rows + i, const] = math.cos(inv_freq[i] * offset)
                attn.q_proj.weight[rows + i + half, const] = -math.sin(inv_freq[i] * offset)
            attn.v_proj.weight[rows:rows + d, A] = eye
            attn.o_proj.weight[target, rows:rows + d] = scale0 * eye
        gain = torch.ones(hd)
        gain[:circuit.positional_pairs] = circuit.positional_gain
        gain[half:half + circuit.positional_pairs] = circuit.positional_gain
        attn.q_norm.weight.copy_(gain)
        attn.k_norm.weight.copy_(gain)

        # Layer 1: induction head 0 and a learned-query copy head 1, both writing to D.
        attn = model.model.layers[1].self_attn
        for w in (attn.q_proj.weight[:hd], attn.k_proj.weight[:hd], attn.v_proj.weight, attn.o_proj.weight):
            w.zero_()
        for k in range(d):
            attn.q_proj.weight[q_a[k], A.start + k] = 1.0
            attn.q_proj.weight[q_b[k], B.start + k] = circuit.prev_weight
            attn.k_proj.weight[q_a[k], B.start + k] = 1.0
            attn.k_proj.weight[q_b[k], C.start + k] = 1.0
        attn.q_proj.weight[q_sink, const] = 1.0
        attn.k_proj.weight[q_sink, sink] = circuit.sink_weight
        gain = torch.ones(hd)
        gain[content] = circuit.content_gain
        attn.q_norm.weight.copy_(gain)
        attn.k_norm.weight.copy_(gain)
        scale1 = math.sqrt((3 * d + kappa ** 2) / circuit.hidden_size)
        for head, head_gain in ((0, 1.0), (1, circuit.learned_head_gain)):
            rows = head * hd
            attn.v_proj.weight[rows:rows + d, A] = eye
            attn.o_proj.weight[D, rows:rows + d] = scale1 * head_gain * eye

        head = model.lm_head.weight
        head.normal_(0.0, config.initializer_range, generator=gen)
        head[:, D] = emb[:, A]


def copy_accuracy(model: Any, sequences: Sequence[Sequence[int]]) -> float:
    """Share of induction-predictable positions the model predicts right (greedy, teacher-forced).

    A position is induction-predictable when its last two tokens occurred before and were then
    followed by the same token as now (e.g. the second half of a repeated random sequence, or the
    rest of an id being copied). A model with the copy circuit scores near 1 on repeated random
    tokens; a randomly initialised one near 0.
    """
    import torch

    hits = total = 0
    for ids in sequences:
        with torch.no_grad():
            pred = model(input_ids=torch.tensor([list(ids)], device=model.device)).logits[0].argmax(-1).tolist()
        follows: dict[tuple[int, int], int] = {}
        for i in range(1, len(ids) - 1):
            key = (ids[i - 1], ids[i])
            if follows.get(key) == ids[i + 1]:
                total += 1
                hits += int(pred[i] == ids[i + 1])
            follows[key] = ids[i + 1]
    return hits / total if total else float("nan")




#: What :func:`circuit_gradient_masks` can hold fixed: ``positional`` (layer 0 and the token
#: vectors), ``all`` (also the induction head), ``none``.
FREEZE_CHOICES = ("all", "positional", "none")


def circuit_gradient_masks(model: Any, circuit: CopyCircuit, freeze: str = "all") -> dict[str, Any]:
    """0/1 masks (by parameter name) over the circuit's weights: 0 = kept as built.

    ``freeze="positional"`` holds fixed layer 0's attention and input norm (the previous-token
    heads), the embedding outside the free dimensions (token identity, constant, sink), the LM
    head's readout of ``D``, and every write by layer 0's MLP outside the free dimensions (which
    would blur what the induction head matches). ``"all"`` also holds layer 1's input norm, its q/k
    norms and head 0 (the induction head); ``"none"`` holds nothing. Everything else trains: the
    free embedding dimensions, the MLPs, layer 1 head 1, the LM head's other columns, the final norm.
    Measured on the airline target: with nothing held, 250 SFT steps at lr 3e-3 took the circuit's
    copy accuracy on repeated random tokens from 0.97 to 0.61.
    """
    import torch

    if freeze not in FREEZE_CHOICES:
        raise ValueError(f"freeze must be one of {', '.join(FREEZE_CHOICES)}, got {freeze!r}")
    d, hd = circuit.token_dim, model.config.head_dim
    free = slice(4 * d + 2, circuit.hidden_size)
    params = dict(model.named_parameters())
    masks: dict[str, Any] = {}
    if freeze == "none":
        return masks

    def fixed(name: str):
        return masks.setdefault(name, torch.ones_like(params[name]))

    for name in params:
        if name.startswith("model.layers.0.self_attn.") or name == "model.layers.0.input_layernorm.weight":
            fixed(name).zero_()
    emb = fixed("model.embed_tokens.weight")
    emb.zero_()
    emb[:, free] = 1
    fixed("lm_head.weight")[:, 3 * d:4 * d] = 0
    fixed("model.layers.0.mlp.down_proj.weight")[:4 * d + 2] = 0
    if freeze == "all":
        for name in ("model.layers.1.input_layernorm.weight", "model.layers.1.self_attn.q_norm.weight",
                     "model.layers.1.self_attn.k_norm.weight"):
            fixed(name).zero_()
        for proj in ("q_proj", "k_proj", "v_proj"):
            fixed(f"model.layers.1.self_attn.{proj}.weight")[:hd] = 0
        fixed("model.layers.1.self_attn.o_proj.weight")[:, :hd] = 0
    return masks


def freeze_copy_circuit(model: Any, circuit: CopyCircuit, freeze: str = "all") -> list[Any]:
    """Keep (part of) the circuit's weights as built during training (gradient hooks; returns their handles).

    With an optimizer without weight decay (the bootstrap's AdamW uses none), a zero gradient leaves
    a weight exactly where it is.
    """
    params = dict(model.named_parameters())
    handles = []
    for name, mask in circuit_gradient_masks(model, circuit, freeze).items():
        mask = mask.to(params[name].device)
        handles.append(params[name].register_hook(lambda grad, mask=mask: grad * mask))
    return handles


def circuit_of(metadata: dict) -> CopyCircuit | None:
    """The circuit a model was built with, from its ``trace_model.json`` (None if none)."""
    spec = (metadata.get("config") or {}).get("copy_circuit")
    return CopyCircuit(**spec) if spec else None


__all__ = ["CopyCircuit", "install_copy_circuit", "copy_accuracy", "circuit_gradient_masks", "freeze_copy_circuit",
           "circuit_of", "FREEZE_CHOICES", "SINK_TOKENS"]
