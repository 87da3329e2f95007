"""The audit at use (generators/audit.py): while a generated env is played (GRPO, evaluation and ``trace
rollout`` all go through ``run_rollouts``), a seeded sample of its episodes (always the first) is replayed in a
second worker and by the reward-hacking probes; a failure stops the run with an error naming the env and the
probe, and quarantines the module in its workspace.

The modules come from ``tests/bad_modules/`` and are installed straight into a workspace, as if admission had
missed them: the audit is the second line, behind admission.
"""

from __future__ import annotations

import json
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs
from generators.audit import AuditConfig, AuditFailure, Auditor
from generators.probes import GOODBYE
from generators.static import static_check
from generators.workspace import Workspace
from trace_envs import OracleAgent, RandomAgent
from trace_envs.core.sandboxed import SandboxUnavailable
from trace_train.rollouts import run_rollouts

pytestmark = pytest.mark.usefixtures("restore_registry")
CORPUS = Path(__file__).resolve().parent / "bad_modules"


def _install(tmp_path: Path, name: str | None) -> tuple[str, Workspace]:
    """Install ``tests/bad_modules/<name>.py``, or with ``name`` None the offline generator's honest module."""
    if name is None:
        from generators.offline import render

        spec = {"name": "precondition_verification", "target_env": "trace/tau_airline-v0",
                "statistics": {"coverage": 0.3}}
        source = render(spec, env_id="gen/precondition_verification_tau_airline-v0", run_id="test").source
    else:
        source = (CORPUS / f"{name}.py").read_text(encoding="utf-8")
    _, registration = static_check(source)
    ws = Workspace(tmp_path / "ws")
    ws.install(source, registration, capability="precondition_verification",
               name="precondition_verification_tau_airline", version=0, target="tau_airline", origin="generated:test")
    trace_envs.load_registry(ws.root)
    return registration["id"], ws


class Alternating:
    """A group whose members differ: even episodes act at random, odd ones are the oracle's."""

    name = "alternating"
    count = 0

    def reset(self, env, observation, info):
        Alternating.count += 1
        self.inner = OracleAgent() if Alternating.count % 2 == 0 else RandomAgent(Alternating.count)
        if hasattr(self.inner, "reset"):
            self.inner.reset(env, observation, info)

    def __call__(self, observation, info):
        return self.inner(observation, info)


def _caught(env_id: str, ws: Workspace, exc: AuditFailure, what: str) -> None:
    print(f"\n{env_id}: {exc}")
    assert exc.env_id == env_id and exc.what == what
    assert env_id in str(exc) and what in str(exc) and "quarantined" in str(exc)
    assert env_id in json.loads(ws.quarantine_file.read_text())
    with pytest.raises(SandboxUnavailable, match="quarantined"):
        gym.make(env_id)


def test_an_env_that_pays_a_probe_at_use_is_stopped_at_its_first_audited_episode(tmp_path):
    env_id, ws = _install(tmp_path, "pays_done_off_admission_seeds")
    with pytest.raises(AuditFailure) as caught:
        run_rollouts(env_id, RandomAgent(0), seeds=[123_456, 1_000_017], samples=2, progress=False,
                     audit=Auditor(AuditConfig(rate=0.0)))
    _caught(env_id, ws, caught.value, "probe:done")


def test_credit_that_depends_on_earlier_episodes_is_caught_by_the_replay(tmp_path):
    env_id, ws = _install(tmp_path, "replay_dependent_credit")
    Alternating.count = 0
    with pytest.raises(AuditFailure) as caught:
        run_rollouts(env_id, Alternating(), seeds=[1_000_003], samples=8, in_flight=1, progress=False,
                     audit=Auditor(AuditConfig(rate=1.0)))
    _caught(env_id, ws, caught.value, "replay")
    assert "second worker" in str(caught.value)


def test_a_reward_that_depends_on_hash_or_global_random_is_caught_by_the_replay(tmp_path):
    env_id, ws = _install(tmp_path, "reward_depends_on_hash")
    with pytest.raises(AuditFailure) as caught:
        run_rollouts(env_id, OracleAgent(), seeds=range(1_000_000, 1_000_016), progress=False,
                     audit=Auditor(AuditConfig(rate=1.0)))
    _caught(env_id, ws, caught.value, "replay")


def test_a_reward_that_switches_on_after_many_resets_is_caught_by_the_probe_worker(tmp_path):
    env_id, ws = _install(tmp_path, "pays_done_after_many_resets")
    auditor = Auditor(AuditConfig(rate=0.02, seed=1))
    with pytest.raises(AuditFailure) as caught:
        run_rollouts(env_id, lambda obs, info: GOODBYE, seeds=range(1_000_000, 1_000_400), progress=False,
                     in_flight=4, audit=auditor)
    _caught(env_id, ws, caught.value, "probe:done")
    assert auditor.episodes[env_id] < 400  # it stopped the run


def test_an_honest_generated_env_passes_its_audit(tmp_path):
    env_id, ws = _install(tmp_path, None)
    auditor = Auditor(AuditConfig(rate=0.5))
    summary = run_rollouts(env_id, Alternating(), seeds=range(1_000_000, 1_000_004), samples=2,
                           progress=False, audit=auditor)
    assert summary.ran == 8 and auditor.audited[env_id] >= 2
    assert not ws.quarantine_file.exists()
    auditor.close()


def test_an_honest_env_played_with_its_own_kwargs_and_a_shorter_step_cap_passes_its_audit(tmp_path):
    """The replay plays the episode as it was played: with the kwargs its env was made with (the planted recipe's
    task size and compact prompt) and no further than the rollout's own step cap (GRPO's
    max_tool_calling_iterations). Replayed with the registry's defaults, or one empty turn past the cap, the
    transcripts differed and an honest env was quarantined in the middle of the recipe's training."""
    env_id, ws = _install(tmp_path, None)
    kwargs = {"size": {"ask_details_prob": 1.0, "cancel_grounds": ["business"], "read_back": True},
              "prompt": "compact", "lead_in": ["flight_status"], "lead_in_prob": 0.5}
    auditor = Auditor(AuditConfig(rate=1.0))
    summary = run_rollouts(env_id, OracleAgent(), seeds=range(1_000_000, 1_000_006), progress=False,
                           env_kwargs=kwargs, max_steps=4, keep_records=True, audit=auditor)
    assert summary.ran == 6 and auditor.audited[env_id] == 6
    assert {r["termination"] for r in summary.records} == {"max_steps"}  # every episode cut by the rollout's cap
    assert not ws.quarantine_file.exists()
    auditor.close()


def test_an_audit_failure_crosses_a_process_boundary_whole():
    """Raised in a worker (a GRPO run or an evaluation job in a process pool), the verdict comes back by pickle."""
    import pickle

    exc = pickle.loads(pickle.dumps(AuditFailure("env x failed (replay, seed 3)", "gen/x-v0", "replay")))
    assert (str(exc), exc.env_id, exc.what) == ("env x failed (replay, seed 3)", "gen/x-v0", "replay")
