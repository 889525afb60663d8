"""The asyncio face of the in-process store: ``memory://`` and ``memory://NAME`` for
``ae.open_async_store``.

Native: the memory store does no I/O, so each operation runs directly on the event loop
(its lock is only ever held for a few list operations). Each operation still yields to
the loop once (``asyncio.sleep(0)``), and a read every :data:`FAIR_EVERY` events, so a
task looping over appends or reads never starves the others. It shares the data of
:mod:`~ares_events.stores.memory` (a :class:`~ares_events.stores.memory.MemoryRecorder`
handle underneath), so ``memory://NAME`` is one store whichever face opens it, and a
blocking append wakes asyncio waiters and the other way round. Waiters register a
callback that wakes their loop thread-safely (``call_soon_threadsafe``).

It may import the core and :mod:`~ares_events.stores.memory`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from ares_events.core.events import ErasedPayloadRef, ExpectedVersion, RecordedEvent
from ares_events.core.recorder import (
    AppendOutcome,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    StoreURL,
    TrackingRecord,
)
from ares_events.stores.memory import MemoryRecorder

if TYPE_CHECKING:
    from ares_events.core.snapshots_async import SnapshotRows

__all__ = ["FAIR_EVERY", "AsyncMemoryRecorder"]

FAIR_EVERY = 256
"""A read yields to the event loop after this many events."""


async def _each(it: Iterator[Any]) -> AsyncIterator[Any]:
    for x in it:
        yield x


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class AsyncMemoryRecorder:
    """Asyncio backend over a :class:`MemoryRecorder` handle (see the module docstring)."""

    scheme: ClassVar[tuple[str, ...]] = MemoryRecorder.scheme
    capabilities: frozenset[Capability] = MemoryRecorder.capabilities

    def __init__(self, handle: MemoryRecorder) -> None:
        self.handle = handle
        self._waiters: set[asyncio.Future[None]] = set()

    @classmethod
    async def open_url(cls, url: StoreURL, **options: Any) -> AsyncMemoryRecorder:
        """``memory://`` or ``memory://NAME`` (see :meth:`MemoryRecorder.from_url`).

        Raises:
            ConfigError: a query parameter or unknown option.
            StoreNotFound: ``create=False`` and no store of that name exists.
        """
        return cls(MemoryRecorder.from_url(url, **options))

    def describe(self) -> str:
        """Human-readable location."""
        return self.handle.describe()

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append under the store's lock."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.append(batch, expected_version)

    async def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Append several batches (and a tracking record) atomically."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.append_many(batches, tracking)

    async def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.tracked_position(name)

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """A slice of the stream, taken when iteration starts."""
        return self._lazy(lambda: self.handle.read(stream_id, from_version, to_version, limit))

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """A slice of the global log (of the streams under ``stream_prefix``), taken when
        iteration starts."""
        return self._lazy(
            lambda: self.handle.read_all(after_position, limit, stream_prefix=stream_prefix)
        )

    async def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """See :meth:`MemoryRecorder.erase`."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.erase(stream_id, version, position, event_hash, ref, blob_key)

    async def _lazy(self, make: Any) -> AsyncIterator[Any]:
        await asyncio.sleep(0)
        for i, x in enumerate(make(), 1):
            yield x
            if i % FAIR_EVERY == 0:
                await asyncio.sleep(0)

    async def head(self, stream_id: str) -> Head | None:
        """Current head."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.head(stream_id)

    def heads(self) -> AsyncIterator[tuple[str, Head]]:
        """All heads, sorted by stream id."""
        return self._lazy(self.handle.heads)

    async def last_position(self) -> int:
        """Number of events in the log."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.last_position()

    async def wait_for(self, position: int, timeout: float) -> bool:
        """Wait (without blocking the loop) until an event beyond ``position`` exists or
        ``timeout`` passes; woken by appends of either face.

        Raises:
            StoreClosed: this handle is closed (also while waiting).
        """
        await asyncio.sleep(0)  # fair: let other tasks run
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        data = self.handle._d
        while True:
            fut: asyncio.Future[None] = loop.create_future()

            def wake(f: asyncio.Future[None] = fut) -> None:
                # Runs in the appender's thread; a loop that is gone has no waiter left.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_wake, f)

            with data.lock:
                data.watchers.add(wake)
            self._waiters.add(fut)
            try:
                # Checked after registering: an append in between still wakes us.
                if self.handle.last_position() > position:
                    return True
                left = deadline - loop.time()
                if left <= 0:
                    return False
                # asyncio.timeout, not wait_for: wait_for can swallow a cancellation
                # that races with the future's completion (Python < 3.12).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(left):
                        await fut
            finally:
                self._waiters.discard(fut)
                with data.lock:
                    data.watchers.discard(wake)

    async def meta_get(self, key: str) -> str | None:
        """A value of the store's metadata."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.meta_get(key)

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is there; return the stored value."""
        await asyncio.sleep(0)  # fair: let other tasks run
        return self.handle.meta_put_if_absent(key, value)

    async def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``."""
        await asyncio.sleep(0)  # fair: let other tasks run
        self.handle.meta_set(key, value)

    def find_duplicates(self) -> AsyncIterator[tuple[str, Any, Any, int, Any]]:
        """Uniqueness violations (none: this store cannot hold any)."""
        return _each(self.handle.find_duplicates())

    def read_model_recorder(self) -> MemoryRecorder:
        """The blocking recorder whose data this face shares (read models live there)."""
        return self.handle

    def snapshot_rows(self, event_store: Any) -> SnapshotRows:
        """The snapshot rows beside these events (shared with the blocking face)."""
        from ares_events.core.snapshots_async import DirectRows

        return DirectRows(self.handle.snapshot_store(event_store))

    async def close(self) -> None:
        """End this handle: later calls raise StoreClosed, waiters wake up with it."""
        self.handle.close()
        for fut in list(self._waiters):
            _wake(fut)
