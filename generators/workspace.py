"""The workspace a generator writes admitted envs into (docs/generate.md).

Layout::

    <workspace>/registry.yaml                         one entry per admitted env
    <workspace>/envs/<name>_v<N>.py                   the module
    <workspace>/envs/<name>_v<N>.admission.json / .md  its admission report

where ``<name>`` is ``<capability>_<target>`` (e.g. ``precondition_verification_tau_airline``) and the
env's id is ``gen/<name>-v<N>``: one name per (capability, target), and N counts its regenerations
(Gymnasium's own reading of ``-vN``: a higher version supersedes a lower one).

``registry.yaml`` is only ever appended to, under an exclusive lock (``registry.yaml.lock``), by
writing the whole new file to a temporary file and renaming it over the old one, so a reader sees
either the old or the new file and two generators never interleave. An existing id is never
overwritten: a regenerated env gets the next ``-vN``.
"""

from __future__ import annotations

import fcntl
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

#: Namespace of generated env ids (``gen/<name>-v<N>``).
NAMESPACE = "gen"
#: The workspace's quarantine (ids the use-time audit caught; :mod:`generators.audit`), beside registry.yaml.
QUARANTINE_FILE = "quarantine.json"


class WorkspaceError(RuntimeError):
    """The workspace cannot take the env (e.g. its id was taken meanwhile); the message says what to do."""


class Workspace:
    """A folder holding a workspace registry of generated envs."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root).resolve()
        self.registry = self.root / "registry.yaml"
        self.envs = self.root / "envs"

    def init(self) -> "Workspace":
        self.envs.mkdir(parents=True, exist_ok=True)
        if not self.registry.exists():
            with self.lock():
                if not self.registry.exists():
                    self._replace("# TRACE workspace registry: generated envs, appended by `trace generate` "
                                  "after admission.\n")
        return self

    @contextmanager
    def lock(self):
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / "registry.yaml.lock", "a+") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def ids(self) -> list[str]:
        """Ids in this workspace's registry (read as text: no PyYAML import, no validation)."""
        if not self.registry.exists():
            return []
        return re.findall(r"^- id: *['\"]?([^'\"\s]+)", self.registry.read_text(encoding="utf-8"), re.M)

    @staticmethod
    def env_name(capability: str, target: str) -> str:
        """``<capability>_<target>``: the name part of the ids of one capability's envs for one target."""
        return re.sub(r"[^a-z0-9_]+", "_", f"{capability}_{target}".lower()).strip("_")

    def next_version(self, name: str, taken: set[str] = frozenset()) -> int:
        """The first N such that neither ``gen/<name>-vN`` nor ``envs/<name>_vN.py`` exists."""
        used = set(self.ids()) | set(taken)
        n = 0
        while f"{NAMESPACE}/{name}-v{n}" in used or (self.envs / f"{name}_v{n}.py").exists():
            n += 1
        return n

    @staticmethod
    def env_id(name: str, version: int) -> str:
        return f"{NAMESPACE}/{name}-v{version}"

    def module_path(self, name: str, version: int) -> Path:
        return self.envs / f"{name}_v{version}.py"

    def install(self, source: str, registration: dict, *, capability: str, name: str, version: int, target: str,
                origin: str, report=None, hint: str | None = None) -> tuple[Path, Path | None, Path | None]:
        """Write the module and its report, then append its entry to ``registry.yaml`` (locked, atomic).

        ``hint`` is hint mode's text, from the generator's own spec (trusted); the module's texts never are.

        Raises :class:`WorkspaceError` if the id or the module file exists already (nothing is overwritten).
        """
        self.init()
        env_id = registration["id"]
        module = self.module_path(name, version)
        with self.lock():
            if env_id in self.ids():
                raise WorkspaceError(f"{env_id} is already in {self.registry} (ids are never overwritten); "
                                     "generate again to get the next -vN")
            fd = os.open(module, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # refuse to replace a module
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(source)
            report_json = report_md = None
            if report is not None:
                report_json, report_md = report.write(module.with_suffix(""))
            entry = _entry_yaml(env_id=env_id, entry_point=f"envs.{module.stem}:{registration['class']}",
                                capability=capability, target=target,
                                max_episode_steps=registration["max_episode_steps"],
                                kwargs=registration.get("kwargs") or {}, origin=origin,
                                description=registration["description"], hint=hint)
            text = self.registry.read_text(encoding="utf-8") if self.registry.exists() else ""
            if text and not text.endswith("\n"):
                text += "\n"
            self._replace(text + entry)
        return module, report_json, report_md

    @property
    def quarantine_file(self) -> Path:
        return self.root / QUARANTINE_FILE

    def quarantine(self, env_id: str, reason: str) -> Path:
        """Record ``env_id`` as quarantined (the use-time audit caught it): its sandboxed worker refuses to
        start until the entry is removed from ``quarantine.json`` by hand. The module and its registry entry
        stay, as evidence. Returns the quarantine file."""
        import json
        import time

        with self.lock():
            try:
                data = json.loads(self.quarantine_file.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                data = {}
            if not isinstance(data, dict):
                data = {}
            data[env_id] = {"reason": reason[:4000], "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            fd, tmp = tempfile.mkstemp(prefix=".quarantine.", suffix=".json", dir=self.root)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, self.quarantine_file)
        return self.quarantine_file

    def _replace(self, text: str) -> None:
        fd, tmp = tempfile.mkstemp(prefix=".registry.", suffix=".yaml", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.registry)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _entry_yaml(**fields) -> str:
    import json

    # JSON scalars and flow mappings are valid YAML: no PyYAML needed to write an entry.
    lines = [f"- id: {fields['env_id']}"]
    for key in ("entry_point", "kind", "capability", "target", "max_episode_steps", "requires", "kwargs", "origin",
                "description", "hint"):
        if key == "hint" and not fields.get("hint"):
            continue
        value = {"kind": "capability", "requires": []}.get(key, fields.get(key))
        lines.append(f"  {key}: {json.dumps(value, ensure_ascii=False, sort_keys=True)}")
    return "\n".join(lines) + "\n"
