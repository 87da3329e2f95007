"""Task instances: bugs validated by the repository's own tests, cached as SWE-smith-style JSON.

Pipeline (``trace swe validate``, ``bench/swe_yield.py``):

1. :func:`~trace_envs.swe.mutations.sample_mutations` proposes candidate bugs from a seed;
2. in one sandbox per repository, the clean suite runs twice — tests whose status differs are
   flaky and excluded; each candidate file is written in, the suite runs, the file is restored;
3. ``FAIL_TO_PASS`` = passed in both clean runs and not passed with the bug; ``PASS_TO_PASS`` =
   passed in all runs. Only statuses pytest reported explicitly count (the report plugin; a
   test missing from the report is a failure). A bug is kept with ≥ 1 of each;
4. combinations of validated bugs (different functions) are validated again as harder tasks;
5. the instance gets an issue text built from the failing behaviour (test names and error
   messages, never the location or the fix) and is stored as one JSON object per line.

Instance fields (SWE-smith's): ``instance_id``, ``repo``, ``base_commit`` (content hash of the
clean tree), ``patch`` (the diff that *introduces* the bug, as in SWE-smith; the gold fix is its
reverse), ``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``image_name``, ``problem_statement``; plus TRACE's
``mutations`` (family, file, function, line of each bug), ``gold_patch`` and ``validation``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from .images import cache_dir
from .mutations import FAMILIES, Mutation, sample_mutations, unified_diff
from .repos import PROTECTED_NAMES, Repo

PACKAGED_INSTANCES = Path(__file__).parent / "data" / "instances"
GIT_IDENTITY = "-c user.name=trace -c user.email=trace@localhost -c commit.gpgsign=false"


# ------------------------------------------------------------------------------------------ patches

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_patch(patch: str) -> dict[str, list[tuple[list[str], list[str]]]]:
    """``{path: [(old_lines, new_lines), ...]}`` from a unified diff (a/ b/ prefixes)."""
    out: dict[str, list[tuple[list[str], list[str]]]] = {}
    path, old, new, prev = None, None, None, ""
    for line in patch.splitlines(keepends=True):
        if line.startswith("--- "):
            continue
        if line.startswith("+++ "):
            path = line[4:].strip()
            path = path[2:] if path.startswith("b/") else path
            out.setdefault(path, [])
            continue
        if line.startswith("@@"):
            old, new = [], []
            out[path].append((old, new))
            continue
        if old is None:
            continue
        if line.startswith("\\"):  # "\ No newline at end of file" applies to the previous line
            targets = {"-": (old,), "+": (new,), " ": (old, new)}.get(prev, ())
            for block in targets:
                if block and block[-1].endswith("\n"):
                    block[-1] = block[-1][:-1]
            continue
        prev = line[:1]
        body = line[1:]
        if prev == " ":
            old.append(body)
            new.append(body)
        elif prev == "-":
            old.append(body)
        elif prev == "+":
            new.append(body)
    return out


def apply_patch(files: dict[str, str], patch: str, reverse: bool = False) -> dict[str, str]:
    """Apply a unified diff to ``files``; returns the changed files' new contents. Raises ValueError if a hunk misses."""
    changed: dict[str, str] = {}
    for path, hunks in parse_patch(patch).items():
        text = changed.get(path, files[path])
        for old, new in hunks:
            if reverse:
                old, new = new, old
            before, after = "".join(old), "".join(new)
            if before not in text:
                raise ValueError(f"patch does not apply to {path}")
            text = text.replace(before, after, 1)
        changed[path] = text
    return changed


def replacements(before: str, after: str, context: int = 1) -> list[tuple[str, str]]:
    """Minimal (old, new) text replacements turning ``before`` into ``after``, each old snippet unique in ``before``."""
    import difflib

    a, b = before.splitlines(keepends=True), after.splitlines(keepends=True)
    out = []
    for tag, i1, i2, j1, j2 in reversed(difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()):
        if tag == "equal":
            continue
        for ctx in range(context, 50):
            lo, hi = max(0, i1 - ctx), min(len(a), i2 + ctx)
            old = "".join(a[lo:hi])
            if old and before.count(old) == 1:
                new = "".join(a[lo:i1]) + "".join(b[j1:j2]) + "".join(a[i2:hi])
                out.append((old, new))
                break
        else:
            raise ValueError("no unique context for a change")
    # applied one after another, bottom-up changes first keep earlier snippets intact
    return out


