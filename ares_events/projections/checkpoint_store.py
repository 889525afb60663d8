"""Signed checkpoints the log issued, stored beside the Merkle tree in the events' database.

One row per ``(origin, tree_size)``: the root and the whole signed note (the first one
signed at that size is kept). ``prove`` uses the latest one that covers an event; the
audit re-checks every one against the events. The verifier keys that signed them are
remembered in the store's metadata (``log_keys``), so an audit can verify the witness's
checkpoints without being told the key (``--vkey`` is the stronger, outside source).

Tables: ``ares_checkpoints`` on SQLite and PostgreSQL (in the store's schema), a dict on
the memory store. Created by the first checkpoint stored, like the read-model tables:
reading (``checkpoint --list``, ``prove``, an audit) never creates it.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Final, Protocol

from ares_events.core.events import utc_now_at
from ares_events.core.recorder import backend_of
from ares_events.errors import ConfigError
from ares_events.projections.tables import MemoryTables, SQLTables, tables_for

__all__ = ["CheckpointStore", "checkpoints_for"]

LOG_KEYS: Final = "log_keys"
"""``ares_meta`` key: JSON list of the verifier keys that signed this log's checkpoints."""

CREATE: Final = (
    "CREATE TABLE IF NOT EXISTS {table} (origin TEXT NOT NULL, tree_size BIGINT NOT NULL, "
    "root {blob} NOT NULL, note TEXT NOT NULL, created_at TEXT NOT NULL, "
    "PRIMARY KEY (origin, tree_size))"
)
INSERT: Final = (
    "INSERT INTO {table} (origin, tree_size, root, note, created_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, tree_size) DO NOTHING"
)
SELECT_LATEST: Final = "SELECT note FROM {table} ORDER BY tree_size DESC, origin LIMIT 1"
SELECT_AT: Final = "SELECT note FROM {table} WHERE tree_size = ? ORDER BY origin LIMIT 1"
SELECT_ORIGIN: Final = "SELECT origin FROM {table} ORDER BY tree_size LIMIT 1"
SELECT_ALL: Final = (
    "SELECT origin, tree_size, root, note, created_at FROM {table} "
    "WHERE tree_size > ? ORDER BY tree_size, origin LIMIT ?"
)
TABLE: Final = "ares_checkpoints"


