"""``trace train`` / ``trace_train.train.grpo``: GRPO of a LoRA adapter on a capability env, on CPU.

The base is the nano Qwen3 given a short SFT warm-up (the bootstrap's own code) on one oracle episode of
the capability env at difficulty 1, so that its rollouts on another seed are sometimes partly right
(informative groups: GRPO has a gradient). Then:

* a run of GRPO writes a PEFT adapter that ``PeftModel.from_pretrained`` loads and that changes the
  model's outputs, a per-step CSV (TRL's ``frac_reward_zero_std`` among its columns), the reward curve
  and the calibration of the base;
* a run interrupted after step 2 and resumed ends at the configured step count with the same optimizer
  state (and step count) as the uninterrupted run's checkpoint at that step;
* bad config values fail before any model loads, naming the field and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ENV = "trace/precondition_verification-v0"
#: The warm-up episode's seed, and the training seed (a task the model never saw).
WARM_SEED, TRAIN_SEED = 7, 8
STEPS = 3


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory) -> str:
    from trace_train.tiny.bootstrap import BootstrapConfig, bootstrap_model
    from trace_train.tiny.build import build_model

    base = build_model("nano", out=tmp_path_factory.getbasetemp() / "nano-pv", env_ids=[ENV], corpus_seeds=4)
    result = bootstrap_model(BootstrapConfig(
        target=ENV, base=str(base.path), out=str(tmp_path_factory.mktemp("warm") / "model"), train_seeds=1,
        seed_offset=WARM_SEED, steps=150, lr=1e-2, batch_size=1, warmup_steps=3, env_kwargs={"difficulty": 1}),
        progress=False)
    return str(result.path)


def _config(model: str, out: Path, **kw):
    from trace_train.train.grpo import TrainConfig

    settings = dict(env_ids=[ENV], env_kwargs={"difficulty": 1}, model=model, output_dir=str(out), max_steps=STEPS,
                    group_size=4, groups_per_step=1, learning_rate=2e-3, seed_offset=TRAIN_SEED, num_seeds=1,
                    eval_seeds=[100, 200], calibration_groups=0, save_steps=1, lora_r=4, lora_alpha=8,
                    max_turn_tokens=96, max_tool_calling_iterations=10, resample_attempts=1, progress=False)
    settings.update(kw)
    return TrainConfig(**settings)


@pytest.fixture(scope="module")
def reference_run(warm_model, tmp_path_factory):
    from trace_train.train.grpo import train

    out = tmp_path_factory.mktemp("grpo-ref")
    return train(_config(warm_model, out, calibration_groups=1))


@pytest.mark.slow
def test_run_writes_an_adapter_that_changes_the_model(warm_model, reference_run):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from trace_train.train.grpo import read_log

    result = reference_run
    assert result.steps == STEPS
    assert (result.adapter_dir / "adapter_config.json").exists()
    assert (result.adapter_dir / "adapter_model.safetensors").exists()
    rows = read_log(result.log_csv)
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    assert all(r["frac_reward_zero_std"] is not None and 0 <= r["frac_reward_zero_std"] <= 1 for r in rows)
    assert all(r["episodes"] >= 4 and r["generation_s"] > 0 and r["step_s"] > 0 for r in rows)
    assert result.rollouts == sum(int(r["episodes"]) for r in rows)
    # Some step had a group whose rewards differed: the adapter got a gradient.
    assert any(r["frac_reward_zero_std"] < 1 for r in rows), rows
    assert result.curve_png is not None and result.curve_png.stat().st_size > 0
    report = result.calibration[ENV]
    assert report["groups"] == 1 and report["group_size"] == 4 and 0 <= report["informative"] <= 1

    base = AutoModelForCausalLM.from_pretrained(warm_model, dtype=torch.float32).eval()
    ids = torch.arange(10, 60).unsqueeze(0)
    with torch.no_grad():
        before = base(input_ids=ids).logits.clone()
        tuned = PeftModel.from_pretrained(base, str(result.adapter_dir)).eval()
        after = tuned(input_ids=ids).logits
    assert (after - before).abs().max().item() > 1e-4
    meta = json.loads((result.adapter_dir / "trace_adapter.json").read_text())
    assert meta["base_model"] == warm_model and meta["env_ids"] == [ENV]


class _Interrupt(Exception):
    pass


@pytest.mark.slow
def test_interrupted_run_resumes_to_the_same_optimizer_state(warm_model, reference_run, tmp_path):
    import torch
    from transformers import TrainerCallback

    from trace_train.train.grpo import read_log, train

    class StopAfterStep2(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 2:
                raise _Interrupt

    cfg = _config(warm_model, tmp_path)
    with pytest.raises(_Interrupt):
        train(cfg, callbacks=[StopAfterStep2()])
    assert not (tmp_path / "checkpoints" / f"checkpoint-{STEPS}").exists()
    cfg.resume = True
    result = train(cfg)
    assert result.steps == STEPS
    assert [int(r["step"]) for r in read_log(result.log_csv)] == list(range(1, STEPS + 1))

    mine = tmp_path / "checkpoints" / f"checkpoint-{STEPS}"
    theirs = reference_run.output_dir / "checkpoints" / f"checkpoint-{STEPS}"
    assert json.loads((mine / "trainer_state.json").read_text())["global_step"] == STEPS
    a = torch.load(mine / "optimizer.pt", weights_only=True)
    b = torch.load(theirs / "optimizer.pt", weights_only=True)
    assert a["state"].keys() == b["state"].keys() and a["state"]
    for key in a["state"]:
        assert a["state"][key]["step"] == b["state"][key]["step"] == STEPS
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(a["state"][key][name], b["state"][key][name], rtol=1e-5, atol=1e-9), (key, name)
    # Some moment is non-zero: the comparison is of an optimizer that moved.
    assert any(a["state"][k]["exp_avg"].abs().max() > 0 for k in a["state"])


# ----------------------------------------------------------------------------- bad configs


@pytest.mark.parametrize("field, value, fix", [
    ("group_size", 1, "at least 2"),
    ("hint_share", 1.5, "share in [0, 1)"),
    ("loss_type", "ppo", "choose one of"),
    ("temperature", 0.0, "value > 0"),
    ("seed_offset", 10, "overlap the evaluation seeds"),
    ("use_vllm", True, "rollout: trl"),
    ("epsilon_high", 0.1, ">= epsilon"),
])
def test_bad_values_name_the_field_and_the_fix(field, value, fix, tmp_path):
    from trace_train.train.grpo import ConfigError, TrainConfig

    with pytest.raises(ConfigError) as err:
        TrainConfig(env_ids=[ENV], model="m", output_dir=str(tmp_path), **{field: value})
    assert f"TrainConfig.{field}" in str(err.value) and fix in str(err.value)


def test_bad_config_fails_before_any_model_loads(tmp_path, monkeypatch):
    import transformers

    from trace_train.train.grpo import ConfigError, TrainConfig, train

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_loading)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", no_loading)
    model = tmp_path / "model"
    model.mkdir()
    yaml_file = tmp_path / "train.yaml"
    yaml_file.write_text(f"env_id: {ENV}\nmodel: {model}\noutput_dir: {tmp_path / 'out'}\ngroup_sise: 4\n")
    with pytest.raises(ConfigError, match="unknown TrainConfig field 'group_sise' \\(did you mean group_size"):
        TrainConfig.from_yaml(yaml_file)
    yaml_file.write_text(f"env_id: {ENV}\nmodel: {model}\noutput_dir: {tmp_path / 'out'}\n"
                         "trl_args: {num_generation: 4}\n")
    cfg = TrainConfig.from_yaml(yaml_file, max_steps=2)
    assert cfg.env_ids == [ENV] and cfg.max_steps == 2
    with pytest.raises(ConfigError, match="trl_args has 'num_generation'.*num_generations"):
        train(cfg)
    with pytest.raises(ConfigError, match="not registered"):
        train(TrainConfig(env_ids=["trace/no_such_env-v0"], model=str(model), output_dir=str(tmp_path / "o")))
    with pytest.raises(ConfigError, match="device = 'cuda', but torch sees no CUDA"):
        train(TrainConfig(env_ids=[ENV], model=str(model), output_dir=str(tmp_path / "o"), device="cuda"))
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


def test_cli_reports_a_bad_value_in_one_line(tmp_path, capsys):
    from trace_train.cli import main

    code = main(["train", "--env", ENV, "--model", str(tmp_path), "--out", str(tmp_path / "o"),
                 "--group-size", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "TrainConfig.group_size = 1" in err and "Traceback" not in err


def test_resume_skips_a_checkpoint_whose_save_did_not_finish(tmp_path):
    """A run killed in the middle of a save leaves a newer ``checkpoint-N`` without ``trainer_state.json`` (the
    Trainer writes it last); resuming takes the newest finished one, by step number, not by name."""
    from trace_train.train.grpo import last_complete_checkpoint

    assert last_complete_checkpoint(tmp_path) is None
    for step, finished in ((2, True), (9, True), (10, True), (12, False)):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(b"")
        if finished:
            (folder / "trainer_state.json").write_text('{"global_step": %d}' % step)
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    (tmp_path / "checkpoint-10" / "trainer_state.json").unlink()
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-9")
