"""Repositories the SWE environments inject bugs into.

A :class:`RepoSpec` names a repository and how to test it. Three sources:

* ``pypi:NAME==VERSION`` — a pure-Python library's sdist from PyPI (fetched with ``pip download``,
  so the machine's index configuration applies), its tests found in the sdist, its dependencies
  read from ``PKG-INFO``;
* ``git:/path/to/repo[@REV]`` — any local git repository (read with gitpython at a revision);
* ``dir:/path`` — a plain directory (the small repository under ``tests/fixtures`` uses this).

:func:`materialize` puts the clean tree in the cache and returns a :class:`Repo`: its files, the
test files, the source files mutations may touch and a content hash (the instance's
``base_commit``). Specs of added repositories are stored as JSON in the cache
(``trace swe add-repo``); :data:`DEFAULT_REPOS` is the built-in set of fast libraries.

Adding a library, end to end (download, detect tests and layout, build its image, run the clean suite)::

    $ trace swe add-repo pypi:toolz==0.12.1
    toolz-0.12.1: tests ['toolz/tests'], PYTHONPATH ['.'], requirements none
    clean suite: 180 passed, 0 failed/error, 7.9s
    added toolz-0.12.1; next: trace swe validate toolz-0.12.1

``--tests PATH`` / ``--python-path DIR`` / ``--requirement REQ`` override what is detected (test
dependencies are read from the sdist's ``test``/``tests``/``testing`` extras, pyproject dependency groups and
requirement files: :func:`test_requirements`); ``--env NAME=VALUE`` and ``--pytest-arg ARG`` set the clean
suite's environment and pytest arguments (a pure-Python switch, a deselected slow test);
``git:/path/to/repo@REV`` and ``dir:/path`` work the same way.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .images import cache_dir

TEST_FILE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py)$")
TEST_DIR = re.compile(r"(^|/)(tests?|testing)/")
#: Files an agent may never change for the reward: test configuration and import hooks.
PROTECTED_NAMES = {"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "setup.py",
                   "sitecustomize.py", "usercustomize.py", ".pytest.ini"}
SKIP_DIRS = {"docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "tools", ".git", "build",
             "dist", "__pycache__"}


@dataclass(frozen=True)
class RepoSpec:
    """How to fetch and test one repository.

    Attributes:
        key: short unique name, used in instance ids and image tags (e.g. "cachetools-5.5.2").
        source: ``pypi:NAME==VERSION``, ``git:/path[@rev]`` or ``dir:/path``.
        test_paths: what pytest collects, relative to the root (default: found automatically).
        python_path: directories put on PYTHONPATH so the tests import the package ("src" or ".").
        requirements: PyPI requirements installed in the repo's image layer.
        pytest_args: extra pytest arguments (e.g. ``--deselect tests/test_x.py::test_slow``).
        sha256: the sdist's hash (checked when set).
        env: ``NAME=VALUE`` environment variables of the test process (e.g. a pure-Python switch).
    """

    key: str
    source: str
    test_paths: tuple[str, ...] = ()
    python_path: tuple[str, ...] = (".",)
    requirements: tuple[str, ...] = ()
    pytest_args: tuple[str, ...] = ()
    sha256: str = ""
    env: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RepoSpec":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


#: The default libraries: pure Python, tests shipped in the sdist, suites that run in about a second.
DEFAULT_REPOS: dict[str, RepoSpec] = {
    spec.key: spec for spec in [
        RepoSpec("cachetools-5.5.2", "pypi:cachetools==5.5.2", ("tests",), ("src",)),
        RepoSpec("inflection-0.5.1", "pypi:inflection==0.5.1", ("test_inflection.py",), (".",)),
        RepoSpec("isodate-0.7.2", "pypi:isodate==0.7.2", ("tests",), ("src",)),
        RepoSpec("parse-1.20.2", "pypi:parse==1.20.2", ("tests",), (".",)),
        RepoSpec("pathspec-0.12.1", "pypi:pathspec==0.12.1", ("tests",), (".",)),
        RepoSpec("idna-3.7", "pypi:idna==3.7", ("tests",), (".",)),
        RepoSpec("jmespath-1.0.1", "pypi:jmespath==1.0.1", ("tests",), (".",)),
        RepoSpec("six-1.16.0", "pypi:six==1.16.0", ("test_six.py",), (".",)),
    ]
}


@dataclass
class Repo:
    """A materialized clean repository."""

    spec: RepoSpec
    root: Path
    files: dict[str, str] = field(default_factory=dict)  # every text file, by relative path

    @property
    def content_hash(self) -> str:
        h = hashlib.sha256()
        for path in sorted(self.files):
            h.update(path.encode() + b"\0" + self.files[path].encode("utf-8") + b"\0")
        return h.hexdigest()[:16]

    def is_test_file(self, path: str) -> bool:
        return bool(TEST_FILE.search(path) or TEST_DIR.search(path))

    @property
    def test_files(self) -> list[str]:
        return sorted(p for p in self.files if p.endswith(".py") and self.is_test_file(p))

    @property
    def source_files(self) -> list[str]:
        """Python files mutations may touch: not tests, not packaging, not docs."""
        out = []
        for p in sorted(self.files):
            parts = p.split("/")
            if not p.endswith(".py") or self.is_test_file(p) or parts[-1] in PROTECTED_NAMES:
                continue
            if any(part in SKIP_DIRS for part in parts[:-1]):
                continue
            out.append(p)
        return out

    def image(self, verbose: bool = False) -> str:
        """Build (or reuse) this repository's sandbox image; returns its tag."""
        from .images import build_repo_image

        return build_repo_image(self.spec.key, self.root, self.content_hash, list(self.spec.requirements),
                                list(self.spec.python_path), verbose=verbose)

    def pytest_command(self, tests: list[str] | None = None, harness=None, root: str = "/testbed") -> str:
        """The shell command that runs the tests in a sandbox and leaves the status report in ``harness.report``.

        The same command serves validation, the agent's ``run_tests`` and the grader. It starts from an empty
        environment (``env -i``: nothing the agent exported, no ``PYTHONPATH``/``PYTEST_ADDOPTS``/
        ``PYTEST_PLUGINS``) and runs pytest through the launcher (:mod:`trace_envs.swe.sandbox_pytest`), so
        that no file in the repository can stand in for the report plugin, pytest or the standard library.
        The repository's own (restored) conftests and ini file apply, as they did when the instance was
        validated; ``--rootdir``/``--confcutdir`` pin the search to the repository, ``addopts`` is ignored.
        """
        import shlex

        from .sandbox import DOCKER_HARNESS

        harness = harness or DOCKER_HARNESS
        targets = tests if tests else list(self.spec.test_paths)
        env = {"PATH": harness.path, "HOME": "/tmp", "LANG": "C.UTF-8", "COLUMNS": "240", "PYTHONHASHSEED": "0",
               "PYTHONDONTWRITEBYTECODE": "1",
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "TRACE_PYTEST_REPORT": harness.report}
        for item in self.spec.env:
            name, _, value = item.partition("=")
            env[name] = value
        launcher = [harness.python, "-s", "-S", "-P", harness.pytest_runner, "--plugin", harness.plugin]
        for directory in harness.trusted:
            launcher += ["--trusted", directory]
        for directory in self.spec.python_path:
            launcher += ["--path", f"{root}/{directory}".rstrip("/.") or root]
        args = ["--", "-q", "--tb=short", "-o", "addopts=", f"--rootdir={root}", f"--confcutdir={root}",
                *self.spec.pytest_args, *targets]
        return (f": >{shlex.quote(harness.report)}; env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
                + " " + " ".join(shlex.quote(a) for a in launcher + args))


