"""A blocking backend as an asyncio one: :class:`ThreadedRecorder` (one writer thread, a
few reader threads; docs/guide-async.md).

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final, TypeVar

from ares_events.core.backend import AppendOutcome, Batch, Capability, Head, TrackingRecord
from ares_events.core.events import ExpectedVersion, RecordedEvent
from ares_events.core.lifecycle import settle
from ares_events.core.recorder import check_capabilities, system_of_record
from ares_events.errors import StoreClosed

if TYPE_CHECKING:
    from ares_events.core.snapshot_format import Snapshot, SnapshotInfo, SnapshotRow
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["CHUNK", "WAIT_SLICE", "ThreadedRecorder", "async_face", "async_snapshots"]

T = TypeVar("T")

CHUNK: Final = 512
"""Events a read pulls per trip to a reader thread."""
WAIT_SLICE: Final = 0.5
"""Longest blocking wait a waiter thread makes before checking back with the loop."""


class ThreadedRecorder:
    """An :class:`~ares_events.core.recorder_async.AsyncRecorder` over a blocking recorder
    (docs/guide-async.md).

    Args:
        sync: the blocking recorder; this object owns it (closing closes it).
        owns: close ``sync`` in :meth:`close` (False: a view of a store someone else
            closes).
    """

    def __init__(self, sync: Any, *, owns: bool = True) -> None:
        self.sync = sync
        self._owns = owns
        self.capabilities: frozenset[Capability] = frozenset(sync.capabilities)
        self._closed = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="ares-events-write")
        self._readers = ThreadPoolExecutor(4, thread_name_prefix="ares-events-read")
        self._waiters = ThreadPoolExecutor(8, thread_name_prefix="ares-events-wait")
        # The methods of every capability exist here; the store calls only those the
        # backend declares (self.capabilities), checked against the backend at open.
        check_capabilities(sync, self.describe())

    def describe(self) -> str:
        """The backend's location, redacted."""
        return str(self.sync.describe())

    def __repr__(self) -> str:
        return f"ThreadedRecorder({self.describe()!r})"

    def uncached(self) -> ThreadedRecorder:
        """The same threads over the system of record under a cache wrapper, for
        integrity checks that must not trust a cache."""
        inner = system_of_record(self.sync)
        if inner is self.sync:
            return self
        view = object.__new__(ThreadedRecorder)
        view.__dict__.update(self.__dict__)
        view.sync = inner
        return view

    async def _call(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise StoreClosed(self.describe())
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(pool, fn, *args)
        except RuntimeError as exc:  # the pool was shut down by close()
            raise StoreClosed(self.describe()) from exc
        if pool is not self._writer:
            return await fut
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            # A thread cannot be stopped: a cancelled write settles (commits or rolls back)
            # before the cancellation goes on, so nothing of it happens after the caller
            # saw CancelledError (as with PostgreSQL, where psycopg cancels the statement),
            # however many more cancels come meanwhile (an outer timeout, a task group).
            await settle(fut)
            raise

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append on the writer thread."""
        return await self._call(self._writer, self.sync.append, batch, expected_version)

    async def append_many(
        self, batches: Sequence[tuple[Batch, ExpectedVersion]], tracking: TrackingRecord | None
    ) -> list[AppendOutcome]:
        """Append several batches on the writer thread."""
        return await self._call(self._writer, self.sync.append_many, batches, tracking)

    async def erase(self, *args: Any) -> Any:
        """The backend's ``erase``, on the writer thread."""
        return await self._call(self._writer, self.sync.erase, *args)

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        """On the writer thread."""
        return await self._call(self._writer, self.sync.meta_put_if_absent, key, value)

    async def meta_set(self, key: str, value: str) -> None:
        """On the writer thread."""
        await self._call(self._writer, self.sync.meta_set, key, value)

    async def meta_swap(self, key: str, expected: str | None, value: str) -> bool:
        """On the writer thread."""
        return bool(await self._call(self._writer, self.sync.meta_swap, key, expected, value))

    async def delete_archived(self, *args: Any) -> int:
        """The backend's ``delete_archived``, on the writer thread."""
        return int(await self._call(self._writer, self.sync.delete_archived, *args))

    async def tracked_position(self, name: str) -> int | None:
        """On a reader thread."""
        return await self._call(self._readers, self.sync.tracked_position, name)

    async def meta_get(self, key: str) -> str | None:
        """On a reader thread."""
        return await self._call(self._readers, self.sync.meta_get, key)

    async def head(self, stream_id: str) -> Head | None:
        """On a reader thread."""
        return await self._call(self._readers, self.sync.head, stream_id)

    async def last_position(self) -> int:
        """On a reader thread."""
        return int(await self._call(self._readers, self.sync.last_position))

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """The blocking read, pulled in chunks on reader threads."""
        return self._pull(lambda: self.sync.read(stream_id, from_version, to_version, limit))

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """The blocking ``read_all``, pulled in chunks on reader threads."""
        # stream_prefix is passed only when asked for, as the core does.
        kw = {"stream_prefix": stream_prefix} if stream_prefix else {}
        return self._pull(lambda: self.sync.read_all(after_position, limit, **kw))

    def heads(self) -> AsyncIterator[tuple[str, Head]]:
        """The blocking ``heads``, pulled in chunks on reader threads."""
        return self._pull(self.sync.heads)

    async def heads_page(
        self, after: str, limit: int, prefix: str | None
    ) -> list[tuple[str, Head]]:
        """The blocking ``heads_page`` on a reader thread."""
        return await self._call(self._readers, self.sync.heads_page, after, limit, prefix)

    def find_duplicates(self) -> AsyncIterator[tuple[str, Any, Any, int, Any]]:
        """The audit's uniqueness scan, pulled on reader threads."""
        return self._pull(self.sync.find_duplicates)

    def positions(self, after_position: int) -> AsyncIterator[tuple[Any, Any, Any]]:
        """The audit's position scan, pulled on reader threads."""
        return self._pull(lambda: self.sync.positions(after_position))

    async def _pull(self, make: Callable[[], Iterator[T]]) -> AsyncIterator[T]:
        it: Iterator[T] | None = None

        def chunk() -> list[T]:
            nonlocal it
            if it is None:
                it = iter(make())
            return list(itertools.islice(it, CHUNK))

        try:
            while True:
                got = await self._call(self._readers, chunk)
                for x in got:
                    yield x
                if len(got) < CHUNK:
                    return
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                # Still running on a reader thread (the consumer was cancelled): it ends
                # there at its next page, or is collected.
                with contextlib.suppress(ValueError):
                    close()

    async def wait_for(self, position: int, timeout: float) -> bool:
        """The backend's native wait, in slices on a waiter thread.

        Raises:
            StoreClosed: the store is closed (also while waiting).
        """
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            left = deadline - time.monotonic()
            part = min(max(left, 0.0), WAIT_SLICE)
            if await self._call(self._waiters, self.sync.wait_for, position, part):
                return True
            if left <= WAIT_SLICE:
                return False

    def read_models(self) -> Any:
        """The backend's read models (blocking: the runner that folds them is)."""
        return self.sync.read_models()

    def default_blobs_url(self) -> str | None:
        """Where the backend keeps spilled payloads by default (no I/O)."""
        return self.sync.default_blobs_url()  # type: ignore[no-any-return]

    def snapshot_rows(self) -> ThreadedSnapshotRows:
        """The backend's snapshot table, its row operations on these threads."""
        return ThreadedSnapshotRows(self.sync.snapshot_rows(), self)

    async def close(self) -> None:
        """Close the backend in a thread (operations in flight finish or fail with
        StoreClosed), then stop the threads. Idempotent."""
        first = not self._closed
        self._closed = True
        if first and self._owns:
            await asyncio.to_thread(self.sync.close)
        for pool in (self._writer, self._readers, self._waiters):
            with contextlib.suppress(Exception):
                pool.shutdown(wait=False)


class ThreadedSnapshotRows:
    """A blocking backend's snapshot rows on a :class:`ThreadedRecorder`'s threads
    (writes on the writer thread, reads on reader threads)."""

    def __init__(self, sync: Any, threads: ThreadedRecorder) -> None:
        self._sync = sync
        self._t = threads

    async def put(self, snap: Snapshot) -> None:
        await self._t._call(self._t._writer, self._sync.put, snap)

    async def get(self, stream_id: str, projection: str) -> SnapshotRow | None:
        return await self._t._call(self._t._readers, self._sync.get, stream_id, projection)

    async def remove(self, stream_id: str, projection: str | None) -> int:
        return int(await self._t._call(self._t._writer, self._sync.remove, stream_id, projection))

    def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        """Every row's description, pulled in chunks on reader threads."""
        return self._t._pull(lambda: self._sync.infos(stream_id))


def async_face(store: Any) -> AsyncEventStore:
    """``store`` on the asyncio face: itself, or, for a blocking store, an asyncio view of
    it whose calls run on worker threads (one view per store, made on first use; closing
    the view leaves the store open). What the asyncio journal, replay and recovery use
    when handed a blocking store."""
    from ares_events.core.identity import DEFAULT_BLOBS
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

    if not isinstance(store, EventStore):
        return store  # type: ignore[no-any-return]
    view: AsyncEventStore | None = store.__dict__.get("_async_face")
    if view is None:
        view = AsyncEventStore(
            ThreadedRecorder(store.recorder, owns=False),
            chain_key=store.chain_key,
            blobs=store.blobs,
            spill_threshold=store.spill_threshold,
            url=store.url,
            max_inline_bytes=store.max_inline_bytes,
            default_blobs=store._blobs_identity == DEFAULT_BLOBS,
            check_identity=False,
            identity=store.identity,
        )
        # The blocking store checked the identity when it opened; the view writes as it.
        view._check_identity = store._check_identity
        view._identity_pending = store._identity_pending
        view._loaded = True
        store.__dict__["_async_face"] = view
    return view


def async_snapshots(view: AsyncEventStore, snapshots: Any) -> Any:
    """The snapshot store to use with the asyncio ``view``: ``snapshots`` itself, or the
    view's own when ``snapshots`` belongs to the blocking face."""
    from ares_events.core.snapshots import SnapshotStore

    return view.snapshots if isinstance(snapshots, SnapshotStore) else snapshots
