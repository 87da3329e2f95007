"""Context gates of the composed model (``gate_input="context"``): the choice of a token rests on the causal
mean of the block inputs so far, exactly the same whether the sequence is read in one forward, decoded token by
token under a KV cache, or left-padded in a batch; the gate reads what came before, not what comes after; the
folder saves and loads it; agents turn their prefix caches and the fast loop off for it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from transformers import AutoModelForCausalLM  # noqa: E402

# test_compose's module fixture `setup` (the nano base and its K adapters) serves these tests too.
from test_compose import K, scramble_gates, setup, tokens  # noqa: E402,F401
from trace_train.compose import ComposedModel, ComposeError  # noqa: E402


@pytest.fixture(scope="module")
def model(setup):
    base, adapters, _ = setup
    m = ComposedModel.build(base, adapters, gate_input="context")
    m.fit_context_centers([tokens(base, batch=1, seq=50, seed=s)[0].tolist() for s in range(20, 24)])
    assert m.context_centers.abs().sum() > 0
    scramble_gates(m, scale=8.0)
    return m


def choices(model, ids, **kwargs):
    with torch.no_grad(), model.recording(choices=True) as routers:
        out = model(input_ids=ids, **kwargs)
        return out, [r.choice.clone() for r in routers]


def test_context_gates_read_twice_the_hidden_size_and_route_tokens_over_every_slot(setup, model):
    base, _, _ = setup
    hidden = AutoModelForCausalLM.from_pretrained(base).config.hidden_size
    assert all(g.in_features == 2 * hidden for g in model.gates)
    assert model.gate_parameter_count() == len(model.gates) * (2 * hidden + 1) * (K + 1)
    _, picks = choices(model, tokens(base, batch=4, seq=40))
    assert set(torch.cat([c.flatten() for c in picks]).tolist()) == set(range(K + 1))


def test_a_token_is_routed_on_what_came_before_it_not_after(setup, model):
    base, _, _ = setup
    ids = tokens(base, batch=1, seq=30, seed=3)
    _, full = choices(model, ids)
    _, head = choices(model, ids[:, :12])
    for f, h in zip(full, head):
        assert torch.equal(f[:, :12], h)  # causal: the later tokens change nothing before them
    # ...and an earlier token does change the choice of a later one (the token gate could not).
    other = ids.clone()
    other[0, :6] = tokens(base, batch=1, seq=6, seed=9)[0]
    _, changed = choices(model, other)
    assert any(not torch.equal(a[:, 6:], b[:, 6:]) for a, b in zip(full, changed))


def test_decoding_under_a_kv_cache_gives_the_choices_and_logits_of_one_forward(setup, model):
    base, _, _ = setup
    ids = tokens(base, batch=2, seq=24, seed=5)
    whole, whole_choices = choices(model, ids)
    with torch.no_grad(), model.recording(choices=True) as routers:
        out = model(input_ids=ids[:, :10], use_cache=True)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        logits, picks = [out.logits], [[r.choice.clone()] for r in routers]
        for t in range(10, 24):
            kwarg = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
            out = model(input_ids=ids[:, t:t + 1], use_cache=True, **{kwarg: cache})
            logits.append(out.logits)
            for p, r in zip(picks, routers):
                p.append(r.choice.clone())
    assert torch.allclose(torch.cat(logits, dim=1), whole.logits, atol=1e-4)
    for p, w in zip(picks, whole_choices):
        assert torch.equal(torch.cat(p, dim=1), w)


def test_left_padding_does_not_count_toward_the_context(setup, model):
    base, _, _ = setup
    seq = tokens(base, batch=1, seq=18, seed=7)
    _, alone = choices(model, seq)
    padded = torch.cat([torch.zeros(1, 5, dtype=torch.long), seq], dim=1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 18, dtype=torch.long)], dim=1)
    _, with_pad = choices(model, padded, attention_mask=mask)
    for a, p in zip(alone, with_pad):
        assert torch.equal(a, p[:, 5:])


def test_generate_matches_with_and_without_padding_and_a_stray_continuation_is_refused(setup, model):
    base, _, _ = setup
    a, b = tokens(base, batch=1, seq=15, seed=11), tokens(base, batch=1, seq=9, seed=12)
    with torch.no_grad():
        alone = model.generate(input_ids=b, attention_mask=torch.ones_like(b), max_new_tokens=8, do_sample=False)
        batch = torch.cat([a, torch.cat([torch.zeros(1, 6, dtype=torch.long), b], dim=1)])
        mask = torch.ones_like(batch)
        mask[1, :6] = 0
        both = model.generate(input_ids=batch, attention_mask=mask, max_new_tokens=8, do_sample=False)
    assert both[1, 15:].tolist() == alone[0, 9:].tolist()
    # A cache the model did not fill in this sequence has no running context: a clear error, not a guess.
    from transformers import DynamicCache

    plain = AutoModelForCausalLM.from_pretrained(base).eval()
    with torch.no_grad():
        out = plain(input_ids=a[:, :10], use_cache=True)
    foreign = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
    assert isinstance(foreign, DynamicCache)
    fresh = ComposedModel.build(base, setup[1], gate_input="context")
    kwarg = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
    with pytest.raises(ComposeError, match="did not start"), torch.no_grad():
        fresh(input_ids=a[:, 10:11], use_cache=True, **{kwarg: foreign})


def test_the_folder_keeps_the_gate_input_and_agents_keep_no_cache_between_turns(setup, model, tmp_path):
    base, _, _ = setup
    model.save_pretrained(tmp_path / "moe")
    loaded = ComposedModel.from_pretrained(tmp_path / "moe")
    assert loaded.gate_input == "context" and loaded.stateful_routing
    assert torch.equal(loaded.context_centers, model.context_centers)
    ids = tokens(base, batch=2, seq=20, seed=13)
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits, atol=1e-5)
    from trace_train.agents import HFAgent
    from trace_train.tiny import fast_decode

    # The fast loop carries the running sums itself (tests/test_fast_decode.py); neither path keeps keys and
    # values between turns for such a model, since they would come without the sums.
    assert fast_decode.supported(loaded)[0]
    agent = HFAgent(str(tmp_path / "moe"), temperature=0.0, max_new_tokens=4, decode="fast")
    assert agent.decode == "fast" and agent.prefix_cache is False and agent.decoder.store.limit == 0
    assert HFAgent(str(tmp_path / "moe"), temperature=0.0, max_new_tokens=4, decode="hf").prefix_cache is False
    assert fast_decode.FastDecoder(loaded, store_limit=64).store.limit == 0
    with pytest.raises(ComposeError, match="gate_input"):
        ComposedModel.build(base, setup[1], gate_input="pooled")


def test_the_centre_is_the_mean_context_of_the_data_and_router_training_fits_it(setup):
    base, adapters, _ = setup
    from trace_train.compose.data import EncodedTrajectory
    from trace_train.compose.train import RouterTrainConfig, train_router

    m = ComposedModel.build(base, adapters, gate_input="context")
    seqs = [tokens(base, batch=1, seq=30 + 5 * s, seed=40 + s)[0].tolist() for s in range(3)]
    m.capture_context = True
    raw = []
    with torch.no_grad():
        for ids in seqs:  # the normalised running mean, as each block reads it before centring
            m(input_ids=torch.tensor([ids]))
            raw.append([r.raw_context[0] for r in m.routers])
    m.capture_context = False
    expected = torch.stack([torch.cat([r[b] for r in raw]).mean(0) for b in range(len(m.routers))])
    episodes = [EncodedTrajectory(ids, [True] * len(ids), ["assistant"] * len(ids), "e", 1, 1) for ids in seqs]
    train_router(m, episodes, RouterTrainConfig(epochs=1, lr=1e-3), progress=False)
    assert torch.allclose(m.context_centers, expected, atol=1e-5)


def test_label_from_the_first_observation_leaves_the_tokens_before_it_out_of_the_label_loss(setup):
    base, adapters, _ = setup
    from trace_train.compose.data import EncodedTrajectory
    from trace_train.compose.train import RouterTrainConfig, episode_loss

    m = ComposedModel.build(base, adapters, gate_input="context")
    scramble_gates(m, scale=8.0)
    ids = tokens(base, batch=1, seq=40, seed=50)[0].tolist()
    ep = EncodedTrajectory(ids, [True] * 40, ["assistant"] * 40, "e", 2, first_observation=25)
    cfg = RouterTrainConfig(label_from="first_observation")
    with torch.no_grad(), m.recording(logits=True, choices=False) as routers:
        m(input_ids=torch.tensor([ids]))
        by_hand = torch.stack([torch.nn.functional.cross_entropy(r.logits[0, 25:].float(),
                                                                 torch.full((15,), 2)) for r in routers]).mean()
        everything = torch.stack([torch.nn.functional.cross_entropy(r.logits[0].float(), torch.full((40,), 2))
                                  for r in routers]).mean()
    with torch.no_grad():
        assert episode_loss(m, ep, cfg)["label"] == pytest.approx(float(by_hand), rel=1e-4)
        assert episode_loss(m, ep, RouterTrainConfig())["label"] == pytest.approx(float(everything), rel=1e-4)
    assert float(by_hand) != pytest.approx(float(everything), rel=1e-3)
    with pytest.raises(ComposeError, match="label_from"):
        RouterTrainConfig(label_from="middle")


def test_gate_inputs_are_what_the_gates_read(setup, model):
    base, _, _ = setup
    ids = tokens(base, batch=1, seq=20, seed=60)[0].tolist()
    inputs = model.gate_inputs(ids, None)
    with torch.no_grad(), model.recording(logits=True, choices=False) as routers:
        model(input_ids=torch.tensor([ids]))
        for gate, x, r in zip(model.gates, inputs, routers):
            assert torch.allclose(gate(x), r.logits[0].float(), atol=1e-5)
    # Forced to one adapter, the later blocks read another residual stream (the adapter's), the first the same.
    forced = model.gate_inputs(ids, 1)
    assert torch.allclose(forced[0], model.gate_inputs(ids, 2)[0])
    assert not torch.allclose(forced[-1], model.gate_inputs(ids, 2)[-1])


def test_the_prefit_routes_each_labelled_episode_to_its_adapter_where_a_few_joint_steps_do_not(setup):
    """Two kinds of episode that differ only in their opening tokens (what the conversation is about), each
    labelled with its own adapter from the first observation on."""
    base, adapters, _ = setup
    from trace_train.compose.data import EncodedTrajectory
    from trace_train.compose.train import RouterTrainConfig, train_router

    def episode(kind, seed):
        ids = tokens(base, batch=1, seq=40, seed=seed)[0]
        ids[:8] = 11 if kind == 1 else 17  # the request
        return EncodedTrajectory(ids.tolist(), [True] * 40, ["assistant"] * 40, f"env{kind}", kind,
                                 first_observation=8)

    train = [episode(1 + s % 2, 70 + s) for s in range(8)]
    held_out = [episode(1 + s % 2, 90 + s) for s in range(6)]

    def share_on_label(m):
        right = total = 0
        with torch.no_grad(), m.recording(choices=True) as routers:
            for ep in held_out:
                m(input_ids=torch.tensor([ep.ids]))
                picks = torch.stack([r.choice[0, ep.first_observation:] for r in routers])
                right += int((picks == ep.slot).sum())
                total += picks.numel()
        return right / total

    joint_only = ComposedModel.build(base, adapters, gate_input="context")
    train_router(joint_only, train, RouterTrainConfig(epochs=1, accumulate=2, label_from="first_observation"),
                 progress=False)
    prefit = ComposedModel.build(base, adapters, gate_input="context")
    train_router(prefit, train, RouterTrainConfig(epochs=1, accumulate=2, label_from="first_observation",
                                                  prefit_steps=200), progress=False)
    assert share_on_label(prefit) > 0.9
    assert share_on_label(joint_only) < 0.5
    assert prefit.spec.training["prefit"]["label_last"] < prefit.spec.training["prefit"]["label_first"]
    with pytest.raises(ComposeError, match="prefit"):
        RouterTrainConfig(prefit_steps=-1)


def test_under_segment_routing_the_labels_cover_the_deciding_tokens_and_the_prefit_routes_whole_messages(setup):
    """Segment routing decides at each message's ``<|im_start|>``: the label loss and the pre-fit cover those tokens
    (from the first observation on) and nothing else, and after the pre-fit every held-out message after the
    first observation goes, whole, to its episode's adapter."""
    base, adapters, _ = setup
    from transformers import AutoTokenizer

    from trace_train.compose.data import EncodedTrajectory
    from trace_train.compose.train import RouterTrainConfig, label_positions, train_router

    start_id = AutoTokenizer.from_pretrained(base).convert_tokens_to_ids("<|im_start|>")

    def episode(kind, seed):
        ids = tokens(base, batch=1, seq=48, seed=seed)[0]
        ids[ids == start_id] = 5
        ids[:8] = 11 if kind == 1 else 17  # the request
        ids[[0, 12, 24, 36]] = start_id  # four messages
        return EncodedTrajectory(ids.tolist(), [True] * 48, ["assistant"] * 48, f"env{kind}", kind,
                                 first_observation=8)

    train = [episode(1 + s % 2, 70 + s) for s in range(8)]
    held_out = [episode(1 + s % 2, 90 + s) for s in range(6)]
    cfg = RouterTrainConfig(epochs=1, accumulate=2, label_from="first_observation", prefit_steps=200)
    model = ComposedModel.build(base, adapters, gate_input="context")
    assert label_positions(model, train[0], cfg).tolist() == list(range(8, 48))
    model.routing = "segment"
    assert label_positions(model, train[0], cfg).tolist() == [12, 24, 36]
    train_router(model, train, cfg, progress=False)
    assert model.spec.training["prefit"]["label_last"] < model.spec.training["prefit"]["label_first"]
    with torch.no_grad(), model.recording(choices=True) as routers:
        for ep in held_out:
            model(input_ids=torch.tensor([ep.ids]))
            for r in routers:
                assert r.choice[0, 12:].tolist() == [ep.slot] * 36