def _read_tree(root: Path) -> dict[str, str]:
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or any(part in (".git", "__pycache__") for part in rel.split("/")):
            continue
        if rel.endswith((".pyc", ".so")):
            continue
        try:
            files[rel] = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
    return files


def _pypi_fetch(name: str, version: str, dest: Path, sha256: str = "") -> Path:
    with tempfile.TemporaryDirectory(prefix="trace-sdist-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               f"{name}=={version}", "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        archives = [p for p in Path(tmp).iterdir() if p.suffix in (".gz", ".zip", ".bz2")]
        if proc.returncode != 0 or not archives:
            raise RuntimeError(f"could not download the sdist of {name}=={version} from PyPI:\n{proc.stderr[-1500:]}")
        archive = archives[0]
        if sha256 and hashlib.sha256(archive.read_bytes()).hexdigest() != sha256:
            raise RuntimeError(f"the sdist of {name}=={version} does not match its recorded sha256")
        unpack = Path(tmp) / "unpack"
        if archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(unpack)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(unpack, filter="data")
        tops = list(unpack.iterdir())
        top = tops[0] if len(tops) == 1 and tops[0].is_dir() else unpack
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(top, dest, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "*.pyc"))
    return dest


def _git_fetch(path: str, rev: str, dest: Path) -> Path:
    import git  # gitpython

    repo = git.Repo(path)
    commit = repo.commit(rev or "HEAD")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for blob in commit.tree.traverse():
        if blob.type != "blob":
            continue
        target = dest / blob.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob.data_stream.read())
    return dest


