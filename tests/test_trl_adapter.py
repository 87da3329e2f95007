"""The TRL adapter (``trace_envs.adapters.trl``): schemas, episode semantics, and GRPO through TRL.

* The generated tool methods give transformers' schema extraction (what TRL renders for the
  model) exactly the env's ``info["tools"]``.
* ``reset``/tools/``send_message_to_user``/``get_reward`` on the worked example env.
* ``trl.GRPOTrainer`` runs 2 steps through the adapter on a tiny Qwen3 model, and every reward TRL
  logged is the env's reward for the actions the model took (checked by replaying them in a fresh env);
  some rollout earns a non-zero reward, so the env's evaluation, not a default, reached TRL.
  Parametrized over the example env and every registered τ² capability env (compact policy,
  difficulty 1). The model is a random-init nano Qwen3 warmed up on one short scoring episode of
  the env (see ``_warm_model``), so that its rollouts finish some episodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trace_envs
from trace_envs import OracleAgent, ScriptedAgent, rollout
from trace_envs.adapters import trl as adapter
from trace_envs.core.conversation import tool_calls_of

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples/warehouse_stock-v0"


def _schema_env_ids() -> list[str]:
    """Envs whose schemas must survive the adapter: every registered env with tools that needs nothing extra (the
    sanity tasks have none: one reply each)."""
    return [e.id for e in trace_envs.registered() if not e.requires and e.kind != "sanity"]


def _grpo_env_ids() -> list[str]:
    """The example env and every τ² capability env (picked up automatically once registered)."""
    caps = [e.id for e in trace_envs.registered()
            if e.kind == "capability" and (e.target or "").startswith("tau_") and not e.requires]
    return [EXAMPLE] + [c for c in caps if c != EXAMPLE]


def _method(instance, name):
    return getattr(instance, name)


# ----------------------------------------------------------------------------- import hygiene


def test_import_does_not_pull_torch_trl_or_transformers():
    code = ("import sys, trace_envs.adapters.trl as a; "
            "print(json.dumps([m for m in ('torch', 'trl', 'transformers', 'datasets') if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True,
                         env={**os.environ}, check=True, cwd=ROOT)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# ----------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("env_id", _schema_env_ids())
def test_tool_methods_render_the_env_schemas(env_id):
    from trace_train.tiny.tokenizer import qwen3_chat_template

    cls = adapter.environment_factory(env_id)  # installs the schema hook
    from transformers.utils import chat_template_utils as ctu
    from transformers.utils import get_json_schema

    instance = cls()
    names = [s["function"]["name"] for s in cls.tool_schemas]
    assert names, f"{env_id} has no tools"
    assert cls.tool_schemas == _env_tools(env_id)
    for schema in cls.tool_schemas:
        method = _method(instance, schema["function"]["name"])
        # What TRL uses: transformers' extraction, through every name it is imported under.
        assert ctu.get_json_schema(method) == schema
        assert get_json_schema(method) == schema
    # The rendered prompt (what the model reads) is identical with the methods or with the env's schemas.
    conversation = [{"role": "system", "content": "policy"}, {"role": "user", "content": "hi"}]
    template = qwen3_chat_template()
    methods = [_method(instance, n) for n in names]
    with_methods = ctu.render_jinja_template([conversation], tools=methods, chat_template=template)
    with_schemas = ctu.render_jinja_template([conversation], tools=cls.tool_schemas, chat_template=template)
    assert with_methods == with_schemas
    for schema in cls.tool_schemas:
        assert json.dumps(schema, ensure_ascii=False) in with_methods[0][0]


def _env_tools(env_id: str) -> list[dict]:
    import gymnasium as gym

    env = gym.make(env_id)
    try:
        return env.reset(seed=0)[1]["tools"]
    finally:
        env.close()


def _normalise(schema: dict) -> dict:
    """Erase the differences of notation between TRACE's schemas and transformers' hint-derived ones."""
    out = {k: v for k, v in schema.items() if k not in ("additionalProperties", "nullable")}
    kind = out.get("type")
    if isinstance(kind, list) and "null" in kind:
        rest = [k for k in kind if k != "null"]
        out["type"] = rest[0] if len(rest) == 1 else rest
    if out.get("type") == "object" and "properties" in out:
        out.pop("properties")  # nested objects: hints cannot carry their fields (the hook exists for this)
        out.pop("required", None)
    if "items" in out:
        out["items"] = _normalise(out["items"])
    if "anyOf" in out:
        out["anyOf"] = [_normalise(s) for s in out["anyOf"]]
    return out


@pytest.mark.parametrize("env_id", _schema_env_ids())
def test_hint_derived_schemas_match_without_the_hook(env_id):
    """The fallback (transformers' own extraction from the generated signature and docstring) agrees
    with the env's schema up to notation, so a missing hook degrades gracefully."""
    from transformers.utils import chat_template_utils as ctu

    cls = adapter.environment_factory(env_id)
    instance = cls()
    original = getattr(ctu.get_json_schema, "__wrapped__", ctu.get_json_schema)
    for schema in cls.tool_schemas:
        fn = schema["function"]
        derived = original(_method(instance, fn["name"]))["function"]
        assert derived["name"] == fn["name"]
        assert derived["description"] == fn["description"]
        params = fn["parameters"]
        assert derived["parameters"].get("required", []) == params["required"]
        assert set(derived["parameters"]["properties"]) == set(params["properties"])
        for arg, arg_schema in params["properties"].items():
            assert _normalise(derived["parameters"]["properties"][arg]) == _normalise(arg_schema), (fn["name"], arg)


def test_only_tools_are_public_functions():
    """TRL exposes every public function of the class as a tool: only reset, get_reward and tools may be."""
    import inspect

    cls = adapter.environment_factory(EXAMPLE)
    public = {n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction) if not n.startswith("_")}
    assert public == {"reset", "get_reward", "send_message_to_user", "list_warehouses", "get_stock", "submit_total"}
    assert adapter.environment_factory(EXAMPLE, user_tool=False).__dict__.get("send_message_to_user") is None


