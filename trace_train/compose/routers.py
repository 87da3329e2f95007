"""Routers of the field beside the token-level MoE, built by the same verb (``trace compose --composers ...``).

Neither trains a gate; both are compared with the MoE in the evaluation (when one conversation needs
two capabilities, does switching per token beat choosing once?).

* :class:`PerTaskRouter` — the TRACE authors' routing as their paper and released code describe it: one choice
  per task, before it starts, then **one merge of the chosen adapter for the whole task** (every token, every
  turn). The choice is the base model's: ``nearest`` retrieves the successful trajectories (the router's data)
  whose first request reads most like this one (cosine of the base's mean last hidden state over the request)
  and takes their adapter by a similarity-weighted vote; ``zero_shot`` asks the base which specialist fits the
  task (a multiple-choice question over the adapters' descriptions, scored by the next-token log-probability of
  each option's letter). A composed folder whose ``compose.json`` says ``"routing": "per_task"`` loads with it;
  its ``task_router.safetensors`` holds the retrieval index. The chosen adapter (top-1) is applied with weight 1:
  with one adapter chosen, "the merge" is that adapter.
* PEFT's **Arrow** (``peft.create_arrow_model``, ``ArrowConfig``): per token and per adapted layer, each adapter's
  prototype (the top right singular vector of its ``B A``) is scored against the token's input, and the
  ``top_k`` best adapters are mixed by a softmax of their absolute scores over ``router_temperature``: per-token
  routing with no router training. :func:`write_arrow` writes a folder (``arrow.json``: the base and adapters by
  path and SHA-256, the settings; the tokenizer) that :func:`load_arrow` — and :func:`trace_train.compose.load.load_composed`, which
  :class:`trace_train.agents.HFAgent` calls — builds into PEFT's Arrow model. It has no base slot: every token
  goes through adapters.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

from .adapters import ComposeError, folder_digest, resolve_adapters
from .baselines import PerEpisodeRouter

logger = logging.getLogger(__name__)

#: How :class:`PerTaskRouter` chooses: ``nearest`` successful trajectories, or the base's ``zero_shot`` answer.
TASK_CHOICES = ("nearest", "zero_shot")
#: The retrieval index of a per-task folder (request embeddings and their adapter slots).
TASK_INDEX_FILE = "task_router.safetensors"
#: The file that marks an Arrow folder.
ARROW_FILE = "arrow.json"
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class PerTaskRouter(PerEpisodeRouter):
    """Chooses one adapter per task from its first observation, as the TRACE authors route: without the gates.

    The decision rests on the first user message (the request; the system prompt is the same for every task) and
    is cached per first observation, as :class:`~trace_train.compose.PerEpisodeRouter`'s is, so later turns of a
    task keep it.

    Args:
        model: the :class:`~trace_train.compose.ComposedModel` whose base decides and whose adapters apply.
        choice: ``"nearest"`` or ``"zero_shot"`` (:data:`TASK_CHOICES`).
        index: for ``nearest``: ``{"embeddings": (N, hidden) unit rows, "slots": (N,) long}``.
        neighbours: for ``nearest``: how many of the most similar trajectories vote.
        descriptions: for ``zero_shot``: one text per adapter slot (1..K), the options the base chooses among.
        tokenizer: the base's tokenizer (for ``zero_shot``: the question is written with its chat template).
    """

    def __init__(self, model: Any, choice: str = "nearest", index: Mapping[str, Any] | None = None,
                 neighbours: int = 5, descriptions: Sequence[str] | None = None, tokenizer: Any = None,
                 user_marker: Sequence[int] | None = None, end_id: int | None = None) -> None:
        if choice not in TASK_CHOICES:
            raise ComposeError(f"per-task routing chooses by one of {', '.join(TASK_CHOICES)}, got {choice!r}")
        if choice == "nearest" and (index is None or len(index["slots"]) == 0):
            raise ComposeError("per-task routing by nearest trajectories needs an index of successful episodes "
                               "(compose with trajectories, or choose 'zero_shot')")
        if choice == "zero_shot" and (tokenizer is None or not descriptions):
            raise ComposeError("zero-shot per-task routing needs the base's tokenizer and one description per "
                               "adapter")
        super().__init__(model, user_marker, end_id)
        self.choice, self.index, self.neighbours = choice, index, max(1, int(neighbours))
        self.descriptions, self.tokenizer = list(descriptions or []), tokenizer

    @classmethod
    def for_model(cls, model: Any, tokenizer: Any = None) -> "PerTaskRouter":
        """The router a per-task composed folder describes (``compose.json``'s ``task_routing``, its index)."""
        from transformers import AutoTokenizer

        settings = dict(getattr(model.spec, "task_routing", None) or {})
        tokenizer = tokenizer or AutoTokenizer.from_pretrained(model.spec.base)
        marker = tokenizer("<|im_start|>user", add_special_tokens=False)["input_ids"]
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        return cls(model, choice=settings.get("choice", "nearest"), index=getattr(model, "task_index", None),
                   neighbours=settings.get("neighbours", 5), descriptions=settings.get("descriptions"),
                   tokenizer=tokenizer, user_marker=marker, end_id=end if isinstance(end, int) and end >= 0 else None)

    def decision_prefix(self, tokens: list[int]) -> list[int]:
        return self.first_observation(tokens)  # no gates: segment-trained or not, the request decides

    def request(self, tokens: list[int]) -> list[int]:
        """The first user message's tokens (the whole first observation when the prompt has no user marker)."""
        prefix = self.first_observation(list(tokens))
        return prefix[min(self.request_start(prefix), len(prefix) - 1):]

    def embed(self, tokens: Sequence[int]) -> Any:
        """The base's view of a task: its mean last hidden state over the request, unit length (float32)."""
        import torch

        model = self.model
        prefix = self.first_observation(list(tokens))
        start = min(self.request_start(prefix), len(prefix) - 1)
        device = next(model.gates.parameters()).device
        with torch.no_grad(), model.force_routing(0):
            out = model.model(input_ids=torch.tensor([prefix], device=device), use_cache=False,
                              output_hidden_states=True)
        h = out.hidden_states[-1][0, start:].float().mean(0)
        return torch.nn.functional.normalize(h, dim=0).cpu()

    def _decide(self, prefix: list[int]) -> int:
        return self._nearest(prefix) if self.choice == "nearest" else self._zero_shot(prefix)

    def _nearest(self, prefix: list[int]) -> int:
        import torch

        sims = self.index["embeddings"].float() @ self.embed(prefix)
        top = torch.topk(sims, min(self.neighbours, sims.numel()))
        votes: dict[int, float] = {}
        for sim, slot in zip(top.values.tolist(), self.index["slots"][top.indices].tolist()):
            votes[int(slot)] = votes.get(int(slot), 0.0) + max(sim, 0.0) + 1e-6
        return max(votes, key=lambda s: (votes[s], -s))

    def question(self, prefix: list[int]) -> list[int]:
        """The zero-shot question for the task whose first observation is ``prefix`` (token ids)."""
        text = self.tokenizer.decode(self.request(prefix), skip_special_tokens=True).strip()
        if text.startswith("user"):
            text = text[len("user"):].strip()
        options = "\n".join(f"{_LETTERS[i]}. {d}" for i, d in enumerate(self.descriptions))
        content = (f"A task begins with this request:\n{text}\n\nWhich specialist should handle the whole task?\n"
                   f"{options}\nAnswer with one letter.")
        return list(self.tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=True,
                                                       add_generation_prompt=True, return_dict=False))

    def option_scores(self, prefix: list[int]) -> list[float]:
        """The base's next-token log-probability of each option's letter after the question."""
        import torch

        ids = self.question(prefix)
        device = next(self.model.gates.parameters()).device
        with torch.no_grad(), self.model.force_routing(0):
            logits = self.model.model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
        logp = torch.log_softmax(logits.float(), -1)
        letters = [self.tokenizer(_LETTERS[i], add_special_tokens=False)["input_ids"][0]
                   for i in range(len(self.descriptions))]
        return [float(logp[t]) for t in letters]

    def _zero_shot(self, prefix: list[int]) -> int:
        scores = self.option_scores(prefix)
        return max(range(len(scores)), key=lambda i: scores[i]) + 1