#: Marker environment of the image's Python (Debian bookworm's 3.11 on Linux).
_IMAGE_MARKERS = {"python_version": "3.11", "python_full_version": "3.11.2", "sys_platform": "linux",
                  "platform_system": "Linux", "implementation_name": "cpython", "os_name": "posix",
                  "platform_machine": "x86_64", "platform_python_implementation": "CPython"}
#: Extras and dependency groups that hold what a test suite needs.
TEST_EXTRAS = ("test", "tests", "testing")
#: Requirement files that list test dependencies, in the order they are tried.
TEST_REQUIREMENT_FILES = ("requirements-test.txt", "requirements_test.txt", "test-requirements.txt",
                          "test_requirements.txt", "requirements-tests.txt", "requirements/test.txt",
                          "requirements/tests.txt", "tests/requirements.txt")
#: Test tooling the sandbox provides itself or that the clean suite does not need (the image's pytest is
#: Debian's; another one in the dependencies would be ignored anyway, see sandbox_pytest).
NOT_INSTALLED = {"pytest", "pytest-cov", "coverage", "pytest-xdist", "pytest-runner", "tox", "nox", "flake8", "mypy",
                 "black", "ruff", "isort", "pre-commit", "sphinx", "twine", "build", "wheel", "setuptools", "pip",
                 "pytest-flake8", "pytest-mypy", "pytest-black", "pytest-sugar", "codecov", "pylint"}


def _requirement_for_image(text: str, extra: str = "") -> str | None:
    """``text`` without its marker if the marker holds for the image's Python (and ``extra``), else None."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        parsed = Requirement(text.strip())
    except InvalidRequirement:
        return None
    if parsed.marker is not None and not parsed.marker.evaluate({**_IMAGE_MARKERS, "extra": extra}):
        return None
    if canonicalize_name(parsed.name) in NOT_INSTALLED:
        return None
    parsed.marker = None
    return str(parsed)


def requirements_from_pkg_info(root: Path) -> list[str]:
    """Runtime dependencies declared in an sdist's PKG-INFO (markers evaluated for the image's Python)."""
    pkg_info = root / "PKG-INFO"
    if not pkg_info.exists():
        return []
    meta = email.parser.Parser().parsestr(pkg_info.read_text(encoding="utf-8", errors="replace"))
    out = []
    for req in meta.get_all("Requires-Dist") or []:
        if "extra" in req.partition(";")[2]:
            continue  # an optional extra, not a runtime dependency
        parsed = _requirement_for_image(req)
        if parsed:
            out.append(parsed)
    return out


def test_requirements(root: Path) -> dict[str, list[str]]:
    """What the sdist declares its tests need, by where it was found: the ``test``/``tests``/``testing``
    extras of PKG-INFO and pyproject.toml, pyproject's dependency groups of those names, and the usual
    requirement files. Test tooling the sandbox brings (:data:`NOT_INSTALLED`) is left out."""
    import tomllib

    found: dict[str, list[str]] = {}

    def add(source: str, reqs, extra: str = "") -> None:
        for req in reqs:
            if isinstance(req, str):
                parsed = _requirement_for_image(req, extra)
                if parsed and parsed not in sum(found.values(), []):
                    found.setdefault(source, []).append(parsed)

    pkg_info = root / "PKG-INFO"
    if pkg_info.exists():
        meta = email.parser.Parser().parsestr(pkg_info.read_text(encoding="utf-8", errors="replace"))
        extras = [e for e in (meta.get_all("Provides-Extra") or []) if e.lower() in TEST_EXTRAS]
        for extra in extras:
            add(f"PKG-INFO extra [{extra}]", [r for r in meta.get_all("Requires-Dist") or []
                                               if "extra" in r.partition(";")[2]], extra)
    pyproject = root / "pyproject.toml"
    if pyproject.exists():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            data = {}
        for extra, reqs in (data.get("project", {}).get("optional-dependencies") or {}).items():
            if extra.lower() in TEST_EXTRAS:
                add(f"pyproject optional-dependencies [{extra}]", reqs)
        for group, reqs in (data.get("dependency-groups") or {}).items():
            if group.lower() in TEST_EXTRAS:
                add(f"pyproject dependency-groups [{group}]", reqs)
    for name in TEST_REQUIREMENT_FILES:
        path = root / name
        if path.is_file():
            lines = [ln.split("#")[0].strip() for ln in path.read_text(encoding="utf-8", errors="replace").splitlines()]
            add(name, [ln for ln in lines if ln and not ln.startswith("-")])
    return found


def detect_layout(root: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(test_paths, python_path) guessed from a source tree."""
    python_path = ("src",) if (root / "src").is_dir() else (".",)
    tests: list[str] = []
    for name in ("tests", "test", "testing"):
        if (root / name).is_dir():
            tests.append(name)
    if not tests:
        tests = sorted(p.relative_to(root).as_posix() for p in root.rglob("test*.py")
                       if "__pycache__" not in p.parts and TEST_FILE.search(p.relative_to(root).as_posix()))
        # collapse files inside one package tests directory
        dirs = sorted({Path(t).parent.as_posix() for t in tests if Path(t).parent.name in ("tests", "test")})
        if dirs:
            tests = dirs
    return tuple(tests), python_path


