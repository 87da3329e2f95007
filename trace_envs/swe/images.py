"""Sandbox images for the SWE environments: one base image, one layer per repository.

No image registry is reachable on the machines this project targets, so the
base image is built from a Debian root filesystem made by ``debootstrap`` and
loaded with ``docker import`` (docs/design.md, "Sandboxing"). When a registry *is* reachable,
``build_base_image(from_registry="python:3.11-slim")`` builds it from that image instead.

Each repository gets its own image on top of the base (SWE-smith: one image
per repo, not per instance): the clean source tree at ``/opt/trace/clean``
(root-owned; the sandbox copies it into its ``/testbed`` tmpfs at start, and the
grader restores tests and configuration from it), the repository's PyPI
dependencies installed *on the host* with ``pip install --target`` (containers
have no network) and copied in, and the grader's in-sandbox files (report
plugin, pytest launcher, tree restorer: :data:`HARNESS_FILES`). ``docker build`` of such a layer works offline because
its ``FROM`` is a local image.

Image tags carry a hash of their content, so a build is skipped when an image
with the same tag exists (CI caches the base image this way).

Builds are infrastructure, and fail like infrastructure (a download that comes back corrupt, a full disk),
so they are made safe to run from many processes at once:

* one build of an image at a time on a machine: a file lock per image under :func:`cache_dir`, taken
  before the build and followed by a second look for the image (whoever waited finds it built);
* a half-made root filesystem is removed before the next try, mounts included — a failed debootstrap
  leaves ``/proc`` mounted inside it, which ``rmtree`` cannot remove — and a removal that fails says so;
* a failed build raises :class:`ImageBuildError` with the path of its log, and the same error is raised at
  once for that image for the rest of the process, so an env whose image cannot be built fails every
  later episode in milliseconds instead of rerunning a 40-second build on each tool call
  (``force=True`` tries again).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)


class InfraError(RuntimeError):
    """The sandbox's infrastructure failed: no Docker engine answers, or an image cannot be built."""


class ImageBuildError(InfraError):
    """An image could not be built; ``log`` is the path of the build's log."""

    def __init__(self, message: str, log: Path | None = None):
        super().__init__(message + (f" (log: {log})" if log else ""))
        self.log = log


#: tag -> the error of a build of that image that failed in this process (raised again without rebuilding).
_FAILED_BUILDS: dict[str, ImageBuildError] = {}

#: Debian release and packages of the base image.
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-pytest", "git")
BASE_REPO = "trace-swe-base"
#: Python inside the base image (Debian bookworm ships 3.11); dependencies are installed for it.
IMAGE_PYTHON = "3.11"
LABEL = "org.trace.sandbox"
PLUGIN_FILE = Path(__file__).with_name("pytest_report.py")
#: Where a repository image keeps what the sandbox and grader use.
IMAGE_LAYOUT = {"clean": "/opt/trace/clean", "deps": "/opt/trace/deps",
                "plugin": "/opt/trace/lib/trace_pytest_report.py", "pytest_runner": "/opt/trace/bin/trace_pytest.py",
                "tree_tool": "/opt/trace/bin/trace_tree.py"}
#: The grader's files copied into each repository image: {source file: path in the image}.
HARNESS_FILES = {PLUGIN_FILE: IMAGE_LAYOUT["plugin"],
                 Path(__file__).with_name("sandbox_pytest.py"): IMAGE_LAYOUT["pytest_runner"],
                 Path(__file__).with_name("sandbox_tree.py"): IMAGE_LAYOUT["tree_tool"]}


def cache_dir() -> Path:
    """Where sdists, repositories, root filesystems and user instances are cached: ``$TRACE_SWE_CACHE``, else
    ``$TRACE_CACHE/swe`` (the project-wide cache), else ``~/.cache/trace/swe``. Downloads happen once."""
    explicit = os.environ.get("TRACE_SWE_CACHE")
    root = Path(explicit) if explicit else Path(os.environ.get("TRACE_CACHE", Path.home() / ".cache" / "trace")) / "swe"
    root.mkdir(parents=True, exist_ok=True)
    return root


def docker_client():
    """A docker SDK client, with an error that says what to do when no engine answers."""
    try:
        import docker
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the SWE sandbox needs the docker package: pip install 'trace-rl[swe]'") from exc
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as exc:
        raise InfraError(f"no Docker engine answers ({type(exc).__name__}: {exc}). Start one with "
                         "scripts/setup_docker.sh, or use sandbox='local' (no isolation)") from exc
    return client


