"""The asyncio snapshot store: :class:`AsyncSnapshotStore` (``async_store.snapshots``).

The same surface as :class:`~ares_events.core.snapshots.SnapshotStore`, each method a
coroutine and each listing an async iterator, and the same checks: they are the
:class:`~ares_events.core.snapshots._SnapshotLogic` steps the blocking stores run, driven
here with awaits. A backend provides only the row operations, as a :class:`SnapshotRows`
from its async recorder's ``snapshot_rows(event_store)`` hook:

- :class:`DirectRows`: a blocking snapshot store whose row operations do no I/O (memory),
  called on the loop;
- :class:`ThreadedRows`: a blocking snapshot store's row operations on the threads of
  :class:`~ares_events.stores.threaded.ThreadedRecorder` (SQLite, cached stores);
- PostgreSQL's native rows (:mod:`ares_events.stores.postgres.snapshots_async`).

It may import the core's other modules and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ares_events.core.events import RecordedEvent, validate_name
from ares_events.core.sansio import arun
from ares_events.core.snapshots import (
    Snapshot,
    SnapshotCheck,
    SnapshotInfo,
    _check_delete,
    _checked,
    _Row,
    _SnapshotLogic,
    make_snapshot_steps,
)
from ares_events.errors import SnapshotMismatch, StoreError

if TYPE_CHECKING:
    from concurrent.futures import ThreadPoolExecutor

    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "AsyncSnapshotStore",
    "DirectRows",
    "SnapshotRows",
    "ThreadedRows",
    "amake_snapshot",
    "async_snapshot_store_for",
]

_LIST_CHUNK = 500


@runtime_checkable
class SnapshotRows(Protocol):
    """The row operations of an asyncio snapshot store (the backend's part)."""

    async def put(self, snap: Snapshot) -> None:
        """Store the sealed snapshot, replacing the previous one (an UPSERT)."""
        ...

    async def get(self, stream_id: str, projection: str) -> _Row | None:
        """The stored row, or None."""
        ...

    async def remove(self, stream_id: str, projection: str | None) -> int:
        """Delete one snapshot, or every snapshot of the stream; returns how many."""
        ...

    def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        """Every stored snapshot without its state, by stream then projection."""
        ...


class DirectRows:
    """The row operations of a blocking snapshot store that does no I/O (memory); each
    yields to the event loop once, so a task looping over them never starves others."""

    def __init__(self, sync: Any) -> None:
        self._sync = sync

    async def put(self, snap: Snapshot) -> None:
        """See :class:`SnapshotRows`."""
        await asyncio.sleep(0)
        self._sync._put(snap)

    async def get(self, stream_id: str, projection: str) -> _Row | None:
        """See :class:`SnapshotRows`."""
        await asyncio.sleep(0)
        row: _Row | None = self._sync._get(stream_id, projection)
        return row

    async def remove(self, stream_id: str, projection: str | None) -> int:
        """See :class:`SnapshotRows`."""
        await asyncio.sleep(0)
        return int(self._sync._remove(stream_id, projection))

    async def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        """See :class:`SnapshotRows`."""
        await asyncio.sleep(0)
        for info in self._sync._infos(stream_id):
            yield info


class ThreadedRows:
    """The row operations of a blocking snapshot store, on worker threads (writes on the
    writer thread, reads on reader threads; ``call(pool, fn, *args)`` runs one)."""

    def __init__(
        self,
        sync: Any,
        writer: ThreadPoolExecutor,
        readers: ThreadPoolExecutor,
        call: Callable[..., Awaitable[Any]],
    ) -> None:
        self._sync = sync
        self._writer = writer
        self._readers = readers
        self._call = call

    async def put(self, snap: Snapshot) -> None:
        """See :class:`SnapshotRows`."""
        await self._call(self._writer, self._sync._put, snap)

    async def get(self, stream_id: str, projection: str) -> _Row | None:
        """See :class:`SnapshotRows`."""
        row: _Row | None = await self._call(self._readers, self._sync._get, stream_id, projection)
        return row

    async def remove(self, stream_id: str, projection: str | None) -> int:
        """See :class:`SnapshotRows`."""
        return int(await self._call(self._writer, self._sync._remove, stream_id, projection))

    async def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        """See :class:`SnapshotRows`."""
        it = self._sync._infos(stream_id)

        def chunk() -> builtins.list[SnapshotInfo]:
            return builtins.list(itertools.islice(it, _LIST_CHUNK))

        while True:
            got = await self._call(self._readers, chunk)
            for info in got:
                yield info
            if len(got) < _LIST_CHUNK:
                return


async def _first(ait: AsyncIterator[RecordedEvent]) -> RecordedEvent | None:
    async with contextlib.aclosing(ait) as events:  # type: ignore[type-var]
        async for e in events:
            return e
    return None


class _StorePort:
    """An async event store as the port of :func:`make_snapshot_steps`."""

    __slots__ = ("_store",)

    def __init__(self, store: AsyncEventStore) -> None:
        self._store = store

    async def read_at(self, stream_id: str, version: int) -> RecordedEvent | None:
        return await _first(self._store.read(stream_id, from_version=version, limit=1))

    async def stream_version(self, stream_id: str) -> int:
        return await self._store.stream_version(stream_id)


class _Port(_StorePort):
    """An async snapshot store and its event store as the port of the checks."""

    __slots__ = ("_rows",)

    def __init__(self, store: AsyncEventStore, rows: SnapshotRows) -> None:
        super().__init__(store)
        self._rows = rows

    async def get_row(self, stream_id: str, projection: str) -> _Row | None:
        return await self._rows.get(stream_id, projection)

    async def put_row(self, snap: Snapshot) -> None:
        await self._rows.put(snap)


class AsyncSnapshotStore(_SnapshotLogic):
    """Latest snapshot per (stream, projection), beside the events, for asyncio: the
    methods of :class:`~ares_events.core.snapshots.SnapshotStore` as coroutines (see the
    blocking store for what each checks and raises).

    Args:
        store: the async event store.
        rows: the backend's row operations.
    """

    def __init__(self, store: AsyncEventStore, rows: SnapshotRows) -> None:
        self._store = store
        self._rows = rows
        self._port = _Port(store, rows)

    def __repr__(self) -> str:
        return f"AsyncSnapshotStore({self._store.url!r})"

    async def save(self, snapshot: Snapshot) -> Snapshot:
        """Check ``snapshot`` against the stream, seal it and store it.

        Raises:
            InvalidEvent: not a self-consistent :class:`Snapshot`; nothing is written.
            SnapshotMismatch: it does not match the stream; nothing is written.
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
        """
        return await arun(self._save_steps(snapshot), self._port)

    async def load(
        self,
        stream_id: str,
        projection: str,
        version: int | None = None,
        *,
        verify: bool = True,
    ) -> Snapshot | None:
        """The latest snapshot, verified (unless ``verify=False``), or None.

        Raises:
            InvalidEvent: a bad stream id, projection name or version.
            SnapshotMismatch: the stored snapshot does not match.
            StoreUnavailable: the database cannot be reached.
        """
        snap, reason = await self._load(stream_id, projection, version, verify=verify)
        if reason is not None:
            raise SnapshotMismatch(stream_id, projection, reason)
        return snap

    async def load_checked(
        self, stream_id: str, projection: str, version: int | None = None
    ) -> SnapshotCheck:
        """Load and verify without raising on a mismatch: ``(snapshot, reason)``.

        Raises:
            InvalidEvent: a bad stream id, projection name or version.
            StoreUnavailable: the database cannot be reached.
        """
        snap, reason = await self._load(stream_id, projection, version, verify=True)
        return _checked(stream_id, projection, snap, reason)

    async def check(self, snapshot: Snapshot, version: int | None = None) -> str | None:
        """Why ``snapshot`` must not be used, or None when it matches the stream.

        Raises:
            InvalidEvent: ``snapshot`` is not a :class:`Snapshot` or ``version`` is bad.
            StoreUnavailable: the database cannot be reached.
        """
        return await arun(self._check_steps(snapshot, version), self._port)

    async def verify_all(
        self, stream_id: str | None = None
    ) -> AsyncIterator[tuple[SnapshotInfo, str | None]]:
        """Check every stored snapshot: ``(info, reason or None)``.

        Raises:
            StoreUnavailable: the database cannot be reached.
        """
        infos = [info async for info in self.list(stream_id)]
        for info in infos:
            if info.problem is not None:
                yield info, f"malformed snapshot row: {info.problem}"
                continue
            _, reason = await self._load(info.stream_id, info.projection, None, verify=True)
            yield info, reason

    async def delete(self, stream_id: str, projection: str | None = None) -> int:
        """Delete one snapshot, or every snapshot of the stream; returns how many.

        Raises:
            InvalidEvent: a bad stream id or projection name.
            StoreUnavailable: the database cannot be reached.
        """
        _check_delete(stream_id, projection)
        return await self._rows.remove(stream_id, projection)

    def list(self, stream_id: str | None = None) -> AsyncIterator[SnapshotInfo]:
        """Every stored snapshot without its state, by stream id then projection.

        Raises:
            InvalidEvent: a bad stream id.
            StoreUnavailable: the database cannot be reached.
        """
        if stream_id is not None:
            validate_name(stream_id, "stream_id")
        return self._rows.infos(stream_id)

    async def close(self) -> None:
        """Nothing to release: the event store owns the connections."""

    async def _load(
        self, stream_id: str, projection: str, version: int | None, *, verify: bool
    ) -> tuple[Snapshot | None, str | None]:
        return await arun(
            self._load_steps(stream_id, projection, version, verify=verify), self._port
        )


async def amake_snapshot(
    store: AsyncEventStore,
    stream_id: str,
    projection_name: str,
    projection_version: int,
    state: Any,
    at_version: int,
) -> Snapshot:
    """The asyncio twin of :func:`~ares_events.core.snapshots.make_snapshot`.

    Raises:
        InvalidEvent: a bad name or version, or a state that is not canonical JSON.
        SnapshotMismatch: the stream has no event at ``at_version``.
        StoreUnavailable: the store cannot be reached.
    """
    return await arun(
        make_snapshot_steps(stream_id, projection_name, projection_version, state, at_version),
        _StorePort(store),
    )


def async_snapshot_store_for(store: AsyncEventStore) -> AsyncSnapshotStore:
    """The async snapshot store beside ``store``'s events (its recorder's
    ``snapshot_rows(event_store)`` hook provides the rows).

    Raises:
        StoreError: the backend has no snapshot table.
    """
    hook = getattr(store.recorder, "snapshot_rows", None)
    if not callable(hook):
        raise StoreError(
            f"store {store.url} has no snapshot store: backend {type(store.recorder).__name__} "
            "does not provide one (expose snapshot_rows(event_store) on the async recorder)"
        )
    return AsyncSnapshotStore(store, hook(store))
