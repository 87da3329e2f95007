"""A copy-on-write database of JSON records, for the τ²-style domains.

A domain's data is a set of tables (``{"users": {id: record}, ...}``). The
generated or loaded tables are a frozen *base* that many episodes share; each
episode works in a :class:`Layer` on top of it, which copies a record the
first time a tool edits it. This makes ``reset`` cheap at any DB size (no deep
copy of the whole DB), and it makes evaluation cheap: two layers over the same
parent differ only in the records either of them touched, so comparing those
records is the same as comparing the two full databases — the DB-state check
of τ²-bench at a fraction of its cost.

Tools read with :meth:`Layer.get` (never mutate what it returns) and write
with :meth:`Layer.edit` / :meth:`Layer.insert`.
"""

from __future__ import annotations

from typing import Any, Iterator

from ..core.env import canonical_hash


def copy_json(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, scalars), several times faster than ``copy.deepcopy``."""
    t = type(value)
    if t is dict:
        return {k: copy_json(v) for k, v in value.items()}
    if t is list:
        return [copy_json(v) for v in value]
    return value


class Layer:
    """One copy-on-write view of the tables: reads fall through to the parent, writes stay here.

    Args:
        parent: a ``Layer`` or a plain ``{table: {key: record}}`` dict (the frozen base).
    """

    __slots__ = ("parent", "changes")

    def __init__(self, parent: "Layer | dict[str, dict[str, dict]]"):
        self.parent = parent
        self.changes: dict[str, dict[str, dict]] = {}

    # -- reads ---------------------------------------------------------------------------------
    def get(self, table: str, key: str) -> dict | None:
        """The record, or None. Treat it as read-only."""
        node: Any = self
        while isinstance(node, Layer):
            own = node.changes.get(table)
            if own is not None and key in own:
                return own[key]
            node = node.parent
        return node.get(table, {}).get(key)

    def __contains__(self, item: tuple[str, str]) -> bool:
        return self.get(*item) is not None

    def keys(self, table: str) -> list[str]:
        """All keys of a table: the base's order, then records inserted by layers."""
        chain = []
        node: Any = self
        while isinstance(node, Layer):
            chain.append(node.changes.get(table, {}))
            node = node.parent
        base = node.get(table, {})
        keys = list(base)
        seen = set(base) if chain else ()
        for own in reversed(chain):
            for key in own:
                if key not in seen:
                    keys.append(key)
                    seen.add(key)  # type: ignore[union-attr]
        return keys

    def values(self, table: str) -> Iterator[dict]:
        for key in self.keys(table):
            yield self.get(table, key)  # type: ignore[misc]

    def count(self, table: str) -> int:
        return len(self.keys(table))

    # -- writes --------------------------------------------------------------------------------
    def edit(self, table: str, key: str) -> dict:
        """The record, copied into this layer on first use, for in-place modification."""
        own = self.changes.setdefault(table, {})
        record = own.get(key)
        if record is None:
            found = self.get(table, key)
            if found is None:
                raise KeyError(f"{table}/{key}")
            record = own[key] = copy_json(found)
        return record

    def insert(self, table: str, key: str, record: dict) -> None:
        if self.get(table, key) is not None:
            raise KeyError(f"{table}/{key} already exists")
        self.changes.setdefault(table, {})[key] = record

    # -- comparison ----------------------------------------------------------------------------
    def touched(self) -> set[tuple[str, str]]:
        return {(t, k) for t, recs in self.changes.items() for k in recs}

    def child(self) -> "Layer":
        return Layer(self)

    def flatten(self) -> dict[str, dict[str, dict]]:
        """The full tables as plain dicts (for export and for hashing the whole DB)."""
        node: Any = self
        while isinstance(node, Layer):
            node = node.parent
        tables = sorted(set(node) | self._layer_tables())
        return {t: {k: self.get(t, k) for k in self.keys(t)} for t in tables}

    def _layer_tables(self) -> set[str]:
        tables: set[str] = set()
        node: Any = self
        while isinstance(node, Layer):
            tables |= set(node.changes)
            node = node.parent
        return tables


def state_hash(layer: Layer, keys: set[tuple[str, str]]) -> str:
    """Canonical hash of the given records of ``layer`` (missing records hash as null)."""
    return canonical_hash(sorted(([t, k, layer.get(t, k)] for t, k in keys), key=lambda x: (x[0], x[1])))


def same_state(a: Layer, b: Layer) -> tuple[bool, str, str]:
    """Whether two layers over the same parent hold the same database.

    Only records touched by either layer can differ, so hashing those is
    equivalent to hashing both full databases. Returns (equal, hash_a, hash_b).
    """
    keys = a.touched() | b.touched()
    ha, hb = state_hash(a, keys), state_hash(b, keys)
    return ha == hb, ha, hb
