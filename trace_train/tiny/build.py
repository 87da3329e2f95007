"""The tiny offline model: a Qwen3-architecture causal LM built from nothing, cached by content.

CPU machines (CI, laptops) run the whole TRACE loop on a model this module builds locally, with no hub
access. :func:`build_model` trains the tokenizer (:mod:`trace_train.tiny.tokenizer`) on text the
environments generate, initialises a ``Qwen3ForCausalLM`` at random from a size preset (:data:`PRESETS`)
and saves both with ``save_pretrained`` into a cache folder keyed by the preset and the content (corpus,
template, config: :func:`_content_key`). A second call with the same inputs is a cache hit. The ``tiny``
preset is not wholly random: it is built with a hand-set copy circuit (:mod:`trace_train.tiny.copy_circuit`),
so it copies ids from its context before any training — a skill SFT alone never gave it on a CPU budget.

The rest of the room: the SFT warm-up (:mod:`trace_train.tiny.bootstrap`), its training data
(:mod:`trace_train.tiny.sft_data`) and fast forward (:mod:`trace_train.tiny.sft_forward`), the fast decode
loop (:mod:`trace_train.tiny.fast_decode`), the folder record (:mod:`trace_train.tiny.metadata`) and the
shipped base (:mod:`trace_train.tiny.shipped`).

Heavy imports (torch, transformers, tokenizers) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from .copy_circuit import copy_accuracy, install_copy_circuit
from .metadata import cache_root
from .presets import PRESETS, ModelPreset  # noqa: F401 - the presets, also named here
from .tokenizer import default_corpus_envs, env_corpus, qwen3_chat_template, train_tokenizer, wrap_tokenizer


#: Bump when the build recipe changes, so cached models are rebuilt.
BUILD_VERSION = 3


@dataclass
class BuildResult:
    """Where a built model lives and whether it came from the cache."""

    path: Path
    cached: bool
    seconds: float
    preset: str
    vocab_size: int
    parameters: int


def _content_key(preset: str, config: ModelPreset, texts: list[str], template: str, seed: int) -> str:
    h = hashlib.sha256()
    spec = asdict(config)
    if spec["split"] == "words":  # the split added later: at its default, earlier builds keep their keys
        del spec["split"]
    h.update(json.dumps({"v": BUILD_VERSION, "preset": preset, "config": spec, "seed": seed},
                        sort_keys=True).encode())
    h.update(hashlib.sha256(template.encode()).digest())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:16]


def build_model(preset: str = "tiny", out: str | Path | None = None, env_ids: Sequence[str] | None = None,
                corpus_seeds: int = 8, seed: int = 0, force: bool = False,
                extra_texts: Sequence[str] = ()) -> BuildResult:
    """Build (or fetch from the cache) a random-init tiny Qwen3 model and its tokenizer.

    Args:
        preset: a key of :data:`PRESETS` (``nano``, ``tiny``, ``tiny-keys``, ``small``).
        out: where to save; default ``<cache>/<preset>-<content hash>``. An existing complete build
            at that path with the same content key is reused unless ``force``.
        env_ids: envs whose oracle conversations and tool schemas train the tokenizer
            (default: every registered env without requirements such as docker).
        corpus_seeds: oracle episodes per env for the corpus.
        seed: torch seed of the random initialisation.
        force: rebuild even on a cache hit.
        extra_texts: more tokenizer training text.

    Returns:
        A :class:`BuildResult`; load with ``AutoModelForCausalLM.from_pretrained(result.path)``.
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    t0 = time.perf_counter()
    config = PRESETS[preset]
    env_ids = list(env_ids) if env_ids is not None else default_corpus_envs()
    texts = env_corpus(env_ids, range(corpus_seeds)) + list(extra_texts)
    template = qwen3_chat_template()
    key = _content_key(preset, config, texts, template, seed)
    path = Path(out) if out else cache_root() / f"{preset}-{key}"
    meta_file = path / "trace_model.json"
    if meta_file.exists() and not force:
        meta = json.loads(meta_file.read_text())
        if meta.get("content_key") == key:
            return BuildResult(path, True, time.perf_counter() - t0, preset, meta["vocab_size"], meta["parameters"])

    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tok = wrap_tokenizer(train_tokenizer(texts, config.vocab_size, config.split), template)
    vocab = len(tok)
    # Round the embedding table up to a multiple of 64 (faster matmuls); the extra rows are never produced.
    padded_vocab = int(math.ceil(vocab / 64) * 64)
    circuit = config.copy_circuit
    model_config = Qwen3Config(
        vocab_size=padded_vocab, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings, rope_theta=config.rope_theta,
        tie_word_embeddings=circuit is None,
        bos_token_id=None, eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), use_cache=True, initializer_range=0.02,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(model_config)
        if circuit is not None:
            install_copy_circuit(model, tok, circuit, seed=seed)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")],
        pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), do_sample=False,
    )
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    parameters = sum(p.numel() for p in model.parameters())
    meta = {"content_key": key, "preset": preset, "config": asdict(config), "vocab_size": vocab,
            "parameters": parameters, "corpus_envs": env_ids, "corpus_texts": len(texts), "seed": seed,
            "build_version": BUILD_VERSION, "env_kwargs": {}, "bootstrap": None}
    if circuit is not None:
        # A check a user can read off the folder: the untrained model continues repeated random text.
        gen = torch.Generator().manual_seed(seed + 1)
        spans = [torch.randint(16, vocab, (200,), generator=gen).tolist() for _ in range(2)]
        meta["copy_accuracy_repeated_random"] = round(copy_accuracy(model.eval(), [s + s for s in spans]), 3)
    (tmp / "trace_model.json").write_text(json.dumps(meta, indent=2))
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, path)
    return BuildResult(path, False, time.perf_counter() - t0, preset, vocab, parameters)
