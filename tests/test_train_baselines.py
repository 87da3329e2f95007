"""The consolidation baselines of ``trace train``: one adapter on a mixture of envs, and ``--sft``.

* ``trace train --env A --env B`` (multi-capability GRPO) plays both envs in its steps and writes one
  adapter; the per-step log has each env's mean reward.
* ``trace train --sft --env A --env B`` trains a LoRA on both envs' oracle episodes with the bootstrap's
  SFT code; the adapter loads with ``PeftModel.from_pretrained`` and changes the model's outputs.
* ``sft_warmup_steps``: GRPO trains on from the LoRA that SFT on the oracle episodes fitted first.
"""

from __future__ import annotations

import json

import pytest

ENVS = ["trace/precondition_verification-v0", "trace/multi_step_completion-v0"]


@pytest.fixture(scope="module")
def nano(tmp_path_factory) -> str:
    from trace_train.tiny.build import build_model

    return str(build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-caps", env_ids=ENVS,
                           corpus_seeds=2).path)


def _changes_outputs(base: str, adapter: str) -> float:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    ids = torch.arange(10, 50).unsqueeze(0)
    with torch.no_grad():
        before = model(input_ids=ids).logits.clone()
        after = PeftModel.from_pretrained(model, adapter).eval()(input_ids=ids).logits
    return (after - before).abs().max().item()


@pytest.mark.slow
def test_multi_capability_grpo_plays_every_env(nano, tmp_path, capsys):
    from trace_train.cli import main
    from trace_train.train.grpo import read_log

    out = tmp_path / "multi"
    code = main(["train", *[a for e in ENVS for a in ("--env", e)], "--model", nano, "--out", str(out),
                 "--steps", "1", "--group-size", "2", "--groups-per-step", "2", "--difficulty", "1",
                 "--calibration-groups", "0", "--no-progress", "--set", "num_seeds=1", "--set", "max_turn_tokens=16",
                 "--set", "max_tool_calling_iterations=2", "--set", "lora_r=2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    rows = read_log(out / "train_log.csv")
    assert len(rows) == 1 and rows[0]["episodes"] == 4
    assert sorted(rows[0]["reward_by_env"]) == sorted(ENVS)
    assert (out / "adapter" / "adapter_config.json").exists()
    meta = json.loads((out / "adapter" / "trace_adapter.json").read_text())
    assert meta["env_ids"] == ENVS and all(meta["env_kwargs"][e]["difficulty"] == 1 for e in ENVS)
    assert str(out / "adapter") in printed


def test_sft_baseline_trains_a_lora_on_the_oracle_episodes(nano, tmp_path):
    from trace_train.train.grpo import TrainConfig, train

    cfg = TrainConfig(env_ids=ENVS, env_kwargs={"difficulty": 1}, model=nano, output_dir=str(tmp_path / "sft"),
                      sft=True, sft_episodes=2, sft_steps=6, sft_batch_size=2, sft_lr=1e-2, lora_r=4, lora_alpha=8,
                      progress=False)
    result = train(cfg)
    assert result.steps == 6 and result.rollouts == 4  # 2 oracle episodes of each env
    assert (result.adapter_dir / "adapter_config.json").exists()
    assert _changes_outputs(nano, str(result.adapter_dir)) > 1e-4
    meta = json.loads((result.adapter_dir / "trace_adapter.json").read_text())
    assert meta["method"] == "sft" and meta["env_ids"] == ENVS
    assert meta["bootstrap"]["mixture"][ENVS[1]]["episodes"] == 2
    losses = [float(line.split(",")[1]) for line in result.log_csv.read_text().splitlines()[1:]]
    assert len(losses) == 6 and losses[-1] < losses[0]


def _lora_weights(adapter) -> dict:
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))


