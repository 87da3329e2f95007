"""``decode: fast`` and ``loss_forward: shared_prefix``: the hand-written decode loop and the shared-prefix loss.

* greedy decoding with :class:`trace_train.tiny.fast_decode.FastDecoder` gives ``generate``'s tokens, token for
  token, on 20 prompts of a capability env (10 first turns, then their second turns, which reuse the
  stored keys/values of the first), with the ``tiny`` preset — except at a tie of the top two logits (within
  1e-4), which float rounding decides and where ``generate`` disagrees with the model's own uncached
  forward too; and an :class:`HFAgent` rollout plays the same episodes with either path;
* with a LoRA (merged into the decoder's weights), sampled tokens carry the log-probabilities the policy
  gives them at that temperature, which is what TRL's loss recomputes;
* :func:`trace_train.train.prefix_logprobs.shared_prefix_logprobs` gives the full forward's log-probs,
  entropies and LoRA gradients on a left/right-padded batch that shares a prefix;
* a GRPO step on the fast path logs the same loss and entropy as one with TRL's own loss forward.
"""

from __future__ import annotations

import pytest

ENV = "trace/precondition_verification-v0"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.tiny.build import build_model

    path = build_model("tiny", out=tmp_path_factory.getbasetemp() / "tiny-fast", env_ids=[ENV], corpus_seeds=4).path
    return str(path), AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@pytest.fixture(scope="module")
def nano(tmp_path_factory):
    from trace_train.tiny.build import build_model

    return str(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-fast", env_ids=[ENV],
                           corpus_seeds=4).path)


def _first_prompts(tokenizer, seeds):
    import gymnasium as gym

    import trace_envs  # noqa: F401
    from trace_train.tiny.metadata import prompt_env_kwargs
    from trace_train.tiny.sft_data import render_prompt

    out = []
    for seed in seeds:
        env = gym.make(ENV, **prompt_env_kwargs(ENV), difficulty=1)
        _, info = env.reset(seed=seed)
        out.append((info["messages"], info["tools"]))
        env.close()
    return out, [tokenizer(render_prompt(tokenizer, m, t), add_special_tokens=False)["input_ids"] for m, t in out]


def _eos(tokenizer):
    return [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")]


def _generate_reference(model, prompt, eos, max_new_tokens):
    import torch

    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos[1])
    tokens = out[0, len(prompt):].tolist()
    return tokens[:tokens.index(eos[0]) + 1] if eos[0] in tokens else tokens


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1]


def _same_but_ties(model, prompts, got, want) -> int:
    """How many of the fast path's generations (``got``) equal ``generate``'s (``want``) token for token.

    The only difference allowed is a tie that float rounding decides: the copy circuit makes some (two copy
    candidates scored alike), and there generate's own cached and uncached forwards disagree too."""
    exact = 0
    for prompt, g, w in zip(prompts, got, want):
        j = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), None)
        if j is None:
            assert len(g) == len(w)
            exact += 1
            continue
        top = _logits(model, prompt + w[:j]).topk(2)
        assert float(top.values[0] - top.values[1]) < 1e-4 and {g[j], w[j]} == set(top.indices.tolist()), (j, top)
    return exact


def test_greedy_decoding_matches_generate_token_for_token(tiny):
    from trace_train.tiny.fast_decode import FastDecoder
    from trace_train.tiny.sft_data import render_prompt

    _, model, tok = tiny
    eos = _eos(tok)
    conversations, prompts = _first_prompts(tok, range(10))
    decoder = FastDecoder(model)
    first = decoder.generate(prompts, 16, eos)
    # Second turns: the model's reply and a user message, re-rendered as HFAgent renders the next prompt.
    second_prompts = []
    for (messages, tools), gen in zip(conversations, first):
        text = tok.decode([t for t in gen.tokens if t not in eos])
        more = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "Thanks, go on."}]
        second_prompts.append(tok(render_prompt(tok, more, tools), add_special_tokens=False)["input_ids"])
    second = decoder.generate(second_prompts, 16, eos)

    got = [g.tokens for g in first + second]
    want = [_generate_reference(model, p, eos, 16) for p in prompts + second_prompts]
    assert _same_but_ties(model, prompts + second_prompts, got, want) >= 16
    # The second turns reused the first turns' keys and values (the store); the first turns had none to reuse.
    assert all(g.cached_tokens == 0 for g in first)
    assert all(g.cached_tokens > 0.9 * len(p) for g, p in zip(second, second_prompts))