def build_task_index(model: Any, sequences: Sequence[Sequence[int]], slots: Sequence[int]) -> dict[str, Any]:
    """The retrieval index of ``nearest`` per-task routing: each sequence's request embedding and its slot."""
    import torch

    router = PerTaskRouter.__new__(PerTaskRouter)  # only embed(): no index yet
    base = PerEpisodeRouter.for_model(model)
    PerEpisodeRouter.__init__(router, model, base.user_marker, base.end_id)
    rows = [router.embed(s) for s in sequences]
    if not rows:
        raise ComposeError("per-task routing by nearest trajectories: no labelled successful episode to index")
    return {"embeddings": torch.stack(rows).contiguous(), "slots": torch.tensor(list(slots), dtype=torch.long)}


def default_descriptions(names: Sequence[str], given: Mapping[str, str] | None = None) -> list[str]:
    """One option text per adapter: ``given[name]``, else the adapter's name read as words."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ComposeError(f"task_descriptions name adapters that are not composed: {unknown}; composed: {list(names)}")
    return [given.get(n) or n.replace("_", " ").replace("-", " ") for n in names]


# ------------------------------------------------------------------------------------------------ Arrow


def write_arrow(base: str | Path, adapters: Mapping[str, Any] | Sequence[Any], out: str | Path, top_k: int = 3,
                router_temperature: float = 1.0, tokenizer: Any = None) -> Path:
    """Write an Arrow folder over ``adapters`` (PEFT's Arrow routing, built when the folder is loaded).

    Args:
        top_k: adapters mixed per token (PEFT's default 3; at most the number of adapters).
        router_temperature: the softmax temperature over the chosen adapters' prototype scores.

    The adapters are checked now by building the Arrow model once (PEFT refuses adapters of different ranks or
    target modules, or ones that adapt other than linear layers).
    """
    refs = resolve_adapters(adapters)
    top_k = int(top_k)
    if not 1 <= top_k:
        raise ComposeError(f"Arrow's top_k must be >= 1, got {top_k}")
    if router_temperature <= 0:
        raise ComposeError(f"Arrow's router_temperature must be > 0, got {router_temperature}")
    out = Path(out)
    spec = {"format": "trace-arrow", "version": 1, "base": str(Path(base).resolve()),
            "base_sha256": folder_digest(base), "adapters": [r.as_json() for r in refs],
            "top_k": min(top_k, len(refs)), "router_temperature": float(router_temperature),
            # the prototypes' power iteration starts from a random vector: seeded, a folder loads the same each time
            "rng_seed": 0}
    _arrow_model(spec)  # refuses incompatible adapters before anything is written
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / ARROW_FILE).write_text(json.dumps(spec, indent=2) + "\n")
    if tokenizer is None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(base))
    tokenizer.save_pretrained(out)
    for extra in ("generation_config.json", "trace_model.json"):  # generation defaults; the env kwargs it needs
        if (Path(base) / extra).is_file():
            shutil.copyfile(Path(base) / extra, out / extra)
    return out


def _arrow_model(spec: Mapping[str, Any], dtype: Any = None) -> Any:
    import torch
    from peft import ArrowConfig, create_arrow_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(spec["base"], dtype=dtype or torch.float32)
    try:
        return create_arrow_model(model, [a["path"] for a in spec["adapters"]],
                                  ArrowConfig(top_k=int(spec["top_k"]),
                                              router_temperature=float(spec["router_temperature"]),
                                              rng_seed=spec.get("rng_seed")))
    except (ValueError, TypeError) as exc:
        raise ComposeError(f"PEFT's Arrow refused these adapters: {exc}") from None


def is_arrow_dir(path: str | Path) -> bool:
    """True for a folder written by :func:`write_arrow`."""
    return (Path(path) / ARROW_FILE).is_file()


def load_arrow(path: str | Path, dtype: Any = None, check_hashes: bool = True) -> Any:
    """PEFT's Arrow model over the base and adapters an Arrow folder references (hash-checked)."""
    path = Path(path)
    if not is_arrow_dir(path):
        raise ComposeError(f"{path} is not an Arrow folder (no {ARROW_FILE}); write one with write_arrow or "
                           "`trace compose --composers arrow`")
    spec = json.loads((path / ARROW_FILE).read_text())
    if spec.get("format") != "trace-arrow":
        raise ComposeError(f"{path / ARROW_FILE}: not an Arrow spec this version of TRACE reads")
    for what, folder, digest in [("base", spec["base"], spec["base_sha256"])] + [
            (f"adapter {a['name']!r}", a["path"], a["sha256"]) for a in spec["adapters"]]:
        if not Path(folder).is_dir():
            raise ComposeError(f"{path}: its {what} {folder} is missing; restore it or compose again")
        if check_hashes and folder_digest(folder) != digest:
            raise ComposeError(f"{path}: the {what} at {folder} changed since composing (SHA-256 differs); "
                               "compose again, or load with check_hashes=False at your own risk")
    model = _arrow_model(spec, dtype)
    model.config._name_or_path = str(path)
    return model


__all__ = ["ARROW_FILE", "PerTaskRouter", "TASK_CHOICES", "TASK_INDEX_FILE", "build_task_index",
           "default_descriptions", "is_arrow_dir", "load_arrow", "write_arrow"]