def test_sft_warmup_fits_the_lora_that_grpo_then_trains(nano, tmp_path):
    """``sft_warmup_steps``: GRPO starts from the LoRA the SFT warm-up fitted, not from a fresh one (whose B is
    zero, so it would not change the outputs). At a learning rate of 1e-12 GRPO's one step leaves the warm-up's
    weights as they were; the warm-up is fitted once and reused by a second run in the same folder."""
    import torch

    from trace_train.train.grpo import TrainConfig, train

    cfg = dict(env_ids=ENVS[:1], env_kwargs={"difficulty": 1}, model=nano, output_dir=str(tmp_path / "warm"),
               sft_warmup_steps=4, sft_episodes=2, sft_batch_size=2, sft_lr=1e-2, lora_r=4, lora_alpha=8,
               max_steps=1, group_size=2, groups_per_step=1, learning_rate=1e-12, calibration_groups=0,
               num_seeds=1, max_turn_tokens=16, max_tool_calling_iterations=2, progress=False, plot=False)
    result = train(TrainConfig(**cfg))
    warm = TrainConfig(**cfg).warmup_dir
    assert json.loads((warm / "done.json").read_text())["steps"] == 4
    before, after = _lora_weights(warm / "adapter"), _lora_weights(result.adapter_dir)
    assert before.keys() == after.keys() and any(k.endswith("lora_B.weight") for k in before)
    assert all(torch.allclose(before[k], after[k], atol=1e-6) for k in before)
    assert any(before[k].abs().max() > 0 for k in before if k.endswith("lora_B.weight"))
    assert _changes_outputs(nano, str(result.adapter_dir)) > 1e-4
    meta = json.loads((result.adapter_dir / "trace_adapter.json").read_text())
    assert meta["method"] == "grpo" and meta["sft_warmup_steps"] == 4 and result.steps == 1
    assert result.rollouts == 2 + 2  # the warm-up's 2 oracle episodes and GRPO's one group of 2

    stamp = (warm / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns
    train(TrainConfig(**cfg))  # the same folder again: the finished warm-up is reused, not refitted
    assert (warm / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns == stamp
    train(TrainConfig(**{**cfg, "sft_lr": 2e-2}))  # other warm-up settings: fitted again
    assert (warm / "adapter" / "adapter_model.safetensors").stat().st_mtime_ns != stamp
    assert json.loads((warm / "done.json").read_text())["settings"]["sft_lr"] == 2e-2


def test_sft_warmup_is_checked():
    from trace_train.train.grpo import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match="sft_warmup_steps.*sft_steps"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft=True, sft_warmup_steps=5)
    with pytest.raises(ConfigError, match="sft_warmup_steps"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_warmup_steps=-1)
    for bad in (0.5, True, "10"):
        with pytest.raises(ConfigError, match="sft_turn_head_weight"):
            TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_turn_head_weight=bad)


def test_the_turn_head_weight_reaches_the_sft_code(tmp_path, monkeypatch):
    """``sft_turn_head_weight`` reaches the SFT code the baseline and GRPO's warm-up share (fit_sft_lora, then
    bootstrap_model's config); unset, the loss stays the plain token mean (weight 1)."""
    from trace_train.tiny import bootstrap
    from trace_train.train import grpo
    from trace_train.train.grpo import TrainConfig
    from trace_train.train.sft import fit_sft_lora

    seen = []

    def fake_bootstrap(cfg, progress=True, **hooks):  # records the config; the real one is exercised in test_models.py
        seen.append(cfg)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bootstrap, "bootstrap_model", fake_bootstrap)
    cfg = TrainConfig(env_ids=ENVS[:1], model="m", output_dir=str(tmp_path), sft_warmup_steps=3,
                      sft_turn_head_weight=10)
    with pytest.raises(RuntimeError, match="stop here"):
        fit_sft_lora(cfg, {ENVS[0]: {}}, "cpu", tmp_path / "a", 3)
    assert seen[-1].turn_head_weight == 10.0 and seen[-1].turn_head_tokens == 8
    with pytest.raises(RuntimeError, match="stop here"):
        grpo.sft_warmup(cfg, {ENVS[0]: {}}, "cpu")
    with pytest.raises(RuntimeError, match="stop here"):
        grpo.sft_warmup(TrainConfig(env_ids=ENVS[:1], model="m", output_dir=str(tmp_path), sft_warmup_steps=3),
                        {ENVS[0]: {}}, "cpu")
    assert [c.turn_head_weight for c in seen] == [10.0, 10.0, 1.0]


