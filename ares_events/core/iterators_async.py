"""Small helpers for the lazy iterators reads return, written once for both faces, and
:func:`maybe_await` for user callbacks that may be coroutine functions.

It may import nothing from the package but :mod:`.faces`.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from itertools import islice
from typing import Any, TypeVar

from ares_events.core.faces import ASYNC

__all__ = ["aclose_iter", "aclosing_iter", "afirst", "apages", "maybe_await"]

T = TypeVar("T")


async def aclose_iter(items: Any) -> None:
    """Close ``items`` when it can be closed (a generator); else do nothing."""
    close = getattr(items, "aclose", None)
    if close is not None:
        await close()


@contextlib.asynccontextmanager
async def aclosing_iter(items: AsyncIterator[T]) -> AsyncIterator[AsyncIterator[T]]:
    """``with`` block that closes ``items`` at its end, whatever ``items`` is."""
    try:
        yield items
    finally:
        await aclose_iter(items)


async def afirst(items: AsyncIterator[T]) -> T | None:
    """The first item of ``items`` (which is closed), or None when it is empty."""
    async with aclosing_iter(items) as each:
        async for item in each:
            return item
    return None


async def apages(items: AsyncIterator[T], size: int) -> AsyncIterator[list[T]]:
    """``items`` in lists of ``size`` (the last one shorter), for work done a page at a
    time (the chain verifier); closing the pages closes ``items``. On the blocking face,
    a read with pages of its own (``event_pages()``) gives those instead (sequences of
    events, sized by the backend)."""
    try:
        if ASYNC:
            page: list[T] = []
            async for item in items:
                page.append(item)
                if len(page) == size:
                    yield page
                    page = []
            if page:
                yield page
        else:
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
        await aclose_iter(items)


async def maybe_await(value: Any) -> Any:
    """``await value`` when it is awaitable, else ``value`` (a user callback that may be
    a plain function or a coroutine function). The blocking face calls it plainly."""
    if inspect.isawaitable(value):
        return await value
    return value
