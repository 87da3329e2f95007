"""The composed model (trace_train.compose): equivalence with the base and with PEFT, gates only train,
sparse routing per token, save/load with hashes, generation, and use as an HFAgent."""

from __future__ import annotations

import json
import shutil

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from peft import LoraConfig, PeftModel, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from trace_train.compose import ComposedModel, ComposeError  # noqa: E402

ENV = "trace/precondition_verification-v0"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
K = 3


def make_adapter(base: str, out, seed: int, r: int, targets=TARGETS, **extra) -> str:
    """A PEFT LoRA adapter with random (non-zero) A and B, as a trained one would have."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    peft_model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets,
                                                  init_lora_weights=False, **extra))
    peft_model.save_pretrained(str(out))
    return str(out)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    torch.set_num_threads(1)
    from trace_train.tiny.build import build_model

    root = tmp_path_factory.mktemp("compose")
    base = str(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-model", env_ids=[ENV],
                           corpus_seeds=4).path)
    # Different ranks per adapter: experts need not share a rank.
    adapters = {f"cap{k}": make_adapter(base, root / f"cap{k}", seed=k, r=4 + 2 * k) for k in range(K)}
    return base, adapters, root


@pytest.fixture(scope="module")
def composed(setup):
    base, adapters, _ = setup
    return ComposedModel.build(base, adapters)


def tokens(base, batch=3, seq=19, seed=0):
    vocab = AutoModelForCausalLM.from_pretrained(base).config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab - 64, (batch, seq), generator=gen)


def peft_logits(base, adapter, ids):
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    with torch.no_grad():
        return model(ids).logits


def scramble_gates(model, seed=1, scale=4.0):
    """Gates that spread tokens over every slot (a trained router would; fresh ones pick the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for g in model.gates:
            g.weight.copy_(torch.randn(g.weight.shape, generator=gen) * scale / g.weight.shape[1] ** 0.5)
            g.bias.zero_()


def test_fresh_and_slot0_equal_the_base(setup, composed):
    base, _, _ = setup
    ids = tokens(base)
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits
        fresh = composed(ids).logits  # base bias 5: every token on the base slot
        with composed.force_routing(0):
            forced = composed(ids).logits
    assert torch.allclose(fresh, ref, atol=1e-5, rtol=0)
    assert torch.allclose(forced, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("k", range(1, K + 1))
def test_slot_k_equals_peft_base_plus_adapter_k(setup, composed, k):
    base, adapters, _ = setup
    ids = tokens(base)
    expected = peft_logits(base, list(adapters.values())[k - 1], ids)
    with torch.no_grad(), composed.force_routing(k):
        got = composed(ids).logits
    plain = AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits
    assert (expected - plain).abs().max() > 1e-2  # the adapter does change the output
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)


def test_mixed_routing_per_sequence_matches_separate_forwards(setup, composed):
    """One batch whose rows go to different experts gives each row its own expert path's logits."""
    base, adapters, _ = setup
    ids = tokens(base, batch=4)
    slots = torch.tensor([2, 0, 3, 1])
    with torch.no_grad(), composed.force_routing(slots):
        mixed = composed(ids).logits
    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    names = list(adapters.values())
    for row, slot in enumerate(slots.tolist()):
        with torch.no_grad():
            ref = plain(ids[row:row + 1]).logits if slot == 0 else peft_logits(base, names[slot - 1], ids[row:row + 1])
        assert torch.allclose(mixed[row:row + 1], ref, atol=1e-5, rtol=0), f"row {row} (slot {slot})"


def test_mixed_routing_per_token_matches_each_tokens_expert(setup, composed):
    """Tokens of one sequence routed to different experts: in the first block (whose projections' inputs
    do not depend on routing) each token's q/k/v output is exactly that of its own expert's forward."""
    base, _, _ = setup
    ids = tokens(base, batch=2, seq=23)
    gen = torch.Generator().manual_seed(5)
    per_token = torch.randint(0, K + 1, ids.shape, generator=gen)
    attn = composed.model.model.layers[0].self_attn
    captured = {}

    def capture(tag):
        hooks = [getattr(attn, n).register_forward_hook(
            lambda m, a, out, n=n: captured.__setitem__((tag, n), out.detach())) for n in ("q_proj", "k_proj", "v_proj")]
        return hooks

    for tag, slots in [("mixed", per_token)] + [(s, s) for s in range(K + 1)]:
        hooks = capture(tag)
        with torch.no_grad(), composed.force_routing(slots):
            composed(ids)
        for h in hooks:
            h.remove()
    for n in ("q_proj", "k_proj", "v_proj"):
        expected = torch.stack([captured[(s, n)] for s in range(K + 1)])  # (K+1, B, T, out)
        pick = expected.gather(0, per_token[None, :, :, None].expand(1, *expected.shape[1:])).squeeze(0)
        assert torch.allclose(captured[("mixed", n)], pick, atol=1e-5, rtol=0), n


@pytest.mark.parametrize("top_k", [1, 2, 4])
@pytest.mark.parametrize("batch,seq,small_step", [(3, 31, 16), (2, 5, 16), (2, 5, 0)],
                         ids=["grouped", "stacked-small-step", "grouped-small-step"])
def test_sparse_equals_dense_under_learned_gates(setup, top_k, batch, seq, small_step):
    """Gate-driven routing over every slot: grouping tokens by expert (or, for a step of few tokens,
    stacking the experts and masking) changes nothing but the cost."""
    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters, top_k=top_k)
    model.small_step_tokens = small_step
    scramble_gates(model)
    ids = tokens(base, batch=batch, seq=seq)
    with torch.no_grad(), model.recording() as routers:
        sparse = model(ids).logits
        used = torch.cat([r.choice.flatten() for r in routers]).unique()
    model.mode = "dense"
    with torch.no_grad():
        dense = model(ids).logits
    assert len(used) == K + 1  # the scrambled gates do use every slot
    assert torch.allclose(sparse, dense, atol=1e-5, rtol=0)


