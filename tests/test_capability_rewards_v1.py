"""The ``-v1`` τ² capability envs pay only for evidence of the skill (issue: rewards without free credit).

Measured against the envs themselves: every probe that does not use the records (``generators.probes``)
earns at most 0.05 mean over 500 seeds at every difficulty, in both domains; the probes that read and
then ignore what they read earn at most the share of requests their fixed decision fits; the oracle
earns 1.0. The ``-v0`` ids stay registered and keep their published rewards (their own test files).
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401  (registers the ids)
from generators.probes import (PROBE_BOUND, PROBE_SUCCESS_BOUND, ReadThenActAgent, ReadThenRefuseAgent,
                               decision_probe_agents, mean_bound, probe_agents)
from trace_envs.agents import OracleAgent
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.core.registry import latest_capability_id
from trace_envs.rollout import rollout

TAU_CAPABILITIES = ("precondition_verification", "multi_step_completion", "structured_data_reasoning",
                    "tool_calling_precision")
#: 500 seeds per difficulty: 250 in each domain.
SEEDS_PER_DOMAIN = 250


#: Shortcuts a probe finds in a published env, each with the success rate it must not exceed (measured over 250 seeds
#: per difficulty, 2026-12-06). Retail's precondition_verification-v1 pays a refusal made after one read with any
#: message: reading once, then restating every id and number heard and saying goodbye solves 0.24 (difficulty 1) to
#: 0.38 (3-5) of its tasks (airline: 0). The fix changes the reward, so it is a -v2 of the env, not an edit of -v1.
KNOWN_SHORTCUTS = {("precondition_verification", "retail", "probe:read_then_echo"): 0.40}


def _mean(env, agent, seeds) -> float:
    return _scores(env, agent, seeds)[0]


def _scores(env, agent, seeds) -> tuple[float, float]:
    """(mean reward, success rate) of ``agent`` on ``seeds``."""
    records = [rollout(env, agent, seed=s) for s in seeds]
    return sum(r["reward"] for r in records) / len(records), sum(r["success"] for r in records) / len(records)


def test_latest_ids_are_v1():
    for cap in TAU_CAPABILITIES:
        assert latest_capability_id(cap) == f"trace/{cap}-v1"
    assert latest_capability_id("swe_localization") == "trace/swe_localization-v0"


@pytest.mark.slow
@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("capability", TAU_CAPABILITIES)
def test_no_probe_that_ignores_the_records_earns_credit(capability, difficulty):
    env_id = latest_capability_id(capability)
    scores, successes = {}, {}
    bounds = {agent.name: mean_bound(agent, PROBE_BOUND) for agent in probe_agents(0)}
    for domain in ("airline", "retail"):
        env = gym.make(env_id, domain=domain, difficulty=difficulty)
        seeds = range(SEEDS_PER_DOMAIN)
        for agent in probe_agents(0):
            scores[(domain, agent.name)], successes[(domain, agent.name)] = _scores(env, agent, seeds)
        assert _mean(env, OracleAgent(), range(40)) == 1.0
        env.close()
    # A probe's mean is bounded by its own bound (PROBE_BOUND, unless it makes a legitimate read that the env may
    # credit partially: generators.probes.mean_bound); every probe's success rate by PROBE_SUCCESS_BOUND.
    over = {k: round(v, 3) for k, v in scores.items() if v > bounds[k[1]]}
    assert not over, f"{env_id} difficulty {difficulty}: probes above their bound: {over}"
    solved = {k: round(v, 3) for k, v in successes.items()
              if v > KNOWN_SHORTCUTS.get((capability, *k), PROBE_SUCCESS_BOUND)}
    assert not solved, f"{env_id} difficulty {difficulty}: probes that succeed: {solved}"
    # The mean over both domains (500 seeds) is what the env's Shortcuts section promises.
    for agent in probe_agents(0):
        both = (scores[("airline", agent.name)] + scores[("retail", agent.name)]) / 2
        assert both <= bounds[agent.name], (agent.name, both)


@pytest.mark.parametrize("difficulty", [1, 3, 5])
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_precondition_decisions_are_balanced_and_the_prior_is_worth_half(domain, difficulty):
    env = gym.make(latest_capability_id("precondition_verification"), domain=domain, difficulty=difficulty)
    seeds = range(400)
    decisions = []
    for s in seeds:
        _, info = env.reset(seed=s)
        decisions.append(env.unwrapped.task.requests[0].decision)
    refuse_share = decisions.count("refuse") / len(decisions)
    assert 0.43 <= refuse_share <= 0.57, refuse_share
    refuse = _mean(env, ReadThenRefuseAgent(), seeds)
    act = _mean(env, ReadThenActAgent(), seeds)
    # A fixed decision after reading scores at most the share of requests it fits.
    assert refuse <= refuse_share + 1e-9, (refuse, refuse_share)
    assert act <= (1 - refuse_share) + 1e-9, (act, 1 - refuse_share)
    assert refuse > 0 and act > 0  # the reads count: reading is the evidence the probes lack


def test_decision_probes_are_the_two_fixed_decisions():
    assert {a.name for a in decision_probe_agents()} == {"decision:read_then_refuse", "decision:read_then_act"}


class _Scripted:
    """Plays a fixed list of actions (after them: a goodbye)."""

    def __init__(self, actions):
        self.actions, self.i = list(actions), 0

    def reset(self, env, observation, info):
        self.i = 0

    def __call__(self, observation, info):
        self.i += 1
        return self.actions[self.i - 1] if self.i <= len(self.actions) else "Goodbye."


def _seed_with(env, decision: str, domain_family: str | None = None) -> int:
    for s in range(200):
        env.reset(seed=s)
        r = env.unwrapped.task.requests[0]
        if r.decision == decision and (domain_family is None or r.kind == domain_family):
            return s
    raise AssertionError(f"no {decision} task in 200 seeds")


def test_precondition_refusal_credit_needs_the_read_record():
    env = gym.make("trace/precondition_verification-v1", domain="airline", difficulty=1)
    s = _seed_with(env, "refuse")
    task = env.unwrapped.task
    r = task.requests[0]
    reads = [hermes_tool_call(c.name, c.arguments) for c in env.unwrapped.evidence_calls(r)]
    reason = f"I'm sorry, this {r.communicate[0]}."
    unread = rollout(env, _Scripted([reason]), seed=s)
    assert unread["reward"] == 0.0 and unread["reward_breakdown"]["evidence"] is False
    silent = rollout(env, _Scripted(reads + ["I'm sorry, I can't do that."]), seed=s)
    assert silent["reward"] == 0.5 and silent["reward_breakdown"]["evidence"] is True
    explained = rollout(env, _Scripted(reads + [reason]), seed=s)
    assert explained["reward"] == 1.0 and explained["reward_breakdown"]["success"] is True
    # Reading and then ending without a word is no refusal.
    quiet = rollout(env, _Scripted(reads + [reads[-1], reads[-1], reads[-1]]), seed=s)
    assert quiet["reward"] == 0.0
    # The same unread refusal earned the silent-refusal credit on -v0 (why v1 exists).
    v0 = gym.make("trace/precondition_verification-v0", domain="airline", difficulty=1)
    s0 = _seed_with(v0, "refuse")
    assert rollout(v0, _Scripted(["I'm sorry, I can't do that."]), seed=s0)["reward"] == 0.5


def test_precondition_allowed_write_needs_the_record_read_first():
    env = gym.make("trace/precondition_verification-v1", domain="airline", difficulty=1)
    s = _seed_with(env, "act")
    r = env.unwrapped.task.requests[0]
    write = hermes_tool_call(r.write.name, r.write.arguments)
    reads = [hermes_tool_call(c.name, c.arguments) for c in env.unwrapped.evidence_calls(r)]
    blind = rollout(env, _Scripted([write, "Done."]), seed=s)
    assert blind["reward_breakdown"]["exact"] and blind["reward"] == 0.0
    late = rollout(env, _Scripted([write] + reads + ["Done."]), seed=s)
    assert late["reward"] == 0.0  # the evidence came after the decision
    assert rollout(env, OracleAgent(), seed=s)["reward"] == 1.0


def test_multi_step_gives_no_attempt_credit():
    env = gym.make("trace/multi_step_completion-v1", domain="airline", difficulty=1)
    v0 = gym.make("trace/multi_step_completion-v0", domain="airline", difficulty=1)
    for e in (env, v0):
        e.reset(seed=0)
    r = env.unwrapped.task.requests
    writes = [q for q in r if q.write is not None]
    assert writes, "seed 0 has a write request"
    q = writes[0]
    # The write's tool with its gold arguments but no read first: credited on v0, uninformed on v1.
    blind = [hermes_tool_call(q.write.name, q.write.arguments), f"{q.message} {q.done_message}"]
    t1 = rollout(env, _Scripted(blind), seed=0)
    assert t1["reward"] == 0.0 and t1["reward_breakdown"]["uninformed"] == 1
    assert rollout(v0, _Scripted(blind), seed=0)["reward"] > 0.0


def test_tool_calling_precision_needs_authentication_first():
    env = gym.make("trace/tool_calling_precision-v1", domain="airline", difficulty=1)
    env.reset(seed=0)
    task = env.unwrapped.task
    q = task.requests[0]
    write = hermes_tool_call(q.write.name, q.write.arguments)
    auth = [hermes_tool_call(c.name, c.arguments) for c in task.auth]
    assert rollout(env, _Scripted([write, "Done."]), seed=0)["reward"] == 0.0
    assert rollout(env, _Scripted(auth + [write, "Done."]), seed=0)["reward"] == 1.0


def test_v0_ids_still_open_and_keep_their_rewards():
    for cap in TAU_CAPABILITIES:
        env = gym.make(f"trace/{cap}-v0")
        assert env.unwrapped.version == 0
        assert rollout(env, OracleAgent(), seed=3)["reward"] == 1.0
    with pytest.raises(ValueError, match="version must be one of"):
        gym.make("trace/precondition_verification-v1", version=7)


#: The most each env's own planted-deficit agent may earn on its v1 id (measured over 150 seeds, both domains:
#: 0.45, 0.33, 0.00, 0.00).
OWN_DEFICIT_BOUND = {"precondition_verification": 0.5, "multi_step_completion": 0.34,
                     "structured_data_reasoning": 0.05, "tool_calling_precision": 0.05}


@pytest.mark.parametrize("capability", TAU_CAPABILITIES)
def test_each_v1_env_isolates_its_capability(capability):
    from conftest import deficit_scores

    env = gym.make(latest_capability_id(capability), domain=None).unwrapped
    scores = deficit_scores(env, range(150))
    assert scores[capability] <= OWN_DEFICIT_BOUND[capability], scores
    for other, score in scores.items():
        # Without attempt credit, sloppy tool arguments cost every write (0.12-0.61 measured); the
        # other deficits leave the env's own skill untouched.
        if other not in (capability, "tool_calling_precision"):
            assert score >= 0.95, (other, score)
