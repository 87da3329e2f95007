"""The routers of the field beside the MoE (trace_train.compose.routers), on a hand-made pair of adapters whose
correct route is known: two LoRAs on the nano model, each fitted on one request family (flight-status questions,
cancellations) to give that family's answer. Each adapter alone answers its own family; the base answers neither."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trace_train.compose import ComposeError, compose  # noqa: E402

ENV = "trace/precondition_verification-v0"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SYSTEM = "You are an airline agent."
FAMILIES = {"status": ("Is flight {} on time today?", "The flight is on time."),
            "cancel": ("Please cancel reservation {} now.", "Your reservation is cancelled.")}
TRAIN_CODES = ["HAT001", "HAT017", "HAT142", "QX9P2L", "ZZ41KD", "MM0307"]
HELD_OUT = ["HAT555", "KQ77PL"]


def conversation(family: str, code: str, answered: bool = True) -> list[dict]:
    question, answer = FAMILIES[family]
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question.format(code)}]
    return messages + ([{"role": "assistant", "content": answer}] if answered else [])


def fit_adapter(base: str, tok, family: str, out) -> str:
    """A rank-8 LoRA fitted (60 full-batch AdamW steps) to answer ``family``'s requests with its answer."""
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=8, lora_alpha=16,
                                                                                   target_modules=TARGETS))
    batch = []
    for code in TRAIN_CODES:
        prompt = tok.apply_chat_template(conversation(family, code, False), add_generation_prompt=True,
                                         tokenize=False)
        ids = tok(prompt + FAMILIES[family][1] + "<|im_end|>", add_special_tokens=False).input_ids
        batch.append((ids, len(tok(prompt, add_special_tokens=False).input_ids)))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(60):
        loss = 0.0
        for ids, n in batch:
            x = torch.tensor([ids])
            labels = x.clone()
            labels[0, :n] = -100
            loss = loss + model(input_ids=x, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    torch.set_num_threads(1)
    from trace_train.tiny.build import build_model

    root = tmp_path_factory.mktemp("routers")
    base = str(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-model", env_ids=[ENV],
                           corpus_seeds=4).path)
    tok = AutoTokenizer.from_pretrained(base)
    adapters = {f: fit_adapter(base, tok, f, root / f) for f in FAMILIES}
    # The router's data: successful episodes of each family, labelled with its adapter through env ids.
    records = [{"env_id": f"fam/{f}-v0", "messages": conversation(f, code), "success": True, "reward": 1.0}
               for f in FAMILIES for code in TRAIN_CODES[:4]]
    data = root / "episodes.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    envs = {f: [f"fam/{f}-v0"] for f in FAMILIES}
    return {"base": base, "tok": tok, "adapters": adapters, "data": data, "envs": envs, "root": root}


def reply(agent, family: str, code: str) -> str:
    return agent.act_batch([""], [{"messages": conversation(family, code, False)}])[0]


@pytest.fixture(scope="module")
def alone(pair):
    """What each adapter alone, and the base, reply to each held-out request."""
    from trace_train.agents import HFAgent

    out = {}
    for name in [None, *pair["adapters"]]:
        agent = HFAgent(pair["base"], adapter=pair["adapters"].get(name), max_new_tokens=10, decode="hf")
        out[name or "base"] = {(f, c): reply(agent, f, c) for f in FAMILIES for c in HELD_OUT}
    return out


def test_the_pair_has_a_known_route(alone):
    """Each adapter alone answers its own family; the other adapter and the base do not."""
    for family, (_, answer) in FAMILIES.items():
        other = next(f for f in FAMILIES if f != family)
        for code in HELD_OUT:
            assert answer in alone[family][(family, code)]
            assert answer not in alone[other][(family, code)]
            assert answer not in alone["base"][(family, code)]


def test_per_task_routing_by_nearest_trajectories_takes_the_right_adapter_for_the_whole_task(pair, alone):
    """``composers=["per_task"]`` writes the authors' routing: the base embeds the task's first request, the most
    similar successful trajectories vote, and the chosen adapter alone runs every turn of the task. Each held-out
    request goes to its family's adapter, and the reply is exactly that adapter's; the choice stays for a later
    turn whatever it asks."""
    from trace_train.agents import HFAgent

    res = compose(pair["base"], pair["adapters"], pair["data"], pair["root"] / "nearest", baselines=[],
                  adapter_envs=pair["envs"], composers=["per_task", "top2", "top4"], task_neighbours=3,
                  train={"epochs": 1}, progress=False)
    methods = json.loads(res.methods_json.read_text())
    # The MoE's own gates at top-2 (its ablation row); top-4 needs more than K + 1 = 3 slots and is skipped.
    assert "top4" not in methods and json.loads((res.baselines["top2"] / "compose.json").read_text())["top_k"] == 2
    assert HFAgent(methods["top2"]["model"], max_new_tokens=2).model.top_k == 2
    folder = methods["per_task"]["model"]
    spec = json.loads((res.baselines["per_task"] / "compose.json").read_text())
    assert spec["routing"] == "per_task" and spec["task_routing"] == {"choice": "nearest", "neighbours": 3}
    agent = HFAgent(folder, max_new_tokens=10)
    router = agent.model.episode_router()
    slot_of = {name: i + 1 for i, name in enumerate(pair["adapters"])}
    for family in FAMILIES:
        for code in HELD_OUT:
            assert reply(agent, family, code) == alone[family][(family, code)]
            assert router.last_slots == [slot_of[family]]
    # A later turn asking for the other family's action keeps the task's adapter (one choice per task).
    turns = conversation("status", HELD_OUT[0]) + [{"role": "user", "content": "Please cancel reservation QQ1 now."}]
    agent.act_batch([""], [{"messages": turns}])
    assert router.last_slots == [slot_of["status"]]