def first_projection_check(setup, top_k: int, gate_weight: str):
    """Run a composed model with scrambled gates; return (its first q_proj's output, what the gating formula gives
    for it, the model, the input ids). The formula: W x + sum over the top-k slots (slot 0 adds nothing) of the
    slot's weight times the PEFT adapter's delta, the weight being p_slot (``prob``) or p_slot over the top-k p's
    sum (``one``)."""
    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters, top_k=top_k, gate_weight=gate_weight)
    scramble_gates(model, seed=7)
    q_proj = model.model.model.layers[0].self_attn.q_proj
    seen = {}
    hook = q_proj.register_forward_hook(lambda m, args, out: seen.update(x=args[0], y=out))
    ids = tokens(base, batch=2, seq=13)
    with torch.no_grad(), model.recording(logits=True) as routers:
        model(ids)
        probs = torch.softmax(routers[0].logits.float(), -1)
    hook.remove()
    x = seen["x"]
    expected = q_proj.base(x)
    with torch.no_grad():
        deltas = [None] + [
            PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), a).eval()
            .base_model.model.model.layers[0].self_attn.q_proj(x) - q_proj.base(x) for a in adapters.values()]
    weights, slots = probs.topk(top_k, dim=-1)
    if gate_weight == "one":
        weights = weights / weights.sum(-1, keepdim=True)
    for j in range(top_k):
        for slot in range(1, K + 1):
            chosen = (slots[..., j] == slot).unsqueeze(-1)
            expected = expected + torch.where(chosen, weights[..., j:j + 1] * deltas[slot], 0.0)
    assert (slots[..., 0] > 0).any() and (slots[..., 0] == 0).any()  # a mix of experts and the base
    return seen["y"], expected, model, ids


@pytest.mark.parametrize("top_k", [1, 2])
def test_gating_is_base_plus_each_chosen_experts_delta_times_its_probability(setup, top_k):
    """out = W x + sum over the top-k slots (slot 0 adds nothing) of p_slot * (PEFT adapter's delta)."""
    got, expected, _, _ = first_projection_check(setup, top_k, "prob")
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("top_k", [1, 2])
def test_gate_weight_one_adds_the_chosen_experts_whole_delta_and_still_trains_the_gates(setup, top_k, tmp_path):
    """gate_weight="one": out = W x + sum over the top-k slots of (p_slot / sum of the top-k p) * delta, so top-1 adds
    the adapter's whole update (the paper's gating adds p times it); the gradient is the probability's
    (straight-through), so the next-token loss still reaches every gate. The setting survives save and load."""
    got, expected, model, ids = first_projection_check(setup, top_k, "one")
    assert torch.allclose(got, expected, atol=1e-5, rtol=0)
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    assert all(float(g.weight.grad.abs().sum()) > 0 for g in model.gates)
    model.eval()
    out = model.save_pretrained(tmp_path / "one")
    assert json.loads((out / "compose.json").read_text())["gate_weight"] == "one"
    assert ComposedModel.from_pretrained(out).gate_weight == "one"
    assert ComposedModel.from_pretrained(out, gate_weight="prob").gate_weight == "prob"
    with pytest.raises(ComposeError, match="gate_weight must be one of prob, one"):
        ComposedModel.build(setup[0], setup[1], gate_weight="half")


