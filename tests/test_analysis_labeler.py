"""The offline labeler on the classes of trajectory it once got wrong, each over many seeds.

Each test rolls out reference agents (the oracle, planted-deficit agents, and a "hasty" agent that
fires a malformed write before asking) on the τ² targets and holds the labels to the ground truth
the agents carry: a planted deficit that made an episode fail is labelled LACKING, and nothing the
agent did right is. Every test also checks that its episodes contain the situation it is about, so
it cannot pass vacuously.
"""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs import rollout
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import CONFIRM, TauScriptedAgent, plan_turns, sloppy
from trace_envs.domains.task import CAPABILITIES
from trace_train.analysis import OfflineLabeler

from conftest import MisreadingAgent

AIRLINE, RETAIL = "trace/tau_airline-v0", "trace/tau_retail-v0"
LABELER = OfflineLabeler()


def _episodes(env_id: str, agent, seeds, **kwargs) -> list[tuple[dict, dict]]:
    env = gym.make(env_id, **kwargs)
    try:
        out = []
        for s in seeds:
            record = rollout(env, agent, s)
            out.append((record, {c: v for c, v in LABELER.label(record).items()}))
        return out
    finally:
        env.close()


def _user_texts(record: dict) -> list[str]:
    return [m["content"] for m in record["messages"] if m["role"] == "user" and isinstance(m.get("content"), str)]


def test_a_product_named_at_the_end_of_a_sentence_is_still_named():
    """'Please cancel the order with the Desk Lamp.' names the order by its Desk Lamp."""
    runs = _episodes(RETAIL, TauScriptedAgent(["structured_data_reasoning"]), range(400))
    failed = [(r, labels) for r, labels in runs if not r["success"]]
    at_end = [r for r, _ in failed if any(re.search(r"with the [A-Z][\w' -]*[.!?]", t) for t in _user_texts(r))]
    assert len(failed) > 80 and len(at_end) >= 10, (len(failed), len(at_end))
    missed = [r["seed"] for r, labels in failed if labels["structured_data_reasoning"].label != "LACKING"]
    assert missed == [], f"wrong record not seen on seeds {missed[:10]}"


def test_a_bag_removal_is_a_precondition_failure_not_an_arithmetic_one():
    runs = _episodes(AIRLINE, TauScriptedAgent(["precondition_verification"]), range(300), scenarios=["baggage"],
                     size={"refusal_prob": 1.0, "bundle_prob": 0.0})
    removals = [r for r, _ in runs if "reduced the checked bags" in LABELER.label(r)["precondition_verification"].reason]
    assert len(removals) >= 30, len(removals)
    for r, labels in runs:
        assert r["success"] or labels["precondition_verification"].label == "LACKING", r["seed"]
        assert labels["structured_data_reasoning"].label != "LACKING", (r["seed"], labels["structured_data_reasoning"])


@pytest.mark.parametrize("lacks", [(), ("precondition_verification",)], ids=["oracle", "skip_precondition"])
def test_certificate_eligibility_comes_from_the_reservation_of_the_request(lacks):
    """In a bundle of two compensation requests, each certificate is judged on its own reservation."""
    runs = _episodes(AIRLINE, TauScriptedAgent(lacks), range(300),
                     scenarios=["compensation", "cancel", "flight_status", "info"], size={"bundle_prob": 1.0})
    two = [r for r, _ in runs if sum("compensation" in t for t in _user_texts(r)) >= 2]
    assert len(two) >= 20, len(two)
    wrong = [r["seed"] for r, labels in runs
             if (labels["precondition_verification"].label == "LACKING") != (not r["success"])]
    assert wrong == [], f"precondition label disagrees with the outcome on seeds {wrong[:10]}"
    if lacks:
        assert sum(not r["success"] for r, _ in runs) >= 30


@pytest.mark.parametrize("env_id", [AIRLINE, RETAIL])
def test_the_oracle_is_never_labelled_lacking(env_id):
    runs = _episodes(env_id, TauScriptedAgent(), range(600), size={"bundle_prob": 0.6})
    assert all(r["success"] for r, _ in runs)
    lacking = [(r["seed"], c, v.reason[:100]) for r, labels in runs for c, v in labels.items() if v.label == "LACKING"]
    assert lacking == [], lacking[:5]


class HastyAgent(TauScriptedAgent):
    """The oracle, except that before each confirmation it fires the write with a malformed argument.

    The tool rejects that call, so nothing is written without consent; the agent then asks, hears
    yes and sends the correct call. Its episodes succeed.
    """

    def reset(self, env, observation, info):
        super().reset(env, observation, info)
        turns = plan_turns(env.task)
        for k, request in enumerate(r for r in env.task.requests if r.decision == "act" and r.write is not None):
            ask = f"{request.message} {CONFIRM}"
            if ask in turns:
                bad = sloppy(request.write, k)
                turns.insert(turns.index(ask), hermes_tool_call(bad.name, bad.arguments))
        self._policy.turns = turns


