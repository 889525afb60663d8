"""Where a framework adapter's storage work runs: the blocking face over a blocking store in
worker threads (the frameworks run one event loop per thread or per request, so nothing
may belong to the first loop), or the asyncio face on a given asyncio store's own loop.

It may import anything in the package (an integration is top layer), and no framework.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, Self, TypeVar

from ares_events.core.events import validate_name
from ares_events.core.store import EventStore
from ares_events.errors import ConfigError, InvalidEvent

if TYPE_CHECKING:
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["MISS", "Adapter", "AsyncAdapter", "Faces", "Table", "stream_name"]

B = TypeVar("B")
A = TypeVar("A")
V = TypeVar("V")
MISS: Final = object()
"""What :meth:`Table.get` returns for a missing key when the table makes no values."""


def stream_name(prefix: str, name: object, field: str) -> str:
    """``prefix + name``, checked as a stream name (InvalidEvent when it is not one)."""
    if not isinstance(name, str):
        raise InvalidEvent(field, f"must be a str, got {type(name).__name__}")
    if not name:
        raise InvalidEvent(field, "must not be empty")
    return validate_name(prefix + name, field)


class Table(Generic[V]):
    """What an adapter keeps per key (a stream's verified view and its lock, a decoded
    value), made on first use by ``make`` or :meth:`put`; beyond ``size`` entries the
    least recently used is dropped. The table's own lock is never held across I/O, so
    different streams run side by side."""

    def __init__(self, make: Callable[[Any], V] | None = None, size: int | None = None) -> None:
        self._make = make
        self._size = size
        self._map: OrderedDict[Any, V] = OrderedDict()
        self._guard = threading.Lock()

    def get(self, key: Any) -> V:
        """The value of ``key``; when there is none, made (no ``make``: :data:`MISS`)."""
        with self._guard:
            got = self._map.get(key, MISS)
            if got is not MISS:
                self._map.move_to_end(key)
            elif self._make is not None:
                got = self._map[key] = self._make(key)
                self._trim()
            return got  # type: ignore[return-value]

    def put(self, key: Any, value: V) -> None:
        """Set the value of ``key`` (it keeps its place in the LRU order when it had one)."""
        with self._guard:
            self._map[key] = value
            self._trim()

    def _trim(self) -> None:
        while self._size is not None and len(self._map) > self._size:
            self._map.popitem(last=False)


class Faces(Generic[B, A]):
    """An adapter's work: ``blocking`` (a blocking store's, made on first use from
    ``url``) or ``asynchronous`` (an asyncio store's; None: the adapter has none).

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
    """

    def __init__(
        self,
        url: str | None,
        store: EventStore | AsyncEventStore | None,
        blocking: Callable[[EventStore], B],
        asynchronous: Callable[[AsyncEventStore], A] | None = None,
    ) -> None:
        if (url is None) == (store is None):
            raise ConfigError("give exactly one of url= or store=")
        self._url = url
        self._make = blocking
        self._owns = store is None
        self.sync: B | None = None
        self.aio: A | None = None
        if asynchronous is not None and store is not None and not isinstance(store, EventStore):
            self.aio = asynchronous(store)
        elif store is not None:
            self.sync = blocking(store)  # type: ignore[arg-type]
        self._opening = threading.Lock()  # one store opened from url=, by one thread

    def __repr__(self) -> str:
        got: Any = self.aio if self.aio is not None else self.sync
        return repr(got.store) if got is not None else "'not open'"

    def blocking(self) -> B:
        """The blocking work, its store opened from ``url`` when not open yet."""
        got = self.sync
        if got is None:
            with self._opening:
                got = self.sync
                if got is None:
                    from ares_events.stores import open_store

                    assert self._url is not None
                    got = self.sync = self._make(open_store(self._url))
        return got

    async def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """``op`` of the asyncio work on this loop, else of the blocking work in a worker
        thread (its own locks serialise the threads of every event loop)."""
        if self.aio is not None:
            return await getattr(self.aio, op)(*args, **kwargs)
        return await asyncio.to_thread(lambda: getattr(self.blocking(), op)(*args, **kwargs))

    def close(self) -> None:
        """Close the store when it was opened from ``url``; a later call opens it again."""
        if self._owns and self.sync is not None:
            got: Any
            got, self.sync = self.sync, None
            got.store.close()


class Adapter:
    """A framework adapter over :class:`Faces` (``_faces``), shown as its store."""

    _faces: Faces[Any, Any]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._faces})"


class AsyncAdapter(Adapter):
    """An adapter with asyncio methods, closed by ``await close()`` or ``async with``."""

    async def close(self) -> None:
        """Close the store when this object opened it (from ``url=``); a later call opens
        it again."""
        await asyncio.to_thread(self._faces.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