def test_the_warmups_own_env_kwargs_reach_its_episodes_and_not_grpos(tmp_path, monkeypatch):
    """``sft_warmup_env_kwargs`` (e.g. a decision-blind warm-up's ``{size: {blind_cabin_prob: 0.5}}``) reach the
    warm-up's oracle episodes, its first env's and the mixture's, with ``size`` merged key by key into the run's;
    they key the warm-up (another value fits it again); the SFT baseline and GRPO's own kwargs keep the run's; and
    they need a warm-up."""
    from trace_train.tiny import bootstrap
    from trace_train.train import grpo
    from trace_train.train.grpo import ConfigError, TrainConfig

    seen = []

    def fake_bootstrap(cfg, progress=True, **hooks):
        seen.append(cfg)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bootstrap, "bootstrap_model", fake_bootstrap)
    run_size = {"read_back": True, "cancel_grounds": ["business"]}
    cfg = TrainConfig(env_ids=ENVS, model="m", output_dir=str(tmp_path), sft_warmup_steps=3,
                      env_kwargs={"size": run_size}, sft_warmup_env_kwargs={"size": {"blind_cabin_prob": 0.5}})
    kwargs = {e: {"size": dict(run_size), "difficulty": 3} for e in ENVS}
    with pytest.raises(RuntimeError, match="stop here"):
        grpo.sft_warmup(cfg, kwargs, "cpu")
    blind = {**run_size, "blind_cabin_prob": 0.5}
    assert seen[-1].env_kwargs == {"size": blind, "difficulty": 3}
    assert seen[-1].mixture_env_kwargs == {"size": blind}
    assert kwargs[ENVS[0]]["size"] == run_size  # GRPO's kwargs untouched

    from types import SimpleNamespace

    fits = []
    monkeypatch.setattr("trace_train.train.sft.fit_sft_lora",
                        lambda *a, **k: fits.append(1) or SimpleNamespace(examples=2, losses=[0.5]))
    cfg.warmup_dir.mkdir(parents=True)
    grpo.sft_warmup(cfg, kwargs, "cpu")
    grpo.sft_warmup(cfg, kwargs, "cpu")
    assert len(fits) == 1 and "blind_cabin_prob" in (cfg.warmup_dir / "done.json").read_text()
    other = TrainConfig(env_ids=ENVS, model="m", output_dir=str(tmp_path), sft_warmup_steps=3,
                        env_kwargs={"size": run_size}, sft_warmup_env_kwargs={"size": {"blind_cabin_prob": 0.25}})
    grpo.sft_warmup(other, kwargs, "cpu")
    assert len(fits) == 2
    for bad in ({"size": 0.5}, ["size"]):
        with pytest.raises(ConfigError, match="sft_warmup_env_kwargs"):
            TrainConfig(env_ids=ENVS, model="m", output_dir="o", sft_warmup_steps=3, sft_warmup_env_kwargs=bad)
    with pytest.raises(ConfigError, match="sft_warmup_env_kwargs.*sft_warmup_steps"):
        TrainConfig(env_ids=ENVS, model="m", output_dir="o", sft_warmup_env_kwargs={"size": {"x": 1}})


def test_replay_reaches_the_sft_code_and_keys_the_warmup(tmp_path, monkeypatch):
    """``sft_replay`` / ``sft_replay_share`` reach the bootstrap config of the SFT fits; a finished warm-up is
    reused only while the replayed file's content is the same (it is part of the warm-up's settings)."""
    from trace_train.tiny import bootstrap
    from trace_train.train import grpo
    from trace_train.train.grpo import ConfigError, TrainConfig
    from trace_train.train.sft import fit_sft_lora

    seen = []

    def fake_bootstrap(cfg, progress=True, **hooks):
        seen.append(cfg)
        raise RuntimeError("stop here")

    monkeypatch.setattr(bootstrap, "bootstrap_model", fake_bootstrap)
    replay = tmp_path / "base.jsonl"
    replay.write_text('{"scenario": "info", "messages": []}\n')
    cfg = TrainConfig(env_ids=ENVS[:1], model="m", output_dir=str(tmp_path), sft_warmup_steps=3,
                      sft_replay=str(replay), sft_replay_share=0.3)
    with pytest.raises(RuntimeError, match="stop here"):
        fit_sft_lora(cfg, {ENVS[0]: {}}, "cpu", tmp_path / "a", 3)
    assert seen[-1].replay == str(replay) and seen[-1].replay_share == 0.3
    with pytest.raises(RuntimeError, match="stop here"):
        fit_sft_lora(TrainConfig(env_ids=ENVS[:1], model="m", output_dir=str(tmp_path), sft_warmup_steps=3,
                                 sft_replay=str(replay)), {ENVS[0]: {}}, "cpu", tmp_path / "a", 3)
    assert seen[-1].replay is None and seen[-1].replay_share == 0.0  # a file alone replays nothing

    # a finished warm-up with this replay is reused; another content of the file is fitted again
    from types import SimpleNamespace

    fits = []
    monkeypatch.setattr("trace_train.train.sft.fit_sft_lora",
                        lambda *a, **k: fits.append(1) or SimpleNamespace(examples=2, losses=[0.5]))
    cfg.warmup_dir.mkdir(parents=True)
    grpo.sft_warmup(cfg, {ENVS[0]: {}}, "cpu")
    grpo.sft_warmup(cfg, {ENVS[0]: {}}, "cpu")
    assert len(fits) == 1
    replay.write_text('{"scenario": "flight_status", "messages": []}\n')
    grpo.sft_warmup(cfg, {ENVS[0]: {}}, "cpu")
    assert len(fits) == 2

    with pytest.raises(ConfigError, match="sft_replay"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_replay_share=0.3)
    with pytest.raises(ConfigError, match="sft_replay"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_replay=str(tmp_path / "nope.jsonl"))
    for bad in (1.0, -0.5, True):
        with pytest.raises(ConfigError, match="sft_replay_share"):
            TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_replay=str(replay), sft_replay_share=bad)


