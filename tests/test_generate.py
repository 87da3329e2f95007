"""The offline generator end to end: diagnose specs in, admitted and registered envs out.

The specs come from ``trace diagnose`` on the rollouts of planted-deficit agents (one diagnosis per
τ² target and planted set, so every capability gets a spec for airline and for retail). Each is
rendered from its family's template, admitted (static + sandboxed dynamic checks) and appended
to a fresh workspace; the conformance suite then passes on every new id in a fresh process that
knows the workspace only through ``TRACE_REGISTRY``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs  # noqa: F401 - registers the ids
from generators import generate
from generators.admit import AdmissionConfig
from generators.workspace import Workspace, WorkspaceError
from trace_envs import rollout
from trace_envs.capabilities.structured_data_reasoning import StructuredDataReasoningEnv
from trace_envs.core.registry import read_registry
from trace_envs.domains.agents import TauScriptedAgent
from trace_envs.domains.task import request_family
from trace_train.analysis import Thresholds, diagnose

from conftest import MisreadingAgent

pytestmark = pytest.mark.usefixtures("restore_registry")  # generated ids stay out of later tests

TAU_CAPABILITIES = ("precondition_verification", "multi_step_completion", "structured_data_reasoning",
                    "tool_calling_precision")
PLANTED = (("precondition_verification",), ("multi_step_completion", "structured_data_reasoning",
                                            "tool_calling_precision"))
#: Fewer seeds and calibration groups than the defaults keep the test cheap (every check still runs).
TEST_CONFIG = AdmissionConfig(calibration_groups=8, n_seeds=5, probe_seeds=6, digest_seeds=3, warm_resets=200,
                              seed_draw=58)  # a fixed draw: 8 groups are few for the band on any draw


@pytest.fixture(scope="module")
def tau_diagnoses(tmp_path_factory) -> list[Path]:
    """Diagnosis folders (with specs/) for each τ² target and planted set."""
    root = tmp_path_factory.mktemp("diagnoses")
    out = []
    for target in ("trace/tau_airline-v0", "trace/tau_retail-v0"):
        env = gym.make(target)
        oracle = [rollout(env, TauScriptedAgent(()), s) for s in range(500, 525)]
        for i, planted in enumerate(PLANTED):
            records = [rollout(env, TauScriptedAgent(planted), s) for s in range(100, 150)] + oracle
            name = f"{target.split('/')[1][:-3]}_{i}"
            path = root / f"{name}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
            result = diagnose(path, root / name, figure=False, thresholds=Thresholds(bootstrap=0))
            assert set(result.retained) == set(planted)
            out.append(root / name)
        env.close()
    return out


def _fresh_process(code: str, workspace: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACE_REGISTRY": str(workspace), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_offline_generator_admits_and_registers_every_tau_capability(tau_diagnoses, tmp_path):
    ws = tmp_path / "workspace"
    results = generate(tau_diagnoses, ws, run_dir=tmp_path / "run", progress=False, config=TEST_CONFIG,
                       run_id="test-run")
    assert len(results) == 8
    for r in results:
        assert r.admitted, (r.capability, r.reason)
        assert r.module.parent == ws / "envs" and r.module.exists()
        assert r.report_json.parent == r.module.parent and json.loads(r.report_json.read_text())["admitted"]
        assert "ADMITTED" in r.report_md.read_text()
    ids = sorted(r.env_id for r in results)
    # one name per (capability, target), version 0 in a fresh workspace
    assert ids == sorted(f"gen/{c}_tau_{d}-v0" for c in TAU_CAPABILITIES for d in ("airline", "retail"))
    env = gym.make(ids[0])  # generate() loaded the workspace into this process
    env.reset(seed=0)
    env.close()
    entries = read_registry(ws)
    assert sorted(e.id for e in entries) == ids
    assert {e.origin for e in entries} == {"generated:test-run"}
    assert {(e.capability, e.target, e.kwargs["domain"]) for e in entries} == \
        {(c, f"tau_{d}", d) for c in TAU_CAPABILITIES for d in ("airline", "retail")}
    # every attempt is in the run directory, never in the workspace
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == sorted([*TAU_CAPABILITIES, "generation.json"])
    assert not list(ws.glob("**/attempt_*"))
    # the generated modules are what the evidence asked for: focus families of the failed trajectories
    module = (ws / "envs" / "precondition_verification_tau_airline_v0.py").read_text()
    assert "FOCUS_FAMILIES = ('" in module and "REGISTRATION" in module

    # the conformance suite on each id, in a fresh process that knows the workspace only by TRACE_REGISTRY
    code = ("import gymnasium as gym, trace_envs\n"
            "from trace_envs.core.checker import check_trace_env\n"
            f"for env_id in {ids!r}:\n"
            "    check_trace_env(env_id, n_seeds=6).raise_if_failed()\n"
            "    env = gym.make(env_id); env.reset(seed=3); env.close()\n"
            "print('conformance ok')\n")
    proc = _fresh_process(code, ws)
    assert proc.returncode == 0 and "conformance ok" in proc.stdout, proc.stderr[-3000:]

    # regenerating never overwrites: the same spec gets the next version, earlier entries stay byte-identical
    before = (ws / "registry.yaml").read_text()
    again = generate(tau_diagnoses[0] / "specs" / "precondition_verification.json", ws, run_dir=tmp_path / "run2",
                     progress=False, config=TEST_CONFIG)
    assert again[0].admitted and again[0].env_id == "gen/precondition_verification_tau_airline-v1"
    assert (ws / "registry.yaml").read_text().startswith(before)


def test_cli_generate_then_envs_list_shows_the_workspace(tau_diagnoses, tmp_path, capsys):
    from trace_train.cli import main

    ws = tmp_path / "ws"
    assert main(["generate", "--spec", str(tau_diagnoses[0]), "--workspace", str(ws), "--no-progress",
                 "--run-dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    # v0 in a fresh process; later if this process already loaded other workspaces' gen/ ids
    [env_id] = Workspace(ws).ids()
    assert "admitted 1 of 1" in out and env_id in out
    assert env_id.startswith("gen/precondition_verification_tau_airline-v")
    assert main(["envs", "list", "--registry", str(ws)]) == 0
    listing = capsys.readouterr().out
    assert env_id in listing and "generated:" in listing
    assert "trace/precondition_verification-v0" in listing  # beside the built-ins
    # user errors: one line, exit status 2
    assert main(["generate", "--spec", str(tmp_path / "nope"), "--workspace", str(ws)]) == 2
    assert main(["generate", "--spec", str(tau_diagnoses[0]), "--workspace", str(ws), "--llm", "http://x"]) == 2


def test_focus_families_are_those_the_failed_agent_faced_under_the_rollout_env_kwargs(tmp_path):
    # The rollout narrows the target to two families; replaying its seeds under the default kwargs
    # would draw other tasks, so the focus must come from what the trajectories recorded.
    from generators.offline import evidence_families, render

    env = gym.make("trace/tau_airline-v0", scenarios=["baggage", "cancel"], size={"bundle_prob": 0.0})
    records = ([rollout(env, TauScriptedAgent(("tool_calling_precision",)), s) for s in range(100, 140)]
               + [rollout(env, TauScriptedAgent(()), s) for s in range(500, 520)])
    env.close()
    faced = {f for r in records for f in r["task"]["families"]}
    assert faced <= {"baggage", "cancel"} and faced
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    result = diagnose(path, tmp_path / "diag", figure=False, thresholds=Thresholds(bootstrap=0))
    assert "tool_calling_precision" in result.retained
    spec = json.loads((tmp_path / "diag" / "specs" / "tool_calling_precision.json").read_text())
    failed = [r for r in records if not r["success"]]
    assert set(spec["failure_families"]) <= {f for r in failed for f in r["task"]["families"]}
    assert sum(spec["failure_families"].values()) >= len(spec["example_failures"])
    assert all(ex["families"] for ex in spec["example_failures"])
    found = dict(evidence_families(spec))
    assert found == spec["failure_families"]
    rendered = render(spec, env_id="gen/x-v0", run_id="t")
    assert rendered.notes["focus_families"] and set(rendered.notes["focus_families"]) <= faced
    # Records written before task.families existed: the families come from their scenario labels.
    for r in records:
        del r["task"]["families"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    diagnose(path, tmp_path / "old", figure=False, thresholds=Thresholds(bootstrap=0))
    old = json.loads((tmp_path / "old" / "specs" / "tool_calling_precision.json").read_text())
    assert old["failure_families"] == spec["failure_families"]


def _load_rendered(source: str, tmp_path: Path, name: str):
    import importlib.util

    path = tmp_path / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_focus_reaches_a_family_that_draws_its_kind_of_task_once_per_episode(tmp_path):
    """Structured data reasoning draws its request kind once per episode and asks for a flight's status only
    at its look-up levels: a focus on flight_status lowers the difficulty to such a level, and a focus on a
    write family (``sdr_change:cancel``) is drawn, rather than the focus being dropped or never met."""
    from generators.offline import render

    env = gym.make("trace/tau_airline-v0", scenarios=["flight_status"], size={"bundle_prob": 0.0})
    records = ([rollout(env, MisreadingAgent(), s) for s in range(100, 130)]
               + [rollout(env, TauScriptedAgent(()), s) for s in range(500, 520)])
    env.close()
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    result = diagnose(path, tmp_path / "diag", figure=False, thresholds=Thresholds(bootstrap=0))
    assert result.retained == ["structured_data_reasoning"]
    spec = json.loads((tmp_path / "diag" / "specs" / "structured_data_reasoning.json").read_text())
    assert spec["failure_families"] == {"flight_status": 30}
    # The demo's evidence: coverage 0.19 keeps the default level 3, where no status is asked; level 2 asks it.
    spec["statistics"]["coverage"] = 0.19
    rendered = render(spec, env_id="gen/x-v0", run_id="t")
    assert rendered.notes["focus_families"] == ["flight_status"]
    assert rendered.notes["difficulty"] == 2 and "hardest level" in rendered.source
    module = _load_rendered(rendered.source, tmp_path, "focus_status")
    for focus, spec_families in (("flight_status", None), ("cancel", {"cancel": 4, "info": 2})):
        if spec_families is not None:
            module = _load_rendered(render({**spec, "failure_families": spec_families}, env_id="gen/x-v0",
                                           run_id="t").source, tmp_path, f"focus_{focus}")
        shares = []
        for cls in (getattr(module, module.REGISTRATION["class"]), StructuredDataReasoningEnv):
            e = cls(**module.REGISTRATION["kwargs"])
            kinds = []
            for s in range(60):
                e.reset(seed=s)
                kinds.append(request_family(e.task.requests[0].kind))
            e.close()
            shares.append(kinds.count(focus) / len(kinds))
        focused, natural = shares
        # FOCUS_SHARE = 0.75 of the episodes are redrawn until they are in focus (a bounded number of times:
        # a rare family such as cancel, 5% of the family's draws, is not always reached).
        assert focused >= 0.4 and focused >= natural + 0.25, (focus, focused, natural)

    # focus_share (generate.focus_share): 1.0 draws every episode of a common family from the focus; later
    # variants keep their own, weaker share.
    whole = render(spec, env_id="gen/x-v0", run_id="t", focus_share=1.0)
    assert whole.notes["focus_share"] == 1.0 and "FOCUS_SHARE = 1.0" in whole.source
    assert render(spec, env_id="gen/x-v0", run_id="t", variant=1, focus_share=1.0).notes["focus_share"] == 0.4
    module = _load_rendered(whole.source, tmp_path, "focus_whole")
    e = getattr(module, module.REGISTRATION["class"])(**module.REGISTRATION["kwargs"])
    kinds = []
    for s in range(40):
        e.reset(seed=s)
        kinds.append(request_family(e.task.requests[0].kind))
    e.close()
    assert kinds.count("flight_status") == 40, kinds


def test_a_spec_without_a_template_names_the_llm_option(tmp_path):
    spec = {"name": "semantic_logic_precision", "definition": "getting the logic of a fix right",
            "target_env": "trace/swe_repo-v0", "tool_schemas": [], "example_failures": []}
    path = tmp_path / "semantic_logic_precision.json"
    path.write_text(json.dumps(spec))
    [result] = generate(path, tmp_path / "ws", run_dir=tmp_path / "run", progress=False)
    assert not result.admitted and result.env_id is None
    assert "--llm" in result.reason and "semantic_logic_precision" in result.reason
    assert Workspace(tmp_path / "ws").ids() == []


#: One installer process: the lock is between processes, so the race runs in real, separate ones (not a
#: fork of this process, whose threads — torch's, a test server's — make forking unsafe).
_INSTALL = """
import sys
from generators.workspace import Workspace
root, n = sys.argv[1], int(sys.argv[2])
registration = {"id": f"gen/race-v{n}", "class": "E", "max_episode_steps": 5, "description": f"entry {n}"}
Workspace(root).install("class E: pass\\n", registration, capability="race", name="race", version=n,
                        target="tau_airline", origin="generated:race")
