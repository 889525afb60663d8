# Generated from iterators_async.py by tools/async_to_sync.py: do not edit.
"""Small helpers for the lazy iterators reads return, written once for both faces, and
:func:`maybe_await` for user callbacks that may be coroutine functions.

It may import nothing from the package but :mod:`.faces`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from itertools import islice
from typing import Any, TypeVar

__all__ = ["close_iter", "closing_iter", "first", "maybe_await", "pages"]

T = TypeVar("T")


def close_iter(items: Any) -> None:
    """Close ``items`` when it can be closed (a generator); else do nothing."""
    close = getattr(items, "close", None)
    if close is not None:
        close()


@contextlib.contextmanager
def closing_iter(items: Iterator[T]) -> Iterator[Iterator[T]]:
    """``with`` block that closes ``items`` at its end, whatever ``items`` is."""
    try:
        yield items
    finally:
        close_iter(items)


def first(items: Iterator[T]) -> T | None:
    """The first item of ``items`` (which is closed), or None when it is empty."""
    with closing_iter(items) as each:
        for item in each:
            return item
    return None


def pages(items: Iterator[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), for work done a page at a
    time (the chain verifier); closing the pages closes ``items``. On the blocking face,
    a read with pages of its own (``event_pages()``) gives those instead (sequences of
    events, sized by the backend)."""
    try:
        event_pages = getattr(items, "event_pages", None)
        if event_pages is not None:
            # A read of pages of rows (core.row_pages.PagedRead): its own pages, whose
            # events are built as they are taken; ``size`` does not apply.
            for page in event_pages():
                yield page
        else:
            each = iter(items)  # a list would start again at every islice
            while page := list(islice(each, size)):  # one C call a page
                yield page
    finally:
        close_iter(items)


def maybe_await(value: Any) -> Any:
    """``await value`` when it is awaitable, else ``value`` (a user callback that may be
    a plain function or a coroutine function). The blocking face calls it plainly."""
    if inspect.isawaitable(value):
        return value
    return value
