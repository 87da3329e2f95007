"""``trace/multi_step_completion-v0``: oracle, shortcuts with their documented bounds, variety, isolation.

The 500-seed loops drive one env instance directly (``rollout(env, agent, seed)``), not ``gym.make``
per episode, so the whole file stays fast.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import trace_envs
from trace_envs import rollout
from trace_envs.capabilities.multi_step_completion import REQUESTS, MultiStepCompletionEnv
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import TauScriptedAgent

from conftest import PlannedAgent, deficit_scores, distinct_tasks, guess_argument, mean_reward

ENV_ID = "trace/multi_step_completion-v0"
N = 500
ANYTHING_ELSE = "Is there anything else I can help you with?"


def _PerTask(name, plan):
    return PlannedAgent(name, plan, fallback=ANYTHING_ELSE)


def _end_at_once(task):
    return ["Thank you for reaching out, have a nice day. Goodbye."]


def _guessed_writes(task):
    turns = []
    for r in task.requests:
        if r.write is not None:
            turns += ["I'll take care of that. Do you confirm (yes/no)?",
                      hermes_tool_call(r.write.name, {k: guess_argument(v) for k, v in r.write.arguments.items()}),
                      f"Done. {ANYTHING_ELSE}"]
        else:
            turns.append(f"I have noted your question. {ANYTHING_ELSE}")
    return turns


@pytest.fixture(scope="module")
def env():
    e = MultiStepCompletionEnv(version=0)
    yield e
    e.close()


def test_registered_and_made_through_gym():
    entry = trace_envs.get_entry(ENV_ID)
    assert entry.kind == "capability" and entry.capability == "multi_step_completion"
    assert entry.target.startswith("tau_")
    e = gym.make(ENV_ID)
    obs, info = e.reset(seed=5)
    assert "First," in info["messages"][1]["content"] and "Second," in info["messages"][1]["content"]
    e.close()


def test_oracle_scores_one_on_500_seeds(env):
    domains = set()
    for seed in range(N):
        t = rollout(env, trace_envs.OracleAgent(), seed=seed)
        assert t["reward"] == 1.0, (seed, t["reward_breakdown"])
        assert t["reward_breakdown"]["n_requests"] == 3
        domains.add(env.domain_name)
    assert domains == {"airline", "retail"}


def test_shortcut_stop_after_first_is_bounded(env):
    """Handling only the first of three requests earns 1/3 (each later one is checked on its own)."""
    rewards = [rollout(env, TauScriptedAgent(["multi_step_completion"]), seed=s)["reward"] for s in range(N)]
    assert sum(rewards) / N <= 0.36
    assert max(rewards) <= 0.34 + 1e-9


def test_shortcut_ending_at_once_scores_zero(env):
    assert mean_reward(env, _PerTask("end", _end_at_once), range(N)) == 0.0


def test_shortcut_guessed_arguments_is_bounded(env):
    assert mean_reward(env, _PerTask("guessed", _guessed_writes), range(N)) <= 0.75


def test_unrequested_writes_cost(env):
    """A successful write nobody asked for costs 0.25: the oracle plus one extra, different write."""
    extra = None
    for seed in range(200):
        env.reset(seed=seed)
        for r in env.task.requests:
            if r.write is not None and r.write.name == "modify_user_address":
                extra = hermes_tool_call(r.write.name, {**r.write.arguments, "address1": "1 Extra Street"})
            elif r.write is not None and r.write.name == "send_certificate":
                extra = hermes_tool_call(r.write.name, {**r.write.arguments, "amount": r.write.arguments["amount"] + 1})
        if extra:
            break
    assert extra, "no seed with a repeatable write in 200 draws"

    class _Extra(TauScriptedAgent):
        def reset(self, env_, observation, info):
            super().reset(env_, observation, info)
            self._policy.turns[-1:-1] = [extra]

    t = rollout(env, _Extra(), seed=seed)
    assert t["reward_breakdown"]["unrequested_writes"] == 1
    assert t["reward"] == pytest.approx(0.75)


def test_1000_seeds_give_at_least_950_distinct_tasks(env):
    assert distinct_tasks(env, range(1000)) >= 950


def test_isolates_its_capability():
    """The agent lacking multi-step completion scores low; agents lacking the others score high."""
    scores = deficit_scores(MultiStepCompletionEnv(version=0), range(100))
    for capability, score in scores.items():
        if capability == "multi_step_completion":
            assert score <= 0.36, score
        else:
            assert score >= 0.75, (capability, score)


@pytest.mark.parametrize("domain", ["airline", "retail"])
@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_every_difficulty_and_domain(domain, difficulty):
    e = MultiStepCompletionEnv(version=0, domain=domain, difficulty=difficulty)
    lo, hi = REQUESTS[difficulty]
    for seed in range(8):
        t = rollout(e, trace_envs.OracleAgent(), seed=seed)
        assert t["reward"] == 1.0 and t["reward_breakdown"]["difficulty"] == difficulty
        assert lo <= len(e.task.requests) <= hi and e.domain_name == domain
        assert all(r.decision != "refuse" and not r.needs_reasoning for r in e.task.requests)


@pytest.mark.parametrize("bad", [0, 6, 2.5, "x"])
def test_difficulty_is_validated(bad):
    with pytest.raises(ValueError, match="difficulty"):
        MultiStepCompletionEnv(version=0, difficulty=bad)


def test_conformance_in_the_retail_domain():
    """The registry entry pins airline (TRL needs one tool set per id); retail passes the same checks."""
    trace_envs.check_trace_env(ENV_ID, n_seeds=10, env_kwargs={"domain": "retail"}).raise_if_failed()
