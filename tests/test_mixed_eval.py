"""Conversations that need two capabilities (issue 57): per-request scoring of a bundle, the evaluation mix's seed
choice (``evaluate.mixed``), which expert wrote each assistant turn, and the report's L4 split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

TARGET = "trace/tau_airline-v0"
KWARGS = {"scenarios": ["flight_status", "info", "cancel"],
          "size": {"bundle_prob": 0.0, "ask_details_prob": 1.0, "cancel_grounds": ["business"], "refusal_prob": 0.5,
                   "read_back": True}, "max_episode_steps": 16}
SETTINGS = {"families": ["flight_status", "cancel"], "share": 0.34, "bundle_prob": 0.7, "max_episode_steps": None}


def test_each_request_of_a_bundle_is_scored_on_its_own():
    """The oracle handles every request of a bundle; an agent that only talks handles none that needs a write or a
    fact, and a refusal it cannot get wrong still counts as handled."""
    from trace_envs import OracleAgent
    from trace_envs.rollout import rollout

    from trace_train.mixed_eval import mixed_kwargs

    kwargs = mixed_kwargs(KWARGS, SETTINGS)
    assert kwargs["size"]["bundle_prob"] == 0.7 and kwargs["max_episode_steps"] == 48
    assert KWARGS["size"]["bundle_prob"] == 0.0  # the run's own kwargs untouched
    seen = 0
    for seed in range(30):
        record = rollout(TARGET, OracleAgent(), seed=seed, env_kwargs=kwargs)
        families = record["task"]["families"]
        outcomes = record["reward_breakdown"].get("requests")
        if len(families) == 1:
            assert outcomes is None  # one request: the conversation's reward is the request's
            continue
        seen += 1
        assert [o["kind"] for o in outcomes] == families and all(o["ok"] for o in outcomes)
        assert record["success"]
        silent = rollout(TARGET, lambda obs, info: "Thank you, goodbye.", seed=seed, env_kwargs=kwargs)
        for o in silent["reward_breakdown"]["requests"]:
            if o["decision"] == "act" or o["kind"] == "flight_status":
                assert not o["ok"], o
    assert seen >= 10


def test_the_mix_takes_the_first_mixed_and_single_conversations():
    import gymnasium as gym

    from trace_train.mixed_eval import choose_seeds, kind_of, mixed_kwargs

    kwargs = mixed_kwargs(KWARGS, SETTINGS)
    seeds, kinds = choose_seeds(TARGET, kwargs, 12, 0, SETTINGS)
    assert len(seeds) == 12 and sum(k == "mixed" for k in kinds.values()) == 5  # ceil(0.34 · 12)
    env = gym.make(TARGET, **kwargs)
    skipped = 0
    for seed in range(max(seeds) + 1):
        env.reset(seed=seed)
        kind = kind_of(env.unwrapped.task_info()["families"], SETTINGS["families"])
        if seed in kinds:
            assert kind == kinds[seed]
            if kind == "mixed":
                assert {"flight_status", "cancel"} <= set(env.unwrapped.task_info()["families"])
        else:  # skipped: a bundle without both families, or a kind whose count was already met
            skipped += 1
    assert skipped > 0
    assert choose_seeds(TARGET, kwargs, 12, 0, SETTINGS) == (seeds, kinds)  # a pure function of the settings


def test_mixed_settings_are_checked():
    from trace_train.pipeline.config import ConfigError, config_from_dict

    for mixed, match in (({"families": ["cancel"]}, "at least two request families"),
                         ({"families": ["a", "b"], "share": 1.5}, "share must be a number in"),
                         ({"families": ["a", "b"], "mix": 1}, "unknown key")):
        with pytest.raises(ConfigError, match=match):
            config_from_dict({"evaluate": {"mixed": mixed}})
    cfg = config_from_dict({"evaluate": {"mixed": {"families": ["flight_status", "cancel"]}}})
    assert cfg.evaluate.mixed == {"families": ["flight_status", "cancel"]}
    with pytest.raises(ConfigError, match="compose.options.composers"):
        config_from_dict({"compose": {"options": {"composers": ["moe"]}}})


def test_turn_routing_shows_where_the_router_switches():
    """A composed model whose gates send every token before the second request's message to adapter 1 and every
    token from it on to adapter 2: the first assistant turn is written by adapter 1, the second by adapter 2, and
    the summary counts one switch at the request boundary."""
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.compose import ComposedModel
    from trace_train.compose.data import encode
    from trace_train.compose.turns import switch_summary, turn_routing
    from trace_train.tiny.build import build_model

    torch.set_num_threads(1)
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="turns-"))
    base = str(build_model("nano", out=root / "nano", env_ids=["trace/precondition_verification-v0"],
                           corpus_seeds=4).path)
    adapters = {}
    for i, name in enumerate(("status", "cancel")):
        torch.manual_seed(i)
        peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                    LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        peft_model.save_pretrained(str(root / name))
        adapters[name] = str(root / name)
    model = ComposedModel.build(base, adapters)
    tok = AutoTokenizer.from_pretrained(base)
    requests = ["Is flight HAT001 on time?", "Please cancel reservation ABC123."]
    record = {"env_id": TARGET, "task": {"families": ["flight_status", "cancel"]}, "messages": [
        {"role": "system", "content": "You are an airline agent."},
        {"role": "user", "content": "Hi! " + requests[0]},
        {"role": "assistant", "content": "It is on time."},
        {"role": "user", "content": "Thanks. " + requests[1]},
        {"role": "assistant", "content": "It is cancelled."}]}
    enc = encode(tok, record, None)
    boundary = len(encode(tok, {**record, "messages": record["messages"][:3]}, None).ids)

    def route(module, args, out):
        logits = torch.full_like(out, -9.0)
        logits[..., :boundary, 1] = 9.0
        logits[..., boundary:, 2] = 9.0
        return logits

    hooks = [g.register_forward_hook(route) for g in model.gates]
    try:
        rows = turn_routing(model, tok, record, requests)
    finally:
        for h in hooks:
            h.remove()
    assert len(enc.ids) > boundary
    assert [(r["turn"], r["request"], r["family"]) for r in rows] == [(0, 0, "flight_status"), (1, 1, "cancel")]
    assert rows[0]["status"] == 1.0 and rows[1]["cancel"] == 1.0
    summary = switch_summary([rows], model.slot_names())
    assert summary["pairs"] == 1 and summary["switched"] == 1
    assert summary["shares_by_family"]["cancel"]["cancel"] == 1.0
    held = switch_summary([[{**rows[0]}, {**rows[1], "status": 1.0, "cancel": 0.0}]], model.slot_names())
    assert held["switched"] == 0  # one adapter for both requests: no switch


def _records(agent: str, outcome) -> list[dict]:
    """Six single and six mixed conversations; ``outcome(kind, seed) -> (success, per-request oks)``."""
    out = []
    for seed in range(12):
        kind = "mixed" if seed % 2 else "single"
        ok, oks = outcome(kind, seed)
        families = ["flight_status", "cancel"] if kind == "mixed" else ["cancel"]
        breakdown = {"requests": [{"kind": f, "decision": "act", "ok": o} for f, o in zip(families, oks)]} \
            if kind == "mixed" else {}
        out.append({"env_id": TARGET, "seed": seed, "sample": 0, "agent": agent, "success": ok, "reward": float(ok),
                    "scenario": "+".join(families), "task": {"families": families}, "termination": "agent_stop",
                    "reward_breakdown": breakdown})
    return out


def test_the_report_splits_l4_into_single_and_mixed_conversations(tmp_path):
    """By construction the MoE solves every conversation; per-episode routing solves the single ones and handles
    only the first request of a mixed one; the base solves nothing. The L4 split shows it per kind, with the MoE's
    Δ over each method, and the per-turn routing table of the mixed conversations."""
    from trace_train.evaluate import evaluate
    from trace_train.mixed_eval import split_scores
    from trace_train.report.links import compute_links
    from trace_train.report.run_report import write_report

    run = tmp_path / "run"
    outcomes = {"base": lambda k, s: (False, [False, False]),
                "per_episode": lambda k, s: (k == "single", [True, False]),
                "trace_moe": lambda k, s: (True, [True, True])}
    results = {"methods": {}, "n_seeds": 12, "samples": 1, "temperature": 0.0, "ks": [1],
               "mix": {**SETTINGS, "mixed": 6, "single": 6}}
    for key, outcome in outcomes.items():
        rel = Path("eval") / key / "trajectories.jsonl"
        (run / rel).parent.mkdir(parents=True)
        records = _records(key, outcome)
        (run / rel).write_text("".join(json.dumps(r) + "\n" for r in records))
        results["methods"][key] = {"label": key, "available": True, "trajectories": str(rel),
                                   "overall": evaluate(run / rel, ks=(1,), n_boot=0)["overall"],
                                   "mix": split_scores(records, SETTINGS["families"])}
    assert results["methods"]["per_episode"]["mix"]["mixed"]["request_success"] == 0.5
    assert results["methods"]["per_episode"]["mix"]["single"]["success"] == 1.0
    results["methods"]["trace_moe"]["turn_routing"] = {
        "csv": "turn_routing.csv", "pairs": 6, "switched": 5, "tokens_by_family": {"cancel": 300, "flight_status": 200},
        "shares_by_family": {"cancel": {"base": 0.1, "status": 0.1, "cancel": 0.8},
                             "flight_status": {"base": 0.0, "status": 0.9, "cancel": 0.1}}}
    (run / "eval" / "results.json").write_text(json.dumps(results))
    l4 = compute_links(run, n_boot=200)["L4"]
    rows = {r["method"]: r for r in l4["split"]}
    assert [r["method"] for r in l4["split"]] == ["trace_moe", "per_episode", "base"]
    assert rows["per_episode"]["moe_minus_mixed"]["value"] == pytest.approx(1.0)
    assert rows["per_episode"]["moe_minus_single"]["value"] == pytest.approx(0.0)
    assert "per-episode routing +1.000" in l4["sentence"]
    text = write_report(run).markdown.read_text()
    assert "L4 on single and mixed conversations (6 single, 6 mixed" in text
    assert "| per_episode | 1.000 | 1.000 | 0.000 | 0.500 | +0.000" in text
    assert "| flight_status | 200 | 0.00 | 0.90 | 0.10 |" in text and "5 of 6 such pairs" in text


def test_the_evaluate_stage_plays_the_mix_and_scores_it_per_kind(tmp_path):
    """``evaluate.mixed`` in a run: the held-out seeds are the mix's (a third mixed at least), every conversation is
    played with bundles on, and each method's row scores single and mixed conversations apart."""
    from trace_train.pipeline import Context
    from trace_train.pipeline.config import config_from_dict
    from trace_train.pipeline.stages.evaluate import run_evaluate
    from trace_train.rollouts import read_trajectories

    base = {"kind": "scripted", "agent": "tau:noisy",
            "agent_kwargs": {"p": 0.5, "capabilities": ["multi_step_completion"]}}
    cfg = config_from_dict({"out": str(tmp_path / "run"), "base": base,
                            "rollout": {"targets": [TARGET], "seeds": "1000:1002", "env_kwargs": KWARGS},
                            "train": {"model": "/nonexistent"},
                            "evaluate": {"seeds": "0:9", "methods": ["base"], "env_seeds": 0,
                                         "mixed": {"families": ["flight_status", "cancel"]}}})
    state = {"stages": {"base": {"status": "done", "summary": {}}, "train": {"status": "pending"},
                        "compose": {"status": "pending"}}}
    run_evaluate(Context(cfg, tmp_path / "run", state, progress=False))
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())
    mix = results["mix"]
    assert mix["mixed"] == 4 and mix["single"] == 5 and len(mix["seeds"]) == 9  # ceil(0.34 · 9) = 4
    played = read_trajectories(tmp_path / "run" / "eval" / "base" / "trajectories.jsonl")
    assert sorted(r["seed"] for r in played) == mix["seeds"]
    for r in played:
        families = r["task"]["families"]
        assert (mix["kinds"][str(r["seed"])] == "mixed") == ({"flight_status", "cancel"} <= set(families))
    row = results["methods"]["base"]["mix"]
    assert row["mixed"]["conversations"] == 4 and row["single"]["conversations"] == 5
    assert row["mixed"]["requests"] >= 8 and 0.0 <= row["mixed"]["request_success"] <= 1.0


