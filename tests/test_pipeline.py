"""`trace run`: the config (errors name the key and the fix), the plan, and the stage bookkeeping
(stages.json, resume, --from) on the first stages of a real run with a scripted base agent."""

from __future__ import annotations

import dataclasses
import json

import pytest

from trace_train.cli import main
from trace_train.pipeline.config import SECTIONS, ConfigError, config_from_dict, embedded_default, load_config

SCRIPTED = {"kind": "scripted", "agent": "tau:noisy",
            "agent_kwargs": {"p": 0.7, "capabilities": ["multi_step_completion", "tool_calling_precision"]}}


def _write(tmp_path, text: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, expected", [
    ("train: {max_step: 3}", "train.max_step: unknown key; did you mean max_steps?"),
    ("evaluate: {seeds: many}", "evaluate.seeds: 'many' is not a count"),
    ("rollout: {samples: two}", "rollout.samples must be int"),
    ("base: {kind: hf}", "base.model is required with base.kind: hf"),
    ("base: {kind: gpt}", "base.kind: 'gpt' is not one of tiny, hf, openai, scripted"),
    ("base: {kind: openai, model: m}", "train.model is required with base.kind: openai"),
    ("rollout: {seeds: '0:50'}\nevaluate: {seeds: '40:60'}", "evaluate.seeds and rollout.seeds share 10 seeds"),
    ("evaluate: {ks: [1, 4]}", "evaluate.ks has k=4 > evaluate.samples=1"),
    ("[1, 2]", "the config must be a mapping"),
    ("compose: {options: {train: {lr: 0.01, epoch: 4}}}", "compose.options.train: unknown router training setting(s) "
                                                          "['epoch']; known: accumulate, epochs"),
    ("compose: {options: {train: {epochs: 0}}}", "compose.options.train: epochs must be >= 1"),
    ("compose: {options: {gate_input: pooled}}", "compose.options.gate_input: 'pooled' is not one of token, context"),
    ("train: {select_seeds: '100:150'}", "train.select_seeds chooses among saved checkpoints: set "
                                         "train.options.save_steps"),
    ("train: {select_seeds: '0:20', options: {save_steps: 5}}\nevaluate: {env_seeds: '10:50'}",
     "train.select_seeds and evaluate.env_seeds share 10 seeds"),
    ("train: {select_seeds: '100:150', select_every: 0, options: {save_steps: 5}}", "train.select_every"),
    ("compose: {router_data: selected}", "compose.router_data: selected trains the router on checkpoint selection"),
    ("compose: {router_data: mine}", "compose.router_data: 'mine' is not one of oracle, selected"),
    ("generate: {focus_share: 1.5}", "generate.focus_share must be a number in [0, 1]"),
    ("generate: {focus_share: 1.0, llm_url: 'http://x', llm_model: m}", "generate.focus_share is the offline"),
    ("compose: {drop_unimproved: true}", "compose.drop_unimproved reads checkpoint selection's validation curves"),
    ("compose: {drop_unimproved: 'yes'}", "compose.drop_unimproved must be bool, got 'yes'"),
    ("compose: {options: {gate_weight: half}}", "compose.options.gate_weight: 'half' is not one of prob, one"),
    ("compose: {options: {routing: per_episode}}",
     "compose.options.routing: 'per_episode' is not one of token, segment"),
])
def test_a_bad_config_names_the_key_and_the_fix(tmp_path, text, expected):
    with pytest.raises(ConfigError, match=None) as err:
        load_config(_write(tmp_path, text))
    assert expected in str(err.value)
    assert str(tmp_path / "run.yaml") in str(err.value)


def test_the_cli_reports_a_config_error_on_one_line(tmp_path, capsys):
    assert main(["run", str(_write(tmp_path, "compose: {top_k: 0}"))]) == 2
    err = capsys.readouterr().err
    assert "compose.top_k must be >= 1, got 0" in err and "Traceback" not in err


