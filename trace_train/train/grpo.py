"""GRPO of one LoRA adapter per capability, on TRL's ``GRPOTrainer`` (the third stage of TRACE).

``train(TrainConfig(...))`` takes a base model and one capability env (or several: one adapter on their
mixture, the "multi-capability GRPO" baseline) and writes, under ``output_dir``:

* ``adapter/``: the LoRA in PEFT's standard format (``PeftModel.from_pretrained(base, dir)``, vLLM's
  ``--lora-modules name=dir``), with ``trace_adapter.json`` naming the base, the envs and their kwargs;
* ``checkpoints/checkpoint-N/``: TRL/transformers checkpoints (adapter, optimizer, scheduler, RNG states,
  step count); ``resume: true`` continues from the latest one. With an SFT warm-up and ``sft_warmup_lora:
  fresh`` the trained LoRA is a delta over the merged warm-up: ``adapter/`` and each checkpoint's ``on_base/``
  are it folded with the warm-up's onto the base, the delta in ``adapter_over_warmup/`` (:mod:`.fold`);
* ``train_log.csv``: one row per step: reward mean/std, the share of groups whose rewards were all equal
  (TRL's ``frac_reward_zero_std``) before and after dynamic sampling, KL, completion length, episodes,
  and seconds per phase (generation, env/tool calls, forward/backward, optimizer);
* ``reward_curve.png``, ``calibration.json`` (the base model on the env before training),
  ``train_config.yaml`` and ``train_result.json``.

What is TRL's and what is ours. TRL does the GRPO loss (all its variants), advantages, clipping, the
optimiser, checkpoints, accelerate/DeepSpeed and vLLM. The rollouts are TRACE's by default
(``rollout: trace``): a ``rollout_func`` that plays each group's episodes with
:func:`trace_train.rollouts.run_rollouts` and :class:`trace_train.agents.HFAgent` over the model being
trained, so the model sees exactly the prompts ``trace eval`` and ``trace rollout`` show it (the env's
own tool schemas, plain-text messages to the user), every member of a group resets with the group's
seed, and the episode's own tokens go back to TRL: the first prompt as ``prompt_ids``, everything after it
as ``completion_ids`` with ``env_mask`` 0 on tool results and user replies (they get no gradient). Owning
the loop is what lets us re-collect groups whose rewards are all equal (dynamic sampling), give a share
of a group a hint while it generates (hint mode, off-policy), and time generation apart from the env.
``rollout: trl`` instead hands TRL an ``environment_factory`` (:mod:`trace_envs.adapters.trl`), TRL's own
tool loop, which is the path that works with ``use_vllm`` in colocate mode.

Endpoint rollouts (``policy_base_url``; docs/train.md, docs/ray.md): the same rollout function, but the episodes are
played by an :class:`~trace_train.agents.OpenAIChatAgent` on the server of the policy, through the rollout seam
(:func:`trace_train.backends.run_jobs`: one :class:`~trace_train.backends.RolloutJob` per env and batch of distinct
seeds, on local worker processes or Ray actors), so that slow envs (SWE localization) scale out while the trainer
stays on its GPUs. The records come back, are grouped by seed and re-tokenised exactly as in-process ones. On the
weights: TRL 1.16's ``GRPOTrainer._generate``, with a ``rollout_func`` and ``use_vllm``, calls
``vllm_generation.sync_weights()`` before the rollout function whenever the optimizer step changed since the last
sync (once per step; in server mode over the NCCL communicator it opened at start-up, a PEFT adapter merged for the
push, then the server's prefix cache reset), and ``trl vllm-serve`` is ``vllm serve`` with TRL's weight transfer, whose
``/v1`` is the endpoint: with ``use_vllm`` + ``vllm_mode: server`` the episodes are on-policy. TRACE passes the server's
root as ``vllm_server_base_url`` and turns ``vllm_importance_sampling_correction`` off (text replies carry no
sampling log-probs). Without ``use_vllm`` nothing syncs the server (a warning says so).

The history is re-tokenised from the transcript (as ``HFAgent`` renders the next prompt) rather than kept
as the sampled token ids, so the gradient is on the canonical tokens of the text the model wrote; a
sampled sequence that is not its text's canonical tokenisation (rare with this BPE) is trained as the
canonical one. Rollouts are on-policy (one generation per optimiser step), so TRL needs no sampling
log-probabilities.

Speed on CPU (``decode``, ``loss_forward``; docs/speed.md): the tiny model's turns are decoded by
:mod:`trace_train.tiny.fast_decode` and the loss's log-probs are computed by :mod:`trace_train.train.prefix_logprobs`,
which encodes the prefix the step's episodes share once instead of once per episode; ``decode: hf`` and
``loss_forward: trl`` are ``generate`` and TRL's own forward.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .calibration import calibrate
from .config import ConfigError, TrainConfig, overlay_kwargs
from .log import LOG_COLUMNS, TrainResult, plot_reward_curve, read_log

logger = logging.getLogger(__name__)

#: Seconds per request of an endpoint policy (policy_base_url): a long turn of a large model on a busy server.
ENDPOINT_TIMEOUT_S = 300.0

__all__ = ["ConfigError", "LOG_COLUMNS", "TrainConfig", "TrainResult", "calibrate", "env_kwargs_for", "read_log",
           "plot_reward_curve", "train"]


# ----------------------------------------------------------------------------- envs


def env_kwargs_for(cfg: TrainConfig, env_id: str) -> dict:
    """``gym.make`` kwargs of ``env_id`` in this run: what the model was bootstrapped with (its prompt size)
    for the kwargs the env accepts, then ``cfg.env_kwargs`` (those the env accepts, when several envs share them)."""
    from ..tiny.metadata import env_accepts, model_env_kwargs

    kwargs = model_env_kwargs(cfg.model, env_id) if Path(cfg.model).is_dir() else {}
    for key, value in cfg.env_kwargs.items():
        if len(cfg.env_ids) == 1 or env_accepts(env_id, key):
            kwargs[key] = value
    return kwargs


def _load_envs(cfg: TrainConfig):
    """Load the workspace registries and check the env ids (before any model loads)."""
    import trace_envs

    for path in cfg.registry:
        trace_envs.load_registry(path)
    for env_id in cfg.env_ids:
        try:
            entry = trace_envs.get_entry(env_id)
        except KeyError:
            raise ConfigError(f"TrainConfig.env_ids has {env_id!r}, which is not registered. Fix: check "
                              "`trace envs list`, or add the workspace that holds it to registry") from None
        cap = cfg.max_tool_calling_iterations
        env_cap = cfg.env_kwargs.get("max_episode_steps") or entry.max_episode_steps
        if cap is not None and env_cap and cap < env_cap:
            # Measured on precondition_verification-v1 (the planted recipe's kwargs, cap 10): 41 of 300 oracle
            # episodes need 11 turns, so a policy that plays them right is paid 0 in training and 1 in evaluation.
            logger.warning("max_tool_calling_iterations %d is below %s's own cap of %d turns (what evaluation and "
                           "checkpoint selection play): a correct episode that needs more turns scores 0 in "
                           "training. Leave it unset (None) to train on the env's cap", cap, env_id, env_cap)
    return trace_envs


def _hint_for(cfg: TrainConfig, env_id: str) -> str:
    """The hint text of hint mode: ``cfg.hint_text``, else :func:`trace_envs.core.registry.prompt_hint`."""
    if cfg.hint_text:
        return cfg.hint_text
    import trace_envs
    from trace_envs.core.registry import prompt_hint

    return prompt_hint(trace_envs.get_entry(env_id))  # a generated env's own texts never reach a prompt


# ----------------------------------------------------------------------------- episodes -> tokens


@dataclass
class EncodedEpisode:
    """One episode as TRL's ``rollout_func`` returns it, plus what its sampler said of its tokens.

    ``sampler_logprobs`` is aligned with ``completion_ids``: the log-probability each agent token had under the
    distribution it was sampled from, NaN where there is none (tool results and user replies; an agent turn whose
    text, as the transcript renders it, is not token for token what was sampled). ``agent_tokens`` counts the
    agent's tokens in the completion and ``sampled_tokens`` those of them that carry a sampler log-probability:
    their ratio is how much of the gradient falls on exactly the tokens the policy sampled.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    sampler_logprobs: list[float]
    agent_tokens: int = 0
    sampled_tokens: int = 0


