"""Which face a module is: ``if ASYNC:`` marks what only the asyncio face does;
``tools/async_to_sync.py`` keeps the ``else`` branch in the generated blocking module.

It may import nothing from the package.
"""

from __future__ import annotations

import inspect
from typing import Final, TypeVar

__all__ = ["ASYNC", "blocking"]

ASYNC: Final = True
"""True in the asyncio sources; the generated blocking modules have no such test."""

_S = TypeVar("_S")


def blocking(store: _S, what: str, twin: str | None = None) -> _S:
    """``store``, refused with a TypeError naming ``what`` when it is on the asyncio face.

    A blocking function handed an asyncio store gets coroutines back from it, and fails far
    from the call (or reads nothing and reports nothing); the asyncio functions take either
    face, so only this direction is checked.
    """
    if inspect.iscoroutinefunction(getattr(type(store), "head", None)):
        instead = f"use {twin}, or " if twin else ""
        raise TypeError(
            f"{what} is blocking and was given an asyncio store ({type(store).__name__}):"
            f" {instead}open the store with ae.open_store"
        )
    return store
