"""Read-model tables for the catch-up runner, in the same database as the events.

Per projection there is a registry row (``ares_projections``: projection version, the
active table, its cursor, and a table being rebuilt with its own cursor) and one table per
generation (``ares_rm_<name>_<generation>``: key, state as canonical JSON, position of
the last event applied). Rows and the cursor are written in one transaction, so each
event is applied exactly once even across crashes. A rebuild fills a fresh generation
while the live one keeps serving reads, then swaps the registry pointer atomically.

Readers never create: the registry is created by the first writer (a runner or a rebuild
registering a projection); before that, reading it finds no projection. So a look at a
store (``ares-events rebuild --verify``, the console) leaves it as it was.
"""

from __future__ import annotations

import contextlib
import re
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import blake3
import orjson

from ares_events.chain import canonical_json
from ares_events.core.recorder import backend_of
from ares_events.errors import ConfigError

__all__ = [
    "MemoryTables",
    "ProjectionMeta",
    "ReadModelTables",
    "SQLTables",
    "encode_state",
    "new_meta",
    "table_name",
    "tables_for",
]

_SAFE = re.compile(r"[^a-z0-9_]")

CREATE_REGISTRY = """CREATE TABLE IF NOT EXISTS ares_projections (
    name TEXT PRIMARY KEY,
    projection_version INTEGER NOT NULL,
    active_table TEXT,
    position BIGINT NOT NULL,
    building_table TEXT,
    building_position BIGINT NOT NULL,
    generation INTEGER NOT NULL
)"""
SELECT_META = (
    "SELECT name, projection_version, active_table, position, building_table, "
    "building_position, generation FROM ares_projections WHERE name = ?"
)
INSERT_META = (
    "INSERT INTO ares_projections (name, projection_version, active_table, position, "
    "building_table, building_position, generation) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (name) DO NOTHING"
)
# Cursor moves are compare-and-set: a writer that read a stale registry row (a runner
# racing a rebuild, two runners) changes nothing and its transaction rolls back.
ADVANCE_LIVE = (
    "UPDATE ares_projections SET position = ? WHERE name = ? AND active_table = ? AND position = ?"
)
ADVANCE_BUILDING = (
    "UPDATE ares_projections SET building_position = ? "
    "WHERE name = ? AND building_table = ? AND building_position = ?"
)
START_BUILDING = (
    "UPDATE ares_projections SET building_table = ?, building_position = 0, generation = ? "
    "WHERE name = ?"
)
SWAP = (
    "UPDATE ares_projections SET active_table = building_table, position = building_position, "
    "building_table = NULL, building_position = 0, projection_version = ? "
    "WHERE name = ? AND building_table = ? AND building_position = ?"
)
SELECT_NAMES = "SELECT name FROM ares_projections ORDER BY name"
# A reset (after an erasure) keeps the tables but empties them and rewinds the cursor: a
# runner that read the registry before it fails its compare-and-set and starts again.
RESET = (
    "UPDATE ares_projections SET position = 0, building_table = NULL, building_position = 0 "
    "WHERE name = ?"
)
DELETE_ROWS = "DELETE FROM {table}"
CREATE_ROWS = (
    "CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, state {blob} NOT NULL, "
    "position BIGINT NOT NULL)"
)
UPSERT_ROW = (
    "INSERT INTO {table} (key, state, position) VALUES (?, ?, ?) ON CONFLICT (key) "
    "DO UPDATE SET state = excluded.state, position = excluded.position"
)
SELECT_ROWS = "SELECT key, state FROM {table} WHERE key IN ({marks})"
SELECT_ALL_ROWS = "SELECT key, state FROM {table} WHERE key > ? ORDER BY key LIMIT ?"
DROP_ROWS = "DROP TABLE IF EXISTS {table}"
REGISTRY = "ares_projections"
SQLITE_HAS_TABLE = "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?"
PG_HAS_TABLE = "SELECT to_regclass(%s) IS NOT NULL"


@dataclass(frozen=True, slots=True)
class ProjectionMeta:
    """Registry row of one projection."""

    name: str
    projection_version: int
    active_table: str | None
    position: int
    building_table: str | None
    building_position: int
    generation: int


def table_name(name: str, generation: int) -> str:
    """A safe SQL identifier for a projection's generation table, distinct for every
    distinct name: a readable part (lowercase, ``[a-z0-9_]``) plus the first 8 hex digits
    of blake3 of the exact name, so ``inj-x`` / ``inj_x`` or ``Agent`` / ``agent`` never
    share a table. (Tables made before this rule keep their recorded names.)"""
    safe = _SAFE.sub("_", name.lower())[:32]
    tag = blake3.blake3(name.encode("utf-8")).hexdigest()[:8]
    return f"ares_rm_{safe}_{tag}_{generation}"