def encode_episode(tokenizer, record: dict, max_completion_length: int) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, env mask) of one episode, as TRL's ``rollout_func`` returns them
    (:func:`encode_episode_sampled` without the sampler's log-probabilities)."""
    enc = encode_episode_sampled(tokenizer, record, max_completion_length)
    return enc.prompt_ids, enc.completion_ids, enc.env_mask


def encode_episode_sampled(tokenizer, record: dict, max_completion_length: int) -> EncodedEpisode:
    """One episode's tokens for the loss, and the sampler's log-probabilities of those it sampled.

    The prompt is the conversation up to the first assistant turn, rendered as :class:`HFAgent` renders it;
    the completion is the rest of the episode (through the last assistant turn), each assistant turn as it
    appears in later prompts (``<|im_end|>`` included) with mask 1, tool results and user replies between
    them with mask 0. It is cut at ``max_completion_length`` tokens.

    Token in, token out where it can be: the episode's last turn is trained on the tokens it sampled (the
    record's ``sampled_turns``, kept by an agent with ``record_samples``), and so is every earlier turn whose
    sampled tokens spell exactly the transcript's text (a non-canonical tokenisation of it). Any other earlier
    turn is trained on the transcript's tokens, the context every later turn was sampled in (the agent renders
    its next prompt from the transcript). Where the trained tokens are the sampled ones their sampler
    log-probabilities come along, so the trainer can measure how far its own log-probabilities of the same tokens
    are from the sampler's (``mismatch_kl``), and on what share of the agent's tokens (``sampled_token_share``).

    Turns the env rejected (text that is not a readable action) are not in its transcript. When the episode
    ended on them (the turn cap or too many errors came while the policy kept writing unreadable turns), the
    last of them was sampled from the conversation as the transcript still has it, so it joins the completion
    as sampled, mask 1: it gets the episode's advantage like any other turn. Without it a malformed reply is
    invisible to the loss (its reward 0 lowers its group's baseline, nothing pushes its tokens down), and
    probability mass drifts into it freely: on the sanity task a policy at lr 1e-2 fell into empty replies
    within 9 steps and never came back (docs/train.md, "Does the trainer learn?"). A rejected turn that the
    policy followed with a readable one is left out (its context is the next turn's, not the end of the
    completion). Without recorded samples, an episode whose every turn was rejected is its first prompt and a
    single ``<|im_end|>`` with mask 0 (it shapes its group's baseline only).
    """
    from ..tiny.sft_data import render_prompt, sft_segments

    nan = float("nan")

    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    turns = list(record.get("sampled_turns") or ())
    last_taken = max((i for i, t in enumerate(turns) if t.get("accepted")), default=-1)
    taken = iter([t for t in turns[:last_taken + 1] if t.get("accepted")])
    trailing = turns[last_taken + 1:]
    segments = sft_segments(tokenizer, record)
    if segments:
        prompt_text, body = segments[0][0], segments[1:]
    else:
        prompt_text, body = render_prompt(tokenizer, record["messages"], record.get("tools")), []
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    last_target = max((i for i, (_, is_target) in enumerate(body) if is_target), default=-1)
    for i, (text, is_target) in enumerate(body):
        piece = ids(text)
        turn = next(taken, None) if is_target else None
        if turn is not None and list(turn["tokens"]) != piece and (
                (i == last_target and not trailing) or tokenizer.decode(turn["tokens"]) == text):
            # Train the tokens the turn sampled, not the transcript's tokenisation of them: the episode's last
            # turn always (it conditions nothing after it, and its rendering can differ: stripped spaces, an
            # <|im_end|> the turn cap kept it from writing), an earlier one when it is the same text tokenised
            # otherwise (a sampled non-canonical split, in 19 of 201 turns of a near-chance start at temperature
            # 1; docs/train.md, "Does the trainer learn?"). The canonical ids of such a turn are tokens the
            # policy did not write, often at low probability, where the loss's gradient is largest. Later turns
            # were sampled after the canonical ids (the agent re-tokenises its prompt), so here they are scored
            # in a context that differs from the sampler's: mismatch_kl measures it (there: mean 2e-3, at most
            # 0.02 a step, where training the canonical ids gave 1e-11 on 82-95% of the agent's tokens, the rest
            # unmeasured).
            piece = list(turn["tokens"])
        completion.extend(piece)
        mask.extend([int(is_target)] * len(piece))
        if turn is not None and list(turn["tokens"]) == piece:
            logprobs.extend(float(x) for x in turn["logprobs"])
        else:
            logprobs.extend([nan] * len(piece))
    if trailing:
        context = render_prompt(tokenizer, record["messages"], record.get("tools"))
        written = prompt_text + "".join(text for text, _ in body)
        if context.startswith(written):  # the template renders the history as the completion has it
            rest = ids(context[len(written):]) if len(context) > len(written) else []
            rejected = trailing[-1]
            completion.extend(rest + list(rejected["tokens"]))
            mask.extend([0] * len(rest) + [1] * len(rejected["tokens"]))
            logprobs.extend([nan] * len(rest) + [float(x) for x in rejected["logprobs"]])
    if not completion:
        completion, mask, logprobs = [tokenizer.convert_tokens_to_ids("<|im_end|>")], [0], [nan]
    cut = max_completion_length
    agent_tokens = sum(mask[:cut])
    sampled_tokens = sum(1 for m, lp in zip(mask[:cut], logprobs[:cut]) if m and lp == lp)
    return EncodedEpisode(ids(prompt_text), completion[:cut], mask[:cut], logprobs[:cut], agent_tokens,
                          sampled_tokens)


# ----------------------------------------------------------------------------- the rollout function


class _HintedAgent:
    """An agent that generates with ``hint`` appended to the system prompt (hint mode); the transcript keeps
    the plain prompt, so the gradient is computed on the plain prompt (off-policy, uncorrected, as the
    authors do)."""

    def __init__(self, agent: Any, hint: str) -> None:
        self.agent, self.hint = agent, hint
        self.name = f"{getattr(agent, 'name', 'agent')}+hint"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        """Stateless (the conversation travels in ``info``)."""

    def _hinted(self, info: dict) -> dict:
        messages = [dict(m) for m in info.get("messages") or []]
        if messages and messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{self.hint}"
        else:
            messages.insert(0, {"role": "system", "content": self.hint})
        return {**info, "messages": messages}

    def act_batch(self, observations: Sequence[str], infos: Sequence[dict]) -> list:
        return self.agent.act_batch(observations, [self._hinted(i) for i in infos])

    @property
    def record_samples(self) -> bool:
        return bool(getattr(self.agent, "record_samples", False))

    @property
    def last_samples(self) -> list:
        return getattr(self.agent, "last_samples", [])

    def __call__(self, observation: str, info: dict):
        return self.act_batch([observation], [info])[0]

    def close(self) -> None:
        close = getattr(self.agent, "close", None)
        if callable(close):
            close()


class _Hinted:
    """A picklable agent factory: the agent of ``make`` in hint mode (built where the episodes run)."""

    def __init__(self, make: Any, hint: str) -> None:
        self.make, self.hint = make, hint

    def __call__(self) -> _HintedAgent:
        return _HintedAgent(self.make(), self.hint)


@dataclass
class EndpointPolicy:
    """The policy of a step when ``policy_base_url`` is set: not an agent, but how to build one where the episodes
    run (``make``, a picklable factory of :class:`~trace_train.agents.OpenAIChatAgent`) and where that is
    (``engine``, ``workers``, ``ray``), for :func:`trace_train.backends.run_jobs`."""

    make: Any
    engine: str
    workers: int = 1
    ray: Any = None


def _flat(rewards: Sequence[float]) -> bool:
    return max(rewards) - min(rewards) < 1e-9


class GroupRollouts:
    """TRL ``rollout_func``: plays every group of the batch in TRACE envs and returns their tokens.

    Called by TRL once per generation batch with the batch's prompts; the rows (seed, environment) come
    from :class:`TraceGRPOTrainer`. TRL's sampler puts the ``group_size`` copies of a row next to each
    other; the group's episodes all reset with that row's seed. ``last`` holds the statistics of the last
    call (episodes, informative share before resampling, seconds of generation and env). With
    ``policy_base_url`` the policy is an :class:`EndpointPolicy` and the episodes are played through the rollout
    seam (:meth:`_play_jobs`); ``generation_s`` is then the agents' time summed over the workers or actors.
    Played in this process, the envs stay open from step to step (``env_pool``, :class:`trace_train.rollouts.EnvPool`:
    a generated env's sandbox worker starts once per episode slot, not once per episode); :meth:`close` closes
    them.
    """

    def __init__(self, cfg: TrainConfig, env_kwargs: dict[str, dict], device: str) -> None:
        from ..rollouts import EnvPool

        self.cfg, self.env_kwargs, self.device = cfg, env_kwargs, device
        self.env_pool = EnvPool()
        self.hints = {e: _hint_for(cfg, e) for e in cfg.env_ids} if cfg.hint_share else {}
        self.episodes = 0
        self.last: dict = {}

    def _agent(self, trainer):
        top_p = getattr(trainer.args, "top_p", 1.0) or 1.0
        if self.cfg.policy_base_url is not None:
            return self._endpoint_policy(top_p)
        from ..agents import HFAgent

        model = trainer.accelerator.unwrap_model(trainer.model)
        # threads/seed None: the run set the threads, and sampling follows the trainer's (checkpointed) RNG.
        # top_k 0: the loss's log-probs are the full softmax's, so the rollouts sample from it (a top-k filter
        # would make every step off-policy by the mass it cuts); top_p stays TRL's (1.0 unless set in trl_args).
        # record_samples: each turn's sampled tokens and their log-probs, for the mismatch metric.
        return HFAgent(model, tokenizer=trainer.processing_class, threads=None, device=self.device,
                       max_new_tokens=self.cfg.max_turn_tokens, temperature=self.cfg.temperature, top_p=top_p,
                       max_prompt_tokens=1 << 30, batch_size=max(1, self.cfg.batch_rollouts), seed=None,
                       name="grpo-policy", decode=self.cfg.decode, top_k=0, record_samples=True)

    def close(self) -> None:
        """Close the envs kept open between steps."""
        self.env_pool.close()

    def _endpoint_policy(self, top_p: float) -> EndpointPolicy:
        """How the step's episodes are played with ``policy_base_url``: an :class:`~trace_train.agents.OpenAIChatAgent`
        on the policy server, built where they run (the sampling settings are the ones HFAgent would use)."""
        import functools

        from ..agents import OpenAIChatAgent

        cfg = self.cfg
        ray = None
        if cfg.rollout_engine == "ray":
            from ..backends.ray_config import ray_section

            ray = ray_section(cfg.ray)
        # Requests in flight per agent: an actor's batch on Ray, a whole step's episodes locally.
        concurrency = ray.max_concurrent_per_actor if ray is not None else max(1, cfg.batch_rollouts)
        make = functools.partial(OpenAIChatAgent, cfg.policy_name, base_url=cfg.policy_base_url,
                                 temperature=cfg.temperature, top_p=top_p if top_p < 1.0 else None,
                                 max_tokens=cfg.max_turn_tokens, concurrency=concurrency,
                                 timeout=ENDPOINT_TIMEOUT_S, extra_body=dict(cfg.policy_extra_body))
        return EndpointPolicy(make=make, engine=cfg.rollout_engine, workers=cfg.rollout_workers, ray=ray)

    def _seed_batches(self, groups: list[tuple[str, int, int]]):
        """``(env id, members, indices of groups)`` of ``groups``: per env and group size, sets of groups with distinct
        seeds (a seed drawn twice is played twice, in two batches)."""
        for env_id in dict.fromkeys(e for e, _, _ in groups):
            for n in sorted({m for e, _, m in groups if e == env_id}):
                pending = [i for i, (e, _, m) in enumerate(groups) if e == env_id and m == n]
                while pending:
                    batch, seen = [], set()
                    for i in pending:
                        if groups[i][1] not in seen:
                            batch.append(i)
                            seen.add(groups[i][1])
                    pending = [i for i in pending if i not in batch]
                    yield env_id, n, batch

    @staticmethod
    def _by_seed(records: list[dict]) -> dict[int, list[dict]]:
        by_seed: dict[int, list[dict]] = {}
        for record in sorted(records, key=lambda r: (r["seed"], r["sample"])):
            by_seed.setdefault(int(record["seed"]), []).append(record)
        return by_seed

    def _play(self, agent, groups: list[tuple[str, int, int]]) -> list[list[dict]]:
        """The episodes of ``groups`` ((env id, seed, members) each), in group order; ``hint_share`` of each
        group's members play with the hint. An :class:`EndpointPolicy` plays them through the rollout seam
        (:meth:`_play_jobs`); an agent, in this process."""
        if isinstance(agent, EndpointPolicy):
            return self._play_jobs(agent, groups)
        from ..rollouts import run_rollouts

        results: list[list[dict]] = [[] for _ in groups]
        for env_id, n, batch in self._seed_batches(groups):
            hinted = int(self.cfg.hint_share * n)
            plays = [(agent, n - hinted)] + ([(_HintedAgent(agent, self.hints[env_id]), hinted)] if hinted else [])
            seeds = [groups[i][1] for i in batch]
            for who, samples in plays:
                if samples < 1:
                    continue
                summary = run_rollouts(env_id, who, seeds=seeds, samples=samples,
                                       in_flight=len(seeds) * samples, env_kwargs=self.env_kwargs[env_id],
                                       progress=False, keep_records=True,
                                       max_steps=self.cfg.max_tool_calling_iterations, env_pool=self.env_pool)
                by_seed = self._by_seed(summary.records)
                for i in batch:
                    results[i].extend(by_seed[groups[i][1]])
        return results

    def _play_jobs(self, policy: EndpointPolicy, groups: list[tuple[str, int, int]]) -> list[list[dict]]:
        """The episodes of ``groups`` played by the endpoint agent through :func:`trace_train.backends.run_jobs`: one
        :class:`~trace_train.backends.RolloutJob` per (env, seed batch), and one more for the batch's hinted members,
        on ``policy.engine`` (local processes or Ray actors); grouped as :meth:`_play` groups them."""
        import tempfile

        from ..backends import RolloutJob, run_jobs
        from ..rollouts import read_trajectories

        cfg = self.cfg
        results: list[list[dict]] = [[] for _ in groups]
        with tempfile.TemporaryDirectory(prefix="trace-grpo-rollouts-") as tmp:
            jobs, batches = [], []
            for env_id, n, batch in self._seed_batches(groups):
                hinted = int(cfg.hint_share * n)
                seeds = [groups[i][1] for i in batch]
                hint = self.hints.get(env_id, "")
                for make, samples in ((policy.make, n - hinted), (_Hinted(policy.make, hint), hinted)):
                    if samples < 1:
                        continue
                    jobs.append(RolloutJob(key=f"grpo:{env_id}", make=make, targets=[env_id], seeds=seeds,
                                           out=Path(tmp) / f"job{len(jobs)}.jsonl", samples=samples,
                                           in_flight=len(seeds) * samples, env_kwargs={env_id: self.env_kwargs[env_id]},
                                           max_steps=cfg.max_tool_calling_iterations, registries=list(cfg.registry),
                                           progress=False))
                    batches.append(batch)
            run_jobs(jobs, policy.engine, workers=policy.workers, ray=policy.ray)
            played = []
            for job, batch in zip(jobs, batches):
                records = read_trajectories(job.out)
                played.extend(records)
                by_seed = self._by_seed(records)
                for i in batch:
                    got = by_seed.get(groups[i][1], [])
                    if len(got) != job.samples:
                        raise RuntimeError(f"the {policy.engine} rollout backend returned {len(got)} episodes of "
                                           f"{groups[i][0]} seed {groups[i][1]}, not {job.samples}")
                    results[i].extend(got)
        failed = [r for r in played if r.get("steps") and r.get("agent_errors", 0) >= r["steps"]]
        if played and len(failed) == len(played):
            raise RuntimeError(f"every request of the step's {len(played)} episodes to the policy server at "
                               f"{cfg.policy_base_url} failed (model {cfg.policy_name!r}); is it still up? The "
                               "episodes are not trained on")
        return results

    def _resample_seed(self, step: int, group: int, attempt: int) -> int:
        """A fresh training seed for attempt ``attempt`` of group ``group`` at ``step`` (a pure function, so a
        resumed run draws the same ones). Without ``num_seeds``, resampled seeds come after the dataset's."""
        cfg = self.cfg
        lo, hi = cfg.train_seed_range()
        index = (step * cfg.groups_per_step + group) * cfg.resample_attempts + attempt
        if cfg.num_seeds is None:
            return lo + cfg.groups_per_step * cfg.max_steps + index % max(1, hi - lo - cfg.groups_per_step * cfg.max_steps)
        return lo + (index * 7919 + 1) % cfg.num_seeds

    def __call__(self, prompts: list, trainer) -> dict:
        cfg = self.cfg
        rows = getattr(trainer, "_trace_rows", None)
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError("GroupRollouts needs the batch rows; use it with trace_train.train.trainer.TraceGRPOTrainer")
        g = cfg.group_size
        if len(rows) % g:
            raise RuntimeError(f"a batch of {len(rows)} rows is not whole groups of {g}")
        # Consecutive rows with one seed are one group's members. On one process they are whole groups; with
        # several processes TRL may split a group across them, and each process plays its share of it.
        groups: list[tuple[str, int, int]] = []
        for r in rows:
            key = (r.get("environment") or cfg.env_ids[0], int(r["seed"]))
            if groups and groups[-1][:2] == key and groups[-1][2] < g:
                groups[-1] = (*key, groups[-1][2] + 1)
            else:
                groups.append((*key, 1))
        whole = all(n == g for _, _, n in groups)
        if cfg.resample_attempts and not whole and not getattr(self, "_warned_split", False):
            logger.warning("GRPO groups are split across processes; dynamic sampling needs whole groups on one "
                           "process and is off (set per_device_train_batch_size to a multiple of group_size)")
            self._warned_split = True
        t0 = time.perf_counter()
        was_training = trainer.model.training  # HFAgent puts the model in eval mode; TRL reads the mode after
        agent = self._agent(trainer)
        try:
            played = self._play(agent, groups)
            flat_before = [_flat([r["reward"] for r in eps]) for eps in played]
            resampled = 0
            for attempt in range(cfg.resample_attempts if whole else 0):
                todo = [i for i, eps in enumerate(played) if _flat([r["reward"] for r in eps])]
                if not todo:
                    break
                fresh = [(groups[i][0], self._resample_seed(trainer.state.global_step, i, attempt), g) for i in todo]
                for i, eps in zip(todo, self._play(agent, fresh)):
                    played[i] = eps
                resampled += len(todo)
        finally:
            if hasattr(getattr(agent, "model", None), "train"):
                agent.model.train(was_training)
        played_s = time.perf_counter() - t0
        tokenizer = trainer.processing_class
        prompt_ids, completion_ids, env_mask, rewards, env_names, logprobs = [], [], [], [], [], []
        env_errors = agent_tokens = sampled_tokens = 0
        for (env_id, _, _), eps in zip(groups, played):
            # An episode the machine failed (termination env_error: an image build, a dead container) says
            # nothing about the policy. TRL needs every row, so it stays, but out of the group: the mean reward
            # of the group's other members (no advantage of its own, the group's baseline unchanged) and a
            # mask of zeros (no token of it enters the loss).
            scored = [float(r["reward"]) for r in eps if r.get("termination") != "env_error"]
            fill = sum(scored) / len(scored) if scored else 0.0
            for record in eps:
                enc = encode_episode_sampled(tokenizer, record, cfg.max_completion_length)
                m, reward = enc.env_mask, float(record["reward"])
                if record.get("termination") == "env_error":
                    env_errors += 1
                    m, reward = [0] * len(m), fill
                else:
                    agent_tokens += enc.agent_tokens
                    sampled_tokens += enc.sampled_tokens
                prompt_ids.append(enc.prompt_ids)
                completion_ids.append(enc.completion_ids)
                env_mask.append(m)
                logprobs.append(enc.sampler_logprobs)
                rewards.append(reward)
                env_names.append(env_id)
        if cfg.shuffle_rewards:
            # The negative control: the same rewards, dealt to the batch's episodes at random (a pure function of
            # the seed and the step), so that no reward says anything about the episode it lands on.
            import random

            random.Random(f"{cfg.seed}:{trainer.state.global_step}").shuffle(rewards)
        if env_errors:
            logger.warning("%d of %d GRPO episodes ended in env_error (the machine failed, not the policy); "
                           "they were left out of their groups", env_errors, len(rewards))
        episodes = len(rows) + resampled * g
        self.episodes += episodes
        stats = getattr(agent, "stats", None)
        gen_s = stats.seconds if stats is not None else sum(r["timing"]["agent_s"] for eps in played for r in eps)
        # Playing = generation + the envs (tool calls, the simulated user, the reward at the last step, resets);
        # encoding the episodes into tokens comes after.
        wall = time.perf_counter() - t0
        env_s = max(0.0, played_s - gen_s)
        by_env = {e: [r for r, n in zip(rewards, env_names) if n == e] for e in dict.fromkeys(env_names)}
        self.last = {"episodes": episodes, "resampled_groups": resampled, "env_errors": env_errors,
                     "informative_before_resampling": 1.0 - sum(flat_before) / len(flat_before),
                     "generation_s": gen_s, "env_s": env_s, "encode_s": wall - played_s, "rollout_s": wall,
                     "reward_by_env": {e: sum(v) / len(v) for e, v in by_env.items()},
                     "sampled_token_share": sampled_tokens / agent_tokens if agent_tokens else None}
        # TRL keeps the sampler's log-probs as the batch's sampling_per_token_logps; without vLLM it only stores
        # them, and TraceGRPOTrainer compares them with the loss's own (mismatch_kl).
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": logprobs if sampled_tokens else None, "env_mask": env_mask, "env_reward": rewards}


def env_reward(prompts=None, completions=None, env_reward=None, **kwargs) -> list[float]:
    """TRL reward function: the env's verifiable reward of each episode (computed during the rollout)."""
    if env_reward is None:
        raise RuntimeError("env_reward needs the rollout's env_reward column (rollout: trace)")
    return [float(r) for r in env_reward]


# ----------------------------------------------------------------------------- train


#: Most rows of a ``rollout: trl`` dataset (each costs an env reset to render its prompt; TRL cycles epochs).
MAX_PROMPT_ROWS = 1024


def _seed_dataset(cfg: TrainConfig, env_kwargs: dict[str, dict]):
    """The training rows: one per (env, seed), with ``seed`` and ``environment`` columns.

    TRACE's rollout function plays the envs itself and reads only those columns, so its rows carry a
    placeholder prompt (no env is reset to build them: a long time-budgeted run has many seeds). TRL's tool
    loop needs the real opening prompts: :func:`trace_envs.adapters.trl.make_dataset`, at most
    :data:`MAX_PROMPT_ROWS` seeds per env.
    """
    from datasets import Dataset

    from trace_envs.adapters.trl import make_dataset

    lo, hi = cfg.train_seed_range()
    count = cfg.num_seeds if cfg.num_seeds is not None else cfg.groups_per_step * cfg.max_steps
    # TRL's sampler drops an incomplete batch: with fewer rows than groups per step there would be no step at
    # all, so the seeds repeat until every env has at least a batch of rows.
    rows = max(count, math.ceil(cfg.groups_per_step / len(cfg.env_ids)))
    if cfg.rollout == "trl":
        rows = max(min(rows, MAX_PROMPT_ROWS), math.ceil(cfg.groups_per_step / len(cfg.env_ids)))
        return make_dataset(cfg.env_ids, seeds=[lo + i % count for i in range(rows)],
                            env_kwargs=lambda e: env_kwargs[e])
    seeds = [lo + i % count for i in range(rows)]
    placeholder = [{"role": "user", "content": ""}]
    return Dataset.from_dict({"prompt": [placeholder] * (rows * len(cfg.env_ids)),
                              "seed": seeds * len(cfg.env_ids),
                              "environment": [e for e in cfg.env_ids for _ in seeds]})


def train(cfg: TrainConfig, callbacks: Sequence[Any] = ()) -> TrainResult:
    """Train one LoRA adapter with GRPO (or SFT with ``cfg.sft``) and write it under ``cfg.output_dir``.

    Everything that can be wrong with the config or the envs fails before the model loads.

    Args:
        cfg: the run's settings.
        callbacks: extra ``transformers.TrainerCallback`` objects for the trainer.

    Returns:
        A :class:`TrainResult`.
    """
    t0 = time.perf_counter()
    device = cfg.check_device()
    cfg.check_trl_args()
    _load_envs(cfg)
    _check_policy_endpoint(cfg)
    if not Path(cfg.model).is_dir() and not _in_hf_cache(cfg.model):
        raise ConfigError(f"TrainConfig.model = {cfg.model!r} is neither a folder nor a model in the local Hugging "
                          "Face cache (the hub is offline). Fix: pass the folder `trace model bootstrap` printed")
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    env_kwargs = {e: env_kwargs_for(cfg, e) for e in cfg.env_ids}
    if cfg.sft:
        from .sft import train_sft

        return train_sft(cfg, env_kwargs, device, t0)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from .trainer import StepLogger, TimeBudget, TraceGRPOTrainer

    if device == "cpu":
        torch.set_num_threads(cfg.threads)
    args = GRPOConfig(**cfg.grpo_kwargs(device))
    resume_from = None
    if cfg.resume and cfg.checkpoint_dir.is_dir():
        resume_from = last_complete_checkpoint(cfg.checkpoint_dir)
    if cfg.resume and resume_from is None:
        logger.warning("resume: no checkpoint in %s; starting from step 0", cfg.checkpoint_dir)
    start_step = int(json.loads((Path(resume_from) / "trainer_state.json").read_text())["global_step"]) \
        if resume_from else 0
    cfg.to_yaml(out / "train_config.yaml")

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype)
    if device == "cuda":
        model = model.to("cuda")

    calibration = None
    calibration_json = out / "calibration.json"
    if resume_from and calibration_json.exists():
        calibration = json.loads(calibration_json.read_text())
    elif cfg.calibration_groups:
        calibration = calibrate(cfg, env_kwargs, device, model=model, tokenizer=tokenizer)
        calibration_json.write_text(json.dumps(calibration, indent=2, default=str))

    dataset = _seed_dataset(cfg, env_kwargs)
    rollouts = None
    if cfg.rollout == "trace":
        rollouts = GroupRollouts(cfg, env_kwargs, device)
        extra = {"reward_funcs": [env_reward], "rollout_func": rollouts}
    else:
        from trace_envs.adapters.trl import environment_factory

        factories = {e: environment_factory(e, **env_kwargs[e]) for e in cfg.env_ids}
        extra = {"reward_funcs": [], "environment_factory": factories if len(factories) > 1
                 else next(iter(factories.values()))}
    log_csv = out / "train_log.csv"
    logger_cb = StepLogger(log_csv, rollouts, default_episodes=cfg.batch_rollouts, start_step=start_step)
    peft_config = cfg.lora_config()
    warm_adapter = sft_warmup(cfg, env_kwargs, device) if cfg.sft_warmup_steps else None
    fresh_over_warmup = warm_adapter is not None and cfg.sft_warmup_lora == "fresh"
    callbacks = list(callbacks)
    if fresh_over_warmup:
        from .fold import fold_callback, fold_missing, merged_warmup

        # A new LoRA over the merged warm-up (peft_config stays); each checkpoint is folded onto the base after
        # its save, and any a killed run left unfolded now (trace_train/train/fold.py).
        model = merged_warmup(model, warm_adapter)
        if int(os.environ.get("RANK", "0")) == 0:  # one process folds (accelerate launches several)
            fold_missing(cfg.checkpoint_dir, cfg.model, warm_adapter)
        callbacks.append(fold_callback(cfg.model, warm_adapter))
    elif warm_adapter is not None:
        from peft import PeftModel

        # GRPO trains the warm-up's LoRA on (a resumed run's checkpoint then overwrites these weights). With
        # beta > 0 TRL keeps a frozen copy of it as the reference: the KL term holds GRPO near the SFT policy.
        model = PeftModel.from_pretrained(model, str(warm_adapter), is_trainable=True)
        peft_config = None
    trainer = TraceGRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=dataset,
                          peft_config=peft_config, callbacks=[logger_cb, *callbacks], **extra)
    trainer.trace_shared_prefix = _shared_prefix_loss(cfg, trainer.model, device)
    if cfg.grpo_replay_weight > 0:
        if trainer.accelerator.num_processes > 1:
            raise ConfigError("grpo_replay_weight runs the replayed episodes outside DDP's forward; train on one "
                              "process, or set grpo_replay_weight: 0")
        from .replay import REPLAY_MAX_LENGTH, drawn_families, replay_batches

        batches = replay_batches(cfg.sft_replay, drawn_families(cfg.env_ids, env_kwargs, cfg.train_seed_range()[0]),
                                 tokenizer, cfg.grpo_replay_batch, REPLAY_MAX_LENGTH, seed=cfg.seed)
        if batches is not None:
            trainer.trace_replay = (float(cfg.grpo_replay_weight), batches, tokenizer.pad_token_id)
            (out / "replay.json").write_text(json.dumps(batches.summary, indent=2))
    if cfg.max_minutes:
        trainer.add_callback(TimeBudget(cfg.max_minutes))
    try:
        trainer.train(resume_from_checkpoint=resume_from)
    finally:
        if rollouts is not None:
            rollouts.close()

    cfg.adapter_dir.mkdir(parents=True, exist_ok=True)
    trainer.save_model(str(cfg.adapter_dir))
    if fresh_over_warmup:  # adapter/ is the folded LoRA on the base; its delta over the merged warm-up beside it
        from .fold import OVER_WARMUP, fold_onto_base

        if trainer.accelerator.is_main_process:
            delta = out / OVER_WARMUP
            if delta.exists():
                shutil.rmtree(delta)
            cfg.adapter_dir.rename(delta)
            fold_onto_base(cfg.model, warm_adapter, delta, cfg.adapter_dir)
        trainer.accelerator.wait_for_everyone()
    tokenizer.save_pretrained(str(cfg.adapter_dir))
    (cfg.adapter_dir / "trace_adapter.json").write_text(json.dumps(
        {"base_model": str(cfg.model), "method": "grpo", "env_ids": cfg.env_ids, "env_kwargs": env_kwargs,
         "steps": trainer.state.global_step, "sft_warmup_steps": cfg.sft_warmup_steps,
         "sft_warmup_lora": cfg.sft_warmup_lora if cfg.sft_warmup_steps else None,
         "grpo_replay": ({"weight": cfg.grpo_replay_weight, **trainer.trace_replay[1].summary}
                         if trainer.trace_replay else None)}, indent=2))
    curve = plot_reward_curve(log_csv, out / "reward_curve.png",
                              f"GRPO on {', '.join(cfg.env_ids)}") if cfg.plot and log_csv.exists() else None
    rows = read_log(log_csv) if log_csv.exists() else []
    episodes = int(sum(r["episodes"] or 0 for r in rows))
    warm_done = cfg.warmup_dir / "done.json"
    if cfg.sft_warmup_steps and warm_done.exists():  # the warm-up's oracle episodes are spent on this adapter too
        episodes += int(json.loads(warm_done.read_text()).get("episodes") or 0)
    result = TrainResult(adapter_dir=cfg.adapter_dir, log_csv=log_csv, curve_png=curve,
                         steps=trainer.state.global_step, rollouts=episodes, calibration=calibration,
                         seconds=time.perf_counter() - t0, output_dir=out, final=rows[-1] if rows else {})
    (out / "train_result.json").write_text(json.dumps(result.to_dict(), indent=2, default=str))
    return result


