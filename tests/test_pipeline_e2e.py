"""`trace run` end to end with tiny budgets: every stage for real (scripted base agent with known gaps for the
diagnosis, offline generation and admission, GRPO and SFT on the nano model, the composer and its baselines,
evaluation of every method), then the same run SIGKILLed during training and resumed."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trace_train.cli import main

STAGES = ["base", "rollout", "diagnose", "generate", "train", "compose", "evaluate"]
CAPABILITIES = ["multi_step_completion", "tool_calling_precision"]


def write_config(path: Path, out: Path) -> Path:
    path.write_text(f"""
out: {out}
base:
  kind: scripted
  agent: "tau:noisy"
  agent_kwargs: {{p: 0.7, capabilities: {json.dumps(CAPABILITIES)}}}
  max_new_tokens: 12
rollout: {{targets: [trace/tau_airline-v0], seeds: "1000:1040", env_kwargs: {{max_episode_steps: 6, prompt: compact}}}}
train:
  model: nano                     # the nano preset, built here offline (cached by content)
  max_steps: 2
  sft_steps: 2
  workers: 2                      # the adapters and baselines train in 2 worker processes
  select_seeds: "100:102"         # each GRPO run keeps its best checkpoint on 2 validation seeds
  options: {{group_size: 2, groups_per_step: 1, calibration_groups: 0, sft_episodes: 2, max_turn_tokens: 12,
             max_completion_length: 96, max_tool_calling_iterations: 2, save_steps: 1}}
