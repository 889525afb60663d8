"""Read models and signed checkpoints of a memory store, in process, atomic under one lock.

It may import the core.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import orjson

from ares_events.core.events import utc_now_at
from ares_events.core.read_models import Cursor, ProjectionMeta

__all__ = ["MemoryCheckpoints", "MemoryReadModels"]


class MemoryCheckpoints:
    """The signed checkpoints of the Merkle log, by ``(origin, size)``
    (:class:`~ares_events.core.read_models.CheckpointStore`)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, int], tuple[bytes, str, str]] = {}
        self._lock = threading.Lock()

    def put(self, origin: str, size: int, root: bytes, note: str) -> None:
        with self._lock:
            self._rows.setdefault((origin, size), (root, note, utc_now_at()))

    def all(self) -> list[tuple[str, int, bytes, str, str]]:
        with self._lock:
            items = sorted(self._rows.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return [(o, n, r, t, at) for (o, n), (r, t, at) in items]

    def newest(self, limit: int) -> list[tuple[str, int, bytes, str, str]]:
        return sorted(self.all(), key=lambda r: (-r[1], r[0]))[:limit]

    def at_size(self, size: int) -> str | None:
        return next((r[3] for r in self.all() if r[1] == size), None)

    def origin(self) -> str | None:
        rows = self.all()
        return rows[0][0] if rows else None


class MemoryReadModels:
    """Read models in process (:class:`~ares_events.core.read_models.ReadModels`); also
    the runner's scratch space when it diffs a rebuild."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meta: dict[str, ProjectionMeta] = {}
        self.tables: dict[str, dict[str, tuple[bytes, int]]] = {}
        """Each table's rows: key -> (canonical JSON state, position)."""
        self.checkpoints = MemoryCheckpoints()

    def meta(self, name: str) -> ProjectionMeta | None:
        with self._lock:
            return self._meta.get(name)

    def put_meta(self, meta: ProjectionMeta) -> None:
        with self._lock:
            self._meta.setdefault(meta.name, meta)

    def start_building(self, name: str, table: str, seen: ProjectionMeta) -> bool:
        """Compare-and-set under the lock."""
        with self._lock:
            m = self._meta[name]
            if m.generation != seen.generation or m.building_table != seen.building_table:
                return False
            self._meta[name] = replace(
                m, building_table=table, building_position=0, generation=seen.generation + 1
            )
            return True

    def swap(self, name: str, table: str, position: int, projection_version: int) -> bool:
        with self._lock:
            m = self._meta[name]
            if m.building_table != table or m.building_position != position:
                return False
            self._meta[name] = replace(
                m,
                active_table=table,
                position=position,
                building_table=None,
                building_position=0,
                projection_version=projection_version,
            )
            return True

    def create(self, table: str) -> None:
        with self._lock:
            self.tables.setdefault(table, {})

    def drop(self, table: str) -> None:
        with self._lock:
            self.tables.pop(table, None)

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        with self._lock:
            t = self.tables.get(table, {})
            return {k: orjson.loads(t[k][0]) for k in keys if k in t}

    def commit(
        self,
        table: str,
        rows: Mapping[str, tuple[bytes, int]],
        name: str,
        cursor: Cursor,
        expected: int,
        new: int,
    ) -> bool:
        """Atomic (and compare-and-set) under the lock."""
        with self._lock:
            m = self._meta.get(name)
            if cursor == "live":
                if m is None or m.active_table != table or m.position != expected:
                    return False
                self._meta[name] = replace(m, position=new)
            elif cursor == "building":
                if m is None or m.building_table != table or m.building_position != expected:
                    return False
                self._meta[name] = replace(m, building_position=new)
            self.tables.setdefault(table, {}).update(rows)
            return True

    def scan(self, table: str) -> Iterator[tuple[str, Any]]:
        with self._lock:
            items = sorted(self.tables.get(table, {}).items())
        for k, (s, _) in items:
            yield k, orjson.loads(s)

    def read_live(self, name: str) -> tuple[ProjectionMeta, dict[str, Any]] | None:
        """The registry row and a copy of its live table, taken under the lock."""
        with self._lock:
            m = self._meta.get(name)
            if m is None or m.active_table is None:
                return None
            rows = dict(self.tables.get(m.active_table, {}))
        return m, {k: orjson.loads(s) for k, (s, _) in sorted(rows.items())}

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._meta)

    def reset(self, name: str) -> bool:
        """Empty the tables, rewind the cursor (atomic under the lock)."""
        with self._lock:
            m = self._meta.get(name)
            if m is None:
                return False
            for t in (m.active_table, m.building_table):
                if t is not None and t in self.tables:
                    self.tables[t] = {}
            self._meta[name] = replace(m, position=0, building_table=None, building_position=0)
            return True
