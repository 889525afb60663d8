# Generated from snapshots_async.py by tools/async_to_sync.py: do not edit.
"""Snapshot rows of the PostgreSQL backend: the ``ares_snapshots`` table of the schema.

It may import the core, :mod:`ares_events.errors`, psycopg and this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final, Protocol

import psycopg

from ares_events.core.snapshot_format import Snapshot, SnapshotInfo, SnapshotRow, info_of, row_of
from ares_events.errors import StoreError, StoreUnavailable

if TYPE_CHECKING:
    from ares_events.stores.postgres.sql import Statements


class RecorderConnections(Protocol):
    """What the rows use of their recorder (typed by use, so the recorder, which hands
    the rows out, and this module do not import each other)."""

    sql: Statements

    def describe(self) -> str:
        """The store's URL, redacted."""
        ...

    def connection(self) -> contextlib.AbstractContextManager[Any]:
        """A pooled connection for the block."""
        ...


__all__ = ["LIST_PAGE", "PostgresSnapshotRows"]

LIST_PAGE: Final = 500
"""Snapshot rows per listing page."""


def _detail(exc: psycopg.Error) -> str:
    """The server's primary message (never the client-side text, which may hold a DSN)."""
    primary = exc.diag.message_primary if exc.diag is not None else None
    if primary:
        return f"{primary} (SQLSTATE {exc.sqlstate})" if exc.sqlstate else str(primary)
    return type(exc).__name__


class PostgresSnapshotRows:
    """The snapshot table's rows."""

    def __init__(self, recorder: RecorderConnections) -> None:
        self._recorder = recorder
        self._url = recorder.describe()
        self.sql = recorder.sql

    @contextlib.contextmanager
    def _txn(self, action: str, *, write: bool = True) -> Iterator[Any]:
        """One pooled connection (to write, in a transaction), its psycopg errors mapped."""
        try:
            with (
                self._recorder.connection() as conn,
                conn.transaction() if write else contextlib.nullcontext(),
            ):
                yield conn
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"{action} in {self._url} failed: {_detail(exc)}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"{action} in {self._url} failed: {_detail(exc)}") from exc

    def put(self, snap: Snapshot) -> None:
        """Insert or replace the row of the snapshot's stream and projection."""
        with self._txn(f"saving snapshot of stream {snap.stream_id!r}") as conn:
            conn.execute(self.sql.snapshot_upsert, (snap.stream_id, snap.projection, *row_of(snap)))

    def get(self, stream_id: str, projection: str) -> SnapshotRow | None:
        """The row of ``(stream_id, projection)``, or None."""
        with self._txn(f"loading snapshot of stream {stream_id!r}", write=False) as conn:
            cur = conn.execute(self.sql.snapshot_select, (stream_id, projection))
            row = cur.fetchone()
        return None if row is None else tuple(row)

    def remove(self, stream_id: str, projection: str | None) -> int:
        """Delete one row, or every row of the stream; return how many."""
        with self._txn(f"deleting snapshots of stream {stream_id!r}") as conn:
            if projection is None:
                cur = conn.execute(self.sql.snapshot_delete_stream, (stream_id,))
            else:
                cur = conn.execute(self.sql.snapshot_delete_one, (stream_id, projection))
            return int(cur.rowcount)

    def infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        """Every row's description, keyset-paged by stream and projection."""
        query = self.sql.snapshot_list_all if stream_id is None else self.sql.snapshot_list_stream
        # Listing one stream, every row's stream id is ``stream_id``: the cursor stays on it.
        after_sid, after_proj = stream_id or "", ""
        while True:
            with self._txn("listing snapshots", write=False) as conn:
                cur = conn.execute(query, (after_sid, after_proj, LIST_PAGE))
                rows = cur.fetchall()
            for r in rows:
                yield info_of(r)
            if len(rows) < LIST_PAGE:
                return
            after_sid, after_proj = rows[-1][0], rows[-1][1]