def test_schema_to_hint_covers_the_tool_annotations():
    from typing import Any, Literal, Optional

    assert adapter.schema_to_hint({"type": "string"}) is str
    assert adapter.schema_to_hint({"type": ["integer", "null"]}) == Optional[int]
    assert adapter.schema_to_hint({"type": "string", "enum": ["a", "b"]}) == Literal["a", "b"]
    assert adapter.schema_to_hint({"type": "array", "items": {"type": "number"}}) == list[float]
    assert adapter.schema_to_hint({"type": "object", "additionalProperties": {"type": "integer"}}) == dict[str, int]
    assert adapter.schema_to_hint({"type": "object", "properties": {"a": {"type": "string"}}}) is dict
    assert adapter.schema_to_hint({}) is Any


# ----------------------------------------------------------------------------- episode semantics


@pytest.fixture(scope="module")
def example_cls():
    return adapter.environment_factory(EXAMPLE)


def test_make_dataset_rows(example_cls):
    ds = adapter.make_dataset(EXAMPLE, seeds=[5, 9], group_size=3)
    assert ds.column_names == ["prompt", "seed", "environment"]
    assert ds["seed"] == [5, 5, 5, 9, 9, 9]
    assert set(ds["environment"]) == {EXAMPLE}
    row = ds[0]
    system, opening = row["prompt"]
    assert system["role"] == "system" and "inventory assistant" in system["content"]
    assert opening == {"role": "user", "content": ""}  # TRL appends reset()'s text here
    env = example_cls()
    text = env.reset(**row)
    assert text.startswith("Hi! How many units of the")
    assert env.messages[0]["content"] == system["content"]
    # Same seed, same task; another seed, another task.
    assert example_cls().reset(**ds[1]) == text
    other = example_cls()
    other.reset(**ds[3])
    assert other.env.unwrapped.task_fingerprint() != env.env.unwrapped.task_fingerprint()
    with_options = adapter.make_dataset(EXAMPLE, seeds=2, env_kwargs={"difficulty": 4}, options={"x": 1})
    assert with_options.column_names == ["prompt", "seed", "environment", "env_kwargs", "options"]
    env.reset(**with_options[0])
    assert len(env.env.unwrapped.stock) == 6  # difficulty 4 → 6 warehouses, from the row's env_kwargs


