"""A small document model that renders to Markdown and to self-contained HTML (images inlined as data URIs).

The run report (:mod:`trace_train.report.run_report`) is built once as a list of blocks and written twice,
so the Markdown and the HTML never disagree.
"""

from __future__ import annotations

import base64
import html
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
color:#1b1f24;line-height:1.45}
h1{font-size:1.7em;border-bottom:2px solid #d0d7de;padding-bottom:.3em}h2{font-size:1.3em;margin-top:1.8em;
border-bottom:1px solid #d0d7de;padding-bottom:.2em}h3{font-size:1.1em}
table{border-collapse:collapse;margin:.8em 0;font-size:.9em}th,td{border:1px solid #d0d7de;padding:.3em .6em;
text-align:left;vertical-align:top}th{background:#f6f8fa}tr:nth-child(even) td{background:#fbfcfd}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code{background:#f6f8fa;padding:.1em .3em;border-radius:4px;font-size:.9em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #d0d7de}figcaption{font-size:.85em;color:#57606a}
p.note{background:#fff8c5;border-left:4px solid #d4a72c;padding:.4em .8em}
p.caption{font-size:.85em;color:#57606a;margin-top:-.4em}
"""

_NUMERIC = re.compile(r"^[+\-−]?\d")


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Image:
    path: Path
    caption: str


@dataclass
class Document:
    """Blocks in order: ``("h", level, text)``, ``("p", text)``, ``("note", text)``, a :class:`Table`, an :class:`Image`."""

    title: str
    blocks: list = field(default_factory=list)

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def note(self, text: str) -> None:
        self.blocks.append(("note", text))

    def table(self, headers: list[str], rows: list[list[object]], caption: str = "") -> None:
        self.blocks.append(Table(list(headers), [[_cell(v) for v in r] for r in rows], caption))

    def image(self, path: str | Path | None, caption: str) -> bool:
        """Add a figure if the file exists (returns whether it did)."""
        if path and Path(path).is_file():
            self.blocks.append(Image(Path(path), caption))
            return True
        return False

    @property
    def tables(self) -> list[Table]:
        return [b for b in self.blocks if isinstance(b, Table)]

    # -- Markdown
    def markdown(self, figures_dir: Path, link_prefix: str) -> str:
        """Markdown text; each figure is copied into ``figures_dir`` and linked as ``link_prefix/<name>``."""
        out = [f"# {self.title}", ""]
        used: set[str] = set()
        for b in self.blocks:
            if isinstance(b, Table):
                out.append("| " + " | ".join(_md_escape(h) for h in b.headers) + " |")
                out.append("|" + "".join("---:|" if _numeric_column(b, i) else "---|" for i in range(len(b.headers))))
                out += ["| " + " | ".join(_md_escape(c) for c in r) + " |" for r in b.rows]
                if b.caption:
                    out += ["", f"*{b.caption}*"]
            elif isinstance(b, Image):
                name = _unique_name(b.path, used)
                figures_dir.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(b.path, figures_dir / name)
                out.append(f"![{b.caption}]({link_prefix}/{name})")
                out += ["", f"*{b.caption}*"]
            elif b[0] == "h":
                out.append("#" * (b[1] + 1) + " " + b[2])
            elif b[0] == "note":
                out.append("> **Note.** " + b[1])
            else:
                out.append(b[1])
            out.append("")
        return "\n".join(out).rstrip() + "\n"

    # -- HTML
    def html(self) -> str:
        """One self-contained HTML page: CSS inline, every image a ``data:`` URI (no external file)."""
        parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                 f"<title>{html.escape(self.title)}</title><style>{_CSS}</style></head><body>",
                 f"<h1>{_inline(self.title)}</h1>"]
        for b in self.blocks:
            if isinstance(b, Table):
                parts.append("<table><thead><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in b.headers)
                             + "</tr></thead><tbody>")
                for r in b.rows:
                    cells = [(' class="num"' if _NUMERIC.match(c) else "", _inline(c)) for c in r]
                    parts.append("<tr>" + "".join(f"<td{cls}>{text}</td>" for cls, text in cells) + "</tr>")
                parts.append("</tbody></table>")
                if b.caption:
                    parts.append(f'<p class="caption">{_inline(b.caption)}</p>')
            elif isinstance(b, Image):
                data = base64.b64encode(b.path.read_bytes()).decode()
                mime = "image/png" if b.path.suffix.lower() == ".png" else "image/svg+xml"
                parts.append(f'<figure><img alt="{html.escape(b.caption)}" src="data:{mime};base64,{data}">'
                             f"<figcaption>{_inline(b.caption)}</figcaption></figure>")
            elif b[0] == "h":
                parts.append(f"<h{b[1] + 1}>{_inline(b[2])}</h{b[1] + 1}>")
            elif b[0] == "note":
                parts.append(f'<p class="note">{_inline(b[1])}</p>')
            else:
                parts.append(f"<p>{_inline(b[1])}</p>")
        parts.append("</body></html>")
        return "\n".join(parts) + "\n"


def _cell(v: object) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v).replace("\n", " ")


def _numeric_column(t: Table, i: int) -> bool:
    vals = [r[i] for r in t.rows if r[i] != "–"]
    return bool(vals) and all(_NUMERIC.match(v) for v in vals)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def _inline(text: str) -> str:
    """Escape HTML, then render `code` and **bold** spans (the only inline markup the report uses)."""
    s = html.escape(text)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)


def _unique_name(path: Path, used: set[str]) -> str:
    stem = "_".join(p for p in path.parts[-3:-1] if p not in ("/", "run")) + "_" + path.name
    name, n = stem.lstrip("_"), 1
    while name in used:
        n += 1
        name = f"{n}_{stem.lstrip('_')}"
    used.add(name)
    return name
