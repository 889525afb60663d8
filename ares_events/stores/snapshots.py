"""The built-in snapshot stores: memory, SQLite and PostgreSQL, beside the events.

Each backend recorder hands out its own from its ``snapshot_store(event_store)`` hook
(what ``EventStore.snapshots`` calls):

- memory: the recorder's ``snapshot_table`` dict (shared by every open of ``memory://NAME``);
- SQLite: the ``ares_snapshots`` table in the same file, on the recorder's per-thread
  connection, with ``BEGIN IMMEDIATE`` write transactions retried while the file is busy;
- PostgreSQL: the ``ares_snapshots`` table in the store's schema, through its pool.

The value types, the checks and :func:`snapshot_store_for` live in
:mod:`ares_events.core.snapshots` (re-exported here, where they were before). This module
may import the core and :mod:`ares_events.errors`; psycopg only inside the PostgreSQL store.
"""

from __future__ import annotations

import builtins
import contextlib
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import format_at, parse_at
from ares_events.core.snapshots import (
    Snapshot,
    SnapshotCheck,
    SnapshotInfo,
    SnapshotStore,
    _BaseSnapshotStore,
    _Row,
    make_snapshot,
    snapshot_store_for,
    state_digest,
)
from ares_events.errors import StoreError, StoreUnavailable

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.stores.sqlite import SQLiteRecorder

__all__ = [
    "MemorySnapshotStore",
    "PostgresSnapshotStore",
    "SQLiteSnapshotStore",
    "Snapshot",
    "SnapshotCheck",
    "SnapshotInfo",
    "SnapshotStore",
    "make_snapshot",
    "snapshot_store_for",
    "state_digest",
]

_LIST_PAGE: Final = 500

# -- SQL (SQLite: ? placeholders) ---------------------------------------------------------

SQLITE_UPSERT: Final = (
    "INSERT INTO ares_snapshots (stream_id, projection, projection_version, at_version, "
    "at_hash, state, state_digest, created_at, seal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (stream_id, projection) DO UPDATE SET "
    "projection_version = excluded.projection_version, at_version = excluded.at_version, "
    "at_hash = excluded.at_hash, state = excluded.state, "
    "state_digest = excluded.state_digest, created_at = excluded.created_at, "
    "seal = excluded.seal"
)
SQLITE_SELECT: Final = (
    "SELECT projection_version, at_version, at_hash, state, state_digest, created_at, seal "
    "FROM ares_snapshots WHERE stream_id = ? AND projection = ?"
)
SQLITE_DELETE_ONE: Final = "DELETE FROM ares_snapshots WHERE stream_id = ? AND projection = ?"
SQLITE_DELETE_STREAM: Final = "DELETE FROM ares_snapshots WHERE stream_id = ?"
_SQLITE_INFO_COLUMNS: Final = (
    "stream_id, projection, projection_version, at_version, at_hash, length(state), "
    "state_digest, created_at"
)
SQLITE_LIST_ALL: Final = (
    f"SELECT {_SQLITE_INFO_COLUMNS} FROM ares_snapshots "
    "WHERE stream_id > ? OR (stream_id = ? AND projection > ?) "
    "ORDER BY stream_id, projection LIMIT ?"
)
SQLITE_LIST_STREAM: Final = (
    f"SELECT {_SQLITE_INFO_COLUMNS} FROM ares_snapshots "
    "WHERE stream_id = ? AND projection > ? ORDER BY projection LIMIT ?"
)

# -- SQL (PostgreSQL: %s placeholders; {table} is the schema-qualified identifier) ---------

PG_UPSERT: Final = (
    "INSERT INTO {table} (stream_id, projection, projection_version, at_version, "
    "at_hash, state, state_digest, created_at, seal) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (stream_id, projection) DO UPDATE SET "
    "projection_version = excluded.projection_version, at_version = excluded.at_version, "
    "at_hash = excluded.at_hash, state = excluded.state, "
    "state_digest = excluded.state_digest, created_at = excluded.created_at, "
    "seal = excluded.seal"
)
PG_SELECT: Final = (
    "SELECT projection_version, at_version, at_hash, state, state_digest, created_at, seal "
    "FROM {table} WHERE stream_id = %s AND projection = %s"
)
PG_DELETE_ONE: Final = "DELETE FROM {table} WHERE stream_id = %s AND projection = %s"
PG_DELETE_STREAM: Final = "DELETE FROM {table} WHERE stream_id = %s"
_PG_INFO_COLUMNS: Final = (
    "stream_id, projection, projection_version, at_version, at_hash, octet_length(state), "
    "state_digest, created_at"
)
PG_LIST_ALL: Final = (
    "SELECT " + _PG_INFO_COLUMNS + " FROM {table} "
    'WHERE (stream_id COLLATE "C", projection COLLATE "C") > (%s, %s) '
    'ORDER BY stream_id COLLATE "C", projection COLLATE "C" LIMIT %s'
)
PG_LIST_STREAM: Final = (
    "SELECT " + _PG_INFO_COLUMNS + " FROM {table} "
    'WHERE stream_id = %s AND projection COLLATE "C" > %s '
    'ORDER BY projection COLLATE "C" LIMIT %s'
)


