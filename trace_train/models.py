"""The tiny offline model: a Qwen3-architecture causal LM built from nothing, plus its SFT warm-up.

CPU machines (CI, laptops) run the whole TRACE loop on a model this module
builds locally, with no hub access:

* :func:`build_model` trains a byte-level BPE tokenizer with ``tokenizers`` on
  text the environments generate (oracle conversations and tool schemas),
  gives it TRL's Qwen3 chat template byte-for-byte (so TRL recognises the
  template and parses ``<tool_call>`` blocks), initialises a
  ``Qwen3ForCausalLM`` at random from a size preset and saves both with
  ``save_pretrained`` into a cache folder keyed by the preset and the content
  (corpus, template, config). A second call with the same inputs is a cache hit.
  The ``tiny`` preset is not wholly random: it is built with a hand-set copy
  circuit (:mod:`trace_train.copy_circuit`), so it copies ids from its context
  before any training — a skill SFT alone never gave it on a CPU budget.
* :func:`bootstrap_model` is the SFT warm-up: it plays the target env's oracle
  on training seeds, turns every assistant turn into a (prompt, completion)
  pair rendered with the chat template exactly as :class:`~trace_train.agents.HFAgent`
  renders it at inference time, and trains on the completion tokens (the last
  decoder layer and the LM head run only where a target token is predicted, the
  prompt prefix every episode shares — policy and tool schemas — is encoded once
  per batch, and the copy circuit's held previous-token layer runs with banded
  attention; all with the full forward's loss and gradients, see :func:`sft_loss`). Scenario
  families named in ``exclude_scenarios`` are left out, which produces a base
  model with real, known gaps. It saves the model, ``loss.json`` and a
  ``loss_curve.png``.

Prompt size: τ²-style envs carry a long policy and many tool schemas. A tiny
model cannot attend over thousands of tokens cheaply, so the warm-up makes the
target with the env constructor argument ``prompt="compact"`` when the env
accepts one (the τ² domains do; others are made as they are). The env kwargs
used are stored in ``trace_model.json`` next to the weights, and
:func:`model_env_kwargs` returns them for a given env id, so that rollouts of
the model see the same prompts it was trained on.

Heavy imports (torch, transformers, tokenizers) happen inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
import warnings
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .copy_circuit import (FREEZE_CHOICES, CopyCircuit, circuit_of, copy_accuracy, freeze_copy_circuit,
                           install_copy_circuit)

logger = logging.getLogger(__name__)

#: Bump when the build recipe changes, so cached models are rebuilt.
BUILD_VERSION = 3

#: Tokens with a role in the chat template. The first three are "special" (dropped by
#: ``skip_special_tokens``), the rest are ordinary added tokens, as in Qwen3's own tokenizer.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKUP_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<tool_response>", "</tool_response>"]

#: Pre-tokenizer split: letter runs, digit runs, and runs of everything else (spaces and
#: punctuation). Unlike Qwen's split, a word never carries the space or quote before it, so an id is
#: the same tokens wherever it appears — ``is stacy_watts_2428.`` in a user message and
#: ``"user_id": "stacy_watts_2428"`` in a tool call share ``stacy _ watts _ 2428``. Copying an id
#: from the conversation into a call is then a plain token copy; with Qwen's split (`` stacy`` vs
#: ``stacy``) a model must also learn the mapping between the two spellings.
#: Digits are kept in runs (BPE then splits a long run into pieces the same way everywhere), so a
#: date or a flight number is a few tokens to copy instead of one per digit; the tiny models do no
#: arithmetic worth protecting. JSON punctuation such as ``": "`` becomes one token.
_SPLIT_PATTERN = r"\p{L}+|\p{N}+|[^\p{L}\p{N}]+"


def env_accepts(env_id: str, kwarg: str) -> bool:
    """Whether the env class registered as ``env_id`` takes ``kwarg`` in its constructor."""
    import inspect

    import trace_envs

    try:
        cls = trace_envs.get_entry(env_id).load_class()
    except Exception:
        return False
    # A constructor that takes ``**kwargs`` usually hands them on to its parent's (structured data
    # reasoning's does): the parent's parameters then decide, up to one that names them all.
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        try:
            params = inspect.signature(init).parameters
        except (TypeError, ValueError):
            return False
        if kwarg in params:
            return True
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return False
    return True


def prompt_env_kwargs(env_id: str, prompt: str = "compact") -> dict:
    """``{"prompt": prompt}`` if the env has a prompt-size switch, else ``{}``."""
    return {"prompt": prompt} if env_accepts(env_id, "prompt") else {}


#: Where built and bootstrapped models are cached (override with ``TRACE_CACHE``).
def cache_root() -> Path:
    return Path(os.environ.get("TRACE_CACHE", Path.home() / ".cache" / "trace")) / "models"


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
            first two layers (:mod:`trace_train.copy_circuit`); the LM head is then untied.
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


PRESETS: dict[str, ModelPreset] = {
    # For tests: builds in seconds, a forward pass over 1k tokens takes milliseconds.
    "nano": ModelPreset(vocab_size=1024, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    # The CPU default, sized for training speed on 2 cores (attention over a ~2k-token τ² prompt is
    # most of the cost, so two layers of two heads), built with the copy circuit: it copies ids from
    # the conversation from the start, and SFT learns the turn format and when to copy within a few
    # hundred steps (see bench/bootstrap_curve.py for what it reaches). The huge RoPE base keeps the
    # induction head's content pairs still over the context (CopyCircuit.check).
    "tiny": ModelPreset(vocab_size=6144, hidden_size=CopyCircuit().hidden_size, intermediate_size=384,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=80,
                        rope_theta=1e28, copy_circuit=CopyCircuit()),
    # Still CPU-trainable, for runs that can afford tens of minutes.
    "small": ModelPreset(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=32),
}


def qwen3_chat_template() -> str:
    """TRL's Qwen3 chat template, read from the installed ``trl`` package (byte-identical)."""
    import trl

    path = Path(trl.__file__).resolve().parent / "chat_templates" / "qwen3.jinja"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; TRACE needs a trl release that ships chat_templates/qwen3.jinja "
                                "(pip install 'trl>=0.24')")
    return path.read_text(encoding="utf-8")