class ReadModelTables(Protocol):
    """Storage for read models (memory, SQLite or PostgreSQL)."""

    def meta(self, name: str) -> ProjectionMeta | None:
        """The registry row, or None."""
        ...

    def put_meta(self, meta: ProjectionMeta) -> None:
        """Create the registry row unless one exists (its own transaction)."""
        ...

    def start_building(self, name: str, table: str, generation: int) -> None:
        """Point the registry's building slot at a fresh table, cursor 0."""
        ...

    def swap(self, name: str, table: str, position: int, projection_version: int) -> bool:
        """Make the building table live, if it is still ``table`` at ``position``."""
        ...

    def create(self, table: str) -> None:
        """Create an empty generation table."""
        ...

    def drop(self, table: str) -> None:
        """Drop a generation table."""
        ...

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        """States of ``keys`` that exist."""
        ...

    def commit(
        self,
        table: str,
        rows: Mapping[str, tuple[bytes, int]],
        name: str,
        cursor: str,
        expected: int,
        new: int,
    ) -> bool:
        """Upsert rows and move the ``cursor`` ("live", "building" or "none") from
        ``expected`` to ``new``, in ONE transaction. Returns False (nothing written) when
        the registry no longer says ``table`` at ``expected``."""
        ...

    def scan(self, table: str) -> Iterator[tuple[str, Any]]:
        """Every (key, state), ordered by key, paged."""
        ...

    def names(self) -> list[str]:
        """Every projection in the registry."""
        ...

    def reset(self, name: str) -> bool:
        """Empty the projection's tables and rewind its cursor to 0, in one transaction
        (the next runner pass folds the log again). False when it is not registered."""
        ...


class _Conflict(Exception):
    """Internal: the registry moved under a writer; roll its transaction back."""