compose: {{router_seeds: 2, options: {{stats_episodes: 2}}}}
evaluate: {{seeds: "0:3", env_seeds: "0:3", workers: 2}}   # the hf rows run in 2 worker processes
""")
    return path


def artifacts(run: Path) -> set[str]:
    """The files a run leaves, minus bookkeeping that legitimately differs between runs (locks, checkpoints)."""
    return {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()
            and not p.name.endswith(".lock") and "checkpoints" not in p.parts and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("e2e")
    run = work / "run"
    assert main(["run", str(write_config(work / "ci.yaml", run)), "--no-progress"]) == 0
    return run


@pytest.mark.slow
def test_every_stage_writes_its_artifacts_and_every_report_table_holds_numbers(full_run):
    run = full_run
    stages = json.loads((run / "stages.json").read_text())["stages"]
    assert [stages[s]["status"] for s in STAGES] == ["done"] * len(STAGES)
    assert all(stages[s]["seconds"] >= 0 and stages[s]["inputs"] for s in STAGES)

    assert len((run / "rollouts" / "trajectories.jsonl").read_text().splitlines()) == 40
    caps = json.loads((run / "diagnosis" / "capabilities.json").read_text())
    assert sorted(caps["retained"]) == CAPABILITIES
    generated = json.loads((run / "generate" / "results.json").read_text())
    assert sorted(g["capability"] for g in generated if g["admitted"]) == CAPABILITIES
    assert (run / "workspace" / "registry.yaml").exists()
    from trace_train.compose.adapters import adapter_update_is_zero

    train = json.loads((run / "train" / "results.json").read_text())
    for name, a in {**train["adapters"], **train["baselines"]}.items():
        assert (Path(a["adapter_dir"]) / "adapter_config.json").exists(), name
        # The multi-capability baseline gets the steps of all adapters together (the same budget).
        assert a["steps"] == (2 * len(CAPABILITIES) if name == "multi" else 2) and a["rollouts"] > 0, name
        if name != "sft" and "skipped" in a["selected"]:  # a zero update: every checkpoint is the base
            assert adapter_update_is_zero(a["adapter_dir"]) and a["selected"]["step"] == a["steps"], name
        elif name != "sft":  # checkpoint selection: the base and each saved step on the validation seeds
            chosen = json.loads((run / "train" / ("_multi" if name == "multi" else name) / "select" /
                                 "selection.json").read_text())
            assert [r["step"] for r in chosen["rows"]] == list(range(a["steps"] + 1)), name
            envs = len(CAPABILITIES) if name == "multi" else 1
            assert all(r["episodes"] == 2 * envs for r in chosen["rows"]), name
            assert a["adapter_dir"] == chosen["adapter_dir"] and a["selected"]["step"] == chosen["step"] > 0
            assert a["rollouts"] == a["train_rollouts"] + 2 * envs * (a["steps"] + 1)
    assert sorted(train["adapters"]) == CAPABILITIES and sorted(train["baselines"]) == ["multi", "sft"]
    compose = json.loads((run / "compose" / "results.json").read_text())
    assert (Path(compose["moe"]["out_dir"]) / "compose.json").exists()
    assert Path(compose["moe"]["heatmap_png"]).stat().st_size > 5_000
    results = json.loads((run / "eval" / "results.json").read_text())["methods"]
    expected = {"base", "sft", "multi", "merge_linear", "merge_ties", "per_episode", "trace_moe",
                *(f"adapter:{c}" for c in CAPABILITIES)}
    assert set(results) == expected
    for key, m in results.items():
        assert m["available"], (key, m.get("note"))
        assert 0.0 <= m["overall"]["pass@1"]["value"] <= 1.0
        assert len((run / m["trajectories"]).read_text().splitlines()) == 3
    assert results["trace_moe"]["rollouts_spent"] > results["adapter:tool_calling_precision"]["rollouts_spent"] > 0
    # Where the MoE's router sent each target family's tokens, read from its own evaluation episodes.
    routing = (run / results["trace_moe"]["trajectories"]).parent / results["trace_moe"]["routing_by_family"]
    families = {json.loads(line)["scenario"] for line in (run / results["base"]["trajectories"]).read_text().splitlines()}
    with open(routing) as f:
        shares = [r for r in csv.DictReader(f) if r["role"] == "all"]
    assert {r["env_id"] for r in shares} == families
    assert all(abs(sum(float(r[s]) for s in ("base", *CAPABILITIES)) - 1.0) < 1e-3 for r in shares)

    from trace_train.report import build_document

    doc = build_document(run)
    number = re.compile(r"^[+\-]?\d+(\.\d+)?( \[[+\-]?\d+\.\d+, [+\-]?\d+\.\d+\])?$")
    assert len(doc.tables) >= 6
    for table in doc.tables:
        assert table.rows, table.headers
        # Every row of every table has at least one number in it (no table made of placeholders only).
        for row in table.rows:
            assert any(number.match(c) for c in row), (table.headers, row)
    train_table = next(t for t in doc.tables if t.headers[0] == "adapter")
    col = train_table.headers.index("informative groups")
    # GRPO rows carry the share of groups with an advantage (from TRL's frac_reward_zero_std); SFT has none.
    assert all(re.fullmatch(r"\d+%", r[col]) if r[2] == "GRPO" else r[col] == "–" for r in train_table.rows)
    results_table = next(t for t in doc.tables if t.headers[0] == "method")
    assert len(results_table.rows) == len(expected)
    assert not any("not in this run" in c for r in results_table.rows for c in r)
    text = (run / "report.md").read_text()
    assert "TRACE MoE pass@1" in text and "paired difference" in text  # the headline
    assert (run / "report.html").read_text().count("data:image/png;base64,") >= 4


@pytest.mark.slow
def test_a_run_killed_during_training_resumes_and_ends_with_the_same_artifacts(tmp_path, full_run):
    run = tmp_path / "run"
    cfg = write_config(tmp_path / "ci.yaml", run)
    cmd = [sys.executable, "-m", "trace_train.cli", "run", str(cfg), "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    state_file = run / "stages.json"
    finished_adapter = None
    deadline = time.time() + 600
    try:
        # Kill once the first adapter is finished and the training stage is still running.
        while time.time() < deadline and proc.poll() is None:
            if state_file.exists():
                try:
                    train = json.loads(state_file.read_text())["stages"].get("train", {})
                except json.JSONDecodeError:
                    train = {}
                done = sorted((run / "train").glob("*/result.json")) if (run / "train").exists() else []
                if train.get("status") == "running" and done:
                    finished_adapter = done[0]
                    os.kill(proc.pid, signal.SIGKILL)
                    break
            time.sleep(0.2)
    finally:
        if proc.poll() is None and finished_adapter is None:
            proc.kill()
        proc.wait()
    assert finished_adapter is not None, "the run ended before the training stage could be interrupted"
    assert proc.returncode == -signal.SIGKILL
    state = json.loads(state_file.read_text())["stages"]
    assert state["train"]["status"] == "running" and "evaluate" not in state
    finished_mtime = finished_adapter.stat().st_mtime_ns

    resumed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = resumed.stdout
    for stage in ("base", "rollout", "diagnose", "generate"):
        assert f"{stage}: done already (inputs unchanged), skipped" in out, stage
    assert "train: GRPO: one LoRA adapter per capability, and the baselines (resuming)" in out
    assert finished_adapter.stat().st_mtime_ns == finished_mtime  # the finished adapter was not retrained
    state = json.loads(state_file.read_text())["stages"]
    assert [state[s]["status"] for s in STAGES] == ["done"] * len(STAGES) and state["train"]["resumed"]

    assert artifacts(run) == artifacts(full_run)
    # The stages before training are deterministic: the same trajectories and the same diagnosis.
    strip = lambda line: {k: v for k, v in json.loads(line).items() if k != "timing"}  # noqa: E731
    assert [strip(x) for x in (run / "rollouts" / "trajectories.jsonl").read_text().splitlines()] == \
        [strip(x) for x in (full_run / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    a, b = (json.loads((r / "diagnosis" / "capabilities.json").read_text()) for r in (run, full_run))
    assert a["retained"] == b["retained"] and a["capabilities"] == b["capabilities"]
