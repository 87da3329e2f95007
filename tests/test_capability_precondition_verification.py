"""``trace/precondition_verification-v0``: oracle, shortcuts with their documented bounds, variety, isolation.

The 500-seed loops drive one env instance directly (``rollout(env, agent, seed)``), not ``gym.make``
per episode, so the whole file stays fast.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import trace_envs
from trace_envs import rollout
from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.domains.agents import TauScriptedAgent

from conftest import PlannedAgent, deficit_scores, distinct_tasks, guess_argument, mean_reward

ENV_ID = "trace/precondition_verification-v0"
N = 500


def _PerTask(name, plan):
    return PlannedAgent(name, plan, fallback="Goodbye.")


def _refuse_all(task):
    return ["I'm sorry, but I can't help with that request. Is there anything else I can help you with?"]


def _do_nothing(task):
    return ["Thank you for contacting us. Goodbye."]


def _guessed_write(task):
    r = task.requests[0]
    call = r.write or r.forbidden_write
    args = {k: guess_argument(v) for k, v in call.arguments.items()}
    return ["Sure. Do you confirm (yes/no)?", hermes_tool_call(call.name, args),
            "Done. Is there anything else I can help you with?"]


@pytest.fixture(scope="module")
def env():
    e = PreconditionVerificationEnv(version=0)
    yield e
    e.close()


def test_registered_and_made_through_gym():
    entry = trace_envs.get_entry(ENV_ID)
    assert entry.kind == "capability" and entry.capability == "precondition_verification"
    assert entry.target.startswith("tau_")
    e = gym.make(ENV_ID)
    obs, info = e.reset(seed=3)
    assert info["tools"] and "get_user_details" in {t["function"]["name"] for t in info["tools"]}
    e.close()


def test_oracle_scores_one_on_500_seeds(env):
    domains = set()
    for seed in range(N):
        t = rollout(env, trace_envs.OracleAgent(), seed=seed)
        assert t["reward"] == 1.0, (seed, t["reward_breakdown"])
        domains.add(env.domain_name)
    assert domains == {"airline", "retail"}


def test_shortcut_refuse_everything_is_bounded(env):
    assert mean_reward(env, _PerTask("refuse_all", _refuse_all), range(N)) <= 0.40


def test_shortcut_write_without_checking_is_bounded(env):
    assert mean_reward(env, TauScriptedAgent(["precondition_verification"]), range(N)) <= 0.50


def test_shortcut_guessed_arguments_is_bounded(env):
    assert mean_reward(env, _PerTask("guessed", _guessed_write), range(N)) <= 0.40


def test_shortcut_doing_nothing_is_bounded(env):
    assert mean_reward(env, _PerTask("nothing", _do_nothing), range(N)) <= 0.40


def test_1000_seeds_give_at_least_950_distinct_tasks(env):
    assert distinct_tasks(env, range(1000)) >= 950


def test_isolates_its_capability():
    """The agent lacking precondition verification scores low; agents lacking the others score high."""
    scores = deficit_scores(PreconditionVerificationEnv(version=0), range(150))
    for capability, score in scores.items():
        if capability == "precondition_verification":
            assert score <= 0.5, score
        else:
            assert score >= 0.85, (capability, score)


@pytest.mark.parametrize("domain", ["airline", "retail"])
@pytest.mark.parametrize("difficulty", [1, 2, 3, 4, 5])
def test_every_difficulty_and_domain(domain, difficulty):
    e = PreconditionVerificationEnv(version=0, domain=domain, difficulty=difficulty)
    decisions = set()
    for seed in range(12):
        t = rollout(e, trace_envs.OracleAgent(), seed=seed)
        assert t["reward"] == 1.0 and t["reward_breakdown"]["difficulty"] == difficulty
        assert e.domain_name == domain and e.task_info()["difficulty"] == difficulty
        decisions.add(e.task.requests[0].decision)
    assert decisions == {"act", "refuse"}


def test_false_claims_appear_at_high_difficulty():
    texts = []
    e = PreconditionVerificationEnv(version=0, domain="airline", difficulty=5)
    for seed in range(40):
        e.reset(seed=seed)
        if e.task.requests[0].decision == "refuse":
            texts.append(e.task.user.opening)
    claims = ("within 24 hours", "economy ticket", "airline cancelled", "removed any time", "ruined my plans")
    assert texts and all(any(c in t for c in claims) for t in texts)


@pytest.mark.parametrize("bad", [0, 6, 2.5, "3", True])
def test_difficulty_is_validated(bad):
    with pytest.raises(ValueError, match="difficulty"):
        PreconditionVerificationEnv(version=0, difficulty=bad)


def test_domain_is_validated():
    with pytest.raises(ValueError, match="domain"):
        PreconditionVerificationEnv(version=0, domain="telecom")


def test_forbidden_write_scores_zero_and_silent_refusal_half():
    e = PreconditionVerificationEnv(version=0, domain="retail")
    seed = next(s for s in range(50) if (e.reset(seed=s), e.task.requests[0].decision)[1] == "refuse")
    t = rollout(e, TauScriptedAgent(["precondition_verification"]), seed=seed)
    assert t["reward"] == 0.0 and t["reward_breakdown"]["forbidden_write"]
    t = rollout(e, _PerTask("nothing", _do_nothing), seed=seed)
    assert t["reward"] == 0.5 and t["reward_breakdown"]["missing"]


def test_conformance_in_the_retail_domain():
    """The registry entry pins airline (TRL needs one tool set per id); retail passes the same checks."""
    trace_envs.check_trace_env(ENV_ID, n_seeds=10, env_kwargs={"domain": "retail"}).raise_if_failed()