class MemoryTables:
    """Read models of a ``memory://`` store (in process)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._meta: dict[str, ProjectionMeta] = {}
        self._tables: dict[str, dict[str, tuple[bytes, int]]] = {}

    def meta(self, name: str) -> ProjectionMeta | None:
        """The registry row, or None."""
        with self._lock:
            return self._meta.get(name)

    def put_meta(self, meta: ProjectionMeta) -> None:
        """Create the registry row unless one exists."""
        with self._lock:
            self._meta.setdefault(meta.name, meta)

    def start_building(self, name: str, table: str, generation: int) -> None:
        """Point the building slot at ``table``."""
        with self._lock:
            m = self._meta[name]
            self._meta[name] = replace(
                m, building_table=table, building_position=0, generation=generation
            )

    def swap(self, name: str, table: str, position: int, projection_version: int) -> bool:
        """Make the building table live (compare-and-set)."""
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
        """Create an empty table."""
        with self._lock:
            self._tables.setdefault(table, {})

    def drop(self, table: str) -> None:
        """Drop a table."""
        with self._lock:
            self._tables.pop(table, None)

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        """States of ``keys``."""
        with self._lock:
            t = self._tables.get(table, {})
            return {k: orjson.loads(t[k][0]) for k in keys if k in t}

    def commit(
        self,
        table: str,
        rows: Mapping[str, tuple[bytes, int]],
        name: str,
        cursor: str,
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
            self._tables.setdefault(table, {}).update(rows)
            return True

    def scan(self, table: str) -> Iterator[tuple[str, Any]]:
        """Every row by key."""
        with self._lock:
            items = sorted(self._tables.get(table, {}).items())
        for k, (s, _) in items:
            yield k, orjson.loads(s)

    def names(self) -> list[str]:
        """Every registered projection."""
        with self._lock:
            return sorted(self._meta)

    def reset(self, name: str) -> bool:
        """Empty the tables, rewind the cursor (atomic under the lock)."""
        with self._lock:
            m = self._meta.get(name)
            if m is None:
                return False
            for t in (m.active_table, m.building_table):
                if t is not None and t in self._tables:
                    self._tables[t] = {}
            self._meta[name] = replace(m, position=0, building_table=None, building_position=0)
            return True

    def raw(self, table: str) -> dict[str, tuple[bytes, int]]:
        """The backing dict (tests)."""
        return self._tables.setdefault(table, {})


class SQLTables:
    """Read models in SQLite or PostgreSQL, next to the events."""

    def __init__(self, recorder: Any, dialect: str) -> None:
        self.recorder = recorder
        self.dialect = dialect
        self._blob = "BLOB" if dialect == "sqlite" else "BYTEA"
        # PostgreSQL tables live in the store's schema (identifiers quoted).
        schema = getattr(recorder, "schema", None)
        self._prefix = (
            ""
            if dialect == "sqlite" or not schema
            else '"{}".'.format(str(schema).replace('"', '""'))
        )
        self._ready = False

    def _name(self, table: str) -> str:
        return f"{self._prefix}{table}"

    def _sql(self, sql: str) -> str:
        if self.dialect == "sqlite":
            return sql
        return sql.replace("?", "%s").replace(
            " ares_projections", f" {self._prefix}ares_projections"
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[Any]:
        """A write transaction (a read-only store refuses it: StoreError)."""
        if self.dialect == "sqlite":
            with self.recorder.transaction() as conn:
                yield conn
        else:
            with self.recorder.connection() as conn, conn.transaction():
                yield conn

    @contextlib.contextmanager
    def _read(self) -> Iterator[Any]:
        """A read transaction: on SQLite no write lock, and possible on a read-only store."""
        if self.dialect == "sqlite":
            with self.recorder.reading() as conn:
                yield conn
        else:
            with self.recorder.connection() as conn, conn.transaction():
                yield conn

    def has_table(self, table: str) -> bool:
        """Whether ``table`` exists (readers ask; only writers create)."""
        with self._read() as c:
            if self.dialect == "sqlite":
                return bool(c.execute(SQLITE_HAS_TABLE, (table,)).fetchone()[0])
            return bool(c.execute(PG_HAS_TABLE, (self._name(table),)).fetchone()[0])

    def _exec(self, conn: Any, sql: str, args: tuple[Any, ...] = ()) -> Any:
        return conn.execute(self._sql(sql), args)

    def _ddl(self, c: Any) -> None:
        # PostgreSQL's CREATE TABLE IF NOT EXISTS is not safe against itself (two sessions
        # can both pass the check and one fails on pg_type): serialize DDL per schema.
        if self.dialect != "sqlite":
            c.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"ares-events:read-models:{self._prefix}",),
            )

    def _registry(self) -> bool:
        """Whether the registry exists (remembered once it does: it is never dropped)."""
        if not self._ready:
            self._ready = self.has_table(REGISTRY)
        return self._ready

    def meta(self, name: str) -> ProjectionMeta | None:
        """The registry row, or None (also when nothing was ever registered)."""
        if not self._registry():
            return None
        with self._read() as c:
            row = self._exec(c, SELECT_META, (name,)).fetchone()
        return ProjectionMeta(*row) if row else None

    def put_meta(self, meta: ProjectionMeta) -> None:
        """Create the registry row unless one exists (and the registry on first use)."""
        if not self._registry():
            with self._tx() as c:
                self._ddl(c)
                self._exec(c, CREATE_REGISTRY)
            self._ready = True
        with self._tx() as c:
            self._exec(c, INSERT_META, _meta_args(meta))

    def start_building(self, name: str, table: str, generation: int) -> None:
        """Point the building slot at ``table``."""
        with self._tx() as c:
            self._exec(c, START_BUILDING, (table, generation, name))

    def swap(self, name: str, table: str, position: int, projection_version: int) -> bool:
        """Make the building table live (compare-and-set)."""
        with self._tx() as c:
            cur = self._exec(c, SWAP, (projection_version, name, table, position))
            return bool(cur.rowcount == 1)

    def create(self, table: str) -> None:
        """Create a generation table."""
        with self._tx() as c:
            self._ddl(c)
            self._exec(c, CREATE_ROWS.format(table=self._name(table), blob=self._blob))

    def drop(self, table: str) -> None:
        """Drop a generation table."""
        with self._tx() as c:
            self._ddl(c)
            self._exec(c, DROP_ROWS.format(table=self._name(table)))

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        """States of ``keys`` (chunked IN lists)."""
        out: dict[str, Any] = {}
        with self._read() as c:
            for i in range(0, len(keys), 500):
                chunk = keys[i : i + 500]
                sql = SELECT_ROWS.format(table=self._name(table), marks=",".join("?" * len(chunk)))
                for k, s in self._exec(c, sql, tuple(chunk)).fetchall():
                    out[k] = orjson.loads(bytes(s))
        return out

    def commit(
        self,
        table: str,
        rows: Mapping[str, tuple[bytes, int]],
        name: str,
        cursor: str,
        expected: int,
        new: int,
    ) -> bool:
        """Rows and the cursor move in one transaction (compare-and-set)."""
        sql = self._sql(UPSERT_ROW.format(table=self._name(table)))
        try:
            with self._tx() as c:
                if cursor != "none":
                    move = ADVANCE_LIVE if cursor == "live" else ADVANCE_BUILDING
                    if self._exec(c, move, (new, name, table, expected)).rowcount != 1:
                        raise _Conflict
                if rows:
                    args = [(k, s, p) for k, (s, p) in rows.items()]
                    if self.dialect == "sqlite":
                        c.executemany(sql, args)
                    else:
                        with c.cursor() as cur:
                            cur.executemany(sql, args)
        except _Conflict:
            return False
        return True

    def scan(self, table: str) -> Iterator[tuple[str, Any]]:
        """Every row by key, 1000 at a time."""
        after = ""
        while True:
            with self._read() as c:
                rows = self._exec(
                    c, SELECT_ALL_ROWS.format(table=self._name(table)), (after, 1000)
                ).fetchall()
            for k, s in rows:
                yield k, orjson.loads(bytes(s))
            if len(rows) < 1000:
                return
            after = rows[-1][0]

    def names(self) -> list[str]:
        """Every registered projection."""
        if not self._registry():
            return []
        with self._read() as c:
            return [str(r[0]) for r in self._exec(c, SELECT_NAMES).fetchall()]

    def reset(self, name: str) -> bool:
        """Empty the tables and rewind the cursor, in one transaction."""
        if not self._registry():
            return False
        with self._tx() as c:
            # Lock the registry row first (SQLite's write transaction already holds the
            # database): a runner's commit then either precedes the reset entirely (its
            # rows are deleted) or fails its compare-and-set after it.
            lock = SELECT_META if self.dialect == "sqlite" else SELECT_META + " FOR UPDATE"
            row = self._exec(c, lock, (name,)).fetchone()
            if row is None:
                return False
            meta = ProjectionMeta(*row)
            for t in (meta.active_table, meta.building_table):
                if t is not None:
                    self._exec(c, DELETE_ROWS.format(table=self._name(t)))
            self._exec(c, RESET, (name,))
        return True

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> None:
        """Run one statement in its own transaction (tests and repairs)."""
        with self._tx() as c:
            self._exec(c, sql, args)

    # Helpers for other tables kept beside the read models (the log's checkpoints).

    def qualified(self, table: str) -> str:
        """``table`` as it is named in SQL (schema-qualified on PostgreSQL)."""
        return self._name(table)

    @contextlib.contextmanager
    def transaction(self, *, ddl: bool = False, read: bool = False) -> Iterator[Any]:
        """One transaction on the events' database (``ddl``: serialized with the other
        schema changes of this store, as PostgreSQL needs; ``read``: a read transaction,
        which a read-only store allows).

        Raises:
            StoreError: a write transaction on a store opened read-only.
        """
        if read:
            with self._read() as c:
                yield c
            return
        with self._tx() as c:
            if ddl:
                self._ddl(c)
            yield c

    def run(self, conn: Any, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """Execute ``sql`` (``?`` placeholders, translated for PostgreSQL) on ``conn``."""
        return self._exec(conn, sql, args)


def _meta_args(m: ProjectionMeta) -> tuple[Any, ...]:
    return (
        m.name,
        m.projection_version,
        m.active_table,
        m.position,
        m.building_table,
        m.building_position,
        m.generation,
    )


def encode_state(state: Any) -> bytes:
    """Canonical JSON of a projection state."""
    return canonical_json(state, field="projection state")


def tables_for(store: Any) -> ReadModelTables:
    """The read-model tables of ``store``'s backend (cached on the recorder).

    Raises:
        ConfigError: the backend has no read-model support.
    """
    rec = backend_of(store.recorder)
    # An asyncio recorder names the blocking recorder its read models live beside (read
    # models are folded by the blocking runner).
    companion = getattr(rec, "read_model_recorder", None)
    if callable(companion):
        rec = backend_of(companion())
    cached = getattr(rec, "_ares_read_models", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    scheme = rec.scheme[0]
    tables: ReadModelTables
    if scheme == "memory":
        data = rec._d
        tables = data.__dict__.setdefault("read_models", MemoryTables())
    elif scheme == "sqlite":
        tables = SQLTables(rec, "sqlite")
    elif scheme in ("postgresql", "postgres"):
        tables = SQLTables(rec, "postgres")
    else:
        raise ConfigError(f"store {store.url} has no read-model tables")
    try:
        object.__setattr__(rec, "_ares_read_models", tables)
    except (AttributeError, TypeError):
        pass
    return tables


def new_meta(name: str, projection_version: int) -> ProjectionMeta:
    """Registry row of a projection never run before."""
    return ProjectionMeta(name, projection_version, None, 0, None, 0, 0)
