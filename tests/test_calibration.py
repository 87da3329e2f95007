"""Calibration: group statistics on a hand-made case, the ``trace envs calibrate`` command, the
stochastic reference agent, and the isolation property of every registered τ² capability env.
"""

from __future__ import annotations

import json

import pytest

import trace_envs
from trace_envs.calibration import (
    DEFICIT_AGENTS,
    Group,
    deficit_rewards,
    isolation_problems,
    pass_at_k,
    run_calibration,
    summarize,
    summarize_groups,
)
from trace_train import cli

HAND_MADE = [Group(0, [0.0, 0.0, 0.0, 0.0], [False] * 4),      # all-0
             Group(1, [1.0, 1.0, 1.0, 1.0], [True] * 4),       # all-1
             Group(2, [0.5, 0.5, 0.5, 0.5], [False] * 4),      # flat at 0.5: no signal, but not all-0/all-1
             Group(3, [1.0, 0.0, 1.0, 0.0], [True, False, True, False])]  # informative


def _tau_capability_envs() -> list:
    return [e for e in trace_envs.registered()
            if e.kind == "capability" and (e.target or "").startswith("tau") and not e.requires]


def test_statistics_of_a_hand_made_case():
    r = summarize_groups(HAND_MADE, env_id="x", agent="y")
    assert (r.groups, r.group_size) == (4, 4)
    assert r.mean_reward == pytest.approx((0 + 4 + 2 + 2) / 16)
    assert r.success_rate == pytest.approx(6 / 16)
    assert (r.all_zero, r.all_one, r.flat, r.informative) == (0.25, 0.25, 0.25, 0.25)
    # pass@k = mean over groups of 1 - C(n-c, k)/C(n, k); pass^k = mean of C(c, k)/C(n, k)
    assert r.pass_at[1] == pytest.approx((0 + 1 + 0 + 0.5) / 4)
    assert r.pass_at[2] == pytest.approx((0 + 1 + 0 + (1 - 1 / 6)) / 4)
    assert r.pass_at[4] == pytest.approx((0 + 1 + 0 + 1) / 4)
    assert r.pass_hat[2] == pytest.approx((1 + 1 / 6) / 4)
    assert r.pass_hat[4] == pytest.approx(1 / 4)
    assert r.pass_hat[1] == r.pass_at[1]
    checks = {name: ok for name, _, _, _, ok in r.checks()}
    assert checks == {"mean_reward": True, "success_rate": True, "all_one": False, "all_zero": False,
                      "informative": False}
    assert not r.in_band
    assert "informative groups" in r.format() and "pass^4" in r.format()


def test_summarize_groups_trajectory_records_by_seed():
    records = [{"env_id": "e", "seed": g.seed, "sample": k, "reward": rew, "success": ok, "agent": "a"}
               for g in HAND_MADE for k, (rew, ok) in enumerate(zip(g.rewards, g.successes))]
    r = summarize(list(reversed(records)))
    assert r.to_dict(groups=False) == summarize_groups(HAND_MADE, env_id="e", agent="a").to_dict(groups=False)
    with pytest.raises(ValueError, match="same number"):
        summarize(records[:-1])


def test_pass_at_k_edges():
    assert pass_at_k(0, 5, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0 and pass_at_k(1, 4, 4) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(1, 2, 3)


def test_noisy_agent_is_seeded_and_spans_oracle_to_all_deficits():
    from trace_envs.domains.agents import NoisyTauAgent

    env = "trace/tau_airline-v0"
    always = run_calibration(env, lambda s: NoisyTauAgent(p=0.0, seed=s), 6, 3)
    assert always.mean_reward == 1.0 and always.all_one == 1.0
    a = run_calibration(env, "tau:noisy", 12, 4, agent_seed=7)
    b = run_calibration(env, "tau:noisy", 12, 4, agent_seed=7)
    assert [g.rewards for g in a.per_group] == [g.rewards for g in b.per_group]  # reproducible
    assert 0.0 < a.mean_reward < 1.0 and a.informative > 0  # members of a group differ
    c = run_calibration(env, "tau:noisy", 12, 4, agent_seed=100)
    assert [g.rewards for g in a.per_group] != [g.rewards for g in c.per_group]


def test_calibrate_command_reports_and_saves(capsys, tmp_path):
    out = tmp_path / "report.json"
    code = cli.main(["envs", "calibrate", "trace/tau_retail-v0", "--agent", "tau:noisy", "--groups", "8",
                     "--group-size", "3", "--seed-offset", "5", "--json", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert code == 0
    assert "informative groups" in text and "pass@3" in text and "pass^3" in text
    saved = json.loads(out.read_text())
    direct = run_calibration("trace/tau_retail-v0", "tau:noisy", 8, 3, seed_offset=5)
    assert saved["mean_reward"] == pytest.approx(direct.mean_reward)
    assert saved["informative"] == pytest.approx(direct.informative)
    assert [g["seed"] for g in saved["per_group"]] == list(range(5, 13))
    assert saved["pass_hat"]["3"] == pytest.approx(direct.pass_hat[3])


def test_calibrate_command_errors(capsys):
    assert cli.main(["envs", "calibrate", "trace/tau_retail-v0", "--agent", "nope"]) == 2
    assert "unknown agent" in capsys.readouterr().err
    assert cli.main(["envs", "calibrate", "trace/tau_retail-v0", "--difficulty", "2"]) == 2
    assert "no difficulty knob" in capsys.readouterr().err
    assert cli.main(["envs", "calibrate", "trace/tau_retail-v0", "--agent", "openai:model-without-url"]) == 2
    assert "openai:MODEL@URL" in capsys.readouterr().err
    assert cli.main(["envs", "calibrate", "trace/tau_retail-v0", "--agent", "hf:/no/such/model"]) == 2
    assert "no such model folder" in capsys.readouterr().err


def test_isolation_rule():
    good = {"oracle": 1.0, "tau:skip_precondition": 0.1, "tau:stop_after_first": 0.9, "tau:wrong_record": 1.0,
            "tau:sloppy_arguments": 0.8, "tau:noisy": 0.3}
    assert isolation_problems("precondition_verification", good) == []
    assert len(isolation_problems("multi_step_completion", good)) == 2  # 0.9 is not low; 0.1 is not high


@pytest.mark.parametrize("env_id", [e.id for e in _tau_capability_envs()])
def test_each_capability_env_isolates_its_capability(env_id):
    entry = trace_envs.get_entry(env_id)
    assert entry.capability in DEFICIT_AGENTS.values()
    rewards = deficit_rewards(env_id, range(40))
    assert rewards["oracle"] == 1.0
    assert isolation_problems(entry.capability, rewards) == [], rewards
