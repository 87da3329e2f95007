"""`trace demo` (what `make demo` runs): rollouts → diagnosis → capability environments, end to end."""

from __future__ import annotations

import json

from trace_train.cli import main


def test_demo_recovers_the_base_agents_planted_gaps(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--seeds", "60", "--calibration-seeds", "10", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert sorted(summary["retained"]) == ["multi_step_completion", "tool_calling_precision"]
    assert "exactly the planted gaps" in text
    capabilities = json.loads((out / "diagnosis" / "capabilities.json").read_text())
    assert sorted(capabilities["retained"]) == sorted(summary["retained"])
    assert (out / "diagnosis" / "capabilities.png").stat().st_size > 10_000
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 120 and all(json.loads(line)["agent"] == "base" for line in lines)
    # Step 3: each retained capability's environment scores the base agent below the oracle.
    for capability in summary["retained"]:
        row = next(line for line in text.splitlines() if line.startswith(f"trace/{capability}-v1"))
        base, oracle = (float(v) for v in row.split()[1:3])
        assert base < 0.75 and oracle == 1.0, row


def test_demo_rejects_an_unknown_capability(capsys):
    assert main(["demo", "--base-lacks", "telepathy"]) == 2
    assert "unknown capabilities" in capsys.readouterr().err
