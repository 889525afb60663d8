"""Small helpers for the lazy iterators reads return, written once for both faces.

And :func:`maybe_await`, for user callbacks that may be coroutine functions.

A backend's read may return any iterator (a generator, a ``map``, a list's iterator):
these take the first item and close what can be closed, so a read stopped early gives its
page and its connection back at once.

It may import nothing from the package.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncIterator
from typing import Any, TypeVar

__all__ = ["aclose_iter", "aclosing_iter", "afirst", "maybe_await"]

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


async def maybe_await(value: Any) -> Any:
    """``await value`` when it is awaitable, else ``value`` (a user callback that may be
    a plain function or a coroutine function). The blocking face calls it plainly."""
    if inspect.isawaitable(value):
        return await value
    return value
