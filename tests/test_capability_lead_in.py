"""Lead-in questions (``lead_in``): a capability env's episode may open with one of the target's other questions.

Why: an adapter trained only on its capability's requests forgot the target's others (the planted recipe's
precondition adapter answered 1 of 54 flight-status requests; the base 43). With ``lead_in``, an episode opens
with a question of another target family, answered from the records without a write, and succeeds only if that
question is answered too; the capability's own request and reward are unchanged.
"""

from __future__ import annotations

import collections

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401  (registers the ids)
from trace_envs.agents import OracleAgent
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.rollout import rollout

LEAD_IN_ENVS = ("trace/precondition_verification-v1", "trace/structured_data_reasoning-v1",
                "trace/tool_calling_precision-v1")


class _SkipsTheQuestion:
    """The oracle, except that the lead-in question's answer is replaced by a message without its facts."""

    def __init__(self):
        self.oracle = OracleAgent()

    def reset(self, env, observation, info):
        self.oracle.reset(env, observation, info)
        self.env = env
        self.skipped = False

    def __call__(self, observation, info):
        action = self.oracle(observation, info)
        facts = self.env.unwrapped.task.requests[0].communicate
        if not self.skipped and isinstance(action, str) and any(f.lower() in action.lower() for f in facts):
            self.skipped = True
            return "Let me look into that later. Is there anything else I can help you with?"
        return action


@pytest.mark.parametrize("env_id", LEAD_IN_ENVS)
def test_the_oracle_answers_the_lead_in_and_does_the_skill(env_id):
    env = gym.make(env_id, domain="airline", lead_in=["flight_status", "info"], lead_in_prob=1.0)
    seen = collections.Counter()
    for seed in range(24):
        t = rollout(env, OracleAgent(), seed=seed)
        task = env.unwrapped.task
        assert task.requests[0].kind in ("flight_status", "info") and task.requests[0].decision == "answer"
        assert task.requests[0].write is None and len(task.requests) == 2
        assert env.unwrapped.skill_request is task.requests[1]
        assert t["task"]["lead_in"] == task.requests[0].kind and t["reward_breakdown"]["lead_in_answered"] is True
        assert t["reward"] == 1.0, (seed, t["reward_breakdown"])
        # The question opens the conversation; the capability's request comes after it.
        assert task.requests[0].text in t["messages"][1]["content"]
        seen[task.requests[0].kind] += 1
    assert set(seen) == {"flight_status", "info"}
    env.close()


@pytest.mark.parametrize("env_id", LEAD_IN_ENVS)
def test_an_unanswered_lead_in_question_earns_nothing(env_id):
    env = gym.make(env_id, domain="airline", lead_in=["flight_status"], lead_in_prob=1.0)
    for seed in range(6):
        t = rollout(env, _SkipsTheQuestion(), seed=seed)
        breakdown = t["reward_breakdown"]
        assert breakdown["lead_in"] == "flight_status" and breakdown["lead_in_answered"] is False
        assert t["reward"] == 0.0 and t["success"] is False
    env.close()


def test_the_skill_alone_still_decides_the_reward_after_a_lead_in():
    """The precondition env's refusal credit rules hold after the question: an unread refusal earns 0, an
    unexplained one 0.5 (the question's answer is no reason), the oracle 1.0."""
    env = gym.make("trace/precondition_verification-v1", domain="airline", difficulty=1, lead_in=["flight_status"],
                   lead_in_prob=1.0)
    seed = next(s for s in range(200) if env.reset(seed=s) and env.unwrapped.skill_request.decision == "refuse")
    task = env.unwrapped.task
    question, request = task.requests
    answer = [hermes_tool_call(c.name, c.arguments) for c in question.reads] + \
        [f"I checked: {' '.join(question.communicate)}. Is there anything else?"]
    reads = [hermes_tool_call(c.name, c.arguments) for c in env.unwrapped.evidence_calls(request)]

    class Plays:
        def __init__(self, actions):
            self.actions = actions

        def reset(self, env, observation, info):
            self.i = 0

        def __call__(self, observation, info):
            self.i += 1
            return self.actions[self.i - 1] if self.i <= len(self.actions) else "Goodbye."

    auth = [hermes_tool_call(c.name, c.arguments) for c in task.auth]
    unread = rollout(env, Plays(auth + answer + [f"I'm sorry, this {request.communicate[0]}."]), seed=seed)
    assert unread["reward"] == 0.0 and unread["reward_breakdown"]["lead_in_answered"] is True
    silent = rollout(env, Plays(auth + answer + reads + ["I'm sorry, I can't do that."]), seed=seed)
    assert silent["reward"] == 0.5
    assert rollout(env, OracleAgent(), seed=seed)["reward"] == 1.0
    env.close()


