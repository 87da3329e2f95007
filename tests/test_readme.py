"""The README is a front door: short, its sections in a newcomer's order, its quickstart runs, its links and the
paths of its Layout block exist, and its results link their lab/ folder. docs/README.md's rooms table names
only paths that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
_NAME = re.compile(r"(?<![\w./-])([A-Za-z_][\w.*-]*(?:/[\w.*-]+)*/?)")


def _section(title: str, text: str = README) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


#: The front door's sections, in order (issue 56).
SECTIONS = ["Install", "The two commands", "Quickstart", "Plugging into a trainer", "Contributing an environment",
            "Results, in miniature", "Layout"]


def test_the_readme_is_a_short_front_door_in_order():
    assert len(README.splitlines()) <= 150, len(README.splitlines())
    assert "docs/figures/loop.png" in README and (ROOT / "docs/figures/loop.png").exists()
    positions = [README.index(f"\n## {title}\n") for title in SECTIONS]
    assert positions == sorted(positions), SECTIONS
    assert "make demo" in _section("The two commands") and "make test" in _section("The two commands")
    trainers = _section("Plugging into a trainer")
    for name in ("TRL", "OpenEnv", "verifiers", "Gymnasium"):
        assert name in trainers, name


def test_the_quickstart_runs_as_written():
    code = _section("Quickstart").split("```python")[1].split("```")[0]
    assert len(code.strip().splitlines()) <= 12
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1.0"


def test_every_relative_link_of_the_readme_exists():
    links = [link for link in re.findall(r"\]\(([^)#]+)\)", README) if "://" not in link]
    missing = [link for link in links if not (ROOT / link).exists()]
    assert links and not missing, missing


def test_the_results_link_their_lab_folder_whose_readme_names_command_and_result():
    results = _section("Results, in miniature")
    folders = {m for m in re.findall(r"\]\((lab/[\w-]+)/README\.md\)", results)}
    assert folders, "the results table must link its lab/ folder"
    for folder in folders:
        readme = (ROOT / folder / "README.md").read_text(encoding="utf-8")
        # the command: a `trace run` config of the folder, or a script of its own
        assert "**Command**" in readme and "**Result**" in readme, folder
        assert "trace run lab/" in readme or f"python {folder}/" in readme, folder


def _exists(path: str, under: Path) -> bool:
    return any(under.glob(path.rstrip("/"))) if "*" in path else (under / path).exists()


def _named_paths(text: str) -> list[str]:
    """Tokens that look like paths: folders (ending in /) and files with an extension."""
    return [t for t in _NAME.findall(text) if t.endswith("/") or re.search(r"\.(py|yaml|md|toml)$", t)]


def test_every_path_in_the_layout_block_exists():
    block = _section("Layout").split("```")[1]
    top: Path | None = None
    missing = []
    for line in block.splitlines():
        line = re.sub(r"\([^)]*\)", lambda m: " ".join(_named_paths(m.group(0))), line)  # keep paths in ( )
        names = _named_paths(line)
        if not names:
            continue
        if not line.startswith(" "):
            top = ROOT / names[0]
            missing += [n for n in names[:1] if not _exists(n, ROOT)]
            names = names[1:]
        for name in names:
            if not (_exists(name, top or ROOT) or _exists(name, ROOT)):
                missing.append(f"{top.name if top else ''}/{name}")
    assert not missing, f"the README's Layout names paths that do not exist: {missing}"


def test_every_room_in_the_docs_rooms_table_exists():
    docs = ROOT / "docs"
    table = _section("Where each room is", (docs / "README.md").read_text(encoding="utf-8"))
    rooms = re.findall(r"^\| ([^|]+) \|", table, flags=re.M)[2:]  # skip the header and the rule
    paths = [p for cell in rooms for p in re.findall(r"`([^`]+)`", cell)]
    assert len(paths) >= 8
    missing = []
    for p in paths:
        # A bare name after a full path in the same cell ("`trace_envs/domains/`, `capabilities/`") is its sibling.
        inside = ("trace_envs", "trace_train", ".")
        if not (_exists(p, ROOT) or (p.rstrip("/").count("/") == 0 and any(_exists(p, ROOT / d) for d in inside))):
            missing.append(p)
    assert not missing, f"docs/README.md's rooms table names paths that do not exist: {missing}"


def test_every_lab_folder_has_a_readme_with_question_command_and_result():
    folders = [p for p in (ROOT / "lab").iterdir() if p.is_dir()]
    assert folders
    for folder in folders:
        readme = (folder / "README.md").read_text(encoding="utf-8")
        for part in ("**Question.**", "**Command**", "**Result**", "**What was learnt.**"):
            assert part in readme, (folder.name, part)
        # A run of the loop (`trace run lab/<folder>/<config>.yaml`) or a committed script (`python lab/<folder>/x.py`).
        commands = re.findall(r"trace run (lab/[\w/.-]+\.yaml)", readme) + re.findall(r"python (lab/[\w/.-]+\.py)", readme)
        assert commands and all((ROOT / c).is_file() for c in commands), (folder.name, commands)
        links = [link for link in re.findall(r"\]\(([^)#]+)\)", readme) if "://" not in link]
        assert all((folder / link).exists() for link in links), (folder.name, links)