def last_complete_checkpoint(folder: Path) -> str | None:
    """The newest ``checkpoint-N`` in ``folder`` whose save finished, or None. The Trainer writes a checkpoint's
    ``trainer_state.json`` after its weights and optimizer state, so a run killed in the middle of a save leaves a
    newer folder without one: resuming from it failed (FileNotFoundError), and the older complete one is kept."""
    found = []  # (step, folder, finished)
    for d in Path(folder).glob("checkpoint-*"):
        suffix = d.name.rpartition("-")[2]
        if d.is_dir() and suffix.isdigit():
            found.append((int(suffix), d, (d / "trainer_state.json").is_file()))
    done = [(step, d) for step, d, finished in found if finished]
    if not done:
        return None
    step, newest = max(done)
    skipped = sorted(d.name for s_, d, finished in found if s_ > step and not finished)
    if skipped:
        logger.warning("resume: %s unfinished (no trainer_state.json); resuming from %s", ", ".join(skipped),
                       newest.name)
    return str(newest)


def sft_warmup(cfg: TrainConfig, env_kwargs: dict[str, dict], device: str) -> Path:
    """The SFT warm-up of ``cfg.sft_warmup_steps`` steps on the envs' oracle episodes: fits the LoRA once into
    ``cfg.warmup_dir / "adapter"`` (a finished one is reused, so an interrupted run resumes without refitting) and
    returns that folder. Its loss curve and ``loss.json`` sit beside the adapter."""
    from .sft import fit_sft_lora

    adapter = cfg.warmup_dir / "adapter"
    done = cfg.warmup_dir / "done.json"
    over = cfg.sft_warmup_env_kwargs
    own_kwargs = env_kwargs
    if over:  # the warm-up's own episodes (e.g. decision-blind ones); GRPO keeps env_kwargs
        env_kwargs = {e: overlay_kwargs(k, over) for e, k in env_kwargs.items()}
    # What the warm-up's weights depend on: a finished warm-up with other settings is fitted again.
    settings = {"steps": cfg.sft_warmup_steps, "model": str(cfg.model), "env_ids": list(cfg.env_ids),
                "env_kwargs": env_kwargs, "sft_episodes": cfg.sft_episodes, "sft_lr": cfg.sft_lr,
                "sft_batch_size": cfg.sft_batch_size, "seed": cfg.seed, "lora_r": cfg.lora_r,
                "lora_alpha": cfg.lora_alpha, "lora_target_modules": list(cfg.lora_target_modules)}
    if cfg.sft_turn_head_weight != 1.0:  # only when set, so that warm-ups done before the option still match
        settings["sft_turn_head_weight"] = cfg.sft_turn_head_weight
    if cfg.sft_replay_share:  # likewise; the replayed file by its content
        settings["sft_replay"] = {"share": cfg.sft_replay_share,
                                  "sha256": hashlib.sha256(Path(cfg.sft_replay).read_bytes()).hexdigest()[:16]}
    settings = json.loads(json.dumps(settings, default=str))
    if done.exists() and json.loads(done.read_text()).get("settings") == settings:
        record = json.loads(done.read_text())
        if over and "overlay_changed" not in record:  # a warm-up fitted before the check existed
            record["overlay_changed"] = overlay_changed(own_kwargs, over)
            done.write_text(json.dumps(record, indent=2))
        return adapter
    t0 = time.perf_counter()
    result = fit_sft_lora(cfg, env_kwargs, device, adapter, cfg.sft_warmup_steps, mixture_over=over)
    done.write_text(json.dumps({"steps": cfg.sft_warmup_steps, "episodes": result.examples,
                                "final_loss": result.losses[-1], "seconds": round(time.perf_counter() - t0, 1),
                                "settings": settings,
                                **({"overlay_changed": overlay_changed(own_kwargs, over)} if over else {})},
                               indent=2))
    logger.info("SFT warm-up: %d steps on %d oracle episodes, final loss %.3f", cfg.sft_warmup_steps,
                result.examples, result.losses[-1])
    return adapter


