"""Event stores as ports of :mod:`~ares_events.core.sansio` steps.

Replay, recovery, snapshots, verification and the run journal are written once as steps
that ask for store operations by name; these ports answer them:

- :class:`StorePort`: a blocking :class:`~ares_events.core.store.EventStore`;
- :class:`AsyncStorePort`: an :class:`~ares_events.core.store_async.AsyncEventStore`;
- :class:`ThreadedStorePort`: a blocking store from asyncio code, each call in a worker
  thread (what ``AsyncJournal`` does over a blocking store).

The calls: ``head``, ``stream_version``, ``append(stream_id, events, expected)``,
``read_at(stream_id, version)`` (the first event at or after ``version``, or None),
``open_read(stream_id, from_version, to_version, limit)`` then ``next_chunk(handle)``
(up to :data:`CHUNK` events; empty at the end) and ``close_read(handle)``;
``open_source(stream_id, start)``: the stream from ``start`` straight from the system of record (the
backend under any cache, no blob fetching), read with ``next_chunk`` too; and
``invoke(fn, *args)``: a method of another object of the same face (a snapshot store;
awaited on the async port, run in a worker thread on the threaded one), and
``user(fn, *args)``: a user callback, called where the caller runs and awaited when it
returns an awaitable.

It may import the core's other modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.sansio import maybe_await

if TYPE_CHECKING:
    from ares_events.core.events import AppendResult, ExpectedVersion, NewEvent, RecordedEvent
    from ares_events.core.recorder import Head
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["CHUNK", "AsyncStorePort", "StorePort", "ThreadedStorePort", "port_for"]

CHUNK: Final = 512
"""Events per ``next_chunk`` answer."""


class StorePort:
    """A blocking event store as a port (see the module docstring)."""

    __slots__ = ("store",)

    def __init__(self, store: EventStore) -> None:
        self.store = store

    def head(self, stream_id: str) -> Head | None:
        return self.store.head(stream_id)

    def stream_version(self, stream_id: str) -> int:
        return self.store.stream_version(stream_id)

    def append(
        self, stream_id: str, events: Sequence[NewEvent], expected: ExpectedVersion
    ) -> AppendResult:
        return self.store.append(stream_id, events, expected_version=expected)

    def read_at(self, stream_id: str, version: int) -> RecordedEvent | None:
        return next(iter(self.store.read(stream_id, from_version=version, limit=1)), None)

    def open_read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        return iter(self.store.read(stream_id, from_version, to_version, limit))

    def open_source(self, stream_id: str, start: int = 1) -> Iterator[RecordedEvent]:
        recorder = getattr(self.store.recorder, "inner", self.store.recorder)
        return iter(recorder.read(stream_id, start, None, None))

    def next_chunk(self, it: Iterator[RecordedEvent]) -> list[RecordedEvent]:
        return list(itertools.islice(it, CHUNK))

    def close_read(self, it: Iterator[RecordedEvent]) -> None:
        close = getattr(it, "close", None)
        if close is not None:
            close()

    def invoke(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)

    def user(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class AsyncStorePort:
    """An asyncio event store as a port (see the module docstring)."""

    __slots__ = ("store",)

    def __init__(self, store: AsyncEventStore) -> None:
        self.store = store

    async def head(self, stream_id: str) -> Head | None:
        return await self.store.head(stream_id)

    async def stream_version(self, stream_id: str) -> int:
        return await self.store.stream_version(stream_id)

    async def append(
        self, stream_id: str, events: Sequence[NewEvent], expected: ExpectedVersion
    ) -> AppendResult:
        return await self.store.append(stream_id, events, expected_version=expected)

    async def read_at(self, stream_id: str, version: int) -> RecordedEvent | None:
        async with contextlib.aclosing(
            self.store.read(stream_id, from_version=version, limit=1)  # type: ignore[type-var]
        ) as events:
            async for e in events:
                return e
        return None

    async def open_read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        return self.store.read(stream_id, from_version, to_version, limit)

    async def open_source(self, stream_id: str, start: int = 1) -> AsyncIterator[RecordedEvent]:
        recorder: Any = self.store.recorder
        uncached = getattr(recorder, "uncached", None)
        if callable(uncached):
            recorder = uncached()
        return recorder.read(stream_id, start, None, None)  # type: ignore[no-any-return]

    async def next_chunk(self, ait: AsyncIterator[RecordedEvent]) -> list[RecordedEvent]:
        out: list[RecordedEvent] = []
        async for e in ait:
            out.append(e)
            if len(out) == CHUNK:
                break
        return out

    async def close_read(self, ait: AsyncIterator[RecordedEvent]) -> None:
        aclose = getattr(ait, "aclose", None)
        if aclose is not None:
            await aclose()

    async def invoke(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await maybe_await(fn(*args))

    async def user(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await maybe_await(fn(*args))


class ThreadedStorePort:
    """A blocking event store driven from asyncio code: each call in a worker thread
    (``asyncio.to_thread``); user callbacks run on the loop."""

    __slots__ = ("_port",)

    def __init__(self, store: EventStore) -> None:
        self._port = StorePort(store)

    async def head(self, stream_id: str) -> Head | None:
        return await asyncio.to_thread(self._port.head, stream_id)

    async def stream_version(self, stream_id: str) -> int:
        return await asyncio.to_thread(self._port.stream_version, stream_id)

    async def append(
        self, stream_id: str, events: Sequence[NewEvent], expected: ExpectedVersion
    ) -> AppendResult:
        return await asyncio.to_thread(self._port.append, stream_id, events, expected)

    async def read_at(self, stream_id: str, version: int) -> RecordedEvent | None:
        return await asyncio.to_thread(self._port.read_at, stream_id, version)

    async def open_read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        return self._port.open_read(stream_id, from_version, to_version, limit)

    async def open_source(self, stream_id: str, start: int = 1) -> Iterator[RecordedEvent]:
        return self._port.open_source(stream_id, start)

    async def next_chunk(self, it: Iterator[RecordedEvent]) -> list[RecordedEvent]:
        return await asyncio.to_thread(self._port.next_chunk, it)

    async def close_read(self, it: Iterator[RecordedEvent]) -> None:
        self._port.close_read(it)

    async def invoke(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def user(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await maybe_await(fn(*args))


def port_for(store: Any) -> AsyncStorePort | ThreadedStorePort:
    """The asyncio port of ``store``: native for an async store, worker threads for a
    blocking one."""
    from ares_events.core.store_async import AsyncEventStore

    if isinstance(store, AsyncEventStore):
        return AsyncStorePort(store)
    return ThreadedStorePort(store)