def test_the_run_seed_is_in_the_fingerprints_of_the_stages_it_draws_for(tmp_path):
    """``--set seed=1`` on a run directory made with seed 0 re-runs the rollouts, training and evaluation (their
    samples and intervals are drawn with it) and nothing else; at the default 0 the fingerprints are those of
    runs made before the seed was fingerprinted."""
    import hashlib

    zero = load_config(_write(tmp_path, "seed: 0\n"))
    one = load_config(_write(tmp_path, "seed: 0\n"), ["seed=1"])
    changed = {name for name in SECTIONS if zero.section_hash(name) != one.section_hash(name)}
    assert changed == {"rollout", "train", "evaluate"}
    older = zero.to_dict()["evaluate"]
    assert zero.section_hash("evaluate") == hashlib.sha256(
        json.dumps(older, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert one.section_hash("train") != load_config(_write(tmp_path, "seed: 0\n"), ["seed=2"]).section_hash("train")


def test_an_unset_focus_share_leaves_the_generate_fingerprint_of_older_runs_alone(tmp_path):
    """generate.focus_share came after runs were made: unset, it is left out of the stage's fingerprint (a run
    made before it does not regenerate); set, it changes the fingerprint (the envs are generated again)."""
    import hashlib

    unset = load_config(_write(tmp_path, "seed: 0\n"))
    older = {k: v for k, v in unset.to_dict()["generate"].items() if k != "focus_share"}
    assert unset.section_hash("generate") == hashlib.sha256(
        json.dumps(older, sort_keys=True, default=str).encode()).hexdigest()[:16]
    assert load_config(_write(tmp_path, "seed: 0\n"), ["generate.focus_share=1.0"]).section_hash("generate") \
        != unset.section_hash("generate")


def test_drop_unimproved_names_the_adapters_selection_found_no_better_than_the_base(tmp_path):
    """compose.drop_unimproved reads each adapter's checkpoint selection: a chosen checkpoint not clearly better than
    the base on the validation seeds (the paired interval's lower end at or below zero: one lucky win in 50) is left
    out, with the figures that say so; without selection's episode files, one at or below the base's value. One
    clearly better, and one without a selection (a zero update), are kept. Off (the default), the compose fingerprint is the one runs made
    before the key had."""
    import hashlib

    from trace_train.pipeline.runner import Context
    from trace_train.pipeline.stages.compose import unimproved

    cfg = config_from_dict({"out": str(tmp_path), "train": {"select_seeds": "100:150", "options": {"save_steps": 5}},
                            "compose": {"drop_unimproved": True}})
    ctx = Context(cfg=cfg, run_dir=tmp_path, state={"stages": {}}, progress=False)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "results.json").write_text(json.dumps({"adapters": {
        "sdr": {"selected": {"step": 10, "success": 0.96, "base_success": 0.22}},
        "tcp": {"selected": {"step": 70, "success": 0.0, "base_success": 0.0}},
        "pv": {"selected": {"step": 20, "success": 0.30, "base_success": 0.34}},
        "zero": {"selected": {"step": 8, "final_step": 8, "skipped": "a zero update"}}}}))
    results = json.loads((tmp_path / "train" / "results.json").read_text())
    results["adapters"]["lucky"] = {"selected": {"step": 40, "success": 0.02, "base_success": 0.0}}
    (tmp_path / "train" / "results.json").write_text(json.dumps(results))

    def episodes(cap: str, step: int, wins: int) -> None:  # selection's files: 50 validation seeds, `wins` won
        path = tmp_path / "train" / cap / "select" / f"{step:05d}" / "trajectories.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"env_id": f"gen/{cap}", "seed": 100 + i, "success": i < wins,
                                            "reward": float(i < wins)}) + "\n" for i in range(50)))

    episodes("sdr", 0, 11), episodes("sdr", 10, 48)  # 0.22 -> 0.96: clearly better
    episodes("lucky", 0, 0), episodes("lucky", 40, 1)  # one win in 50: within the noise
    why = unimproved(ctx, ["sdr", "tcp", "pv", "zero", "lucky"])
    assert set(why) == {"tcp", "pv", "lucky"}
    assert "success 0.00 at step 70, the base 0.00" in why["tcp"] and "0.30 at step 20, the base 0.34" in why["pv"]
    assert "not clearly better" not in why["tcp"]  # no episode files: the values alone decided
    assert why["lucky"].startswith("no checkpoint was clearly better than the base")
    assert "success 0.02 at step 40, the base 0.00; paired Δ +0.02 [+0.00, +0.06]" in why["lucky"], why["lucky"]
    off = load_config(_write(tmp_path, "seed: 0\n"))
    older = {k: v for k, v in off.to_dict()["compose"].items() if k != "drop_unimproved"}
    assert off.section_hash("compose") == hashlib.sha256(
        json.dumps(older, sort_keys=True, default=str).encode()).hexdigest()[:16]
    selection = {"out": str(tmp_path), "train": {"select_seeds": "100:150", "options": {"save_steps": 5}}}
    assert cfg.section_hash("compose") != config_from_dict(selection).section_hash("compose")


