"""The asyncio event store: :class:`AsyncEventStore`, what ``ae.open_async_store`` returns.

The same store as :class:`~ares_events.core.store.EventStore`, every I/O method a
coroutine and every read an async iterator, over an
:class:`~ares_events.core.recorder.AsyncRecorder`. Nothing is decided twice: validation,
encoding, limits, sealing, duplicate resolution, spill decisions and the identity checks
are :class:`~ares_events.core.store_core.StoreCore`'s, shared with the blocking face.

No call blocks the event loop. Blob I/O (writing a spilled payload, fetching one on
read) runs in a worker thread (``asyncio.to_thread``): file and S3 blob stores are
blocking libraries. Spilled payloads of the events a read yields are fetched (and
digest-checked) before the event is yielded, so ``event.payload`` never does I/O on the
loop; a blob that cannot be fetched raises when ``payload`` is read, as in the blocking
store.

A store belongs to the event loop that opened it (its connections do).

It may import the core's other modules, :mod:`ares_events.errors` and the chain format.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import (
    ANY,
    AppendResult,
    ExpectedVersion,
    NewEvent,
    PayloadRef,
    PreparedEvent,
    RecordedEvent,
    _normalize_expected,
    utc_now_at,
    validate_name,
)
from ares_events.core.identity import StoreIdentity
from ares_events.core.recorder import AsyncRecorder, Batch, Capability, Head, TrackingRecord
from ares_events.core.sansio import arun
from ares_events.core.store_core import (
    DEFAULT_MAX_INLINE_BYTES,
    Conflict,
    StoreCore,
    check_after,
    check_range,
)
from ares_events.errors import ConcurrencyError, InvalidEvent, StoreClosed, StoreError
from ares_events.integrity.chain import ChainKey

if TYPE_CHECKING:
    from ares_events.core.snapshots_async import AsyncSnapshotStore
    from ares_events.stores.blobs.base import BlobStore

logger = logging.getLogger(__name__)

__all__ = ["SUBSCRIBE_PAGE", "AsyncEventStore"]

SUBSCRIBE_PAGE: Final = 1000
"""Events ``subscribe()`` reads per ``read_all`` page."""
_POLL_MAX: Final = 0.25


class _AsyncRecorderPort:
    """The async recorder (and blob store) as the port of the identity and erasure steps
    of :class:`StoreCore`."""

    __slots__ = ("_blobs", "_rec")

    def __init__(self, recorder: Any, blobs: BlobStore | None = None) -> None:
        self._rec = recorder
        self._blobs = blobs

    async def read_one(self, stream_id: str, version: int) -> RecordedEvent | None:
        async with contextlib.aclosing(self._rec.read(stream_id, version, version, 1)) as events:
            async for e in events:
                return e  # type: ignore[no-any-return]
        return None

    async def erase(self, *args: Any) -> Any:
        return await self._rec.erase(*args)

    async def delete_blob(self, key: str, if_older_than: datetime) -> None:
        blobs = self._blobs
        assert blobs is not None
        await asyncio.to_thread(lambda: blobs.delete(key, if_older_than=if_older_than))

    async def meta_get(self, key: str) -> str | None:
        return await self._rec.meta_get(key)  # type: ignore[no-any-return]

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        return await self._rec.meta_put_if_absent(key, value)  # type: ignore[no-any-return]

    async def meta_set(self, key: str, value: str) -> None:
        await self._rec.meta_set(key, value)

    async def last_position(self) -> int:
        return int(await self._rec.last_position())

    async def first_event(self) -> tuple[str, RecordedEvent | None] | None:
        async with contextlib.aclosing(self._rec.heads()) as heads:
            async for sid, _ in heads:
                async with contextlib.aclosing(self._rec.read(sid, 1, 1, 1)) as events:
                    async for e in events:
                        return sid, e
                return sid, None
        return None


def _failing_loader(exc: BaseException) -> Callable[[PayloadRef], bytes]:
    def load(ref: PayloadRef) -> bytes:
        raise exc

    return load


def _preload(e: RecordedEvent) -> RecordedEvent:
    """In a worker thread: fetch and check a spilled payload so reading it later does no
    I/O; a fetch that fails is kept, to be raised where ``payload`` is read."""
    try:
        e.payload_bytes  # noqa: B018 - fetches, checks and keeps the bytes
    except Exception as exc:  # raised again, unchanged, when the payload is read
        return e._with_loader(_failing_loader(exc))
    return e


class AsyncEventStore(StoreCore):
    """A hash-chained, append-only event store for asyncio (see the module docstring).

    Open one with ``await ae.open_async_store(url)``; use ``async with`` or ``await
    store.close()``. Constructing one directly over an
    :class:`~ares_events.core.recorder.AsyncRecorder` does no I/O: the recorded identity
    is checked by :meth:`open` (which ``open_async_store`` calls), else before the first
    operation.

    Args:
        recorder: the asyncio backend.
        chain_key: key of the chain's keyed mode (None: unkeyed).
        blobs: blob store for spilled payloads (None: nothing spills).
        spill_threshold: payloads larger than this many bytes go to ``blobs``.
        url: the store's redacted URL (for messages).
        max_inline_bytes: the largest payload stored inline.
        default_blobs: ``blobs`` is the backend's default folder.
        check_identity: check the configuration against the recorded identity
            (default); False: a forensic reader that refuses to write.
        identity: the identity already read by the caller.
    """

    def __init__(
        self,
        recorder: AsyncRecorder,
        *,
        chain_key: ChainKey | bytes | str | None = None,
        blobs: BlobStore | None = None,
        spill_threshold: int = 256 * 1024,
        url: str | None = None,
        max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES,
        default_blobs: bool = False,
        check_identity: bool = True,
        identity: StoreIdentity | None = None,
    ) -> None:
        super().__init__(
            recorder,
            chain_key=chain_key,
            blobs=blobs,
            spill_threshold=spill_threshold,
            url=url,
            max_inline_bytes=max_inline_bytes,
            default_blobs=default_blobs,
            check_identity=check_identity,
            identity=identity,
        )
        self.recorder: AsyncRecorder = recorder
        self._identity_lock = asyncio.Lock()
        self._loaded = not (check_identity and self._keeps_identity)
        self._given_identity = identity

    @classmethod
    async def open(cls, recorder: AsyncRecorder, **kwargs: Any) -> AsyncEventStore:
        """Construct over ``recorder`` and check the recorded identity now.

        Raises:
            ConfigError: the store records another chain mode, chain key or blob location.
            StoreUnavailable: the backend cannot be reached.
        """
        store = cls(recorder, **kwargs)
        await store._ready()
        return store

    def __repr__(self) -> str:
        return self._repr("AsyncEventStore")

    async def _ready(self) -> None:
        """Check the recorded identity once, before the first operation."""
        if self._loaded:
            return
        async with self._identity_lock:
            if not self._loaded:
                await arun(
                    self._load_identity_steps(self._given_identity),
                    _AsyncRecorderPort(self.recorder),
                )
                self._loaded = True

    async def record_identity(self, *, relocate_blobs: bool = False) -> StoreIdentity | None:
        """See :meth:`EventStore.record_identity`.

        Raises:
            ConfigError: the store records another configuration.
            StoreClosed: the store is closed.
        """
        self._check_open("recording the store identity")
        await self._ready()
        if not self._keeps_identity:
            return None
        async with self._identity_lock:
            return await arun(
                self._record_identity_request_steps(relocate_blobs),
                _AsyncRecorderPort(self.recorder),
            )

    async def _before_write(self) -> None:
        await self._ready()
        if self._identity_pending or not self._check_identity:
            self._refuse_unchecked_writes()
            async with self._identity_lock:
                if self._identity_pending:
                    await arun(self._record_identity_steps(), _AsyncRecorderPort(self.recorder))

    # -- writes --------------------------------------------------------------------------

    async def append(
        self, stream_id: str, events: Sequence[NewEvent], *, expected_version: ExpectedVersion = ANY
    ) -> AppendResult:
        """Append ``events`` to ``stream_id`` atomically (see :meth:`EventStore.append`).

        Cancelling the awaiting task cancels the append where it stands: it committed or
        it did not by the time the task sees ``CancelledError`` (PostgreSQL cancels the
        statement; a threaded backend lets the write finish first). Which one is not
        known to the task: re-append the same event ids to find out (appends are
        idempotent).

        Raises:
            InvalidEvent: bad input (names the field and the event's index).
            ConcurrencyError: ``expected_version`` not satisfied, or an event id reused
                for a different event.
            StoreClosed: the store is closed (also while the append was in flight).
            StoreUnavailable: the backend cannot be reached; nothing was written.
        """
        if self._closed:
            raise StoreClosed(self._url, f"append to stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        expected = _normalize_expected(expected_version)
        events = self._events_arg(stream_id, events)
        await self._before_write()
        prepared = await self._spill_async(self._encode(stream_id, events, utc_now_at()))
        self._check_inline(stream_id, prepared)
        outcome = await self.recorder.append(Batch(stream_id, prepared, self.chain_key), expected)
        if outcome.duplicate:
            res = self._duplicate(stream_id, prepared, outcome.events)
            if isinstance(res, Conflict):
                raise await self._conflict(res)
            return res
        return self._result(stream_id, prepared, outcome)

    async def append_many(
        self,
        batches: Sequence[tuple[str, Sequence[NewEvent], ExpectedVersion]],
        *,
        tracking: TrackingRecord | tuple[str, int] | None = None,
    ) -> list[AppendResult]:
        """Append to several streams in one transaction (see :meth:`EventStore.append_many`).

        Raises:
            InvalidEvent: bad input (names the stream and the event's index).
            ConcurrencyError: an expected version or ``tracking`` not satisfied, or an
                event id reused for a different event.
            StoreError: the backend does not declare ``MULTI_STREAM_APPEND``.
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached; nothing was written.
        """
        self._check_open("append_many")
        track = self._tracking_arg(tracking)
        if not batches and track is None:
            raise InvalidEvent("batches", "at least one batch (or a tracking record) is required")
        if Capability.MULTI_STREAM_APPEND not in self.recorder.capabilities:
            if len(batches) == 1 and track is None:
                sid, evs, exp = batches[0]
                return [await self.append(sid, evs, expected_version=exp)]
            raise StoreError(
                f"store {self._url} cannot append to several streams atomically "
                "(its backend does not declare MULTI_STREAM_APPEND)"
            )
        await self._before_write()
        plan = self._plan_many(batches, utc_now_at())
        for b in plan:
            b.prepared = await self._spill_async(b.prepared)
        for b in plan:
            self._check_inline(b.stream_id, b.prepared)
        work = [(Batch(b.stream_id, b.prepared, self.chain_key), b.expected) for b in plan]
        outcomes = await self.recorder.append_many(work, track)  # type: ignore[attr-defined]
        res = self._many_results(plan, outcomes)
        if isinstance(res, Conflict):
            raise await self._conflict(res)
        return res

    async def erase_payload(self, stream_id: str, version: int) -> tuple[RecordedEvent, int | None]:
        """Remove one event's payload, keeping its digest and size (see
        :meth:`EventStore.erase_payload`: the same steps).

        Raises:
            EventNotFound: no event at ``stream_id`` ``version``.
            StoreError: the backend does not declare ``ERASE``, or the row changed while
                it was erased (retry).
            StoreUnavailable: the backend or the blob store cannot be reached.
        """
        self._check_erase(stream_id, version)
        await self._before_write()
        return await arun(
            self._erase_steps(stream_id, version), _AsyncRecorderPort(self.recorder, self.blobs)
        )

    async def tracked_position(self, name: str) -> int | None:
        """See :meth:`EventStore.tracked_position`.

        Raises:
            StoreError: the backend does not declare ``MULTI_STREAM_APPEND``.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        validate_name(name, "tracking name")
        if Capability.MULTI_STREAM_APPEND not in self.recorder.capabilities:
            raise StoreError(f"store {self._url} keeps no tracking records")
        await self._ready()
        return await self.recorder.tracked_position(name)  # type: ignore[attr-defined,no-any-return]

    async def _spill_async(self, prepared: list[PreparedEvent]) -> list[PreparedEvent]:
        """Spill in a worker thread (blob stores are blocking), only when one could."""
        if not self._may_spill(prepared):
            return prepared
        blobs, limit = self.blobs, self.spill_threshold
        assert blobs is not None
        return await asyncio.to_thread(lambda: [blobs.spill(p, limit) for p in prepared])

    async def _conflict(self, c: Conflict) -> ConcurrencyError:
        version = await self.stream_version(c.stream_id)
        return ConcurrencyError(c.stream_id, c.expected, version, c.detail)

    # -- reads ---------------------------------------------------------------------------

    def read(
        self,
        stream_id: str,
        from_version: int = 1,
        to_version: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RecordedEvent]:
        """Events of ``stream_id`` in version order, as a lazy async iterator (one page in
        memory at a time); arguments are checked at the call.

        Raises:
            InvalidEvent: a bad stream id or range.
            StoreClosed: the store is closed (also between pages).
            StoreUnavailable: the backend cannot be reached.
        """
        if self._closed:
            raise StoreClosed(self._url, f"read of stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        check_range(from_version, to_version, limit)
        return self._events(lambda: self.recorder.read(stream_id, from_version, to_version, limit))

    def read_all(
        self,
        after_position: int = 0,
        limit: int | None = None,
        *,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[RecordedEvent]:
        """Events of every stream in global position order, after ``after_position``, as a
        lazy async iterator (see :meth:`EventStore.read_all` for the visibility rule and
        ``stream_prefix``).

        Raises:
            InvalidEvent: a bad position, limit or prefix.
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open("read_all")
        check_after(after_position, limit, stream_prefix)
        if stream_prefix:
            prefix = stream_prefix
            return self._events(
                lambda: self.recorder.read_all(after_position, limit, stream_prefix=prefix)  # type: ignore[call-arg]
            )
        return self._events(lambda: self.recorder.read_all(after_position, limit))

    async def _events(
        self, source: Callable[[], AsyncIterator[RecordedEvent]]
    ) -> AsyncIterator[RecordedEvent]:
        await self._ready()
        blobs = self.blobs
        async with contextlib.aclosing(source()) as events:  # type: ignore[type-var]
            async for e in events:
                if e.payload_ref is not None and blobs is not None:
                    yield await asyncio.to_thread(_preload, blobs.attach(e))
                else:
                    yield e

    async def stream_version(self, stream_id: str) -> int:
        """The stream's version from its head row; 0 when the stream does not exist.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        head = await self.head(stream_id)
        return head.version if head else 0

    async def head(self, stream_id: str) -> Head | None:
        """The stream's head (version and hash of the last event), or None.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        validate_name(stream_id, "stream_id")
        await self._ready()
        return await self.recorder.head(stream_id)

    async def streams(self) -> AsyncIterator[tuple[str, int]]:
        """Every stream with its version, ordered by stream id.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        await self._ready()
        async with contextlib.aclosing(self.recorder.heads()) as heads:  # type: ignore[type-var]
            async for sid, h in heads:
                yield sid, h.version

    async def last_position(self) -> int:
        """The highest global position visible to ``read_all`` (0 for an empty store).

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        await self._ready()
        return await self.recorder.last_position()

    async def wait_for(self, position: int, timeout: float) -> bool:
        """Wait until an event after ``position`` is visible to ``read_all``, or
        ``timeout`` seconds pass, without blocking the loop: the backend's wake-ups
        (PostgreSQL LISTEN/NOTIFY, the memory store's) where it has them, else polling
        with backoff (5 ms doubling to 250 ms).

        Returns:
            True when an event after ``position`` exists.

        Raises:
            StoreClosed: the store is closed (also while waiting).
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        await self._ready()
        waiter = getattr(self.recorder, "wait_for", None)
        if waiter is not None:
            return bool(await waiter(position, timeout))
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            self._check_open()
            if await self.recorder.last_position() > position:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await asyncio.sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

    def subscribe(
        self, after_position: int = 0, *, page: int = SUBSCRIBE_PAGE
    ) -> AsyncIterator[RecordedEvent]:
        """Every event after ``after_position``, in position order, then each new one as
        it commits: an endless async iterator (break out of it, or close the store).

        It pages through :meth:`read_all` and, once caught up, waits with
        :meth:`wait_for` (LISTEN/NOTIFY on PostgreSQL, polling elsewhere). It never skips
        an event: ``read_all`` returns only positions below which nothing can commit
        any more, so an event whose transaction commits late is seen in its place.
        Resume after a restart by passing the last position processed.

        Raises:
            InvalidEvent: a bad position or page size.
            StoreClosed: the store was closed (ends the iteration).
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open("subscribe")
        check_after(after_position, None)
        if type(page) is not int or page < 1:
            raise InvalidEvent("page", f"must be an int >= 1, got {page!r}")
        return self._subscription(after_position, page)

    async def _subscription(self, position: int, page: int) -> AsyncIterator[RecordedEvent]:
        while True:
            n = 0
            async with contextlib.aclosing(self.read_all(position, page)) as events:  # type: ignore[type-var]
                async for e in events:
                    position = e.position
                    n += 1
                    yield e
            if n < page:
                await self.wait_for(position, 30.0)

    @property
    def snapshots(self) -> AsyncSnapshotStore:
        """The async snapshot store in the same database as the events.

        Raises:
            StoreClosed: the store is closed.
            StoreError: the backend has no snapshot table.
        """
        self._check_open()
        if self._snapshots is None:
            from ares_events.core.snapshots_async import async_snapshot_store_for

            self._snapshots = async_snapshot_store_for(self)
        return self._snapshots  # type: ignore[no-any-return]

    # -- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        """Release the backend's connections. Idempotent.

        From now on every call raises :class:`StoreClosed`. Operations in flight in other
        tasks finish, or are interrupted after a short grace and raise
        :class:`StoreClosed`; waiters and subscribers wake up with it; no connection
        outlives this call.
        """
        self._closed = True
        await self.recorder.close()
        if self.blobs is not None:
            await asyncio.to_thread(self.blobs.close)

    async def __aenter__(self) -> AsyncEventStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