def test_oracle_through_the_tools_earns_the_env_reward(example_cls):
    """Playing the oracle's calls through the generated methods scores exactly what rollout() scores."""
    for seed in range(5):
        env = example_cls()
        env.reset(seed=seed, prompt=[], environment=EXAMPLE)
        reference = rollout(EXAMPLE, OracleAgent(), seed=seed)
        for name, args, result in tool_calls_of(reference["messages"]):
            assert _method(env, name)(**args) == result
        assert env.done and env.termination == "agent_stop"
        assert env.get_reward() == reference["reward"] == 1.0
        assert env.reward_breakdown == reference["reward_breakdown"]
        assert env.messages == reference["messages"]


@pytest.mark.parametrize("env_id", _schema_env_ids())
def test_oracle_replayed_in_trl_form_scores_like_rollout(env_id):
    """Every env: the oracle's episode, in the form a TRL rollout takes (tools + send_message_to_user),
    played through the adapter gets the same tool outputs, user replies and reward as rollout()."""
    cls = adapter.environment_factory(env_id)
    for seed in range(3):
        reference = rollout(env_id, OracleAgent(), seed=seed)
        env = cls()
        env.reset(seed=seed)
        converted = adapter.to_trl_messages(reference["messages"], reference["termination"])
        results = {m["tool_call_id"]: m["content"] for m in converted if m["role"] == "tool"}
        for m in converted:
            for tc in m.get("tool_calls") or ():
                args = json.loads(tc["function"]["arguments"])
                assert _method(env, tc["function"]["name"])(**args) == results[tc["id"]]
        assert env.get_reward() == reference["reward"] == 1.0
        assert env.termination == reference["termination"]
        assert env.messages == reference["messages"]


def test_wrong_answer_and_bad_calls(example_cls):
    env = example_cls()
    env.reset(seed=3)
    assert env.get_stock(warehouse_id=7).startswith("Error: invalid arguments for get_stock")
    assert "unexpected argument 'wid'" in env.get_stock(wid="WH-01")
    assert "Error: no warehouse 'WH-99'" in env.get_stock(warehouse_id="WH-99")
    assert env.reward is None and not env.done
    assert env.submit_total(total=-1).startswith("Error:")
    assert env.submit_total(total=0) == "Total submitted."
    assert env.done and env.get_reward() == 0.0
    assert env.get_stock(warehouse_id="WH-01").startswith("Error: this episode has ended")
    assert env.get_reward() == 0.0


def test_send_message_to_user(example_cls):
    env = example_cls()
    env.reset(seed=1)
    # A tool call smuggled into a message is refused without stepping the env.
    assert "Call the tool directly" in env.send_message_to_user(message='{"name": "list_warehouses", "arguments": {}}')
    assert not env.done and len(env.messages) == 2
    # The example's scripted user has nothing to add: a message ends the episode (agent_stop), reward 0.
    reply = env.send_message_to_user(message="I do not know.")
    assert env.done and env.termination == "agent_stop" and env.get_reward() == 0.0
    assert "ended" in reply
    assert env.messages[-1] == {"role": "assistant", "content": "I do not know."}


def test_unfinished_episode_scores_zero_and_is_closed(example_cls):
    env = example_cls()
    env.reset(seed=2)
    env.list_warehouses()
    assert env.termination is None
    assert env.get_reward() == 0.0 and env.termination == adapter.UNFINISHED
    assert env.list_warehouses().startswith("Error: this episode has ended")
    assert env.trajectory["reward"] == 0.0 and env.trajectory["steps"] == 1
    # A new rollout starts clean on the same (pooled) instance.
    env.reset(seed=2)
    assert env.termination is None and env.reward is None and len(env.messages) == 2


def test_max_episode_steps_truncates(example_cls):
    env = example_cls()
    env.reset(seed=4)
    steps = trace_envs.get_entry(EXAMPLE).max_episode_steps
    for _ in range(steps):
        env.get_stock(warehouse_id="WH-01")
    assert env.done and env.termination == adapter.MAX_STEPS
    assert env.get_stock(warehouse_id="WH-01").startswith("Error: this episode has ended (termination: max_steps")
    assert env.submit_total(total=1).startswith("Error: this episode has ended")
    assert env.get_reward() == 0.0