def _debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (deb822 or one-line sources)."""
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
            if line.startswith("deb ") and "security" not in line:
                return [p for p in line.split() if p.startswith("http")][0]
    return "http://deb.debian.org/debian"


def base_image_tag() -> str:
    recipe = {"suite": BASE_SUITE, "packages": sorted(BASE_PACKAGES), "variant": "minbase", "v": 1}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{BASE_REPO}:{digest}"


def image_exists(client, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _file_stem(tag: str) -> str:
    """An image tag as a file name (its lock, its build log)."""
    return tag.replace(":", "-").replace("/", "-")


def _build_lock(tag: str):
    """The machine-wide lock of one image's build (a file lock: it also holds across processes)."""
    from filelock import FileLock

    locks = cache_dir() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return FileLock(str(locks / (_file_stem(tag) + ".lock")))


def _build_log(tag: str, text: str) -> Path:
    logs = cache_dir() / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    path = logs / (_file_stem(tag) + ".log")
    path.write_text(text, errors="replace")
    return path


def _failed(tag: str, message: str, log_text: str) -> ImageBuildError:
    """Record a failed build of ``tag`` (log on disk, error remembered for this process) and return its error."""
    error = ImageBuildError(message, _build_log(tag, log_text))
    _FAILED_BUILDS[tag] = error
    logger.error("%s", error)
    return error


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path`` (from /proc/self/mountinfo), deepest first."""
    root = os.path.realpath(path)
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) < 5:
            continue
        # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
        point = fields[4].encode().decode("unicode_escape")
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return sorted(found, key=len, reverse=True)


def remove_partial_tree(path: Path) -> None:
    """Remove a half-made root filesystem: unmount what a failed debootstrap left mounted in it (``/proc``,
    ``/sys``), then delete it; raise :class:`ImageBuildError` if anything is left."""
    for point in _mounts_under(path):
        proc = subprocess.run(["umount", "-l", point], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ImageBuildError(f"cannot unmount {point}, left mounted by an earlier failed build: "
                                  f"{proc.stderr.strip()}; unmount it as root and retry")
    if path.exists() or path.is_symlink():
        errors: list[str] = []
        shutil.rmtree(path, onerror=lambda _f, p, e: errors.append(f"{p}: {e[1]}"))
        if path.exists():
            raise ImageBuildError(f"cannot remove the partial build {path}: {'; '.join(errors[:3]) or 'unknown'}")


def build_base_image(force: bool = False, from_registry: str | None = None, verbose: bool = True) -> str:
    """Build the base image (python3, pytest, git) unless an image with its tag exists; return the tag.

    One build at a time per machine (a file lock); a build that failed earlier in this process raises its
    :class:`ImageBuildError` again at once unless ``force``.

    Args:
        force: rebuild even if the tag exists, or if a build failed earlier in this process.
        from_registry: build ``FROM`` this registry image (e.g. ``python:3.11-slim``) instead of debootstrap.
        verbose: print progress.
    """
    client = docker_client()
    tag = base_image_tag()
    if not force:
        if image_exists(client, tag):
            return tag
        if tag in _FAILED_BUILDS:
            raise _FAILED_BUILDS[tag]
    say = print if verbose else logger.info
    with _build_lock(tag):
        if image_exists(client, tag) and not force:  # built by whoever held the lock before us
            return tag
        _FAILED_BUILDS.pop(tag, None)
        _build_base_locked(client, tag, from_registry, say)
    return tag


def _build_base_locked(client, tag: str, from_registry: str | None, say) -> None:
    if from_registry:
        dockerfile = (f"FROM {from_registry}\nRUN (apt-get update && apt-get install -y --no-install-recommends "
                      f"git python3-pytest) || pip install pytest\n")
        try:
            client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, labels={LABEL: "base"})
        except Exception as exc:
            raise _failed(tag, f"building the base image from {from_registry} failed: {exc}", str(exc)) from exc
        return
    if shutil.which("debootstrap") is None:
        raise InfraError("building the base image needs debootstrap (apt-get install -y debootstrap; "
                         "scripts/setup_docker.sh installs it) or a reachable registry (--from-registry IMAGE)")
    rootfs = cache_dir() / f"rootfs-{BASE_SUITE}"
    done = rootfs / ".trace-complete"
    if not done.exists():
        tmp = cache_dir() / f"rootfs-{BASE_SUITE}.partial"
        remove_partial_tree(tmp)
        mirror = _debian_mirror()
        say(f"debootstrap {BASE_SUITE} from {mirror} (about 1.5-2 minutes)...")
        cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES), BASE_SUITE, str(tmp), mirror]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            log = f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
            debootstrap_log = tmp / "debootstrap" / "debootstrap.log"
            if debootstrap_log.exists():
                log += "\n--- debootstrap.log ---\n" + debootstrap_log.read_text(errors="replace")
            try:
                remove_partial_tree(tmp)  # the next try starts clean, whoever makes it
            except ImageBuildError as exc:
                log += f"\n{exc}"
            raise _failed(tag, f"debootstrap failed (exit {proc.returncode}): "
                               f"{(proc.stderr.strip() or proc.stdout.strip())[-300:]}", log)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (tmp / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        (tmp / ".trace-complete").write_text(tag)
        remove_partial_tree(rootfs)
        tmp.rename(rootfs)
    say(f"docker import {rootfs} -> {tag}")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--exclude=./.trace-complete", "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(["docker", "import", "--change", "ENV LANG=C.UTF-8", "--change", "CMD [\"/bin/bash\"]",
                          "-", tag], stdin=tar.stdout, capture_output=True, text=True)
    tar.stdout.close()
    tar.wait()
    if imp.returncode != 0:
        raise _failed(tag, f"docker import failed: {imp.stderr.strip()[-300:]}", imp.stdout + imp.stderr)


def install_dependencies(requirements: list[str], target: Path) -> None:
    """Install PyPI ``requirements`` for the image's Python into ``target`` (on the host: containers are offline)."""
    target.mkdir(parents=True, exist_ok=True)
    if not requirements:
        return
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(target),
           "--python-version", IMAGE_PYTHON, "--only-binary=:all:", "--implementation", "py",
           "--platform", "any", *requirements]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        # Some dependencies only ship platform wheels; retry for CPython on manylinux.
        cmd = [c for c in cmd if c not in ("--implementation", "py", "--platform", "any")]
        cmd[cmd.index("--target"):cmd.index("--target")] = ["--platform", "manylinux2014_x86_64", "--implementation", "cp"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"installing {requirements} for the sandbox failed:\n{proc.stderr[-3000:]}")


