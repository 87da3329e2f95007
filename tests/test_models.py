"""The tiny offline model: build, reload offline, TRL's template and tool-call parser, SFT warm-up."""

from __future__ import annotations

import json
import os

import gymnasium as gym
import pytest

from trace_envs.core.conversation import hermes_tool_call

EXAMPLE = "examples/warehouse_stock-v0"
SCENARIO_ENV = "tests/scenario_warehouse-v0"


def nano_model(tmp_path_factory) -> str:
    """The nano model, built once per test session (later calls are cache hits)."""
    from trace_train.tiny.build import build_model

    out = tmp_path_factory.getbasetemp() / "nano-model"
    return str(build_model("nano", out=out, env_ids=[EXAMPLE], corpus_seeds=4).path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return nano_model(tmp_path_factory)


def _register_scenario_env() -> None:
    """The worked example with scenario labels ('kitchen' products vs the rest), registered for tests."""
    import trace_envs  # noqa: F401 - puts examples/ on sys.path
    import custom_env  # the worked example (examples/ is on sys.path through TRACE_REGISTRY)

    class ScenarioWarehouseEnv(custom_env.WarehouseStockEnv):
        def task_info(self) -> dict:
            return {"scenario": "kitchen" if self.product in ("blue kettle", "travel mug") else "other"}

    if SCENARIO_ENV not in gym.registry:
        gym.register(SCENARIO_ENV, entry_point=ScenarioWarehouseEnv, max_episode_steps=20)


def test_build_reloads_offline_with_trl_template(model_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.chat_template_utils import add_response_schema, get_training_chat_template, parse_response

    from trace_train.tiny.build import build_model
    from trace_train.tiny.tokenizer import qwen3_chat_template

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert tok.chat_template == qwen3_chat_template()  # byte-identical, so TRL recognises it
    assert get_training_chat_template(tok) is not None  # TRL knows it and has its training variant
    for marker in ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"):
        ids = tok(marker, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, marker
        assert tok.convert_ids_to_tokens(ids[0]) == marker
    assert tok.eos_token == "<|im_end|>"
    assert len(tok) <= model.config.vocab_size

    # Render a tool call with the chat template, then parse it back with TRL's parser.
    tools = [{"type": "function", "function": {"name": "get_stock", "description": "Stock of a warehouse.",
                                               "parameters": {"type": "object", "properties": {
                                                   "warehouse_id": {"type": "string"}},
                                                   "required": ["warehouse_id"]}}}]
    messages = [{"role": "user", "content": "How many blue kettles?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": "get_stock", "arguments": {"warehouse_id": "WH-02"}}}]}]
    prompt = tok.apply_chat_template(messages[:1], tools=tools, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert full.startswith(prompt) and "<tools>" in prompt
    completion = full[len(prompt):].rstrip("\n")
    tok = add_response_schema(tok)
    parsed = parse_response(tok, tok(completion, add_special_tokens=False)["input_ids"],
                            prefix=tok(prompt, add_special_tokens=False)["input_ids"])
    assert parsed["tool_calls"] == [{"type": "function",
                                     "function": {"name": "get_stock", "arguments": {"warehouse_id": "WH-02"}}}]
    # The env's own Hermes text is the same shape the template renders.
    assert hermes_tool_call("get_stock", {"warehouse_id": "WH-02"}) in completion

    # The model runs and the second build is a cache hit at the same place.
    import torch

    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape[-1] == model.config.vocab_size
    again = build_model("nano", out=model_dir, env_ids=[EXAMPLE], corpus_seeds=4)
    assert again.cached and str(again.path) == model_dir


def test_cache_key_follows_content(tmp_path):
    from trace_train.tiny.build import build_model

    a = build_model("nano", env_ids=[EXAMPLE], corpus_seeds=2, out=tmp_path / "a")
    os.environ["TRACE_CACHE"], old = str(tmp_path / "cache"), os.environ.get("TRACE_CACHE")
    try:
        b = build_model("nano", env_ids=[EXAMPLE], corpus_seeds=2)
        c = build_model("nano", env_ids=[EXAMPLE], corpus_seeds=3)  # other corpus, other key
    finally:
        if old is None:
            os.environ.pop("TRACE_CACHE")
        else:
            os.environ["TRACE_CACHE"] = old
    assert not a.cached and not b.cached and not c.cached
    assert b.path.parent == tmp_path / "cache" / "models" and b.path.name.startswith("nano-")
    assert b.path != c.path
    meta = json.loads((b.path / "trace_model.json").read_text())
    assert meta["preset"] == "nano" and meta["corpus_envs"] == [EXAMPLE]
    with pytest.raises(ValueError, match="unknown preset"):
        build_model("huge", out=tmp_path / "x")


def test_oracle_trajectories_leave_out_scenarios():
    from trace_train.tiny.sft_data import oracle_trajectories

    _register_scenario_env()
    records, counts = oracle_trajectories(SCENARIO_ENV, range(40), exclude_scenarios=["kitchen"])
    assert counts["kitchen"]["excluded"] > 0 and counts["kitchen"]["kept"] == 0
    assert counts["other"]["kept"] == len(records) > 0
    assert {r["scenario"] for r in records} == {"other"}
    assert all(r["success"] for r in records)


def test_oracle_trajectories_keep_a_share_of_a_family():
    from trace_train.tiny.bootstrap import BootstrapConfig
    from trace_train.tiny.sft_data import oracle_trajectories

    _register_scenario_env()
    full, full_counts = oracle_trajectories(SCENARIO_ENV, range(200))
    part, counts = oracle_trajectories(SCENARIO_ENV, range(200), scenario_shares={"kitchen": 0.25})
    kitchen = full_counts["kitchen"]["kept"]
    # under-represented, not absent: about a quarter of the family's episodes stay, the other family is whole
    assert 0.1 * kitchen < counts["kitchen"]["kept"] < 0.4 * kitchen
    assert counts["kitchen"]["kept"] + counts["kitchen"]["excluded"] == kitchen
    assert counts["other"]["kept"] == full_counts["other"]["kept"]
    again, _ = oracle_trajectories(SCENARIO_ENV, range(200), scenario_shares={"kitchen": 0.25})
    assert [r["seed"] for r in again] == [r["seed"] for r in part]  # chosen by seed: the same every time
    with pytest.raises(ValueError, match="scenario_shares.*exclude_scenarios"):
        BootstrapConfig(target=SCENARIO_ENV, scenario_shares={"kitchen": 0.0})


def _replay_file(path, records) -> str:
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(path)


def test_replay_keeps_the_agents_own_episodes_of_the_families_left_out(tmp_path):
    """``replay_episodes``: the recorded episodes whose family the training episodes never draw (a bundle that
    holds a drawn family is left out too), repeated in a seeded order up to the count asked for; an unlabelled
    episode only when the training episodes carry no label either."""
    from trace_train.tiny.sft_data import oracle_trajectories, replay_episodes

    _register_scenario_env()
    records, _ = oracle_trajectories(SCENARIO_ENV, range(30))
    other = [r for r in records if r["scenario"] == "other"][:3]
    kitchen = [r for r in records if r["scenario"] == "kitchen"][:2]
    assert len(other) == 3 and len(kitchen) == 2
    bundle = {**kitchen[0], "scenario": "bundle:kitchen+other"}
    unlabelled = {**other[0], "scenario": None}
    silent = {**other[0], "messages": [m for m in other[0]["messages"] if m["role"] != "assistant"]}
    # a capability env's label: its request kinds name the target family after their last colon
    prefixed = {**other[1], "scenario": "cap:question:x", "task": {"families": ["question:kitchen"]}}
    path = _replay_file(tmp_path / "base.jsonl", [*other, *kitchen, bundle, unlabelled, silent, prefixed])
    with open(path, "a") as f:
        f.write('{"scenario": "other", "messages": [{"role": "assist\n')  # a line cut off by a killed rollout

    rows, summary = replay_episodes(path, drawn={"kitchen"}, count=7, seed=0)
    assert len(rows) == 7 and {r["scenario"] for r in rows} == {"other"}
    texts = [json.dumps(r["messages"]) for r in rows]
    assert sorted(set(texts)) == sorted(json.dumps(r["messages"]) for r in other)  # every kept episode appears
    assert max(texts.count(t) for t in texts) == 3 and min(texts.count(t) for t in texts) == 2  # in whole rounds
    assert summary["episodes_in_file"] == 10 and summary["episodes_kept"] == 3 and summary["rows"] == 7
    assert summary["unreadable_lines"] == 1
    assert summary["families"] == {"other": 3} and summary["left_out_families"] == ["kitchen"]
    assert [r["messages"] for r in replay_episodes(path, ["kitchen"], 7, seed=0)[0]] == [r["messages"] for r in rows]
    assert all(set(r) == {"messages", "tools", "scenario"} for r in rows)

    everything, summary = replay_episodes(path, drawn=set(), count=6)  # training episodes without labels
    assert summary["episodes_kept"] == 8 and len(everything) == 6  # all but the one without an assistant turn
    assert replay_episodes(path, drawn={"other", "kitchen"}, count=5)[0] == []
    assert replay_episodes(path, drawn={"other"}, count=3)[1]["families"] == {"kitchen": 3}  # `prefixed` too


def test_target_families_read_the_request_kinds_before_the_label():
    from trace_train.tiny.sft_data import target_families

    assert target_families({"families": ["sdr_question:flight_status"]}, "sdr:sdr_question:flight_status") == {
        "flight_status"}
    assert target_families({"families": ["cancel", "info"]}, "bundle:cancel+info") == {"cancel", "info"}
    assert target_families(None, "bundle:cancel+info") == {"bundle:cancel+info", "cancel", "info"}
    assert target_families({"families": []}, "kitchen") == {"kitchen"}
    assert target_families(None, None) == set()


def test_bootstrap_replays_the_left_out_families(model_dir, tmp_path):
    """``BootstrapConfig.replay``: the replayed rows join the oracle episodes at the share asked for; they are
    counted apart from the env episodes the fit spent, and the settings are checked."""
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.metadata import model_metadata
    from trace_train.tiny.sft_data import oracle_trajectories

    _register_scenario_env()
    kitchen, _ = oracle_trajectories(SCENARIO_ENV, range(200, 230), exclude_scenarios=["other"])
    path = _replay_file(tmp_path / "base.jsonl", kitchen[:3])
    cfg = BootstrapConfig(target=SCENARIO_ENV, base=model_dir, exclude_scenarios=("kitchen",), steps=2,
                          batch_size=2, train_seeds=12, lr=5e-3, warmup_steps=1, out=str(tmp_path / "boot"),
                          replay=path, replay_share=0.4)
    result = bootstrap_model(cfg, progress=False)
    replay = model_metadata(result.path)["bootstrap"]["replay"]
    oracle = model_metadata(result.path)["bootstrap"]["scenario_counts"]["other"]["kept"]
    assert result.examples == oracle and result.replayed == replay["rows"] == round(0.4 / 0.6 * oracle) > 0
    assert replay["episodes_kept"] == 3 and replay["families"] == {"kitchen": 3}
    assert replay["left_out_families"] == ["other"]
    with pytest.raises(ValueError, match="replay_share > 0 needs replay"):
        BootstrapConfig(target=SCENARIO_ENV, replay_share=0.2)
    for bad in (1.0, -0.1, True):
        with pytest.raises(ValueError, match="replay_share must be"):
            BootstrapConfig(target=SCENARIO_ENV, replay=path, replay_share=bad)
    with pytest.raises(ValueError, match="no trajectories file"):
        BootstrapConfig(target=SCENARIO_ENV, replay=str(tmp_path / "missing.jsonl"), replay_share=0.2)


def test_sft_segments_match_inference_prompts(model_dir):
    from transformers import AutoTokenizer

    from trace_envs import OracleAgent, rollout
    from trace_train.tiny.sft_data import render_prompt, sft_rows, sft_segments

    tok = AutoTokenizer.from_pretrained(model_dir)
    record = rollout(EXAMPLE, OracleAgent(), seed=3)
    segments = sft_segments(tok, record)
    targets = [text for text, is_target in segments if is_target]
    assistant = [m for m in record["messages"] if m["role"] == "assistant"]
    assert len(targets) == len(assistant)
    assert all(t.startswith("<tool_call>") and t.endswith("</tool_call><|im_end|>") for t in targets)
    # Every target's context is exactly the prompt the agent sees at that turn.
    context = ""
    turn = 0
    for text, is_target in segments:
        if is_target:
            i = [k for k, m in enumerate(record["messages"]) if m["role"] == "assistant"][turn]
            assert context == render_prompt(tok, record["messages"][:i], record["tools"])
            turn += 1
        context += text
    rows, turns, dropped = sft_rows(tok, [record], max_length=4096)
    assert turns == len(assistant) and dropped == 0
    ids, labels = rows[0]
    assert sum(label != -100 for label in labels) == sum(len(tok(t, add_special_tokens=False)["input_ids"])
                                                        for t in targets)
    short, turns_short, dropped_short = sft_rows(tok, [record], max_length=len(ids) - 5)
    assert dropped_short >= 1 and turns_short == turns - dropped_short


def test_shared_prefix_loss_is_exact(model_dir):
    """Encoding the shared prompt prefix once per batch gives the same loss and gradients as the plain forward."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_envs import OracleAgent, rollout
    from trace_train.tiny.sft_data import sft_rows, shared_prefix_length
    from trace_train.tiny.sft_forward import sft_loss

    tok = AutoTokenizer.from_pretrained(model_dir)
    records = [rollout(EXAMPLE, OracleAgent(), seed=s) for s in (1, 2, 5)]
    rows, _, _ = sft_rows(tok, records, max_length=4096)
    n = shared_prefix_length(rows)
    first_target = min(labels.index(next(x for x in labels if x != -100)) for _, labels in rows)
    assert 0 < n < first_target  # the system prompt and tool schemas are shared, no target inside
    assert all(ids[:n] == rows[0][0][:n] for ids, _ in rows)
    assert shared_prefix_length(rows[:1]) == next(i for i, x in enumerate(rows[0][1]) if x != -100) - 1
    assert shared_prefix_length([([1, 2, 3], [-100, 5, 6]), ([1, 2, 4], [-100, -100, 7])]) == 0

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    grads = []
    losses = []
    for prefix in (0, n):
        model.zero_grad()
        loss = sft_loss(model, rows, tok.pad_token_id, prefix)
        loss.backward()
        losses.append(float(loss))
        grads.append([p.grad.clone() for p in model.parameters()])
    # The reference: transformers' own loss, one unpadded sequence at a time, token-weighted.
    total, count = 0.0, 0
    for ids, labels in rows:
        k = sum(label != -100 for label in labels[1:])
        total += float(model(input_ids=torch.tensor([ids]), labels=torch.tensor([labels])).loss) * k
        count += k
    assert losses[0] == pytest.approx(total / count, rel=1e-4)
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-3)


def test_last_layer_at_targets_only_is_exact(model_dir):
    """The SFT fast path runs the last decoder layer only where a target is predicted (its keys and values
    everywhere): same loss and gradients as the full forward, with and without the shared prefix; with
    grouped-query attention (the nano preset has 4 heads over 2 key/value heads)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_envs import OracleAgent, rollout
    from trace_train.tiny.sft_data import sft_rows, shared_prefix_length
    from trace_train.tiny.sft_forward import _targets_only_supported, sft_loss

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows, _, _ = sft_rows(tok, [rollout(EXAMPLE, OracleAgent(), seed=s) for s in (3, 4, 7)], max_length=4096)
    n = shared_prefix_length(rows)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    assert _targets_only_supported(model)
    assert model.config.num_attention_heads > model.config.num_key_value_heads
    for prefix in (0, n):
        results = []
        for targets_only in (False, True):
            model.zero_grad()
            loss = sft_loss(model, rows, tok.pad_token_id, prefix, targets_only=targets_only)
            loss.backward()
            results.append((float(loss), [p.grad.clone() for p in model.parameters()]))
        (full, full_grads), (fast, fast_grads) = results
        assert fast == pytest.approx(full, rel=1e-5)
        for a, b in zip(full_grads, fast_grads):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-3)