# ------------------------------------------------------------------------------------------ running tests

@dataclass
class TestRun:
    """Statuses of one pytest run, as the report plugin recorded them."""

    statuses: dict[str, str]
    output: str
    seconds: float
    exit_code: int
    collect_errors: list[str] = field(default_factory=list)
    #: wall time of the pytest process itself, measured inside the sandbox (``seconds`` minus this is
    #: what the harness adds: the shell round trips and reading the report)
    process_seconds: float | None = None

    def passed(self, test: str) -> bool:
        return self.statuses.get(test) == "passed"


def run_tests(sandbox, repo: Repo, tests: list[str] | None = None, timeout: float = 120.0,
              max_output: int = 8000, as_grader: bool = False) -> TestRun:
    """Run pytest in ``sandbox`` and read the explicit per-test statuses.

    The output keeps its start and its end when it is longer than ``max_output`` (pytest's summary of
    failures is at the end). The report is read in the same round trip, after every process the test
    run left is gone. ``as_grader``: run as the grader's uid, which cannot write the repository
    (:meth:`~trace_envs.swe.sandbox.DockerSandbox.run_as_grader`)."""
    t0 = time.monotonic()
    harness = sandbox.harness
    command = repo.pytest_command(tests, harness, sandbox.workdir) + " -rfE"
    runner = sandbox.run_as_grader if as_grader else sandbox.run
    result = runner(command, timeout=timeout, max_output=max_output, also_read=harness.report)
    try:
        data = json.loads(result.extra or "")
    except json.JSONDecodeError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    return TestRun(statuses=dict(data.get("tests", {})), output=result.output, seconds=time.monotonic() - t0,
                   exit_code=result.exit_code, collect_errors=list(data.get("collect_errors", [])),
                   process_seconds=result.inner_seconds)


_GIT_INIT = ("git init -q --template= && mkdir -p .git/info && printf '__pycache__/\\n*.pyc\\n' > .git/info/exclude && "
             "git add -A --force")


def stage_clean_tree(sandbox) -> None:
    """Index the clean tree in a fresh sandbox ahead of time (the warm pool does this in the background),
    so that :func:`prepare_sandbox` only hashes the files the bug changes. Nothing is committed."""
    res = sandbox.run(f"rm -rf .git && {_GIT_INIT}", timeout=60)
    if res.exit_code != 0:
        from .sandbox import SandboxError

        raise SandboxError(f"could not index the repository in the sandbox: {res.output[-500:]}")
    sandbox.git_staged = True


def prepare_sandbox(sandbox, files: dict[str, str]) -> None:
    """Write the instance's bugged files and make the tree a one-commit git repository (no history of the fix).

    On a sandbox staged by :func:`stage_clean_tree`, the clean versions of the changed files were hashed into
    ``.git/objects``; they are deleted after the commit (unless another file has the same content), so the
    repository holds nothing an agent could recover the fix from.
    """
    from .sandbox import SandboxError, SandboxWriteError

    try:
        sandbox.write_files(files)
    except SandboxWriteError as exc:
        raise SandboxError(str(exc)) from exc
    commit = f"git {GIT_IDENTITY} commit -qm base"
    if getattr(sandbox, "git_staged", False):
        paths = " ".join(shlex.quote(p) for p in sorted(files))
        script = (f"__clean=$(git ls-files -s -- {paths} | cut -d' ' -f2) && git add -A --force && {commit} && "
                  "__kept=$(git ls-tree -r HEAD | cut -d' ' -f3 | cut -f1) && "
                  "for o in $__clean; do case \"$__kept\" in *$o*) ;; *) rm -f .git/objects/${o:0:2}/${o:2} ;; esac; "
                  "done")
        sandbox.git_staged = False
    else:
        script = f"rm -rf .git && {_GIT_INIT} && {commit} && git rev-parse HEAD"
    res = sandbox.run(script, timeout=60)
    if res.exit_code != 0:
        raise SandboxError(f"could not prepare the repository in the sandbox: {res.output[-500:]}")