def test_only_gates_get_gradients_and_their_count(setup, composed):
    base, _, _ = setup
    config = composed.config
    assert composed.gate_parameter_count() == config.num_hidden_layers * (config.hidden_size + 1) * (K + 1)
    trainable = {n for n, p in composed.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in composed.gates.named_parameters(prefix="gates")}
    scramble_gates(composed, scale=2.0)
    try:
        composed.train()
        ids = tokens(base, batch=2, seq=11)
        loss = composed(input_ids=ids, labels=ids).loss
        loss.backward()
        with_grad = {n for n, p in composed.named_parameters() if p.grad is not None}
        assert with_grad == trainable
        assert all(composed.get_parameter(n).grad.abs().sum() > 0 for n in with_grad if n.endswith("weight"))
        assert all(b.grad is None for _, b in composed.named_buffers() if b.is_floating_point())
    finally:
        composed.eval()
        composed.zero_grad(set_to_none=True)
        composed.reset_gates()


def test_save_load_round_trip_and_hash_check(setup, tmp_path):
    base, adapters, root = setup
    model = ComposedModel.build(base, adapters, top_k=2)
    scramble_gates(model, seed=3)
    out = model.save_pretrained(tmp_path / "composed")
    spec = json.loads((out / "compose.json").read_text())
    assert [a["name"] for a in spec["adapters"]] == list(adapters)
    assert all(len(a["sha256"]) == 64 for a in spec["adapters"]) and len(spec["base_sha256"]) == 64
    assert spec["top_k"] == 2
    loaded = ComposedModel.from_pretrained(out)
    ids = tokens(base)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    AutoTokenizer.from_pretrained(str(out))  # the folder carries its tokenizer
    from trace_train.tiny.metadata import model_metadata

    assert model_metadata(out) == model_metadata(base) != {}  # and the env kwargs its base was trained with

    # An adapter changed after composing is refused (the hash no longer matches).
    moved = root / "changed"
    shutil.copytree(adapters["cap1"], moved)
    spec["adapters"][1]["path"] = str(moved)
    (out / "compose.json").write_text(json.dumps(spec))
    ComposedModel.from_pretrained(out)  # same bytes elsewhere: fine
    from safetensors.torch import load_file, save_file

    weights = load_file(str(moved / "adapter_model.safetensors"))
    save_file({k: v * 1.5 for k, v in weights.items()}, str(moved / "adapter_model.safetensors"))
    with pytest.raises(ComposeError, match="changed since composing"):
        ComposedModel.from_pretrained(out)


def test_refuses_adapters_that_cannot_be_composed(setup, tmp_path):
    base, adapters, _ = setup
    other_targets = make_adapter(base, tmp_path / "attn_only", seed=9, r=4, targets=["q_proj", "v_proj"])
    with pytest.raises(ComposeError, match="same target_modules"):
        ComposedModel.build(base, [adapters["cap0"], other_targets])
    dora = make_adapter(base, tmp_path / "dora", seed=9, r=4, use_dora=True)
    with pytest.raises(ComposeError, match="DoRA"):
        ComposedModel.build(base, [adapters["cap0"], dora])
    with pytest.raises(ComposeError, match="not a PEFT adapter folder"):
        ComposedModel.build(base, [adapters["cap0"], str(tmp_path)])
    with pytest.raises(ComposeError, match="not a model folder"):
        ComposedModel.build(tmp_path, [adapters["cap0"]])
    with pytest.raises(ComposeError, match="not a composed model folder"):
        ComposedModel.from_pretrained(tmp_path)