def test_turn_head_weights_mark_the_opening_of_every_target_run():
    """The first ``head_tokens`` positions of each run of targets (an assistant turn) get the weight, the rest of
    the run 1, non-targets 0; runs are found per row."""
    import torch

    from trace_train.tiny.sft_forward import turn_head_weights

    keep = torch.tensor([[0, 1, 1, 1, 0, 0, 1, 1, 0], [1, 1, 0, 1, 1, 1, 1, 1, 1]]).bool()
    assert turn_head_weights(keep, 5.0, 2).tolist() == [[0, 5, 5, 1, 0, 0, 5, 5, 0], [5, 5, 0, 5, 5, 1, 1, 1, 1]]
    assert turn_head_weights(keep, 1.0, 2).tolist() == keep.float().tolist()


def test_turn_head_weighted_loss_is_the_weighted_mean_on_both_forwards(model_dir):
    """With ``head_weight`` the SFT loss is the mean of per-token losses weighted by turn_head_weights, the same
    on the fast (targets-only, shared prefix) and the plain forward; it is not the plain mean."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_envs import OracleAgent, rollout
    from trace_train.tiny.sft_data import sft_rows, shared_prefix_length
    from trace_train.tiny.sft_forward import sft_loss, turn_head_weights

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows, _, _ = sft_rows(tok, [rollout(EXAMPLE, OracleAgent(), seed=s) for s in (3, 4)], max_length=4096)
    n = shared_prefix_length(rows)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    total = weight = 0.0
    with torch.no_grad():
        for ids, labels in rows:  # the reference: per-token losses of one unpadded sequence at a time
            logits = model(input_ids=torch.tensor([ids])).logits[0, :-1]
            nxt = torch.tensor(labels[1:])
            keep = nxt != -100
            losses = torch.nn.functional.cross_entropy(logits[keep], nxt[keep], reduction="none")
            w = turn_head_weights(keep.unsqueeze(0), 10.0, 8)[0][keep]
            total += float((losses * w).sum())
            weight += float(w.sum())
        plain = float(sft_loss(model, rows, tok.pad_token_id, n))
        weighted = [float(sft_loss(model, rows, tok.pad_token_id, prefix, targets_only=fast, head_weight=10.0))
                    for prefix, fast in ((0, False), (n, True))]
    assert weighted[0] == pytest.approx(total / weight, rel=1e-4)
    assert weighted[1] == pytest.approx(weighted[0], rel=1e-5)
    assert abs(weighted[0] - plain) > 1e-4


def test_pretraining_loss_is_the_conversation_alone_on_every_token(model_dir):
    """The curriculum's pre-training steps: without the shared prompt, every token a target. The loss equals
    the plain LM loss of the conversations cut after that prompt, and differs from the SFT loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_envs import OracleAgent, rollout
    from trace_train.tiny.bootstrap import BootstrapConfig
    from trace_train.tiny.sft_data import sft_rows, shared_prefix_length
    from trace_train.tiny.sft_forward import sft_loss

    tok = AutoTokenizer.from_pretrained(model_dir)
    rows, _, _ = sft_rows(tok, [rollout(EXAMPLE, OracleAgent(), seed=s) for s in (1, 2)], max_length=4096)
    n = shared_prefix_length(rows)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        pretraining = float(sft_loss(model, rows, tok.pad_token_id, n, drop_prefix=True, every_token=True))
        no_prompt_sft = float(sft_loss(model, rows, tok.pad_token_id, n, drop_prefix=True))
        cut_sft = float(sft_loss(model, [(ids[n:], labels[n:]) for ids, labels in rows], tok.pad_token_id, 0))
        total, count = 0.0, 0
        for ids, _ in rows:
            x = torch.tensor([ids[n:]])
            total += float(model(input_ids=x, labels=x).loss) * (len(ids) - n - 1)
            count += len(ids) - n - 1
        whole = float(sft_loss(model, rows, tok.pad_token_id, n))
    assert pretraining == pytest.approx(total / count, rel=1e-4)
    assert no_prompt_sft == pytest.approx(cut_sft, rel=1e-5)
    assert abs(no_prompt_sft - whole) > 1e-6  # the prompt is really gone (it shifts even a random model)
    with pytest.raises(ValueError, match="pretrain_frac"):
        BootstrapConfig(target=EXAMPLE, pretrain_frac=1.0)


