"""Warmed-up tiny bases shipped with the project, so that ``trace run`` needs no warm-up.

Each folder under ``trace_train/tiny/bases/`` is a complete model folder (``model.safetensors``, the
tokenizer, ``trace_model.json``) plus ``recipe.json``: the :class:`~trace_train.tiny.bootstrap.BootstrapConfig`
that made it, the cache name that recipe gives (:func:`trace_train.pipeline.stages.base.tiny_base_cache_dir`:
a hash of the recipe and :data:`~trace_train.tiny.build.BUILD_VERSION`), how long it trained, and what it
solves. The base stage installs a shipped base into the model cache when its cache name equals the one
the run's ``base.bootstrap`` gives, so the same config gives the same base on every machine; any other
recipe warms up a new base as before.

A run config can name one more place to look (``base.shipped``: a base folder, or a folder of them), so that
a base only one experiment uses lives beside that experiment's config instead of in the package.

Why ship it: the warm-up is a step budget, so machines of one CPU type make the same base, but another
CPU rounds differently (the same recipe gave bases solving 2, 6 and 9 of 40 diagnosis episodes on three
machines), and it cost half of ``make demo``'s 30 minutes. ``trace model bootstrap --recipe
trace_train/tiny/bases/<name>/recipe.json`` rebuilds one (bit for bit only on the CPU type it was built on).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

BASES = Path(__file__).resolve().parent / "bases"
#: The files a shipped base must have to be installed.
REQUIRED = ("model.safetensors", "config.json", "tokenizer.json", "trace_model.json", "recipe.json")


@dataclass
class ShippedBase:
    """One shipped base: its folder and its ``recipe.json``."""

    path: Path
    recipe: dict

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def cache_name(self) -> str:
        """The model-cache folder name its recipe gives (what a run's config must give to use it)."""
        return str(self.recipe["cache_name"])

    @property
    def complete(self) -> bool:
        return all((self.path / f).is_file() for f in REQUIRED)


Roots = Path | Iterable[Path]


def _roots(root: Roots) -> list[Path]:
    return [Path(root)] if isinstance(root, (str, Path)) else [Path(r) for r in root]


def _folders(root: Path) -> list[Path]:
    """A base folder itself (it has ``recipe.json``), or the folders inside ``root``, by name."""
    if (root / "recipe.json").is_file():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def shipped_bases(root: Roots = BASES) -> list[ShippedBase]:
    """Every shipped base under ``root`` (one folder or several; each a base folder or a folder of them) whose
    ``recipe.json`` reads, in the roots' order and by name within each."""
    out = []
    for folder in (f for r in _roots(root) for f in _folders(r)):
        try:
            recipe = json.loads((folder / "recipe.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if "cache_name" in recipe:
            out.append(ShippedBase(folder, recipe))
    return out


def find_shipped_base(cache_name: str, root: Roots = BASES) -> ShippedBase | None:
    """The first complete shipped base whose recipe gives ``cache_name``, or None."""
    return next((b for b in shipped_bases(root) if b.cache_name == cache_name and b.complete), None)


def install_shipped_base(cache_dir: Path, root: Roots = BASES) -> ShippedBase | None:
    """Copy the shipped base matching ``cache_dir``'s name into ``cache_dir`` (atomically); None if none matches.

    The copy goes to a ``.partial`` sibling first and is renamed, so an interrupted copy never looks cached.
    """
    base = find_shipped_base(cache_dir.name, root)
    if base is None:
        return None
    tmp = cache_dir.with_name(cache_dir.name + ".shipped.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base.path, tmp)
    shutil.rmtree(cache_dir, ignore_errors=True)
    tmp.rename(cache_dir)
    return base


__all__ = ["BASES", "ShippedBase", "find_shipped_base", "install_shipped_base", "shipped_bases"]