def test_an_hf_agent_plays_the_same_episodes_with_either_path(nano):
    from trace_train.agents import HFAgent
    from trace_train.tiny.metadata import model_env_kwargs
    from trace_train.rollouts import run_rollouts

    records = {}
    for decode in ("hf", "fast"):
        agent = HFAgent(nano, max_new_tokens=12, decode=decode)
        assert agent.decode == decode
        summary = run_rollouts(ENV, agent, seeds=range(4), in_flight=4, max_steps=3, progress=False,
                               keep_records=True, env_kwargs={**model_env_kwargs(nano, ENV), "difficulty": 1})
        records[decode] = sorted((r["seed"], r["messages"]) for r in summary.records)
    assert records["fast"] == records["hf"]
    assert HFAgent(nano).decode == "fast"  # auto: the tiny presets on CPU take the fast path


def _first_decoded_context(decoder, prompts, eos):
    """The (centred context, token count) that the first routed layer's gates read at the first decoding step of
    ``decoder.generate(prompts, 2, eos)``: ``[rows, 1, hidden]`` and ``[rows]``."""
    import torch

    seen = []
    original = type(decoder)._context

    def recording(layer, h, sums, counts, restarts=None):
        out = original(layer, h, sums, counts, restarts)
        if out[0] is not None and torch.is_tensor(counts) and not seen:  # a decoding step: one count per row
            seen.append((out[0].clone(), counts.clone()))
        return out

    decoder._context = recording
    try:
        decoder.generate(prompts, 2, eos)
    finally:
        del decoder._context
    return seen[0]


def _lora(model, seed=0):
    """``model`` with a LoRA on every attention and MLP projection, its B matrices random (a trained-like adapter)."""
    import torch
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return peft_model


def _two_adapters(path: str, folder) -> dict[str, str]:
    """Two random LoRAs over the model at ``path``, saved under ``folder``: name -> folder."""
    from transformers import AutoModelForCausalLM

    adapters = {}
    for i, name in enumerate(("alpha", "beta")):
        _lora(AutoModelForCausalLM.from_pretrained(path), seed=i + 1).save_pretrained(folder / name)
        adapters[name] = str(folder / name)
    return adapters


@pytest.mark.parametrize("top_k, gate_input, gate_weight, routing", [
    (1, "token", "prob", "token"), (2, "token", "prob", "token"), (1, "context", "prob", "token"),
    (1, "context", "one", "token"), (2, "token", "one", "token"), (1, "context", "prob", "segment"),
    (1, "token", "one", "segment"), (1, "request", "prob", "token"), (1, "request", "prob", "segment")])
