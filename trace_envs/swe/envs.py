"""``trace/swe_repo-v0``: repair a bug injected into a real repository, in a Docker sandbox.

See :class:`SweRepoEnv`. Instances come from the validated store (:mod:`trace_envs.swe.tasks`);
the sandbox from :mod:`trace_envs.swe.sandbox`.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from trace_envs.core import EnvError, PlannedPolicy, ToolError, TraceEnv, tool
from trace_envs.core.conversation import hermes_tool_call

from .read_tools import RepoReadTools
from .repos import DEFAULT_REPOS, Repo, get_repo_spec, materialize
from .tasks import (apply_patch, evaluate_in_sandbox, load_instances, prepare_sandbox, replacements, run_tests,
                    stage_clean_tree)

logger = logging.getLogger(__name__)

_REPO_CACHE: dict[str, Repo] = {}


def load_repo(key: str) -> Repo:
    """The clean repository ``key`` (materialized once per process)."""
    if key not in _REPO_CACHE:
        _REPO_CACHE[key] = materialize(get_repo_spec(key))
    return _REPO_CACHE[key]


def resolve_repos(repos: str | list[str]) -> list[str]:
    if repos == "default" or repos == ["default"]:
        return list(DEFAULT_REPOS)
    return [repos] if isinstance(repos, str) else list(repos)


def bugged_files(repo: Repo, instance: dict) -> dict[str, str]:
    """The files the instance's bug patch changes, with the bug applied."""
    return apply_patch(repo.files, instance["patch"])


def _staged_sandbox(image: str):
    """A pooled sandbox: started and its clean tree indexed by git in the pool's thread, off the reset path."""
    from .sandbox import DockerSandbox

    box = DockerSandbox(image)
    try:
        stage_clean_tree(box)
    except Exception:
        box.close()
        raise
    return box