def test_rows_need_a_seed_and_the_right_environment(example_cls):
    env = example_cls()
    with pytest.raises(ValueError, match="integer 'seed'"):
        env.reset(prompt=[])
    with pytest.raises(ValueError, match="environment_factories"):
        env.reset(seed=0, environment="trace/some_other-v0")
    with pytest.raises(RuntimeError, match="before reset"):
        example_cls().list_warehouses()


def test_multi_environment_factories():
    factories = adapter.environment_factories([EXAMPLE])
    assert list(factories) == [EXAMPLE]
    ds = adapter.make_dataset([EXAMPLE], seeds=2)
    row = {k: v for k, v in ds[0].items() if k != "environment"}  # TRL strips the routing column
    assert factories[ds[0]["environment"]]().reset(**row).startswith("Hi!")


# ----------------------------------------------------------------------------- GRPO through TRL


#: Candidate task seeds of the GRPO test; the two with the shortest warm-up episodes are used.
CANDIDATE_SEEDS = range(16)
#: Longest warm-up sequence: the nano preset's context (the whole episode must fit, see ``_warm_model``).
WARMUP_MAX_LENGTH = 8192
#: Warm-up optimiser steps at most; it stops once the model's first choice is every token of the episode
#: and the loss is below ``WARMUP_LOSS``.
WARMUP_STEPS = 150
WARMUP_LOSS = 0.02
WARMUP_LR = 1e-2
#: GRPO rollouts per step: one group of ``num_generations=2`` on one task.
ROLLOUTS_PER_STEP = 2
#: Completion tokens GRPO allows beyond the warm-up episode's.
COMPLETION_MARGIN = 64


@pytest.fixture(scope="session")
def trace_cache(tmp_path_factory):
    """Built and warmed models go to TRACE_CACHE when set (reused across runs), else to a temp dir."""
    if os.environ.get("TRACE_CACHE"):
        yield Path(os.environ["TRACE_CACHE"])
        return
    path = tmp_path_factory.mktemp("trace-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACE_CACHE", str(path))
        yield path


def _grpo_env_kwargs(env_id: str) -> dict:
    """Small episodes for a CPU test: the compact policy (τ² envs) and the easiest difficulty, where the
    env has those switches (it gets the registry's defaults otherwise)."""
    from trace_train.tiny.metadata import env_accepts, prompt_env_kwargs

    return {**prompt_env_kwargs(env_id), **({"difficulty": 1} if env_accepts(env_id, "difficulty") else {})}


def _assistant_turns(messages: list[dict]) -> list[dict]:
    return [m for m in messages if m["role"] == "assistant"]


def _shortest_scoring_episode(env_id: str, seed: int, env_kwargs: dict) -> dict:
    """The oracle's episode on ``seed`` without the turns its reward does not need.

    Greedy: leave out one assistant turn at a time and keep the cut when replaying the other turns in the
    env ends the episode the same way with at least the oracle's reward (e.g. a refusal that states the
    policy's reason needs no lookup turns when its ids are known). A short episode is one a nano model
    learns in a few dozen steps; the test needs an episode the env scores, not the oracle's manners.
    """
    import gymnasium as gym

    env = gym.make(env_id, **env_kwargs)
    try:
        record = rollout(env, OracleAgent(), seed=seed)
        assert record["success"], f"the oracle of {env_id} failed on seed {seed}"
        actions, i = _assistant_turns(record["messages"]), 0
        while i < len(actions):
            trial = actions[:i] + actions[i + 1:]
            if trial:
                replay = rollout(env, ScriptedAgent(trial), seed=seed, max_steps=len(trial))
                if replay["termination"] == record["termination"] and replay["reward"] >= record["reward"]:
                    record, actions = replay, _assistant_turns(replay["messages"])
                    continue
            i += 1
        return record
    finally:
        env.close()