def test_per_task_routing_zero_shot_is_the_bases_answer_and_one_adapter(pair, alone):
    """``task_choice="zero_shot"``: the base answers a multiple-choice question over the adapters' descriptions
    (the request quoted in it); the task gets the option whose letter the base scores highest, and runs that
    adapter alone. (The nano base is not a reader: which option it prefers is not the point here, that the choice
    is its answer and applies to the whole task is.)"""
    from trace_train.agents import HFAgent

    descriptions = {"status": "reads flight status records", "cancel": "cancels reservations by policy"}
    res = compose(pair["base"], pair["adapters"], pair["data"], pair["root"] / "zero", baselines=[],
                  adapter_envs=pair["envs"], composers=["per_task"], task_choice="zero_shot",
                  task_descriptions=descriptions, train={"epochs": 1}, progress=False)
    agent = HFAgent(json.loads(res.methods_json.read_text())["per_task"]["model"], max_new_tokens=10)
    router = agent.model.episode_router()
    tok = pair["tok"]
    names = list(pair["adapters"])
    for family in FAMILIES:
        prompt = tok.apply_chat_template(conversation(family, HELD_OUT[0], False), add_generation_prompt=True,
                                         tokenize=False)
        ids = tok(prompt, add_special_tokens=False).input_ids
        question = tok.decode(router.question(ids))
        assert FAMILIES[family][0].format(HELD_OUT[0]) in question
        assert all(f"{letter}. {descriptions[n]}" in question for letter, n in zip("AB", names))
        scores = router.option_scores(ids)
        chosen = max(range(2), key=lambda i: scores[i]) + 1
        assert reply(agent, family, HELD_OUT[0]) == alone[names[chosen - 1]][(family, HELD_OUT[0])]
        assert router.last_slots == [chosen]
    with pytest.raises(ComposeError, match="task_descriptions name adapters"):
        compose(pair["base"], pair["adapters"], pair["data"], pair["root"] / "bad", baselines=[],
                composers=["per_task"], task_choice="zero_shot", task_descriptions={"refund": "x"}, progress=False)


def test_arrow_routes_each_token_to_the_adapter_whose_prototype_it_meets(pair, alone):
    """``composers=["arrow"]`` writes PEFT's Arrow over the adapters, loaded by HFAgent like any composed folder.
    With the status adapter beside an adapter whose update is zero (its prototype is the zero vector, so no token
    scores above the status adapter's at top-1), Arrow routes every token to the status adapter: its replies are
    that adapter's, on both families."""
    from trace_train.agents import HFAgent

    zero = pair["root"] / "zero_update"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(pair["base"]),
                           LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS))  # PEFT's init: B = 0
    model.save_pretrained(str(zero))
    res = compose(pair["base"], {"status": pair["adapters"]["status"], "nothing": str(zero)}, None,
                  pair["root"] / "arrow", baselines=[], composers=["arrow"], arrow_top_k=1,
                  drop_zero_updates=False, progress=False)
    folder = json.loads(res.methods_json.read_text())["arrow"]["model"]
    spec = json.loads((res.baselines["arrow"] / "arrow.json").read_text())
    assert spec["top_k"] == 1 and [a["name"] for a in spec["adapters"]] == ["status", "nothing"]
    agent = HFAgent(folder, max_new_tokens=10)
    assert isinstance(agent.model, PeftModel) and agent.model.active_adapter == "arrow_router"
    for family in FAMILIES:
        for code in HELD_OUT:
            assert reply(agent, family, code) == alone["status"][(family, code)]


def test_arrow_folder_refuses_changed_adapters_and_bad_settings(pair, tmp_path):
    import shutil

    from trace_train.compose import load_arrow, write_arrow

    copy = tmp_path / "cancel"
    shutil.copytree(pair["adapters"]["cancel"], copy)
    folder = write_arrow(pair["base"], {"status": pair["adapters"]["status"], "cancel": str(copy)},
                         tmp_path / "arrow", top_k=5)
    assert json.loads((folder / "arrow.json").read_text())["top_k"] == 2  # at most the number of adapters
    weights = copy / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(ComposeError, match="changed since composing"):
        load_arrow(folder)
    with pytest.raises(ComposeError, match="router_temperature"):
        write_arrow(pair["base"], pair["adapters"], tmp_path / "t", router_temperature=0)
    with pytest.raises(ComposeError, match="composers must be"):
        compose(pair["base"], pair["adapters"], None, tmp_path / "c", composers=["router"], progress=False)
    with pytest.raises(ComposeError, match="nearest trajectories needs trajectories"):
        compose(pair["base"], pair["adapters"], None, tmp_path / "c", composers=["per_task"], progress=False)


def test_the_cli_builds_the_composers(pair, tmp_path):
    from trace_train.cli import main

    adapters = [f"{n}={p}" for n, p in pair["adapters"].items()]
    envs = [f"--adapter-env={n}=fam/{n}-v0" for n in pair["adapters"]]
    out = tmp_path / "cli"
    assert main(["compose", "--base", pair["base"], "--adapters", *adapters, "--data", str(pair["data"]), "--out",
                 str(out), "--epochs", "1", "--composers", "per_task", "arrow", "--arrow-top-k", "1",
                 "--task-neighbours", "3", "--no-progress", *envs, "--baselines"]) == 0
    methods = json.loads((out / "methods.json").read_text())
    assert {"composed", "per_task", "arrow"} <= set(methods)
    assert json.loads((out / "baselines" / "arrow" / "arrow.json").read_text())["top_k"] == 1
    assert main(["compose", "--base", pair["base"], "--adapters", *adapters, "--out", str(tmp_path / "bad"),
                 "--composers", "per_task", "--no-progress"]) == 2  # nearest needs --data: one line, nothing lost
