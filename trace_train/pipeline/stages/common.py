"""What several stages of ``trace run`` share: the per-unit time estimates, the base agent, the selected capabilities.

The per-unit times are constants measured on a 2-core CPU with the tiny model (noisy: the machine was shared),
so every estimate built on them is rough by design. The base agent's factory and env kwargs are used by the
rollout, compose and evaluate stages; :func:`capability_envs` (which env each selected capability trains on)
by the train and compose stages.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Any

from ..config import BaseSection, ConfigError


# Rough per-unit seconds on a 2-core CPU (see the module docstring).
SECONDS_PER_SCRIPTED_EPISODE = 0.05
# A batch of b tiny-model episodes generated together (compact τ² prompt, ≤ 16 turns of ≤ 96 tokens) takes about
# SECONDS_PER_TINY_BATCH + b × SECONDS_PER_TINY_EPISODE_IN_BATCH on one thread: decoding steps, not batch width,
# are most of the cost (measured: 40 episodes in 96 s; 9 methods x 40 held-out episodes, two at once, in 439 s).
SECONDS_PER_TINY_BATCH = 40.0
SECONDS_PER_TINY_EPISODE_IN_BATCH = 1.5
# With decode: fast (trace_train.tiny.fast_decode, the default for the tiny model on CPU), measured by
# `bench/rollout_speed.py --in-flight 8 40` on the embedded default's evaluation, both paths in one run (two runs,
# docs/speed.md): 3.3x and 4.1x the episodes per second of decode: hf at 8 in flight (decoding steps: the per-batch
# term), 7.2x and 7.8x at 40 (where generate() reads 40 copies of the shared prompt's keys each token). The
# per-batch term is divided by the first ratio; the per-episode term is what then makes 40 episodes at 40 in flight
# that much faster than above.
FAST_DECODE_SPEEDUP_NARROW, FAST_DECODE_SPEEDUP_40 = 3.7, 7.5
SECONDS_PER_TINY_BATCH_FAST = SECONDS_PER_TINY_BATCH / FAST_DECODE_SPEEDUP_NARROW
SECONDS_PER_TINY_EPISODE_IN_BATCH_FAST = max(0.02, ((SECONDS_PER_TINY_BATCH + 40 * SECONDS_PER_TINY_EPISODE_IN_BATCH)
                                                    / FAST_DECODE_SPEEDUP_40 - SECONDS_PER_TINY_BATCH_FAST) / 40)
SECONDS_PER_ENDPOINT_EPISODE = 2.0    # an OpenAI-compatible endpoint, 8 requests in flight
SECONDS_PER_LABEL_OFFLINE = 0.01
SECONDS_PER_ADMISSION = 15.0          # an offline template's env admits in ~4 s under bubblewrap; LLM retries cost more
SECONDS_PER_GRPO_STEP_TINY = 8.0     # decode: hf, loss_forward: trl (the path before the fast one)
# decode: fast + loss_forward: shared_prefix (the default for the tiny model on CPU): divided by the ratio
# `bench/grpo_speed.py --rounds 2` measured between the two paths at the embedded default's train options (3.35x
# and 3.96x in two runs, docs/speed.md).
GRPO_FAST_SPEEDUP = 3.65
SECONDS_PER_GRPO_STEP_TINY_FAST = SECONDS_PER_GRPO_STEP_TINY / GRPO_FAST_SPEEDUP
SECONDS_PER_SFT_STEP_TINY = 1.2       # bench/bootstrap_curve.py: 484 warm-up steps of the tiny model in 9 min
SECONDS_PER_ROUTER_RUN_TINY = 15.0    # gates over 2 adapters on 16 oracle episodes, with the merges: 16 s
#: One router optimizer step beyond the 12 of the default settings (3 epochs of 16 episodes by 4): the embedded
#: default's 80 steps (10 epochs by 2) made the compose stage 122 s against 27 s for 12 (this session's machine).
SECONDS_PER_ROUTER_STEP_TINY = 1.4
#: Warm-up steps on two torch threads against one: the default's 1200 steps in 812 s on 2 threads, its
#: earlier 800 steps in 927 s on one (the same machine: 0.68 s against 1.16 s a step).
SFT_TWO_THREAD_SPEEDUP = 1.7
SECONDS_BOOTSTRAP_SETUP = 60.0        # building the tiny model and collecting ~4,000 oracle episodes (measured 55 s)


def _check_targets(ctx) -> None:
    import trace_envs

    registries = [str(ctx.workspace)] if (ctx.workspace / "registry.yaml").exists() else []
    for path in registries:
        trace_envs.load_registry(path)
    for env_id in ctx.cfg.rollout.targets:
        try:
            trace_envs.get_entry(env_id)
        except KeyError:
            raise ConfigError(f"rollout.targets: unknown env id {env_id!r}; `trace envs list` shows the "
                              "registered ones") from None


class MixtureAgent:
    """Plays each episode with one of several scripted agents, picked by the episode's first observation.

    The pick is a hash of (seed, the first observation's text), so it is the same for the same task in any
    process (a resumed rollout picks what the interrupted one would have) and varies across tasks; a copy
    of this agent per open episode (what :func:`~trace_train.rollouts.run_rollouts` does) changes nothing.
    """

    def __init__(self, agents: dict[str, Any], weights: dict[str, float], seed: int = 0, name: str = "mixture"):
        self.agents, self.name, self.seed = agents, name, seed
        total = float(sum(weights.values()))
        self.cumulative, acc = [], 0.0
        for key in agents:
            acc += weights[key] / total
            self.cumulative.append((acc, key))
        self.current: Any = None
        self.picked: str | None = None

    def reset(self, env: Any, observation: str, info: dict) -> None:
        digest = hashlib.sha256(f"{self.seed}\0{observation}".encode()).digest()
        u = int.from_bytes(digest[:8], "big") / 2**64
        self.picked = next((k for c, k in self.cumulative if u < c), self.cumulative[-1][1])
        self.current = self.agents[self.picked]
        if hasattr(self.current, "reset"):
            self.current.reset(env, observation, info)

    def __call__(self, observation: str, info: dict) -> Any:
        return self.current(observation, info)


def _scripted_agent(b: BaseSection, seed: int = 0):
    from trace_envs.agents import agent_names, make_agent

    try:
        if b.mixture:
            return MixtureAgent({n: make_agent(n) for n in b.mixture}, dict(b.mixture), seed=seed, name="base")
        return make_agent(b.agent, **b.agent_kwargs)
    except KeyError:
        raise ConfigError(f"base.agent: unknown agent {b.agent!r}; choose one of {', '.join(agent_names())}") from None
    except TypeError as exc:
        raise ConfigError(f"base.agent_kwargs: {exc}") from None


def workspace_registries(ctx) -> list[str]:
    """The run's workspace registry, when it has one: what a fresh process (a worker, a Ray actor) loads."""
    return [str(ctx.workspace)] if (ctx.workspace / "registry.yaml").exists() else []


def base_model_path(ctx) -> str | None:
    """The local model the adapters are trained on: ``train.model`` or the base agent's own model."""
    summary = ctx.summary("base")
    model = summary.get("train_model_path") or ctx.cfg.train.model or summary.get("model_path")
    return str(Path(model).expanduser()) if model else None


def model_env_kwargs_fn(model: str | None, extra: dict | None = None):
    """``env_id -> gym.make kwargs``: the kwargs a model built here was trained with, then ``extra``."""
    from trace_train.tiny.metadata import model_env_kwargs

    def kwargs(env_id: str) -> dict:
        base = {}
        if model and Path(model, "trace_model.json").exists():
            base = model_env_kwargs(model, env_id)
        return {**base, **(extra or {})}

    return kwargs


#: ``lead_in: auto`` in ``train.options.env_kwargs``: lead-in questions come from the target's request families the
#: base already answers in the rollout stage, at least this share of at least this many episodes, among the
#: families that can be asked without a write (:func:`trace_envs.capabilities.lead_in.answer_families`). These are the
#: requests an adapter must not lose (L3's "without losing the others"); the families the base fails are the
#: capabilities' own.
LEAD_IN_AUTO_MIN_SUCCESS = 0.5
LEAD_IN_AUTO_MIN_EPISODES = 5


def auto_lead_in(trajectories: str | Path) -> tuple[list[str], dict[str, list[int]]]:
    """``lead_in: auto`` resolved from the base's rollouts: (the families, ``{family: [wins, episodes]}`` of every
    single-family request the rollouts hold). See :data:`LEAD_IN_AUTO_MIN_SUCCESS`."""
    from trace_envs.capabilities.lead_in import answer_families

    path = Path(trajectories)
    if not path.is_file():
        raise ConfigError(f"train.options.env_kwargs.lead_in: auto reads the base's rollouts, and {path} is missing")
    counts: dict[str, list[int]] = {}
    with path.open() as f:
        for line in f:
            if not line.strip():
                continue
            record = json.loads(line)
            families = (record.get("task") or {}).get("families") or [record.get("scenario")]
            if len(families) != 1 or not families[0]:
                continue  # a bundle of requests: its success is not one family's
            wins = counts.setdefault(families[0], [0, 0])
            wins[0] += bool(record.get("success"))
            wins[1] += 1
    answerable = set(answer_families())
    chosen = sorted(f for f, (won, n) in counts.items() if f in answerable and n >= LEAD_IN_AUTO_MIN_EPISODES
                    and won / n >= LEAD_IN_AUTO_MIN_SUCCESS)
    return chosen, counts


def resolve_env_kwargs(env_kwargs: dict | None, rollouts: str | Path) -> dict:
    """``train.options.env_kwargs`` as the capability envs take them: ``lead_in: auto`` replaced by the families
    :func:`auto_lead_in` reads from ``rollouts`` (none: no lead-ins, ``lead_in_prob`` dropped too)."""
    kwargs = dict(env_kwargs or {})
    if kwargs.get("lead_in") == "auto":
        families, _ = auto_lead_in(rollouts)
        if families:
            kwargs["lead_in"] = families
        else:
            kwargs.pop("lead_in")
            kwargs.pop("lead_in_prob", None)
    return kwargs


def train_env_kwargs(ctx) -> dict:
    """The run's ``train.options.env_kwargs``, resolved (:func:`resolve_env_kwargs`) against its rollouts."""
    return resolve_env_kwargs((ctx.cfg.train.options or {}).get("env_kwargs"),
                              ctx.path("rollouts", "trajectories.jsonl"))


def base_agent_factory(ctx, temperature: float | None = None):
    """A no-argument callable that builds the base agent (at ``temperature``, default ``base.temperature``).

    For a local model it is a partial of :class:`~trace_train.agents.HFAgent`, which pickles, so a worker
    process can build its own copy; a scripted or endpoint base is built where it runs.
    """
    b = ctx.cfg.base
    temp = b.temperature if temperature is None else temperature
    if b.kind in ("tiny", "hf"):
        from trace_train.agents import HFAgent

        return functools.partial(HFAgent, ctx.summary("base")["model_path"], threads=b.threads, device=b.device,
                                 max_new_tokens=b.max_new_tokens, temperature=temp, seed=ctx.cfg.seed, name="base",
                                 decode=b.decode)
    if b.kind == "openai":
        from trace_train.agents import OpenAIChatAgent

        return lambda: OpenAIChatAgent(b.model, base_url=b.base_url, api_key=b.api_key, temperature=temp,
                                       max_tokens=b.max_new_tokens)
    # A closure over the section and the seed only (not the run's context), so that a Ray actor can build it;
    # the local backend keeps it in this process (a closure does not pickle to a worker).
    seed = ctx.cfg.seed
    return lambda: _scripted_agent(b, seed)


def base_env_kwargs_fn(ctx):
    """``env_id -> gym.make kwargs`` of the base agent's episodes: a local model's own (e.g. the compact prompt
    it was warmed up on), then ``rollout.env_kwargs``."""
    extra = ctx.cfg.rollout.env_kwargs
    if ctx.cfg.base.kind in ("tiny", "hf"):
        return model_env_kwargs_fn(ctx.summary("base")["model_path"], extra)
    return lambda env_id: dict(extra)


def _fast_decode(ctx, decode: str | None = None) -> bool:
    """Whether the base's local model decodes the fast way (``base.decode``, or ``decode``; auto: the tiny model on
    CPU)."""
    b = ctx.cfg.base
    decode = decode or b.decode
    return decode == "fast" or (decode == "auto" and b.kind == "tiny" and str(b.device).startswith("cpu"))


def _tiny_episodes_seconds(n: int, in_flight: int, fast: bool) -> float:
    """Rough seconds of ``n`` tiny-model episodes with ``in_flight`` open at once."""
    width = max(1, min(n, in_flight))
    if fast:
        return math.ceil(n / width) * (SECONDS_PER_TINY_BATCH_FAST + width * SECONDS_PER_TINY_EPISODE_IN_BATCH_FAST)
    return math.ceil(n / width) * (SECONDS_PER_TINY_BATCH + width * SECONDS_PER_TINY_EPISODE_IN_BATCH)


def _episodes_seconds(ctx, n: int, in_flight: int) -> float:
    """Rough seconds of ``n`` episodes of the base agent with ``in_flight`` open at once."""
    kind = ctx.cfg.base.kind
    if kind in ("scripted", "openai"):
        return n * {"scripted": SECONDS_PER_SCRIPTED_EPISODE, "openai": SECONDS_PER_ENDPOINT_EPISODE}[kind]
    return _tiny_episodes_seconds(n, in_flight, _fast_decode(ctx))


def _selected(ctx) -> list[str]:
    return list(ctx.summary("diagnose").get("selected", []))


def train_records(ctx) -> dict[str, dict]:
    """The train stage's record of each adapter (``train/results.json``: its runs, checkpoint selection, ...)."""
    results = ctx.path("train", "results.json")
    return json.loads(results.read_text()).get("adapters", {}) if results.is_file() else {}


def capability_envs(ctx) -> dict[str, dict]:
    """Per selected capability, the env its adapter trains on: the admitted generated env when there is one,
    else the newest hand-written registered env of that capability (``trace/<capability>-vN``), marked so."""
    import trace_envs

    admitted = ctx.summary("generate").get("admitted", {}) if ctx.done("generate") else {}
    if admitted and (ctx.workspace / "registry.yaml").exists():
        trace_envs.load_registry(str(ctx.workspace))
    out = {}
    for cap in _selected(ctx):
        if cap in admitted and admitted[cap]:
            out[cap] = {"env_id": admitted[cap], "source": "generated"}
            continue
        try:
            env_id = trace_envs.latest_capability_id(cap)
        except KeyError:
            continue
        gen = ctx.state["stages"].get("generate", {}).get("status")
        why = "generation was not available in this build" if gen == "unavailable" else "no admitted generated env"
        out[cap] = {"env_id": env_id, "source": f"hand-written ({why})"}
    return out


def _str(p: Any) -> str | None:
    return None if p is None else str(p)
