"""Build the ``trace serve`` Docker image with the project's own image builder (no registry needed).

The image is ``FROM`` the Debian base image of :mod:`trace_envs.swe.images` (debootstrap + ``docker
import``, Python 3.11), with the project's sources (``trace_envs`` only: the server needs nothing else)
and its runtime dependencies plus the ``serve`` extra, installed on the host for the image's Python
(``pip install --target``: the build itself needs no network). The ``Dockerfile`` at the repository root
is the recipe; its ``HEALTHCHECK`` polls ``/health``. The tag carries a hash of what went in, so an
unchanged build is skipped.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
REPO = "trace-serve"


def requirements() -> list[str]:
    """The runtime dependencies of ``trace_envs`` and the ``serve`` extra, from ``pyproject.toml``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project["dependencies"]) + list(project["optional-dependencies"]["serve"])


def _sources_hash() -> str:
    h = hashlib.sha256()
    for path in sorted((ROOT / "trace_envs").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    h.update((ROOT / "Dockerfile").read_bytes())
    h.update(json.dumps(requirements()).encode())
    return h.hexdigest()[:12]


def image_tag() -> str:
    return f"{REPO}:{_sources_hash()}"


def build_serve_image(force: bool = False, from_registry: str | None = None, verbose: bool = True) -> str:
    """Build (or reuse) the server image; returns its tag. Needs a running Docker engine."""
    from trace_envs.swe.images import IMAGE_PYTHON, LABEL, build_base_image, docker_client, image_exists

    client = docker_client()
    tag = image_tag()
    if image_exists(client, tag) and not force:
        return tag
    base = build_base_image(from_registry=from_registry, verbose=verbose)
    with tempfile.TemporaryDirectory(prefix="trace-serve-ctx-") as ctx:
        ctx = Path(ctx)
        shutil.copytree(ROOT / "trace_envs", ctx / "src" / "trace_envs",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy(ROOT / "Dockerfile", ctx / "Dockerfile")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(ctx / "deps"),
               "--python-version", IMAGE_PYTHON, "--implementation", "cp", "--platform", "manylinux2014_x86_64",
               "--only-binary=:all:", *requirements()]
        if verbose:
            print(f"installing the server's dependencies for Python {IMAGE_PYTHON} (on the host)...")
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"installing the server's dependencies failed:\n{proc.stderr[-3000:]}")
        if verbose:
            print(f"docker build {tag} (FROM {base})")
        client.images.build(path=str(ctx), tag=tag, rm=True, forcerm=True, buildargs={"BASE_IMAGE": base},
                            labels={LABEL: "serve"})
    return tag