def test_ids_tokenize_the_same_in_prose_and_in_tool_calls(model_dir):
    """A tiny model copies ids token by token, so an id must be the same tokens in a user message, a tool
    call's JSON arguments and a tool result (no leading space or quote glued to its first piece)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    for value in ("stacy_watts_2428", "HAT016", "2024-05-15", "WH-02", "blue kettle"):
        pieces = tok.tokenize(value)
        for context in (f"My user id is {value}.", json.dumps({"user_id": value}), f"'{value}'", f"\n{value}\n"):
            tokens = tok.tokenize(context)
            assert any(tokens[i:i + len(pieces)] == pieces for i in range(len(tokens))), (value, context, tokens)


def test_bootstrap_trains_and_saves(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.metadata import model_env_kwargs, model_metadata

    _register_scenario_env()
    seen = []
    cfg = BootstrapConfig(target=SCENARIO_ENV, base=model_dir, exclude_scenarios=("kitchen",), steps=24,
                          batch_size=2, train_seeds=24, lr=5e-3, warmup_steps=4, out=str(tmp_path / "boot"))
    result = bootstrap_model(cfg, progress=False, checkpoint_every=12,
                             on_checkpoint=lambda step, model, tok, secs: seen.append(step))
    assert seen == [12, 24]
    assert len(result.losses) == 24
    first, last = sum(result.losses[:4]) / 4, sum(result.losses[-4:]) / 4
    assert last < 0.7 * first, result.losses
    assert (result.path / "loss_curve.png").stat().st_size > 1000
    assert json.loads((result.path / "loss.json").read_text())["loss"] == result.losses
    meta = model_metadata(result.path)
    assert meta["bootstrap"]["exclude_scenarios"] == ["kitchen"]
    assert meta["bootstrap"]["scenario_counts"]["kitchen"]["kept"] == 0
    assert model_env_kwargs(result.path, EXAMPLE) == {}  # the example env has no prompt switch
    AutoModelForCausalLM.from_pretrained(result.path)
    with pytest.raises(ValueError, match="steps"):
        BootstrapConfig(target=EXAMPLE, steps=0)
    with pytest.raises(ValueError, match="freeze_circuit"):
        BootstrapConfig(target=EXAMPLE, freeze_circuit="some")


def test_bootstrap_stops_on_its_time_budget(model_dir, tmp_path):
    """With ``max_seconds`` the run ends when the training time is spent; checkpoints follow that time."""
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.metadata import model_metadata

    _register_scenario_env()
    calls = []
    cfg = BootstrapConfig(target=SCENARIO_ENV, base=model_dir, steps=100_000, max_seconds=3.0, batch_size=2,
                          train_seeds=12, warmup_steps=2, pretrain_frac=0.5, out=str(tmp_path / "boot"))
    result = bootstrap_model(cfg, progress=False, checkpoint_every_s=1.0,
                             on_checkpoint=lambda step, model, tok, secs: calls.append((step, secs)))
    steps = len(result.losses)
    assert 2 < steps < 100_000
    meta = model_metadata(result.path)["bootstrap"]
    assert meta["steps"] == steps and 1.5 < meta["train_seconds"] <= 3.0  # never over the budget
    assert 0 < meta["pretrain_steps"] < steps  # the curriculum follows the spent share of the budget
    assert calls[-1][0] == steps  # the final call, after the last step
    mid = [secs for _, secs in calls[:-1]]
    assert len(mid) >= 2 and all(b > a for a, b in zip(mid, mid[1:])) and mid[0] >= 1.0
    assert all(secs < 3.0 for secs in mid)


def test_teacher_forced_turns_counts_exact_turns(model_dir, tmp_path):
    """A model overfitted on one episode reproduces each of its turns from the true history (rate 1.0); the
    random base model reproduces none. The worked example's oracle only calls tools (no message turns)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.sft_data import oracle_trajectories, teacher_forced_turns

    records, _ = oracle_trajectories(EXAMPLE, [7])
    n_calls = sum(m["role"] == "assistant" for m in records[0]["messages"])
    assert n_calls >= 2 and all(m.get("tool_calls") for m in records[0]["messages"] if m["role"] == "assistant")
    tok = AutoTokenizer.from_pretrained(model_dir)
    base = teacher_forced_turns(AutoModelForCausalLM.from_pretrained(model_dir).eval(), tok, records,
                                max_new_tokens=48)
    assert base == {"tool_call": 0.0, "message": None, "n_tool_call": n_calls, "n_message": 0}
    result = bootstrap_model(BootstrapConfig(target=EXAMPLE, base=model_dir, train_seeds=1, seed_offset=7,
                                             steps=80, batch_size=1, lr=1e-2, warmup_steps=3,
                                             out=str(tmp_path / "overfit")), progress=False)
    model = AutoModelForCausalLM.from_pretrained(result.path).eval()
    assert teacher_forced_turns(model, tok, records, max_new_tokens=96) == {
        "tool_call": 1.0, "message": None, "n_tool_call": n_calls, "n_message": 0}


