"""The tiny model's size presets (:data:`PRESETS`), read by the build and by the tokenizer.

A module of their own so that :mod:`trace_train.tiny.tokenizer` reads the presets without importing
:mod:`trace_train.tiny.build`, which imports the tokenizer (one direction, no cycle).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .copy_circuit import CopyCircuit


@dataclass(frozen=True)
class ModelPreset:
    """Size of a tiny Qwen3 model and of its tokenizer.

    Attributes:
        vocab_size: target BPE vocabulary size (special tokens included).
        hidden_size: width of the residual stream.
        intermediate_size: width of the MLP.
        num_hidden_layers: transformer blocks.
        num_attention_heads: query heads.
        num_key_value_heads: key/value heads (grouped-query attention).
        head_dim: width of one attention head.
        max_position_embeddings: longest sequence the model is configured for.
        rope_theta: RoPE base.
        copy_circuit: if set, the model is built with this hand-set induction (copy) circuit in its
            first two layers (:mod:`trace_train.tiny.copy_circuit`); the LM head is then untied.
        split: the tokenizer's pre-tokenizer split (:data:`trace_train.tiny.tokenizer.SPLITS`): ``words``,
            or ``keys``, which keeps a snake_case name such as ``reservation_id`` whole (one token after BPE),
            so that the induction head's two-token match tells one id field from another.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0
    copy_circuit: CopyCircuit | None = None
    split: str = "words"


#: The CPU default's size (see :data:`PRESETS`), shared by the ``tiny`` presets.
_TINY = ModelPreset(vocab_size=6144, hidden_size=CopyCircuit().hidden_size, intermediate_size=384, num_hidden_layers=2,
                    num_attention_heads=2, num_key_value_heads=2, head_dim=80, rope_theta=1e28,
                    copy_circuit=CopyCircuit())

PRESETS: dict[str, ModelPreset] = {
    # For tests: builds in seconds, a forward pass over 1k tokens takes milliseconds. Its 32k positions take the
    # LLM generator's whole prompt (15k tokens with the airline target's schemas) when `transformers serve`
    # serves it: from 5.25 the server refuses a prompt that does not fit the model's context.
    "nano": ModelPreset(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=32768),
    # The CPU default, sized for training speed on 2 cores (attention over a ~2k-token τ² prompt is
    # most of the cost, so two layers of two heads), built with the copy circuit: it copies ids from
    # the conversation from the start, and SFT learns the turn format and when to copy within a few
    # hundred steps (see bench/bootstrap_curve.py for what it reaches). The huge RoPE base keeps the
    # induction head's content pairs still over the context (CopyCircuit.check).
    "tiny": _TINY,
    # The tiny model with the ``keys`` tokenizer split: a field name is one token, so a write after a record it
    # read copies the field it names (``reservation_id ": "``), not whichever ``id ": "`` the record holds.
    "tiny-keys": replace(_TINY, split="keys"),
    # Still CPU-trainable, for runs that can afford tens of minutes.
    "small": ModelPreset(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32),
}


__all__ = ["PRESETS", "ModelPreset"]