class CheckpointStore(Protocol):
    """Where a log keeps the checkpoints it signed."""

    def put(self, origin: str, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint (the first one of a size stays)."""
        ...

    def latest(self) -> str | None:
        """The signed note of the largest size, or None."""
        ...

    def at_size(self, size: int) -> str | None:
        """The signed note of exactly ``size``, or None."""
        ...

    def origin(self) -> str | None:
        """The origin of the first checkpoint stored (the log's identity), or None."""
        ...

    def all(self) -> list[tuple[str, int, bytes, str, str]]:
        """Every ``(origin, size, root, note, created_at)`` by size."""
        ...

    def remember_key(self, vkey: str) -> None:
        """Record a verifier key that signed this log's checkpoints."""
        ...

    def known_keys(self) -> list[str]:
        """The verifier keys recorded by :meth:`remember_key`."""
        ...


class _Keys:
    """The ``log_keys`` entry of the store's metadata (through the recorder)."""

    def __init__(self, recorder: Any) -> None:
        self._rec = recorder
        self._lock = threading.Lock()

    def remember_key(self, vkey: str) -> None:
        get = getattr(self._rec, "meta_get", None)
        if not callable(get):
            return
        with self._lock:
            keys = self.known_keys()
            if vkey not in keys:
                self._rec.meta_set(LOG_KEYS, json.dumps([*keys, vkey]))

    def known_keys(self) -> list[str]:
        get = getattr(self._rec, "meta_get", None)
        raw = get(LOG_KEYS) if callable(get) else None
        if not raw:
            return []
        try:
            keys = json.loads(raw)
        except ValueError:
            return []
        return [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []


class MemoryCheckpoints(_Keys):
    """Checkpoints of a ``memory://`` store."""

    def __init__(self, recorder: Any) -> None:
        super().__init__(recorder)
        self._rows: dict[tuple[str, int], tuple[bytes, str, str]] = {}
        self._rows_lock = threading.Lock()

    def put(self, origin: str, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint."""
        with self._rows_lock:
            self._rows.setdefault((origin, size), (root, note, utc_now_at()))

    def _sorted(self) -> list[tuple[str, int, bytes, str, str]]:
        with self._rows_lock:
            items = sorted(self._rows.items(), key=lambda kv: (kv[0][1], kv[0][0]))
        return [(o, n, r, t, at) for (o, n), (r, t, at) in items]

    def latest(self) -> str | None:
        """The largest size's note."""
        rows = self._sorted()
        if not rows:
            return None
        top = max(r[1] for r in rows)
        return next(r[3] for r in rows if r[1] == top)

    def at_size(self, size: int) -> str | None:
        """The note of ``size``."""
        return next((r[3] for r in self._sorted() if r[1] == size), None)

    def origin(self) -> str | None:
        """The first origin."""
        rows = self._sorted()
        return rows[0][0] if rows else None

    def all(self) -> list[tuple[str, int, bytes, str, str]]:
        """Every row by size."""
        return self._sorted()


class SQLCheckpoints(_Keys):
    """Checkpoints in SQLite or PostgreSQL, beside the read models."""

    def __init__(self, tables: SQLTables) -> None:
        super().__init__(tables.recorder)
        self.t = tables
        self._name = tables.qualified(TABLE)
        self._ready = False

    def _sql(self, template: str) -> str:
        return template.format(table=self._name, blob=self.t._blob)

    def _exists(self) -> bool:
        """Whether the table exists (remembered once it does: it is never dropped)."""
        if not self._ready:
            self._ready = self.t.has_table(TABLE)
        return self._ready

    def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        if not self._exists():
            return None
        with self.t.transaction(read=True) as c:
            row = self.t.run(c, self._sql(sql), args).fetchone()
        return None if row is None else row[0]

    def put(self, origin: str, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint (the first one of a size stays)."""
        if not self._exists():
            with self.t.transaction(ddl=True) as c:
                self.t.run(c, self._sql(CREATE))
            self._ready = True
        with self.t.transaction() as c:
            self.t.run(c, self._sql(INSERT), (origin, size, root, note, utc_now_at()))

    def latest(self) -> str | None:
        """The largest size's note."""
        v = self._one(SELECT_LATEST)
        return None if v is None else str(v)

    def at_size(self, size: int) -> str | None:
        """The note of ``size``."""
        v = self._one(SELECT_AT, (size,))
        return None if v is None else str(v)

    def origin(self) -> str | None:
        """The first origin."""
        v = self._one(SELECT_ORIGIN)
        return None if v is None else str(v)

    def all(self) -> list[tuple[str, int, bytes, str, str]]:
        """Every row by size, paged."""
        out: list[tuple[str, int, bytes, str, str]] = []
        if not self._exists():
            return out
        after = -1
        while True:
            with self.t.transaction(read=True) as c:
                rows = self.t.run(c, self._sql(SELECT_ALL), (after, 1000)).fetchall()
            out.extend((str(o), int(n), bytes(r), str(t), str(at)) for o, n, r, t, at in rows)
            if len(rows) < 1000:
                return out
            after = int(rows[-1][1])


def checkpoints_for(store: Any) -> CheckpointStore:
    """The checkpoint table of ``store``'s backend (cached on the recorder).

    Raises:
        ConfigError: the backend keeps no tables beside its events.
    """
    rec = backend_of(store.recorder)
    cached = getattr(rec, "_ares_checkpoints", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    tables = tables_for(store)
    found: CheckpointStore
    if isinstance(tables, MemoryTables):
        data = rec._d
        found = data.__dict__.setdefault("checkpoints", MemoryCheckpoints(rec))
    elif isinstance(tables, SQLTables):
        found = SQLCheckpoints(tables)
    else:  # pragma: no cover - tables_for knows only these two
        raise ConfigError(f"store {store.url} keeps no checkpoints")
    try:
        object.__setattr__(rec, "_ares_checkpoints", found)
    except (AttributeError, TypeError):
        pass
    return found
