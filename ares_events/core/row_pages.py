"""Reads that come a page of rows at a time, with events built only when taken
(docs/performance.md). The blocking face only.

It may import only :mod:`ares_events.chain` and the core's :mod:`.events`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

from ares_events.chain import _native
from ares_events.core.events import _MISSING, RecordedEvent

__all__ = ["EventPage", "PagedRead", "event_maker"]

# None without the native module, or with one built before it had this function.
_row_to_event: Any = getattr(_native, "row_to_event", None)

Row = tuple[Any, ...]
Make = Callable[[Row], RecordedEvent]


def event_maker(slow: Make = RecordedEvent._from_row) -> Make:
    """The row-to-event function: the native builder for rows without a payload reference
    (``slow`` for the others), or ``slow`` itself without the native module."""
    if _row_to_event is None:
        return slow
    return functools.partial(_row_to_event, RecordedEvent, _MISSING, slow)


class EventPage(Sequence[RecordedEvent]):
    """A page of rows seen as the events they hold; an event is built when taken."""

    __slots__ = ("make", "rows")

    def __init__(self, rows: list[Row], make: Make) -> None:
        self.rows = rows
        self.make = make

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[RecordedEvent]:
        return map(self.make, self.rows)

    @overload
    def __getitem__(self, i: int) -> RecordedEvent: ...
    @overload
    def __getitem__(self, i: slice) -> EventPage: ...
    def __getitem__(self, i: int | slice) -> RecordedEvent | EventPage:
        if isinstance(i, slice):
            return EventPage(self.rows[i], self.make)
        return self.make(self.rows[i])

    def __repr__(self) -> str:
        return f"<EventPage of {len(self.rows)} rows>"


class PagedRead(itertools.chain):  # type: ignore[type-arg]
    """The events of one read, from pages of rows (docs/performance.md).

    Build it with :meth:`over`. Iterate it, or take :meth:`event_pages` before the first
    event, not both. ``close()`` closes the source of pages.
    """

    __slots__ = ("_make", "_slow", "_source", "_started")

    _make: Make
    _slow: Make
    _source: Iterator[list[Row]]
    _started: list[bool]

    @classmethod
    def over(
        cls, row_pages: Iterator[list[Row]], slow: Make = RecordedEvent._from_row
    ) -> PagedRead:
        """The read of ``row_pages``; ``slow`` builds the events of rows the native
        builder leaves (those with a payload reference)."""
        started = [False]
        make = event_maker(slow)
        self: PagedRead = cls.from_iterable(_page_maps(started, row_pages, make))  # type: ignore[assignment]
        self._source = row_pages
        self._make = make
        self._slow = slow
        self._started = started
        return self

    def with_slow(self, wrap: Callable[[Make], Make]) -> PagedRead:
        """The same read (which must not have started) whose rows with a payload reference
        are built by ``wrap(slow)`` (a store attaching its blob store to them)."""
        _start(self._started)
        return PagedRead.over(self._source, wrap(self._slow))

    def event_pages(self) -> Iterator[EventPage]:
        """The read's pages, as :class:`EventPage`\\ s (before any event was taken)."""
        _start(self._started)
        make = self._make
        for rows in self._source:
            yield EventPage(rows, make)

    def close(self) -> None:
        """Close the source of pages (a read stopped early gives its page back)."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


def _page_maps(
    started: list[bool], row_pages: Iterator[list[Row]], make: Make
) -> Iterator[Iterator[RecordedEvent]]:
    """The chain's source: a ``map`` building the events of each page of rows."""
    _start(started)
    for rows in row_pages:
        yield map(make, rows)


def _start(started: list[bool]) -> None:
    if started[0]:
        raise RuntimeError("this read has started: iterate it, or take its pages")
    started[0] = True
