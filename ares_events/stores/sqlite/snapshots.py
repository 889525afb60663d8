"""Snapshot rows of the SQLite backend: the ``ares_snapshots`` table in the events' file.

It may import the core, :mod:`ares_events.errors` and this package.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any, Final, Protocol

from ares_events.core.snapshot_format import Snapshot, SnapshotInfo, SnapshotRow, info_of, row_of
from ares_events.errors import StoreError, StoreUnavailable
from ares_events.stores.sqlite.sql import (
    SQLITE_DELETE_ONE,
    SQLITE_DELETE_STREAM,
    SQLITE_LIST_ALL,
    SQLITE_LIST_STREAM,
    SQLITE_SELECT,
    SQLITE_UPSERT,
)


class _Recorder(Protocol):
    """What the rows use of their recorder, typed by use: importing it would be a cycle."""

    def describe(self) -> str: ...
    def transaction(self) -> contextlib.AbstractContextManager[sqlite3.Connection]: ...
    def fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]: ...


__all__ = ["SQLiteSnapshotRows"]

LIST_PAGE: Final = 500
"""Snapshot rows per listing page."""


class SQLiteSnapshotRows:
    """The snapshot table's rows."""

    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = recorder

    @contextlib.contextmanager
    def _errors(self, action: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            bad = StoreUnavailable if isinstance(exc, sqlite3.OperationalError) else StoreError
            raise bad(f"{action} in {self._recorder.describe()} failed: {exc}") from exc

    def _write(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._recorder.transaction() as conn:
            return int(conn.execute(sql, args).rowcount)

    def put(self, snap: Snapshot) -> None:
        """Insert or replace the row of the snapshot's stream and projection."""
        with self._errors(f"saving snapshot of stream {snap.stream_id!r}"):
            self._write(SQLITE_UPSERT, (snap.stream_id, snap.projection, *row_of(snap)))

    def get(self, stream_id: str, projection: str) -> SnapshotRow | None:
        """The row of ``(stream_id, projection)``, or None."""
        with self._errors(f"loading snapshot of stream {stream_id!r}"):
            rows = self._recorder.fetch(SQLITE_SELECT, (stream_id, projection))
        return tuple(rows[0]) if rows else None

    def remove(self, stream_id: str, projection: str | None) -> int:
        """Delete one row, or every row of the stream; return how many."""
        with self._errors(f"deleting snapshots of stream {stream_id!r}"):
            if projection is None:
                return self._write(SQLITE_DELETE_STREAM, (stream_id,))
            return self._write(SQLITE_DELETE_ONE, (stream_id, projection))

    def infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        """Every row's description, keyset-paged by stream and projection."""
        after_sid, after_proj = "", ""
        while True:
            args: tuple[Any, ...]
            if stream_id is None:
                sql, args = SQLITE_LIST_ALL, (after_sid, after_sid, after_proj, LIST_PAGE)
            else:
                sql, args = SQLITE_LIST_STREAM, (stream_id, after_proj, LIST_PAGE)
            with self._errors("listing snapshots"):
                rows = self._recorder.fetch(sql, args)
            yield from map(info_of, rows)
            if len(rows) < LIST_PAGE:
                return
            after_sid, after_proj = rows[-1][0], rows[-1][1]
