"""Admission of generated env modules: the bad-module corpus is rejected, each for its own defect.

Every module in ``tests/bad_modules/`` is the built-in precondition env plus one defect, and names
the report row that must reject it (``# expect: <row> :: <words>``; ``any`` for whichever row meets it
first, ``admitted`` for a module whose attack is harmless and so passes — tests/test_sandbox.py plays
those through ``gym.make``). Each is admitted through the public entry point
(:func:`generators.pipeline.admit_module`) into a fresh workspace: it must be rejected by that row with
a reason naming the defect, nothing may be registered or written outside the run directory, and no
process may outlive the admission. The judge is outside the judged: with the static filter switched
off, a module that rewrites the checks from inside its worker is still rejected by the checks here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import child_pids

from generators.admit import AdmissionConfig
from generators.pipeline import admit_module
from generators.static import static_check
from generators.workspace import Workspace

pytestmark = pytest.mark.usefixtures("restore_registry")  # generated ids stay out of later tests

CORPUS = Path(__file__).resolve().parent / "bad_modules"
BAD = sorted(p for p in CORPUS.glob("*.py"))
LEAK = Path("/tmp/trace_bad_module_wrote_this")
#: Small sizes: the corpus needs each defect caught, not a precise calibration.
LIGHT = AdmissionConfig(timeout_s=120, import_timeout_s=12, n_seeds=4, digest_seeds=3, probe_seeds=6,
                        calibration_groups=4, calibration_group_size=8, warm_resets=300,
                        seed_draw=58)  # a fixed draw: the corpus's verdicts do not vary from run to run


def _expect(path: Path) -> tuple[str, str]:
    m = re.match(r"# expect: (.+?) :: (.+)", path.read_text(encoding="utf-8").splitlines()[0])
    assert m, f"{path.name} must start with '# expect: <row> :: <words>'"
    return m.group(1).strip(), m.group(2).strip()



def test_the_corpus_covers_every_defect_the_issue_lists():
    assert len(BAD) >= 30
    rows = {_expect(p)[0] for p in BAD}
    assert {"id is new", "source parses", "import", "probe: empty", "probe: write_all", "rewards in [0, 1]",
            "conformance: oracle scores 1.0", "tool schemas identical to the target's",
            "no tool the target lacks", "determinism across two processes", "no dynamic code", "no file writes",
            "no dunder escapes", "no process, network or foreign-memory access", "any", "admitted"} <= rows
    names = {p.stem for p in BAD}
    assert {"forges_verdict_main", "forges_verdict_frames", "patches_evaluator", "wraps_gym_make",
            "runs_libc_system", "setsid_daemon", "popen_via_load_env_creator", "reads_secrets", "writes_files_numpy",
            "date_in_task", "raises_for_large_seeds", "slow_step", "connects_out", "eval_alias",
            "attrgetter_os", "pays_outside_admission"} <= names


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_module_is_rejected_for_its_defect(path, tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_TEST_SECRET", "trace-test-secret-3b9f7c")  # planted in this process's environment
    row_name, words = _expect(path)
    workspace, run = tmp_path / "ws", tmp_path / "run"
    LEAK.unlink(missing_ok=True)
    before = child_pids()
    # a module expected to pass gets the default calibration (LIGHT's 4 groups are too few for its band)
    config = AdmissionConfig(n_seeds=4, probe_seeds=6, seed_draw=58) if row_name == "admitted" else LIGHT
    result = admit_module(path.read_text(encoding="utf-8"), capability="precondition_verification",
                          target_env="trace/tau_airline-v0", workspace=workspace, run_dir=run, config=config)
    report = json.loads(result.report_json.read_text())
    rows = {r["name"]: r for r in report["checks"]}
    print(f"\n{path.stem}: {result.reason}")
    assert not LEAK.exists() and child_pids() <= before
    if row_name == "admitted":
        assert result.admitted, result.reason
        if "print(" in path.read_text(encoding="utf-8"):
            # what it printed is in the report, marked untrusted, and changed no verdict
            assert report["output_tail"].startswith("[UNTRUSTED") and "LOOT" in report["output_tail"]
        assert "root:x:0:0" not in report["output_tail"] and "trace-test-secret" not in report["output_tail"]
        if words != "harmless":  # what the report must show of it
            assert words in json.dumps(report["module_texts"]) and words in result.report_md.read_text()
        return
    assert not result.admitted and result.env_id is None and result.module is None
    if row_name == "any":
        failed = [r for r in report["checks"] if r["status"] == "failed"]
        assert any(words.lower() in r["reason"].lower() for r in failed), failed
    else:
        assert rows[row_name]["status"] == "failed", (row_name, rows[row_name])
        assert words.lower() in rows[row_name]["reason"].lower(), rows[row_name]["reason"]
    assert result.reason and report["admitted"] is False
    # the Markdown report has a row per check
    md = result.report_md.read_text()
    assert md.count("\n| ") >= len(report["checks"]) and "REJECTED" in md
    # nothing registered, nothing in the workspace but its empty registry, nothing written elsewhere
    assert Workspace(workspace).ids() == [] and list((workspace / "envs").iterdir()) == []
    assert result.report_json.parent == run
    assert not LEAK.exists()
    # no process outlives the admission
    assert child_pids() <= before


def test_admission_draws_its_seeds_where_training_and_evaluation_draw_theirs():
    """The probes' and the calibration's seeds come from the ranges use draws from (issue 58: a module behaved on
    admission's fixed seeds only); the ranges agree with TrainConfig's defaults."""
    import random

    from generators.admit import USE_SEED_RANGES, use_seeds
    from trace_train.train.config import TrainConfig

    fields = {f.name: f.default for f in __import__("dataclasses").fields(TrainConfig)}
    (eval_lo, eval_hi), (train_lo, _) = USE_SEED_RANGES
    assert [eval_lo, eval_hi] == list(TrainConfig.__dataclass_fields__["eval_seeds"].default_factory())
    assert train_lo == fields["seed_offset"]
    a, b = use_seeds(random.Random(1), 16), use_seeds(random.Random(2), 16)
    assert a != b and len(set(a)) == 16 and all(any(lo <= s < hi for lo, hi in USE_SEED_RANGES) for s in a)
    assert not set(a) & (set(range(500, 516)) | set(range(1000, 1024)))


def test_static_checks_name_the_line_and_construct():
    findings, registration = static_check("import os\nx = eval('1')\nopen('f', mode='a')\nREGISTRATION = 3\n")
    assert "line 1" in str(findings["imports on the allow-list"][0]) and "os" in str(findings["imports on the "
                                                                                              "allow-list"][0])
    assert "eval" in str(findings["no dynamic code"][0]) and "line 2" in str(findings["no dynamic code"][0])
    assert "mode 'a'" in str(findings["no file writes"][0])
    assert registration is None and findings["registration block"]
    clean, reg = static_check('from trace_envs.capabilities.swe_localization import SweLocalizationEnv\n'
                              'REGISTRATION = {"id": "gen/x-v0", "class": "E", "max_episode_steps": 5, '
                              '"description": "d", "answer_tools": ["submit_location"]}\n'
                              'class E(SweLocalizationEnv):\n    def __init__(self):\n        super().__init__()\n')
    assert not any(clean.values()) and reg["answer_tools"] == ["submit_location"]
    _, bad_answer = static_check('REGISTRATION = {"id": "gen/x-v0", "class": "E", "max_episode_steps": 5, '
                                 '"description": "d", "answer_tools": ["get_everything"]}\nclass E: pass\n')
    assert bad_answer is None


GOOD = '''from trace_envs.capabilities.precondition_verification import PreconditionVerificationEnv

REGISTRATION = {"id": "gen/precondition_verification_tau_airline-v0", "class": "GoodEnv",
                "max_episode_steps": 30, "kwargs": {"domain": "airline"},
                "description": "the built-in precondition env, unchanged"}


class GoodEnv(PreconditionVerificationEnv):
    pass
'''


def test_without_bubblewrap_admission_refuses_unless_unsandboxed_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))  # no bwrap to be found
    monkeypatch.delenv("TRACE_UNSANDBOXED", raising=False)
    result = admit_module(GOOD, capability="precondition_verification", target_env="trace/tau_airline-v0",
                          workspace=tmp_path / "ws", run_dir=tmp_path / "run", config=LIGHT)
    report = json.loads(result.report_json.read_text())
    assert not result.admitted and "bubblewrap" in result.reason and "--unsandboxed" in result.reason
    assert report["sandbox"].startswith("not started")
    assert Workspace(tmp_path / "ws").ids() == []
    # TRACE_UNSANDBOXED alone does not run generated code unsandboxed: it needs the second switch
    monkeypatch.setenv("TRACE_UNSANDBOXED", "1")
    monkeypatch.delenv("TRACE_UNSANDBOXED_GENERATED", raising=False)
    result = admit_module(GOOD, capability="precondition_verification", target_env="trace/tau_airline-v0",
                          workspace=tmp_path / "ws", run_dir=tmp_path / "run1", config=LIGHT)
    assert not result.admitted and "TRACE_UNSANDBOXED_GENERATED=1" in result.reason
    # explicitly unsandboxed, both switches: the same checks, in a plain subprocess, and the report says so
    monkeypatch.setenv("TRACE_UNSANDBOXED_GENERATED", "1")
    with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
        result = admit_module(GOOD, capability="precondition_verification", target_env="trace/tau_airline-v0",
                              workspace=tmp_path / "ws", run_dir=tmp_path / "run2",
                              config=AdmissionConfig(n_seeds=4, probe_seeds=6, seed_draw=58))  # default calibration
    assert result.admitted, result.reason
    report = json.loads(result.report_json.read_text())
    assert report["sandbox"].startswith("plain subprocess") and "network NOT isolated" in report["warnings"][0]
    assert "WITHOUT a sandbox" in result.report_md.read_text()
    assert Workspace(tmp_path / "ws").ids() == ["gen/precondition_verification_tau_airline-v0"]


def test_a_module_that_forges_its_verdict_from_inside_is_still_rejected(tmp_path, monkeypatch):
    """With the static filter off (as if it had missed the module), the module runs and rewrites the checks
    and bounds of every module it can reach in its worker; the verdicts are computed here, so the refusal
    it pays for is still caught, and this process's checks are untouched."""
    from generators import admit as admit_module_mod, probes
    from generators.static import STATIC_CHECKS, static_check as real_static_check
    from trace_envs.core import checker

    def no_filter(source):
        findings, registration = real_static_check(source)
        return {name: [] for name, _ in STATIC_CHECKS}, registration

    monkeypatch.setattr(admit_module_mod, "static_check", no_filter)
    bounds, checks = dict(probes.PROBE_BOUNDS), list(checker.CHECKS)
    source = (CORPUS / "forges_verdict_main.py").read_text(encoding="utf-8")
    result = admit_module(source, capability="precondition_verification", target_env="trace/tau_airline-v0",
                          workspace=tmp_path / "ws", run_dir=tmp_path / "run", config=LIGHT)
    report = json.loads(result.report_json.read_text())
    rows = {r["name"]: r for r in report["checks"]}
    assert not result.admitted
    assert rows["probe: refuse"]["status"] == "failed" and "probe:refuse earns" in rows["probe: refuse"]["reason"]
    assert rows["import"]["status"] == "passed"  # it did run, and did its forging in its worker
    assert probes.PROBE_BOUNDS == bounds and checker.CHECKS == checks
