"""Sandbox images for the SWE environments: one base image, one layer per repository.

No image registry is reachable on the machines this project targets, so the
base image is built from a Debian root filesystem made by ``debootstrap`` and
loaded with ``docker import`` (FACTS.md §4). When a registry *is* reachable,
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
        raise RuntimeError(f"no Docker engine answers ({type(exc).__name__}: {exc}). Start one with "
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


def build_base_image(force: bool = False, from_registry: str | None = None, verbose: bool = True) -> str:
    """Build the base image (python3, pytest, git) unless an image with its tag exists; return the tag.

    Args:
        force: rebuild even if the tag exists.
        from_registry: build ``FROM`` this registry image (e.g. ``python:3.11-slim``) instead of debootstrap.
        verbose: print progress.
    """
    client = docker_client()
    tag = base_image_tag()
    if image_exists(client, tag) and not force:
        return tag
    say = print if verbose else logger.info
    if from_registry:
        dockerfile = (f"FROM {from_registry}\nRUN (apt-get update && apt-get install -y --no-install-recommends "
                      f"git python3-pytest) || pip install pytest\n")
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, labels={LABEL: "base"})
        return tag
    if shutil.which("debootstrap") is None:
        raise RuntimeError("building the base image needs debootstrap (apt-get install -y debootstrap; "
                           "scripts/setup_docker.sh installs it) or a reachable registry (--from-registry IMAGE)")
    rootfs = cache_dir() / f"rootfs-{BASE_SUITE}"
    done = rootfs / ".trace-complete"
    if not done.exists():
        tmp = cache_dir() / f"rootfs-{BASE_SUITE}.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        mirror = _debian_mirror()
        say(f"debootstrap {BASE_SUITE} from {mirror} (about 1.5-2 minutes)...")
        cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES), BASE_SUITE, str(tmp), mirror]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"debootstrap failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for item in (tmp / junk).glob("*"):
                if item.is_file():
                    item.unlink()
        (tmp / ".trace-complete").write_text(tag)
        shutil.rmtree(rootfs, ignore_errors=True)
        tmp.rename(rootfs)
    say(f"docker import {rootfs} -> {tag}")
    tar = subprocess.Popen(["tar", "-C", str(rootfs), "--exclude=./.trace-complete", "-c", "."], stdout=subprocess.PIPE)
    imp = subprocess.run(["docker", "import", "--change", "ENV LANG=C.UTF-8", "--change", "CMD [\"/bin/bash\"]",
                          "-", tag], stdin=tar.stdout, capture_output=True, text=True)
    tar.stdout.close()
    tar.wait()
    if imp.returncode != 0:
        raise RuntimeError(f"docker import failed: {imp.stderr[-2000:]}")
    return tag


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
    """Build (or reuse) the image of one repository: base + clean tree + dependencies + the grader's files."""
    client = docker_client()
    tag = repo_image_tag(repo_key, content_hash, requirements)
    if image_exists(client, tag) and not force:
        return tag
    base = base_image_tag()
    if not image_exists(client, base):
        build_base_image(verbose=verbose)
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
    return tag