def test_each_grpo_runs_sft_warmup_is_evaluated_as_sft_on_its_env_alone(tmp_path, model_dir):
    """The evaluate stage plays each GRPO run's SFT warm-up (SFT on that capability's env alone: the L1 transfer
    ceiling) as `sft:<capability>`, with the oracle episodes it was fitted on as its rollouts, and plays it on that
    capability's env too, beside the base and the adapter (L2: what GRPO added over it); a run without a warm-up
    adds neither."""
    from trace_train.pipeline.runner import Context
    from trace_train.pipeline.stages.evaluate import _env_jobs, method_agents

    sdr, tcp = "structured_data_reasoning", "tool_calling_precision"
    records = {}
    for cap, warm in ((sdr, True), (tcp, False)):
        run = tmp_path / "train" / cap / "run"
        (run / "adapter").mkdir(parents=True)
        if warm:
            (run / "sft_warmup" / "adapter").mkdir(parents=True)
            (run / "sft_warmup" / "done.json").write_text(json.dumps({"steps": 300, "episodes": 1000}))
        records[cap] = {"adapter_dir": str(run / "adapter"), "final_adapter_dir": str(run / "adapter")}
    (tmp_path / "train" / "results.json").write_text(json.dumps({"adapters": records, "baselines": {}}))
    cfg = config_from_dict({"out": str(tmp_path), "base": {"kind": "hf", "model": model_dir},
                            "evaluate": {"env_seeds": "0:5"}})
    state = {"stages": {"base": {"status": "done", "summary": {"model_path": model_dir}},
                        "diagnose": {"status": "done", "summary": {"selected": [sdr, tcp]}},
                        "train": {"status": "done", "summary": {
        "adapters": {c: r["adapter_dir"] for c, r in records.items()}, "baselines": {}, "rollouts": {}}}}}
    ctx = Context(cfg, tmp_path, state, False)
    agents = method_agents(ctx)
    rows = {key: (make, spent) for key, _, make, spent, _ in agents}
    assert f"sft:{sdr}" in rows and f"sft:{tcp}" not in rows
    make, spent = rows[f"sft:{sdr}"]
    assert spent == 1000 and make.keywords["adapter"] == str(tmp_path / "train" / sdr / "run" / "sft_warmup"
                                                               / "adapter")
    jobs, copies = _env_jobs(ctx, agents, set(), model_dir)
    by_key = {job.key: job for job in jobs}
    assert set(by_key) == {f"env:{sdr}:base", f"env:{sdr}:adapter", f"env:{sdr}:warmup", f"env:{tcp}:base",
                           f"env:{tcp}:adapter"} and not copies
    warmup = by_key[f"env:{sdr}:warmup"]
    assert warmup.make is make and list(warmup.seeds) == [0, 1, 2, 3, 4]
    assert warmup.out == tmp_path / "eval" / "env" / sdr / "warmup" / "trajectories.jsonl"
    assert warmup.targets == by_key[f"env:{sdr}:adapter"].targets


def test_the_sft_warmup_option_warms_up_the_grpo_runs_and_not_the_sft_baseline(tmp_path):
    """train.options.sft_warmup_steps reaches every GRPO run's TrainConfig; the SFT baseline, all SFT already,
    is built without it (TrainConfig refuses both at once), and the dry run's estimates count the warm-ups (their
    training, and their own rows in the evaluation)."""
    from trace_train.pipeline.runner import Context
    from trace_train.pipeline.stages.evaluate import estimate_evaluate
    from trace_train.pipeline.stages.train import _train_job, estimate_train

    cfg = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "max_minutes": 1.0,
                                                            "options": {"sft_warmup_steps": 50,
                                                                        "sft_warmup_env_kwargs": {"size": {}}}}})
    ctx = Context(cfg=cfg, run_dir=tmp_path, state={"stages": {}}, progress=False)
    env = ["trace/precondition_verification-v0"]
    grpo_cfg = _train_job(ctx, "pv", env, 10)["cfg"]
    assert grpo_cfg.sft_warmup_steps == 50 and grpo_cfg.sft_warmup_env_kwargs == {"size": {}}
    baseline = _train_job(ctx, "_sft", env, 10, sft=True)["cfg"]
    assert baseline.sft and baseline.sft_warmup_steps == 0 and baseline.sft_warmup_env_kwargs == {}
    with_warmup, note = estimate_train(ctx)
    cold = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "max_minutes": 1.0}})
    without, _ = estimate_train(Context(cfg=cold, run_dir=tmp_path, state={"stages": {}}, progress=False))
    assert with_warmup > without and "50 SFT warm-up steps" in note
    # each warm-up is evaluated on the target too (the L1 row "sft:<capability>"): the evaluation estimate counts it
    k = cfg.diagnose.max_capabilities
    evaluated, rows = estimate_evaluate(ctx)
    evaluated_cold, rows_cold = estimate_evaluate(Context(cfg=cold, run_dir=tmp_path, state={"stages": {}},
                                                          progress=False))
    assert evaluated > evaluated_cold
    assert rows.startswith(f"≤ {7 + 2 * k} methods") and rows_cold.startswith(f"≤ {7 + k} methods")


def test_sft_replay_share_replays_the_runs_own_rollouts(tmp_path):
    """train.options.sft_replay_share: every SFT fit (each GRPO run's warm-up and the SFT baseline) replays the
    base's episodes the rollout stage recorded, and train.options.grpo_replay_weight puts them in the GRPO runs'
    loss (not the SFT baseline's); a run without them is refused with the option's name."""
    from trace_train.pipeline.runner import Context
    from trace_train.pipeline.stages.train import _train_job

    cfg = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "options": {
        "sft_warmup_steps": 50, "sft_replay_share": 0.25}}})
    ctx = Context(cfg=cfg, run_dir=tmp_path, state={"stages": {}}, progress=False)
    env = ["trace/precondition_verification-v0"]
    with pytest.raises(ConfigError, match="sft_replay"):
        _train_job(ctx, "pv", env, 10)
    rollouts = tmp_path / "rollouts" / "trajectories.jsonl"
    rollouts.parent.mkdir()
    rollouts.write_text("")
    for job in (_train_job(ctx, "pv", env, 10), _train_job(ctx, "_sft", env, 10, sft=True)):
        assert job["cfg"].sft_replay == str(rollouts) and job["cfg"].sft_replay_share == 0.25
    grpo = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "options": {"grpo_replay_weight": 2.0}}})
    gctx = Context(cfg=grpo, run_dir=tmp_path, state={"stages": {}}, progress=False)
    held = _train_job(gctx, "pv", env, 10)["cfg"]  # GRPO's replay term reads the same file
    assert held.sft_replay == str(rollouts) and held.grpo_replay_weight == 2.0 and held.sft_replay_share == 0.0
    assert _train_job(gctx, "_sft", env, 10, sft=True)["cfg"].grpo_replay_weight == 0.0  # the term is GRPO's
    plain = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "options": {"sft_warmup_steps": 50}}})
    cold = _train_job(Context(cfg=plain, run_dir=tmp_path, state={"stages": {}}, progress=False), "pv", env, 10)
    assert cold["cfg"].sft_replay is None and cold["cfg"].sft_replay_share == 0.0