@pytest.fixture(scope="module")
def request_gated(tmp_path_factory):
    """A composed model over two random LoRAs whose gates read the request being served (gates spread over the
    slots, context centres fitted), and a conversation with a tool result between two requests."""
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.compose import ComposedModel
    from trace_train.tiny.build import build_model

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("request-gates")
    base = str(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-model",
                           env_ids=["trace/precondition_verification-v0"], corpus_seeds=4).path)
    adapters = {}
    for i, name in enumerate(("status", "cancel")):
        torch.manual_seed(i)
        peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(base),
                                    LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
        peft_model.save_pretrained(str(root / name))
        adapters[name] = str(root / name)
    model = ComposedModel.build(base, adapters, gate_input="request")
    tok = AutoTokenizer.from_pretrained(base)
    messages = [{"role": "system", "content": "You are an airline agent."},
                {"role": "user", "content": "Is flight HAT001 on time?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "get_flight", "arguments": {"id": "H"}}}]},
                {"role": "tool", "content": '{"status": "landed"}'},
                {"role": "assistant", "content": "It has landed."},
                {"role": "user", "content": "Please cancel reservation ABC123."}]
    ids = tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
              add_special_tokens=False).input_ids
    model.fit_context_centers([ids])
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for g in model.gates:
            g.weight.copy_(torch.randn(g.weight.shape, generator=gen) * 2.0 / g.weight.shape[1] ** 0.5)
            g.bias.zero_()
    return model, tok, ids


