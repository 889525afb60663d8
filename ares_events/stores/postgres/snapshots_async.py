"""Snapshot rows of the asyncio PostgreSQL recorder: the ``ares_snapshots`` table of the
store's schema through the async pool, with the statements of
:mod:`ares_events.stores.snapshots` (the checks are the core's,
:class:`~ares_events.core.snapshots_async.AsyncSnapshotStore`).

It may import the core, :mod:`ares_events.errors`, :mod:`ares_events.stores.snapshots`,
psycopg and this package.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from ares_events.core.snapshots import Snapshot, SnapshotInfo, _Row
from ares_events.errors import StoreError, StoreUnavailable
from ares_events.stores.snapshots import (
    _LIST_PAGE,
    PG_DELETE_ONE,
    PG_DELETE_STREAM,
    PG_LIST_ALL,
    PG_LIST_STREAM,
    PG_SELECT,
    PG_UPSERT,
    _info_of,
    _pg_detail,
    _row_of,
)

if TYPE_CHECKING:
    from ares_events.stores.postgres.recorder_async import AsyncPostgresRecorder

__all__ = ["PostgresSnapshotRows"]


class PostgresSnapshotRows:
    """The row operations of the PostgreSQL snapshot store, natively async (one pooled
    connection per operation; writes in a short transaction)."""

    def __init__(self, recorder: AsyncPostgresRecorder, event_store: Any) -> None:
        self._recorder = recorder
        self._url = event_store.url
        table = sql.Identifier(recorder.schema, "ares_snapshots")
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

    @contextlib.asynccontextmanager
    async def _txn(self, action: str, *, write: bool = True) -> AsyncIterator[Any]:
        """One pooled connection (and, to write, a transaction); psycopg errors mapped as
        the blocking snapshot store maps them."""
        try:
            async with self._recorder.connection() as conn:
                if write:
                    async with conn.transaction():
                        yield conn
                else:
                    yield conn
        except psycopg.OperationalError as exc:
            raise StoreUnavailable(f"{action} in {self._url} failed: {_pg_detail(exc)}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"{action} in {self._url} failed: {_pg_detail(exc)}") from exc

    async def put(self, snap: Snapshot) -> None:
        """See :class:`~ares_events.core.snapshots_async.SnapshotRows`."""
        async with self._txn(f"saving snapshot of stream {snap.stream_id!r}") as conn:
            await conn.execute(
                self._sql["upsert"], (snap.stream_id, snap.projection, *_row_of(snap))
            )

    async def get(self, stream_id: str, projection: str) -> _Row | None:
        """See :class:`~ares_events.core.snapshots_async.SnapshotRows`."""
        async with self._txn(f"loading snapshot of stream {stream_id!r}", write=False) as conn:
            cur = await conn.execute(self._sql["select"], (stream_id, projection))
            row = await cur.fetchone()
        return None if row is None else tuple(row)

    async def remove(self, stream_id: str, projection: str | None) -> int:
        """See :class:`~ares_events.core.snapshots_async.SnapshotRows`."""
        async with self._txn(f"deleting snapshots of stream {stream_id!r}") as conn:
            if projection is None:
                cur = await conn.execute(self._sql["delete_stream"], (stream_id,))
            else:
                cur = await conn.execute(self._sql["delete_one"], (stream_id, projection))
            return int(cur.rowcount)

    async def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        """See :class:`~ares_events.core.snapshots_async.SnapshotRows`."""
        after_sid, after_proj = "", ""
        while True:
            async with self._txn("listing snapshots", write=False) as conn:
                if stream_id is None:
                    cur = await conn.execute(
                        self._sql["list_all"], (after_sid, after_proj, _LIST_PAGE)
                    )
                else:
                    cur = await conn.execute(
                        self._sql["list_stream"], (stream_id, after_proj, _LIST_PAGE)
                    )
                rows = await cur.fetchall()
            for r in rows:
                yield _info_of(r)
            if len(rows) < _LIST_PAGE:
                return
            after_sid, after_proj = rows[-1][0], rows[-1][1]