def test_generate_follows_the_forced_expert_and_agent_loads_the_folder(setup, tmp_path):
    """HF ``generate`` (with its cache) on slot k writes what PEFT's base + adapter k writes, and
    ``HFAgent`` takes the composed folder like a model folder."""
    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters)
    tok = AutoTokenizer.from_pretrained(base)
    ids = tok("<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n", return_tensors="pt").input_ids
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapters["cap2"]).eval()
    kwargs = dict(max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=None)
    with torch.no_grad(), model.force_routing(3):
        got = model.generate(ids, **kwargs)
    expected = peft_model.generate(ids, **kwargs)
    assert torch.equal(got, expected)

    from trace_train.agents import HFAgent

    out = model.save_pretrained(tmp_path / "composed")
    agent = HFAgent(str(out), max_new_tokens=8)
    plain = HFAgent(base, max_new_tokens=8)
    info = {"messages": [{"role": "system", "content": "You are an agent."},
                         {"role": "user", "content": "Cancel reservation ABC123."}], "tools": []}
    assert isinstance(agent.model, ComposedModel)
    assert agent("Cancel reservation ABC123.", info) == plain("Cancel reservation ABC123.", info)  # fresh = base


def test_an_adapter_whose_update_is_zero_is_told_from_a_trained_one(setup, tmp_path):
    from trace_train.compose.adapters import adapter_update_is_zero

    base, adapters, _ = setup
    assert not adapter_update_is_zero(adapters["cap0"])  # random A and B: a real update
    # PEFT's default init (B = 0) saved untouched: what GRPO with only flat groups leaves behind.
    model = AutoModelForCausalLM.from_pretrained(base)
    fresh = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    fresh.save_pretrained(str(tmp_path / "fresh"))
    assert adapter_update_is_zero(tmp_path / "fresh")
    ids = tokens(base)
    with torch.no_grad():
        assert torch.equal(peft_logits(base, str(tmp_path / "fresh"), ids),
                           AutoModelForCausalLM.from_pretrained(base).eval()(ids).logits)
    # One B entry moved by one step is a real update again.
    with torch.no_grad():
        next(p for n, p in fresh.named_parameters() if "lora_B" in n).view(-1)[0] = 1e-3
    fresh.save_pretrained(str(tmp_path / "moved"))
    assert not adapter_update_is_zero(tmp_path / "moved")
    assert not adapter_update_is_zero(tmp_path)  # no adapter weights at all: not known to be zero


def _chat_ids(base) -> torch.Tensor:
    tok = AutoTokenizer.from_pretrained(base)
    text = ("<|im_start|>system\nYou are an airline agent.<|im_end|>\n<|im_start|>user\nCancel reservation ABC123."
            "<|im_end|>\n<|im_start|>assistant\nLet me look it up.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n"
            "<|im_start|>assistant\n")
    return tok(text, return_tensors="pt").input_ids