@pytest.mark.parametrize("env_id", [AIRLINE, RETAIL])
def test_a_write_rejected_for_its_arguments_is_not_a_write_without_consent(env_id):
    runs = _episodes(env_id, HastyAgent(name="hasty"), range(300), size={"bundle_prob": 0.5})
    hasty = [r for r, _ in runs if any(m["role"] == "tool" and str(m.get("content", "")).startswith("Error:")
                                       for m in r["messages"])]
    assert len(hasty) >= 150, len(hasty)
    for r, labels in runs:
        assert r["success"], r["seed"]
        assert labels["precondition_verification"].label != "LACKING", (r["seed"], labels["precondition_verification"])
    # ... and the sloppy agent, whose malformed writes stay rejected, lacks tool-calling precision only
    for r, labels in _episodes(env_id, TauScriptedAgent(["tool_calling_precision"]), range(200),
                               size={"bundle_prob": 0.5}):
        others = {c: v.reason for c, v in labels.items() if v.label == "LACKING" and c != "tool_calling_precision"}
        assert others == {}, (r["seed"], others)
        assert r["success"] or labels["tool_calling_precision"].label == "LACKING", r["seed"]


def test_every_capability_is_still_found_alone():
    """The fixes above did not cost recall: each single-deficit agent's failures carry its label."""
    for env_id in (AIRLINE, RETAIL):
        for cap in CAPABILITIES:
            for r, labels in _episodes(env_id, TauScriptedAgent([cap]), range(100)):
                assert r["success"] or labels[cap].label == "LACKING", (env_id, cap, r["seed"])


def test_a_flight_status_other_than_the_one_the_tool_returned_is_a_reading_error():
    """The failure the demo's base makes most: it reads a status and answers another (docs/design.md, diagnosis)."""
    runs = _episodes(AIRLINE, MisreadingAgent(), range(60), scenarios=["flight_status"], size={"bundle_prob": 0.0})
    assert all(not r["success"] for r, _ in runs)
    for r, labels in runs:
        sdr = labels["structured_data_reasoning"]
        assert sdr.label == "LACKING" and "get_flight_status returned" in sdr.reason, (r["seed"], sdr)
        assert {c for c, v in labels.items() if v.label == "LACKING"} == {"structured_data_reasoning"}, r["seed"]
    for r, labels in _episodes(AIRLINE, TauScriptedAgent(), range(60), scenarios=["flight_status"],
                               size={"bundle_prob": 0.0}):
        assert r["success"] and labels["structured_data_reasoning"].label == "PRESENT", (r["seed"], labels)
    # An answer that states no status rests on nothing checkable: NA, not PRESENT (it would dilute ER⁻).
    for r, labels in _episodes(AIRLINE, MisreadingAgent(mute=True), range(30), scenarios=["flight_status"],
                               size={"bundle_prob": 0.0}):
        assert not r["success"], r["seed"]
        assert labels["structured_data_reasoning"].label == "NA", (r["seed"], labels["structured_data_reasoning"])


def test_an_episode_ended_by_unreadable_tool_calls_lacks_tool_calling_precision():
    """An agent whose calls never parse (a tiny model copying garbage into the JSON) leaves no message
    behind them: the env ends the episode on too many rejected turns, and that is the evidence."""

    class Garbled:
        def __call__(self, observation, info):
            if len(info["messages"]) < 3:  # greet and ask for the user id like the oracle does
                return "Welcome! Could you please tell me your user id?"
            return '<tool_call>\n{"name": "get_user_details", "arguments": {"user_id": "j_type": "one_way"}}\n</tool_call>'

    episodes = _episodes(AIRLINE, Garbled(), range(4))
    for record, labels in episodes:
        assert record["termination"] == "too_many_errors"
        assert not any(m.get("tool_calls") for m in record["messages"])  # the unreadable calls left nothing
        assert labels["tool_calling_precision"].label == "LACKING", labels["tool_calling_precision"]
        assert "rejected turns" in labels["tool_calling_precision"].reason
    # Ending well, or on the step cap, is not that evidence: the oracle stays PRESENT.
    oracle = _episodes(AIRLINE, TauScriptedAgent(), range(4))
    assert all(labels["tool_calling_precision"].label == "PRESENT" for _, labels in oracle)


def test_the_details_given_when_asked_name_the_records_of_the_request():
    """On tasks that ask for their details (``size.ask_details_prob: 1``) the user names the flight or reservation
    only in the answer to "Which reservation, flight or trip is it about?": that answer extends the request (it is
    not a second request) and the checks read the record it names. Before, a flight-status answer that contradicted
    the tool went unlabelled and every asking episode counted two requests."""
    size = {"ask_details_prob": 1.0, "bundle_prob": 0.0}
    scenarios = ["flight_status", "info", "cancel"]
    for r, labels in _episodes(AIRLINE, TauScriptedAgent([]), range(30), size=size, scenarios=scenarios):
        assert r["success"], r["seed"]
        assert not [c for c, v in labels.items() if v.label == "LACKING"], (r["seed"], labels)
        assert labels["multi_step_completion"].label == "NA", (r["seed"], labels["multi_step_completion"])
    misread = _episodes(AIRLINE, MisreadingAgent(), range(40), size=size, scenarios=["flight_status"])
    failed = [(r, labels) for r, labels in misread if not r["success"]]
    assert len(failed) >= 10, len(failed)
    for r, labels in failed:
        assert labels["structured_data_reasoning"].label == "LACKING", (r["seed"], labels["structured_data_reasoning"])
        assert "get_flight_status returned" in labels["structured_data_reasoning"].reason
