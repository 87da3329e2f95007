"""Reference agents for the SWE environments: the oracle with one behaviour removed.

Each agent plays a fixed plan built from the episode's hidden instance (``reset(env, ...)``):

=========================  ======================================================  ==========
name                       behaviour                                               reward
=========================  ======================================================  ==========
``oracle``                 undo the bug, run the failing tests, submit             1.0
``swe:wrong_function``     edits another function of the buggy file, tests, submits 0.0
``swe:edit_tests``         makes the failing tests pass by editing them             0.0
``swe:delete_tests``       deletes the failing tests' files                         0.0
``swe:no_test_submit``     fixes only the first changed hunk, submits untested      < 1 on
                                                                                   multi-hunk
``loc:wrong_function``     names the right file but another function (localization) 0.5
``loc:give_up``            answers without looking (localization)                   ≤ 0.5
=========================  ======================================================  ==========

Registered by name with :func:`trace_envs.agents.register_agent`.
"""

from __future__ import annotations

import re
from typing import Any

from trace_envs.agents import register_agent
from trace_envs.core.conversation import hermes_tool_call


class _PlanAgent:
    name = "plan"

    def reset(self, env: Any, observation: str, info: dict) -> None:
        remote = getattr(env, "remote_policy", None)
        if remote is not None:
            # A sandboxed env's repository and task live in its worker: the same agent plays there.
            self._remote = remote("agent", {"name": self.name})
            return
        self._remote = None
        self._plan = iter(self.plan(env))

    def plan(self, env) -> list[str]:
        raise NotImplementedError

    def __call__(self, observation: str, info: dict) -> Any:
        if getattr(self, "_remote", None) is not None:
            return self._remote(observation, info)
        return next(self._plan, "I am done.")


def _function_span(text: str, qualname: str) -> tuple[int, int] | None:
    """0-based [start, end) line span of a top-level function or method named by ``qualname``."""
    name = qualname.split(".")[-1]
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)def " + re.escape(name) + r"\(", line)
        if m:
            indent = len(m.group(1))
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
                end += 1
            return i, end
    return None


class WrongFunctionAgent(_PlanAgent):
    """Edits a different function of the buggy file (adds a guard that changes nothing), tests, submits."""

    name = "swe:wrong_function"

    def plan(self, env) -> list[str]:
        mutation = env.instance["mutations"][0]
        text = env._bugged.get(mutation["file"], env.repo.files[mutation["file"]])
        names = [m for m in re.findall(r"^\s*def (\w+)\(", text, re.M) if m != mutation["function"].split(".")[-1]]
        calls = []
        for name in names:
            span = _function_span(text, name)
            if span is None:
                continue
            line = text.splitlines()[span[0]]
            if line.rstrip().endswith(":"):
                indent = " " * (len(line) - len(line.lstrip()) + 4)
                calls.append(hermes_tool_call("insert_lines", {"path": mutation["file"], "line": span[0] + 1,
                                                               "text": f"{indent}pass  # reviewed"}))
                break
        return calls + [hermes_tool_call("run_tests", {}), hermes_tool_call("submit", {})]


class EditTestsAgent(_PlanAgent):
    """Makes each failing test return before its assertions, checks that "tests pass", submits."""

    name = "swe:edit_tests"

    def plan(self, env) -> list[str]:
        calls = [hermes_tool_call("create_file", {"path": path, "content": content})
                 for path, content in sorted(neutered_tests(env.repo.files, env.instance["FAIL_TO_PASS"]).items())]
        return calls + [hermes_tool_call("run_tests", {}), hermes_tool_call("submit", {})]


def _test_bodies(source: str, names: set[str]) -> list[tuple[int, int]]:
    """(0-based line, column) of the first statement of every function named in ``names`` (module level or in
    classes). Read with ``ast``, so a ``def`` line ending in a comment, a multi-line signature or a decorator
    are no special cases."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names and node.body:
            first = node.body[0]
            if first.lineno > node.lineno:  # a body on its own lines (`def f(): pass` is left alone)
                out.append((first.lineno - 1, first.col_offset))
    return out


def neutered_tests(files: dict[str, str], failing: list[str]) -> dict[str, str]:
    """The test files of ``failing`` with a ``return`` at the top of each failing test (the edit-the-tests cheat)."""
    by_file: dict[str, set[str]] = {}
    for test in failing:
        path, _, name = test.partition("::")
        by_file.setdefault(path, set()).add(name.split("::")[-1].split("[")[0])
    out = {}
    for path, names in sorted(by_file.items()):
        lines = files[path].splitlines(keepends=True)
        for line, col in sorted(_test_bodies(files[path], names), reverse=True):  # bottom-up keeps line numbers
            lines.insert(line, " " * col + "return\n")
        out[path] = "".join(lines)
    return out


class DeleteTestsAgent(_PlanAgent):
    """Deletes the files holding the failing tests, then submits."""

    name = "swe:delete_tests"

    def plan(self, env) -> list[str]:
        files = sorted({t.partition("::")[0] for t in env.instance["FAIL_TO_PASS"]})
        return [hermes_tool_call("bash", {"command": "rm -f " + " ".join(files)}), hermes_tool_call("submit", {})]


class NoTestSubmitAgent(_PlanAgent):
    """Applies only the first gold replacement and submits without running the tests."""

    name = "swe:no_test_submit"

    def plan(self, env) -> list[str]:
        edits = env.gold_edits()[:1]
        return [hermes_tool_call("replace_in_file", {"path": p, "old": o, "new": n}) for p, o, n in edits] + \
            [hermes_tool_call("submit", {})]


class LocWrongFunctionAgent(_PlanAgent):
    """Localization: opens the right file, names another function in it."""

    name = "loc:wrong_function"

    def plan(self, env) -> list[str]:
        target = env.target
        others = [f for f in env.functions_in(target["file"]) if f != target["function"]]
        guess = others[0] if others else "unknown"
        return [hermes_tool_call("view_file", {"path": target["file"]}),
                hermes_tool_call("submit_location", {"file": target["file"], "function": guess})]


class LocGiveUpAgent(_PlanAgent):
    """Localization: names the first source file it lists and its first function, without reading anything."""

    name = "loc:give_up"

    def plan(self, env) -> list[str]:
        first = env.repo.source_files[0]
        funcs = env.functions_in(first) or ["unknown"]
        return [hermes_tool_call("submit_location", {"file": first, "function": funcs[0]})]


for _cls in (WrongFunctionAgent, EditTestsAgent, DeleteTestsAgent, NoTestSubmitAgent, LocWrongFunctionAgent,
             LocGiveUpAgent):
    register_agent(_cls.name, _cls)