def _oracle_file(path, env_id: str, seeds) -> None:
    """A trajectories file of ``env_id``'s oracle episodes, labelled with their scenarios as a rollout's are
    (standing in for a base's own rollouts)."""
    from trace_train.tiny.sft_data import oracle_trajectories

    records, _ = oracle_trajectories(env_id, seeds, env_kwargs={"difficulty": 1, "prompt": "compact"})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _replay_nll_of(model_dir: str, adapter, rows) -> float:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trace_train.train.replay import replay_nll

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.no_grad():
        return float(replay_nll(model.eval(), rows, 0, "cpu"))


@pytest.mark.slow
def test_grpo_replay_term_pulls_the_adapter_toward_the_replayed_episodes(nano, tmp_path):
    """``grpo_replay_weight``: every GRPO step adds the NLL of replayed episodes (another env's, so of families
    the trained env never draws) to the loss. Sampled near-greedily, a group's two rollouts are the same episode, so
    GRPO's own advantages are zero and its term moves nothing: without replay the adapter stays the base; with it
    the replayed episodes' NLL falls.
    The log, ``replay.json`` and ``trace_adapter.json`` say what was replayed."""
    from transformers import AutoTokenizer

    from trace_train.train.grpo import TrainConfig, read_log, train
    from trace_train.train.replay import REPLAY_MAX_LENGTH, drawn_families, replay_batches

    replay = tmp_path / "base.jsonl"
    _oracle_file(replay, "trace/structured_data_reasoning-v0", range(3))
    cfg = dict(env_ids=ENVS[:1], env_kwargs={"difficulty": 1}, model=nano, max_steps=3, group_size=2,
               groups_per_step=1, learning_rate=5e-3, temperature=1e-3, calibration_groups=0, num_seeds=1,
               max_turn_tokens=8, max_tool_calling_iterations=2, progress=False, plot=False, sft_replay=str(replay))
    plain = train(TrainConfig(**cfg, output_dir=str(tmp_path / "plain")))
    held = train(TrainConfig(**cfg, output_dir=str(tmp_path / "held"), grpo_replay_weight=5.0, grpo_replay_batch=2))
    assert [r["reward_std"] for r in read_log(plain.log_csv)] == [0.0] * 3  # no signal of GRPO's own

    tokenizer = AutoTokenizer.from_pretrained(nano)
    drawn = drawn_families(ENVS[:1], {ENVS[0]: {"difficulty": 1}}, 0, seeds=4)
    rows = replay_batches(str(replay), drawn, tokenizer, 3, REPLAY_MAX_LENGTH).rows
    assert len(rows) == 3
    base_nll = _replay_nll_of(nano, None, rows)
    assert abs(_replay_nll_of(nano, plain.adapter_dir, rows) - base_nll) < 1e-4
    assert _replay_nll_of(nano, held.adapter_dir, rows) < base_nll - 0.05

    logged = [r["replay_nll"] for r in read_log(held.log_csv)]
    assert len(logged) == 3 and all(v is not None and v > 0 for v in logged)
    assert all(r["replay_nll"] is None for r in read_log(plain.log_csv))
    summary = json.loads((tmp_path / "held" / "replay.json").read_text())
    assert summary["episodes_kept"] == summary["rows"] == 3
    meta = json.loads((held.adapter_dir / "trace_adapter.json").read_text())
    assert meta["grpo_replay"]["weight"] == 5.0 and meta["grpo_replay"]["rows"] == 3
    assert json.loads((plain.adapter_dir / "trace_adapter.json").read_text())["grpo_replay"] is None


