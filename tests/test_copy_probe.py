"""lab/headline-planted/scripts/copy_probe.py: the forced prompt is the conversation cut after the named tool's result, then the
assistant's call up to the argument's opening quote; only episodes that name an id and reach that point count."""

from __future__ import annotations

import json
import re
import pytest
from conftest import load_script

ENV = "trace/tau_airline-v0"
KWARGS = {"scenarios": ["cancel", "flight_status"], "prompt": "compact"}


@pytest.fixture(scope="module")
def probe():
    return load_script("copy_probe", "lab/headline-planted/scripts")


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    pytest.importorskip("torch")
    from trace_envs import OracleAgent, rollout
    from trace_train.tiny.build import build_model

    root = tmp_path_factory.mktemp("copy_probe")
    model = str(build_model("nano", out=root / "nano", env_ids=[ENV], corpus_seeds=2).path)
    path = root / "episodes.jsonl"
    records = [rollout(ENV, OracleAgent(), seed=s, env_kwargs=KWARGS) for s in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return model, path, records


def test_the_forced_prompt_ends_with_the_call_and_follows_the_named_tools_result(probe, episodes):
    from transformers import AutoTokenizer

    model, _, records = episodes
    tokenizer = AutoTokenizer.from_pretrained(model)
    pattern = r"reservation ([A-Z0-9]{6})"
    found = list(probe.forced_prompts(records, tokenizer, "get_reservation_details", "reservation_id", pattern,
                                      "get_user_details"))
    # Described reservations ("... (I don't have the reservation id at hand)") name no id: not probed.
    named = [r for r in records if re.search(pattern, r["messages"][1]["content"])
             and any(m.get("name") == "get_user_details" for m in r["messages"] if m["role"] == "tool")]
    assert named and len(found) == len(named)
    for wanted, family, prompt in found:
        assert family == "cancel" and wanted in prompt.split("<tool_response>")[0]  # named before the tool ran
        assert prompt.endswith('<tool_call>\n{"name": "get_reservation_details", "arguments": {"reservation_id": "')
        assert prompt.count("<tool_response>") == 1  # cut right after get_user_details's result
    assert not list(probe.forced_prompts(records, tokenizer, "t", "a", r"no such (\w+)", "get_user_details"))


def test_the_probe_counts_every_matching_episode(probe, episodes, capsys):
    model, path, _ = episodes
    assert probe.main([model, str(path), "--tool", "get_flight_status", "--arg", "flight_number",
                       "--pattern", r"flight (HAT[0-9]{3})", "--show", "0"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    flights = sum(1 for line in path.read_text().splitlines()
                  if re.search(r"flight (HAT[0-9]{3})", json.loads(line)["messages"][1]["content"]))
    assert summary["episodes"] == flights > 0 and 0 <= summary["right"] <= flights
    with pytest.raises(SystemExit, match="no episode"):
        probe.main([model, str(path), "--tool", "t", "--arg", "a", "--pattern", r"nothing (\d+)"])


def test_a_message_prefix_probes_the_id_named_when_asked_across_the_record_read(probe, episodes, tmp_path, capsys):
    """``--message``: with the id given when the agent asks, the cut after the reservation's record, the prompt ends
    with the message's start; the probe counts each such episode (a confirmation must state the id next)."""
    from transformers import AutoTokenizer

    from trace_envs import OracleAgent, rollout

    model, _, _ = episodes
    tokenizer = AutoTokenizer.from_pretrained(model)
    kwargs = {**KWARGS, "scenarios": ["cancel"], "size": {"ask_details_prob": 1.0, "bundle_prob": 0.0}}
    records = [rollout(ENV, OracleAgent(), seed=s, env_kwargs=kwargs) for s in range(6)]
    pattern = r"reservation id is ([A-Z0-9]{6})"
    found = list(probe.forced_prompts(records, tokenizer, None, None, pattern, "get_reservation_details",
                                      message="Reservation "))
    named = [r for r in records if any(re.search(pattern, m.get("content") or "") for m in r["messages"]
                                       if m["role"] == "user")]
    assert named and len(found) == len(named)
    for wanted, _, prompt in found:
        assert prompt.endswith("<|im_start|>assistant\nReservation ")
        assert prompt.count("<tool_response>") == 2  # the user record, then the reservation's
        assert wanted in prompt.split("<tool_response>")[1] and wanted in prompt.split("<tool_response>")[2]
    path = tmp_path / "asked.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert probe.main([model, str(path), "--after", "get_reservation_details", "--pattern", pattern,
                       "--message", "Reservation ", "--show", "0"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == len(named)
    with pytest.raises(SystemExit):
        probe.main([model, str(path), "--pattern", pattern])  # neither a call nor a message to start


# ---------------------------------------------------------------- lab/headline-planted/scripts/decision_probe.py (same episodes)
@pytest.fixture(scope="module")
def decision_probe():
    return load_script("decision_probe", "lab/headline-planted/scripts")


def test_the_decision_prompt_is_the_history_up_to_the_named_tools_result(decision_probe, episodes):
    from transformers import AutoTokenizer

    model, _, records = episodes
    tokenizer = AutoTokenizer.from_pretrained(model)
    found = list(decision_probe.decision_prompts(records, tokenizer, "get_user_details", "scenario"))
    reaching = [r for r in records if any(m.get("name") == "get_user_details" for m in r["messages"])]
    assert reaching and len(found) == len(reaching)
    for record, (value, prompt, oracle_call) in zip(reaching, found):
        cut = next(i for i, m in enumerate(record["messages"]) if m.get("name") == "get_user_details")
        nxt = next(m for m in record["messages"][cut + 1:] if m["role"] == "assistant")
        assert value == record["task"]["scenario"] and oracle_call == bool(nxt.get("tool_calls"))
        assert prompt.count("<tool_response>") == 1 and prompt.endswith("<|im_start|>assistant\n")
    assert not list(decision_probe.decision_prompts(records, tokenizer, "no_such_tool", "scenario"))


def test_the_decision_summary_groups_by_label_and_scores_the_likelier_opening(decision_probe):
    rows = [("act", 0.2, False), ("act", 0.6, False), ("refuse", 0.9, True), ("refuse", 0.3, True)]
    summary = decision_probe.summarize(rows)
    assert summary["act"]["episodes"] == 2 and summary["act"]["oracle_calls"] == 0.0
    assert summary["act"]["p_call_mean"] == pytest.approx(0.4) and summary["act"]["argmax_agrees"] == 0.5
    assert summary["refuse"]["p_call_min"] == 0.3 and summary["refuse"]["argmax_agrees"] == 0.5


def test_the_decision_probe_reports_every_reaching_episode(decision_probe, episodes, capsys):
    model, path, records = episodes
    assert decision_probe.main([model, str(path), "--after", "get_user_details", "--label", "scenario"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    reaching = [r for r in records if any(m.get("name") == "get_user_details" for m in r["messages"])]
    assert sum(s["episodes"] for s in summary.values()) == len(reaching)
    assert all(0.0 <= s["p_call_min"] <= s["p_call_mean"] <= s["p_call_max"] <= 1.0 for s in summary.values())
    with pytest.raises(SystemExit, match="no episode reaches"):
        decision_probe.main([model, str(path), "--after", "no_such_tool"])