def test_a_composed_model_decodes_like_its_generate(tiny, tmp_path, top_k, gate_input, gate_weight, routing):
    """A token-level MoE (two LoRA experts, gates that send tokens to every slot) on the fast path: the tokens
    of its own ``generate``, except at a float-rounding tie, as for the plain model. With context gates (each
    gate also reads the centred running mean of its block's inputs) the loop carries each row's running sums
    through the shared prefix, the row's own prompt and every generated token; a second turn re-encodes its
    prompt after the shared prefix (the store keeps no sums) and still decodes like ``generate``. With
    ``gate_weight="one"`` the chosen slots' weights are renormalised (top-1: the whole update) on both paths. With
    segment routing each message keeps the choice made at its first token, through the shared prefix, the row's
    prompt and the generated tokens (which continue the assistant header's message), and the store is off. With
    request gates the running mean restarts at each user request of the prompt (the second turn's is one), as the
    composer's forward restarts it; a loop that did not restart decodes otherwise."""
    import torch

    from trace_train.compose import ComposedModel
    from trace_train.tiny.fast_decode import FastDecoder, auto_applies

    path, _, tok = tiny
    adapters = _two_adapters(path, tmp_path)
    composed = ComposedModel.build(path, adapters, top_k=top_k, gate_input=gate_input, gate_weight=gate_weight).eval()
    eos = _eos(tok)
    _, prompts = _first_prompts(tok, range(8))
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for g in composed.gates:  # a trained-like router: every slot wins some tokens
            g.weight.copy_(torch.randn(g.weight.shape, generator=gen) * 0.5)
            g.bias.zero_()
        if gate_input in ("context", "request"):
            composed.fit_context_centers(prompts[:2])
            assert float(composed.context_centers.abs().sum()) > 0
            hidden = composed.context_centers.shape[1]
            for g in composed.gates:  # the context half decides: the task, not the token, picks the slot
                g.weight[:, hidden:].mul_(4.0)
    assert auto_applies(composed)
    composed.keep_choices = True
    with torch.no_grad():
        composed(input_ids=torch.tensor([prompts[0]]))
    used = set(torch.cat([r.choice.flatten() for r in composed.routers]).tolist())
    composed.keep_choices = False
    assert used == {0, 1, 2}, used
    if routing == "segment":  # the same gates, their choices held per message
        composed.routing = routing
        composed.keep_choices = True
        with torch.no_grad():
            composed(input_ids=torch.tensor([prompts[0]]))
        held = [r.choice[0] for r in composed.routers]
        composed.keep_choices = False
        assert any(int(c.max()) > 0 for c in held)  # adapters are held, not only the base
        if gate_input != "token":  # messages differ in their slot (a token gate reads the same <|im_start|>)
            assert any(len(set(c.tolist())) > 1 for c in held)
    decoder = FastDecoder(composed)
    got = [g.tokens for g in decoder.generate(prompts, 16, eos)]
    want = [_generate_reference(composed, p, eos, 16) for p in prompts]
    assert _same_but_ties(composed, prompts, got, want) >= 6
    if gate_input != "token" or routing == "segment":  # a second turn: the same decoder, longer prompts
        nxt = [p + w + tok("<|im_end|>\n<|im_start|>user\nPlease go on.<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)["input_ids"] for p, w in zip(prompts, want)]
        second = decoder.generate(nxt, 16, eos)
        got = [g.tokens for g in second]
        assert not decoder.store.entries  # no keys/values kept between turns: their sums/holds are not stored
        want = [_generate_reference(composed, p, eos, 16) for p in nxt]
        assert _same_but_ties(composed, nxt, got, want) >= 6
        if gate_input == "request":  # the restarts are what make it so: the first generated token's gates read
            # the mean since the row's last request; without restarts, the mean over the whole conversation
            restarted = _first_decoded_context(decoder, nxt, eos)
            decoder.request_marker = None
            unrestarted = _first_decoded_context(decoder, nxt, eos)
            assert (restarted[1] < unrestarted[1] - 20).all()  # tokens averaged: the last request's vs all
            assert float((restarted[0] - unrestarted[0]).abs().max()) > 0.1
    with composed.force_routing(1):  # forced (per-episode) routing keeps generate()
        assert not auto_applies(composed)


def test_per_episode_routing_decodes_like_its_generate(tiny, tmp_path, monkeypatch):
    """Per-episode routing (one adapter per conversation, chosen from its first observation) on the fast path: the
    loop groups the prompts by the episode router's slot and decodes each group with every token on that adapter,
    the tokens of the composed model's own ``generate``; a second turn reuses each slot's own store (a prefix's
    keys/values differ between adapters), and a slot forced from outside still keeps ``generate``."""
    from trace_train.compose import ComposedModel
    from trace_train.tiny.fast_decode import FastDecoder, supported

    path, _, tok = tiny
    adapters = _two_adapters(path, tmp_path)
    composed = ComposedModel.build(path, adapters).eval()
    eos = _eos(tok)
    _, prompts = _first_prompts(tok, range(8))
    composed.routing = "per_episode"
    router = composed.episode_router()
    # The choice itself is the router's business (tests/test_compose.py); here each first observation is sent to
    # a slot by the parity of its tokens, so that both adapters decode a group. Both paths ask the same router.
    monkeypatch.setattr(router, "_decide", lambda prefix: 1 + sum(prefix) % 2)
    slots = [router.slot_for(p) for p in prompts]
    assert set(slots) == {1, 2}, slots
    decoder = FastDecoder(composed)
    got = [g.tokens for g in decoder.generate(prompts, 16, eos)]
    want = [_generate_reference(composed, p, eos, 16) for p in prompts]
    assert _same_but_ties(composed, prompts, got, want) >= 6
    nxt = [p + w + tok("<|im_end|>\n<|im_start|>user\nPlease go on.<|im_end|>\n<|im_start|>assistant\n",
                          add_special_tokens=False)["input_ids"] for p, w in zip(prompts, want)]
    second = decoder.generate(nxt, 16, eos)
    assert sorted(decoder._stores) == [1, 2] and all(s.entries for s in decoder._stores.values())
    assert all(g.cached_tokens > 0 for g in second)  # each conversation's own keys/values, from its slot's store
    want = [_generate_reference(composed, p, eos, 16) for p in nxt]
    assert _same_but_ties(composed, nxt, [g.tokens for g in second], want) >= 6
    with composed.force_routing(1):
        assert supported(composed) == (False, "forced routing")


def test_sampled_tokens_carry_the_policys_logprobs(nano):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trace_train.tiny.fast_decode import FastDecoder

    tok = AutoTokenizer.from_pretrained(nano)
    model = _lora(AutoModelForCausalLM.from_pretrained(nano)).eval()
    _, prompts = _first_prompts(tok, range(3))
    temperature = 0.7
    out = FastDecoder(model).generate(prompts, 20, _eos(tok), temperature=temperature, top_k=None,
                                      generator=torch.Generator().manual_seed(1))
    for prompt, gen in zip(prompts, out):
        ids = torch.tensor([prompt + gen.tokens])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature
        want = torch.log_softmax(logits, -1).gather(1, torch.tensor(gen.tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-4)
    assert len({tuple(g.tokens) for g in out}) > 1  # sampled, not greedy


def test_shared_prefix_logprobs_and_gradients_match_the_full_forward(nano):
    import torch
    from transformers import AutoModelForCausalLM

    from trace_train.train.prefix_logprobs import shared_prefix_logprobs

    model = _lora(AutoModelForCausalLM.from_pretrained(nano), seed=1)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    shared = torch.randint(3, vocab, (60,), generator=gen).tolist()
    prompts = [shared + torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (5, 9, 1)]
    completions = [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (7, 3, 11)]
    p_width, c_width = max(map(len, prompts)), max(map(len, completions))
    ids = torch.zeros(3, p_width + c_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions)):  # TRL's layout: prompts left-, completions right-padded
        ids[i, p_width - len(p):p_width] = torch.tensor(p)
        ids[i, p_width:p_width + len(c)] = torch.tensor(c)
        mask[i, p_width - len(p):p_width + len(c)] = 1
    temperature = 0.9
    weights = torch.randn(3, c_width, generator=gen)  # stands in for advantages

    def grads_of(fn):
        model.zero_grad()
        logps, ent = fn()
        (logps * weights * mask[:, p_width:]).sum().backward()
        return logps.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                             if p.requires_grad}

    def full():
        rows_lp, rows_ent = [], []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            logits = model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1:-1].float() / temperature
            logp = torch.log_softmax(logits, -1)
            pad = c_width - len(c)
            rows_lp.append(torch.cat([logp.gather(1, torch.tensor(c)[:, None])[:, 0], torch.zeros(pad)]))
            rows_ent.append(torch.cat([-(logp.exp() * logp).sum(-1), torch.zeros(pad)]))
        return torch.stack(rows_lp), torch.stack(rows_ent)

    lp_ref, ent_ref, g_ref = grads_of(full)
    lp, ent, g = grads_of(lambda: shared_prefix_logprobs(model, ids, mask, c_width, temperature, compute_entropy=True))
    assert torch.allclose(lp, lp_ref, atol=1e-5)
    assert torch.allclose(ent, ent_ref, atol=1e-5)
    assert g.keys() == g_ref.keys() and any(v.abs().sum() > 0 for v in g.values())
    for name in g:
        assert torch.allclose(g[name], g_ref[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.slow
def test_a_grpo_step_on_the_fast_path_logs_trls_loss_and_entropy(nano, tmp_path):
    from transformers import TrainerCallback

    from trace_train.train.grpo import TrainConfig, train

    class Logs(TrainerCallback):
        def __init__(self):
            self.rows = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "entropy" in logs:
                self.rows.append(logs)

    logged = {}
    for loss_forward in ("shared_prefix", "trl"):
        cb = Logs()
        train(TrainConfig(env_ids=[ENV], env_kwargs={"difficulty": 1}, model=nano,
                          output_dir=str(tmp_path / loss_forward), max_steps=1, group_size=2, groups_per_step=2,
                          learning_rate=1e-3, calibration_groups=0, save_steps=10, lora_r=4, lora_alpha=8,
                          max_turn_tokens=24, max_tool_calling_iterations=2, decode="fast",
                          loss_forward=loss_forward, progress=False, plot=False), callbacks=[cb])
        logged[loss_forward] = cb.rows[-1]
    fast, trl = logged["shared_prefix"], logged["trl"]
    assert fast["completions/mean_length"] == trl["completions/mean_length"]  # the same sampled episodes
    assert fast["entropy"] > 0
    for key in ("entropy", "loss", "grad_norm"):
        assert fast[key] == pytest.approx(trl[key], rel=1e-3, abs=1e-5), key