def test_set_changes_one_field_of_a_config_and_checks_it_like_the_file(tmp_path):
    path = _write(tmp_path, "seed: 0\ntrain: {options: {seed: 0, group_size: 4}}\nevaluate: {seeds: '0:200'}\n")
    cfg = load_config(path, ["seed=1", "train.options.seed=1", "evaluate.seeds=200:400", "compose.top_k=2"])
    assert cfg.seed == 1 and cfg.compose.top_k == 2 and cfg.evaluate.seeds == "200:400"
    assert cfg.train.options == {"seed": 1, "group_size": 4}  # the sibling option is kept
    assert load_config(path).seed == 0  # the file itself is untouched
    assert embedded_default(["evaluate.seeds=0:10"]).evaluate.seeds == "0:10"
    with pytest.raises(ConfigError, match="train.max_step: unknown key; did you mean max_steps"):
        load_config(path, ["train.max_step=3"])
    with pytest.raises(ConfigError, match="use KEY=VALUE"):
        load_config(path, ["seed"])
    with pytest.raises(ConfigError, match="seed is 0, not a section"):
        load_config(path, ["seed.x=1"])


def test_the_cli_takes_set_before_the_plan(tmp_path, capsys):
    cfg = _write(tmp_path, f"out: {tmp_path / 'run'}\nbase: {json.dumps(SCRIPTED)}\n"
                           "rollout: {seeds: '1000:1040'}\ntrain: {model: /nonexistent}\n")
    assert main(["run", str(cfg), "--dry-run", "--set", "rollout.seeds=1000:1010"]) == 0
    assert "10 episodes" in capsys.readouterr().out
    assert main(["run", str(cfg), "--dry-run", "--set", "compose.top_k=0"]) == 2
    assert "compose.top_k must be >= 1, got 0" in capsys.readouterr().err


def test_the_embedded_default_is_valid_and_cpu_only():
    cfg = embedded_default()
    assert cfg.base.kind == "tiny" and cfg.base.device == "cpu"
    assert cfg.diagnose.llm_url is None and cfg.generate.llm_url is None  # offline analysis and generation
    assert not set(range(1000, 1060)) & set(range(40))


def test_the_shipped_example_configs_load():
    from pathlib import Path

    root = Path(__file__).parent.parent
    configs = sorted((root / "examples" / "configs").glob("*.yaml"))
    assert {p.name for p in configs} >= {"cpu_default.yaml", "gpu_qwen3.yaml", "openai_endpoint.yaml", "swe.yaml"}
    experiments = sorted(root.glob("lab/*/config*.yaml"))  # the experiments' recipes load too
    assert {p.parent.name for p in experiments} >= {"headline", "headline-planted", "headline-ask"}
    for path in configs + experiments:
        cfg = load_config(path)
        assert cfg.rollout.targets
    # The CPU example is the embedded default, written out.
    cpu = load_config(configs[[p.name for p in configs].index("cpu_default.yaml")]).to_dict()
    assert cpu == embedded_default().to_dict()
    # The headline recipe starts from the shipped base (installed, not warmed up) and holds its seeds out.
    headline = load_config(root / "lab" / "headline" / "config.yaml")
    assert headline.to_dict()["base"] == embedded_default().to_dict()["base"]
    assert len(range(*map(int, headline.evaluate.seeds.split(":")))) >= 200


def test_dry_run_prints_the_plan_with_estimates_and_runs_nothing(tmp_path, capsys):
    cfg = _write(tmp_path, f"out: {tmp_path / 'run'}\nbase: {json.dumps(SCRIPTED)}\n"
                           "rollout: {seeds: '1000:1040'}\ntrain: {model: /nonexistent}\n")
    assert main(["run", str(cfg), "--dry-run"]) == 0
    out = capsys.readouterr().out
    for stage in ("base", "rollout", "diagnose", "generate", "train", "compose", "evaluate"):
        assert any(line.startswith(stage) for line in out.splitlines()), stage
    assert "40 episodes of the base agent" in out and "estimated total:" in out
    assert not (tmp_path / "run").exists()


