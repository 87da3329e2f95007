"""The shipped SWE config (examples/configs/swe.yaml) through `trace run` in Docker, with CI budgets:
scripted SWE agents on `trace/swe_repo-v0`, the diagnosis names swe_localization, the offline generator
writes and admits its env, and GRPO runs 2 steps of the nano model on it (plumbing, not learning)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trace_train.pipeline import Pipeline
from trace_train.pipeline.config import config_from_dict

CONFIG = Path(__file__).parent.parent / "examples" / "configs" / "swe.yaml"


@pytest.mark.slow
def test_the_swe_config_diagnoses_generates_and_trains(tmp_path):
    data = yaml.safe_load(CONFIG.read_text())
    data["out"] = str(tmp_path / "run")
    data["rollout"]["seeds"] = "1000:1016"
    data["train"].update(max_steps=2, sft_baseline=False, options={
        "group_size": 2, "groups_per_step": 1, "calibration_groups": 0, "max_turn_tokens": 12,
        "max_completion_length": 96, "max_tool_calling_iterations": 2})
    cfg = config_from_dict(data)
    assert cfg.rollout.targets == ["trace/swe_repo-v0"] and cfg.train.model == "nano"

    result = Pipeline(cfg, progress=False).run(stop_after="train")
    stages = result.stages
    assert [stages[s]["status"] for s in ("base", "rollout", "diagnose", "generate", "train")] == ["done"] * 5
    assert stages["diagnose"]["summary"]["retained"] == ["swe_localization"]
    env_id = stages["generate"]["summary"]["admitted"]["swe_localization"]
    assert env_id.startswith("gen/") and "swe_localization" in env_id
    run = Path(data["out"])
    records = [json.loads(x) for x in (run / "rollouts" / "trajectories.jsonl").read_text().splitlines()]
    assert len(records) == 16 and {r["env_id"] for r in records} == {"trace/swe_repo-v0"}
    assert 2 <= sum(not r["success"] for r in records) <= 14  # the mixture: the oracle on some tasks only
    trained = json.loads((run / "train" / "results.json").read_text())["adapters"]["swe_localization"]
    assert trained["env_ids"] == [env_id] and trained["steps"] == 2 and trained["source"] == "generated"
    assert (Path(trained["adapter_dir"]) / "adapter_config.json").exists()
    report = (run / "report.md").read_text()
    assert "`swe_localization`" in report and env_id in report
