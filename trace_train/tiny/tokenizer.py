"""The tiny model's tokenizer: a byte-level BPE trained on the environments' own text.

:func:`train_tokenizer` learns merges with ``tokenizers`` on :func:`env_corpus` (oracle conversations and tool
schemas of :func:`default_corpus_envs`, rendered with the Qwen3 markup by :func:`render_plain`), with a split
that keeps an id the same tokens wherever it appears (:data:`SPLITS`: ``keys`` also keeps a field name such as
``reservation_id`` whole); :func:`wrap_tokenizer` gives it TRL's Qwen3 chat
template byte-for-byte (:func:`qwen3_chat_template`), so TRL recognises the template and parses
``<tool_call>`` blocks. :func:`trace_train.tiny.build.build_model` calls these.

Heavy imports (tokenizers, transformers, trl) happen inside the functions.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Iterable, Sequence

from .metadata import prompt_env_kwargs
from .presets import PRESETS

logger = logging.getLogger(__name__)


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
#: The ``keys`` split: as above, but a snake_case name (letter runs joined by underscores) is one piece, so
#: ``reservation_id`` can become one token instead of ``reservation _ id``. Why: the copy circuit's induction
#: head matches the last two tokens, and ``id ": "`` ends every ``..._id`` field, so a write after a reservation
#: record (``{"reservation_id": "`` with the record's ``user_id`` and ``payment_id`` fields in context) copies
#: whichever id field it matches; ``reservation_id ": "`` matches only the field the write names. An id such as
#: ``mia_li_3668`` still splits the same way wherever it appears (``mia_li`` ``_`` ``3668``).
_KEYS_SPLIT_PATTERN = r"\p{L}+(?:_\p{L}+)+|\p{L}+|\p{N}+|[^\p{L}\p{N}]+"
#: Pre-tokenizer splits by name (:attr:`trace_train.tiny.presets.ModelPreset.split`).
SPLITS = {"words": _SPLIT_PATTERN, "keys": _KEYS_SPLIT_PATTERN}


def qwen3_chat_template() -> str:
    """TRL's Qwen3 chat template, read from the installed ``trl`` package (byte-identical)."""
    import trl

    path = Path(trl.__file__).resolve().parent / "chat_templates" / "qwen3.jinja"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing; TRACE needs a trl release that ships chat_templates/qwen3.jinja "
                                "(pip install 'trl>=0.24')")
    return path.read_text(encoding="utf-8")


def default_corpus_envs() -> list[str]:
    """The env ids whose text trains the tokenizer when none are named.

    The built-in registry's target and capability envs without requirements, each at its first published
    version: a stable set, so that a new ``-vN`` of an env, a trainer sanity task, or a workspace of generated
    envs named by ``TRACE_REGISTRY`` never changes the tokenizer, and with it the content key and the base a
    recipe builds.
    """
    import trace_envs
    from trace_envs.core.registry import BUILTIN_REGISTRY

    first: dict[str, tuple[int, str]] = {}
    for e in trace_envs.registered():
        if e.requires or e.kind == "sanity" or Path(e.source or "").resolve() != BUILTIN_REGISTRY.resolve():
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


def train_tokenizer(texts: list[str], vocab_size: int, split: str = "words"):
    """A byte-level BPE tokenizer with the chat markup as added tokens.

    ``split`` names the pre-tokenizer's pattern in :data:`SPLITS`: ``words`` (letter runs, digit runs, the
    rest) or ``keys`` (also a snake_case name whole).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    if split not in SPLITS:
        raise ValueError(f"unknown tokenizer split {split!r}; choose one of {', '.join(SPLITS)}")
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLITS[split]), behavior="isolated"),
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