# -- memory ----------------------------------------------------------------------------------


class MemorySnapshotStore(_BaseSnapshotStore):
    """Snapshots in the memory recorder's ``snapshot_table`` (not durable).

    The table maps ``(stream_id, projection)`` to the same row the SQL backends store.
    """

    def __init__(
        self,
        store: EventStore,
        table: dict[tuple[str, str], Any],
        check_open: Any = None,
    ) -> None:
        super().__init__(store)
        self._table = table
        self._check_open = check_open or (lambda: None)

    def _put(self, snap: Snapshot) -> None:
        self._check_open()
        self._table[(snap.stream_id, snap.projection)] = _row_of(snap)

    def _get(self, stream_id: str, projection: str) -> _Row | None:
        self._check_open()
        row: _Row | None = self._table.get((stream_id, projection))
        return row

    def _remove(self, stream_id: str, projection: str | None) -> int:
        self._check_open()
        if projection is not None:
            return 1 if self._table.pop((stream_id, projection), None) is not None else 0
        keys = [k for k in builtins.list(self._table) if k[0] == stream_id]
        return sum(1 for k in keys if self._table.pop(k, None) is not None)

    def _infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        self._check_open()
        items = sorted(
            (k, v)
            for k, v in builtins.list(self._table.items())
            if stream_id is None or k[0] == stream_id
        )
        for (sid, proj), (pv, at_version, at_hash, state_json, digest, created, _) in items:
            yield _info_of((sid, proj, pv, at_version, at_hash, len(state_json), digest, created))


def _row_of(snap: Snapshot) -> _Row:
    return (
        snap.projection_version,
        snap.at_version,
        bytes(snap.at_hash),
        snap.state_json,
        bytes(snap.state_digest),
        format_at(snap.created_at),
        snap.seal,
    )


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def _info_of(row: tuple[Any, ...]) -> SnapshotInfo:
    """A listing row as a :class:`SnapshotInfo`; a malformed row (a tampered table) is an
    info with ``problem`` set instead of an exception, so audits go on."""
    try:
        if not (type(row[2]) is int and type(row[3]) is int):
            raise TypeError("projection_version and at_version must be integers")
        return SnapshotInfo(
            stream_id=str(row[0]),
            projection=str(row[1]),
            projection_version=row[2],
            at_version=row[3],
            at_hash=bytes(row[4]),
            state_size=int(row[5] or 0),
            state_digest=bytes(row[6]),
            created_at=parse_at(row[7]),
        )
    except (TypeError, ValueError) as exc:
        return SnapshotInfo(
            stream_id=str(row[0]),
            projection=str(row[1]),
            projection_version=-1,
            at_version=row[3] if type(row[3]) is int else 0,
            at_hash=b"",
            state_digest=b"",
            state_size=0,
            created_at=_EPOCH,
            problem=f"{type(exc).__name__}: {exc}",
        )


# -- SQLite ----------------------------------------------------------------------------------


class SQLiteSnapshotStore(_BaseSnapshotStore):
    """Snapshots in the ``ares_snapshots`` table of the events' SQLite file.

    Uses the recorder's per-thread connection and its transactions (``BEGIN IMMEDIATE``,
    busy retries up to the store's ``busy_timeout``, then :class:`StoreUnavailable`).
    """

    def __init__(self, store: EventStore, recorder: SQLiteRecorder) -> None:
        super().__init__(store)
        self._recorder = recorder

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        """Map sqlite3 errors to the store's error tree (one place)."""
        try:
            yield
        except sqlite3.OperationalError as exc:
            raise StoreUnavailable(
                f"{action} in {self._recorder.describe()} failed: {exc}"
            ) from exc
        except sqlite3.Error as exc:
            raise StoreError(f"{action} in {self._recorder.describe()} failed: {exc}") from exc

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._recorder.transaction() as conn:
            return int(conn.execute(sql, args).rowcount)

    def _query(self, sql: str, args: tuple[Any, ...]) -> builtins.list[Any]:
        return self._recorder.fetch(sql, args)

    def _put(self, snap: Snapshot) -> None:
        with self._errors(f"saving snapshot of stream {snap.stream_id!r}"):
            self._write(SQLITE_UPSERT, (snap.stream_id, snap.projection, *_row_of(snap)))

    def _get(self, stream_id: str, projection: str) -> _Row | None:
        with self._errors(f"loading snapshot of stream {stream_id!r}"):
            rows = self._query(SQLITE_SELECT, (stream_id, projection))
        if not rows:
            return None
        return tuple(rows[0])

    def _remove(self, stream_id: str, projection: str | None) -> int:
        with self._errors(f"deleting snapshots of stream {stream_id!r}"):
            if projection is None:
                return self._write(SQLITE_DELETE_STREAM, (stream_id,))
            return self._write(SQLITE_DELETE_ONE, (stream_id, projection))

    def _infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        after_sid, after_proj = "", ""
        while True:
            with self._errors("listing snapshots"):
                if stream_id is None:
                    rows = self._query(
                        SQLITE_LIST_ALL, (after_sid, after_sid, after_proj, _LIST_PAGE)
                    )
                else:
                    rows = self._query(SQLITE_LIST_STREAM, (stream_id, after_proj, _LIST_PAGE))
            for r in rows:
                yield _info_of(r)
            if len(rows) < _LIST_PAGE:
                return
            after_sid, after_proj = rows[-1][0], rows[-1][1]