def _episode_tokens(tokenizer, record: dict, factory: type) -> tuple[list[int], list[int], int]:
    """(ids, labels, completion tokens) of an episode rendered as a TRL rollout through the adapter takes it
    (its tools in TRL's order, messages to the user as ``send_message_to_user`` calls), whole: no turn left out."""
    from trace_train.tiny.sft_data import sft_rows

    trl_record = {**record, "messages": adapter.to_trl_messages(record["messages"], record["termination"]),
                  "tools": adapter.trl_tool_schemas(factory)}
    rows, turns, dropped = sft_rows(tokenizer, [trl_record], max_length=WARMUP_MAX_LENGTH)
    assert rows and not dropped, (f"the episode ({turns} turns kept, {dropped} dropped) does not fit in "
                                  f"{WARMUP_MAX_LENGTH} tokens: the warm-up would never show how an episode ends")
    ids, labels = rows[0]
    return ids, labels, len(ids) - next(i for i, label in enumerate(labels) if label != -100)


def _warm_model(env_id: str, factory: type, env_kwargs: dict) -> tuple[Path, list[int], int]:
    """A nano Qwen3 (random init, TRL's Qwen3 template) given a short SFT warm-up on one whole episode, so
    that its GRPO rollouts make real tool calls and some of them finish the task.

    The episode is :func:`_shortest_scoring_episode` on the candidate seed where it has the fewest tokens.
    The prompt (policy and tool schemas, most of the sequence) is run without gradient each step and the
    episode's turns attend to its cache: the same context as at generation, at a third of the cost.
    Returns the model folder, the task seeds for GRPO (that one, then the next shortest: a task the model
    never saw) and the episode's completion length in tokens (tool results included, as TRL counts them).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.tiny.build import build_model

    base = build_model("nano", env_ids=[env_id], corpus_seeds=4)
    tokenizer = AutoTokenizer.from_pretrained(base.path)
    episodes = sorted((len(ids), seed, ids, labels, completion) for seed in CANDIDATE_SEEDS
                      for ids, labels, completion in [_episode_tokens(
                          tokenizer, _shortest_scoring_episode(env_id, seed, env_kwargs), factory)])
    (_, seed, ids, labels, completion), (_, other, *_) = episodes[:2]
    kwargs_tag = "-".join(f"{k}={v}" for k, v in sorted(env_kwargs.items()))
    out = Path(os.environ["TRACE_CACHE"]) / f"warm-trl-{env_id.replace('/', '_')}-{base.path.name}-{seed}-{kwargs_tag}"
    if not (out / "warmup.json").exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32)
        model.train()
        optim = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR, betas=(0.9, 0.95), weight_decay=0.0)
        split = len(ids) - completion - 1  # the prompt, less its last token (whose logit is the first target)
        prompt_t, rest_t = torch.tensor([ids[:split]]), torch.tensor([ids[split:]])
        labels_t = torch.tensor([labels[split:]])
        for step in range(WARMUP_STEPS):
            for group in optim.param_groups:
                group["lr"] = WARMUP_LR * min(1.0, (step + 1) / 3)
            with torch.no_grad():
                cache = model(input_ids=prompt_t, use_cache=True).cache
            output = model(input_ids=rest_t, cache=cache, labels=labels_t)
            loss, targets = output.loss, labels_t[0, 1:]
            learnt = bool((output.logits[0, :-1].argmax(-1) == targets)[targets != -100].all())
            if learnt and loss.item() < WARMUP_LOSS:  # every token of the episode is the model's first choice
                break
            optim.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
        assert learnt and loss.item() < WARMUP_LOSS, f"the warm-up did not converge (loss {loss.item():.3f})"
        model.eval()
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "warmup.json").write_text(json.dumps({"seed": seed, "tokens": len(ids), "completion": completion,
                                                     "steps": step, "loss": loss.item()}))
        tmp.rename(out)
    return out, [seed, other], completion


def _replay_reward(env_id: str, seed: int, messages: list[dict], env_kwargs: dict) -> tuple[float, str]:
    """The reward a fresh env gives the assistant turns of a transcript (an independent re-computation)."""
    actions = [m for m in messages if m["role"] == "assistant"]
    if not actions:
        return 0.0, "max_steps"
    record = rollout(env_id, ScriptedAgent(actions), seed=seed, env_kwargs=env_kwargs, max_steps=len(actions))
    return record["reward"], record["termination"]


@pytest.mark.parametrize("env_id", _grpo_env_ids())
def test_grpo_two_steps_rewards_come_from_the_env(env_id, trace_cache, tmp_path):
    import statistics

    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(1)
    env_kwargs = _grpo_env_kwargs(env_id)  # compact prompts, difficulty 1: episodes a tiny context holds
    base = adapter.environment_factory(env_id, **env_kwargs)
    model_path, seeds, completion_tokens = _warm_model(env_id, base, env_kwargs)
    calls: list[dict] = []

    class Recorded(base):  # the env class TRL sees, recording what get_reward returned
        def get_reward(self):
            value = super().get_reward()
            calls.append({"reward": value, "seed": self._seed, "messages": self.messages,
                          "termination": self.termination})
            return value

    Recorded.__name__ = Recorded.__qualname__ = base.__name__
    dataset = adapter.make_dataset(env_id, seeds=seeds, env_kwargs=env_kwargs)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    steps = trace_envs.get_entry(env_id).max_episode_steps or 20
    args = GRPOConfig(
        # One task per step, a group of 2 rollouts: the warm-up's task and the unseen one, in TRL's order.
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=ROLLOUTS_PER_STEP, num_generations=2,
        # Room for the warm-up's whole episode (TRL counts tool results in the completion) with a margin, and a
        # tool-loop iteration per env step: that episode ends in the env, not in TRL. The unseen task gets the
        # same budget (a rollout that runs past it is unfinished and scores 0).
        max_completion_length=completion_tokens + COMPLETION_MARGIN, max_tool_calling_iterations=steps,
        temperature=0.2, learning_rate=1e-4, beta=0.0, logging_steps=1,
        report_to="none", save_strategy="no", use_cpu=True, bf16=False,
        gradient_checkpointing=False, seed=0, disable_tqdm=True,
    )
    trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=args, train_dataset=dataset,
                          environment_factory=Recorded,
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
    trainer.train()

    print(f"{env_id} {env_kwargs}: warm-up {(model_path / 'warmup.json').read_text()}; "
          "rollouts (seed, reward, termination):", [(c["seed"], c["reward"], c["termination"]) for c in calls])
    assert len(calls) == 2 * ROLLOUTS_PER_STEP, "get_reward must be called once per rollout"
    assert {c["seed"] for c in calls} == set(seeds)
    # What TRL logged per step is the mean (and spread) of the rewards the adapter returned in that step.
    key = f"rewards/{base.__name__}"
    logged = [entry for entry in trainer.state.log_history if f"{key}/mean" in entry]
    assert len(logged) == 2
    for step, entry in enumerate(logged):
        batch = [c["reward"] for c in calls[ROLLOUTS_PER_STEP * step: ROLLOUTS_PER_STEP * (step + 1)]]
        assert entry[f"{key}/mean"] == pytest.approx(statistics.fmean(batch), abs=1e-6)
        assert entry[f"{key}/std"] == pytest.approx(statistics.stdev(batch), abs=1e-6)
    # Every reward is the env's: replaying the model's turns in a fresh env gives the same reward.
    for c in calls:
        reward, termination = _replay_reward(env_id, c["seed"], c["messages"], env_kwargs)
        assert c["reward"] == pytest.approx(reward), c["termination"]
        if c["termination"] not in (adapter.UNFINISHED, adapter.MAX_STEPS):
            assert termination == c["termination"]
    # The model acted through the adapter (each assistant turn of an env transcript is a tool call TRL made),
    # and the env scored some rollout above 0: a reward that only an episode the env ended and evaluated can
    # carry (an unfinished one scores 0), so real signal reached TRL.
    assert any(_assistant_turns(c["messages"]) for c in calls)
    scored = [c for c in calls if c["reward"] > 0]
    assert scored, [(c["seed"], c["termination"]) for c in calls]
    assert all(c["termination"] not in (adapter.UNFINISHED, adapter.MAX_STEPS) for c in scored)


# ----------------------------------------------------------------------------- another trainer


def test_other_trainer_learns_through_the_gymnasium_api():
    """examples/other_trainer.py (REINFORCE over tool calls, gym.make/reset/step only) improves on the example."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import other_trainer
    finally:
        sys.path.remove(str(ROOT / "examples"))
    curve = other_trainer.train(EXAMPLE, iterations=30, episodes=32, lr=5.0, seed=0, seeds=1000)
    first, last = sum(curve[:5]) / 5, sum(curve[-5:]) / 5
    assert first < 0.2 and last > 0.7, curve