class SweRepoEnv(RepoReadTools, TraceEnv):
    """Fix a validated bug in a real Python repository.

    ## Description
    A bug was injected into a repository by a procedural AST mutation (SWE-smith's families) and
    validated by the repository's own tests. The agent reads an issue describing the failing
    behaviour, explores and edits the repository in a locked-down container, runs the tests and
    submits.

    ## Action Space
    The assistant's turn as text (a ``<tool_call>`` block or a message) or an OpenAI assistant message.
    Tools: ``list_files``, ``view_file``, ``search``, ``replace_in_file``, ``insert_lines``,
    ``create_file``, ``run_tests``, ``bash``, ``submit``.

    ## Observation Space
    Text: the issue, then tool results.

    ## Rewards
    On ``submit`` (or a message to the user, which ends the episode), the grader trusts nothing the
    agent left behind (:func:`~trace_envs.swe.tasks.restore_for_grading`): every process of the
    agent is killed; test files, conftests, pytest and packaging configuration, ``.pth`` and
    ``sitecustomize`` files are restored from the clean tree baked read-only into the image (not from
    the agent's git ``HEAD``); caches, foreign symlinks and ``/tmp`` are wiped; only the agent's changes
    to other files are kept. The suite then runs as a uid that cannot write the repository, through a
    launcher no file in the repository can shadow (the report plugin loaded from its absolute path,
    the standard library and installed packages ahead of the repository, no ``site``, no plugin
    auto-loading; the instance's own conftests and ini file apply, as in validation). 1.0 iff every
    FAIL_TO_PASS and PASS_TO_PASS test passes (explicit passes only), else 0.0; a change to the library
    that reaches for pytest, the report or the import system earns 0.0 (``harness_tampering``).
    Per-test statuses are in ``info["reward_breakdown"]``. :mod:`trace_envs.swe.cheats` lists the
    attacks this defeats (all score 0.0 in ``tests/test_swe_adversarial.py``).

    Commands: each runs in its own process group with a time budget; no process it starts outlives
    it; out-of-memory kills, time-outs, the process limit and full disk budgets (``/testbed`` 256 MB,
    ``/tmp`` 512 MB) are reported as such at the top of the ``bash`` result.

    ## Episode End
    ``submit`` or a message (terminated); ``max_episode_steps`` (truncated). A failure of the machine, not
    of the agent — an image that cannot be built, a Docker engine that does not answer, a container that
    died — ends the episode with termination ``env_error`` and the reason in ``info["env_error"]``
    (:class:`trace_envs.core.EnvError`): rollouts count it apart and evaluation reruns it.

    ## Arguments
    repos: repository keys, or "default" (the eight default PyPI libraries).
    difficulty: 1 = one bug, 2 = two bugs in different functions (combined instances).
    sandbox: "docker" (default) or "local" (no isolation; warns).
    pool_size: warm containers kept ready (0: start one lazily on the first tool call).
    command_timeout: seconds per bash command; test_timeout: seconds per test run.
    instances_dir: an extra directory of instance files (<repo>.jsonl), searched first.

    ## Version History
    v0: initial version.
    """

    max_invalid_actions = 8

    def __init__(self, repos: str | list[str] = "default", difficulty: int = 1, sandbox: str = "docker",
                 pool_size: int = 0, command_timeout: float = 30.0, test_timeout: float = 120.0,
                 instances_dir: str | None = None, render_mode: str | None = None):
        super().__init__(render_mode=render_mode)
        if difficulty not in (1, 2):
            raise ValueError(f"difficulty must be 1 (one bug) or 2 (two bugs), got {difficulty}")
        if sandbox not in ("docker", "local"):
            raise ValueError(f"sandbox must be 'docker' or 'local', got {sandbox!r}")
        self.repo_keys = resolve_repos(repos)
        self.difficulty = difficulty
        self.sandbox_kind = sandbox
        self.pool_size = pool_size
        self.command_timeout = command_timeout
        self.test_timeout = test_timeout
        extra = [Path(instances_dir)] if instances_dir else []
        self.instances = load_instances(self.repo_keys, min_bugs=difficulty, max_bugs=difficulty, extra_dirs=extra)
        if not self.instances:
            raise ValueError(f"no validated instances with {difficulty} bug(s) for {self.repo_keys}; create some with "
                             "`trace swe validate REPO`")
        self._box = None
        self._sandbox_failed: str | bool = False
        self._pools: dict[str, object] = {}
        self.instance: dict | None = None
        self.repo: Repo | None = None

    # ------------------------------------------------------------------ sandbox management
    def _new_box(self, repo: Repo):
        if self.sandbox_kind == "local":
            from .sandbox import LocalSandbox

            return LocalSandbox(repo.root, list(repo.spec.python_path))
        from .sandbox import ContainerPool, DockerSandbox

        image = repo.image()
        if self.pool_size > 0:
            pool = self._pools.get(image)
            if pool is None:
                pool = self._pools[image] = ContainerPool(lambda: _staged_sandbox(image), self.pool_size)
            return pool.acquire(wait_s=30, refill=False)  # refilled after the reset (see _generate_task)
        return DockerSandbox(image)

    def _release_box(self, wait: bool = True) -> None:
        if self._box is not None:
            if getattr(self._box, "kind", "") == "docker":
                self._box.close(wait=wait)  # on reset, removed in the background: the new episode need not wait
            else:
                self._box.close()
            self._box = None

    def _sandbox(self):
        """The episode's sandbox, started (and loaded with the bugged repository) on first use.

        A sandbox that cannot start (the image cannot be built, no engine answers, the container does not
        come up) is the machine's failure: :class:`EnvError`, remembered for the rest of the episode."""
        from .images import InfraError
        from .sandbox import SandboxError

        if self._sandbox_failed:
            raise EnvError(f"the sandbox failed: {self._sandbox_failed}")
        if self._box is None:
            try:
                self._box = self._new_box(self.repo)
                prepare_sandbox(self._box, self._bugged)
            except (SandboxError, InfraError) as exc:
                self._sandbox_failed = str(exc)
                raise EnvError(f"the sandbox failed to start: {exc}") from exc
        return self._box

    def _sandbox_gone(self, exc: Exception) -> EnvError:
        """The error that ends the episode when the running sandbox fails (container killed, engine gone)."""
        self._sandbox_failed = str(exc)
        return EnvError(f"the sandbox failed: {exc}")

    def _sh(self, command: str, timeout: float | None = None, max_output: int = 20_000):
        from .sandbox import SandboxError

        box = self._sandbox()
        try:
            return box.run(command, timeout=timeout or self.command_timeout, max_output=max_output)
        except SandboxError as exc:
            raise self._sandbox_gone(exc) from exc

    def preflight(self) -> None:
        """Check that a Docker engine answers and build (or find) the base image every repository's image is
        made from, so that a machine that cannot run the sandbox stops a rollout before its first episode
        instead of failing each one. A repository's own image is built when an episode first needs it (a
        rollout of a few seeds should not build all eight); if that fails, the episode ends in env_error and
        the failure is remembered for the rest of the process."""
        if self.sandbox_kind == "local":
            return
        from .images import InfraError, build_base_image

        try:
            build_base_image(verbose=False)
        except InfraError as exc:
            raise EnvError(f"the sandbox cannot run here: {exc}") from exc

    def open_resources(self) -> list[str]:
        out = [repr(self._box)] if self._box is not None else []
        for pool in self._pools.values():
            out += pool.open_resources()
        return out

    def close(self) -> None:
        self._release_box()
        for pool in self._pools.values():
            pool.close()
        self._pools = {}
        super().close()

    # ------------------------------------------------------------------ task
    def _generate_task(self, options: dict) -> str:
        # The previous container is removed, and the pool refilled, only after the new episode's sandbox
        # is ready: both keep dockerd busy and would otherwise slow this reset down.
        previous, self._box = self._box, None
        index = int(self.np_random.integers(len(self.instances)))
        if "instance_id" in options:
            ids = [i["instance_id"] for i in self.instances]
            index = ids.index(options["instance_id"])
        self.instance = self.instances[index]
        self.repo = load_repo(self.instance["repo"])
        self._bugged = bugged_files(self.repo, self.instance)
        self._sandbox_failed: str | bool = False
        self.submitted = False
        self.tests_run = 0
        try:
            if self.pool_size > 0:  # a warm container is ready: load the repository now
                try:
                    self._sandbox()
                except EnvError:
                    pass  # remembered: the episode's first tool call ends it with env_error
        finally:
            if previous is not None:
                previous.close(**({"wait": False} if getattr(previous, "kind", "") == "docker" else {}))
            for pool in self._pools.values():
                pool.refill()
        return self.instance["problem_statement"]

    def system_prompt(self) -> str:
        return ("You are a software engineer fixing a bug in the repository at /testbed. Read the issue, find the "
                "cause in the library code, fix it with the editing tools, run the tests, and call submit when "
                "done. Do not modify the tests: test files are restored before grading.")

    def task_spec(self) -> dict:
        return {"instance_id": self.instance["instance_id"], "difficulty": self.difficulty}

    def world_state(self) -> dict:
        return {"submitted": self.submitted, "tests_run": self.tests_run,
                "sandbox": repr(self._box) if self._box else None}

    # ------------------------------------------------------------------ tools
    # list_files / view_file / search come from RepoReadTools; these hooks read the sandbox.
    def _read(self, path: str) -> str:
        rel = self._path(path)
        res = self._sh(f"cat -- {shlex.quote(rel)}", max_output=5_000_000)
        if res.exit_code != 0:
            raise ToolError(f"cannot read {rel}: {res.output.strip()[:200]}")
        return res.output

    def _list(self, rel: str) -> str:
        # Paths relative to the root, without find's "./" (as the other tools take them). Without the
        # test, a missing directory would "list" as find's error message (the pipeline ends in sort: exit 0).
        res = self._sh(f"test -d {shlex.quote(rel)} || exit 3; find {shlex.quote(rel)} -mindepth 1 -maxdepth 2 "
                       f"-not -path '*/.git*' -not -path '*__pycache__*' | sed 's|^\\./||' | sort")
        if res.exit_code == 3:
            raise ToolError(f"no such directory: {rel}")
        if res.exit_code != 0:
            raise ToolError(f"cannot list {rel}: {res.output.strip()[:200]}")
        return res.output

    def _grep(self, pattern: str, rel: str, limit: int) -> str:
        # Sorted by file, then line: grep walks directories in their on-disk order, which differs between filesystems.
        res = self._sh(f"grep -rnE --include='*.py' -e {shlex.quote(pattern)} -- {shlex.quote(rel)} "
                       f"| sort -t: -k1,1 -k2,2n -s | head -{limit}")
        return res.output

    @tool(write=True)
    def replace_in_file(self, path: str, old: str, new: str) -> str:
        """Replace one exact occurrence of a snippet in a file.

        Args:
            path: the file, relative to the repository root.
            old: the exact text to replace; it must occur exactly once in the file.
            new: the replacement text.
        """
        text = self._read(path)
        count = text.count(old) if old else 0
        if count != 1:
            raise ToolError(f"`old` occurs {count} times in {path}; give a snippet that occurs exactly once")
        self._write(path, text.replace(old, new, 1))
        return f"Replaced 1 occurrence in {self._path(path)}."

    @tool(write=True)
    def insert_lines(self, path: str, line: int, text: str) -> str:
        """Insert text after a given line of a file (0 inserts at the top).

        Args:
            path: the file, relative to the repository root.
            line: the line after which to insert (0 to insert before the first line).
            text: the lines to insert.
        """
        lines = self._read(path).splitlines(keepends=True)
        if not 0 <= line <= len(lines):
            raise ToolError(f"line must be between 0 and {len(lines)}")
        chunk = text if text.endswith("\n") else text + "\n"
        self._write(path, "".join(lines[:line]) + chunk + "".join(lines[line:]))
        return f"Inserted {chunk.count(chr(10))} line(s) after line {line} of {self._path(path)}."

    @tool(write=True)
    def create_file(self, path: str, content: str) -> str:
        """Create a file, or overwrite an existing one, with the given content.

        Args:
            path: the file, relative to the repository root.
            content: the full new content.
        """
        self._write(path, content)
        return f"Wrote {len(content)} characters to {self._path(path)}."

    def _write(self, path: str, content: str) -> None:
        from .sandbox import SandboxError

        from .sandbox import SandboxWriteError

        box = self._sandbox()
        try:
            box.write_files({self._path(path): content})
        except SandboxWriteError as exc:  # e.g. a directory the agent made read-only: its problem, not the sandbox's
            raise ToolError(str(exc)) from exc
        except SandboxError as exc:
            raise self._sandbox_gone(exc) from exc

    @tool
    def run_tests(self, tests: list[str] | None = None) -> str:
        """Run the repository's tests (all of them, or the given test files or node ids) and report each failure.

        Args:
            tests: test files or pytest node ids such as "tests/test_x.py::test_y"; omit to run the whole suite.
        """
        from .sandbox import SandboxError

        box = self._sandbox()
        targets = [self._path(t.split("::")[0]) + ("::" + t.split("::", 1)[1] if "::" in t else "") for t in tests or []]
        try:
            run = run_tests(box, self.repo, targets or None, timeout=self.test_timeout)
        except SandboxError as exc:
            raise self._sandbox_gone(exc) from exc
        self.tests_run += 1
        counts: dict[str, int] = {}
        for status in run.statuses.values():
            counts[status] = counts.get(status, 0) + 1
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "no tests ran"
        bad = [f"{t}: {s}" for t, s in sorted(run.statuses.items()) if s not in ("passed", "skipped", "xfail")]
        text = f"{summary}.\n" + ("\n".join(bad[:50]) + "\n" if bad else "")
        if bad or run.collect_errors or not run.statuses:
            text += "\n" + run.output[-4000:]
        return text

    @tool
    def bash(self, command: str) -> str:
        """Run a shell command in the repository root (no network; time-limited; output capped).

        Args:
            command: the bash command line.
        """
        res = self._sh(command)
        # The notes (time-out, out of memory, process limit, full disk) first: a long output is cut at its end.
        return "\n".join([f"[exit code {res.exit_code}]", *res.notes, res.body])

    @tool(write=True)
    def submit(self) -> str:
        """Submit your changes for grading; this ends the episode."""
        self.submitted = True
        return "Submitted."

    # ------------------------------------------------------------------ flow and reward
    def _on_tool_result(self, name, arguments, result) -> None:
        if name == "submit" and result.ok:
            self._end("agent_stop")

    def _evaluate(self) -> tuple[float, dict]:
        from .sandbox import SandboxError

        base = {"instance_id": self.instance["instance_id"], "submitted": self.submitted}
        if self._sandbox_failed:
            raise EnvError(f"the sandbox failed: {self._sandbox_failed}")
        if self._box is None:  # no tool ever touched the repository: the bug is still there
            return 0.0, {**base, "reason": "no_changes"}
        try:
            reward, breakdown = evaluate_in_sandbox(self._box, self.repo, self.instance, timeout=self.test_timeout)
        except SandboxError as exc:  # the grader's container failed: the machine's fault, not a score
            raise EnvError(f"the sandbox failed while grading: {exc}") from exc
        return reward, {**base, **breakdown}

    # ------------------------------------------------------------------ oracle
    def gold_edits(self) -> list[tuple[str, str, str]]:
        """(path, old, new) replacements that undo the bug (used by the oracle and the deficit agents)."""
        edits = []
        for path in sorted(self._bugged):
            for old, new in replacements(self._bugged[path], self.repo.files[path]):
                edits.append((path, old, new))
        return edits

    def oracle(self):
        plan = [hermes_tool_call("replace_in_file", {"path": p, "old": o, "new": n}) for p, o, n in self.gold_edits()]
        plan.append(hermes_tool_call("run_tests", {"tests": list(self.instance["FAIL_TO_PASS"])}))
        plan.append(hermes_tool_call("submit", {}))
        return PlannedPolicy(plan)  # submits again after its plan: an episode that goes on still gets an answer
