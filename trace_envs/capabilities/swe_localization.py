"""``trace/swe_localization-v0``: find the function that holds a bug (capability env of ``swe_repo``).

Same issues, repositories and read-only tool schemas as ``trace/swe_repo-v0`` (``list_files``,
``view_file``, ``search``), plus ``submit_location``. Nothing is executed, so the bugged tree is
served from memory and no sandbox is needed: this isolates *localization* — reading an issue and
navigating a repository to the faulty function — from editing and testing.
"""

from __future__ import annotations

import re

from trace_envs.core import PlannedPolicy, ToolError, TraceEnv, tool
from trace_envs.core.conversation import hermes_tool_call
from trace_envs.swe.envs import bugged_files, load_repo, resolve_repos
from trace_envs.swe.mutations import FUNCTION_LEVEL
from trace_envs.swe.read_tools import RepoReadTools, grep_lines
from trace_envs.swe.tasks import load_instances


class SweLocalizationEnv(RepoReadTools, TraceEnv):
    """Name the file and function where an injected bug lives.

    ## Description
    The agent gets the issue of a validated ``swe_repo`` instance (failing tests and their errors)
    and read-only access to the bugged repository. It answers with ``submit_location(file, function)``.

    ## Action Space
    Assistant turns (``<tool_call>`` text, bare JSON, OpenAI message or plain text).

    ## Observation Space
    Text: the issue, then tool results.

    ## Rewards
    1.0 if file and function are right (a method may be named ``Class.method`` or ``method``);
    ``file_credit`` (default 0.5) if only the file is right; 0.0 otherwise or without an answer.

    ## Episode End
    ``submit_location`` or a message (terminated); ``max_episode_steps`` (truncated).

    ## Arguments
    repos: repository keys or "default". file_credit: partial reward for the right file.
    difficulty: 1 = issues list every failing test; 2 = only the first failing test is shown
    (less to go on). instances_dir: extra directory of instance files.

    ## Version History
    v0: initial version.
    """

    def __init__(self, repos: str | list[str] = "default", file_credit: float = 0.5, difficulty: int = 1,
                 instances_dir: str | None = None, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if not 0.0 <= file_credit < 1.0:
            raise ValueError(f"file_credit must be in [0, 1), got {file_credit}")
        if difficulty not in (1, 2):
            raise ValueError(f"difficulty must be 1 or 2, got {difficulty}")
        from pathlib import Path

        self.repo_keys = resolve_repos(repos)
        self.file_credit, self.difficulty = file_credit, difficulty
        extra = [Path(instances_dir)] if instances_dir else []
        self.instances = load_instances(self.repo_keys, max_bugs=1, families=FUNCTION_LEVEL, extra_dirs=extra)
        if not self.instances:
            raise ValueError(f"no single-bug function-level instances for {self.repo_keys}")

    def _generate_task(self, options: dict) -> str:
        self.instance = self.instances[int(self.np_random.integers(len(self.instances)))]
        self.repo = load_repo(self.instance["repo"])
        self.files = dict(self.repo.files)
        self.files.update(bugged_files(self.repo, self.instance))
        mutation = self.instance["mutations"][0]
        self.target = {"file": mutation["file"], "function": mutation["function"]}
        self.answer: dict | None = None
        statement = self.instance["problem_statement"]
        if self.difficulty == 2:  # keep only the first failing test
            lines, seen = [], False
            for line in statement.splitlines():
                if line.startswith("- `"):
                    if seen:
                        continue
                    seen = True
                lines.append(line)
            statement = "\n".join(lines)
        return statement + "\n\nFind the function that causes this and report it with submit_location."

    def system_prompt(self) -> str:
        return ("You are a software engineer triaging a bug report for the repository at /testbed. Explore the code "
                "with the read-only tools and report the file and the function that contain the bug.")

    def task_spec(self) -> dict:
        return {"instance_id": self.instance["instance_id"], "target": self.target}

    def world_state(self) -> dict:
        return {"answer": self.answer}

    def functions_in(self, path: str) -> list[str]:
        """Qualified names of the functions and methods defined in a file (for the deficit agents)."""
        out, classes = [], []
        for line in self.files.get(path, "").splitlines():
            m = re.match(r"^(\s*)(class|def) (\w+)", line)
            if not m:
                continue
            indent = len(m.group(1))
            classes = [(i, n) for i, n in classes if i < indent]
            if m.group(2) == "class":
                classes.append((indent, m.group(3)))
            else:
                out.append(".".join([n for _, n in classes] + [m.group(3)]))
        return out

    # ------------------------------------------------------------------ tools
    # list_files / view_file / search (the target's schemas) come from RepoReadTools; these hooks
    # serve the bugged tree from memory.
    def _read(self, path: str) -> str:
        rel = self._path(path)
        if rel not in self.files:
            raise ToolError(f"no such file: {rel}")
        return self.files[rel]

    def _list(self, rel: str) -> str:
        prefix = "" if rel == "." else rel + "/"
        entries = set()
        for f in self.files:
            if f.startswith(prefix):
                parts = f[len(prefix):].split("/")
                for depth in range(1, min(2, len(parts)) + 1):
                    entries.add(prefix + "/".join(parts[:depth]))
        if not entries:
            raise ToolError(f"no such directory: {rel}")
        return "\n".join(sorted(entries))

    def _grep(self, pattern: str, rel: str, limit: int) -> str:
        # grep_lines bounds the time a pattern may take (a backtracking regex must not hang the step)
        chosen = (f for f in sorted(self.files)
                  if f.endswith(".py") and (rel == "." or f == rel or f.startswith(rel + "/")))
        return grep_lines(pattern, ((f, self.files[f]) for f in chosen), limit)

    @tool(write=True)
    def submit_location(self, file: str, function: str) -> str:
        """Report where the bug is; this ends the episode.

        Args:
            file: the file, relative to the repository root, e.g. "src/pkg/module.py".
            function: the function's name; for a method, "Class.method" or "method".
        """
        self.answer = {"file": file, "function": function}
        return "Location submitted."

    def _on_tool_result(self, name, arguments, result) -> None:
        if name == "submit_location" and result.ok:
            self._end("agent_stop")

    def _evaluate(self) -> tuple[float, dict]:
        if not self.answer:
            return 0.0, {"file": 0.0, "function": 0.0, "target": self.target, "answer": None}
        try:
            file_ok = self._path(self.answer["file"]) == self.target["file"]
        except ToolError:
            file_ok = False
        want = self.target["function"]
        got = self.answer["function"].strip().removesuffix("()")
        func_ok = file_ok and (got == want or want.endswith("." + got) and got.count(".") == 0 and
                               sum(f.split(".")[-1] == got for f in self.functions_in(self.target["file"])) == 1)
        reward = 1.0 if func_ok else (self.file_credit if file_ok else 0.0)
        return reward, {"file": float(file_ok), "function": float(func_ok), "target": self.target,
                        "answer": self.answer}

    def oracle(self):
        # After its plan it submits the location again: an episode that goes on still gets an answer.
        return PlannedPolicy([hermes_tool_call("view_file", {"path": self.target["file"]}),
                              hermes_tool_call("submit_location", dict(self.target))])
