"""The LLM analysis agent end to end against a real OpenAI-compatible server on loopback.

``transformers serve`` with the nano model (random weights) stands in for a real analysis model:
its replies are not valid JSON, so the test checks what matters for the pipeline — that every
malformed reply is rejected by the schema check and retried, that what stays unlabelled is recorded
as missing (never guessed), and that the stage still completes and writes its outputs. Parsing and
validation of well-formed replies are tested without a server.
"""

from __future__ import annotations

import json

import pytest

from trace_train.analysis import LLMConfig, diagnose, extract_json, validate
from trace_train.analysis.llm import _parse_labels, labels_schema

EXAMPLE = "examples/warehouse_stock-v0"


def test_extract_and_validate():
    assert extract_json('sure! ```json\n{"a": [1, 2]}\n``` done') == {"a": [1, 2]}
    assert extract_json('text {"a": {"b": "}"}} tail') == {"a": {"b": "}"}}
    with pytest.raises(ValueError):
        extract_json("no json here")
    schema = labels_schema(["T1", "T2"], ["cap_a"])
    ok = {"labels": [{"trajectory": "T1", "capability": "cap_a", "label": "LACKING"}]}
    assert validate(ok, schema) == []
    bad = {"labels": [{"trajectory": "T9", "capability": "cap_a", "label": "MAYBE"}], "x": 1}
    errors = validate(bad, schema)
    assert any("T9" in e for e in errors) and any("MAYBE" in e for e in errors) and any("'x'" in e for e in errors)
    # partial replies keep their valid entries; conflicting pairs are dropped, never guessed
    got, errs = _parse_labels(json.dumps({"labels": [
        {"trajectory": "T1", "capability": "cap_a", "label": "PRESENT"},
        {"trajectory": "T2", "capability": "cap_a", "label": "NA"},
        {"trajectory": "T2", "capability": "cap_a", "label": "LACKING"},
        {"trajectory": "T1", "capability": "nope", "label": "NA"}]}), schema, {"T1": 0, "T2": 1})
    assert got == {(0, "cap_a"): "PRESENT"} and len(errs) == 2


def test_llm_pipeline_end_to_end_rejects_and_retries_malformed_replies(transformers_server, model_dir, tmp_path):
    import gymnasium as gym

    from trace_envs import rollout
    from trace_envs.domains.agents import TauScriptedAgent

    env = gym.make("trace/tau_retail-v0")
    records = [rollout(env, TauScriptedAgent(lacks), s) for lacks, s in
               [((), 1), (("tool_calling_precision",), 2), (("tool_calling_precision",), 3), ((), 4)]]
    env.close()
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = LLMConfig(base_url=transformers_server, model=model_dir, runs=2, batch_size=2, max_attempts=2,
                    max_tokens=16, max_trajectory_chars=400, sample_per_outcome=1, timeout=120)
    result = diagnose(src, tmp_path / "out", llm=cfg, figure=False)
    data = json.loads(result.capabilities_json.read_text())
    llm = data["llm"]
    # phase 1 failed to produce a valid dictionary: the built-in one was labelled, and the report says so
    assert llm["induction_attempts"] == 2 and any("induction failed" in n for n in data["notes"])
    # phase 2: 2 runs x 2 batches, each retried once after its malformed reply
    assert llm["labelling_requests"] == 8 and llm["retries"] >= 5 and llm["rejected_replies"] >= 8
    assert llm["missing_labels"] == llm["total_labels"] == 2 * 4 * len(data["dictionary"])
    for cap in data["capabilities"]:
        assert set(cap["labels"].values()) == {None}  # missing, never guessed
        assert cap["retained"] is False
    assert "cross_check" in data and "rejected by the schema check" in result.report.read_text()
