"""The configuration of ``trace run`` (:mod:`trace_train.pipeline`): one dataclass per stage, read from YAML.

A run's YAML file has one section per stage, each optional (a missing section or key takes the default)::

    out: runs/airline              # the run directory
    base:     {kind: hf, model: /models/Qwen3-8B}
    rollout:  {targets: [trace/tau_airline-v0], seeds: "1000:1200"}
    diagnose: {min_delta: 0.2}
    generate: {llm_url: http://127.0.0.1:8000/v1, llm_model: Qwen/Qwen3-32B}
    train:    {max_steps: 40, options: {num_generations: 16}}
    compose:  {top_k: 1}
    evaluate: {seeds: "0:100", samples: 4, ks: [1, 2, 4]}
    ray:      {address: auto, num_actors: 8, env_cpus: 0.5}   # with rollout.engine: ray (docs/ray.md)

Every field is documented on its dataclass below; ``examples/configs/`` has complete files. A key that does
not exist or a value of the wrong type fails at load time, before anything runs, with the key's full name
and the fix (``train.max_step: unknown key; did you mean max_steps?``).

:func:`embedded_default` is the run ``trace run`` does with no config: CPU, the tiny model warmed up here
as the base agent, the τ² airline target, offline analysis and generation, small but real budgets.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import hashlib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

#: The stages of a run, in order (DESIGN.md, "Run directory"); ``base`` prepares the base agent first.
STAGES = ("base", "rollout", "diagnose", "generate", "train", "compose", "evaluate")

#: The methods of the paper-style results table, in its order.
METHODS = ("base", "sft", "adapters", "multi", "merge_linear", "merge_ties", "per_episode", "trace_moe")


class ConfigError(ValueError):
    """A config value that cannot be used; the message names the key and the fix."""


@dataclass
class BaseSection:
    """The base agent: the model TRACE diagnoses and trains adapters for.

    Attributes:
        kind: ``tiny`` (the tiny model built and warmed up here, cached by content), ``hf`` (a local
            Hugging Face model folder or hub id in ``model``), ``openai`` (any OpenAI-compatible endpoint:
            ``base_url`` + the served ``model`` name; training then needs ``train.model``, the same
            model's weights) or ``scripted`` (a registered reference agent named by ``agent``, e.g.
            ``tau:noisy``; for pipeline tests, training then needs ``train.model``).
        model: ``hf``: the model folder; ``openai``: the served model name.
        preset: ``tiny``: the size preset of the model built here (``nano``, ``tiny``, ``tiny-keys``, ``small``).
        bootstrap: ``tiny``: fields of :class:`trace_train.tiny.bootstrap.BootstrapConfig` for the warm-up (its
            ``target`` defaults to the first rollout target).
        base_url: ``openai``: the endpoint.
        api_key: ``openai``: the key (``EMPTY`` for local servers).
        agent: ``scripted``: the agent's registered name (``trace envs`` lists them).
        agent_kwargs: ``scripted``: keyword arguments of that agent (e.g. ``{p: 0.7, capabilities: [...]}``
            for ``tau:noisy``).
        mixture: ``scripted``, instead of ``agent``: registered agents and their weights
            (``{oracle: 0.5, "swe:wrong_function": 0.5}``); each episode is played by one of them, picked
            from a hash of the run seed and the episode's first observation (deterministic, resumable).
        temperature: sampling temperature of the base agent's rollouts (0 = greedy).
        max_new_tokens: tokens per turn at most.
        threads: torch CPU threads for local models (1 is fastest for tiny models).
        device: torch device for local models (``cpu``, ``cuda``).
        decode: how local models generate, in the base's rollouts and in every evaluated local model:
            ``fast`` (:mod:`trace_train.tiny.fast_decode`, for Qwen3-architecture models), ``hf``
            (``model.generate``), ``auto`` (fast for the tiny presets' models on CPU, hf otherwise).
    """

    kind: str = "tiny"
    model: str | None = None
    preset: str = "tiny"
    bootstrap: dict = field(default_factory=dict)
    base_url: str = "http://127.0.0.1:8000/v1"
    api_key: str = "EMPTY"
    agent: str | None = None
    agent_kwargs: dict = field(default_factory=dict)
    mixture: dict = field(default_factory=dict)
    temperature: float = 0.0
    max_new_tokens: int = 256
    threads: int = 1
    device: str = "cpu"
    decode: str = "auto"

    def validate(self) -> None:
        _choice("base.kind", self.kind, ("tiny", "hf", "openai", "scripted"))
        if self.kind in ("hf", "openai") and not self.model:
            raise ConfigError(f"base.model is required with base.kind: {self.kind} "
                              f"({'a model folder or hub id' if self.kind == 'hf' else 'the served model name'})")
        if self.kind == "scripted" and bool(self.agent) == bool(self.mixture):
            raise ConfigError("base.kind: scripted needs one of base.agent (e.g. agent: tau:noisy) or base.mixture "
                              "(e.g. mixture: {oracle: 0.5, tau:skip_precondition: 0.5})")
        for name, weight in self.mixture.items():
            if not isinstance(weight, (int, float)) or weight <= 0:
                raise ConfigError(f"base.mixture.{name} must be a weight > 0, got {weight!r}")
        if self.kind == "tiny":
            from trace_train.tiny.build import PRESETS

            _choice("base.preset", self.preset, tuple(PRESETS))
        _at_least("base.max_new_tokens", self.max_new_tokens, 1)
        _at_least("base.threads", self.threads, 1)
        _choice("base.decode", self.decode, ("auto", "fast", "hf"))
        if self.temperature < 0:
            raise ConfigError(f"base.temperature must be >= 0, got {self.temperature}")


@dataclass
class RolloutSection:
    """Rollouts of the base agent on the target (the diagnosis's evidence).

    Attributes:
        targets: target env ids (``trace/tau_airline-v0``, ``trace/tau_retail-v0``, ``trace/swe_repo-v0``,
            or a workspace env).
        seeds: a count (``100``), a range (``"1000:1100"``) or a list; keep them disjoint from
            ``evaluate.seeds`` (the held-out seeds).
        samples: episodes per (target, seed).
        in_flight: episodes open at once (batched generation for local models).
        env_kwargs: ``gym.make`` kwargs of the targets (a local model's own defaults, e.g. the compact
            prompt it was warmed up on, apply first).
        workers: processes a local base agent (``tiny``, ``hf``) rolls out in, each on its share of the
            seeds with its own copy of the model (on ``base.threads`` threads): 2 uses both cores of a
            2-core CPU. The episodes are the same as in one process; only the time changes.
        engine: where every rollout of the run (this stage's and the evaluation's) runs: ``local`` (this
            machine's processes: ``workers``, ``evaluate.workers``) or ``ray`` (Ray actors of the cluster in
            the ``ray`` section; docs/ray.md). The same episodes either way; changing it re-runs no stage.
    """

    targets: list = field(default_factory=lambda: ["trace/tau_airline-v0"])
    seeds: Any = "1000:1100"
    samples: int = 1
    in_flight: int = 16
    env_kwargs: dict = field(default_factory=dict)
    workers: int = 1
    engine: str = "local"

    def validate(self) -> None:
        if not self.targets:
            raise ConfigError("rollout.targets is empty; name at least one target env id")
        parse_seeds("rollout.seeds", self.seeds)
        _at_least("rollout.samples", self.samples, 1)
        _at_least("rollout.in_flight", self.in_flight, 1)
        _at_least("rollout.workers", self.workers, 1)
        _choice("rollout.engine", self.engine, ("local", "ray"))


@dataclass
class RaySection:
    """The Ray cluster of ``rollout.engine: ray`` (docs/ray.md); unused with the local engine.

    Attributes:
        address: ``auto`` (the cluster this machine belongs to, started with ``ray start``), ``ray://HOST:PORT``
            (a remote cluster through Ray Client), ``HOST:PORT`` (a cluster's GCS address, what ``ray start
            --address`` takes), or null (the cluster of ``RAY_ADDRESS`` or one already running here, else a
            new one-node cluster started for this run).
        num_actors: actors that host the envs of a rollout; each builds its own agent once (a local model is
            loaded once per actor; an endpoint agent is a client of the one shared server).
        env_cpus: CPUs each actor reserves (fractions share a core: 16 actors of 0.125 CPU on 2 cores, for
            envs that mostly wait on a tool or an LLM call).
        max_concurrent_per_actor: episodes open at once in one actor (its agent's batch).
        max_container_starts: SWE sandbox containers starting at once in the whole cluster (a named Ray actor
            semaphore around every container start). SWE actors run only on nodes that declare the custom
            resource ``docker`` (``ray start --resources '{"docker": 4}'``: that node hosts 4 SWE actors).
        stall_s: the liveness bound of a chunk of episodes on an actor. A chunk that hands nothing back for 30 s
            (or ``stall_s``, if less) has its actor asked about it; it runs again on a new actor when the actor is
            dead, does not answer within ``stall_s``, is not playing it (a lost task or stream end), or plays it
            but none of its episodes took a step for ``stall_s`` (set it above the slowest single step or turn).
        start_timeout_s: seconds a rollout waits for its first actor to start (none can be placed while the
            cluster lacks the CPUs or resources they ask for) before it fails, naming what they ask and what the
            cluster has.
    """

    address: str | None = None
    num_actors: int = 4
    env_cpus: float = 1.0
    max_concurrent_per_actor: int = 8
    max_container_starts: int = 4
    stall_s: float = 300.0
    start_timeout_s: float = 300.0

    def validate(self) -> None:
        check_ray_address("ray.address", self.address)
        _at_least("ray.num_actors", self.num_actors, 1)
        if not self.env_cpus >= 0:
            raise ConfigError(f"ray.env_cpus must be >= 0 (a fraction shares a core), got {self.env_cpus}")
        _at_least("ray.max_concurrent_per_actor", self.max_concurrent_per_actor, 1)
        _at_least("ray.max_container_starts", self.max_container_starts, 1)
        for key in ("stall_s", "start_timeout_s"):
            value = getattr(self, key)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ConfigError(f"ray.{key} must be a number of seconds > 0, got {value!r}")


def ray_section(data: Any, prefix: str = "ray.") -> RaySection:
    """A validated :class:`RaySection` from a mapping of its keys: a run config's ``ray:`` section, or
    ``TrainConfig.ray`` (GRPO's endpoint rollouts on Ray). An unknown key, a wrong type or a bad value raises
    :class:`ConfigError` naming the key, as at load time."""
    section = _build(RaySection, data, prefix)
    section.validate()
    return section


def check_ray_address(key: str, address: Any) -> None:
    """An address Ray can connect to: null, ``auto``, ``ray://HOST:PORT`` or ``HOST:PORT``; anything else names
    the value and the forms."""
    if address is None or address == "auto":
        return
    text = str(address)
    rest = text[len("ray://"):] if text.startswith("ray://") else text
    host, sep, port = rest.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536) or "/" in host:
        raise ConfigError(f"{key}: {text!r} is not a Ray cluster address; use auto (the cluster of this machine), "
                          "ray://HOST:PORT (Ray Client), HOST:PORT (the head's GCS address, e.g. 10.0.0.1:6379) "
                          "or null (start a local cluster)")


@dataclass
class DiagnoseSection:
    """The contrastive diagnosis (``trace diagnose``).

    Attributes:
        llm_url: an OpenAI-compatible endpoint for the LLM analysis agent; empty = the offline labeler.
        llm_model: the served model's name (with ``llm_url``).
        runs: independent labelling runs (the paper uses 10; the offline labeler is deterministic).
        min_delta: retain a capability only if Δ = ER⁻ − ER⁺ is at least this.
        min_coverage: ... and its coverage (LF / failed) is at least this.
        max_capabilities: train adapters for at most this many retained capabilities (highest Δ first).
    """

    llm_url: str | None = None
    llm_model: str | None = None
    runs: int = 1
    min_delta: float = 0.20
    min_coverage: float = 0.10
    max_capabilities: int = 4

    def validate(self) -> None:
        if self.llm_url and not self.llm_model:
            raise ConfigError("diagnose.llm_model is required with diagnose.llm_url (the served model's name)")
        _at_least("diagnose.runs", self.runs, 1)
        _at_least("diagnose.max_capabilities", self.max_capabilities, 1)
        if not -1 <= self.min_delta <= 1:
            raise ConfigError(f"diagnose.min_delta must be in [-1, 1], got {self.min_delta}")
        if not 0 <= self.min_coverage <= 1:
            raise ConfigError(f"diagnose.min_coverage must be in [0, 1], got {self.min_coverage}")


@dataclass
class GenerateSection:
    """Generation and admission of one environment per retained capability (``trace generate``).

    Attributes:
        llm_url: an OpenAI-compatible endpoint for the generator agent; empty = the offline generator
            (templates of the built-in capability families).
        llm_model: the served model's name (with ``llm_url``).
        attempts: generation attempts per capability (the admission report goes back to the agent).
        workspace: the workspace registry admitted envs are written to (default: ``<run>/workspace``).
        focus_share: the offline generator's first attempt draws this share of each env's episodes from the
            request families the evidence failed on (default 0.75; 1.0 isolates the capability).
    """

    llm_url: str | None = None
    llm_model: str | None = None
    attempts: int = 3
    workspace: str | None = None
    focus_share: float | None = None

    def validate(self) -> None:
        if self.llm_url and not self.llm_model:
            raise ConfigError("generate.llm_model is required with generate.llm_url (the served model's name)")
        _at_least("generate.attempts", self.attempts, 1)
        if self.focus_share is not None and (isinstance(self.focus_share, bool) or not isinstance(
                self.focus_share, (int, float)) or not 0.0 <= self.focus_share <= 1.0):
            raise ConfigError(f"generate.focus_share must be a number in [0, 1] (or unset for 0.75), got "
                              f"{self.focus_share!r}")
        if self.focus_share is not None and self.llm_url:
            raise ConfigError("generate.focus_share is the offline generator's; the LLM generator chooses its own "
                              "task mix. Fix: drop one of generate.focus_share and generate.llm_url")


@dataclass
class TrainSection:
    """GRPO, one LoRA adapter per retained capability (``trace train``), and the training baselines.

    Attributes:
        model: the model whose adapters are trained (default: the base agent's model; required when the
            base agent is an endpoint or a scripted agent): a folder, a hub id in the local cache, or a size
            preset of the tiny model (``nano``, ``tiny``, ``small``), then built here offline and cached.
        max_steps: GRPO steps per adapter.
        max_minutes: a training-time budget per adapter (minutes; the trainer stops before the step that
            would overrun it), with ``max_steps`` then an upper bound. None = steps only.
        options: further fields of :class:`trace_train.train.config.TrainConfig` (group size, lr, LoRA rank,
            ``vllm``, ...), passed through as they are.
        sft_baseline: also train "SFT on synthetic data" (a LoRA on the capability envs' oracle episodes).
        sft_steps: optimiser steps of that SFT baseline.
        multi_baseline: also train "multi-capability GRPO" (one adapter on the mixture of every env).
        multi_steps: its GRPO steps (default: ``max_steps`` × the number of capabilities, the same budget;
            its time budget is likewise ``max_minutes`` × the number of capabilities).
        launcher: ``python`` (train in the ``trace run`` process) or ``accelerate`` (each adapter is trained by
            ``accelerate launch [accelerate_args] -m trace_train.cli train --config <its TrainConfig YAML>``,
            e.g. across the GPUs of a node, with DeepSpeed or FSDP from an accelerate config file).
        accelerate_args: arguments of ``accelerate launch`` (e.g. ``[--num_processes, "4", --config_file,
            examples/configs/accelerate_zero2.yaml]``).
        workers: adapters trained at once (``launcher: python``), each in its own process on ``base.threads``
            threads: 2 on a 2-core CPU runs the adapters and baselines side by side (a time budget
            ``max_minutes`` then buys each run the same steps in half the wall time). 1 on a GPU.
        select_seeds: validation seeds of each GRPO run's own envs (``"start:stop"``), or None (off): the base
            and the saved checkpoints (``options.save_steps``) play them greedily after training, and the
            checkpoint with the highest success becomes the adapter (:mod:`trace_train.train.select`). Keep them
            apart from the training seeds (1,000,000 on) and from ``evaluate.env_seeds``.
        select_every: play every n-th saved checkpoint (the last one always).
    """

    model: str | None = None
    max_steps: int = 20
    max_minutes: float | None = None
    options: dict = field(default_factory=dict)
    sft_baseline: bool = True
    sft_steps: int = 40
    multi_baseline: bool = True
    multi_steps: int | None = None
    launcher: str = "python"
    accelerate_args: list = field(default_factory=list)
    workers: int = 1
    select_seeds: str | None = None
    select_every: int = 1

    def validate(self) -> None:
        _choice("train.launcher", self.launcher, ("python", "accelerate"))
        _at_least("train.select_every", self.select_every, 1)
        if self.select_seeds is not None:
            parse_seeds("train.select_seeds", self.select_seeds)
            if not (self.options or {}).get("save_steps"):
                raise ConfigError("train.select_seeds chooses among saved checkpoints: set train.options.save_steps "
                                  "(e.g. 5), or select_seeds: null")
        _at_least("train.workers", self.workers, 1)
        _at_least("train.max_steps", self.max_steps, 1)
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ConfigError(f"train.max_minutes must be > 0 (or null for steps only), got {self.max_minutes}")
        _at_least("train.sft_steps", self.sft_steps, 1)
        if self.multi_steps is not None:
            _at_least("train.multi_steps", self.multi_steps, 1)


#: Where the router's episodes come from (``compose.router_data``).
ROUTER_DATA = ("oracle", "selected")


@dataclass
class ComposeSection:
    """Token-level top-1 MoE over the adapters (``trace compose``) and the composition baselines.

    Attributes:
        top_k: experts per token (1 = the method; 2 and 4 are the paper's ablation).
        router_seeds: episodes per capability env that train the gates (successful trajectories).
        router_data: where those episodes come from: ``oracle`` (the env's oracle, on seeds of their own) or
            ``selected`` (the chosen checkpoint's own successful episodes from checkpoint selection, at most
            ``router_seeds`` of them: tokens its adapter predicts better than the base does, which the oracle's
            need not be; needs ``train.select_seeds``; an adapter without such episodes falls back to the
            oracle's).
        merges: PEFT merges reported as baselines (``linear``, ``ties``; empty = none).
        per_episode: also report per-episode routing (one adapter chosen from the first observation).
        drop_unimproved: leave out of the composition (the MoE, the merges and per-episode routing) every adapter
            whose chosen checkpoint was not clearly better than the base on its own env's validation seeds
            (checkpoint selection, ``train.select_seeds``; the paired interval's lower end at or below zero, so
            one lucky win in 50 does not count), as a zero update is left out: its envs label the base slot. Such
            an adapter learnt nothing its env can show, and kept, it is a slot the router can send tokens to that
            only changes the base. It still gets its own row in the evaluation. Decided on the env's validation
            seeds, never on the target.
        options: further keyword arguments of :func:`trace_train.compose.compose`; ``train`` holds the
            router's training settings (:class:`trace_train.compose.RouterTrainConfig` fields: ``lr``,
            ``epochs``, ``label_coef``, ``label_from``, ...); ``gate_input: context`` gives the gates the
            conversation so far (for the tiny models, whose token states do not carry the task).
    """

    top_k: int = 1
    router_seeds: int = 16
    router_data: str = "oracle"
    merges: list = field(default_factory=lambda: ["linear", "ties"])
    per_episode: bool = True
    drop_unimproved: bool = False
    options: dict = field(default_factory=dict)

    def validate(self) -> None:
        _at_least("compose.top_k", self.top_k, 1)
        _at_least("compose.router_seeds", self.router_seeds, 1)
        _choice("compose.router_data", self.router_data, ROUTER_DATA)
        for m in self.merges:
            _choice("compose.merges[]", m, ("linear", "ties"))
        if "gate_input" in self.options:
            from ..compose.model import GATE_INPUTS

            _choice("compose.options.gate_input", self.options["gate_input"], GATE_INPUTS)
        if "gate_weight" in self.options:
            from ..compose.model import GATE_WEIGHTS

            _choice("compose.options.gate_weight", self.options["gate_weight"], GATE_WEIGHTS)
        if "routing" in self.options:
            from ..compose.model import GATE_ROUTINGS

            _choice("compose.options.routing", self.options["routing"], GATE_ROUTINGS)
        if "train" in self.options:  # the router's settings: checked now, not after the adapters have trained
            from ..compose.adapters import ComposeError
            from ..compose.api import router_config

            try:
                router_config(self.options["train"])
            except (ComposeError, TypeError) as exc:
                raise ConfigError(f"compose.options.train: {exc}") from None


@dataclass
class EvaluateSection:
    """Every method on held-out target seeds: pass@1, pass^k with bootstrap intervals.

    Attributes:
        seeds: the held-out target seeds (a count, a range or a list), disjoint from ``rollout.seeds`` and
            from the warm-up's training seeds.
        samples: trials per seed (pass^k needs k ≤ samples; sampling needs ``temperature`` > 0).
        ks: the k of pass^k.
        temperature: sampling temperature of every method's rollouts.
        in_flight: episodes open at once.
        methods: rows of the results table to compute (see :data:`METHODS`); rows left out are shown as
            not run.
        bootstrap: bootstrap resamples of the intervals.
        workers: methods evaluated at once, each in its own process with its own model (on
            ``base.threads`` threads): 2 on a 2-core CPU halves this stage for local models. Rows whose agent
            cannot go to a process (a scripted or endpoint base) run in the main process.
        env_seeds: held-out seeds of each capability env on which the base, that capability's adapter and the
            SFT warm-up its GRPO run started from (if any) are played (the report's learning link, L2: does
            training raise the env's own success, and how much of it is GRPO's?); disjoint from the training
            seeds (``train.options.seed_offset``, 1,000,000 by default). 0 skips it.
    """

    seeds: Any = "0:40"
    samples: int = 1
    ks: list = field(default_factory=lambda: [1])
    temperature: float = 0.0
    in_flight: int = 16
    methods: list = field(default_factory=lambda: list(METHODS))
    bootstrap: int = 1000
    workers: int = 1
    env_seeds: Any = "0:50"

    def validate(self) -> None:
        parse_seeds("evaluate.seeds", self.seeds)
        if self.env_seeds:
            parse_seeds("evaluate.env_seeds", self.env_seeds)
        _at_least("evaluate.workers", self.workers, 1)
        _at_least("evaluate.samples", self.samples, 1)
        _at_least("evaluate.in_flight", self.in_flight, 1)
        for k in self.ks:
            if not isinstance(k, int) or k < 1:
                raise ConfigError(f"evaluate.ks must hold integers >= 1, got {k!r}")
            if k > self.samples:
                raise ConfigError(f"evaluate.ks has k={k} > evaluate.samples={self.samples}; pass^k needs k trials "
                                  "per seed: raise evaluate.samples (with temperature > 0) or drop that k")
        for m in self.methods:
            _choice("evaluate.methods[]", m, METHODS)
        if self.samples > 1 and self.temperature == 0:
            raise ConfigError("evaluate.samples > 1 with evaluate.temperature: 0 repeats identical greedy episodes; "
                              "set evaluate.temperature (e.g. 0.7) or evaluate.samples: 1")


@dataclass
class RunConfig:
    """A whole ``trace run``: the run directory and one section per stage.

    Attributes:
        out: the run directory (DESIGN.md, "Run directory").
        name: a label for the report (default: the run directory's name).
        seed: the run's seed (sampling, bootstrap intervals).
        base, rollout, diagnose, generate, train, compose, evaluate: the stage sections.
        ray: the Ray cluster of ``rollout.engine: ray``.
    """

    out: str = "runs/trace"
    name: str | None = None
    seed: int = 0
    base: BaseSection = field(default_factory=BaseSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    diagnose: DiagnoseSection = field(default_factory=DiagnoseSection)
    generate: GenerateSection = field(default_factory=GenerateSection)
    train: TrainSection = field(default_factory=TrainSection)
    compose: ComposeSection = field(default_factory=ComposeSection)
    evaluate: EvaluateSection = field(default_factory=EvaluateSection)
    ray: RaySection = field(default_factory=RaySection)

    def validate(self) -> "RunConfig":
        for name in SECTIONS:
            getattr(self, name).validate()
        self.ray.validate()
        if self.base.kind in ("openai", "scripted") and not self.train.model:
            raise ConfigError(f"train.model is required with base.kind: {self.base.kind} (the weights adapters are "
                              "trained on: a model folder, e.g. the served model's checkpoint)")
        overlap = set(parse_seeds("rollout.seeds", self.rollout.seeds)) & set(parse_seeds("evaluate.seeds",
                                                                                       self.evaluate.seeds))
        if overlap:
            raise ConfigError(f"evaluate.seeds and rollout.seeds share {len(overlap)} seeds (e.g. {min(overlap)}); "
                              "the evaluation seeds must be held out: make the two ranges disjoint")
        if self.compose.router_data == "selected" and self.train.select_seeds is None:
            raise ConfigError("compose.router_data: selected trains the router on checkpoint selection's episodes: "
                              "set train.select_seeds (and train.options.save_steps), or router_data: oracle")
        if self.compose.drop_unimproved and self.train.select_seeds is None:
            raise ConfigError("compose.drop_unimproved reads checkpoint selection's validation curves: set "
                              "train.select_seeds (and train.options.save_steps), or drop_unimproved: false")
        if self.train.select_seeds is not None and self.evaluate.env_seeds:
            shared = set(parse_seeds("train.select_seeds", self.train.select_seeds)) & set(
                parse_seeds("evaluate.env_seeds", self.evaluate.env_seeds))
            if shared:
                raise ConfigError(f"train.select_seeds and evaluate.env_seeds share {len(shared)} seeds (e.g. "
                                  f"{min(shared)}); the checkpoint is chosen on validation seeds, so the env's "
                                  "held-out seeds must stay unseen: make the two ranges disjoint")
        return self

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def section_hash(self, name: str) -> str:
        """A fingerprint of one section (the stage re-runs when it changes)."""
        data = self.to_dict()[name] if name in SECTIONS else {}
        for key in NOT_HASHED.get(name, ()):  # where episodes run changes no result
            data.pop(key, None)
        defaults = {f.name: f.default for f in dataclasses.fields(SECTIONS[name])} if name in SECTIONS else {}
        for key in HASHED_WHEN_SET.get(name, ()):  # at its default, a newer key leaves older runs' fingerprints alone
            if key in data and data[key] == defaults.get(key):
                data.pop(key)
        if name in SEEDED_STAGES and self.seed != RunConfig.seed:  # the run's seed draws these stages' samples
            data = {**data, "run seed": self.seed}
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


#: Keys of a section that do not change a stage's outputs, left out of its fingerprint (changing them re-runs
#: nothing). ``rollout.workers`` stays in: a fingerprint change there was always a re-run.
NOT_HASHED = {"rollout": ("engine",)}
#: Keys added after runs were made, fingerprinted only when not at their default (so that a run made before them
#: does not re-run).
HASHED_WHEN_SET = {"generate": ("focus_share",), "compose": ("drop_unimproved",)}

#: Stages whose outputs depend on the run's top-level ``seed`` (the base agent's sampling in rollouts, checkpoint
#: selection's episodes, evaluation's sampling and bootstrap intervals). The seed enters their fingerprints only
#: when it is not the default 0, so that runs made before it was fingerprinted do not re-run.
SEEDED_STAGES = ("rollout", "train", "evaluate")

SECTIONS: dict[str, type] = {"base": BaseSection, "rollout": RolloutSection, "diagnose": DiagnoseSection,
                             "generate": GenerateSection, "train": TrainSection, "compose": ComposeSection,
                             "evaluate": EvaluateSection}


def parse_key_values(pairs: Iterable[str], flag: str) -> dict:
    """``key=value`` command-line pairs (e.g. ``--env-kwarg difficulty=3``) as a dict.

    Values are read as JSON when they parse (numbers, booleans, lists), else kept as strings; a pair without
    ``=`` is a :class:`ConfigError` that names ``flag``.
    """
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"{flag} {pair!r} must look like key=value")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def parse_seeds(key: str, spec: Any) -> list[int]:
    """``100`` → 0..99, ``"1000:1100"`` → 1000..1099, ``[1, 5]`` or ``"1,5"`` → those seeds."""
    try:
        if isinstance(spec, bool):
            raise ValueError
        if isinstance(spec, int):
            return list(range(spec))
        if isinstance(spec, (list, tuple)):
            return [int(s) for s in spec]
        text = str(spec)
        if ":" in text:
            lo, hi = text.split(":", 1)
            seeds = list(range(int(lo), int(hi)))
        elif "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            seeds = list(range(int(text)))
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: {spec!r} is not a count (100), a range (\"1000:1100\") or a list ([1, 5, 9])") from None
    if not seeds:
        raise ConfigError(f"{key}: {spec!r} names no seed")
    return seeds


def _choice(key: str, value: Any, choices: tuple) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}")


def _at_least(key: str, value: Any, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key} must be >= {low}, got {value}")


def _type_ok(value: Any, hint: Any) -> bool:
    """Whether a YAML value fits a field's type hint (ints are accepted for floats)."""
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is not None:
        hint = origin
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "null"
    return getattr(origin or hint, "__name__", str(hint))


def _build(cls: type, data: Any, prefix: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'the config'} must be a mapping of keys to values, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"did you mean {close[0]}?" if close else f"valid keys: {', '.join(names)}"
            raise ConfigError(f"{full}: unknown key; {hint}")
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            kwargs[key] = _build(hint, value, f"{full}.")
            continue
        if not _type_ok(value, hint):
            raise ConfigError(f"{full} must be {_type_name(hint)}, got {value!r} ({type(value).__name__})")
        kwargs[key] = value
    return cls(**kwargs)


def apply_settings(data: dict, settings: list[str] | tuple[str, ...]) -> dict:
    """``data`` with each ``KEY=VALUE`` of ``settings`` applied (``trace run --set``), in order.

    ``KEY`` is a dotted path (``train.options.seed``); ``VALUE`` is read as YAML (``1`` an int, ``0:200`` a
    string, ``[a, b]`` a list, ``null`` None). Mappings on the path are created where missing; a path through a
    value that is not a mapping is an error. The result is validated like any config, so a misspelt key fails
    with the same message as in a file.
    """
    import yaml

    data = copy.deepcopy(data)
    for item in settings:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: use KEY=VALUE with a dotted KEY, e.g. --set train.options.seed=1")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML ({exc})") from None
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[:i + 1])} is {child!r}, not a section")
            node = child
        node[parts[-1]] = value
    return data


def config_from_dict(data: dict | None, settings: list[str] | tuple[str, ...] = (), **overrides: Any) -> RunConfig:
    """A validated :class:`RunConfig` from a parsed YAML mapping; ``overrides`` set top-level keys (e.g. ``out``),
    ``settings`` are ``KEY=VALUE`` strings with dotted keys (:func:`apply_settings`, applied first)."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"the config must be a mapping of sections (base:, rollout:, ...), got {type(data).__name__}")
    data = apply_settings(data or {}, settings)
    data.update({k: v for k, v in overrides.items() if v is not None})
    return _build(RunConfig, data, "").validate()


def load_config(path: str | Path, settings: list[str] | tuple[str, ...] = (), **overrides: Any) -> RunConfig:
    """Read and validate a run's YAML file (see the module docstring and ``examples/configs/``)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (examples/configs/ has examples)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    try:
        return config_from_dict(data, settings, **overrides)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def dump_config(cfg: RunConfig) -> str:
    """The resolved config as YAML (written to ``<run>/config.yaml``)."""
    import yaml

    return yaml.safe_dump(cfg.to_dict(), sort_keys=False, allow_unicode=True)


def embedded_default(settings: list[str] | tuple[str, ...] = (), **overrides: Any) -> RunConfig:
    """The run ``trace run`` does with no config: the whole loop on CPU with the tiny model, small real budgets.

    The base agent is the ``tiny`` model warmed up for 1200 SFT steps on one torch thread on the airline
    target's one-request oracle episodes of three families: ``flight_status`` and ``info`` in full and
    ``cancel`` under-represented (a tenth of its episodes). Its gaps come from how it was trained — families
    it saw often against a family it saw rarely — never from reading the answer. That base is shipped with
    the project (``trace_train/tiny/bases/embedded-default/``): this recipe's cache name matches it, so
    ``trace run`` installs it instead of warming up (the warm-up took 50 minutes on a loaded 2-core machine,
    and another CPU's rounding would make another base). Measured as ``trace run`` sees it: it solves 9 of
    the 40 diagnosis episodes (``flight_status`` 9 of 15, ``info`` and ``cancel`` never). Change any
    ``base.bootstrap`` field and a new base is warmed up and cached instead.

    The time the shipped base saves goes to training and evaluation: each adapter and baseline trains for
    6 minutes of GRPO (two at a time, on the fast decode path: a step of 8 episodes costs ~5 s here) and
    every method is evaluated on 100 held-out seeds, so the intervals can separate methods. The composer's
    gates read the conversation so far (``gate_input: context``): the tiny model's token states do not carry
    the task, and the paper's token gate left every token on the base. Both cores
    work: the base's rollouts in two processes, the adapters and baselines two at a time, and the methods
    evaluated two at a time, each process on one torch thread (the fastest for this model).
    ``docs/demo/`` holds the report of a run; ``docs/demo.md`` says what it reached.
    """
    target_kwargs = {"scenarios": ["flight_status", "info", "cancel"], "size": {"bundle_prob": 0.0}}
    data = {
        "out": "runs/trace",
        "base": {"kind": "tiny", "preset": "tiny", "max_new_tokens": 96, "bootstrap": {
            "target": "trace/tau_airline-v0", "train_seeds": 4000, "pretrain_frac": 0.5, "steps": 1200, "threads": 1,
            "max_length": 8192, "env_kwargs": target_kwargs, "scenario_shares": {"cancel": 0.1}}},
        # One request per conversation takes the oracle under 10 turns: 16 caps what a lost base spends.
        "rollout": {"targets": ["trace/tau_airline-v0"], "seeds": "1000:1040", "in_flight": 40, "workers": 2,
                    "env_kwargs": {**target_kwargs, "max_episode_steps": 16}},
        "diagnose": {"max_capabilities": 2},
        "train": {"max_steps": 1000, "max_minutes": 6.0, "sft_steps": 40, "workers": 2,
                  "options": {"group_size": 4, "groups_per_step": 2, "learning_rate": 1.0e-3, "temperature": 1.0,
                              "max_turn_tokens": 160, "calibration_groups": 0, "env_kwargs": {"difficulty": 1},
                              "max_tool_calling_iterations": 10, "save_steps": 5}},
        # Context gates, centred, label loss from the request on (docs/compose.md): the paper's token gate at
        # its learning rate left every token on the base (the MoE was the base); this router sends 99% of the
        # flight-status answers' tokens to that capability's adapter.
        "compose": {"router_seeds": 8, "options": {"gate_input": "context", "train": {
            "lr": 0.01, "epochs": 10, "accumulate": 2, "label_from": "first_observation"}}},
        "evaluate": {"seeds": "0:100", "in_flight": 50, "workers": 2},
    }
    return config_from_dict(data, settings, **overrides)