def repo_image_tag(repo_key: str, content_hash: str, requirements: list[str]) -> str:
    recipe = {"base": base_image_tag(), "content": content_hash, "deps": sorted(requirements),
              "harness": [hashlib.sha256(f.read_bytes()).hexdigest() for f in HARNESS_FILES], "v": 2}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in repo_key.lower())
    return f"trace-swe-repo-{safe}:{digest}"


def build_repo_image(repo_key: str, source_dir: Path, content_hash: str, requirements: list[str],
                     python_path: list[str], force: bool = False, verbose: bool = False) -> str:
    """Build (or reuse) the image of one repository: base + clean tree + dependencies + the grader's files.

    Locked and remembered like :func:`build_base_image`: one build of a tag at a time per machine, and a
    failed build raises its :class:`ImageBuildError` again at once in this process unless ``force``."""
    client = docker_client()
    tag = repo_image_tag(repo_key, content_hash, requirements)
    if not force:
        if image_exists(client, tag):
            return tag
        if tag in _FAILED_BUILDS:
            raise _FAILED_BUILDS[tag]
    base = base_image_tag()
    if not image_exists(client, base):
        build_base_image(verbose=verbose)
    with _build_lock(tag):
        if image_exists(client, tag) and not force:
            return tag
        _FAILED_BUILDS.pop(tag, None)
        try:
            _build_repo_locked(client, tag, base, repo_key, source_dir, requirements, python_path, verbose)
        except ImageBuildError:
            raise
        except Exception as exc:
            raise _failed(tag, f"building the image of {repo_key} failed: {type(exc).__name__}: "
                               f"{str(exc)[-300:]}", f"{type(exc).__name__}: {exc}") from exc
    return tag


def _build_repo_locked(client, tag: str, base: str, repo_key: str, source_dir: Path, requirements: list[str],
                       python_path: list[str], verbose: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="trace-swe-ctx-") as ctx:
        ctx = Path(ctx)
        shutil.copytree(source_dir, ctx / "testbed", ignore=shutil.ignore_patterns(".git", "__pycache__", "*.pyc"))
        install_dependencies(requirements, ctx / "deps")
        for source, target in HARNESS_FILES.items():
            (ctx / "harness" / target.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, ctx / "harness" / target.lstrip("/"))
        # PYTHONPATH is for the agent's own commands; the tests run through the launcher, which sets its own path.
        pypath = ["/opt/trace/deps"] + [f"/testbed/{p}".rstrip("/.") or "/testbed" for p in python_path]
        (ctx / "Dockerfile").write_text(
            f"FROM {base}\n"
            f"COPY testbed {IMAGE_LAYOUT['clean']}\n"
            f"COPY deps {IMAGE_LAYOUT['deps']}\n"
            "COPY harness/ /\n"
            f"RUN chmod -R a+rX /opt/trace && mkdir -p /testbed /run/trace\n"
            f"ENV PYTHONPATH={':'.join(pypath)} PYTHONDONTWRITEBYTECODE=1 HOME=/tmp\n"
            "WORKDIR /testbed\n")
        if verbose:
            print(f"docker build {tag}")
        client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True, labels={LABEL: "repo", "org.trace.repo": repo_key})