def test_the_share_of_lead_ins_follows_lead_in_prob_and_defaults_to_none():
    with_lead = gym.make("trace/precondition_verification-v1", lead_in=["flight_status"])  # prob 0.5 by default
    without = gym.make("trace/precondition_verification-v1")
    opened = 0
    for seed in range(200):
        with_lead.reset(seed=seed)
        opened += with_lead.unwrapped.skill_index
        without.reset(seed=seed)
        assert without.unwrapped.skill_index == 0 and len(without.unwrapped.task.requests) == 1
    assert 80 <= opened <= 120
    with_lead.close()
    without.close()


@pytest.mark.parametrize("kwargs, message", [
    ({"lead_in": ["nope"]}, "lead_in: unknown request families ['nope']"),
    ({"lead_in_prob": 0.3}, "lead_in_prob needs lead_in"),
    ({"lead_in": ["flight_status"], "lead_in_prob": 1.5}, "lead_in_prob must be a number in [0, 1]"),
    ({"lead_in": ["flight_status"], "lead_in_prob": True}, "lead_in_prob must be a number in [0, 1]"),
    ({"lead_in": [3]}, "lead_in must be a list of target request families"),
])
def test_bad_lead_in_arguments_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gym.make("trace/precondition_verification-v1", **kwargs)


def test_a_question_that_needs_a_write_cannot_lead_in_and_multi_step_takes_none():
    env = gym.make("trace/precondition_verification-v1", lead_in=["cancel"], lead_in_prob=1.0)
    with pytest.raises(RuntimeError, match="lead-in questions must be requests answered without a write"):
        env.reset(seed=0)
    env.close()
    with pytest.raises(ValueError, match="takes no lead_in"):
        gym.make("trace/multi_step_completion-v1", lead_in=["flight_status"])


def test_a_generated_env_never_leads_in_with_its_own_focus(tmp_path):
    """The generated env (offline template) drops its focus families from ``lead_in``: the question is one of the
    target's *other* requests."""
    import importlib.util

    from generators.offline import render

    spec = {"name": "precondition_verification", "target_env": "trace/tau_airline-v0",
            "definition": "Checks the policy before a write.", "statistics": {"delta": 0.5, "coverage": 0.3},
            "failure_families": {"cancel": 20}}
    source = render(spec, env_id="gen/lead-v0", run_id="t", focus_share=1.0).source
    path = tmp_path / "lead_env.py"
    path.write_text(source)
    module_spec = importlib.util.spec_from_file_location("lead_env", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    assert module.FOCUS_FAMILIES == ("cancel",)
    env = getattr(module, module.REGISTRATION["class"])(**module.REGISTRATION["kwargs"],
                                                        lead_in=["cancel", "flight_status"], lead_in_prob=1.0)
    try:
        kinds = set()
        for seed in range(10):
            env.reset(seed=seed)
            kinds.add(env.task.requests[0].kind)
            assert env.skill_request.kind == "cancel"
        assert kinds == {"flight_status"}
    finally:
        env.close()


def test_answer_families_are_those_asked_without_a_write():
    """The families a lead-in can come from are probed: the airline's status and information questions, never a
    cancellation (always a write); an env told lead_in='auto' points at `trace run`, which resolves it."""
    from trace_envs.capabilities.lead_in import answer_families

    airline = answer_families("airline")
    assert set(airline) == {"flight_status", "info"}
    assert "info" in answer_families("retail") and "cancel" not in answer_families()
    with pytest.raises(ValueError, match="resolved by `trace run`"):
        gym.make("trace/precondition_verification-v0", lead_in="auto")