def test_grpo_replay_serves_every_episode_once_per_epoch_and_is_checked(tmp_path):
    """The replayed rows come ``batch`` at a time, each once per epoch in a seeded order; bad settings fail with
    the field's name."""
    from trace_train.train.grpo import ConfigError, TrainConfig
    from trace_train.train.replay import ReplayBatches

    rows = [([i], [i]) for i in range(5)]

    def served(seed: int, calls: int) -> list[int]:
        batches = ReplayBatches(rows=rows, batch=2, seed=seed)
        return [r[0][0] for _ in range(calls) for r in batches.next()]

    drawn = served(7, 5)
    assert sorted(drawn[:5]) == [0, 1, 2, 3, 4] and sorted(drawn[5:10]) == [0, 1, 2, 3, 4]
    assert served(7, 5) == drawn and served(8, 5) != drawn  # the seed fixes the order
    assert len(ReplayBatches(rows=rows[:1], batch=4).next()) == 1

    replay = tmp_path / "base.jsonl"
    replay.write_text("{}\n")
    with pytest.raises(ConfigError, match="sft_replay"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", grpo_replay_weight=1.0)
    for bad in (-1.0, True, "1"):
        with pytest.raises(ConfigError, match="grpo_replay_weight"):
            TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_replay=str(replay), grpo_replay_weight=bad)
    with pytest.raises(ConfigError, match="grpo_replay_batch"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_replay=str(replay), grpo_replay_weight=1.0,
                    grpo_replay_batch=0)
    with pytest.raises(ConfigError, match="grpo_replay_weight"):
        TrainConfig(env_ids=ENVS[:1], model="m", output_dir="o", sft_replay=str(replay), grpo_replay_weight=1.0,
                    sft=True)


def test_calibration_warns_with_the_figures_and_the_knob(nano, tmp_path, caplog):
    """A random base is never right: the calibration before training says so, with what to turn."""
    import logging

    from trace_train.train.grpo import TrainConfig, calibrate, env_kwargs_for

    cfg = TrainConfig(env_ids=ENVS[:1], env_kwargs={"difficulty": 1}, model=nano, output_dir=str(tmp_path),
                      group_size=2, calibration_groups=1, max_turn_tokens=8, max_tool_calling_iterations=2,
                      progress=False)
    with caplog.at_level(logging.WARNING, logger="trace_train.train"):
        report = calibrate(cfg, {ENVS[0]: env_kwargs_for(cfg, ENVS[0])}, "cpu")
    assert report[ENVS[0]]["informative"] == 0.0 and report[ENVS[0]]["groups"] == 1
    message = caplog.text
    assert "only 0% of 1 groups are informative" in message and "mean reward" in message
    assert "difficulty" in message and "temperature" in message and "--mix" in message


def test_bootstrap_mix_flag_is_checked(capsys):
    from trace_train.cli import main

    assert main(["model", "bootstrap", "--target", ENVS[0], "--mix", "no-share"]) == 2
    assert "ENV=SHARE" in capsys.readouterr().err
    assert main(["model", "bootstrap", "--target", ENVS[0], "--mix", "trace/nope-v0=0.1"]) == 2


def _random_lora(base: str, folder, seed: int, r: int = 4) -> str:
    """A LoRA on q/k/v/o over ``base`` with random B matrices (a trained-like adapter), saved in ``folder``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), LoraConfig(
        r=r, lora_alpha=2 * r, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.save_pretrained(str(folder))
    return str(folder)


def test_a_lora_trained_over_the_merged_warm_up_folds_onto_the_base(nano, tmp_path):
    """``sft_warmup_lora: fresh`` trains a LoRA over the warm-up merged into the weights; folded with the warm-up's
    (ranks concatenated), one LoRA on the base gives the same logits as the merged model with the new LoRA, and
    differs from either LoRA alone."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trace_train.train.fold import fold_onto_base, merged_warmup

    warm = _random_lora(nano, tmp_path / "warm", seed=1)
    merged_dir = tmp_path / "merged"
    merged_warmup(AutoModelForCausalLM.from_pretrained(nano, dtype=torch.float32), warm).save_pretrained(merged_dir)
    delta = _random_lora(str(merged_dir), tmp_path / "delta", seed=2, r=2)
    folded = fold_onto_base(nano, warm, delta, tmp_path / "folded")
    assert json.loads((folded / "adapter_config.json").read_text())["r"] == 4 + 2

    ids = torch.arange(10, 60).unsqueeze(0)

    def logits(model_dir, adapter):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        with torch.no_grad():
            return PeftModel.from_pretrained(model, str(adapter)).eval()(input_ids=ids).logits

    want = logits(merged_dir, delta)
    got = logits(nano, folded)
    assert (got - want).abs().max().item() < 1e-4
    assert (got - logits(nano, warm)).abs().max().item() > 1e-3  # the delta is in it
    with pytest.raises(ValueError, match="other modules"):
        fold_onto_base(nano, warm, _random_lora_on(nano, tmp_path / "mlp"), tmp_path / "bad")


