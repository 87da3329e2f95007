"""The README's Layout section and its "Where things live" table name only paths that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
_NAME = re.compile(r"(?<![\w./-])([A-Za-z_][\w.*-]*(?:/[\w.*-]+)*/?)")


def _section(title: str) -> str:
    start = README.index(f"## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


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


def test_every_room_in_the_where_things_live_table_exists():
    table = _section("Where things live")
    rooms = re.findall(r"^\| ([^|]+) \|", table, flags=re.M)[2:]  # skip the header and the rule
    paths = [p for cell in rooms for p in re.findall(r"`([^`]+)`", cell)]
    assert len(paths) >= 8
    missing = []
    for p in paths:
        # A bare name after a full path in the same cell ("`trace_envs/domains/`, `capabilities/`") is its sibling.
        inside = ("trace_envs", "trace_train", ".")
        if not (_exists(p, ROOT) or (p.rstrip("/").count("/") == 0 and any(_exists(p, ROOT / d) for d in inside))):
            missing.append(p)
    assert not missing, f"the README's rooms table names paths that do not exist: {missing}"
    links = re.findall(r"\]\(([^)#]+)\)", table)
    assert links and all((ROOT / link).exists() for link in links), links
