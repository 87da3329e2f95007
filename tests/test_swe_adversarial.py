"""The SWE grader against agents that try to earn the reward without fixing the bug (real Docker).

Every cheat of :mod:`trace_envs.swe.cheats` — shadowing the report plugin or a module it or a test
imports, conftests and pytest/pyproject/setup.cfg/tox sections, ``sitecustomize``/``.pth``/entry-point
hooks, a detached process rewriting the tests after ``submit``, one waiting for the grader's restore,
symlinks and hard links, a forged ``__pycache__``, edited tests committed to git's ``HEAD``, a library
module patching pytest from inside the test process — scores 0.0 on two instances of each of two
shipped libraries, and the gold patch still scores 1.0 in the same container afterwards.

The structural cheats are graded with the token guard (:func:`~trace_envs.swe.tasks.harness_tampering`)
turned off, so they show what the restore, the separate grader uid, the killed processes and the
shadow-proof launcher hold on their own; ``library_patch`` runs code inside the test process, which
only the guard stops, so it is graded as the environment grades (guard on). One container serves all
cheats of an instance (the grader resets everything it trusts between them); a few cheats also run
end to end through ``gym.make`` and the registered ``cheat:*`` agents.
"""

from __future__ import annotations

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from trace_envs import make_agent, rollout

LIBRARIES = ("parse-1.20.2", "cachetools-5.5.2")
PER_LIBRARY = 2


def _fastest_instances() -> list[tuple[str, str]]:
    """The single-bug instances with the fewest failing tests (their graded runs are the cheapest)."""
    from trace_envs.swe.tasks import load_instances

    out = []
    for key in LIBRARIES:
        insts = sorted(load_instances([key], max_bugs=1), key=lambda i: (len(i["FAIL_TO_PASS"]), i["instance_id"]))
        out += [(key, i["instance_id"]) for i in insts[:PER_LIBRARY]]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("repo_key,instance_id", _fastest_instances())
def test_every_cheat_scores_zero_and_gold_still_one(repo_key, instance_id):
    from trace_envs.swe.cheats import CHEATS, apply_steps, cheat_steps
    from trace_envs.swe.envs import load_repo
    from trace_envs.swe.sandbox import DockerSandbox
    from trace_envs.swe.tasks import apply_patch, evaluate_in_sandbox, load_instances, prepare_sandbox, reset_tree

    repo = load_repo(repo_key)
    inst = next(i for i in load_instances([repo_key]) if i["instance_id"] == instance_id)
    bugged = apply_patch(repo.files, inst["patch"])
    rewards = {}
    with DockerSandbox(repo.image()) as box:
        prepare_sandbox(box, bugged)
        for cheat in CHEATS:
            apply_steps(box, cheat_steps(cheat, repo, inst))
            reward, info = evaluate_in_sandbox(box, repo, inst, tamper_check=(cheat == "library_patch"))
            rewards[cheat] = (reward, info.get("reason"), info.get("f2p_passed"))
            reset_tree(box, bugged)
        box.write_files({p: repo.files[p] for p in bugged})
        gold, info = evaluate_in_sandbox(box, repo, inst)
    assert {c: r[0] for c, r in rewards.items()} == {c: 0.0 for c in CHEATS}, rewards
    assert rewards["library_patch"][1] == "harness_tampering"
    # the structural cheats really ran the suite (no shortcut): the failing tests failed
    assert all(r[2] is None or r[2].startswith("0/") for c, r in rewards.items() if c != "library_patch"), rewards
    assert gold == 1.0, info


@pytest.mark.parametrize("repo_key", LIBRARIES)
def test_cheat_agents_through_the_environment(repo_key):
    """The registered agents end to end: a detached test rewriter and a shadowed plugin earn nothing, the
    oracle in the same env still earns 1.0, and no container is left."""
    instance_id = next(i for k, i in _fastest_instances() if k == repo_key)
    env = gym.make("trace/swe_repo-v0", repos=[repo_key], pool_size=1)
    try:
        for name in ("cheat:background_rewriter", "cheat:shadow_plugin", "cheat:conftest"):
            record = rollout(env, make_agent(name), 0, options={"instance_id": instance_id})
            assert record["reward"] == 0.0, (name, record["reward_breakdown"])
            assert record["termination"] == "agent_stop", record
        assert rollout(env, make_agent("oracle"), 0, options={"instance_id": instance_id})["reward"] == 1.0
    finally:
        env.close()
    assert env.unwrapped.open_resources() == []
