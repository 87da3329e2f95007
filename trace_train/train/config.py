"""``TrainConfig``: every setting of ``trace train`` (GRPO, one LoRA adapter per capability).

The config sits beside :mod:`trace_train.train.grpo` the way TRL's ``GRPOConfig`` sits beside its trainer: a
dataclass with help text per field (``TrainConfig.help()`` prints it; the CLI shows it too), loadable
from YAML (:meth:`TrainConfig.from_yaml`), validated in ``__post_init__`` so that a bad value fails
before any model loads, with a message that names the field and says how to fix it.

It maps onto TRL rather than re-implementing it: the GRPO fields become ``trl.GRPOConfig`` arguments
(:meth:`TrainConfig.grpo_kwargs`), the LoRA fields a ``peft.LoraConfig`` (:meth:`TrainConfig.lora_config`),
and ``trl_args`` passes any other ``GRPOConfig`` option straight through (checked against
``GRPOConfig``'s own fields).

Defaults follow the TRACE paper's reference settings (docs/design.md, "The method's settings"): LoRA r=16, α=16 on q/k/v/o, KL β=0,
clip ε 0.2 low / 0.28 high, temperature 1.0, lr 1e-5. CPU runs with the tiny model want a larger
learning rate and small groups; ``examples/train_grpo.py`` shows both.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..schema import ConfigError  # one ConfigError for every config of trace_train

#: ``device`` values: ``cpu`` and ``cuda`` are presets (see :meth:`TrainConfig.device_preset`); ``auto`` picks one.
DEVICES = ("auto", "cpu", "cuda")
#: ``rollout`` values: TRACE's multi-turn loop (``trace``) or TRL's ``environment_factory`` tool loop (``trl``).
ROLLOUTS = ("trace", "trl")
#: ``TrainConfig.decode`` and ``TrainConfig.loss_forward`` choices.
DECODES = ("auto", "fast", "hf")
LOSS_FORWARDS = ("auto", "shared_prefix", "trl")
#: ``vllm_mode`` values (TRL's): one GPU shares training and generation, or a separate ``trl vllm-serve``.
VLLM_MODES = ("colocate", "server")
#: TRL 1.16's GRPO loss variants.
LOSS_TYPES = ("grpo", "dapo", "dr_grpo", "bnpo", "cispo", "sapo", "vespo", "luspo")


def _help(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


def overlay_kwargs(kwargs: dict, over: dict) -> dict:
    """``kwargs`` with ``over`` on top; a ``size`` mapping in both is merged key by key (the warm-up's
    ``{size: {blind_cabin_prob: 0.5}}`` keeps the run's other size keys)."""
    out = {**kwargs, **over}
    if isinstance(kwargs.get("size"), dict) and isinstance(over.get("size"), dict):
        out["size"] = {**kwargs["size"], **over["size"]}
    return out


@dataclass
class TrainConfig:
    """Settings of one ``trace train`` run (GRPO of one LoRA adapter, or its SFT baseline).

    Every field has help text in its metadata (``TrainConfig.help()``).
    """

    # ------------------------------------------------------------------ what to train
    env_ids: list[str] = _help("capability env id(s) to train on, e.g. trace/precondition_verification-v1; several "
                               "ids train one adapter on their mixture (multi-capability GRPO)",
                               default_factory=list)
    model: str = _help("base model: a folder (e.g. from `trace model bootstrap`) or a hub id (offline: it must be in "
                       "the local HF cache)", default="")
    output_dir: str = _help("run folder: adapter/, checkpoints/, train_log.csv, reward_curve.png, calibration.json",
                            default="")
    env_kwargs: dict = _help("gym.make kwargs for every env (e.g. difficulty: 1); they override the kwargs the model "
                             "was bootstrapped with (trace_model.json), which override the registry's",
                             default_factory=dict)
    registry: list[str] = _help("workspace registries (a registry.yaml or a folder holding one) to load first, for "
                                "generated envs", default_factory=list)
    sft: bool = _help("train the adapter by SFT on the envs' oracle episodes instead of GRPO (the paper's "
                      "'SFT on synthetic data' baseline)", default=False)

    # ------------------------------------------------------------------ LoRA (PEFT)
    lora_r: int = _help("LoRA rank", default=16)
    lora_alpha: int = _help("LoRA alpha (scale = alpha / r)", default=16)
    lora_dropout: float = _help("LoRA dropout", default=0.0)
    lora_target_modules: list[str] = _help("module names that get a LoRA (Qwen3: q_proj k_proj v_proj o_proj)",
                                           default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    # ------------------------------------------------------------------ GRPO (passed to trl.GRPOConfig)
    group_size: int = _help("rollouts per group (TRL's num_generations); every member of a group resets with the "
                            "same seed", default=8)
    groups_per_step: int = _help("groups (distinct seeds) per optimiser step", default=4)
    temperature: float = _help("sampling temperature of the rollouts", default=1.0)
    learning_rate: float = _help("peak learning rate of the adapter", default=1e-5)
    lr_scheduler_type: str = _help("transformers scheduler name (constant, linear, cosine, ...)", default="constant")
    epsilon: float = _help("PPO clip range, low side (TRL's epsilon)", default=0.2)
    epsilon_high: float | None = _help("PPO clip range, high side (DAPO's clip-higher; None = epsilon)", default=0.28)
    beta: float = _help("KL coefficient against the frozen base (0: no reference model is kept)", default=0.0)
    loss_type: str = _help(f"TRL loss variant: {', '.join(LOSS_TYPES)}", default="dapo")
    max_steps: int = _help("optimiser steps", default=20)
    max_minutes: float | None = _help("a training-time budget: stop (and save) before the step that would overrun "
                                      "it, or at max_steps, whichever comes first (None: no budget)", default=None)
    max_tool_calling_iterations: int | None = _help("most agent turns per episode (None: the registry's "
                                                    "max_episode_steps)", default=None)
    max_completion_length: int = _help("token budget of a whole episode after the prompt (tool results and user "
                                       "replies included, as TRL counts them); longer episodes are cut for the "
                                       "gradient", default=2048)
    max_turn_tokens: int = _help("most new tokens per agent turn (rollout='trace')", default=256)
    trl_args: dict = _help("any other trl.GRPOConfig option, passed through unchanged (e.g. {scale_rewards: batch, "
                           "top_p: 0.95, num_iterations: 2})", default_factory=dict)

    # ------------------------------------------------------------------ seeds
    seed_offset: int = _help("first training seed; group g of the run uses seed seed_offset + g (cycling over "
                             "num_seeds)", default=1_000_000)
    num_seeds: int | None = _help("training seeds (None: one fresh seed per group of the run)", default=None)
    eval_seeds: list[int] = _help("[start, stop) of the seeds evaluation uses; training seeds must not overlap them",
                                  default_factory=lambda: [0, 100_000])
    seed: int = _help("torch / data-order seed", default=0)

    # ------------------------------------------------------------------ informative groups
    resample_attempts: int = _help("dynamic sampling: a group whose rewards are all equal is re-collected on a fresh "
                                   "training seed up to this many times (the authors use 3; 0 = off; "
                                   "rollout='trace')", default=0)
    calibration_groups: int = _help("groups of group_size rollouts of the base model before training; warns when "
                                    "fewer than half would be informative (0 = skip)", default=4)
    hint_share: float = _help("hint mode (off-policy, off by default): this share of each group's rollouts gets "
                              "hint_text in its system prompt while generating; the gradient sees the plain prompt "
                              "(rollout='trace')", default=0.0)
    shuffle_rewards: bool = _help("the negative control of a trainer check: each step's rewards are dealt to its "
                                  "episodes in a random order, so they carry no information about the episodes "
                                  "(a trainer that still 'learns' is learning something other than the reward)",
                                  default=False)
    hint_text: str | None = _help("the hint (default: the env's hint_text attribute if it has one, else its registry "
                                  "description)", default=None)

    # ------------------------------------------------------------------ SFT baseline (sft: true) and warm-up
    sft_episodes: int = _help("oracle episodes per env for --sft", default=200)
    sft_steps: int = _help("optimiser steps for --sft", default=200)
    sft_lr: float = _help("learning rate for --sft", default=1e-3)
    sft_batch_size: int = _help("episodes per step for --sft", default=4)
    sft_warmup_steps: int = _help("GRPO with an SFT warm-up: the LoRA is first fitted for this many steps on the "
                                  "envs' oracle episodes (sft_episodes, sft_lr, sft_batch_size), then GRPO trains "
                                  "the same LoRA on (the cold start of R1-style recipes: GRPO from a policy that "
                                  "already does the skill sometimes; 0 = off)", default=0)
    sft_warmup_env_kwargs: dict = _help("the warm-up's own gym.make kwargs, over env_kwargs for its oracle episodes "
                                        "only (a size mapping merged key by key): e.g. {size: {blind_cabin_prob: "
                                        "0.5}} for a decision-blind warm-up that teaches the flow and leaves the "
                                        "decision to GRPO (docs/train.md)", default_factory=dict)
    sft_warmup_lora: str = _help("what GRPO trains after the warm-up: 'continue' (the warm-up's own LoRA) or "
                                 "'fresh' (a new LoRA over the warm-up merged into the weights; every adapter it "
                                 "saves is folded with the warm-up's into one LoRA on the base, of rank the two "
                                 "ranks summed: what the adapter is when GRPO starts from a merged model). "
                                 "docs/train.md compares the two on the planted decision", default="continue")
    sft_turn_head_weight: float = _help("SFT (--sft and the warm-up): the first 8 tokens of every assistant turn "
                                        "count this many times in the loss, where a turn's decision sits (message "
                                        "or call, which tool, go ahead or refuse) among tokens copied from the "
                                        "context (1 = a plain token mean)", default=1.0)
    sft_replay: str | None = _help("a trajectories file of the base's own episodes (the pipeline passes its "
                                   "rollouts on the target): its episodes of the families the envs never draw "
                                   "are replayed, in the SFT rows with sft_replay_share and in GRPO's loss with "
                                   "grpo_replay_weight, so the adapter keeps the base's behaviour there",
                                   default=None)
    sft_replay_share: float = _help("SFT (--sft and the warm-up): the share of the SFT rows replayed from "
                                    "sft_replay (0 = off)", default=0.0)
    grpo_replay_weight: float = _help("GRPO: every step's loss adds this weight times the mean NLL of the agent "
                                      "turns of grpo_replay_batch episodes replayed from sft_replay, so GRPO "
                                      "does not take back the base's behaviour on the families the envs never "
                                      "draw (0 = off; trace_train.train.replay)", default=0.0)
    grpo_replay_batch: int = _help("GRPO: replayed episodes per step (grpo_replay_weight)", default=2)

    # ------------------------------------------------------------------ device, checkpoints, logs
    device: str = _help("cpu (fp32, one torch thread, use_cpu), cuda (bf16, optional vLLM), or auto", default="auto")
    threads: int = _help("torch CPU threads (1 is fastest for the tiny models)", default=1)
    rollout: str = _help("'trace': TRACE's multi-turn loop (HFAgent prompts, as `trace eval` sees the model; phase "
                         "timings, dynamic sampling, hints); 'trl': TRL's environment_factory tool loop (works with "
                         "use_vllm)", default="trace")
    decode: str = _help("how the rollouts generate (rollout='trace'): 'fast' with trace_train.tiny.fast_decode (a "
                        "hand-written loop for Qwen3-architecture models: the prefix the batch shares attended once, "
                        "tested token-for-token against generate), 'hf' with model.generate (the path before it), "
                        "'auto' fast for the tiny presets' models on CPU and hf otherwise", default="auto")
    loss_forward: str = _help("how the loss computes the policy's log-probs: 'shared_prefix' encodes the prefix the "
                              "batch's episodes share once, then each episode at its own length "
                              "(trace_train.train.prefix_logprobs: TRL's values with less compute); 'trl' TRL's padded "
                              "forward over every episode; 'auto' shared_prefix wherever decode resolves to fast",
                              default="auto")
    use_vllm: bool = _help("generate with vLLM (GPU only; `pip install vllm`): with rollout='trl' TRL's own tool loop "
                           "generates on it; with policy_base_url (vllm_mode: server) TRL keeps the server's weights "
                           "in sync with the trained ones and TRACE's endpoint rollouts generate on it",
                           default=False)
    vllm_mode: str = _help("colocate (one GPU) or server (`trl vllm-serve` on other GPUs)", default="colocate")

    # ------------------------------------------------------------------ endpoint policy (rollout='trace')
    policy_base_url: str | None = _help(
        "an OpenAI-compatible base URL (…/v1) of the server that serves the policy being trained; when set, each "
        "step's episodes are played by an endpoint agent through the rollout seam (rollout_engine: local processes "
        "or Ray actors) instead of HFAgent in the trainer's process, and their text is re-tokenised for the loss as "
        "usual. On GPUs: the vLLM server of use_vllm + vllm_mode: server (`trl vllm-serve`), which TRL syncs with "
        "the trained weights before each step's rollout_func call; without use_vllm nothing syncs it (the server's "
        "own weights play: off-policy, e.g. `transformers serve` in tests)", default=None)
    policy_model: str | None = _help("the model name the policy server serves (policy_base_url; default: model)",
                                     default=None)
    policy_extra_body: dict = _help("extra JSON fields of every request to the policy server (policy_base_url), e.g. "
                                    "vLLM's {top_k: 50} or {chat_template_kwargs: {enable_thinking: false}}; "
                                    "`transformers serve` samples only with {generation_config: '{\"do_sample\": "
                                    "true}'} when the model's generation config is greedy", default_factory=dict)
    rollout_engine: str = _help("where endpoint rollouts (policy_base_url) run: 'local' (the trainer's process, or "
                                "rollout_workers processes of this machine) or 'ray' (actors of a Ray cluster; the ray "
                                "settings); the trainer stays on its GPUs either way", default="local")
    rollout_workers: int = _help("rollout_engine 'local': worker processes for the endpoint rollouts (1 = the "
                                 "trainer's process)", default=1)
    ray: dict = _help("rollout_engine 'ray': the Ray cluster, with the keys of a run config's ray: section (address, "
                      "num_actors, env_cpus, max_concurrent_per_actor, max_container_starts; docs/ray.md)",
                      default_factory=dict)

    save_steps: int = _help("checkpoint every N steps (adapter, optimizer, scheduler, RNG and step count)", default=10)
    save_total_limit: int | None = _help("keep at most this many checkpoints (None: all)", default=None)
    resume: bool = _help("resume from the latest checkpoint in output_dir/checkpoints", default=False)
    plot: bool = _help("write reward_curve.png", default=True)
    progress: bool = _help("progress bars", default=True)

    # ------------------------------------------------------------------ construction

    def __post_init__(self) -> None:
        if isinstance(self.env_ids, str):
            self.env_ids = [self.env_ids]
        self.env_ids = list(self.env_ids)
        if isinstance(self.registry, (str, Path)):
            self.registry = [str(self.registry)]
        self.registry = [str(p) for p in self.registry]
        if isinstance(self.lora_target_modules, str):
            self.lora_target_modules = [self.lora_target_modules]
        self.eval_seeds = list(self.eval_seeds)
        self.validate()

    def _fail(self, name: str, fix: str) -> None:
        raise ConfigError(f"TrainConfig.{name} = {getattr(self, name)!r}: {fix}")

    def validate(self) -> None:
        """Check every value (called by ``__post_init__``); raises :class:`ConfigError` naming the field and the fix."""
        if not self.env_ids or not all(isinstance(e, str) and e for e in self.env_ids):
            self._fail("env_ids", "give at least one env id, e.g. env_ids: [trace/precondition_verification-v1] "
                                  "(`trace envs list` shows them)")
        if len(set(self.env_ids)) != len(self.env_ids):
            self._fail("env_ids", "list each env once")
        if not isinstance(self.model, str) or not self.model:
            self._fail("model", "give a model folder or hub id, e.g. the folder `trace model bootstrap` printed")
        if not isinstance(self.output_dir, (str, Path)) or not str(self.output_dir):
            self._fail("output_dir", "give a folder for the adapter and logs, e.g. runs/train/precondition")
        self.output_dir = str(self.output_dir)
        if not isinstance(self.env_kwargs, dict):
            self._fail("env_kwargs", "give a mapping, e.g. {difficulty: 1}")
        if not isinstance(self.sft_warmup_env_kwargs, dict) or \
                not isinstance(self.sft_warmup_env_kwargs.get("size", {}), dict):
            self._fail("sft_warmup_env_kwargs", "give a mapping (its size a mapping too), e.g. "
                                                "{size: {blind_cabin_prob: 0.5}}")
        if self.sft_warmup_lora not in ("continue", "fresh"):
            self._fail("sft_warmup_lora", "give 'continue' (GRPO trains the warm-up's LoRA) or 'fresh' (a new LoRA "
                                          "over the merged warm-up)")
        if self.sft_warmup_env_kwargs and not self.sft_warmup_steps:
            self._fail("sft_warmup_env_kwargs", "they are the warm-up's: set sft_warmup_steps too, or leave them out")
        for name in ("trl_args",):
            if not isinstance(getattr(self, name), dict):
                self._fail(name, "give a mapping of trl.GRPOConfig options")
        positive = ("lora_r", "lora_alpha", "groups_per_step", "max_steps", "max_completion_length",
                    "max_turn_tokens", "save_steps", "threads", "sft_episodes", "sft_steps", "sft_batch_size")
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                self._fail(name, "use a positive integer")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            self._fail("group_size", "use at least 2: GRPO's advantage is a reward minus its group's mean, so a "
                                     "group of one carries no signal")
        if not 0.0 <= self.lora_dropout < 1.0:
            self._fail("lora_dropout", "use a value in [0, 1)")
        if not self.lora_target_modules or not all(isinstance(m, str) for m in self.lora_target_modules):
            self._fail("lora_target_modules", "name at least one module, e.g. [q_proj, v_proj]")
        if not self.temperature > 0:
            self._fail("temperature", "use a value > 0 (GRPO needs sampled, differing rollouts; 0.7-1.0 is usual)")
        if isinstance(self.sft_warmup_steps, bool) or not isinstance(self.sft_warmup_steps, int) \
                or self.sft_warmup_steps < 0:
            self._fail("sft_warmup_steps", "use an integer >= 0 (0: GRPO from a fresh LoRA)")
        if self.sft and self.sft_warmup_steps:
            self._fail("sft_warmup_steps", "the warm-up is for GRPO runs; with sft: true set sft_steps instead")
        if isinstance(self.sft_turn_head_weight, bool) or not isinstance(self.sft_turn_head_weight, (int, float)) \
                or not self.sft_turn_head_weight >= 1:
            self._fail("sft_turn_head_weight", "use a number >= 1 (1: a plain token mean; 10 makes a turn's opening "
                                               "decision a large share of a fitted episode's loss)")
        if isinstance(self.sft_replay_share, bool) or not isinstance(self.sft_replay_share, (int, float)) \
                or not 0.0 <= self.sft_replay_share < 1.0:
            self._fail("sft_replay_share", "use a number in [0, 1): the share of the SFT rows replayed (0 = off)")
        if isinstance(self.grpo_replay_weight, bool) or not isinstance(self.grpo_replay_weight, (int, float)) \
                or not self.grpo_replay_weight >= 0:
            self._fail("grpo_replay_weight", "use a number >= 0: the weight of the replayed episodes' NLL in "
                                             "GRPO's loss (0 = off)")
        if isinstance(self.grpo_replay_batch, bool) or not isinstance(self.grpo_replay_batch, int) \
                or self.grpo_replay_batch < 1:
            self._fail("grpo_replay_batch", "use a positive integer: replayed episodes per GRPO step")
        if self.grpo_replay_weight > 0 and not self.sft_replay:
            self._fail("sft_replay", "give the trajectories file of the base's own episodes to replay "
                                     "(e.g. a run's rollouts/trajectories.jsonl), or grpo_replay_weight: 0")
        if self.grpo_replay_weight > 0 and self.sft:
            self._fail("grpo_replay_weight", "the replay term is GRPO's; an SFT run replays with sft_replay_share")
        if self.sft_replay_share > 0 and not self.sft_replay:
            self._fail("sft_replay", "give the trajectories file of the base's own episodes to replay "
                                     "(e.g. a run's rollouts/trajectories.jsonl), or sft_replay_share: 0")
        if self.sft_replay is not None and not Path(self.sft_replay).is_file():
            self._fail("sft_replay", f"no trajectories file at {self.sft_replay}")
        for name in ("learning_rate", "sft_lr"):
            if not getattr(self, name) > 0:
                self._fail(name, "use a value > 0 (1e-5 for Qwen3 models, ~1e-3 for the tiny CPU model)")
        if not self.epsilon > 0:
            self._fail("epsilon", "use a clip range > 0 (0.2 is usual)")
        if self.epsilon_high is not None and self.epsilon_high < self.epsilon:
            self._fail("epsilon_high", f"use a value >= epsilon ({self.epsilon}) or None")
        if self.max_minutes is not None and not self.max_minutes > 0:
            self._fail("max_minutes", "use a budget > 0 minutes, or None")
        if self.beta < 0:
            self._fail("beta", "use a KL coefficient >= 0 (0 keeps no reference model)")
        if self.loss_type not in LOSS_TYPES:
            self._fail("loss_type", f"choose one of {', '.join(LOSS_TYPES)}")
        if self.max_tool_calling_iterations is not None and (
                isinstance(self.max_tool_calling_iterations, bool) or self.max_tool_calling_iterations < 1):
            self._fail("max_tool_calling_iterations", "use a positive integer or None (the registry's cap)")
        if self.max_turn_tokens > self.max_completion_length:
            self._fail("max_turn_tokens", f"use at most max_completion_length ({self.max_completion_length})")
        if len(self.eval_seeds) != 2 or not self.eval_seeds[0] <= self.eval_seeds[1]:
            self._fail("eval_seeds", "give [start, stop), e.g. [0, 100000]")
        if self.num_seeds is not None and (isinstance(self.num_seeds, bool) or self.num_seeds < 1):
            self._fail("num_seeds", "use a positive integer or None")
        if self.seed_offset < 0:
            self._fail("seed_offset", "use a seed >= 0")
        lo, hi = self.train_seed_range()
        if lo < self.eval_seeds[1] and self.eval_seeds[0] < hi:
            self._fail("seed_offset", f"training seeds {lo}..{hi - 1} overlap the evaluation seeds "
                                      f"{self.eval_seeds[0]}..{self.eval_seeds[1] - 1}; move seed_offset to "
                                      f"{self.eval_seeds[1]} or above (or change eval_seeds)")
        if isinstance(self.resample_attempts, bool) or not 0 <= self.resample_attempts <= 16:
            self._fail("resample_attempts", "use 0 (off) to 16; the authors use 3")
        if self.calibration_groups < 0:
            self._fail("calibration_groups", "use 0 (skip) or a positive number of groups")
        if not 0.0 <= self.hint_share < 1.0:
            self._fail("hint_share", "use a share in [0, 1) of each group's rollouts (0 = off; the authors use "
                                     "0.25-0.5)")
        if self.hint_share and int(self.hint_share * self.group_size) == 0:
            self._fail("hint_share", f"{self.hint_share} of a group of {self.group_size} is no rollout; raise it to "
                                     f"at least {1 / self.group_size:.3g}")
        if self.device not in DEVICES:
            self._fail("device", f"choose one of {', '.join(DEVICES)}")
        if self.decode not in DECODES:
            self._fail("decode", f"choose one of {', '.join(DECODES)}")
        if self.loss_forward not in LOSS_FORWARDS:
            self._fail("loss_forward", f"choose one of {', '.join(LOSS_FORWARDS)}")
        if self.rollout not in ROLLOUTS:
            self._fail("rollout", f"choose one of {', '.join(ROLLOUTS)}")
        if self.vllm_mode not in VLLM_MODES:
            self._fail("vllm_mode", f"choose one of {', '.join(VLLM_MODES)}")
        self._validate_endpoint()
        if self.use_vllm and self.rollout != "trl" and self.policy_base_url is None:
            self._fail("use_vllm", "vLLM generation goes through TRL's own tool loop (rollout: trl), or through TRACE's "
                                   "endpoint rollouts on a vLLM server (policy_base_url with vllm_mode: server): set "
                                   "one of them as well")
        if self.use_vllm and self.device == "cpu":
            self._fail("use_vllm", "vLLM needs a CUDA GPU; set device: cuda, or use_vllm: false on a CPU")
        if self.rollout == "trl" and (self.resample_attempts or self.hint_share):
            name = "resample_attempts" if self.resample_attempts else "hint_share"
            self._fail(name, "dynamic sampling and hints need TRACE's rollout loop: set rollout: trace, or 0 here")
        if self.rollout == "trl" and self.shuffle_rewards:
            self._fail("shuffle_rewards", "the shuffled-reward control needs TRACE's rollout loop: set rollout: trace")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            self._fail("save_total_limit", "use a positive integer or None")

    def _validate_endpoint(self) -> None:
        """The endpoint policy's fields (policy_base_url, policy_model, rollout_engine, rollout_workers, ray)."""
        from trace_train.backends import ENGINES
        from trace_train.backends.ray_config import ray_section

        url = self.policy_base_url
        if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
            self._fail("policy_base_url", "give the OpenAI-compatible base URL of the server that serves the policy, "
                                          "e.g. http://127.0.0.1:8000/v1 (or null for HFAgent in this process)")
        if self.policy_model is not None and (not isinstance(self.policy_model, str) or not self.policy_model):
            self._fail("policy_model", "give the name the server serves the model under, or null for model")
        if not isinstance(self.policy_extra_body, dict):
            self._fail("policy_extra_body", "give a mapping of request fields, e.g. {top_k: 50}")
        if self.rollout_engine not in ENGINES:
            self._fail("rollout_engine", f"choose one of {', '.join(ENGINES)}")
        workers = self.rollout_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            self._fail("rollout_workers", "use a positive integer (1 = the trainer's process)")
        if not isinstance(self.ray, dict):
            self._fail("ray", "give a mapping of a run config's ray: keys, e.g. {address: auto, num_actors: 8}")
        try:
            ray_section(self.ray, "ray.")
        except ConfigError as exc:
            self._fail("ray", f"{exc} (docs/ray.md lists the keys and their values)")
        if url is None:
            if self.rollout_engine != "local":
                self._fail("rollout_engine", "the seam plays endpoint rollouts only; set policy_base_url (the server "
                                             "of the policy being trained), or rollout_engine: local")
            if self.rollout_workers != 1:
                self._fail("rollout_workers", "worker processes play endpoint rollouts only; set policy_base_url, or "
                                              "rollout_workers: 1")
            return
        if self.rollout != "trace":
            self._fail("policy_base_url", "endpoint rollouts are TRACE's rollout loop: set rollout: trace (rollout: "
                                          "trl generates through TRL's own loop)")
        if self.use_vllm and self.vllm_mode != "server":
            self._fail("vllm_mode", "a colocated vLLM engine has no endpoint for the rollouts; use vllm_mode: server "
                                    "with policy_base_url on that server, or drop policy_base_url")
        if self.trl_args.get("vllm_importance_sampling_correction"):
            self._fail("trl_args", "vllm_importance_sampling_correction needs the sampling log-probs, and endpoint "
                                   "rollouts come back as text (re-tokenised for the loss): leave it out")

    # ------------------------------------------------------------------ derived values

    @property
    def batch_rollouts(self) -> int:
        """Rollouts per optimiser step (TRL's per-device batch): ``group_size * groups_per_step``."""
        return self.group_size * self.groups_per_step

    def train_seed_range(self) -> tuple[int, int]:
        """``[start, stop)`` of the training seeds (resampled groups draw from it too)."""
        count = self.num_seeds
        if count is None:
            # One fresh seed per group, room for every resampling attempt, at most.
            count = self.groups_per_step * self.max_steps * (1 + self.resample_attempts)
        return self.seed_offset, self.seed_offset + count

    @property
    def adapter_dir(self) -> Path:
        return Path(self.output_dir) / "adapter"

    @property
    def checkpoint_dir(self) -> Path:
        return Path(self.output_dir) / "checkpoints"

    @property
    def warmup_dir(self) -> Path:
        """Where the SFT warm-up's LoRA (``sft_warmup_steps``) is written; GRPO starts from it."""
        return Path(self.output_dir) / "sft_warmup"

    def resolved_device(self) -> str:
        """``cpu`` or ``cuda`` (``auto``: cuda when torch sees one)."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    def check_device(self) -> str:
        """The device to train on; fails at once, with the fix, when the GPU preset has no CUDA (or no vLLM)."""
        import importlib.util

        device = self.resolved_device()
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("TrainConfig.device = 'cuda', but torch sees no CUDA GPU on this machine "
                                  f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). Fix: set device: "
                                  "cpu (or auto), or run on a GPU machine with a CUDA build of torch")
            if self.use_vllm and importlib.util.find_spec("vllm") is None:
                raise ConfigError("TrainConfig.use_vllm = True, but vllm is not installed. Fix: `pip install "
                                  "'vllm<=0.31'` (the versions TRL 1.16 supports), or set use_vllm: false")
        return device

    def device_preset(self, device: str) -> dict:
        """The ``GRPOConfig`` arguments of a device preset (docs/design.md, "Models").

        CPU: fp32, no gradient checkpointing, ``use_cpu``. CUDA: bf16, gradient checkpointing, and TRL's
        vLLM generation when ``use_vllm`` (colocate mode on one GPU, server mode across GPUs).
        """
        if device == "cpu":
            return {"use_cpu": True, "bf16": False, "fp16": False, "gradient_checkpointing": False}
        preset = {"bf16": True, "gradient_checkpointing": True}
        if self.use_vllm:
            preset.update(use_vllm=True, vllm_mode=self.vllm_mode)
            if self.policy_base_url is not None:
                # TRL syncs the trained weights into the server the episodes are played on (its root URL: TRL's
                # client adds /v1 itself), and there are no sampling log-probs to correct with (text replies).
                preset.update(vllm_server_base_url=self.policy_server_root(),
                              vllm_importance_sampling_correction=False)
        return preset

    @property
    def policy_name(self) -> str:
        """The model name sent to the policy server (``policy_model``, else ``model``)."""
        return self.policy_model or self.model

    def policy_server_root(self) -> str:
        """``policy_base_url`` without its ``/v1`` (the root TRL's vLLM client takes)."""
        url = (self.policy_base_url or "").rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    def check_policy_endpoint(self, timeout: float = 10.0) -> None:
        """With ``policy_base_url``: an OpenAI-compatible server answers there (its ``/models``), checked before any
        model loads; raises :class:`ConfigError` with the fix otherwise."""
        if self.policy_base_url is None:
            return
        import json
        import urllib.error
        import urllib.request

        url = self.policy_base_url.rstrip("/") + "/models"
        start = ("start the server of the policy first (on GPUs `trl vllm-serve --model MODEL` with use_vllm: true and "
                 "vllm_mode: server; on a CPU `transformers serve`), or set policy_base_url: null to play the episodes "
                 "with HFAgent in this process")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as reply:
                body = json.loads(reply.read() or b"{}")
        except urllib.error.HTTPError as exc:
            raise ConfigError(f"TrainConfig.policy_base_url = {self.policy_base_url!r}: the server there answers "
                              f"GET /models with HTTP {exc.code}, so it is not an OpenAI-compatible base URL. Fix: "
                              "give the URL that ends in /v1, e.g. http://127.0.0.1:8000/v1") from None
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ConfigError(f"TrainConfig.policy_base_url = {self.policy_base_url!r}: no OpenAI-compatible server "
                              f"answers there ({reason}). Fix: {start}") from None
        served = [m.get("id") for m in body.get("data", []) if isinstance(m, dict)] if isinstance(body, dict) else []
        if self.use_vllm and served and self.policy_name not in served:
            raise ConfigError(f"TrainConfig.policy_model: the server at {self.policy_base_url} serves "
                              f"{', '.join(map(str, served))}, not {self.policy_name!r}. Fix: set policy_model to the "
                              "served name")

    def grpo_kwargs(self, device: str) -> dict:
        """``trl.GRPOConfig`` arguments (the preset, the GRPO fields, then ``trl_args`` on top)."""
        kwargs = {
            "output_dir": str(self.checkpoint_dir),
            "max_steps": self.max_steps,
            "per_device_train_batch_size": self.batch_rollouts,
            "gradient_accumulation_steps": 1,
            "num_generations": self.group_size,
            "temperature": self.temperature,
            "learning_rate": self.learning_rate,
            "lr_scheduler_type": self.lr_scheduler_type,
            "warmup_steps": 0,
            "epsilon": self.epsilon,
            "beta": self.beta,
            "loss_type": self.loss_type,
            "max_completion_length": self.max_completion_length,
            "logging_steps": 1,
            "save_strategy": "steps",
            "save_steps": self.save_steps,
            "save_total_limit": self.save_total_limit,
            "report_to": "none",
            "seed": self.seed,
            "data_seed": self.seed,
            "disable_tqdm": not self.progress,
            "remove_unused_columns": False,
            "dataloader_num_workers": 0,
            **self.device_preset(device),
        }
        if self.epsilon_high is not None:
            kwargs["epsilon_high"] = self.epsilon_high
        if self.rollout == "trl" and self.max_tool_calling_iterations is not None:
            kwargs["max_tool_calling_iterations"] = self.max_tool_calling_iterations
        kwargs.update(self.trl_args)
        return kwargs

    def check_trl_args(self) -> None:
        """``trl_args`` keys must be ``GRPOConfig`` fields (imports trl, loads no model)."""
        if not self.trl_args:
            return
        from trl import GRPOConfig

        known = {f.name for f in dataclasses.fields(GRPOConfig)}
        for key in self.trl_args:
            if key not in known:
                close = difflib.get_close_matches(key, sorted(known), n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(f"TrainConfig.trl_args has {key!r}, which is not a trl.GRPOConfig option{hint}. "
                                  "Fix: use a GRPOConfig field name, or the TrainConfig field for it")

    def lora_config(self):
        """The ``peft.LoraConfig`` of the adapter."""
        from peft import LoraConfig

        return LoraConfig(r=self.lora_r, lora_alpha=self.lora_alpha, lora_dropout=self.lora_dropout,
                          target_modules=list(self.lora_target_modules), task_type="CAUSAL_LM", bias="none")

    # ------------------------------------------------------------------ YAML

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, data: dict, **overrides: Any) -> "TrainConfig":
        """A config from a mapping; unknown keys are an error that suggests the closest field."""
        merged = {**(data or {}), **{k: v for k, v in overrides.items() if v is not None}}
        if "env_id" in merged and "env_ids" not in merged:  # the singular reads naturally in YAML
            merged["env_ids"] = merged.pop("env_id")
        names = cls.field_names()
        for key in merged:
            if key not in names:
                close = difflib.get_close_matches(key, names, n=3)
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                raise ConfigError(f"unknown TrainConfig field {key!r}{hint}. Fix: use one of the fields "
                                  "`trace train --help-config` lists, or put GRPOConfig options under trl_args")
        return cls(**merged)

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> "TrainConfig":
        """Load a YAML file (a mapping of field names); ``overrides`` (not None) win over the file."""
        import yaml

        path = Path(path)
        if not path.exists():
            raise ConfigError(f"config file {path} does not exist. Fix: check the path")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path} must hold a mapping of TrainConfig fields, got {type(data).__name__}")
        return cls.from_dict(data, **overrides)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self, path: str | Path) -> Path:
        import yaml

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path

    @classmethod
    def help(cls) -> str:
        """Every field with its default and help text."""
        lines = []
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            lines.append(f"{f.name} (default {default!r}): {f.metadata.get('help', '')}")
        return "\n".join(lines)


__all__ = ["ConfigError", "DECODES", "DEVICES", "LOSS_FORWARDS", "LOSS_TYPES", "ROLLOUTS", "TrainConfig", "VLLM_MODES",
           "overlay_kwargs"]
