"""``trace/tool_calling_precision-v0``: oracle, variety, isolation, and every documented shortcut's bound.

Each shortcut is a scripted agent that plays the task's gold path with one behaviour changed; the
bounds are the ones the env's docstring documents ("Shortcuts").
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs import make_agent, rollout
from trace_envs.capabilities.tool_calling_precision import precision_penalty
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import ANYTHING_ELSE, CONFIRM, sloppy
from trace_envs.domains.task import Call

from conftest import distinct_tasks

ENV_ID = "trace/tool_calling_precision-v0"
N = 500


@pytest.fixture(scope="module")
def env():
    e = gym.make(ENV_ID, domain=None)  # the domain drawn per episode: both targets' tools
    yield e
    e.close()


class _Plan:
    """Plays the task's gold path through ``turns(task) -> list of actions``."""

    name = "shortcut"

    def reset(self, env, observation, info):
        self.turns, self.i = self.plan(env.task), 0

    def __call__(self, observation, info):
        turn = self.turns[self.i] if self.i < len(self.turns) else ANYTHING_ELSE
        self.i += 1
        return turn

    @staticmethod
    def prefix(task):
        turns = [task.auth_message] if task.auth_message else []
        return turns + [hermes_tool_call(c.name, c.arguments) for c in task.auth]

    def write_turns(self, task, writes):
        r = task.requests[0]
        turns = self.prefix(task) + [hermes_tool_call(c.name, c.arguments) for c in r.reads]
        turns.append(f"{r.message} {CONFIRM}")
        turns += [hermes_tool_call(c.name, c.arguments) for c in writes]
        return turns + [f"{r.done_message} {ANYTHING_ELSE}"]


class Refuser(_Plan):
    def plan(self, task):
        return self.prefix(task) + ["I'm sorry, but I can't make that change. " + ANYTHING_ELSE]


class NoWrite(_Plan):
    """Says it did the change without calling the write tool."""

    def plan(self, task):
        return self.write_turns(task, [])


def near_miss(call: Call) -> Call:
    """The gold call with one value guessed wrong but still well-typed."""
    args = copy.deepcopy(call.arguments)
    enums = {"cabin": ("basic_economy", "economy", "business"), "insurance": ("yes", "no"),
             "flight_type": ("one_way", "round_trip"), "reason": ("no longer needed", "ordered by mistake")}
    for key, values in enums.items():
        if key in args:
            args[key] = next(v for v in values if v != args[key])
            return Call(call.name, args)
    for a, b in (("address1", "city"), ("city", "state")):
        if a in args and b in args and args[a] != args[b]:
            args[a], args[b] = args[b], args[a]
            return Call(call.name, args)
    for key, value in args.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            args[key] = value + 1
            return Call(call.name, args)
    for key, value in args.items():
        if isinstance(value, list) and len(value) > 1:
            args[key] = value[:-1]  # one item forgotten
            return Call(call.name, args)
    key = next(k for k, v in args.items() if isinstance(v, str))
    args[key] = args[key].lower() if args[key] != args[key].lower() else args[key].upper()
    return Call(call.name, args)


class NearMiss(_Plan):
    def plan(self, task):
        return self.write_turns(task, [near_miss(task.requests[0].write)])


class TrialAndError(_Plan):
    """A sloppy call first, then the right one after the tool complains."""

    def plan(self, task):
        gold = task.requests[0].write
        return self.write_turns(task, [sloppy(gold, 0), gold])


class ExtraWrite(_Plan):
    """The right write, then an unrequested second write (a near miss of the first)."""

    def plan(self, task):
        gold = task.requests[0].write
        return self.write_turns(task, [gold, near_miss(gold)])


def _rewards(env, agent, n=N):
    return [rollout(env, agent, seed=s)["reward"] for s in range(n)]


def test_oracle_scores_one_on_500_seeds_and_covers_both_domains(env):
    domains, tools = set(), set()
    for s in range(N):
        record = rollout(env, make_agent("oracle"), seed=s)
        assert record["reward"] == 1.0, (s, record["reward_breakdown"])
        assert record["success"]
        domains.add(record["reward_breakdown"]["domain"])
        tools.add(record["reward_breakdown"]["tool"])
    assert domains == {"airline", "retail"}
    assert tools == {"cancel_reservation", "send_certificate", "update_reservation_baggages",  # tiers 1-3
                     "update_reservation_flights", "cancel_pending_order", "modify_pending_order_payment",
                     "modify_pending_order_address", "modify_user_address", "return_delivered_order_items"}


def test_1000_seeds_give_950_distinct_tasks(env):
    assert distinct_tasks(env, range(1000)) >= 950


@pytest.mark.parametrize("difficulty", [1, 5])
def test_every_difficulty_has_an_oracle_and_its_tier(difficulty):
    e = gym.make(ENV_ID, difficulty=difficulty, domain=None)
    tiers = []
    for s in range(60):
        record = rollout(e, make_agent("oracle"), seed=s)
        assert record["reward"] == 1.0, (s, record["reward_breakdown"])
        tiers.append(record["task"]["tier"])
    assert max(tiers) == difficulty and min(tiers) >= 1
    assert tiers.count(difficulty) >= 20  # the top tier is drawn with probability 0.6


