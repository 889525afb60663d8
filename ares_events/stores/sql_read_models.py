"""Read models and signed checkpoints in SQLite or PostgreSQL, next to the events
(:class:`SQLReadModels`, given its transactions and :class:`Dialect` by the backend).

It may import the core.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Mapping
from dataclasses import astuple, dataclass, replace
from typing import Any, Final

import orjson

from ares_events.core.events import utc_now_at
from ares_events.core.read_models import Cursor, ProjectionMeta
from ares_events.errors import StoreError, StoreUnavailable

__all__ = [
    "POSTGRES",
    "SQLITE",
    "Dialect",
    "SQLCheckpoints",
    "SQLReadModels",
    "postgres_read_models",
]

Tx = Callable[[], contextlib.AbstractContextManager[Any]]
"""A transaction on the events' database: the block gets a connection."""

REGISTRY: Final = "ares_projections"
CHECKPOINTS: Final = "ares_checkpoints"
# Statements name their tables {r} (registry), {t} (a generation or the checkpoint table)
# and {b} (the binary type); "?" becomes the dialect's placeholder.
CREATE_REGISTRY: Final = """CREATE TABLE IF NOT EXISTS {r} (
    name TEXT PRIMARY KEY,
    projection_version INTEGER NOT NULL,
    active_table TEXT,
    position BIGINT NOT NULL,
    building_table TEXT,
    building_position BIGINT NOT NULL,
    generation INTEGER NOT NULL
)"""
SELECT_META: Final = (
    "SELECT name, projection_version, active_table, position, building_table, "
    "building_position, generation FROM {r} WHERE name = ?"
)
INSERT_META: Final = (
    "INSERT INTO {r} (name, projection_version, active_table, position, "
    "building_table, building_position, generation) VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (name) DO NOTHING"
)
# Cursor moves are compare-and-set: a writer that read a stale registry row (a runner
# racing a rebuild, two runners) changes nothing and its transaction rolls back.
ADVANCE_LIVE: Final = (
    "UPDATE {r} SET position = ? WHERE name = ? AND active_table = ? AND position = ?"
)
ADVANCE_BUILDING: Final = (
    "UPDATE {r} SET building_position = ? "
    "WHERE name = ? AND building_table = ? AND building_position = ?"
)
# Claiming the building slot is a compare-and-set too: of two rebuilds that read the same
# row only one claims the next generation, and the other never touches its table.
START_BUILDING: Final = (
    "UPDATE {r} SET building_table = ?, building_position = 0, generation = ? "
    "WHERE name = ? AND generation = ? AND COALESCE(building_table, '') = ?"
)
SWAP: Final = (
    "UPDATE {r} SET active_table = building_table, position = building_position, "
    "building_table = NULL, building_position = 0, projection_version = ? "
    "WHERE name = ? AND building_table = ? AND building_position = ?"
)
SELECT_NAMES: Final = "SELECT name FROM {r} ORDER BY name"
# A reset (after an erasure) keeps the tables but empties them and rewinds the cursor: a
# runner that read the registry before it fails its compare-and-set and starts again.
RESET: Final = (
    "UPDATE {r} SET position = 0, building_table = NULL, building_position = 0 WHERE name = ?"
)
DELETE_ROWS: Final = "DELETE FROM {t}"
CREATE_ROWS: Final = (
    "CREATE TABLE IF NOT EXISTS {t} (key TEXT PRIMARY KEY, state {b} NOT NULL, "
    "position BIGINT NOT NULL)"
)
UPSERT_ROW: Final = (
    "INSERT INTO {t} (key, state, position) VALUES (?, ?, ?) ON CONFLICT (key) "
    "DO UPDATE SET state = excluded.state, position = excluded.position"
)
SELECT_ROWS: Final = "SELECT key, state FROM {t} WHERE key IN ({marks})"
SELECT_ALL_ROWS: Final = "SELECT key, state FROM {t} WHERE key > ? ORDER BY key LIMIT ?"
DROP_ROWS: Final = "DROP TABLE IF EXISTS {t}"
CREATE_CHECKPOINTS: Final = (
    "CREATE TABLE IF NOT EXISTS {t} (origin TEXT NOT NULL, tree_size BIGINT NOT NULL, "
    "root {b} NOT NULL, note TEXT NOT NULL, created_at TEXT NOT NULL, "
    "PRIMARY KEY (origin, tree_size))"
)
INSERT_CHECKPOINT: Final = (
    "INSERT INTO {t} (origin, tree_size, root, note, created_at) VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (origin, tree_size) DO NOTHING"
)
SELECT_NEWEST: Final = (
    "SELECT origin, tree_size, root, note, created_at FROM {t} "
    "ORDER BY tree_size DESC, origin LIMIT ?"
)
SELECT_AT: Final = "SELECT note FROM {t} WHERE tree_size = ? ORDER BY origin LIMIT 1"
SELECT_ORIGIN: Final = "SELECT origin FROM {t} ORDER BY tree_size LIMIT 1"
SELECT_CHECKPOINTS: Final = (
    "SELECT origin, tree_size, root, note, created_at FROM {t} "
    "WHERE tree_size > ? ORDER BY tree_size, origin LIMIT ?"
)
PAGE: Final = 1000


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the two SQL backends."""

    blob: str
    mark: str
    has_table: str
    """One parameter, the qualified table name; one row whose first column is true
    when the table exists."""
    ddl_lock: str | None
    """Taken before DDL, one parameter (the schema prefix)."""
    for_update: str
    snapshot: str | None
    """Run first in a read transaction to make all its reads one snapshot (None: the
    backend's read transaction is one already)."""
    schema: str | None = None

    def qualified(self, table: str) -> str:
        """``table`` as SQL names it (schema-qualified on PostgreSQL)."""
        if self.schema is None:
            return table
        return '"{}".{}'.format(self.schema.replace('"', '""'), table)


SQLITE: Final = Dialect(
    blob="BLOB",
    mark="?",
    has_table="SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?",
    ddl_lock=None,
    for_update="",
    # A deferred transaction on a WAL file reads one snapshot from its first read (an
    # in-memory database is serialized in-process for the whole transaction).
    snapshot=None,
)
POSTGRES: Final = Dialect(
    blob="BYTEA",
    mark="%s",
    has_table="SELECT to_regclass(%s) IS NOT NULL",
    # CREATE TABLE IF NOT EXISTS is not safe against itself on PostgreSQL (two sessions
    # can both pass the check and one fails on pg_type): serialize DDL per schema.
    ddl_lock="SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
    for_update=" FOR UPDATE",
    # READ COMMITTED gives each statement its own snapshot; the registry row and the
    # pages of a table read after it must come from the same one.
    snapshot="SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
)
"""The PostgreSQL dialect without a schema (``dataclasses.replace(POSTGRES, schema=...)``)."""


class _Conflict(Exception):
    """Internal: the registry moved under a writer; roll its transaction back."""


def _mapped(tx: Tx, what: str) -> Tx:
    """``tx`` with SQLite's driver errors made the store's (PostgreSQL's transactions map
    theirs already, so only SQLite's arrive here)."""

    @contextlib.contextmanager
    def mapped() -> Iterator[Any]:
        try:
            with tx() as c:
                yield c
        except sqlite3.Error as exc:
            # SQLITE_ERROR is the file's content (a table the registry names is missing):
            # retrying cannot help. Busy, locked, I/O, full or interrupted may pass.
            code = getattr(exc, "sqlite_errorcode", 0) & 0xFF  # an extended code's primary
            lost = isinstance(exc, sqlite3.OperationalError) and code != sqlite3.SQLITE_ERROR
            raise (StoreUnavailable if lost else StoreError)(f"{what} failed: {exc}") from exc

    return mapped


def _state(table: str, key: Any, raw: Any) -> Any:
    """A row's state, which the runner wrote as canonical JSON."""
    try:
        return orjson.loads(bytes(raw))
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise StoreError(
            f"read-model row {key!r:.80} of table {table} is damaged (its state is not "
            f"JSON: {exc}); rebuild the read model it belongs to (`ares-events rebuild`)"
        ) from exc


class SQLCheckpoints:
    """The signed checkpoints of the Merkle log in ``ares_checkpoints``
    (:class:`~ares_events.core.read_models.CheckpointStore`)."""

    def __init__(self, models: SQLReadModels) -> None:
        self._m = models

    def _rows(self, template: str, args: tuple[Any, ...]) -> list[Any]:
        return self._m._fetch(template, args, CHECKPOINTS, needs=CHECKPOINTS)

    def put(self, origin: str, size: int, root: bytes, note: str) -> None:
        self._m._ensure(CHECKPOINTS, CREATE_CHECKPOINTS)
        self._m._run(INSERT_CHECKPOINT, (origin, size, root, note, utc_now_at()), CHECKPOINTS)

    def at_size(self, size: int) -> str | None:
        rows = self._rows(SELECT_AT, (size,))
        return str(rows[0][0]) if rows else None

    def origin(self) -> str | None:
        rows = self._rows(SELECT_ORIGIN, ())
        return str(rows[0][0]) if rows else None

    def newest(self, limit: int) -> list[tuple[str, int, bytes, str, str]]:
        rows = self._rows(SELECT_NEWEST, (limit,))
        return [(str(o), int(n), bytes(r), str(t), str(at)) for o, n, r, t, at in rows]

    def all(self) -> list[tuple[str, int, bytes, str, str]]:
        """Every row by size, paged."""
        out: list[tuple[str, int, bytes, str, str]] = []
        while True:
            rows = self._rows(SELECT_CHECKPOINTS, (out[-1][1] if out else -1, PAGE))
            out.extend((str(o), int(n), bytes(r), str(t), str(at)) for o, n, r, t, at in rows)
            if len(rows) < PAGE:
                return out


class SQLReadModels:
    """Read models in SQLite or PostgreSQL (:class:`~ares_events.core.read_models.ReadModels`).

    Args:
        write: a write transaction (a read-only store refuses it: StoreError).
        read: a read transaction (allowed on a read-only store).
        dialect: :data:`SQLITE`, or :data:`POSTGRES` with the store's schema.
    """

    def __init__(self, write: Tx, read: Tx, dialect: Dialect) -> None:
        self._write = _mapped(write, "a read-model transaction")
        self._read = _mapped(read, "a read-model read")
        self.dialect = dialect
        self._exists: set[str] = set()  # tables seen to exist (the registry is never dropped)
        self.checkpoints = SQLCheckpoints(self)

    def _sql(self, template: str, table: str = "", **more: str) -> str:
        d = self.dialect
        text = template.format(r=d.qualified(REGISTRY), t=d.qualified(table), b=d.blob, **more)
        return text.replace("?", d.mark)

    def _has(self, table: str) -> bool:
        """Whether ``table`` exists (remembered once it does)."""
        d = self.dialect
        if table not in self._exists:
            with self._read() as c:
                if c.execute(d.has_table, (d.qualified(table),)).fetchone()[0]:
                    self._exists.add(table)
        return table in self._exists

    @contextlib.contextmanager
    def _ddl(self) -> Iterator[Any]:
        """A write transaction serialized with the other schema changes of the store."""
        d = self.dialect
        with self._write() as c:
            if d.ddl_lock is not None:
                c.execute(d.ddl_lock, (f"ares-events:read-models:{d.qualified('')}",))
            yield c

    def _fetch(
        self, template: str, args: tuple[Any, ...] = (), table: str = "", needs: str = ""
    ) -> list[Any]:
        """Every row of one read statement; none when table ``needs`` does not exist."""
        if needs and not self._has(needs):
            return []
        with self._read() as c:
            return list(c.execute(self._sql(template, table), args).fetchall())

    def _run(self, template: str, args: tuple[Any, ...] = (), table: str = "") -> Any:
        with self._write() as c:
            return c.execute(self._sql(template, table), args)

    def _ensure(self, table: str, create: str) -> None:
        if not self._has(table):
            with self._ddl() as c:
                c.execute(self._sql(create, table))
            self._exists.add(table)

    def meta(self, name: str) -> ProjectionMeta | None:
        rows = self._fetch(SELECT_META, (name,), needs=REGISTRY)
        return ProjectionMeta.from_row(rows[0]) if rows else None

    def put_meta(self, meta: ProjectionMeta) -> None:
        """Create the registry row unless one exists (and the registry on first use)."""
        self._ensure(REGISTRY, CREATE_REGISTRY)
        self._run(INSERT_META, astuple(meta))

    def start_building(self, name: str, table: str, seen: ProjectionMeta) -> bool:
        args = (table, seen.generation + 1, name, seen.generation, seen.building_table or "")
        return bool(self._run(START_BUILDING, args).rowcount == 1)

    def swap(self, name: str, table: str, position: int, projection_version: int) -> bool:
        return bool(self._run(SWAP, (projection_version, name, table, position)).rowcount == 1)

    def create(self, table: str) -> None:
        with self._ddl() as c:
            c.execute(self._sql(CREATE_ROWS, table))

    def drop(self, table: str) -> None:
        with self._ddl() as c:
            c.execute(self._sql(DROP_ROWS, table))

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        """States of ``keys`` (chunked IN lists)."""
        out: dict[str, Any] = {}
        with self._read() as c:
            for i in range(0, len(keys), 500):
                chunk = tuple(keys[i : i + 500])
                sql = self._sql(SELECT_ROWS, table, marks=",".join("?" * len(chunk)))
                for k, s in c.execute(sql, chunk).fetchall():
                    out[k] = _state(table, k, s)
        return out

    def commit(
        self,
        table: str,
        rows: Mapping[str, tuple[bytes, int]],
        name: str,
        cursor: Cursor,
        expected: int,
        new: int,
    ) -> bool:
        """Rows and the cursor move in one transaction (compare-and-set)."""
        try:
            with self._write() as c:
                if cursor != "none":
                    move = self._sql(ADVANCE_LIVE if cursor == "live" else ADVANCE_BUILDING)
                    if c.execute(move, (new, name, table, expected)).rowcount != 1:
                        raise _Conflict
                if rows:
                    c.cursor().executemany(
                        self._sql(UPSERT_ROW, table), [(k, s, p) for k, (s, p) in rows.items()]
                    )
        except _Conflict:
            return False
        return True

    def scan(self, table: str) -> Iterator[tuple[str, Any]]:
        """Every row by key, a page at a time."""
        after = ""
        while True:
            rows = self._fetch(SELECT_ALL_ROWS, (after, PAGE), table)
            for k, s in rows:
                yield k, _state(table, k, s)
            if len(rows) < PAGE:
                return
            after = rows[-1][0]

    def read_live(self, name: str) -> tuple[ProjectionMeta, dict[str, Any]] | None:
        """The registry row and its live table's rows, paged, in one read transaction
        that is one snapshot (:attr:`Dialect.snapshot`)."""
        if not self._has(REGISTRY):
            return None
        with self._read() as c:
            if self.dialect.snapshot is not None:
                c.execute(self.dialect.snapshot)
            row = c.execute(self._sql(SELECT_META), (name,)).fetchone()
            meta = None if row is None else ProjectionMeta.from_row(row)
            if meta is None or meta.active_table is None:
                return None
            table = meta.active_table
            page = self._sql(SELECT_ALL_ROWS, table)
            out: dict[str, Any] = {}
            after = ""
            while True:
                rows = c.execute(page, (after, PAGE)).fetchall()
                out.update((k, _state(table, k, s)) for k, s in rows)
                if len(rows) < PAGE:
                    return meta, out
                after = rows[-1][0]

    def names(self) -> list[str]:
        rows = self._fetch(SELECT_NAMES, needs=REGISTRY)
        return [str(r[0]) for r in rows]

    def reset(self, name: str) -> bool:
        """Empty the tables and rewind the cursor, in one transaction."""
        if not self._has(REGISTRY):
            return False
        with self._write() as c:
            # Lock the registry row first (SQLite's write transaction already holds the
            # database): a runner's commit then either precedes the reset entirely (its
            # rows are deleted) or fails its compare-and-set after it.
            lock = self._sql(SELECT_META + self.dialect.for_update)
            row = c.execute(lock, (name,)).fetchone()
            if row is None:
                return False
            meta = ProjectionMeta.from_row(row)  # never DELETE FROM a table it should not name
            for t in (meta.active_table, meta.building_table):
                if t is not None:
                    c.execute(self._sql(DELETE_ROWS, t))
            c.execute(self._sql(RESET), (name,))
        return True


def postgres_read_models(recorder: Any) -> SQLReadModels:
    """The read models of a blocking PostgreSQL recorder, in its schema: every operation
    one transaction on a pooled connection (``recorder.connection()``)."""

    @contextlib.contextmanager
    def tx() -> Iterator[Any]:
        # Driver errors become the store's (a lost server is StoreUnavailable), as on
        # every other path of the recorder.
        with (
            recorder._translate_errors("a read-model transaction"),
            recorder.connection() as conn,
            conn.transaction(),
        ):
            yield conn

    return SQLReadModels(tx, tx, replace(POSTGRES, schema=recorder.schema))