def test_the_default_dry_run_states_its_estimate_up_front(capsys, tmp_path):
    assert main(["run", "--dry-run", "--out", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "the embedded default" in out
    total = next(line for line in out.splitlines() if line.startswith("estimated total:"))
    assert "min" in total


def test_stages_record_inputs_outputs_and_resume(tmp_path, capsys):
    """The first three stages for real; a second run skips them; --from re-runs from a stage; a config change
    re-runs exactly the stages whose inputs changed."""
    run = tmp_path / "run"
    text = (f"out: {run}\nbase: {json.dumps(SCRIPTED)}\nrollout: {{seeds: '1000:1040'}}\n"
            "train: {model: /nonexistent}\n")
    cfg = _write(tmp_path, text)
    assert main(["run", str(cfg), "--until", "diagnose", "--no-progress"]) == 0
    state = json.loads((run / "stages.json").read_text())["stages"]
    assert [state[s]["status"] for s in ("base", "rollout", "diagnose")] == ["done"] * 3
    assert "generate" not in state  # --until stopped after the diagnosis
    rollout = state["rollout"]
    assert rollout["outputs"] == ["rollouts/trajectories.jsonl"] and rollout["seconds"] >= 0
    assert len(rollout["output_hashes"]["rollouts/trajectories.jsonl"]) == 16
    # Inputs: the config section's fingerprint and the hashes of the outputs of the stages it reads.
    assert set(state["diagnose"]["inputs"]) == {"config", "rollout"}
    assert state["diagnose"]["inputs"]["rollout"] == rollout["output_hashes"]
    assert sorted(state["diagnose"]["summary"]["retained"]) == ["multi_step_completion", "tool_calling_precision"]
    assert (run / "config.yaml").exists() and (run / "report.md").exists() and (run / "report.html").exists()
    lines = (run / "rollouts" / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 40
    capsys.readouterr()

    # Nothing changed: every stage is skipped.
    assert main(["run", str(cfg), "--until", "diagnose", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert all(f"{s}: done already" in out for s in ("base", "rollout", "diagnose"))

    # --from diagnose re-runs the diagnosis only.
    assert main(["run", str(cfg), "--until", "diagnose", "--from", "diagnose", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "rollout: done already" in out and "diagnose: done in" in out

    # A changed diagnose section re-runs the diagnosis, not the rollouts.
    _write(tmp_path, text + "diagnose: {min_delta: 0.9}\n")
    assert main(["run", str(cfg), "--until", "diagnose", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "rollout: done already" in out and "diagnose: done in" in out
    state = json.loads((run / "stages.json").read_text())["stages"]
    assert state["diagnose"]["summary"]["retained"] == []


def test_a_run_moved_or_resumed_from_another_directory_finds_its_own_files(tmp_path, monkeypatch, capsys):
    """Summaries name files as the run saw them (``runs/x/...`` from where it started): resumed after a move and
    from another working directory, the stages are still skipped and the summaries point at the files here, not
    at the old place (which may hold another run's files)."""
    from trace_train.pipeline import Pipeline
    from trace_train.run_dir import rebase_summaries

    (tmp_path / "a").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    text = (f"out: runs/x\nbase: {json.dumps(SCRIPTED)}\nrollout: {{seeds: '1000:1010'}}\n"
            "train: {model: /nonexistent}\n")
    cfg = _write(tmp_path, text)
    assert main(["run", str(cfg), "--until", "diagnose", "--no-progress"]) == 0
    state = json.loads((tmp_path / "a" / "runs" / "x" / "stages.json").read_text())
    assert state["run_dir"] == "runs/x" and state["run_dir_abs"] == str(tmp_path / "a" / "runs" / "x")
    # What a later stage's summary holds: a path inside the run, as a path from the starting directory, and
    # strings that are not the run's files.
    state["stages"]["diagnose"]["summary"].update(
        file="runs/x/rollouts/trajectories.jsonl", env="runs/x-v0", gone="runs/x/never/written")
    (tmp_path / "a" / "runs" / "x" / "stages.json").write_text(json.dumps(state))

    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "runs" / "x").rename(tmp_path / "b" / "moved")
    monkeypatch.chdir(tmp_path / "b")
    capsys.readouterr()
    assert main(["run", str(cfg), "--until", "diagnose", "--no-progress", "--out", "moved"]) == 0
    out = capsys.readouterr().out
    assert all(f"{s}: done already" in out for s in ("base", "rollout", "diagnose"))
    state = json.loads((tmp_path / "b" / "moved" / "stages.json").read_text())
    summary = state["stages"]["diagnose"]["summary"]
    assert summary["file"] == "moved/rollouts/trajectories.jsonl" and (tmp_path / "b" / summary["file"]).exists()
    assert summary["env"] == "runs/x-v0" and summary["gone"] == "runs/x/never/written"
    assert state["run_dir"] == "moved" and state["run_dir_abs"] == str(tmp_path / "b" / "moved")

    # The same run from a third directory, by its absolute path: the relative paths become absolute ones.
    monkeypatch.chdir(tmp_path)
    state = Pipeline(dataclasses.replace(load_config(cfg), out=str(tmp_path / "b" / "moved")),
                     progress=False).load_state()
    assert state["stages"]["diagnose"]["summary"]["file"] == str(tmp_path / "b" / "moved" / "rollouts" /
                                                                  "trajectories.jsonl")
    # Rebasing twice changes nothing.
    again = rebase_summaries(json.loads(json.dumps(state)), tmp_path / "b" / "moved")
    assert again == state


def test_an_interrupted_rollout_stage_resumes_inside(tmp_path, capsys):
    """A rollout stage left 'running' (a killed run) keeps its finished episodes and runs only the rest."""
    run = tmp_path / "run"
    cfg = _write(tmp_path, f"out: {run}\nbase: {json.dumps(SCRIPTED)}\nrollout: {{seeds: '1000:1030'}}\n"
                           "train: {model: /nonexistent}\n")
    assert main(["run", str(cfg), "--until", "rollout", "--no-progress"]) == 0
    path = run / "rollouts" / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    # Simulate the kill: 12 episodes on disk plus a torn line, the stage marked running.
    path.write_text("\n".join(lines[:12]) + "\n" + lines[12][:40])
    state = json.loads((run / "stages.json").read_text())
    state["stages"]["rollout"]["status"] = "running"
    (run / "stages.json").write_text(json.dumps(state))
    capsys.readouterr()
    assert main(["run", str(cfg), "--until", "rollout", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "rollout: roll out the base agent on the target seeds (resuming)" in out
    state = json.loads((run / "stages.json").read_text())["stages"]
    assert state["rollout"]["summary"]["resumed_from"] == 12
    again = path.read_text().splitlines()
    assert len(again) == 30 and again[:12] == lines[:12]
    assert sorted(json.loads(x)["seed"] for x in again) == list(range(1000, 1030))

    # Killed again, but now the seeds change: that is not a resume, the stale episodes must go.
    path.write_text("\n".join(again[:5]) + "\n")
    state = json.loads((run / "stages.json").read_text())
    state["stages"]["rollout"].update(status="running", outputs=[])  # as the runner leaves it mid-stage
    (run / "stages.json").write_text(json.dumps(state))
    text = cfg.read_text().replace("'1000:1030'", "'2000:2010'")
    cfg.write_text(text)
    assert main(["run", str(cfg), "--until", "rollout", "--no-progress"]) == 0
    seeds = sorted(json.loads(x)["seed"] for x in path.read_text().splitlines())
    assert seeds == list(range(2000, 2010))


def test_stages_whose_part_is_missing_are_marked_in_the_plan_and_the_report(tmp_path, monkeypatch):
    """Without the generator and the trainer, the run still goes to the end: those stages are recorded as
    unavailable (never faked), and every results row they would have fed is kept and marked so."""
    from trace_train.pipeline import runner as pipeline
    from trace_train.report import build_document

    original = pipeline._stage_list
    missing = "not available in this build: a part of TRACE is not installed (test)"

    def without_generate_and_train():
        stages = original()
        for s in stages:
            if s.name in ("generate", "train"):
                s.requires = lambda: missing
        return stages

    monkeypatch.setattr(pipeline, "_stage_list", without_generate_and_train)
    cfg = config_from_dict({"out": str(tmp_path / "run"), "base": SCRIPTED, "rollout": {"seeds": "1000:1030"},
                            "train": {"model": "/nonexistent"}, "evaluate": {"seeds": "0:5"}})
    p = pipeline.Pipeline(cfg, progress=False)
    rows = {r.stage: r for r in p.plan()}
    assert rows["train"].action == "unavailable" and rows["train"].note == missing
    result = p.run()
    assert result.stages["generate"]["status"] == result.stages["train"]["status"] == "unavailable"
    assert result.stages["evaluate"]["status"] == "done"
    doc = build_document(tmp_path / "run")
    stages = next(t for t in doc.tables if t.headers[0] == "stage")
    assert ["train", "unavailable", "–", missing] in stages.rows
    table = next(t for t in doc.tables if t.headers[0] == "method")
    by_method = {r[0]: r for r in table.rows}
    assert by_method["base"][1] != "not in this run"
    for label in ("SFT on synthetic data", "single-capability adapters", "multi-capability GRPO (one adapter)",
                  "merge (linear)", "merge (ties)", "per-episode routing", "TRACE MoE (token-level top-1)"):
        assert by_method[label][1] == "not in this run", label
        assert "the train stage is not available in this build" in by_method[label][-1], by_method[label]
    assert "not available in this build" in (tmp_path / "run" / "report.md").read_text()


def test_an_adapter_with_a_zero_update_reuses_the_base_episodes_which_are_its_own(tmp_path, model_dir):
    """An adapter whose every GRPO group was flat is the base model: evaluate reuses the base's greedy
    episodes for it (and says so), and they are exactly what evaluating it would have given."""
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trace_train.agents import HFAgent
    from trace_train.pipeline import Context
    from trace_train.pipeline.stages.evaluate import SAME_AS_BASE_NOTE, run_evaluate
    from trace_train.rollouts import read_trajectories, run_rollouts

    env, seeds = "examples/warehouse_stock-v0", [0, 1]
    adapters = {}
    for name, init in (("flat", True), ("moved", False)):  # PEFT's B = 0 init, and a random (trained-like) one
        torch.manual_seed(0)
        peft = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir),
                              LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=init))
        peft.save_pretrained(str(tmp_path / name))
        adapters[name] = str(tmp_path / name)
    cfg = config_from_dict({"out": str(tmp_path / "run"), "base": {"kind": "hf", "model": model_dir, "max_new_tokens": 8},
                            "rollout": {"targets": [env], "seeds": "100:102", "env_kwargs": {"max_episode_steps": 3}},
                            "evaluate": {"seeds": seeds, "methods": ["base", "adapters"]}})
    done = lambda summary: {"status": "done", "summary": summary}  # noqa: E731
    state = {"stages": {"base": done({"model_path": model_dir}), "train": done({"adapters": adapters}),
                        "compose": {"status": "pending"}}}
    ctx = Context(cfg, tmp_path / "run", state, progress=False)
    _, summary = run_evaluate(ctx)
    results = json.loads((tmp_path / "run" / "eval" / "results.json").read_text())["methods"]
    assert results["adapter:flat"]["note"] == SAME_AS_BASE_NOTE and results["adapter:moved"]["note"] == ""
    base = read_trajectories(tmp_path / "run" / "eval" / "base" / "trajectories.jsonl")
    reused = read_trajectories(tmp_path / "run" / "eval" / "adapter_flat" / "trajectories.jsonl")
    assert {r["agent"] for r in reused} == {"adapter:flat"}
    # The claim behind the reuse: the flat adapter, evaluated for real, plays exactly the base's episodes.
    agent = HFAgent(model_dir, adapter=adapters["flat"], max_new_tokens=8)
    fresh = run_rollouts([env], agent, seeds, out=tmp_path / "fresh.jsonl", in_flight=16, progress=False,
                         env_kwargs={"max_episode_steps": 3})
    assert fresh.total == len(seeds)
    actions = lambda records: sorted((r["seed"], json.dumps(r["messages"], sort_keys=True)) for r in records)  # noqa: E731
    assert actions(read_trajectories(tmp_path / "fresh.jsonl")) == actions(base) == actions(reused)
    assert summary["methods"]["adapter:flat"] == summary["methods"]["base"]


def test_rollout_workers_split_the_seeds_and_play_the_episodes_one_process_plays(tmp_path, model_dir):
    """rollout.workers: 2 rolls the base out in two processes, each on half the seeds, joined into one file;
    the episodes are the ones a single process plays."""
    from trace_train.pipeline import Context
    from trace_train.pipeline.stages.rollout import run_rollout
    from trace_train.rollouts import read_trajectories

    runs = {}
    for workers in (1, 2):
        cfg = config_from_dict({"out": str(tmp_path / f"w{workers}"),
                                "base": {"kind": "hf", "model": model_dir, "max_new_tokens": 8},
                                "rollout": {"targets": ["examples/warehouse_stock-v0"], "seeds": "100:105",
                                            "workers": workers, "env_kwargs": {"max_episode_steps": 3}}})
        state = {"stages": {"base": {"status": "done", "summary": {"model_path": model_dir}}}}
        _, summary = run_rollout(Context(cfg, tmp_path / f"w{workers}", state, progress=False))
        assert summary["episodes"] == 5
        out = tmp_path / f"w{workers}" / "rollouts"
        assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".lock")) == ["trajectories.jsonl"]
        runs[workers] = read_trajectories(out / "trajectories.jsonl")
    by_seed = {w: {r["seed"]: r["messages"] for r in records} for w, records in runs.items()}
    assert sorted(by_seed[2]) == list(range(100, 105)) and by_seed[2] == by_seed[1]


def test_only_the_last_rounds_jobs_are_split_and_a_whole_output_is_never_split(tmp_path):
    from trace_train.backends import RolloutJob
    from trace_train.backends.local import _split_last_round

    jobs = [RolloutJob(key=k, make=dict, targets=["t"], seeds=list(range(10)), out=tmp_path / f"{k}.jsonl")
            for k in "abc"]
    groups = _split_last_round(jobs, 2)
    assert [len(g) for g in groups] == [1, 1, 2]  # a and b side by side, then c's seeds on both workers
    assert [p.seeds for p in groups[2]] == [list(range(5)), list(range(5, 10))]
    assert [p.out.name for p in groups[2]] == ["c.part0.jsonl", "c.part1.jsonl"]
    assert [len(g) for g in _split_last_round(jobs[:2], 2)] == [1, 1]
    (tmp_path / "c.jsonl").write_text("")  # c ran whole before an interruption: it resumes whole
    (tmp_path / "c.part0.jsonl").write_text("{}\n")  # a part a finished join left behind
    assert [len(g) for g in _split_last_round(jobs, 2)] == [1, 1, 1]
    assert not (tmp_path / "c.part0.jsonl").exists()


def test_router_data_selected_takes_the_chosen_checkpoints_successes_and_falls_back_to_the_oracle(tmp_path,
                                                                                                 model_dir):
    """compose.router_data: selected trains the router on the successful episodes that checkpoint selection played
    with each adapter's chosen checkpoint (at most router_seeds); an adapter with none (a zero update, or no
    success) gets oracle episodes of its env, and the compose results say which each got."""
    from trace_train.pipeline import Context
    from trace_train.pipeline.stages.compose import router_episodes
    from trace_train.rollouts import read_trajectories

    env = "trace/precondition_verification-v1"
    cfg = config_from_dict({"out": str(tmp_path), "compose": {"router_seeds": 2, "router_data": "selected"},
                            "train": {"select_seeds": "100:104", "options": {"save_steps": 5}}})
    ctx = Context(cfg, tmp_path, {"stages": {}}, progress=False)
    played = tmp_path / "train" / "learnt" / "select" / "00010" / "trajectories.jsonl"
    played.parent.mkdir(parents=True)
    episodes = [{"env_id": env, "seed": 100 + i, "success": i != 1, "messages": [], "agent": "select step 10"}
                for i in range(4)]
    played.write_text("".join(json.dumps(e) + "\n" for e in episodes))
    (tmp_path / "train" / "results.json").write_text(json.dumps({"adapters": {
        "learnt": {"selected": {"step": 10, "final_step": 20}},
        "flat": {"selected": {"step": 20, "final_step": 20, "skipped": "a zero update: every checkpoint is the base"}},
    }}))
    data, sources, played = router_episodes(ctx, ["learnt", "flat"], {"learnt": env, "flat": env}, model_dir)
    learnt, flat = (read_trajectories(path) for path in data)
    assert [r["seed"] for r in learnt] == [100, 102]  # successes only, at most router_seeds, in the order played
    assert {r["agent"] for r in learnt} == {"select step 10"}
    assert len(flat) == 2 and all(r["success"] for r in flat) and {r["agent"] for r in flat} == {"oracle"}
    assert sources["learnt"].startswith("selected: 2 ") and sources["flat"].startswith("oracle: 2 episodes (")
    assert played == 2  # selection's episodes were counted when they were played; only the oracle's are new


def test_the_moe_row_says_how_the_composed_model_routes(tmp_path):
    from trace_train.pipeline.stages.evaluate import _moe_routing

    assert _moe_routing(None) == "token-level top-1"
    (tmp_path / "compose.json").write_text(json.dumps({"routing": "token"}))
    assert _moe_routing(str(tmp_path)) == "token-level top-1"
    (tmp_path / "compose.json").write_text(json.dumps({"routing": "segment"}))
    assert _moe_routing(str(tmp_path)) == "top-1, one choice per message"


def _rollout_record(family: str | list, success: bool) -> str:
    families = family if isinstance(family, list) else [family]
    return json.dumps({"env_id": "trace/tau_airline-v0", "scenario": families[0] if len(families) == 1 else "bundle",
                       "task": {"families": families}, "success": success}) + "\n"


def test_lead_in_auto_takes_the_answer_families_the_base_wins_in_its_rollouts(tmp_path):
    """train.options.env_kwargs.lead_in: auto becomes the families the base answers (≥ half of ≥ 5 rollout episodes)
    that can be asked without a write; every GRPO run, the SFT baseline, checkpoint selection and the env
    evaluation get the same families, and the train stage's summary says why."""
    from trace_train.pipeline.runner import Context
    from trace_train.pipeline.stages.common import LEAD_IN_AUTO_MIN_EPISODES, auto_lead_in, train_env_kwargs
    from trace_train.pipeline.stages.train import _auto_lead_in_summary, _train_job

    cfg = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "options": {
        "env_kwargs": {"lead_in": "auto", "lead_in_prob": 0.5, "difficulty": 2}}}})
    ctx = Context(cfg=cfg, run_dir=tmp_path, state={"stages": {}}, progress=False)
    env = ["trace/precondition_verification-v0"]
    with pytest.raises(ConfigError, match="lead_in: auto reads the base's rollouts"):
        _train_job(ctx, "pv", env, 10)
    rollouts = tmp_path / "rollouts" / "trajectories.jsonl"
    rollouts.parent.mkdir()
    rows = ([_rollout_record("flight_status", i < 3) for i in range(5)]      # 3 of 5: chosen
            + [_rollout_record("info", i < 2) for i in range(5)]             # 2 of 5: the base fails it
            + [_rollout_record("cancel", True) for _ in range(6)]            # won, but a write: never a lead-in
            + [_rollout_record(["info", "flight_status"], True) for _ in range(9)])  # a bundle counts for neither
    rollouts.write_text("".join(rows))
    families, counts = auto_lead_in(rollouts)
    assert families == ["flight_status"]
    assert counts == {"flight_status": [3, 5], "info": [2, 5], "cancel": [6, 6]}
    resolved = {"lead_in": ["flight_status"], "lead_in_prob": 0.5, "difficulty": 2}
    assert train_env_kwargs(ctx) == resolved
    for job in (_train_job(ctx, "pv", env, 10), _train_job(ctx, "_sft", env, 10, sft=True)):
        assert job["cfg"].env_kwargs == resolved
    assert _auto_lead_in_summary(ctx) == {"families": ["flight_status"], "base_rollouts": counts,
                                          "min_success": 0.5, "min_episodes": LEAD_IN_AUTO_MIN_EPISODES}
    # Too few episodes of a family the base always wins: not chosen, and with no family left, no lead-ins at all.
    rollouts.write_text("".join(_rollout_record("info", True) for _ in range(LEAD_IN_AUTO_MIN_EPISODES - 1)))
    assert auto_lead_in(rollouts)[0] == []
    assert train_env_kwargs(ctx) == {"difficulty": 2}
    plain = config_from_dict({"out": str(tmp_path), "train": {"model": "nano", "options": {
        "env_kwargs": {"lead_in": ["info"]}}}})
    assert _auto_lead_in_summary(Context(cfg=plain, run_dir=tmp_path, state={"stages": {}}, progress=False)) is None