print(registration["id"])
"""


def _install(root: str, n: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _INSTALL, root, str(n)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_workspace_appends_are_atomic_locked_and_never_overwrite(tmp_path):
    ws = Workspace(tmp_path / "ws").init()
    procs = [_install(str(ws.root), n) for n in range(12)]  # all started before any is waited for
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [err for _, err in outputs]
    ids = [out.strip() for out, _ in outputs]
    assert sorted(ws.ids()) == sorted(ids)
    import yaml

    data = yaml.safe_load((ws.root / "registry.yaml").read_text())
    assert sorted(e["id"] for e in data) == sorted(ids) and all(e["origin"] == "generated:race" for e in data)
    with pytest.raises(WorkspaceError, match="never overwritten"):
        ws.install("class E: pass\n", {"id": "gen/race-v3", "class": "E", "max_episode_steps": 5},
                   capability="race", name="race", version=3, target="tau_airline", origin="generated:race")
    assert ws.next_version("race") == 12
    assert not list(ws.root.glob(".registry.*"))  # no temporary file left behind


@pytest.mark.slow
@pytest.mark.docker
def test_offline_generator_admits_swe_localization_from_swe_repo_rollouts(tmp_path):
    """The SWE family: swe_repo rollouts (Docker) -> diagnose -> a swe_localization env, admitted and conformant."""
    from conftest import REQUIREMENT_CHECKS, allowed_missing

    ok, why = REQUIREMENT_CHECKS["docker"]()
    if not ok:
        if "docker" in allowed_missing():
            pytest.skip(why)
        pytest.fail(f"this test needs Docker ({why}); run scripts/setup_docker.sh or set TRACE_ALLOW_MISSING=docker")
    from trace_envs.agents import OracleAgent, ScriptedAgent
    from trace_envs.core.conversation import hermes_tool_call
    from trace_envs.swe.images import base_image_tag, build_base_image, docker_client, image_exists

    if not image_exists(docker_client(), base_image_tag()):
        build_base_image(verbose=True)
    from trace_envs.swe.repos import RepoSpec, known_repos, materialize, save_repo

    fixture = Path(__file__).parent / "fixtures"
    save_repo(RepoSpec("minicalc", f"dir:{fixture / 'minicalc'}", ("tests",), (".",)))  # as tests/test_swe.py does
    for spec in known_repos().values():  # fetched here, with network: the admission sandbox has none
        materialize(spec)
    env = gym.make("trace/swe_repo-v0", repos=["minicalc"], instances_dir=str(fixture / "minicalc_instances"))
    try:
        # the oracle fixes the bug; the other agent submits without locating (or editing) anything
        records = [rollout(env, OracleAgent(), s) for s in range(2)]
        records += [rollout(env, ScriptedAgent([hermes_tool_call("submit", {})], name="submit_blind"), 10 + s)
                    for s in range(3)]
    finally:
        env.close()
    assert [r["reward"] for r in records] == [1.0, 1.0, 0.0, 0.0, 0.0]
    path = tmp_path / "swe.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    diagnosis = diagnose(path, tmp_path / "diagnosis", figure=False, thresholds=Thresholds(bootstrap=0))
    assert diagnosis.retained == ["swe_localization"]
    ws = tmp_path / "ws"
    [result] = generate(tmp_path / "diagnosis", ws, run_dir=tmp_path / "run", progress=False, config=TEST_CONFIG)
    assert result.admitted, result.reason
    report = json.loads(result.report_json.read_text())
    assert {c["name"]: c["status"] for c in report["checks"]}["no tool the target lacks"] == "passed"
    assert report["registration"]["answer_tools"] == ["submit_location"]
    code = ("from trace_envs.core.checker import check_trace_env\n"
            f"check_trace_env({result.env_id!r}, n_seeds=4).raise_if_failed()\nprint('conformance ok')\n")
    proc = _fresh_process(code, ws)
    assert proc.returncode == 0 and "conformance ok" in proc.stdout, proc.stderr[-3000:]


def test_the_level_and_focus_follow_where_most_of_the_evidence_lies():
    """A capability whose failures are mostly flight-status answers (26 of 34), with a few stray cancellations,
    gets the level that asks for a status (2, not the default 3 where only the 2 cancellations are drawn) and a
    focus on flight_status alone: a family under a tenth of the failures is not a focus. Measured on the planted
    run of lab/headline-planted/history.md, where the rule before focused the env on those 2 cancellations."""
    from generators.offline import FOCUS_MIN_SHARE, render

    spec = {"name": "structured_data_reasoning", "target_env": "trace/tau_airline-v0",
            "definition": "Reads the retrieved records correctly.",
            "statistics": {"delta": 0.94, "coverage": 0.48},
            "failure_families": {"flight_status": 26, "info": 6, "cancel": 2}}
    assert 2 < FOCUS_MIN_SHARE * 34 <= 6
    rendered = render(spec, env_id="gen/x-v0", run_id="t", focus_share=1.0)
    assert rendered.notes["difficulty"] == 2
    assert rendered.notes["focus_families"] == ["flight_status"]
    assert "28 of 34, in flight_status, cancel" in rendered.source  # what the chosen level draws
    # When an easier level draws no more of the failures, the default level stays (a tie keeps the harder one).
    rendered = render({**spec, "failure_families": {"cancel": 20, "info": 3}}, env_id="gen/x-v0",
                      run_id="t", focus_share=1.0)
    assert rendered.notes["difficulty"] == 3 and rendered.notes["focus_families"] == ["cancel"]


def test_tool_calling_precision_follows_the_evidence_into_the_targets_conversation(tmp_path):
    """The evidence's precision failures happened inside the target's conversation (an id read right, then
    garbled in the write), so the variants that follow the evidence render ``flow="target"``; the family as it
    is (the last, conservative variant) keeps its stated requests. Measured on the planted run of
    lab/headline-planted/history.md: stated in full, the env's requests needed no read, and its adapter scored 0 on the target."""
    from generators.offline import VARIANTS, render

    spec = {"name": "tool_calling_precision", "target_env": "trace/tau_airline-v0",
            "definition": "Sends exact tool calls.", "statistics": {"delta": 0.32, "coverage": 0.32},
            "failure_families": {"cancel": 20, "info": 3}}
    first = render(spec, env_id="gen/x-v0", run_id="t", focus_share=1.0)
    assert first.notes["kwargs"] == {"flow": "target"}
    module = _load_rendered(first.source, tmp_path, "tcp_target_flow")
    assert module.REGISTRATION["kwargs"]["flow"] == "target"
    env = getattr(module, module.REGISTRATION["class"])(**module.REGISTRATION["kwargs"],
                                                        size={"ask_details_prob": 1.0})
    try:
        env.reset(seed=0)
        request = env.task.requests[0]
        assert request.kind == "cancel" and request.ask and request.reads  # asked, then read, then written
    finally:
        env.close()
    last = render(spec, env_id="gen/x-v0", run_id="t", variant=len(VARIANTS) - 1)
    assert "kwargs" not in last.notes and '"flow"' not in last.source
