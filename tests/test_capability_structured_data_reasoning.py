"""``trace/structured_data_reasoning-v0``: oracle, variety, isolation, and every documented shortcut's bound.

The 500-seed loops drive one env instance directly (``rollout(env, agent, seed)``); each shortcut is
a scripted agent that sees the task (and the env's look-alike values) and plays one behaviour.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import trace_envs
from trace_envs import make_agent, rollout
from trace_envs.capabilities.structured_data_reasoning import REJECTED_CREDIT, StructuredDataReasoningEnv, stated
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import ANYTHING_ELSE, CONFIRM
from trace_envs.domains.airline.tasks import TODAY

from conftest import distinct_tasks

ENV_ID = "trace/structured_data_reasoning-v0"
N = 500


@pytest.fixture(scope="module")
def env():
    e = StructuredDataReasoningEnv(version=0, domain=None)  # the domain drawn per episode: both targets
    yield e
    e.close()


class _Plan:
    """A shortcut agent: ``plan(env) -> list of turns``, replayed in order."""

    name = "shortcut"

    def reset(self, env, observation, info):
        self.turns, self.i = self.plan(env), 0

    def __call__(self, observation, info):
        turn = self.turns[self.i] if self.i < len(self.turns) else ANYTHING_ELSE
        self.i += 1
        return turn

    @staticmethod
    def prefix(task, reads=True):
        turns = [task.auth_message] if task.auth_message else []
        calls = list(task.auth) + (list(task.requests[0].reads) if reads else [])
        return turns + [hermes_tool_call(c.name, c.arguments) for c in calls]


class EveryCandidate(_Plan):
    """Reads everything, then states every candidate value (questions) or writes every candidate (changes)."""

    def plan(self, env):
        task = env.task
        r = task.requests[0]
        turns = self.prefix(task)
        if r.decision == "answer":
            values = r.communicate + env.lookalike_facts
            return turns + [f"It is one of these: {'; '.join(values)}. {ANYTHING_ELSE}"]
        turns.append(f"{r.message} {CONFIRM}")
        turns += [hermes_tool_call(c.name, c.arguments) for c in (r.write, r.wrong_write)]
        return turns + [f"{r.done_message} {ANYTHING_ELSE}"]


def _guess_like(fact: str, rng) -> str:
    """A plausible value of the same shape as ``fact`` (what an agent that did not read would say)."""
    if fact.startswith("$"):
        return f"${int(rng.integers(20, 1500))}"
    if fact.endswith("free checked bag"):
        return f"{int(rng.integers(1, 10))} free checked bag"
    if fact.isdigit():
        return str(int(rng.integers(10**11, 10**12)))
    if "." in fact:
        return f"{rng.integers(5, 2000)}.{rng.integers(0, 100):02d}"
    return "I'm not sure"


def _guess_args(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return 1
    if isinstance(value, str):
        return "guess"
    if isinstance(value, list):
        return []
    return {}


class GuessWithoutReading(_Plan):
    """Authenticates, reads nothing, then guesses: a plausible value, or the write with guessed arguments."""

    def plan(self, env):
        task = env.task
        r = task.requests[0]
        rng = np.random.default_rng(env._seed)
        turns = self.prefix(task, reads=False)
        if r.decision == "answer":
            return turns + [f"That would be {', '.join(_guess_like(f, rng) for f in r.communicate)}. {ANYTHING_ELSE}"]
        args = {k: _guess_args(v) for k, v in r.write.arguments.items()}
        return turns + [f"Sure. {CONFIRM}", hermes_tool_call(r.write.name, args), f"Done. {ANYTHING_ELSE}"]


class Refuser(_Plan):
    def plan(self, env):
        return self.prefix(env.task) + [f"I'm sorry, but I can't help with that. {ANYTHING_ELSE}"]


def _rewards(env, agent, n=N):
    return [rollout(env, agent, seed=s)["reward"] for s in range(n)]


def test_registered_and_made_through_gym():
    entry = trace_envs.get_entry(ENV_ID)
    assert entry.kind == "capability" and entry.capability == "structured_data_reasoning"
    assert entry.target == "tau_airline" and entry.kwargs == {"domain": "airline", "version": 0}
    e = gym.make(ENV_ID)
    assert rollout(e, make_agent("oracle"), seed=0)["reward_breakdown"]["domain"] == "airline"
    e = gym.make(ENV_ID, domain="retail")
    assert rollout(e, make_agent("oracle"), seed=0)["reward_breakdown"]["domain"] == "retail"


def test_oracle_scores_one_on_500_seeds(env):
    domains, kinds = set(), {}
    for s in range(N):
        t = rollout(env, make_agent("oracle"), seed=s)
        assert t["reward"] == 1.0, (s, t["reward_breakdown"])
        b = t["reward_breakdown"]
        domains.add(b["domain"])
        kinds[b["kind"]] = kinds.get(b["kind"], 0) + 1
        assert env.lookalike_facts or b["kind"] == "change"
    assert domains == {"airline", "retail"}
    assert 0.25 * N <= kinds["change"] <= 0.45 * N  # WRITE_SHARE = 0.35


def test_1000_seeds_give_at_least_950_distinct_tasks(env):
    assert distinct_tasks(env, range(1000)) >= 950


def test_shortcut_stating_every_candidate_scores_zero(env):
    rewards = _rewards(env, EveryCandidate())
    assert max(rewards) == 0.0


def test_shortcut_guessing_without_reading_is_bounded(env):
    rewards = _rewards(env, GuessWithoutReading())
    assert sum(rewards) / len(rewards) <= 0.05


def test_shortcut_wrong_record_is_bounded(env):
    rewards = _rewards(env, make_agent("tau:wrong_record"))
    assert sum(rewards) / len(rewards) <= 0.05


def test_shortcut_refusing_scores_zero(env):
    assert max(_rewards(env, Refuser())) == 0.0


@pytest.mark.parametrize("agent", ["tau:skip_precondition", "tau:stop_after_first"])
def test_other_deficits_score_one(env, agent):
    assert min(_rewards(env, make_agent(agent), n=100)) == 1.0


def test_sloppy_arguments_keeps_question_credit_and_half_on_changes(env):
    rewards = []
    for s in range(200):
        t = rollout(env, make_agent("tau:sloppy_arguments"), seed=s)
        expected = 1.0 if t["reward_breakdown"]["kind"] == "question" else REJECTED_CREDIT
        assert t["reward"] == expected, (s, t["reward_breakdown"])
        rewards.append(t["reward"])
    assert sum(rewards) / len(rewards) >= 0.75


@pytest.mark.parametrize("domain", ["airline", "retail"])
@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_every_difficulty_and_domain(domain, difficulty):
    e = StructuredDataReasoningEnv(version=0, domain=domain, difficulty=difficulty)
    kinds = set()
    for s in range(6):
        t = rollout(e, make_agent("oracle"), seed=s)
        assert t["reward"] == 1.0 and t["reward_breakdown"]["difficulty"] == difficulty, t["reward_breakdown"]
        assert t["reward_breakdown"]["n_lookalikes"] == {1: 1, 2: 2, 3: 2, 4: 3, 5: 4}[difficulty]
        kinds.add(t["reward_breakdown"]["kind"])
        assert rollout(e, make_agent("tau:wrong_record"), seed=s)["reward"] == 0.0
    assert "question" in kinds


def test_stated_matches_whole_values_only():
    assert stated("$50", "That is $50 in total.") and stated("12.50", "it costs $12.50.")
    assert not stated("$50", "That is $500.") and not stated("$50", "That is $50.25.")
    assert not stated("2.50", "it costs $12.50") and stated("$1200", "It is $1,200.")
    assert stated("3 free checked bag", "You get 3 free checked bags.")
    assert not stated("3 free checked bag", "You get 13 free checked bags.")


def test_lookalike_value_costs_the_answer():
    e = StructuredDataReasoningEnv(version=0, domain="airline", difficulty=2)
    seed = next(s for s in range(40) if (e.reset(seed=s), e.task.requests[0].decision)[1] == "answer")

    class RightThenLookalike(_Plan):
        def plan(self, env):
            r = env.task.requests[0]
            return self.prefix(env.task) + [f"{r.message} Or maybe {env.lookalike_facts[0]}. {ANYTHING_ELSE}"]

    t = rollout(e, RightThenLookalike(), seed=seed)
    assert t["reward"] == 0.0 and t["reward_breakdown"]["lookalikes_stated"]
    assert rollout(e, make_agent("oracle"), seed=seed)["reward"] == 1.0


@pytest.mark.parametrize("bad", [0, 6, "3"])
def test_difficulty_is_validated(bad):
    with pytest.raises(ValueError, match="difficulty"):
        StructuredDataReasoningEnv(version=0, difficulty=bad)


def test_conformance_in_the_retail_domain():
    """The registry entry pins airline (TRL needs one tool set per id); retail passes the same checks."""
    trace_envs.check_trace_env(ENV_ID, n_seeds=10, env_kwargs={"domain": "retail"}).raise_if_failed()


class StatusByDate(_Plan):
    """Calls ``get_flight_status`` right, then answers with the status the date makes likeliest, unread.

    The tiny base model's misreading (a flight today "is in the air (flying)"); ``read=False`` makes
    the same guess without the call.
    """

    def __init__(self, read: bool = True):
        self.read = read

    def plan(self, env):
        from trace_envs.domains.airline.tasks import STATUS_WORDS

        r = env.task.requests[0]
        day = r.reads[0].arguments["date"]
        guess = "flying" if day == TODAY else "landed"
        return self.prefix(env.task, reads=self.read) + [
            f"I checked: flight {r.reads[0].arguments['flight_number']} on {day} {STATUS_WORDS[guess]}. "
            f"{ANYTHING_ELSE}"]


@pytest.mark.parametrize("difficulty", [1, 2])
def test_a_flight_status_must_be_read_from_the_tool_not_guessed_from_the_date(difficulty):
    """The look-up levels ask for a flight's status: the oracle scores 1, a date-based guess rarely does."""
    e = StructuredDataReasoningEnv(version=0, domain="airline", difficulty=difficulty)
    seeds = [s for s in range(200) if (e.reset(seed=s), e.task.requests[0].kind)[1] == "sdr_question:flight_status"]
    assert len(seeds) >= 25, len(seeds)
    days = []
    for s in seeds:
        assert rollout(e, make_agent("oracle"), seed=s)["reward"] == 1.0, s
        assert rollout(e, make_agent("tau:wrong_record"), seed=s)["reward"] == 0.0, s
        days.append(e.task.requests[0].reads[0].arguments["date"])
    # The target's mix of days: mostly today, and future flights too, so that the call must copy the asked day.
    assert days.count(TODAY) > len(days) / 2 and any(d > TODAY for d in days), days
    guessed = [rollout(e, StatusByDate(), seed=s)["reward"] for s in seeds]
    assert 0 < np.mean(guessed) <= 0.5, np.mean(guessed)  # right only when the likeliest status is the one
    assert [rollout(e, StatusByDate(read=False), seed=s)["reward"] for s in seeds] == [0.0] * len(seeds)
    assert rollout(e, EveryCandidate(), seed=seeds[0])["reward"] == 0.0
    e.close()
    deeper = StructuredDataReasoningEnv(version=0, domain="airline", difficulty=3)
    assert all((deeper.reset(seed=s), deeper.task.requests[0].kind)[1] != "sdr_question:flight_status"
               for s in range(60))
    deeper.close()