def protection_rules(repo: Repo) -> dict:
    """What the agent's edits may not change for the reward — test paths, test-looking files, test and
    packaging configuration, import hooks — in the form :mod:`trace_envs.swe.sandbox_tree` reads."""
    from .repos import TEST_DIR, TEST_FILE

    return {"paths": list(repo.spec.test_paths) + repo.test_files, "names": sorted(PROTECTED_NAMES),
            "suffixes": [".pth"], "patterns": [TEST_FILE.pattern, TEST_DIR.pattern]}


@dataclass
class Submission:
    """The agent's changes as the grader will test them (from :func:`restore_for_grading`)."""

    changed: dict[str, str]
    deleted: list[str]
    large: list[str]
    dropped: list[str]

    @property
    def empty(self) -> bool:
        return not (self.changed or self.deleted or self.large)

    def patch(self, expected: dict[str, str]) -> str:
        """A unified diff from the expected (bugged) tree, for the reward breakdown."""
        out = [unified_diff(p, expected.get(p, ""), text) for p, text in sorted(self.changed.items())]
        out += [unified_diff(p, expected.get(p, ""), "") for p in self.deleted]
        out += [f"Binary or large file {p} changed\n" for p in self.large]
        return "".join(out)


def _tree_tool(sandbox, action: str, request: dict, timeout: float = 120.0):
    h = sandbox.harness
    payload = json.dumps({"root": sandbox.workdir, "clean": h.clean, "wipe": list(h.wipe), **request})
    eof = f"__TRACE_REQ_{hashlib.sha256(payload.encode()).hexdigest()[:12]}"
    # -I: no PYTHONPATH (the image sets one, into the repository, for the agent's own commands), no user site,
    # no script directory; -S: no site at all. The tool needs only the standard library.
    res = sandbox.run(f"{shlex.quote(h.python)} -I -S {shlex.quote(h.tree_tool)} {action} <<'{eof}'\n{payload}\n{eof}",
                      timeout=timeout, max_output=50_000_000)
    try:
        return res, json.loads(res.output) if res.exit_code == 0 else None
    except json.JSONDecodeError:
        return res, None


def restore_for_grading(sandbox, repo: Repo, expected: dict[str, str]) -> Submission:
    """Make the sandbox's tree trustworthy for grading and return the agent's changes.

    Every process of the agent is ended first, so nothing can undo what follows. Then, without trusting
    anything in the tree (no git: its hooks, filters and ``HEAD`` are the agent's), every protected file is
    restored from the clean tree baked into the image, caches, foreign symlinks and special files are
    removed and ``/tmp`` is emptied (:mod:`trace_envs.swe.sandbox_tree`). ``expected``: the bugged
    versions of the files the instance's bug changes. Raises SandboxError when the tree cannot be restored.
    """
    from .sandbox import SandboxError

    sandbox.kill_user_processes()
    hashes = {p: hashlib.sha256(t.encode("utf-8")).hexdigest() for p, t in expected.items()}
    res, data = _tree_tool(sandbox, "grade", {"protected": protection_rules(repo), "expected": hashes})
    if data is None:
        raise SandboxError(f"could not restore the repository for grading: {res.output[-500:]}")
    return Submission(dict(data["changed"]), list(data["deleted"]), list(data["large"]), list(data["dropped"]))


def reset_tree(sandbox, files: dict[str, str]) -> None:
    """Make the sandbox's tree the clean tree again, then write ``files`` (e.g. the bugged ones)."""
    from .sandbox import SandboxError

    res, data = _tree_tool(sandbox, "reset", {})
    if data is None:
        raise SandboxError(f"could not reset the sandbox's tree: {res.output[-300:]}")
    sandbox.write_files(files)


#: Names a library fix has no reason to add, but code that reaches into the test process does: pytest's
#: machinery, the report plugin or its file, exit hooks, the import system, other processes.
HARNESS_TOKENS = ("pytest", "pluggy", "trace_pytest_report", "TRACE_PYTEST_REPORT", "/run/trace", "atexit",
                  "sys.modules", "builtins", "__import__", "importlib", "sys.path", "_exit", "settrace",
                  "setprofile", "_getframe", "gc.get_", "ctypes", "subprocess", "fork", "os.system", "signal",
                  "os.environ", "exec(")