def parse_source(source: str) -> tuple[str, str, str]:
    """Split ``kind:rest`` and return (kind, target, revision_or_version)."""
    kind, _, rest = source.partition(":")
    if kind == "pypi":
        name, _, version = rest.partition("==")
        if not name or not version:
            raise ValueError(f"pin a version: pypi:NAME==VERSION, got {source!r}")
        return kind, name, version
    if kind == "git":
        path, _, rev = rest.partition("@")
        return kind, path, rev
    if kind == "dir":
        return kind, rest, ""
    raise ValueError(f"unknown repository source {source!r}; use pypi:NAME==VERSION, git:/path[@rev] or dir:/path")


def spec_for_source(source: str, key: str | None = None, **overrides) -> RepoSpec:
    """A spec for a new source, with test paths, python path and requirements detected from the tree."""
    kind, target, rev = parse_source(source)
    if key is None:
        key = f"{target}-{rev}" if kind == "pypi" else (Path(target).name + (f"-{rev[:8]}" if rev else ""))
    spec = RepoSpec(key=key, source=source)
    root = _fetch(spec)
    tests, pypath = detect_layout(root)
    requirements: list[str] = requirements_from_pkg_info(root) if kind == "pypi" else []
    for reqs in test_requirements(root).values():
        requirements += [r for r in reqs if r not in requirements]
    fields = {"test_paths": tests, "python_path": pypath, "requirements": tuple(requirements)}
    fields.update({k: tuple(v) if isinstance(v, list) else v for k, v in overrides.items() if v})
    return RepoSpec(key=key, source=source, **fields)


def _fetch(spec: RepoSpec) -> Path:
    kind, target, rev = parse_source(spec.source)
    dest = cache_dir() / "repos" / spec.key
    marker = dest / ".trace-source"
    if marker.exists() and marker.read_text() == spec.source and kind != "dir":
        return dest
    if kind == "pypi":
        _pypi_fetch(target, rev, dest, spec.sha256)
    elif kind == "git":
        _git_fetch(target, rev, dest)
    else:
        src = Path(target)
        if not src.is_dir():
            raise FileNotFoundError(f"no directory {src}")
        return src
    marker.write_text(spec.source)
    return dest


def materialize(spec: RepoSpec) -> Repo:
    """Fetch (or reuse from the cache) the clean tree of ``spec``."""
    root = _fetch(spec)
    files = _read_tree(root)
    files.pop(".trace-source", None)
    return Repo(spec=spec, root=root, files=files)


# ------------------------------------------------------------------------------------------ the repo store

def _store() -> Path:
    path = cache_dir() / "repos.json"
    return path


def known_repos() -> dict[str, RepoSpec]:
    """The default repositories plus those added with ``trace swe add-repo``."""
    out = dict(DEFAULT_REPOS)
    if _store().exists():
        for data in json.loads(_store().read_text()):
            spec = RepoSpec.from_json(data)
            out[spec.key] = spec
    return out


def save_repo(spec: RepoSpec) -> None:
    specs = {s.key: s for s in known_repos().values() if s.key not in DEFAULT_REPOS}
    specs[spec.key] = spec
    _store().write_text(json.dumps([s.to_json() for s in specs.values()], indent=1))


def get_repo_spec(key_or_source: str) -> RepoSpec:
    repos = known_repos()
    if key_or_source in repos:
        return repos[key_or_source]
    for spec in repos.values():
        if spec.source == key_or_source:
            return spec
    if ":" in key_or_source:
        return spec_for_source(key_or_source)
    raise KeyError(f"unknown repository {key_or_source!r}; known: {', '.join(sorted(repos))}. "
                   "Add one with `trace swe add-repo pypi:NAME==VERSION` (or git:/path, dir:/path)")
