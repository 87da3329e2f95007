"""`trace swe add-repo` and the instance tooling on awkward repositories.

* test dependencies are read from an sdist's extras, pyproject groups and requirement files;
* a clean suite that fails on an import says which ``--requirement`` to add;
* ``--env`` and ``--pytest-arg`` reach the clean suite (and every later run);
* ``trace swe validate --recheck`` and the ``swe:edit_tests`` agent handle a test whose ``def`` line ends in
  a comment, and a parametrized id with spaces keeps its error message in the issue text.

The Docker parts build small images of throw-away repositories (a few seconds each).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures"


def test_test_requirements_are_read_from_extras_groups_and_files(tmp_path):
    from trace_envs.swe.repos import requirements_from_pkg_info, test_requirements

    (tmp_path / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: attrs>=22\n"
        "Requires-Dist: colorama; sys_platform == 'win32'\nProvides-Extra: test\n"
        "Requires-Dist: hypothesis>=6; extra == 'test'\nRequires-Dist: pytest>=7; extra == 'test'\n"
        "Provides-Extra: docs\nRequires-Dist: sphinx-rtd-theme; extra == 'docs'\n")
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'demo'\n[project.optional-dependencies]\ntesting = ['freezegun']\ndocs = ['furo']\n"
        "[dependency-groups]\ntests = ['pytest-mock>=3', 'pytest-cov']\n")
    (tmp_path / "requirements-test.txt").write_text("# pinned\n-r requirements.txt\nsimplejson==3.19  # a comment\n")
    assert requirements_from_pkg_info(tmp_path) == ["attrs>=22"]
    found = test_requirements(tmp_path)
    assert found == {"PKG-INFO extra [test]": ["hypothesis>=6"],
                     "pyproject optional-dependencies [testing]": ["freezegun"],
                     "pyproject dependency-groups [tests]": ["pytest-mock>=3"],
                     "requirements-test.txt": ["simplejson==3.19"]}


def test_issue_text_keeps_messages_of_ids_with_spaces_and_reads_as_english(tmp_path):
    from trace_envs.swe.repos import RepoSpec, Repo
    from trace_envs.swe.tasks import failure_messages, problem_statement

    repo = Repo(RepoSpec("demo", "dir:/x"), tmp_path)
    ids = ["tests/test_a.py::test_fmt[a b - c]", "tests/test_a.py::test_fmt[a]", "tests/test_a.py::TestX::test_y"]
    output = ("...\n=========================== short test summary info ============================\n"
              "FAILED tests/test_a.py::test_fmt[a b - c] - AssertionError: assert 'x y' == 'x'\n"
              "FAILED tests/test_a.py::test_fmt[a] - ValueError: bad\n"
              "ERROR tests/test_a.py::TestX::test_y - KeyError: 'k'\n1 failed in 0.1s\n")
    assert failure_messages(output, ids) == {ids[0]: "AssertionError: assert 'x y' == 'x'", ids[1]: "ValueError: bad",
                                             ids[2]: "KeyError: 'k'"}
    one = problem_statement(repo, ids[:1], output)
    assert "1 test fails:" in one and "AssertionError: assert 'x y' == 'x'" in one
    assert "3 tests fail:" in problem_statement(repo, ids, output)


def test_edit_tests_cheat_handles_comments_on_def_lines():
    from trace_envs.swe.agents import neutered_tests

    src = ("import pytest\n\ndef test_a():  # why: a note\n    assert 1 == 2\n\nclass TestB:\n"
           "    @pytest.mark.parametrize('x', [1])\n    def test_c(self,\n               x):  # trailing\n"
           "        assert x == 2\n")
    out = neutered_tests({"t.py": src}, ["t.py::test_a", "t.py::TestB::test_c[1]"])["t.py"]
    assert "def test_a():  # why: a note\n    return\n" in out
    assert "x):  # trailing\n        return\n        assert x == 2" in out
    compile(out, "t.py", "exec")


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_SWE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_recheck_with_a_comment_on_the_failing_tests_def_line(private_cache, capsys):
    """`trace swe validate --recheck` runs every reference check (edit_tests included) on such a test."""
    from trace_envs.swe.repos import RepoSpec, save_repo
    from trace_envs.swe.tasks import load_instance_file
    from trace_train.cli import main

    src = private_cache / "calc"
    shutil.copytree(FIXTURE / "minicalc", src, ignore=shutil.ignore_patterns("__pycache__"))
    inst = load_instance_file(FIXTURE / "minicalc_instances" / "minicalc.jsonl")[0]
    for test in inst["FAIL_TO_PASS"]:
        path, _, name = test.partition("::")
        name = name.split("[")[0].split("::")[-1]
        text = (src / path).read_text()
        assert f"def {name}():\n" in text, test
        (src / path).write_text(text.replace(f"def {name}():\n", f"def {name}():  # note: a comment\n"))
    save_repo(RepoSpec("calc-comments", f"dir:{src}", ("tests",), (".",)))
    file = private_cache / "calc-comments.jsonl"
    file.write_text(json.dumps({**inst, "repo": "calc-comments"}) + "\n")
    assert main(["swe", "validate", "--recheck", str(file)]) in (0, None)
    out = capsys.readouterr().out
    assert "FAILED" not in out and "calc-comments" in out


def test_add_repo_env_pytest_args_and_the_missing_import_hint(private_cache, capsys):
    from trace_envs.swe.repos import known_repos
    from trace_train.cli import main

    repo = private_cache / "envdemo"
    (repo / "envdemo").mkdir(parents=True)
    (repo / "envdemo" / "__init__.py").write_text("def mode():\n    import os\n    return os.environ.get('ENVDEMO_MODE')\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_envdemo.py").write_text(
        "import envdemo\n\ndef test_mode():\n    assert envdemo.mode() == 'pure'\n\n"
        "def test_slow():\n    raise AssertionError('too slow for the sandbox')\n")
    args = ["swe", "add-repo", f"dir:{repo}", "--key", "envdemo", "--env", "ENVDEMO_MODE=pure",
            "--pytest-arg=--deselect=tests/test_envdemo.py::test_slow"]
    assert main(args) in (0, None)
    out = capsys.readouterr().out
    assert "1 passed, 0 failed/error" in out, out
    spec = known_repos()["envdemo"]
    assert spec.env == ("ENVDEMO_MODE=pure",) and spec.pytest_args == ("--deselect=tests/test_envdemo.py::test_slow",)

    broken = private_cache / "needsdep"
    (broken / "tests").mkdir(parents=True)
    (broken / "needsdep.py").write_text("X = 1\n")
    (broken / "tests" / "test_needsdep.py").write_text("import frozendict_not_installed\n\ndef test_x():\n    pass\n")
    assert main(["swe", "add-repo", f"dir:{broken}", "--key", "needsdep"]) == 2
    assert "--requirement frozendict_not_installed" in capsys.readouterr().err
    assert "needsdep" not in known_repos()
    assert main(["swe", "add-repo", f"dir:{broken}", "--key", "needsdep", "--env", "no-equals"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err