def harness_tampering(submission: Submission, clean: dict[str, str], bugged: dict[str, str]) -> dict[str, list[str]]:
    """``{file: [token, ...]}`` for each changed source file that mentions a :data:`HARNESS_TOKENS` name more
    often than both its clean and its bugged version do.

    The library's modules necessarily run inside the test process, so a change to them could patch pytest
    or rewrite the report from within; a repair has no use for these names (the gold patch, which
    restores the clean file, never trips this), and a submission that adds one is graded 0.0. A
    heuristic second line behind the structural defences (restored tests, a separate uid, a launcher
    the repository cannot shadow), not a proof."""
    found: dict[str, list[str]] = {}
    for path, text in submission.changed.items():
        if not path.endswith(".py"):
            continue
        before = [clean.get(path, ""), bugged.get(path, clean.get(path, ""))]
        hits = [t for t in HARNESS_TOKENS if text.count(t) > max(b.count(t) for b in before)]
        if hits:
            found[path] = hits
    return found


def evaluate_in_sandbox(sandbox, repo: Repo, instance: dict, timeout: float = 300.0,
                        skip_if_unchanged: bool = True, tamper_check: bool = True) -> tuple[float, dict]:
    """The reward of the sandbox's current tree: 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passes
    once the agent's processes are gone and tests, conftests and configuration are restored from the
    instance (only the agent's changes to non-test files are kept: :func:`restore_for_grading`), run as
    a uid that cannot write the repository.

    ``tamper_check=False`` turns off :func:`harness_tampering` (the adversarial tests do, to show what
    the structural defences hold on their own)."""
    bugged = apply_patch(repo.files, instance["patch"]) if instance.get("patch") else {}
    submission = restore_for_grading(sandbox, repo, bugged)
    breakdown: dict = {"model_patch": submission.patch({**repo.files, **bugged})[:50_000]}
    if submission.dropped:
        breakdown["dropped"] = submission.dropped[:50]
    if skip_if_unchanged and submission.empty:
        return 0.0, {**breakdown, "reason": "no_changes", "FAIL_TO_PASS": {}, "PASS_TO_PASS": {}}
    tampering = harness_tampering(submission, repo.files, bugged) if tamper_check else {}
    if tampering:
        return 0.0, {**breakdown, "reason": "harness_tampering", "detail": tampering, "FAIL_TO_PASS": {},
                     "PASS_TO_PASS": {}}
    run = run_tests(sandbox, repo, timeout=timeout, as_grader=True)
    f2p = {t: run.statuses.get(t, "missing") for t in instance["FAIL_TO_PASS"]}
    p2p = {t: run.statuses.get(t, "missing") for t in instance["PASS_TO_PASS"]}
    ok_f2p = sum(s == "passed" for s in f2p.values())
    ok_p2p = sum(s == "passed" for s in p2p.values())
    breakdown.update({"FAIL_TO_PASS": f2p, "PASS_TO_PASS": p2p, "f2p_passed": f"{ok_f2p}/{len(f2p)}",
                      "p2p_passed": f"{ok_p2p}/{len(p2p)}", "tests_seconds": round(run.seconds, 3)})
    reward = float(ok_f2p == len(f2p) and ok_p2p == len(p2p))
    return reward, breakdown


# ------------------------------------------------------------------------------------------ issue text

def failure_messages(output: str, tests: list[str]) -> dict[str, str]:
    """``{test: error message}`` from the short summary at the end of pytest's output (``-rfE``).

    Lines read ``FAILED <node id> - <message>``; a parametrized id may contain spaces (and " - "), so the
    id is matched against the known ``tests``, longest first, rather than split at a space."""
    by_length = sorted(tests, key=len, reverse=True)
    messages: dict[str, str] = {}
    for line in output.splitlines():
        line = line.strip()
        kind, _, rest = line.partition(" ")
        if kind not in ("FAILED", "ERROR"):
            continue
        for test in by_length:
            if rest == test or rest.startswith(test + " - "):
                messages.setdefault(test, rest[len(test) + 3:].strip())
                break
    return messages


def _count(n: int, noun: str, verb: str) -> str:
    """``1 test fails`` / ``3 tests fail``."""
    return f"{n} {noun}{'' if n == 1 else 's'} {verb + 's' if n == 1 else verb}"