def test_registry_default_is_the_airline_domain():
    e = gym.make(ENV_ID)
    assert rollout(e, make_agent("oracle"), seed=0)["reward_breakdown"]["domain"] == "airline"
    e = gym.make(ENV_ID, domain="retail")
    assert rollout(e, make_agent("oracle"), seed=0)["reward_breakdown"]["domain"] == "retail"


def test_bad_difficulty_is_rejected():
    with pytest.raises(ValueError, match="difficulty"):
        gym.make(ENV_ID, difficulty=6)


def test_shortcut_refusing_scores_zero(env):
    assert max(_rewards(env, Refuser())) == 0.0


def test_shortcut_claiming_without_writing_scores_zero(env):
    assert max(_rewards(env, NoWrite())) == 0.0


def test_shortcut_sloppy_arguments_scores_zero(env):
    assert max(_rewards(env, make_agent("tau:sloppy_arguments"))) == 0.0


def test_shortcut_near_miss_arguments_at_most_005(env):
    rewards = _rewards(env, NearMiss())
    assert sum(rewards) / len(rewards) <= 0.05


def test_shortcut_trial_and_error_at_most_075(env):
    rewards = _rewards(env, TrialAndError())
    assert max(rewards) <= 0.75
    assert sum(rewards) / len(rewards) >= 0.5  # the fixed call still counts, with the penalty


def test_shortcut_extra_write_scores_zero(env):
    accepted = 0
    for s in range(N):
        record = rollout(env, ExtraWrite(), seed=s)
        b = record["reward_breakdown"]
        if b["unrequested_writes"]:  # the extra write went through: the database differs
            accepted += 1
            assert record["reward"] == 0.0, (s, b)
        else:  # the tool rejected it: the database is right, the rejected call costs 0.25
            assert record["reward"] == 0.75, (s, b)
    assert accepted >= N // 4


@pytest.mark.parametrize("agent", ["tau:skip_precondition", "tau:stop_after_first", "tau:wrong_record"])
def test_other_deficits_score_one(env, agent):
    assert min(_rewards(env, make_agent(agent), n=200)) == 1.0


def test_penalty_schedule():
    assert [precision_penalty(k) for k in range(4)] == [1.0, 0.75, 0.5, 0.5]


def test_breakdown_and_task_labels(env):
    record = rollout(env, make_agent("tau:sloppy_arguments"), seed=3)
    b = record["reward_breakdown"]
    assert b["capability"] == "tool_calling_precision" and b["db"] == 0.0 and b["rejected_writes"] >= 1
    assert record["task"]["needs"] == ["tool_calling_precision"]


class GarbledId:
    """The oracle, except that the reservation id in its write has one character changed (what the planted base
    of lab/headline-planted/history.md does after reading the reservation right)."""

    name = "garbled_id"

    def __init__(self):
        self.oracle = make_agent("oracle")

    def reset(self, env, observation, info):
        self.oracle.reset(env, observation, info)
        self.gold = env.task.requests[0].write

    def __call__(self, observation, info):
        action = self.oracle(observation, info)
        rid = self.gold.arguments.get("reservation_id")
        if isinstance(action, str) and rid and self.gold.name in action:
            action = action.replace(rid, rid[:-1] + ("A" if rid[-1] != "A" else "B"))
        return action


def test_target_flow_asks_reads_then_writes_and_the_copy_of_the_id_is_what_pays():
    """``flow="target"``: the request as the target's user says it (the id given when asked), the reads of the
    target's gold path before the write; the oracle still scores 1 and a write with the id garbled scores 0."""
    e = gym.make(ENV_ID, difficulty=1, flow="target", size={"ask_details_prob": 1.0})
    stated = gym.make(ENV_ID, difficulty=1, size={"ask_details_prob": 1.0})
    cancels = 0
    for s in range(40):
        observation, _ = e.reset(seed=s)
        request, task = e.unwrapped.task.requests[0], e.unwrapped.task
        assert request.ask and request.reads and task.scenario.endswith(":target"), (s, task.scenario)
        record = rollout(e, make_agent("oracle"), seed=s)
        assert record["reward"] == 1.0, (s, record["reward_breakdown"])
        if request.kind == "cancel":
            cancels += 1
            rid = request.write.arguments["reservation_id"]
            assert rid not in observation  # the id comes later, when asked
            assert rollout(e, GarbledId(), seed=s)["reward"] == 0.0, s
        stated.reset(seed=s)  # the default flow is unchanged: every value stated, nothing to read
        assert stated.unwrapped.task.requests[0].reads == [] and ":target" not in stated.unwrapped.task.scenario
    assert cancels >= 10
    # No write rests on reasoning: the target's "cheapest flight" changes are drawn again (precision only).
    harder = gym.make(ENV_ID, difficulty=3, flow="target")
    kinds = set()
    for s in range(40):
        harder.reset(seed=s)
        request = harder.unwrapped.task.requests[0]
        kinds.add(request.kind)
        assert "cheapest" not in request.text, (s, request.text)
    assert "flight_change" in kinds
    for env in (e, stated, harder):
        env.close()
    with pytest.raises(ValueError, match="flow"):
        gym.make(ENV_ID, flow="asked")
