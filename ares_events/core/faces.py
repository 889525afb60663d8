"""Which face a module is: ``if ASYNC:`` marks what only the asyncio face does;
``tools/async_to_sync.py`` keeps the ``else`` branch in the generated blocking module.

It may import nothing from the package.
"""

from __future__ import annotations

import inspect
from typing import Final, TypeVar

__all__ = ["ASYNC", "blocking", "on_asyncio"]

ASYNC: Final = True
"""True in the asyncio sources; the generated blocking modules have no such test."""

_S = TypeVar("_S")


def blocking(store: _S, what: str, twin: str | None = None) -> _S:
    """``store``, refused with a TypeError naming ``what`` when it is on the asyncio face.

    A blocking function handed an asyncio store gets coroutines back from it, and fails far
    from the call (or reads nothing and reports nothing). Most asyncio functions take
    either face; the few that cannot use :func:`on_asyncio`.
    """
    if _is_asyncio(store):
        instead = f"use {twin}, or " if twin else ""
        raise TypeError(
            f"{what} is blocking and was given an asyncio store ({type(store).__name__}):"
            f" {instead}open the store with ae.open_store"
        )
    return store


def on_asyncio(store: _S, what: str, twin: str) -> _S:
    """``store``, refused with a TypeError naming ``what`` when it is a blocking store (for
    the few asyncio functions that cannot take one: its calls would run before the
    ``await`` that fails on their result)."""
    if not _is_asyncio(store):
        raise TypeError(
            f"{what} is for asyncio stores and was given a blocking one "
            f"({type(store).__name__}): use {twin}, or open the store with ae.open_async_store"
        )
    return store


def _is_asyncio(store: object) -> bool:
    return inspect.iscoroutinefunction(getattr(type(store), "head", None))