def problem_statement(repo: Repo, f2p: list[str], bug_output: str, max_tests: int = 3) -> str:
    """An issue from the failing behaviour: which tests fail and how — never where the bug is or how to fix it."""
    messages = failure_messages(bug_output, f2p)
    shown = f2p[:max_tests]
    lines = [f"Tests in `{repo.spec.key}` started failing",
             "",
             f"After a recent change, {_count(len(f2p), 'test', 'fail')}"
             f"{'' if len(f2p) <= max_tests else f' (showing {max_tests})'}:", ""]
    for test in shown:
        msg = messages.get(test, "")
        lines.append(f"- `{test}`" + (f": `{msg[:300]}`" if msg else ""))
    lines += ["", "The rest of the test suite still passes. Please find the cause in the library's code and fix it "
              "so that these tests pass again, without changing the tests."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ validation

@dataclass
class YieldStats:
    """Numbers for the yield table (bench/swe_yield.py)."""

    repo: str
    candidates: int = 0
    valid: int = 0
    f2p_counts: list[int] = field(default_factory=list)
    p2p_counts: list[int] = field(default_factory=list)
    validation_seconds: list[float] = field(default_factory=list)
    flaky: int = 0
    combined: int = 0


def _instance_id(repo: Repo, mutations: list[Mutation]) -> str:
    digest = hashlib.sha256("".join(m.patch for m in mutations).encode()).hexdigest()[:8]
    family = "+".join(m.site.family for m in mutations)
    return f"{repo.spec.key}.{family}__{digest}"


def _progress_bar(enabled: bool, total: int, desc: str, unit: str):
    """A tqdm bar when ``enabled`` and tqdm is installed (the ``swe`` extra alone does not need it), else None."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit=unit)


def validate_candidates(repo: Repo, sandbox, mutations: list[Mutation], *, combine: int = 0, seed: int = 0,
                        timeout: float = 120.0, progress: bool = False, restart=None) -> tuple[list[dict], YieldStats]:
    """Validate candidate bugs in ``sandbox`` (holding the clean repository); return instances and stats.

    Args:
        repo: the clean repository.
        sandbox: a sandbox started from ``repo``'s image (its tree is restored after each candidate).
        mutations: candidates from :func:`sample_mutations`.
        combine: also build up to this many two-bug instances from validated bugs in different functions.
        seed: seed for picking combinations.
        timeout: per test-suite run.
        progress: show a progress bar.
        restart: ``() -> sandbox``: a fresh sandbox when a candidate kills the current one (a bug that
            exhausts memory, say); without it such a failure propagates.
    """
    from .sandbox import SandboxError, SandboxWriteError

    stats = YieldStats(repo.spec.key)
    clean1 = run_tests(sandbox, repo, timeout=timeout)
    clean2 = run_tests(sandbox, repo, timeout=timeout)
    if not any(s == "passed" for s in clean1.statuses.values()):
        raise RuntimeError(f"the clean test suite of {repo.spec.key} has no passing test:\n{clean1.output[-2000:]}")
    flaky = {t for t in set(clean1.statuses) | set(clean2.statuses) if clean1.statuses.get(t) != clean2.statuses.get(t)}
    stats.flaky = len(flaky)
    stable_pass = sorted(t for t, s in clean1.statuses.items() if s == "passed" and t not in flaky)
    image = getattr(sandbox, "image", "local")

    def check(muts: list[Mutation]) -> dict | None:
        files: dict[str, str] = {}
        for m in muts:
            base = files.get(m.site.file, repo.files[m.site.file])
            if len(muts) > 1:
                base = apply_patch({m.site.file: base}, m.patch)[m.site.file]
                files[m.site.file] = base
            else:
                files[m.site.file] = m.mutated
        nonlocal sandbox
        t0 = time.monotonic()
        try:
            sandbox.write_files(files)
            bug = run_tests(sandbox, repo, timeout=timeout)
            sandbox.write_files({p: repo.files[p] for p in files})
        except (SandboxError, SandboxWriteError):
            if restart is None:
                raise
            sandbox.close()
            sandbox = restart()
            stats.validation_seconds.append(time.monotonic() - t0)
            return None
        stats.validation_seconds.append(time.monotonic() - t0)
        f2p = [t for t in stable_pass if not bug.passed(t)]
        p2p = [t for t in stable_pass if bug.passed(t)]
        if not f2p or not p2p:
            return None
        patch = "".join(unified_diff(p, repo.files[p], files[p]) for p in sorted(files))
        gold = "".join(unified_diff(p, files[p], repo.files[p]) for p in sorted(files))
        return {
            "instance_id": _instance_id(repo, muts),
            "repo": repo.spec.key,
            "repo_source": repo.spec.source,
            "base_commit": repo.content_hash,
            "patch": patch,
            "gold_patch": gold,
            "FAIL_TO_PASS": f2p,
            "PASS_TO_PASS": p2p,
            "image_name": image,
            "problem_statement": problem_statement(repo, f2p, bug.output),
            "mutations": [m.to_json() for m in muts],
            "validation": {"flaky_excluded": sorted(flaky)[:50], "bug_seconds": round(bug.seconds, 3),
                           "clean_seconds": round(clean1.seconds, 3)},
        }

    bar = _progress_bar(progress, len(mutations), f"validate {repo.spec.key}", "bug")
    instances, valid_muts = [], []
    for m in mutations:
        stats.candidates += 1
        inst = check([m])
        if inst is not None:
            instances.append(inst)
            valid_muts.append(m)
            stats.valid += 1
            stats.f2p_counts.append(len(inst["FAIL_TO_PASS"]))
            stats.p2p_counts.append(len(inst["PASS_TO_PASS"]))
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    if combine and len(valid_muts) >= 2:
        import numpy as np

        rng = np.random.default_rng(seed)
        pairs = [(i, j) for i in range(len(valid_muts)) for j in range(i + 1, len(valid_muts))
                 if valid_muts[i].site.function != valid_muts[j].site.function]
        for k in rng.permutation(len(pairs))[: combine * 2]:
            if stats.combined >= combine:
                break
            i, j = pairs[int(k)]
            try:
                inst = check([valid_muts[i], valid_muts[j]])
            except ValueError:
                continue
            if inst is not None:
                instances.append(inst)
                stats.combined += 1
    return instances, stats


def generate_instances(repo: Repo, sandbox, n_candidates: int, seed: int = 0, combine: int = 0,
                       families: tuple[str, ...] = FAMILIES, progress: bool = False,
                       restart=None) -> tuple[list[dict], YieldStats]:
    """Sample ``n_candidates`` bugs from ``seed`` and validate them."""
    files = {p: repo.files[p] for p in repo.source_files}
    mutations = sample_mutations(files, seed, n_candidates, families)
    return validate_candidates(repo, sandbox, mutations, combine=combine, seed=seed, progress=progress,
                               restart=restart)


# ------------------------------------------------------------------------------------------ the instance store

def instance_dirs() -> list[Path]:
    """Where instances are read from: the package's shipped set, then the user's cache."""
    return [PACKAGED_INSTANCES, cache_dir() / "instances"]


def save_instances(instances: list[dict], repo_key: str, directory: Path | None = None) -> Path:
    """Merge ``instances`` into ``<dir>/<repo_key>.jsonl`` (by instance_id; sorted, one JSON object per line)."""
    directory = directory or cache_dir() / "instances"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{repo_key}.jsonl"
    existing = {i["instance_id"]: i for i in load_instance_file(path)} if path.exists() else {}
    for inst in instances:
        existing[inst["instance_id"]] = inst
    path.write_text("".join(json.dumps(existing[k], sort_keys=True) + "\n" for k in sorted(existing)))
    return path


def load_instance_file(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def load_instances(repo_keys: list[str], max_bugs: int | None = None, min_bugs: int = 1,
                   families: tuple[str, ...] | None = None, extra_dirs: list[Path] | None = None) -> list[dict]:
    """Validated instances of the given repositories, sorted by id (deterministic across machines)."""
    found: dict[str, dict] = {}
    for directory in list(extra_dirs or []) + instance_dirs():
        for key in repo_keys:
            path = Path(directory) / f"{key}.jsonl"
            if path.exists():
                for inst in load_instance_file(path):
                    found.setdefault(inst["instance_id"], inst)
    out = []
    for inst in found.values():
        n = len(inst["mutations"])
        if n < min_bugs or (max_bugs is not None and n > max_bugs):
            continue
        if families is not None and any(m["family"] not in families for m in inst["mutations"]):
            continue
        out.append(inst)
    return sorted(out, key=lambda i: i["instance_id"])


# ------------------------------------------------------------------------------------------ re-checking shipped instances

#: The reference submissions every shipped instance is graded with, and the reward each must get.
REFERENCE_CHECKS = {"gold": 1.0, "empty": 0.0, "delete_tests": 0.0, "edit_tests": 0.0}


def check_instance(sandbox, repo: Repo, instance: dict, timeout: float = 300.0,
                   refresh_issue: bool = False) -> dict[str, float]:
    """Grade the reference submissions of one instance with the environment's grader; ``{check: reward}``.

    ``gold`` applies the reverse of the bug patch; ``empty`` changes nothing (graded for real, no
    shortcut); ``delete_tests`` removes the failing tests' files; ``edit_tests`` makes each failing test
    return before its assertions. ``sandbox`` must hold the clean repository (a fresh container of the
    repository's image); it is left holding the clean repository again (without the git history).
    ``refresh_issue``: also rewrite ``instance["problem_statement"]`` from a run of the bugged tree.
    """
    from .agents import neutered_tests

    bugged = apply_patch(repo.files, instance["patch"])
    test_files = sorted({t.partition("::")[0] for t in instance["FAIL_TO_PASS"]})
    prepare_sandbox(sandbox, bugged)
    rewards = {}
    if refresh_issue:
        bug = run_tests(sandbox, repo, timeout=timeout)
        instance["problem_statement"] = problem_statement(repo, list(instance["FAIL_TO_PASS"]), bug.output)
    try:
        for check in REFERENCE_CHECKS:
            if check == "gold":
                sandbox.write_files({p: repo.files[p] for p in bugged})
            elif check == "delete_tests":
                sandbox.run("rm -f -- " + " ".join(shlex.quote(p) for p in test_files), timeout=30)
            elif check == "edit_tests":
                sandbox.write_files(neutered_tests(repo.files, instance["FAIL_TO_PASS"]))
            reward, _ = evaluate_in_sandbox(sandbox, repo, instance, timeout=timeout, skip_if_unchanged=False)
            rewards[check] = reward
            reset_tree(sandbox, bugged)
    finally:
        reset_tree(sandbox, {})
    return rewards


def recheck_instance_file(path: Path, sandbox_factory, load_repo, timeout: float = 300.0, progress: bool = False,
                          drop_failing: bool = False,
                          refresh_issues: bool = False) -> tuple[list[dict], list[tuple[str, dict]]]:
    """Re-grade every instance of one ``<repo>.jsonl`` file; returns (passing instances, [(id, rewards)] failing).

    With ``drop_failing`` the file is rewritten without the instances that failed a check; with
    ``refresh_issues`` it is rewritten with issue texts rebuilt from a run of each bugged tree.
    """
    from .sandbox import SandboxError

    instances = load_instance_file(path)
    by_repo: dict[str, list[dict]] = {}
    for inst in instances:
        by_repo.setdefault(inst["repo"], []).append(inst)
    good, bad = [], []
    bar = _progress_bar(progress, len(instances), f"recheck {path.stem}", "inst")
    for key, insts in by_repo.items():
        repo = load_repo(key)
        box = sandbox_factory(repo)
        try:
            for inst in insts:
                try:
                    rewards = check_instance(box, repo, inst, timeout=timeout, refresh_issue=refresh_issues)
                except SandboxError as exc:
                    box.close()
                    box = sandbox_factory(repo)
                    rewards = {"sandbox_error": str(exc)[:200]}
                ok = all(rewards.get(c) == want for c, want in REFERENCE_CHECKS.items())
                (good.append(inst) if ok else bad.append((inst["instance_id"], rewards)))
                if bar:
                    bar.update(1)
        finally:
            box.close()
    if bar:
        bar.close()
    if (drop_failing and bad) or refresh_issues:
        keep = good if drop_failing else instances
        path.write_text("".join(json.dumps(i, sort_keys=True) + "\n" for i in sorted(keep, key=lambda i: i["instance_id"])))
    return good, bad