#: Seeds on which :func:`overlay_changed` compares an env's oracle episodes with and without the warm-up's kwargs.
OVERLAY_CHECK_SEEDS = range(16)


def overlay_changed(own_kwargs: dict[str, dict], over: dict) -> dict[str, list[int]]:
    """For each env, ``[changed, checked]``: on how many of :data:`OVERLAY_CHECK_SEEDS` the oracle episode with the
    warm-up's kwargs (``over`` laid on the env's ``own_kwargs``) differs from the env's own. ``over`` may not
    touch an env at all (``size.blind_cabin_prob`` on an env that draws no cancellation): that env's warm-up is
    then SFT on its own episodes, which the report's L1 reads as a transfer ceiling (trace_train/report/links.py)."""
    import gymnasium as gym

    import trace_envs
    from trace_envs import OracleAgent

    out = {}
    for env_id, kwargs in own_kwargs.items():
        changed = 0
        envs = gym.make(env_id, **kwargs), gym.make(env_id, **overlay_kwargs(kwargs, over))
        try:
            for seed in OVERLAY_CHECK_SEEDS:
                own, warm = (trace_envs.rollout(e, OracleAgent(), seed=seed)["messages"] for e in envs)
                changed += int(own != warm)
        finally:
            for e in envs:
                e.close()
        out[env_id] = [changed, len(OVERLAY_CHECK_SEEDS)]
    return out