def test_request_gates_restart_their_mean_at_each_request_and_not_at_a_tool_result(request_gated):
    """What a ``request`` gate's context is at each token: the mean of the block's normalised inputs since the last
    user message that is not a tool result (from the sequence start before the first one)."""
    import torch

    from trace_train.compose.model import _rms

    model, tok, ids = request_gated
    marker, tool = model.spec.request_marker
    starts = [i for i in range(len(ids)) if ids[i:i + len(marker)] == marker
              and ids[i + len(marker):i + len(marker) + len(tool)] != tool]
    tools = [i for i in range(len(ids)) if ids[i:i + len(marker) + len(tool)] == marker + tool]
    assert len(starts) == 2 and len(tools) == 1  # the two requests; the tool result does not restart
    model.capture_context = model.capture_inputs = True
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]), use_cache=False)
        hidden = model.context_centers.shape[1]
        for router in model.routers:
            x, got = router.raw_input[0, :, :hidden], router.raw_context[0]
            for t in range(len(ids)):
                r = max([s for s in starts if s <= t], default=0)
                want = _rms(x[r:t + 1].mean(0))
                assert torch.allclose(got[t], want, atol=1e-4), (router.index, t)
    finally:
        model.capture_context = model.capture_inputs = False
        for router in model.routers:
            router.raw_context = router.raw_input = None


def test_request_gates_decode_under_a_kv_cache_as_without_one(request_gated):
    """``generate`` carries each row's running mean since its request between decoding steps: its greedy tokens are
    those of re-reading the whole sequence at every step. The fast decode loop, which finds the requests in the
    prompt itself (here two, and a tool result that must not restart the mean), decodes the same tokens."""
    import torch

    from trace_train.tiny.fast_decode import FastDecoder, supported

    model, tok, ids = request_gated
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, min_new_tokens=8, do_sample=False,
                             pad_token_id=0, attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):]
        seq = list(ids)
        for _ in range(8):
            seq.append(int(model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].argmax()))
        model.keep_choices = True
        model(input_ids=torch.tensor([seq]), use_cache=False)
        used = set(torch.cat([r.choice.flatten() for r in model.routers]).tolist())
        model.keep_choices = False
    assert out.tolist() == seq[len(ids):]
    assert {1, 2} <= used  # the gates do route to both adapters
    assert model.stateful_routing and supported(model) == (True, "")
    assert FastDecoder(model).generate([ids], 8, eos_ids=[])[0].tokens == out.tolist()
