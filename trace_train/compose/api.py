"""``compose()``: stage four of TRACE end to end — build, train the gates, save, measure, baselines.

Reads the K capability adapters (``trace train`` outputs) and trajectory files, writes one folder::

    <out>/compose.json, gates.safetensors, tokenizer files   the composed model (HFAgent loads <out>)
    <out>/router_log.csv, router_loss.png                    gate training
    <out>/routing.csv, routing.png                           share of tokens per expert, per env and role
    <out>/baselines/linear/, baselines/ties/                 PEFT merges (adapter folders)
    <out>/baselines/per_episode/                             one adapter per episode (a composed folder)
    <out>/baselines/per_task/                                the authors' per-task routing (``composers``)
    <out>/baselines/arrow/                                   PEFT's Arrow routing (``composers``)
    <out>/methods.json                                       how to load every method for `trace eval`

``methods.json`` maps a method name to ``{"model": ..., "adapter": ...}``, the arguments of
:class:`trace_train.agents.HFAgent`, for the composed model, each baseline and each single adapter.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .adapters import ComposeError, adapter_update_is_zero, resolve_adapters
from .baselines import MERGE_METHODS, merge_adapters
from .data import capability_of, encode, is_successful, label_slots, read_trajectories, trained_envs
from .model import COMPOSE_FILE, ComposedModel
from .train import RouterTrainConfig, routing_stats, train_router, write_routing, write_train_log

logger = logging.getLogger(__name__)

BASELINES = ("linear", "ties", "per_episode")
#: Routers of the field built on request (``composers``): the TRACE authors' per-task routing and PEFT's Arrow
#: (:mod:`trace_train.compose.routers`).
COMPOSERS = ("per_task", "arrow", "top2", "top4")


@dataclass
class ComposeResult:
    """What :func:`compose` wrote.

    Attributes:
        out_dir: the composed model's folder (``HFAgent(out_dir)`` / ``ComposedModel.from_pretrained``).
        routing_csv, heatmap_png: routing statistics (None without trajectories).
        train_log_csv, loss_png: router training log and curve (None when not trained).
        baselines: method name -> folder (merged adapters, the per-episode composed folder).
        methods_json: every method's HFAgent arguments.
        episodes: successful episodes the router trained on.
        labelled_envs: env id -> adapter name used by the label loss (``"base"`` for the base slot).
        dropped: adapters left out, because their LoRA update is exactly zero (they are the base slot) or the
            caller named them in ``leave_out``; the envs they claimed label the base slot.
        dropped_why: adapter name -> why it was left out.
    """

    out_dir: Path
    routing_csv: Path | None = None
    heatmap_png: Path | None = None
    train_log_csv: Path | None = None
    loss_png: Path | None = None
    baselines: dict[str, Path] = field(default_factory=dict)
    methods_json: Path | None = None
    episodes: int = 0
    labelled_envs: dict[str, str] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    dropped_why: dict[str, str] = field(default_factory=dict)


def router_config(train: RouterTrainConfig | Mapping[str, Any] | None) -> RouterTrainConfig | None:
    """``train`` as a :class:`RouterTrainConfig` (a dict names its fields; an unknown one is a :class:`ComposeError`)."""
    if train is None or isinstance(train, RouterTrainConfig):
        return train
    if not isinstance(train, Mapping):
        raise ComposeError(f"router training settings must be a mapping of RouterTrainConfig fields, got {train!r}")
    fields = set(RouterTrainConfig.__dataclass_fields__)
    unknown = sorted(set(train) - fields)
    if unknown:
        raise ComposeError(f"unknown router training setting(s) {unknown}; known: {', '.join(sorted(fields))}")
    return RouterTrainConfig(**train)


def compose(base: str | Path, adapters: Mapping[str, Any] | Iterable[Any], data: str | Path | Sequence[Any] | None,
            out: str | Path, top_k: int = 1, train: RouterTrainConfig | Mapping[str, Any] | None = None,
            adapter_envs: Mapping[str, Sequence[str]] | None = None, baselines: Sequence[str] = BASELINES,
            min_reward: float | None = None, max_length: int = 4096, stats_episodes: int = 64,
            base_bias: float = 5.0, gate_input: str = "token", threads: int | None = 1, device: str = "cpu",
            base_envs: Sequence[str] = (), drop_zero_updates: bool = True,
            leave_out: Mapping[str, str] | None = None, gate_weight: str = "prob", routing: str = "token",
            composers: Sequence[str] = (), task_choice: str = "nearest", task_neighbours: int = 5,
            task_descriptions: Mapping[str, str] | None = None, arrow_top_k: int = 3,
            arrow_temperature: float = 1.0, progress: bool = True) -> ComposeResult:
    """Compose K capability adapters into one token-routed model and write it with its baselines.

    Args:
        base: the base model folder the adapters were trained on.
        adapters: PEFT LoRA adapter folders, ``name=folder`` strings or ``{name: folder}`` (slot k = k-th).
        data: trajectory JSONL files or folders; the successful episodes train the gates, all of them
            (up to ``stats_episodes`` per env) give the routing statistics. ``None`` writes fresh gates
            (the composed model is then the base model).
        out: output folder.
        top_k: slots per token (1 = the paper's default; 2, 4 for the ablation).
        train: router training settings: a :class:`RouterTrainConfig` or a dict of its fields (a YAML
            config's ``compose.options.train``); docs/design.md, "The method's settings" defaults.
        adapter_envs: adapter name -> env ids whose episodes it labels (default: the envs in the
            adapter's ``trace_adapter.json``, written by ``trace train``; else the env whose capability is
            the adapter's name, e.g. ``trace/precondition_verification-v1``).
        baselines: which of ``linear``, ``ties``, ``per_episode`` to build as well.
        min_reward: count an episode as successful at reward >= this (default: its ``success`` flag).
        max_length: tokens per episode at most (longer ones are cut).
        stats_episodes: episodes per env for the routing statistics.
        base_bias: initial bias of the base slot.
        gate_input: what the gates read: ``"token"`` (the block input at the token, the paper's gate) or
            ``"context"`` (and the causal mean of the block inputs so far; for shallow models whose token
            states do not carry the task), or ``"request"`` (that mean restarted at each user message that is
            not a tool result: the request being served). See :mod:`trace_train.compose.model`.
        gate_weight: the forward weight of a chosen slot's update: ``"prob"`` (its gate probability: the paper's
            multiplicative gating) or ``"one"`` (renormalised over the chosen slots, so top-1 adds the whole
            update; straight-through gradient). See :data:`trace_train.compose.model.GATE_WEIGHTS`.
        routing: how the gates' choices apply, in router training and after: ``"token"`` (each token its own,
            the paper's) or ``"segment"`` (the choice at each chat message's first token held to its end; see
            :mod:`trace_train.compose.model`).
        threads: ``torch.set_num_threads`` (None leaves it alone).
        device: torch device.
        base_envs: env ids whose episodes the label loss sends to the base slot (tasks where the base
            should answer, e.g. a capability whose adapter learnt nothing).
        drop_zero_updates: leave out every adapter whose LoRA update is exactly zero
            (:func:`~trace_train.compose.adapters.adapter_update_is_zero`, GRPO whose every group was flat),
            as long as one adapter with an update remains. Such an adapter is the base slot over again: kept,
            the router splits tokens between two copies of the base, and a linear merge halves the other
            adapters' updates. The envs it claimed label the base slot. ``ComposeResult.dropped`` names them.
        leave_out: adapter name -> reason: adapters to leave out in the same way, on the caller's judgement
            (``trace run`` with ``compose.drop_unimproved``: no checkpoint did better than the base on its env's
            validation seeds). As with zero updates, when every adapter would be left out, none is.
        composers: routers of the field to build beside the MoE (:data:`COMPOSERS`), each written under
            ``baselines/`` and listed in ``methods.json``: ``per_task``, the TRACE authors' routing (one adapter
            per task chosen by the base, then applied to the whole task: a composed folder with routing
            ``per_task``), and ``arrow``, PEFT's Arrow (per-token routing by the adapters' own singular vectors,
            no router training), and ``top2`` / ``top4``: the composed model with the same gates at top-2 / top-4
            (the paper's ablation, on the router trained at ``top_k``; skipped where K + 1 slots are fewer). See
            :mod:`trace_train.compose.routers`.
        task_choice: how per-task routing chooses: ``nearest`` (the successful trajectories whose first request
            the base reads most alike; needs ``data``) or ``zero_shot`` (the base answers a multiple-choice
            question over ``task_descriptions``).
        task_neighbours: ``nearest``: how many trajectories vote.
        task_descriptions: ``zero_shot``: adapter name -> the option's text (default: the name as words).
        arrow_top_k, arrow_temperature: PEFT's ``ArrowConfig`` (adapters mixed per token, at most K; softmax
            temperature).
        progress: tqdm bars.
    """
    import torch
    from transformers import AutoTokenizer

    from .model import GATE_ROUTINGS, GATE_WEIGHTS

    if gate_weight not in GATE_WEIGHTS:
        raise ComposeError(f"gate_weight must be one of {', '.join(GATE_WEIGHTS)}, got {gate_weight!r}")
    if routing not in GATE_ROUTINGS:
        raise ComposeError(f"routing must be one of {', '.join(GATE_ROUTINGS)}, got {routing!r} "
                           "(per-episode routing is a baseline of its own: baselines=['per_episode'])")
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        raise ComposeError(f"unknown baselines {sorted(unknown)}; choose from {', '.join(BASELINES)}")
    from .routers import TASK_CHOICES

    if isinstance(composers, str) or set(composers) - set(COMPOSERS):
        raise ComposeError(f"composers must be a list of {', '.join(COMPOSERS)}, got {composers!r}")
    if task_choice not in TASK_CHOICES:
        raise ComposeError(f"task_choice must be one of {', '.join(TASK_CHOICES)}, got {task_choice!r}")
    if "per_task" in composers and task_choice == "nearest" and not data:
        raise ComposeError("per-task routing by nearest trajectories needs trajectories (data), or "
                           "task_choice='zero_shot'")
    train = router_config(train)
    if threads:
        torch.set_num_threads(threads)
    out = Path(out)
    # Everything that can be wrong with the inputs is checked before the model loads or anything is written.
    refs = resolve_adapters(adapters)
    every = {r.name: str(r.path) for r in refs}
    records = read_trajectories(data) if data else []
    if data and not records:
        raise ComposeError(f"{data}: no trajectories found")
    claims = {k: list(v) for k, v in (adapter_envs or {}).items()}
    for ref in refs:  # an adapter from `trace train` names the envs it was trained on
        if ref.name not in claims and trained_envs(ref.path):
            claims[ref.name] = trained_envs(ref.path)
    unknown = sorted(set(leave_out or {}) - set(every))
    if unknown:
        raise ComposeError(f"leave_out names adapters that were not given: {unknown}; given: {sorted(every)}")
    why = {n: "a zero update (the base itself)" for n, path in every.items()
           if drop_zero_updates and adapter_update_is_zero(path)}
    why.update({n: reason for n, reason in (leave_out or {}).items() if n not in why})
    if len(why) == len(every):
        why = {}  # nothing would remain: composing every adapter is the only composition there is
    left_out = [n for n in every if n in why]
    named = {n: path for n, path in every.items() if n not in left_out}
    label_slots(records, list(every), claims)  # checks the claims' names against every adapter given
    base_claims = list(base_envs) + [env for n in left_out for env in claims.get(n, [])]
    base_claims += [r["env_id"] for r in records if capability_of(r["env_id"]) in left_out]
    slots = label_slots(records, list(named), {k: v for k, v in claims.items() if k not in left_out})
    for env in base_claims:
        slots.setdefault(env, 0)  # the base slot; an env an adapter claims stays that adapter's
    for n in left_out:
        logger.info("left out adapter %s: %s; its envs label the base slot", n, why[n])
    successful = [r for r in records if is_successful(r, min_reward)]
    if records and not successful:
        raise ComposeError(f"none of the {len(records)} trajectories succeeded; the router learns from "
                           "successful episodes (lower --min-reward, or roll out each adapter on its own env)")
    model = ComposedModel.build(base, named, top_k=top_k, base_bias=base_bias, device=device, gate_input=gate_input,
                                gate_weight=gate_weight)
    model.routing = routing  # before router training: the joint loss trains the routing the model will use
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    result = ComposeResult(out_dir=out)
    result.labelled_envs = {env: model.adapter_names[s - 1] if s else "base" for env, s in sorted(slots.items())}
    result.dropped, result.dropped_why = left_out, {n: why[n] for n in left_out}
    if records and not slots and (train or RouterTrainConfig()).label_coef > 0:
        logger.warning("no trajectory's env matches an adapter name; the label loss is off (name adapters "
                       "NAME=DIR after their capability, or pass adapter_envs)")
    encoded = [encode(tokenizer, r, slots.get(r["env_id"]), max_length) for r in successful]
    result.episodes = len(encoded)
    out.mkdir(parents=True, exist_ok=True)
    if encoded:
        log = train_router(model, encoded, train, progress=progress)
        result.train_log_csv, result.loss_png = write_train_log(log, out)
    model.save_pretrained(out, tokenizer=tokenizer)

    if records:
        per_env: dict[str, int] = {}
        sample = []
        for r in records:
            if per_env.get(r["env_id"], 0) < stats_episodes:
                per_env[r["env_id"]] = per_env.get(r["env_id"], 0) + 1
                sample.append(encode(tokenizer, r, slots.get(r["env_id"]), max_length))
        rows = routing_stats(model, sample, progress=progress)
        result.routing_csv, result.heatmap_png = write_routing(rows, model.slot_names(), out)

    methods: dict[str, dict] = {"composed": {"model": str(out.resolve()), "adapter": None}}
    for method in baselines:
        folder = out / "baselines" / method
        if method in MERGE_METHODS:
            try:
                merge_adapters(base, named, folder, method=method)
            except ComposeError as exc:  # e.g. a linear merge of adapters of different ranks
                logger.warning("baseline %s skipped: %s", method, exc)
                continue
            methods[method] = {"model": str(Path(base).resolve()), "adapter": str(folder.resolve())}
        elif len(named) < 2:  # one adapter per episode over a single adapter is that adapter
            reasons = "; ".join(f"{n} left out: {why[n]}" for n in left_out)
            logger.warning("baseline %s skipped: it chooses among adapters, and only %s remains%s", method,
                           list(named), f" ({reasons})" if reasons else "")
            continue
        else:
            if folder.exists():
                shutil.rmtree(folder)
            shutil.copytree(out, folder, ignore=shutil.ignore_patterns("baselines", "*.png", "*.csv", "methods.json"))
            spec = json.loads((folder / COMPOSE_FILE).read_text())
            spec["routing"] = "per_episode"
            (folder / COMPOSE_FILE).write_text(json.dumps(spec, indent=2) + "\n")
            methods[method] = {"model": str(folder.resolve()), "adapter": None}
        result.baselines[method] = folder
    for method in composers:
        folder = out / "baselines" / method
        if method in ("top2", "top4"):
            k = int(method[3:])
            if k > len(named) + 1 or k == top_k:
                logger.warning("composer %s skipped: %s", method, f"only {len(named) + 1} slots"
                               if k > len(named) + 1 else f"the composed model is already top-{k}")
                continue
            if folder.exists():
                shutil.rmtree(folder)
            shutil.copytree(out, folder, ignore=shutil.ignore_patterns("baselines", "*.png", "*.csv", "methods.json"))
            spec = json.loads((folder / COMPOSE_FILE).read_text())
            spec["top_k"] = k
            (folder / COMPOSE_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        elif method == "arrow":
            from .routers import write_arrow

            try:
                write_arrow(base, named, folder, top_k=arrow_top_k, router_temperature=arrow_temperature,
                            tokenizer=tokenizer)
            except ComposeError as exc:  # e.g. adapters of different ranks
                logger.warning("composer arrow skipped: %s", exc)
                continue
        else:
            _write_per_task(model, out, folder, encoded, task_choice, task_neighbours, task_descriptions)
        methods[method] = {"model": str(folder.resolve()), "adapter": None}
        result.baselines[method] = folder
    for name, path in every.items():
        methods[f"adapter:{name}"] = {"model": str(Path(base).resolve()), "adapter": path}
    result.methods_json = out / "methods.json"
    result.methods_json.write_text(json.dumps(methods, indent=2) + "\n")
    return result


def _write_per_task(model: ComposedModel, out: Path, folder: Path, encoded: Sequence[Any], choice: str,
                    neighbours: int, descriptions: Mapping[str, str] | None) -> None:
    """The per-task composed folder: the composed model's files with routing ``per_task`` and its settings, and
    (``nearest``) the retrieval index of the router's labelled successful episodes."""
    from safetensors.torch import save_file

    from .routers import TASK_INDEX_FILE, build_task_index, default_descriptions

    settings: dict[str, Any] = {"choice": choice}
    index = None
    if choice == "nearest":
        labelled = [e for e in encoded if e.slot is not None]
        index = build_task_index(model, [e.ids[:e.first_observation] for e in labelled], [e.slot for e in labelled])
        settings["neighbours"] = int(neighbours)
    else:
        settings["descriptions"] = default_descriptions(model.adapter_names, descriptions)
    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(out, folder, ignore=shutil.ignore_patterns("baselines", "*.png", "*.csv", "methods.json"))
    spec = json.loads((folder / COMPOSE_FILE).read_text())
    spec["routing"], spec["task_routing"] = "per_task", settings
    (folder / COMPOSE_FILE).write_text(json.dumps(spec, indent=2) + "\n")
    if index is not None:
        save_file(index, str(folder / TASK_INDEX_FILE))
