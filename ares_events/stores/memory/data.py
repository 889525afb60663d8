"""The memory store's tables, shared by both faces and by every handle of one name.

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ares_events.core.backend import Head
from ares_events.core.events import RecordedEvent
from ares_events.errors import StoreNotFound
from ares_events.stores.memory.read_models import MemoryReadModels

__all__ = ["MemoryData", "data_for", "fresh"]


@dataclass
class MemoryData:
    """Everything one memory store holds, guarded by ``lock``."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    streams: dict[str, list[RecordedEvent]] = field(default_factory=dict)
    heads: dict[str, Head] = field(default_factory=dict)
    log: list[RecordedEvent] = field(default_factory=list)
    ids: dict[str, RecordedEvent] = field(default_factory=dict)
    snapshots: dict[tuple[str, str], Any] = field(default_factory=dict)
    tracking: dict[str, int] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    read_models: MemoryReadModels = field(default_factory=MemoryReadModels)
    watchers: set[Callable[[], None]] = field(default_factory=set)
    """Called (under the lock, so they must not block) after every append: how asyncio
    waiters wake up, whichever face appended."""
    cond: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)


_NAMED: dict[str, MemoryData] = {}
_NAMED_LOCK = threading.Lock()


def data_for(name: str | None, *, create: bool, where: str) -> MemoryData:
    """The data of ``memory://NAME`` (created on first use), or a private store's.

    Raises:
        StoreNotFound: ``create=False`` and there is no such store.
    """
    if not name:
        if not create:
            raise StoreNotFound(where, "a private memory store is always new")
        return MemoryData()
    with _NAMED_LOCK:
        data = _NAMED.get(name)
        if data is None:
            if not create:
                raise StoreNotFound(where, "no store of that name in this process")
            data = _NAMED[name] = MemoryData()
        return data


def fresh(e: RecordedEvent) -> RecordedEvent:
    """A new event sharing only immutable parts with the stored one, so a reader that
    mutates its decoded payload or metadata cannot change what later reads return."""
    return RecordedEvent(*e[:12])