def test_cli_model_build(tmp_path, capsys):
    from trace_train.cli import main

    status = main(["model", "build", "--preset", "nano", "--out", str(tmp_path / "m"), "--envs", EXAMPLE,
                   "--corpus-seeds", "2"])
    assert status == 0
    out = capsys.readouterr().out
    assert "built nano model" in out and str(tmp_path / "m") in out
    assert (tmp_path / "m" / "config.json").exists() and (tmp_path / "m" / "tokenizer.json").exists()
    assert main(["model", "build", "--preset", "giant", "--out", str(tmp_path / "g")]) == 2
    assert main(["model", "bootstrap", "--target", "nope/missing-v0"]) == 2
    assert main(["model", "bootstrap", "--target", EXAMPLE, "--base", str(tmp_path / "m"), "--steps", "1",
                 "--env-kwarg", "no_such_kwarg=1", "--no-progress"]) == 2
    assert "--env-kwarg" in capsys.readouterr().err
    # --minutes: a time budget instead of a step count.
    assert main(["model", "bootstrap", "--target", EXAMPLE, "--base", str(tmp_path / "m"), "--minutes", "0.02",
                 "--train-seeds", "2", "--out", str(tmp_path / "timed"), "--no-progress"]) == 0
    meta = json.loads((tmp_path / "timed" / "trace_model.json").read_text())["bootstrap"]
    assert meta["max_seconds"] == pytest.approx(1.2)
    assert meta["steps"] >= 1 and meta["train_seconds"] <= 1.2
    for bad in (["--minutes", "0"], ["--steps", "0"]):  # a clear error, not a silent default
        assert main(["model", "bootstrap", "--target", EXAMPLE, "--base", str(tmp_path / "m"), *bad,
                     "--no-progress"]) == 2
        assert ("max_seconds" if bad[0] == "--minutes" else "steps") in capsys.readouterr().err


def test_env_accepts_follows_a_constructor_that_hands_its_kwargs_on():
    """Structured data reasoning's ``__init__(*args, **kwargs)`` hands them to CapabilityEnv, which has no
    ``scenarios``: the target's ``scenarios`` must not be passed to it (a base warmed up on the target would
    otherwise crash every rollout in a generated structured-data-reasoning env)."""
    from trace_train.tiny.metadata import env_accepts

    for env_id in ("trace/structured_data_reasoning-v0", "trace/tool_calling_precision-v0"):
        assert not env_accepts(env_id, "scenarios"), env_id
        assert env_accepts(env_id, "difficulty") and env_accepts(env_id, "prompt"), env_id
    assert env_accepts("trace/tau_airline-v0", "scenarios") and not env_accepts("trace/tau_airline-v0", "difficulty")
    assert not env_accepts("no/such-v0", "prompt")
