"""The hand-set copy circuit: a freshly built model copies from its context before any training."""

from __future__ import annotations

import pytest

from test_models import nano_model

CIRCUIT_KW = dict(token_dim=32, free_dims=14)


def _config(tokenizer, circuit, **overrides):
    from transformers import Qwen3Config

    kw = dict(vocab_size=len(tokenizer) + (-len(tokenizer)) % 64, hidden_size=circuit.hidden_size,
              intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
              head_dim=circuit.min_head_dim(), max_position_embeddings=2048, rope_theta=1e28,
              tie_word_embeddings=False)
    kw.update(overrides)
    return Qwen3Config(**kw)


def _repeated_random(vocab: int, n: int, length: int, seed: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(seed)
    # Ordinary tokens only (skip the first few ids: special and markup tokens).
    return [(lambda s: s + s)(torch.randint(16, vocab, (length,), generator=gen).tolist()) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(nano_model(tmp_path_factory))


def test_circuit_copies_repeated_random_tokens_untrained(tokenizer):
    import torch
    from transformers import Qwen3ForCausalLM

    from trace_train.tiny.copy_circuit import CopyCircuit, copy_accuracy, install_copy_circuit

    circuit = CopyCircuit(**CIRCUIT_KW)
    torch.manual_seed(0)
    plain = Qwen3ForCausalLM(_config(tokenizer, circuit)).eval()
    wired = Qwen3ForCausalLM(_config(tokenizer, circuit)).eval()
    install_copy_circuit(wired, tokenizer, circuit)
    sequences = _repeated_random(len(tokenizer), n=3, length=150, seed=1)
    assert copy_accuracy(wired, sequences) >= 0.95
    assert copy_accuracy(plain, sequences) <= 0.05
    # The first half has nothing to copy yet: the circuit does not invent repeats there.
    with torch.no_grad():
        logits = wired(input_ids=torch.tensor([sequences[0]])).logits[0]
    first_half = logits[:149].argmax(-1)
    assert (first_half == torch.tensor(sequences[0][1:150])).float().mean() < 0.05


def test_circuit_follows_two_tokens_of_context(tokenizer):
    """After an ambiguous token (one seen before several times) the token before it decides."""
    import torch
    from transformers import Qwen3ForCausalLM

    from trace_train.tiny.copy_circuit import CopyCircuit, install_copy_circuit

    circuit = CopyCircuit(**CIRCUIT_KW)
    model = Qwen3ForCausalLM(_config(tokenizer, circuit)).eval()
    install_copy_circuit(model, tokenizer, circuit)
    # Ordinary token ids standing for "north", "_", "kettle", "shelf", "south", "mug".
    north, sep, kettle, shelf, south, mug = 101, 102, 103, 104, 105, 106
    # "north _ kettle ... south _ mug ... north _" -> kettle; "... south _" -> mug
    context = [north, sep, kettle, shelf, south, sep, mug, shelf, shelf]
    with torch.no_grad():
        after_north = model(input_ids=torch.tensor([context + [north, sep]])).logits[0, -1].argmax()
        after_south = model(input_ids=torch.tensor([context + [south, sep]])).logits[0, -1].argmax()
    assert int(after_north) == kettle
    assert int(after_south) == mug


def test_circuit_survives_save_and_reload(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    from trace_train.tiny.copy_circuit import CopyCircuit, copy_accuracy, install_copy_circuit

    circuit = CopyCircuit(**CIRCUIT_KW)
    model = Qwen3ForCausalLM(_config(tokenizer, circuit))
    install_copy_circuit(model, tokenizer, circuit)
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert not again.config.tie_word_embeddings
    assert copy_accuracy(again, _repeated_random(len(tokenizer), n=2, length=120, seed=2)) >= 0.95


@pytest.mark.parametrize("override, message", [
    ({"hidden_size": 96}, "hidden_size"),
    ({"head_dim": 32}, "head_dim"),
    ({"num_key_value_heads": 1}, "key/value heads"),
    ({"num_attention_heads": 4, "num_key_value_heads": 4}, "2 query heads"),
    ({"tie_word_embeddings": True}, "untied"),
    ({"rope_theta": 10000.0}, "rope_theta"),
])
def test_config_that_cannot_hold_the_circuit_is_refused(tokenizer, override, message):
    from transformers import Qwen3ForCausalLM

    from trace_train.tiny.copy_circuit import CopyCircuit, install_copy_circuit

    circuit = CopyCircuit(**CIRCUIT_KW)
    config = _config(tokenizer, circuit, **override)
    with pytest.raises(ValueError, match=message):
        install_copy_circuit(Qwen3ForCausalLM(config), tokenizer, circuit)


def test_build_model_wires_the_circuit_of_a_preset(tmp_path, monkeypatch):
    """A preset with ``copy_circuit`` (like ``tiny``) builds a checkpoint that copies when reloaded."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.tiny import build as models
    from trace_train.tiny.metadata import model_metadata
    from trace_train.tiny.copy_circuit import CopyCircuit, copy_accuracy

    circuit = CopyCircuit(**CIRCUIT_KW)
    preset = models.ModelPreset(vocab_size=1024, hidden_size=circuit.hidden_size, intermediate_size=96,
                                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                head_dim=circuit.min_head_dim(), max_position_embeddings=2048, rope_theta=1e28,
                                copy_circuit=circuit)
    monkeypatch.setitem(models.PRESETS, "wired", preset)
    built = models.build_model("wired", out=tmp_path / "m", env_ids=["examples/warehouse_stock-v0"], corpus_seeds=2)
    model = AutoModelForCausalLM.from_pretrained(built.path).eval()
    tok = AutoTokenizer.from_pretrained(built.path)
    assert model.config.rope_parameters["rope_theta"] == 1e28 and not model.config.tie_word_embeddings
    assert copy_accuracy(model, _repeated_random(len(tok), n=2, length=120, seed=3)) >= 0.95
    assert model_metadata(built.path)["copy_accuracy_repeated_random"] >= 0.95  # measured at build time
    # The real preset fits its own circuit.
    tiny = models.PRESETS["tiny"]
    assert tiny.copy_circuit is not None and tiny.hidden_size == tiny.copy_circuit.hidden_size
    assert tiny.head_dim >= tiny.copy_circuit.min_head_dim()


def test_frozen_circuit_survives_training(tokenizer):
    """Training with the circuit frozen changes the other weights but not what the copy heads attend to."""
    import torch
    from transformers import Qwen3ForCausalLM

    from trace_train.tiny.copy_circuit import (CopyCircuit, circuit_gradient_masks, freeze_copy_circuit,
                                               install_copy_circuit)

    circuit = CopyCircuit(**CIRCUIT_KW)
    config = _config(tokenizer, circuit)
    config._attn_implementation = "eager"  # to read the attention weights
    model = Qwen3ForCausalLM(config)
    install_copy_circuit(model, tokenizer, circuit)
    probe = torch.tensor(_repeated_random(len(tokenizer), n=1, length=60, seed=4))

    def copy_heads():  # layer 0 (both previous-token heads) and layer 1 head 0 (induction)
        model.eval()
        with torch.no_grad():
            att = model(input_ids=probe, output_attentions=True).attentions
        model.train()
        return att[0][0], att[1][0, 0]

    heads_before = copy_heads()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    masks = circuit_gradient_masks(model, circuit)
    freeze_copy_circuit(model, circuit)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    gen = torch.Generator().manual_seed(5)
    for _ in range(10):  # language modelling on random text
        ids = torch.randint(16, len(tokenizer), (4, 64), generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
    params = dict(model.named_parameters())
    for name, mask in masks.items():
        held = mask == 0
        assert torch.equal(params[name].detach()[held], before[name][held]), name
    assert not torch.equal(params["model.layers.1.mlp.down_proj.weight"], before["model.layers.1.mlp.down_proj.weight"])
    free = slice(4 * circuit.token_dim + 2, circuit.hidden_size)
    assert not torch.equal(params["model.embed_tokens.weight"][:, free], before["model.embed_tokens.weight"][:, free])
    for was, now in zip(heads_before, copy_heads()):
        assert (was - now).abs().max() < 0.02, (was - now).abs().max()
    # ...and they still point where the circuit says: one back, two back, after the earlier occurrence.
    prev, prev2 = heads_before[0][0].argmax(-1), heads_before[0][1].argmax(-1)
    positions = torch.arange(probe.shape[1])
    assert torch.equal(prev[2:], positions[2:] - 1) and torch.equal(prev2[3:], positions[3:] - 2)
    second_half = positions[62:]
    assert torch.equal(heads_before[1].argmax(-1)[62:], second_half - 60 + 1)


def test_banded_training_forward_matches_the_full_one(tokenizer, monkeypatch):
    """While the previous-token layer is held, its attention stays within a few positions, so the SFT fast
    path runs it with banded attention: the same loss, and the same gradients for every weight that trains."""
    import torch
    from transformers import Qwen3ForCausalLM

    from trace_train.tiny.copy_circuit import CopyCircuit, circuit_gradient_masks, install_copy_circuit
    from trace_train.tiny import sft_forward
    from trace_train.tiny.bootstrap import LOCAL_WINDOW, _banded_window
    from trace_train.tiny.sft_forward import local_attention_mass, sft_loss

    circuit = CopyCircuit(**CIRCUIT_KW)
    torch.manual_seed(0)
    plain = Qwen3ForCausalLM(_config(tokenizer, circuit))
    wired = Qwen3ForCausalLM(_config(tokenizer, circuit))
    install_copy_circuit(wired, tokenizer, circuit)
    # Rows sharing a 300-token prefix, then 60-90 tokens of their own, targets on their last 25 tokens.
    gen = torch.Generator().manual_seed(2)
    prefix = torch.randint(16, len(tokenizer), (300,), generator=gen).tolist()
    rows = []
    for length in (60, 75, 90):
        tail = torch.randint(16, len(tokenizer), (length,), generator=gen).tolist()
        ids = prefix + tail
        rows.append((ids, [-100] * (len(ids) - 25) + ids[-25:]))
    assert local_attention_mass(wired, rows[0][0], LOCAL_WINDOW) > 1 - 1e-4
    assert local_attention_mass(plain, rows[0][0], LOCAL_WINDOW) < 0.5
    assert _banded_window(wired, circuit, "positional", rows) == LOCAL_WINDOW
    assert _banded_window(wired, circuit, "none", rows) is None  # the layer trains: it may stop being local
    assert _banded_window(plain, None, "positional", rows) is None

    held_masks = circuit_gradient_masks(wired, circuit, "positional")  # 0 where a weight is held fixed
    banded_calls = []
    real_layer = sft_forward._local_decoder_layer
    monkeypatch.setattr(sft_forward, "_local_decoder_layer", lambda *a, **k: banded_calls.append(1) or real_layer(*a, **k))
    for prefix_len, every_token in ((300, False), (0, False), (0, True)):
        results = []
        for window in (None, LOCAL_WINDOW):
            wired.zero_grad()
            loss = sft_loss(wired, rows, tokenizer.pad_token_id, prefix_len, targets_only=window is not None,
                            local_window=window, every_token=every_token)
            loss.backward()
            results.append((float(loss), {n: p.grad.clone() for n, p in wired.named_parameters()}))
        (full, full_grads), (banded, banded_grads) = results
        assert banded_calls, "the banded path did not run"
        banded_calls.clear()
        assert banded == pytest.approx(full, rel=1e-5)
        for name, grad in full_grads.items():
            held = held_masks.get(name)
            a, b = (grad, banded_grads[name]) if held is None else (grad * held, banded_grads[name] * held)
            # Relative to the weight's largest gradient (the induction head's sharp softmax amplifies rounding).
            assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max()) + 1e-7, name


def _wired_preset(split: str):
    from trace_train.tiny.build import ModelPreset
    from trace_train.tiny.copy_circuit import CopyCircuit

    circuit = CopyCircuit(**CIRCUIT_KW)
    return ModelPreset(vocab_size=2048, hidden_size=circuit.hidden_size, intermediate_size=96, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=2, head_dim=circuit.min_head_dim(),
                       max_position_embeddings=4096, rope_theta=1e28, copy_circuit=circuit, split=split)


def test_the_keys_split_lets_a_write_after_a_record_copy_the_field_it_names(tmp_path, monkeypatch):
    """``id ": "`` ends every id field; with the field name one token the induction match tells them apart.

    The context is a cancellation's: the user details call and record, the reservation read and its record (which
    also holds the user id). The write ``{"reservation_id": "`` must continue with the reservation id. Untrained,
    the ``words`` split's match spreads over every ``id ": "`` (the user id's three, the reservation id's two) and
    its copy is not the reservation id; the ``keys`` split copies the reservation id. Measured on 37 oracle
    cancellations of the planted target with the real presets: the write starts with the id 1/37 (``tiny``)
    against 28/37 (``tiny-keys``).
    """
    import json

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.tiny import build as models

    user, rid = "mia_li_3668", "ZFA04Y"
    user_record = {"user_id": user, "name": {"first_name": "Mia", "last_name": "Li"}, "reservations": [rid]}
    reservation = {"reservation_id": rid, "user_id": user, "origin": "SFO", "destination": "JFK", "cabin": "business"}
    context = (f'<tool_call>\n{{"name": "get_user_details", "arguments": {{"user_id": "{user}"}}}}\n</tool_call>\n'
               f"<tool_response>\n{json.dumps(user_record)}\n</tool_response>\n"
               f'<tool_call>\n{{"name": "get_reservation_details", "arguments": {{"reservation_id": "{rid}"}}}}\n'
               f"</tool_call>\n<tool_response>\n{json.dumps(reservation)}\n</tool_response>\n"
               '<tool_call>\n{"name": "cancel_reservation", "arguments": {"reservation_id": "')
    first = {}
    for split in ("words", "keys"):
        monkeypatch.setitem(models.PRESETS, f"wired-{split}", _wired_preset(split))
        built = models.build_model(f"wired-{split}", out=tmp_path / split, env_ids=["trace/tau_airline-v0"],
                                   corpus_seeds=2)
        tok = AutoTokenizer.from_pretrained(built.path)
        model = AutoModelForCausalLM.from_pretrained(built.path).eval()
        pieces = [tok.decode([i]) for i in tok("reservation_id").input_ids]
        assert pieces == (["reservation_id"] if split == "keys" else ["reservation", "_", "id"])
        with torch.no_grad():
            logits = model(input_ids=tok(context, return_tensors="pt").input_ids).logits[0, -1]
        first[split] = tok.decode([int(logits.argmax())])
        assert rid.startswith(tok.decode(tok(rid).input_ids[:1]))  # the id's first token is what a copy starts with
    assert rid.startswith(first["keys"]) and first["keys"], first
    assert not rid.startswith(first["words"]), first  # the words split's copy is a blend of the id fields
