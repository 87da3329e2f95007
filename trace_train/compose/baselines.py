"""The alternatives a composed model is compared against, built by the same verb (``trace compose``).

* :func:`merge_adapters` — PEFT's own merges of the K adapters into one (``add_weighted_adapter``,
  ``linear`` or ``ties``), written as an ordinary PEFT adapter folder: run it with
  ``HFAgent(base, adapter=folder)``.
* :class:`PerEpisodeRouter` — one adapter per episode, chosen from the first observation (the system
  prompt and first user message) by the trained gates, pooled over those tokens and over the blocks,
  then fixed for the whole episode. This is what vLLM's multi-LoRA serving can already run (one adapter
  per request); a composed folder whose ``compose.json`` says ``"routing": "per_episode"`` loads with it.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .adapters import ComposeError, folder_digest, resolve_adapters

MERGE_METHODS = ("linear", "ties")


def merge_adapters(base: str | Path, adapters: Mapping[str, Any] | Iterable[Any], out: str | Path,
                   method: str = "linear", weights: Sequence[float] | None = None, density: float = 0.5) -> Path:
    """Merge K LoRA adapters into one PEFT adapter folder with PEFT's ``add_weighted_adapter``.

    Args:
        base: the base model folder.
        adapters: adapter folders (``name=folder`` strings or a mapping, as for :func:`compose`).
        out: the merged adapter's folder (written; its ``merge.json`` records the sources and hashes).
        method: ``"linear"`` (weights default 1/K: the average) or ``"ties"`` (weights default 1.0,
            ``density`` of each task vector kept before sign election).
        weights: one weight per adapter.
        density: TIES density in (0, 1].
    """
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    if method not in MERGE_METHODS:
        raise ComposeError(f"unknown merge method {method!r}; choose one of {', '.join(MERGE_METHODS)}")
    refs = resolve_adapters(adapters)
    k = len(refs)
    if weights is None:
        weights = [1.0 / k] * k if method == "linear" else [1.0] * k
    if len(weights) != k:
        raise ComposeError(f"{len(weights)} merge weights for {k} adapters")
    if method == "ties" and not 0 < density <= 1:
        raise ComposeError(f"density must be in (0, 1], got {density}")
    if len({r.config.get("r") for r in refs}) > 1:
        raise ComposeError(f"PEFT's {method} merge needs adapters of one rank; these have ranks "
                           f"{[r.config.get('r') for r in refs]} (train them with one LoRA rank)")
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    names = [f"e{i}" for i in range(k)]
    peft_model = PeftModel.from_pretrained(model, str(refs[0].path), adapter_name=names[0])
    for name, ref in zip(names[1:], refs[1:]):
        peft_model.load_adapter(str(ref.path), adapter_name=name)
    extra = {"density": density} if method == "ties" else {}
    peft_model.add_weighted_adapter(names, list(weights), "merged", combination_type=method, **extra)
    out = Path(out)
    with tempfile.TemporaryDirectory(dir=out.parent if out.parent.exists() else None) as tmp:
        peft_model.save_pretrained(tmp, selected_adapters=["merged"])
        saved = Path(tmp) / "merged" if (Path(tmp) / "merged").is_dir() else Path(tmp)
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(saved, out)
    config_file = out / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = str(Path(base).resolve())
    config_file.write_text(json.dumps(config, indent=2))
    (out / "merge.json").write_text(json.dumps({
        "method": method, "weights": list(weights), "density": density if method == "ties" else None,
        "base": str(Path(base).resolve()), "base_sha256": folder_digest(base),
        "adapters": [r.as_json() for r in refs]}, indent=2) + "\n")
    return out


class PerEpisodeRouter:
    """Chooses one adapter per episode from its first observation, with a composed model's gates.

    The first observation is every token up to the end of the first user message (found with the
    tokenizer's ``<|im_start|>user`` marker; the whole prompt when it has none). Each block's gate
    probabilities over the K adapter slots are averaged over the first user message's tokens (the request:
    the system prompt before it is the same in every episode, and a router trained with
    ``label_from="first_observation"`` was never told where its tokens go) and over the blocks; the
    episode gets the arg-max adapter for all its tokens and turns. Gates trained for segment routing (the
    composed folder records ``segment_token_id``) were taught only at each message's first token, so for them
    the decision is read at the first ``<|im_start|>`` after the first observation, the one that opens the
    agent's first message, with the earlier messages routed as segment routing would. Decisions are cached per first
    observation, so later turns of an episode (whose prompts start the same way) cost nothing.

    Args:
        model: the :class:`~trace_train.compose.ComposedModel` whose gates decide.
        user_marker: token ids of ``<|im_start|>user`` (default: read from the base's tokenizer).
        end_id: token id of ``<|im_end|>``.
    """

    def __init__(self, model: Any, user_marker: Sequence[int] | None = None, end_id: int | None = None,
                 cache_size: int = 4096) -> None:
        self.model = model
        self.user_marker = list(user_marker or [])
        self.end_id = end_id
        self.cache_size = cache_size
        self._cache: dict[tuple[int, ...], int] = {}
        self.last_slots: list[int] = []

    @classmethod
    def for_model(cls, model: Any, tokenizer: Any = None) -> "PerEpisodeRouter":
        if tokenizer is None:
            try:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(model.spec.base)
            except (OSError, ValueError):
                return cls(model)
        marker = tokenizer("<|im_start|>user", add_special_tokens=False)["input_ids"]
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        return cls(model, marker, end if isinstance(end, int) and end >= 0 else None)

    def _marker_at(self, tokens: list[int]) -> int | None:
        """Where the first ``<|im_start|>user`` marker starts in ``tokens`` (None without one)."""
        m = self.user_marker
        if m:
            for i in range(len(tokens) - len(m) + 1):
                if tokens[i:i + len(m)] == m:
                    return i
        return None

    def request_start(self, tokens: list[int]) -> int:
        """Where the first user message starts in ``tokens`` (0 without the marker)."""
        at = self._marker_at(tokens)
        return 0 if at is None else at

    def first_observation(self, tokens: list[int]) -> list[int]:
        at = self._marker_at(tokens)
        if at is not None and self.end_id is not None:
            after = at + len(self.user_marker)
            if self.end_id in tokens[after:]:
                return tokens[:tokens.index(self.end_id, after) + 1]
        return tokens

    def decision_prefix(self, tokens: list[int]) -> list[int]:
        """The tokens the choice rests on: the first observation, and for segment-trained gates up to the
        ``<|im_start|>`` after it (where those gates decide), when the prompt has it."""
        prefix = self.first_observation(tokens)
        seg = self._segment_id()
        if seg is not None and seg in tokens[len(prefix):]:
            return tokens[:tokens.index(seg, len(prefix)) + 1]
        return prefix

    def _segment_id(self) -> int | None:
        return getattr(getattr(self.model, "spec", None), "segment_token_id", None)

    def choose(self, input_ids, attention_mask=None) -> "Any":
        """One slot (1..K) per row of ``input_ids``; padding (``attention_mask`` 0) is ignored."""
        import torch

        rows = []
        for b in range(input_ids.shape[0]):
            toks = input_ids[b]
            if attention_mask is not None:
                toks = toks[attention_mask[b].bool()]
            rows.append(self.slot_for(toks.tolist()))
        self.last_slots = rows
        return torch.tensor(rows, dtype=torch.long)

    def slot_for(self, tokens: list[int]) -> int:
        """The slot (1..K) of the episode whose prompt is ``tokens`` (unpadded), cached per decision prefix."""
        prefix = self.decision_prefix(list(tokens))
        key = tuple(prefix)
        if key not in self._cache:
            if len(self._cache) >= self.cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = self._decide(prefix)
        return self._cache[key]

    def _decide(self, prefix: list[int]) -> int:
        import torch

        model = self.model
        device = next(model.gates.parameters()).device
        segment = self._segment_id() is not None and prefix[-1] == self._segment_id()
        routing = model.spec.routing
        try:
            if segment:  # the messages before the decision routed as the gates were trained to
                model.spec.routing = "segment"
            with torch.no_grad(), model.force_routing(None), model.recording(logits=True, choices=False) as routers:
                model.model(input_ids=torch.tensor([prefix], device=device), use_cache=False)
                start = len(prefix) - 1 if segment else min(self.request_start(prefix), len(prefix) - 1)
                probs = torch.stack([torch.softmax(r.logits[0, start:].float(), -1).mean(0)
                                     for r in routers]).mean(0)
        finally:
            model.spec.routing = routing
        return int(probs[1:].argmax()) + 1