# ----------------------------------------------------------------------------- corpus


def default_corpus_envs() -> list[str]:
    """The env ids whose text trains the tokenizer when none are named.

    The built-in registry's envs without requirements, each at its first published version: a stable set,
    so that a new ``-vN`` of an env, or a workspace of generated envs named by ``TRACE_REGISTRY``, never
    changes the tokenizer, and with it the content key and the base a recipe builds.
    """
    import trace_envs
    from trace_envs.core.registry import BUILTIN_REGISTRY

    first: dict[str, tuple[int, str]] = {}
    for e in trace_envs.registered():
        if e.requires or Path(e.source or "").resolve() != BUILTIN_REGISTRY.resolve():
            continue
        name, _, version = e.id.rpartition("-v")
        v = int(version) if version.isdigit() else 0
        if name not in first or v < first[name][0]:
            first[name] = (v, e.id)
    return sorted(env_id for _, env_id in first.values())


def env_corpus(env_ids: Sequence[str], seeds: Iterable[int] = range(8)) -> list[str]:
    """Text for the tokenizer: oracle conversations and tool schemas of ``env_ids``.

    Each conversation is rendered with the Qwen3 markup (``<|im_start|>`` etc. as plain strings, which the
    tokenizer later splits off as added tokens), so merges are learnt on the text the model will see.
    Envs with a compact prompt contribute conversations with both prompt sizes.
    """
    from trace_envs import OracleAgent, rollout

    texts: list[str] = [
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>\n</tools>\n\nFor each function call, return "
        "a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    ]
    seeds = list(seeds)
    for env_id in env_ids:
        compact = prompt_env_kwargs(env_id)
        for kwargs in ([{}, compact] if compact else [{}]):
            for seed in seeds:
                try:
                    with warnings.catch_warnings():  # gymnasium warns that a -v0 has a newer version: it is meant
                        warnings.simplefilter("ignore", DeprecationWarning)
                        record = rollout(env_id, OracleAgent(), seed=seed, env_kwargs=kwargs)
                except Exception as exc:  # a broken env must not stop the build; its text is just missing
                    logger.warning("corpus: oracle rollout of %s seed %s failed: %s", env_id, seed, exc)
                    break
                if seed == seeds[0]:
                    texts.extend(json.dumps(t, ensure_ascii=False) for t in record["tools"])
                texts.append(render_plain(record["messages"]))
    return texts


def render_plain(messages: list[dict]) -> str:
    """A Qwen3-like rendering without jinja, for tokenizer training only."""
    out = []
    for m in messages:
        content = m.get("content") or ""
        if m["role"] == "tool":
            out.append(f"<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>")
            continue
        for tc in m.get("tool_calls") or ():
            fn = tc["function"]
            args = fn["arguments"] if isinstance(fn["arguments"], str) else json.dumps(fn["arguments"])
            content += f'\n<tool_call>\n{{"name": "{fn["name"]}", "arguments": {args}}}\n</tool_call>'
        out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>")
    return "\n".join(out)


# ----------------------------------------------------------------------------- build


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
    h.update(json.dumps({"v": BUILD_VERSION, "preset": preset, "config": asdict(config), "seed": seed},
                        sort_keys=True).encode())
    h.update(hashlib.sha256(template.encode()).digest())
    for t in texts:
        h.update(hashlib.sha256(t.encode()).digest())
    return h.hexdigest()[:16]


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer (Qwen-style split) with the chat markup as added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS + MARKUP_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return tok


def wrap_tokenizer(tok, template: str):
    """The ``transformers`` fast tokenizer around a trained ``tokenizers`` object."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token=None,
        bos_token=None, model_max_length=PRESETS["small"].max_position_embeddings, padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = template
    return hf


def build_model(preset: str = "tiny", out: str | Path | None = None, env_ids: Sequence[str] | None = None,
                corpus_seeds: int = 8, seed: int = 0, force: bool = False,
                extra_texts: Sequence[str] = ()) -> BuildResult:
    """Build (or fetch from the cache) a random-init tiny Qwen3 model and its tokenizer.

    Args:
        preset: a key of :data:`PRESETS` (``nano``, ``tiny``, ``small``).
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

    tok = wrap_tokenizer(train_tokenizer(texts, config.vocab_size), template)
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


def model_metadata(path: str | Path) -> dict:
    """``trace_model.json`` of a model built here ({} for any other model folder)."""
    f = Path(path) / "trace_model.json"
    return json.loads(f.read_text()) if f.exists() else {}


def model_env_kwargs(path: str | Path, env_id: str | None = None) -> dict:
    """The env constructor kwargs a bootstrapped model was trained with (``{"prompt": "compact"}``),
    restricted to those ``env_id`` accepts; use them for the model's rollouts."""
    kwargs = dict(model_metadata(path).get("env_kwargs") or {})
    if env_id is not None:
        kwargs = {k: v for k, v in kwargs.items() if env_accepts(env_id, k)}
    return kwargs


# ----------------------------------------------------------------------------- SFT warm-up


@dataclass
class BootstrapConfig:
    """Settings of the SFT warm-up on oracle trajectories.

    Attributes:
        target: env id whose oracle trajectories are the training data.
        base: a model folder to start from; default: build ``preset`` (with ``target`` in the corpus).
        preset: size preset used when ``base`` is not given.
        out: output folder; default ``<cache>/bootstrap-<target>-<hash>``.
        exclude_scenarios: scenario families (``task_spec()["scenario"]``) left out of training.
        scenario_shares: scenario families kept at a share below 1 (``{"cancel": 0.1}`` keeps about one
            cancel episode in ten, chosen by seed): families *under-represented* in the warm-up rather
            than absent, so the base shows them sometimes but not reliably.
        train_seeds: how many training episodes to collect; seeds start at ``seed_offset`` so that
            evaluation on small seeds is held out.
        seed_offset: first training seed.
        steps: optimiser steps.
        batch_size: trajectories per step (each one sequence, loss on its assistant turns).
        lr: peak learning rate (linear warm-up, cosine decay).
        warmup_steps: linear warm-up length.
        max_length: longest training sequence in tokens; assistant turns beyond it are left out
            (use compact prompts so that whole episodes fit).
        prompt: ``"compact"`` (default) or ``"full"``: the target's prompt size, passed as the env
            kwarg ``prompt`` when the env has one.
        threads: torch CPU threads (1 is fastest for the tiny presets).
        device: torch device to train on (``cpu``; ``cuda`` where there is one).
        seed: torch seed (data order, dropout-free init is fixed by the base).
        env_kwargs: passed to ``gym.make`` (e.g. ``scenarios`` to train on chosen families only, or
            ``size={"bundle_prob": 0.0}`` for one request per episode: shorter episodes).
        shared_prefix: encode the token prefix every training sequence shares (the system prompt and
            tool schemas, thousands of tokens with a τ² policy) once per step and let the batch attend
            to it, instead of once per sequence. The gradient is exact (it flows through the shared
            keys/values); only the cost changes.
        pretrain_frac: a curriculum: the first fraction of the steps is language-model pre-training
            on the conversations alone — without the shared prompt (a few hundred tokens per sequence
            instead of a few thousand, so these steps are several times cheaper) and with every token
            a target: user turns and tool results too. Tool results repeat the ids of the call
            before them and of earlier turns, so this phase is rich in copying, the skill SFT on
            assistant turns alone leaves unlearnt for a long time (the model writes memorised ids
            instead of the user's). The remaining steps are SFT on the assistant turns of whole
            sequences, as the model sees them at inference. 0 disables it. Measured on the airline
            target (bench/bootstrap_curve.py): a lower SFT loss at the same wall time, but the
            ``tiny`` preset still did not copy ids within 40 CPU minutes before it had a copy circuit.
        max_seconds: a training-time budget (the optimisation loop only): training stops before the
            step that would overrun it (timed as the slowest of the last 8), or after ``steps`` (then an upper
            bound), whichever comes first; the learning-rate schedule and the pre-training phase
            follow the share of the budget spent. Robust to a
            machine of unknown or varying speed, where a step count planned from a probe is not.
        freeze_circuit: for a base built with a copy circuit (the ``tiny`` preset), which of its
            weights stay as built: ``all``, ``positional`` (the induction head trains too) or
            ``none`` (:func:`trace_train.copy_circuit.circuit_gradient_masks`). Everything else
            trains. With ``none``, SFT slowly erodes the copying it relies on; with ``all``, the
            induction head cannot adapt to start a copy (measured on the airline target: the user id
            after "My user id is" came out wrong in every replayed episode).
        mixture: the warm-up mixture: ``{env_id: share}`` adds, for each env, ``round(share * train_seeds)``
            (at least 1) oracle episodes of that env to the target's (seeds from ``seed_offset`` too, so
            evaluation seeds stay held out). A low share of a capability env's own episodes (e.g. 0.05)
            makes a base that is *sometimes* right on that env, which GRPO needs (a group whose rollouts
            all score 0 carries no signal; a base warmed up on the target alone scores ~0 on the τ²
            capability envs, FACTS.md §8).
        mixture_env_kwargs: ``gym.make`` kwargs of the mixture envs (e.g. ``{"difficulty": 1}``); the
            ``prompt`` switch is added for envs that have one.
        lora: train a LoRA adapter instead of the whole model (the base stays frozen): a mapping of
            ``peft.LoraConfig`` arguments (``r``, ``lora_alpha``, ``lora_dropout``, ``target_modules``).
            The output folder then holds a PEFT adapter (``PeftModel.from_pretrained(base, out)``), not
            a model; ``trace train --sft`` uses this.
    """

    target: str
    base: str | None = None
    preset: str = "tiny"
    out: str | None = None
    exclude_scenarios: tuple[str, ...] = ()
    scenario_shares: dict = field(default_factory=dict)
    train_seeds: int = 400
    seed_offset: int = 100_000
    steps: int = 300
    batch_size: int = 8
    lr: float = 3e-3
    warmup_steps: int = 20
    max_length: int = 4096
    prompt: str = "compact"
    threads: int = 1
    device: str = "cpu"
    seed: int = 0
    env_kwargs: dict = field(default_factory=dict)
    shared_prefix: bool = True
    pretrain_frac: float = 0.0
    freeze_circuit: str = "positional"
    max_seconds: float | None = None
    mixture: dict = field(default_factory=dict)
    mixture_env_kwargs: dict = field(default_factory=dict)
    lora: dict | None = None

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be > 0, got {self.max_seconds}")
        if self.freeze_circuit not in FREEZE_CHOICES:
            raise ValueError(f"freeze_circuit must be one of {', '.join(FREEZE_CHOICES)}, got {self.freeze_circuit!r}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.train_seeds < 1:
            raise ValueError(f"train_seeds must be >= 1, got {self.train_seeds}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if not 0.0 <= self.pretrain_frac < 1.0:
            raise ValueError(f"pretrain_frac must be in [0, 1), got {self.pretrain_frac}")
        if self.prompt not in ("compact", "full"):
            raise ValueError(f"prompt must be 'compact' or 'full', got {self.prompt!r}")
        self.exclude_scenarios = tuple(self.exclude_scenarios)
        for family, share in self.scenario_shares.items():
            if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1:
                raise ValueError(f"scenario_shares[{family!r}] must be a number in (0, 1] (the share of that "
                                 f"family's episodes kept), got {share!r}; use exclude_scenarios to leave it out")
        for env_id, share in self.mixture.items():
            if not isinstance(share, (int, float)) or isinstance(share, bool) or not share > 0:
                raise ValueError(f"mixture share of {env_id} must be a number > 0 (a share of train_seeds), "
                                 f"got {share!r}")


def scenario_of(env: Any) -> str | None:
    """The scenario family of the env's current task (``task_info()`` or ``task_spec()``), if it has one."""
    for hook in ("task_info", "task_spec"):
        try:
            labels = getattr(env.unwrapped, hook)()
        except Exception:
            continue
        if isinstance(labels, dict) and labels.get("scenario") is not None:
            return str(labels["scenario"])
    return None


def scenario_families(scenario: str) -> list[str]:
    """The families a scenario label names: ``"bundle:cancel+booking"`` → cancel, booking (and the label)."""
    if scenario.startswith("bundle:"):
        return [scenario] + scenario[len("bundle:"):].split("+")
    return [scenario]


def _kept_at_share(seed: int, share: float) -> bool:
    """Whether episode ``seed`` is among the ``share`` of its family that is kept (a pure function of the seed)."""
    digest = hashlib.sha256(f"scenario-share:{seed}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < share


def oracle_trajectories(target: str, seeds: Iterable[int], exclude_scenarios: Sequence[str] = (),
                        env_kwargs: dict | None = None,
                        scenario_shares: dict[str, float] | None = None) -> tuple[list[dict], dict]:
    """Oracle episodes of ``target`` on ``seeds``, without the excluded scenarios.

    A task is left out when its scenario, or any family of a ``bundle:a+b`` scenario, is excluded. A family
    in ``scenario_shares`` keeps only that share of its episodes (the smallest share of its families, for a
    bundle), chosen by seed, so the same settings always keep the same episodes.

    Returns:
        (records, counts) where counts maps each scenario (or ``None``) to kept/excluded/failed numbers.
    """
    import gymnasium as gym

    import trace_envs
    from trace_envs import OracleAgent

    env = gym.make(target, **(env_kwargs or {}))
    records, counts = [], {}
    excluded = set(exclude_scenarios)
    try:
        for seed in seeds:
            record = trace_envs.rollout(env, OracleAgent(), seed=seed)
            scenario = scenario_of(env)
            c = counts.setdefault(str(scenario), {"kept": 0, "excluded": 0, "failed": 0})
            if scenario is not None and excluded & set(scenario_families(scenario)):
                c["excluded"] += 1
                continue
            share = min([(scenario_shares or {}).get(f, 1.0) for f in scenario_families(scenario or "")] or [1.0])
            if share < 1.0 and not _kept_at_share(seed, share):
                c["excluded"] += 1
                continue
            if not record["success"]:
                c["failed"] += 1  # an oracle that fails is an env bug; never train on it
                continue
            record["scenario"] = scenario
            records.append(record)
            c["kept"] += 1
    finally:
        env.close()
    return records, counts


def render_prompt(tokenizer, messages: list[dict], tools: list[dict] | None) -> str:
    """The generation prompt for the next assistant turn (the same one :class:`HFAgent` uses).

    No ``enable_thinking`` switch is passed: the prompt ends with ``<|im_start|>assistant\n`` and the
    model writes its turn (a ``<tool_call>`` block or a message) directly, exactly as past assistant
    turns appear in the history. TRL's GRPO rollouts render prompts the same way.
    """
    return tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=False)


_DUMMY_USER = {"role": "user", "content": "."}


def assistant_turns(tokenizer, record: dict) -> Iterable[tuple[int, str, str, int]]:
    """Each assistant turn of a trajectory as ``(message index, prompt, full text, end)``.

    ``prompt`` is the generation prompt before the turn (as :func:`render_prompt` renders it at
    inference), ``full`` the whole conversation rendered once, and ``full[len(prompt):end]`` the turn
    as it appears in later prompts, ``<|im_end|>`` included. Qwen3's template gives the *last*
    assistant turn an empty ``<think>`` block; a throw-away user message after it keeps every turn
    uniform.
    """
    messages, tools = record["messages"], record["tools"] or None
    end = "<|im_end|>"
    full = tokenizer.apply_chat_template(messages + [_DUMMY_USER], tools=tools, tokenize=False)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render_prompt(tokenizer, messages[:i], tools)
        if not full.startswith(prompt):
            raise RuntimeError("the chat template is not prefix-preserving at an assistant turn; "
                               "cannot build SFT targets from it")
        yield i, prompt, full, full.index(end, len(prompt)) + len(end)


def sft_segments(tokenizer, record: dict) -> list[tuple[str, bool]]:
    """One trajectory as text segments ``(text, is_target)``: the assistant turns are the targets.

    The whole conversation is one training sequence (much cheaper than one sequence per turn). Each
    assistant turn is rendered as it appears in later prompts, so the context of every target matches
    what the model sees at inference (see :func:`assistant_turns`); the closing dummy turn is cut off.
    """
    segments: list[tuple[str, bool]] = []
    pos = 0
    for _, prompt, full, stop in assistant_turns(tokenizer, record):
        segments.append((full[pos:len(prompt)], False))
        segments.append((full[len(prompt):stop], True))
        pos = stop
    return segments


def teacher_forced_turns(model, tokenizer, records: list[dict], max_new_tokens: int = 96,
                         device: str = "cpu") -> dict:
    """How many assistant turns of ``records`` the model reproduces exactly, given the true history.

    Each turn is generated greedily from the oracle's own history (as :class:`HFAgent` prompts it), so
    one early mistake does not hide the later turns. Returns the exact-match rate of tool calls and of
    messages, plus the number of each: a diagnostic next to episode success, which stays at 0 until
    every turn of an episode is right (a model that has learnt the turn format but not yet to copy
    ids from the conversation into its calls gets its messages right and its tool calls wrong).
    """
    import torch

    hits = {"tool_call": [0, 0], "message": [0, 0]}
    end = "<|im_end|>"
    for record in records:
        for i, prompt, full, stop in assistant_turns(tokenizer, record):
            want = full[len(prompt):stop - len(end)]
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(device)
            with torch.no_grad():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                     max_new_tokens=max_new_tokens, do_sample=False)
            got = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False).split(end)[0]
            kind = "tool_call" if record["messages"][i].get("tool_calls") else "message"
            hits[kind][0] += int(got.strip() == want.strip())
            hits[kind][1] += 1
    return {**{k: (h / n if n else None) for k, (h, n) in hits.items()},
            **{f"n_{k}": n for k, (_, n) in hits.items()}}


def sft_rows(tokenizer, records: list[dict], max_length: int) -> tuple[list[tuple[list[int], list[int]]], int, int]:
    """Token ids and loss labels (-100 outside the targets) per trajectory.

    A trajectory longer than ``max_length`` keeps the turns that fit; returns (rows, turns, dropped turns).
    """
    rows, turns, dropped = [], 0, 0
    for record in records:
        ids: list[int] = []
        labels: list[int] = []
        for text, is_target in sft_segments(tokenizer, record):
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            if len(ids) + len(piece) > max_length:
                dropped += 1 if is_target else 0
                if is_target:
                    continue
                break
            ids.extend(piece)
            labels.extend(piece if is_target else [-100] * len(piece))
            turns += int(is_target)
        if any(label != -100 for label in labels):
            rows.append((ids, labels))
    return rows, turns, dropped


def _lr_at(step: int, done: float, cfg: BootstrapConfig) -> float:
    """Linear warm-up over ``warmup_steps``, then cosine to 10% over the share ``done`` of the run."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, done))))


def shared_prefix_length(rows: Sequence[tuple[list[int], list[int]]]) -> int:
    """Length of the token prefix all ``rows`` share and that holds no loss target (0 if none).

    It stops one token before the first target of any row, so that every row keeps at least that
    token after the prefix (its prediction is never lost).
    """
    if not rows:
        return 0
    first = rows[0][0]
    n = len(first)
    for ids, labels in rows:
        k = 0
        m = min(n, len(ids))
        while k < m and ids[k] == first[k]:
            k += 1
        n = k
        targets = [i for i, label in enumerate(labels) if label != -100]
        if targets:
            n = min(n, targets[0] - 1)
        n = min(n, len(ids) - 1)
    return max(0, n)


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
    mass within 4 positions, :mod:`trace_train.copy_circuit`): the band costs O(T·window) instead of
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
             targets_only: bool = True, local_window: int | None = None):
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
        return torch.nn.functional.cross_entropy(logits.float(), targets)
    hidden = model.model(input_ids=ids_t.to(device), attention_mask=mask.to(device), **kwargs).last_hidden_state
    logits = model.lm_head(hidden[:, :-1][keep])
    return torch.nn.functional.cross_entropy(logits.float(), next_labels[keep])


def plot_loss(losses: list[float], path: Path, title: str, pretrain_steps: int = 0) -> None:
    """Save a loss curve (raw and smoothed) as PNG; a dashed line marks the end of LM pre-training."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    ax.plot(range(1, len(losses) + 1), losses, lw=0.8, alpha=0.4, label="loss")
    if len(losses) >= 10:
        w = max(5, len(losses) // 30)
        smooth = [sum(losses[max(0, i - w + 1):i + 1]) / len(losses[max(0, i - w + 1):i + 1])
                  for i in range(len(losses))]
        ax.plot(range(1, len(losses) + 1), smooth, lw=1.6, label=f"mean of {w}")
    if pretrain_steps:
        ax.axvline(pretrain_steps + 0.5, ls="--", lw=0.8, color="grey")
        ax.text(pretrain_steps + 0.5, 0.97, " SFT →", transform=ax.get_xaxis_transform(), va="top", fontsize=8,
                color="grey")
        ax.text(pretrain_steps + 0.5, 0.97, "← LM pre-training (all tokens) ", transform=ax.get_xaxis_transform(),
                va="top", ha="right", fontsize=8, color="grey")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy per target token")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class BootstrapResult:
    """Outcome of :func:`bootstrap_model`."""

    path: Path
    losses: list[float]
    examples: int
    turns: int
    truncated: int
    scenario_counts: dict
    seconds: float


#: Window of the banded attention used in training for the copy circuit's held previous-token layer.
LOCAL_WINDOW = 8


def _banded_window(model, circuit: CopyCircuit | None, freeze: str, rows) -> int | None:
    """:data:`LOCAL_WINDOW` when training may run the layers before the last with banded attention.

    That is when they are exactly the copy circuit's previous-token layer held fixed (so its attention
    stays local for the whole run), checked on a training sequence: all but 1e-4 of every head's
    attention within the window. None otherwise (the plain forward is used).
    """
    if circuit is None or freeze == "none" or len(model.model.layers) != 2 or not _targets_only_supported(model):
        return None
    mass = local_attention_mass(model, rows[0][0][:1024], LOCAL_WINDOW)
    if mass < 1 - 1e-4:
        logger.warning("the previous-token layer puts only %.6f of its attention within %d positions; "
                       "training without banded attention", mass, LOCAL_WINDOW)
        return None
    return LOCAL_WINDOW


def bootstrap_model(cfg: BootstrapConfig, progress: bool = True,
                    on_checkpoint: Callable[[int, Any, Any, float], None] | None = None,
                    checkpoint_every: int = 0, checkpoint_every_s: float = 0.0) -> BootstrapResult:
    """SFT warm-up of a tiny model on the target env's oracle trajectories.

    Args:
        cfg: the settings.
        progress: show a tqdm bar.
        on_checkpoint: called as ``fn(step, model, tokenizer, training_seconds)`` every
            ``checkpoint_every`` steps (or ``checkpoint_every_s`` seconds of training) and at the end;
            the model is in eval mode during the call. ``training_seconds`` counts the optimisation
            loop only: not the setup (oracle episodes, model load) nor the callbacks themselves.
        checkpoint_every: period of ``on_checkpoint`` in steps (0 = only at the end).
        checkpoint_every_s: period of ``on_checkpoint`` in seconds of training (0 = by steps).

    Returns:
        A :class:`BootstrapResult`; the model, ``loss.json``, ``loss_curve.png`` and ``trace_model.json``
        are in ``result.path``.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    torch.set_num_threads(max(1, cfg.threads))
    env_kwargs = {**prompt_env_kwargs(cfg.target, cfg.prompt), **cfg.env_kwargs}
    base = cfg.base or str(build_model(cfg.preset, env_ids=sorted(set(default_corpus_envs()) | {cfg.target})).path)
    tokenizer = AutoTokenizer.from_pretrained(base)
    seeds = range(cfg.seed_offset, cfg.seed_offset + cfg.train_seeds)
    records, counts = oracle_trajectories(cfg.target, seeds, cfg.exclude_scenarios, env_kwargs, cfg.scenario_shares)
    if not records:
        raise RuntimeError(f"no oracle trajectories of {cfg.target} left to train on (scenario counts: {counts}); "
                           "check --exclude-scenarios")
    mixture_counts = {}
    for env_id, share in sorted(cfg.mixture.items()):
        n = max(1, round(share * cfg.train_seeds))
        mix_kwargs = {**prompt_env_kwargs(env_id, cfg.prompt), **cfg.mixture_env_kwargs}
        extra, _ = oracle_trajectories(env_id, range(cfg.seed_offset, cfg.seed_offset + n), env_kwargs=mix_kwargs)
        records.extend(extra)
        mixture_counts[env_id] = {"episodes": len(extra), "env_kwargs": mix_kwargs}
    rows, turns, truncated = sft_rows(tokenizer, records, cfg.max_length)
    if truncated:
        logger.warning("%d assistant turns did not fit in %d tokens and were left out; use compact prompts",
                       truncated, cfg.max_length)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(cfg.device)
    circuit = circuit_of(model_metadata(base))
    peft_model = None
    if cfg.lora is not None:
        # A LoRA on a frozen base: sft_loss runs the base model's modules, into which PEFT injected the
        # adapters. No banded attention: the adapters may make the held layer attend beyond the band.
        from peft import LoraConfig, get_peft_model

        peft_model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **cfg.lora))
        model = peft_model.get_base_model()
        local_window = None
    else:
        if circuit is not None:
            freeze_copy_circuit(model, circuit, cfg.freeze_circuit)
        local_window = _banded_window(model, circuit, cfg.freeze_circuit, rows)
    model.train()
    model.config.use_cache = False
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=(0.9, 0.95),
                              weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed)
    pad = tokenizer.pad_token_id
    prefix_len = shared_prefix_length(rows) if cfg.shared_prefix else 0
    logger.info("bootstrap: %d sequences, shared prefix of %d tokens", len(rows), prefix_len)
    losses: list[float] = []
    order: list[int] = []
    pretrain_steps = 0
    train_s = 0.0  # time in the optimisation loop (callbacks excluded)
    # The next step is predicted to take as long as the slowest recent one: step times vary by a few percent,
    # and predicting with the last one alone let a slightly slower step end past the budget.
    recent_steps_s: deque[float] = deque(maxlen=8)

    def over_budget() -> bool:
        return bool(cfg.max_seconds and recent_steps_s and train_s + max(recent_steps_s) > cfg.max_seconds)
    next_checkpoint_s = checkpoint_every_s
    # With a time budget the number of steps is not known ahead: the bar counts steps and shows the
    # minutes spent of the budget.
    bar = tqdm(total=None if cfg.max_seconds else cfg.steps, desc=f"bootstrap {cfg.target}", disable=not progress,
               unit="step")
    budget = f"/{cfg.max_seconds / 60:.1f}" if cfg.max_seconds else ""
    for step in range(cfg.steps):
        # Share of the run done: of the time budget when there is one, else of the steps.
        done = train_s / cfg.max_seconds if cfg.max_seconds else step / cfg.steps
        if over_budget():
            break  # the next step would overrun the budget
        t_step = time.perf_counter()
        batch_idx = []
        for _ in range(cfg.batch_size):
            if not order:
                order = torch.randperm(len(rows), generator=gen).tolist()
            batch_idx.append(order.pop())
        batch = [rows[i] for i in batch_idx]
        for g in optim.param_groups:
            g["lr"] = _lr_at(step, done, cfg)
        pretraining = done < cfg.pretrain_frac
        pretrain_steps += int(pretraining)
        loss = sft_loss(model, batch, pad, prefix_len, cfg.device, drop_prefix=pretraining, every_token=pretraining,
                        local_window=local_window)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        losses.append(float(loss.detach()))
        recent_steps_s.append(time.perf_counter() - t_step)
        train_s += recent_steps_s[-1]
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", train_min=f"{train_s / 60:.1f}{budget}")
        due = (checkpoint_every and (step + 1) % checkpoint_every == 0) or \
              (checkpoint_every_s and train_s >= next_checkpoint_s)
        last = step + 1 == cfg.steps or over_budget()
        if on_checkpoint and due and not last:
            next_checkpoint_s += checkpoint_every_s
            model.eval()
            model.config.use_cache = True
            on_checkpoint(step + 1, model, tokenizer, train_s)
            model.train()
            model.config.use_cache = False
    bar.close()
    model.eval()
    model.config.use_cache = True

    # Options left at their defaults stay out of the key, so folders cached before they existed still match.
    keyed = {k: v for k, v in asdict(cfg).items() if not (k in ("mixture", "mixture_env_kwargs", "lora", "scenario_shares") and not v)}
    key = hashlib.sha256(json.dumps({"cfg": keyed, "base": model_metadata(base).get("content_key", base)},
                                    sort_keys=True, default=str).encode()).hexdigest()[:12]
    out = Path(cfg.out) if cfg.out else cache_root() / f"bootstrap-{cfg.target.replace('/', '_')}-{key}"
    out.mkdir(parents=True, exist_ok=True)
    saved = peft_model if peft_model is not None else model
    saved.to("cpu").save_pretrained(out)
    saved.to(cfg.device)
    tokenizer.save_pretrained(out)
    meta = model_metadata(base)
    meta.pop("reset_options", None)
    # A bootstrapped folder is not the base build: give it its own key so build_model never mistakes it.
    meta.update({"content_key": f"bootstrap-{key}", "base_content_key": meta.get("content_key"),
                 "env_kwargs": env_kwargs, "bootstrap": {
        "target": cfg.target, "base": str(base), "exclude_scenarios": list(cfg.exclude_scenarios),
        "scenario_shares": dict(cfg.scenario_shares),
        "steps": len(losses), "max_seconds": cfg.max_seconds, "batch_size": cfg.batch_size, "lr": cfg.lr,
        "examples": len(rows), "train_seconds": train_s,
        "pretrain_steps": pretrain_steps, "frozen_circuit": cfg.freeze_circuit if circuit else None,
        "turns": turns, "truncated": truncated, "shared_prefix_tokens": prefix_len, "banded_window": local_window,
        "scenario_counts": counts, "mixture": mixture_counts, "lora": cfg.lora, "final_loss": losses[-1],
        "seconds": time.perf_counter() - t0}})
    # An adapter folder is not a model folder: its record gets its own name, so model_metadata() of it is {}.
    (out / ("trace_adapter.json" if peft_model is not None else "trace_model.json")).write_text(
        json.dumps(meta, indent=2, default=str))
    (out / "loss.json").write_text(json.dumps({"loss": losses}, indent=None))
    plot_loss(losses, out / "loss_curve.png", f"SFT warm-up on {cfg.target} ({len(rows)} episodes, {turns} turns)",
              pretrain_steps=pretrain_steps)
    if on_checkpoint:
        on_checkpoint(len(losses), model, tokenizer, train_s)
    return BootstrapResult(out, losses, len(rows), turns, truncated, counts, time.perf_counter() - t0)