def test_segment_routing_holds_each_messages_first_choice(setup, tmp_path):
    """routing="segment": every token of a chat message takes the slot (and weight) its block's gate chose at the
    message's ``<|im_start|>``; with ``gate_weight="one"`` that is exactly base + the held adapter, token for token.
    Decoding under generate's cache continues the open message's choice, so generated tokens carry the assistant
    header's slot and the whole sequence forward again routes them the same; the setting survives save and load."""
    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters, gate_weight="one")
    scramble_gates(model, seed=5)
    ids = _chat_ids(base)
    start_id = AutoTokenizer.from_pretrained(base).convert_tokens_to_ids("<|im_start|>")
    starts = (ids[0] == start_id).nonzero().flatten().tolist()
    assert starts[0] == 0 and len(starts) == 5
    segment = torch.tensor([max(s for s in starts if s <= t) for t in range(ids.shape[1])])
    with torch.no_grad(), model.recording(choices=True) as routers:
        model(input_ids=ids)
        per_token = [r.choice[0].clone() for r in routers]
    assert any(len(set(c[segment == s].tolist())) > 1 for c in per_token for s in starts)  # the gates do vary
    model.routing = "segment"
    assert model.segment_token_id == start_id and model.stateful_routing
    with torch.no_grad(), model.recording(choices=True) as routers:
        got = model(input_ids=ids).logits
        held = [r.choice[0].clone() for r in routers]
    # The first block reads the same inputs either way: each token gets its message start's per-token choice.
    # Later blocks read the stream the held choices made; their choice too is constant over each message.
    assert torch.equal(held[0], per_token[0][segment])
    for c_held in held:
        assert torch.equal(c_held, c_held[segment])
    # gate_weight "one", top-1: the held slot's whole update, i.e. forced per-token routing to those slots (the
    # blocks' held choices differ, so force block by block is not possible; compare the first block's projection).
    blocks = model.model.model.layers
    seen = {}
    hook = blocks[0].self_attn.q_proj.register_forward_hook(lambda m, a, o: seen.setdefault("q", o.detach()))
    with torch.no_grad():
        model(input_ids=ids)
    hook.remove()
    q = blocks[0].self_attn.q_proj
    x = model.model.model.layers[0].input_layernorm(model.model.model.embed_tokens(ids))[0]
    expected = q.base(x) + torch.stack([q.expert_delta(x[t], int(held[0][t]) - 1) if held[0][t] else
                                        torch.zeros(q.base.out_features) for t in range(ids.shape[1])])
    assert torch.allclose(seen["q"][0], expected, atol=1e-5, rtol=0)

    tok = AutoTokenizer.from_pretrained(base)
    with torch.no_grad(), model.recording(choices=True) as routers:
        out = model.generate(ids, max_new_tokens=10, do_sample=False, pad_token_id=tok.pad_token_id,
                             eos_token_id=None)
    assert out.shape[1] == ids.shape[1] + 10
    with torch.no_grad(), model.recording(choices=True) as routers:
        full = model(input_ids=out).logits
        again = [r.choice[0].clone() for r in routers]
    for c_before, c_again in zip(held, again):
        assert torch.equal(c_again[:ids.shape[1]], c_before)
        assert set(c_again[starts[-1]:].tolist()) == {int(c_before[starts[-1]])}  # generated: the header's choice
    assert torch.allclose(full[:, :ids.shape[1]], got, atol=1e-5, rtol=0)
    # greedy under the cache = greedy of the uncached forward (the hold carried over the decoding steps)
    assert torch.equal(full[0, ids.shape[1] - 1:-1].argmax(-1), out[0, ids.shape[1]:])

    saved = model.save_pretrained(tmp_path / "segment")
    assert json.loads((saved / "compose.json").read_text())["routing"] == "segment"
    loaded = ComposedModel.from_pretrained(saved)
    assert loaded.routing == "segment" and loaded.segment_token_id == start_id
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=ids).logits, got)
    with pytest.raises(ComposeError, match="routing must be one of"):
        loaded.routing = "message"


def test_per_episode_routing_decides_on_the_request_not_the_system_prompt(setup):
    """The per-episode baseline averages the gates over the first user message only: the system prompt before it
    is the same in every episode. Gates made to favour slot 1 on the (long) system prompt and slot 2 on the request
    choose slot 2; the system prompt alone would have decided for slot 1."""
    from trace_train.compose import PerEpisodeRouter

    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters)
    tok = AutoTokenizer.from_pretrained(base)
    system = tok("<|im_start|>system\n" + "You are an airline agent. " * 30 + "<|im_end|>\n",
                 add_special_tokens=False).input_ids
    request = tok("<|im_start|>user\nIs flight HAT001 on time?<|im_end|>\n", add_special_tokens=False).input_ids
    ids = system + request + tok("<|im_start|>assistant\n", add_special_tokens=False).input_ids

    def favour(module, args, out):
        logits = torch.zeros_like(out)
        logits[..., 1] = 4.0
        logits[..., len(system):, 1] = 3.0  # the request's tokens: slot 2 wins
        logits[..., len(system):, 2] = 6.0
        return logits

    hooks = [g.register_forward_hook(favour) for g in model.gates]
    try:
        router = PerEpisodeRouter.for_model(model)
        assert router.request_start(ids) == len(system)
        assert router.choose(torch.tensor([ids])).tolist() == [2]
        assert PerEpisodeRouter.for_model(model).choose(torch.tensor([system])).tolist() == [1]
    finally:
        for h in hooks:
            h.remove()


