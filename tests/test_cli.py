"""The ``trace`` command line: in-process through ``main([...])`` and through the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import gymnasium as gym
import pytest

import trace_envs
from trace_train import cli

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = "examples/warehouse_stock-v0"


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def console_script() -> Path:
    script = Path(sys.executable).parent / "trace"
    if not script.exists():
        pytest.fail(f"the `trace` console script is not installed next to {sys.executable}; "
                    "run `pip install -e .` in the repository", pytrace=False)
    return script


def run_script(*argv: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([str(console_script()), *argv], capture_output=True, text=True, env=full_env, cwd=cwd,
                          timeout=300)


# ---------------------------------------------------------------- in-process

def test_help_and_version(capsys) -> None:
    code, out, _ = run_main(capsys, "--help")
    assert code == 0
    assert "usage: trace" in out and "envs" in out and "list, inspect and check environments" in out
    code, out, _ = run_main(capsys, "--version")
    assert code == 0 and out.strip() == f"trace {trace_envs.__version__}"
    code, out, _ = run_main(capsys, "envs", "--help")
    assert code == 0 and all(verb in out for verb in ("list", "show", "check"))


def test_envs_list(capsys) -> None:
    code, out, err = run_main(capsys, "envs", "list")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["id", "kind", "capability", "target", "requires", "origin"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {e.id for e in trace_envs.registered()}
    assert rows[EXAMPLE] == [EXAMPLE, "capability", "structured_data_reasoning", "-", "-", "hand-written"]
    # Columns are aligned: every row's second column starts where the header's does.
    column = lines[0].index("kind")
    assert all(line[column - 2:column] == "  " and line[column] != " " for line in lines[2:])


def test_envs_list_kind_filter(capsys) -> None:
    code, out, _ = run_main(capsys, "envs", "list", "--kind", "capability")
    assert code == 0 and EXAMPLE in out
    code, out, _ = run_main(capsys, "envs", "list", "--kind", "target")
    assert code == 0 and EXAMPLE not in out
    targets = [e.id for e in trace_envs.registered() if e.kind == "target"]
    assert all(t in out for t in targets)
    code, _, err = run_main(capsys, "envs", "list", "--kind", "bogus")
    assert code == 2 and err.strip() == "trace: error: unknown kind 'bogus'; choose one of target, capability, sanity"


def test_envs_show(capsys, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    code, out, err = run_main(capsys, "envs", "show", EXAMPLE, "--seed", "3", "--registry", "examples")
    assert code == 0, err
    env = gym.make(EXAMPLE)
    obs, info = env.reset(seed=3)
    fingerprint = env.unwrapped.task_fingerprint()
    product = env.unwrapped.product
    env.close()
    assert out.startswith(EXAMPLE + "\n")
    assert "Sum a product's stock across warehouses" in out           # registry description
    for section in ("## Description", "## Rewards", "## Episode End", "## Arguments", "## Version History"):
        assert section in out                                          # the class docstring
    assert "Tools (3)" in out
    assert "  get_stock(warehouse_id: string)\n      Get the stock of every product in one warehouse." in out
    assert "  submit_total(total: integer)\n" in out and "  list_warehouses()\n" in out
    assert "Sample task (seed 3)" in out
    assert f"How many units of the {product} do we have in stock" in out
    assert "<tools>" not in out and '"parameters"' not in out          # the long JSON block is left out
    assert f"task fingerprint: {fingerprint}" in out


def test_envs_show_seed_changes_task(capsys) -> None:
    outs = [run_main(capsys, "envs", "show", EXAMPLE, "--seed", str(seed))[1] for seed in range(4)]
    fingerprints = {line for out in outs for line in out.splitlines() if line.startswith("task fingerprint:")}
    assert len(fingerprints) == 4


def test_envs_check(capsys) -> None:
    code, out, err = run_main(capsys, "envs", "check", EXAMPLE, "--seeds", "4")
    assert code == 0, out + err
    assert f"Conformance of {EXAMPLE}: PASS" in out
    assert "[ok] oracle scores 1.0" in out and "1.0 on 4 seeds" in out
    assert "FAIL" not in out


@pytest.mark.parametrize("argv,message", [
    (["envs", "show", "nope/missing-v0"], "unknown TRACE environment 'nope/missing-v0'"),
    (["envs", "check", "nope/missing-v0"], "unknown TRACE environment 'nope/missing-v0'"),
    (["envs", "check", EXAMPLE, "--seeds", "1"], "--seeds must be at least 2"),
    (["envs", "list", "--registry", "/nonexistent/trace-ws"], "registry file not found"),
    (["envs", "show"], "the following arguments are required: ID"),
    (["envs", "show", EXAMPLE, "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_user_errors_are_one_line_exit_2(capsys, argv: list[str], message: str) -> None:
    code, out, err = run_main(capsys, *argv)
    assert code == 2
    assert message in err
    assert err.startswith("trace") and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def test_group_without_subcommand_shows_help(capsys) -> None:
    code, out, err = run_main(capsys, "envs")
    assert code == 2 and "list" in err and "show" in err and "check" in err


# ---------------------------------------------------------------- command modules

def _fake_command_package(tmp_path: Path, monkeypatch) -> str:
    package = f"fake_trace_cmds_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / package
    folder.mkdir()
    (folder / "__init__.py").write_text("", encoding="utf-8")
    (folder / "needs_extra.py").write_text(textwrap.dedent("""
        import trace_test_dependency_that_is_not_installed  # an optional extra

        def register(subparsers):
            raise AssertionError("never reached")
    """), encoding="utf-8")
    (folder / "buggy.py").write_text("import trace_envs.no_such_module_here\n", encoding="utf-8")
    (folder / "hello.py").write_text(textwrap.dedent("""
        def register(subparsers):
            p = subparsers.add_parser("hello", help="say hello")
            p.add_argument("--name", default="world")
            p.set_defaults(func=lambda args: print(f"hello {args.name}") or 0)
    """), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return package


def test_command_modules_are_pluggable_and_isolated(tmp_path, monkeypatch, capsys) -> None:
    package = _fake_command_package(tmp_path, monkeypatch)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["envs", f"{package}.needs_extra", f"{package}.hello"])

    code, out, _ = run_main(capsys, "hello", "--name", "trace")
    assert (code, out) == (0, "hello trace\n")
    code, out, _ = run_main(capsys, "envs", "list")
    assert code == 0 and EXAMPLE in out              # other verbs keep working
    code, out, _ = run_main(capsys, "--help")
    assert "needs_extra" in out and "unavailable" in out

    code, out, err = run_main(capsys, "needs_extra", "--anything")
    assert code == 2
    assert "`trace needs_extra` is unavailable" in err
    assert "trace_test_dependency_that_is_not_installed" in err and "Fix: pip install" in err
    assert "Traceback" not in err


def test_a_broken_import_of_our_own_code_is_not_hidden(tmp_path, monkeypatch) -> None:
    package = _fake_command_package(tmp_path, monkeypatch)
    monkeypatch.setattr(cli, "COMMAND_MODULES", ["envs", f"{package}.buggy"])
    with pytest.raises(ModuleNotFoundError, match="trace_envs.no_such_module_here"):
        cli.main(["envs", "list"])


def test_every_listed_command_module_loads() -> None:
    parser = cli.build_parser()
    verbs = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - argparse keeps them here
    assert "envs" in verbs
    for name in cli.COMMAND_MODULES:
        assert hasattr(__import__(cli._module_path(name), fromlist=["register"]), "register")


# ---------------------------------------------------------------- the installed console script

def test_console_script_list_show_check() -> None:
    done = run_script("envs", "list", "--registry", "examples")
    assert done.returncode == 0, done.stderr
    assert EXAMPLE in done.stdout and done.stdout.startswith("id ")

    done = run_script("envs", "show", EXAMPLE, "--seed", "3", "--registry", "examples")
    assert done.returncode == 0, done.stderr
    assert "Sample task (seed 3)" in done.stdout and "task fingerprint: " in done.stdout

    done = run_script("envs", "check", EXAMPLE, "--seeds", "3", "--registry", "examples")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Conformance of {EXAMPLE}: PASS" in done.stdout


def test_console_script_check_failure_exits_1(tmp_path: Path) -> None:
    module = f"ws_wrong_oracle_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent('''
        from trace_envs import TraceEnv, tool
        from trace_envs.core.conversation import hermes_tool_call


        class WrongOracleEnv(TraceEnv):
            """Its oracle answers wrong on purpose."""

            def _generate_task(self, options):
                self.n = int(self.np_random.integers(100))
                self.answer = None
                return f"Answer with {self.n}."

            def task_spec(self):
                return {"n": self.n}

            @tool(write=True)
            def answer_with(self, n: int) -> str:
                """Give the answer.

                Args:
                    n: the number.
                """
                self.answer = n
                self._end("agent_stop")
                return "ok"

            def _evaluate(self):
                return float(self.answer == self.n), {}

            def oracle(self):
                return lambda observation, info: hermes_tool_call("answer_with", {"n": self.n + 1})
    '''), encoding="utf-8")
    (tmp_path / "registry.yaml").write_text(textwrap.dedent(f"""
        - id: ws/wrong_oracle-v0
          entry_point: {module}:WrongOracleEnv
          kind: capability
          max_episode_steps: 5
          description: An env whose oracle fails.
    """), encoding="utf-8")
    done = run_script("envs", "check", "ws/wrong_oracle-v0", "--seeds", "3", "--registry", str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Conformance of ws/wrong_oracle-v0: FAIL" in done.stdout
    assert "[FAIL] oracle scores 1.0" in done.stdout and "oracle below 1.0 on 3/3 seeds" in done.stdout


def test_console_script_broken_trace_registry_is_a_clear_error() -> None:
    env = {"TRACE_REGISTRY": "/nonexistent/trace-workspace"}
    done = run_script("envs", "list", env=env)
    assert done.returncode == 2
    assert "registry file not found" in done.stderr and "Fix:" in done.stderr and "TRACE_REGISTRY" in done.stderr
    assert "Traceback" not in done.stderr
    assert run_script("--help", env=env).returncode == 0  # help never needs the registry