def _random_lora_on(base: str, folder) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(
        r=2, target_modules=["up_proj"], task_type="CAUSAL_LM"))
    model.save_pretrained(str(folder))
    return str(folder)


def test_grpo_over_a_merged_warm_up_saves_adapters_on_the_base(nano, tmp_path):
    """``sft_warmup_lora: fresh`` end to end: the final ``adapter/`` is the folded LoRA (the warm-up's rank plus
    GRPO's), its delta in ``adapter_over_warmup/``; each checkpoint keeps its delta (what a resumed run loads) and
    gets ``on_base/``, which checkpoint selection reads; a checkpoint a killed run left unfolded is folded on
    resume."""
    import shutil

    from trace_train.train.grpo import TrainConfig, train
    from trace_train.train.select import checkpoints

    cfg = dict(env_ids=ENVS[:1], env_kwargs={"difficulty": 1}, model=nano, output_dir=str(tmp_path / "fresh"),
               sft_warmup_steps=4, sft_warmup_lora="fresh", sft_episodes=2, sft_batch_size=2, sft_lr=1e-2,
               lora_r=4, lora_alpha=8, max_steps=2, save_steps=1, group_size=2, groups_per_step=1,
               learning_rate=1e-3, calibration_groups=0, num_seeds=2, max_turn_tokens=16,
               max_tool_calling_iterations=2, progress=False, plot=False)
    result = train(TrainConfig(**cfg))
    run = tmp_path / "fresh"
    assert json.loads((result.adapter_dir / "adapter_config.json").read_text())["r"] == 4 + 4
    assert json.loads((run / "adapter_over_warmup" / "adapter_config.json").read_text())["r"] == 4
    meta = json.loads((result.adapter_dir / "trace_adapter.json").read_text())
    assert meta["sft_warmup_lora"] == "fresh" and meta["sft_warmup_steps"] == 4
    found = checkpoints(run / "checkpoints")
    assert [s for s, _ in found] == [1, 2] and all(p.name == "on_base" for _, p in found)
    assert _changes_outputs(nano, str(found[0][1])) > 1e-4  # the warm-up is in every folded checkpoint

    shutil.rmtree(run / "checkpoints" / "checkpoint-2" / "on_base")  # killed between the save and the fold
    train(TrainConfig(**{**cfg, "max_steps": 3, "resume": True}))
    found = checkpoints(run / "checkpoints")
    assert [s for s, _ in found] == [1, 2, 3] and all(p.name == "on_base" for _, p in found)
    with pytest.raises(Exception, match="sft_warmup_lora"):
        TrainConfig(**{**cfg, "sft_warmup_lora": "merge"})


def test_the_warm_up_says_which_envs_its_kwargs_changed():
    """``overlay_changed``: on fixed seeds, the oracle episodes with the warm-up's kwargs laid on against the env's
    own. A decision-blind overlay changes cancellations and leaves flight-status requests as they were (the report's
    L1 then reads such an env's warm-up as SFT on its own episodes)."""
    from trace_train.train.grpo import OVERLAY_CHECK_SEEDS, overlay_changed

    size = {"read_back": True, "cancel_grounds": ["business"], "refusal_prob": 0.5, "ask_details_prob": 1.0}
    own = {"trace/tau_airline-v0": {"scenarios": ["cancel"], "size": size}}
    changed = overlay_changed(own, {"size": {"blind_cabin_prob": 0.5}})["trace/tau_airline-v0"]
    assert changed[1] == len(OVERLAY_CHECK_SEEDS) and changed[0] > 0
    own = {"trace/tau_airline-v0": {"scenarios": ["flight_status"], "size": size}}
    assert overlay_changed(own, {"size": {"blind_cabin_prob": 0.5}}) == {
        "trace/tau_airline-v0": [0, len(OVERLAY_CHECK_SEEDS)]}