def test_per_episode_routing_over_segment_trained_gates_decides_where_they_were_taught(setup):
    """Gates trained for segment routing were taught only at message starts: the per-episode choice is read at the
    ``<|im_start|>`` that opens the agent's first message, not averaged over the request."""
    from trace_train.compose import PerEpisodeRouter

    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters)
    model.routing = "segment"  # records the segment token, as a segment-routed folder does
    model.routing = "per_episode"
    tok = AutoTokenizer.from_pretrained(base)
    head = tok("<|im_start|>system\nYou are an airline agent.<|im_end|>\n<|im_start|>user\nIs HAT001 on time?"
               "<|im_end|>\n", add_special_tokens=False).input_ids
    ids = head + tok("<|im_start|>assistant\n", add_special_tokens=False).input_ids

    def favour(module, args, out):
        logits = torch.zeros_like(out)
        logits[..., 1] = 4.0  # every token but the deciding one: slot 1
        if out.shape[-2] > len(head):  # the first message's <|im_start|>: slot 3
            logits[..., len(head), :] = torch.tensor([0.0, 0.0, 0.0, 9.0])
        return logits

    hooks = [g.register_forward_hook(favour) for g in model.gates]
    try:
        router = PerEpisodeRouter.for_model(model)
        assert router.decision_prefix(ids) == ids[:len(head) + 1]
        assert router.choose(torch.tensor([ids])).tolist() == [3]
        assert model.routing == "per_episode"
        model.spec.segment_token_id = None  # gates trained per token: the request decides
        assert PerEpisodeRouter.for_model(model).choose(torch.tensor([ids])).tolist() == [1]
    finally:
        for h in hooks:
            h.remove()


def test_per_episode_routing_never_reuses_another_adapters_prefix_cache(setup):
    """Episodes share the system prompt, but per-episode routing runs it through the adapter chosen from the
    request after it: its keys/values differ per adapter. An HFAgent's prefix cache reuses a stored conversation
    only for a prompt routed to the same adapter, so every reply equals the uncached one (a run once garbled
    episodes after ~120 of them, when the cache handed one adapter's system prompt to another's episode)."""
    from trace_train.agents import HFAgent

    base, adapters, _ = setup
    model = ComposedModel.build(base, adapters)
    model.routing = "per_episode"
    tok = AutoTokenizer.from_pretrained(base)
    system = "You are an airline agent. Read the records before you answer. " * 8
    requests = {"cancel": "Please cancel reservation ABC123.", "status": "Is flight HAT001 on time?",
                "cancel2": "Please cancel reservation XYZ789."}
    info = {name: {"messages": [{"role": "system", "content": system}, {"role": "user", "content": text}]}
            for name, text in requests.items()}
    router = model.episode_router()
    slots = {"cancel": 1, "status": 2, "cancel2": 1}
    for name, slot in slots.items():  # the decisions, as trained gates would make them
        ids = tok(tok.apply_chat_template(info[name]["messages"], add_generation_prompt=True, tokenize=False),
                  add_special_tokens=False).input_ids
        router._cache[tuple(router.decision_prefix(ids))] = slot
        assert model.prefix_scope(ids) == slot

    def agent(cache: bool) -> HFAgent:
        return HFAgent(model, tokenizer=tok, max_new_tokens=12, prefix_cache=cache, decode="hf")

    fresh = {name: agent(False)("", info[name]) for name in requests}
    cached = agent(True)
    assert cached("", info["cancel"]) == fresh["cancel"] and cached.cached_prompt_tokens == 0
    assert cached("", info["status"]) == fresh["status"]
    assert cached.cached_prompt_tokens == 0  # the cancellation's system prompt went through another adapter
    assert cached("", info["cancel2"]) == fresh["cancel2"]
    assert cached.cached_prompt_tokens > 0  # same adapter: the system prompt is reused
    fast = HFAgent(model, tokenizer=tok, max_new_tokens=12)  # the fast loop: one store per adapter
    assert fast.decode == "fast" and [fast("", info[name]) for name in requests] == list(fresh.values())
    assert fast.cached_prompt_tokens > 0 and sorted(fast.decoder._stores) == [1, 2]
    # The scopes matter: a cache that lets any conversation's prefix serve another (the old behaviour) hands the
    # status episode the cancellation's system prompt, encoded through the other adapter, and its reply changes.
    unscoped = agent(True)
    unscoped._scopes = lambda ids: [None] * len(ids)
    unscoped("", info["cancel"])
    assert unscoped("", info["status"]) != fresh["status"] and unscoped.cached_prompt_tokens > 0