# -- PostgreSQL ------------------------------------------------------------------------------


class PostgresSnapshotStore(_BaseSnapshotStore):
    """Snapshots in the ``ares_snapshots`` table of the store's PostgreSQL schema.

    Each operation borrows a pooled connection from the recorder for one short
    transaction. The table is created by the recorder's migrations.
    """

    def __init__(self, store: EventStore, recorder: Any) -> None:
        super().__init__(store)
        from psycopg import sql

        self._recorder = recorder
        table = sql.Identifier(str(recorder.schema), "ares_snapshots")
        self._sql = {
            name: sql.SQL(text).format(table=table)
            for name, text in (
                ("upsert", PG_UPSERT),
                ("select", PG_SELECT),
                ("delete_one", PG_DELETE_ONE),
                ("delete_stream", PG_DELETE_STREAM),
                ("list_all", PG_LIST_ALL),
                ("list_stream", PG_LIST_STREAM),
            )
        }

    @contextlib.contextmanager
    def _txn(self, action: str, *, write: bool = True) -> Iterator[Any]:
        """One pooled connection (and, to write, a transaction); maps psycopg errors in
        one place. A read is a single autocommit statement: no BEGIN/COMMIT round trips."""
        import psycopg

        try:
            with self._recorder.connection() as conn:
                if write:
                    with conn.transaction():
                        yield conn
                else:
                    yield conn
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(
                f"{action} in {self._store.url} failed: {_pg_detail(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"{action} in {self._store.url} failed: {_pg_detail(exc)}") from exc

    def _put(self, snap: Snapshot) -> None:
        with self._txn(f"saving snapshot of stream {snap.stream_id!r}") as conn:
            conn.execute(self._sql["upsert"], (snap.stream_id, snap.projection, *_row_of(snap)))

    def _get(self, stream_id: str, projection: str) -> _Row | None:
        with self._txn(f"loading snapshot of stream {stream_id!r}", write=False) as conn:
            row = conn.execute(self._sql["select"], (stream_id, projection)).fetchone()
        if row is None:
            return None
        return tuple(row)

    def _remove(self, stream_id: str, projection: str | None) -> int:
        with self._txn(f"deleting snapshots of stream {stream_id!r}") as conn:
            if projection is None:
                cur = conn.execute(self._sql["delete_stream"], (stream_id,))
            else:
                cur = conn.execute(self._sql["delete_one"], (stream_id, projection))
            return int(cur.rowcount)

    def _infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        after_sid, after_proj = "", ""
        while True:
            with self._txn("listing snapshots", write=False) as conn:
                if stream_id is None:
                    rows = conn.execute(
                        self._sql["list_all"], (after_sid, after_proj, _LIST_PAGE)
                    ).fetchall()
                else:
                    rows = conn.execute(
                        self._sql["list_stream"], (stream_id, after_proj, _LIST_PAGE)
                    ).fetchall()
            for r in rows:
                yield _info_of(r)
            if len(rows) < _LIST_PAGE:
                return
            after_sid, after_proj = rows[-1][0], rows[-1][1]


def _pg_detail(exc: Any) -> str:
    """The server's primary message (never the client-side text, which may hold a DSN)."""
    diag = getattr(exc, "diag", None)
    primary = getattr(diag, "message_primary", None)
    sqlstate = getattr(exc, "sqlstate", None)
    if primary:
        return f"{primary} (SQLSTATE {sqlstate})" if sqlstate else str(primary)
    return type(exc).__name__