def _check_policy_endpoint(cfg: TrainConfig) -> None:
    """With ``policy_base_url``: the server answers, and the Ray cluster of ``rollout_engine: ray`` too, before any
    model loads; a server that nothing syncs with the trained weights is said once."""
    if cfg.policy_base_url is None or cfg.sft:
        return
    cfg.check_policy_endpoint()
    if cfg.rollout_engine == "ray":
        from ..backends.ray_backend import RayBackendError, connect
        from ..backends.ray_config import ray_section

        try:
            connect(ray_section(cfg.ray).address)
        except RayBackendError as exc:
            raise ConfigError(f"TrainConfig.ray: {exc}") from None
    if not cfg.use_vllm:
        logger.warning("policy_base_url %s is not synced with the weights being trained (use_vllm is off): the "
                       "episodes come from whatever that server serves, i.e. off-policy after the first step. On GPUs "
                       "set use_vllm: true and vllm_mode: server, so that TRL pushes the weights to it every step",
                       cfg.policy_base_url)


def _shared_prefix_loss(cfg: TrainConfig, model, device: str) -> bool:
    """Whether the loss's log-probs take :func:`trace_train.train.prefix_logprobs.shared_prefix_logprobs`."""
    if cfg.loss_forward != "auto":
        return cfg.loss_forward == "shared_prefix"
    from ..tiny.fast_decode import auto_applies, supported

    if cfg.decode == "fast":
        return supported(model)[0]
    return cfg.decode == "auto" and device == "cpu" and auto_applies(model)


def _in_hf_cache(model_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(model_id, "config.json"), str)
    except Exception:
        return False

