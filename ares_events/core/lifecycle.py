"""Safe close for backends: an operation gate that ``close()`` drains (docs/architecture.md).

Every backend runs each unit of work inside :meth:`OperationGate.op`, and its ``close()``
calls :meth:`OperationGate.close` before releasing connections; lazy reads hold the gate
one page at a time. :class:`AsyncOperationGate` is the same gate for asyncio backends;
:func:`settle` is how a cancelled asyncio write waits for its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

from ares_events.errors import StoreClosed

__all__ = ["DEFAULT_CLOSE_GRACE", "AsyncOperationGate", "OperationGate", "settle"]

DEFAULT_CLOSE_GRACE: Final = 2.0
"""Seconds ``close()`` lets in-flight operations finish before it interrupts them."""


class _Gate:
    """What both gates share: the closed flag and the cheap check."""

    __slots__ = ("_active", "_closed", "where")

    def __init__(self, where: str) -> None:
        self.where = where
        self._active = 0
        self._closed = False

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called (operations may still be draining)."""
        return self._closed

    def check(self, action: str | None = None) -> None:
        """Raise :class:`StoreClosed` when closed (a cheap check with no bookkeeping).

        Raises:
            StoreClosed: the store is closed or closing.
        """
        if self._closed:
            raise StoreClosed(self.where, action)


class OperationGate(_Gate):
    """Counts in-flight operations; refuses new ones once closing (docs/architecture.md).

    Args:
        where: the store's redacted URL, for :class:`StoreClosed` messages.
    """

    __slots__ = ("_cond", "_local", "_lock")

    def __init__(self, where: str) -> None:
        super().__init__(where)
        # enter() and exit() take the condition's lock itself: its C methods, not the
        # Condition's Python ones, on every operation.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._local = threading.local()

    def enter(self, action: str | None = None) -> None:
        """Start an operation; pair with :meth:`exit` (``op()`` does both).

        Raises:
            StoreClosed: the store is closed or closing.
        """
        with self._lock:
            self.check(action)
            self._active += 1
        local = self._local
        local.n = getattr(local, "n", 0) + 1

    def exit(self) -> None:
        """End an operation started with :meth:`enter`."""
        local = self._local
        local.n -= 1
        with self._lock:
            self._active -= 1
            if self._closed:  # close() is the only waiter, and it waits once closed
                self._cond.notify_all()

    @contextmanager
    def op(self, action: str | None = None) -> Iterator[None]:
        """One operation: refused with :class:`StoreClosed` once closing, counted while
        it runs so :meth:`close` can wait for it.

        Raises:
            StoreClosed: the store is closed or closing.
        """
        self.enter(action)
        try:
            yield
        finally:
            self.exit()

    def close(self, *, interrupt: Callable[[], None] | None = None) -> bool:
        """Refuse new operations and wait for the ones in flight in other threads, until
        they are done (which an ``interrupt`` makes prompt).

        Args:
            interrupt: called once after :data:`DEFAULT_CLOSE_GRACE` if some are still
                running (e.g. cancel their statements); they then fail with
                :class:`StoreClosed`.

        Returns:
            True for the first call (the caller releases its resources), False when the
            gate was already closed.
        """
        with self._cond:
            first = not self._closed
            self._closed = True
        mine = getattr(self._local, "n", 0)
        start = time.monotonic()
        interrupted = interrupt is None
        with self._cond:
            while self._active > mine:
                waited = time.monotonic() - start
                if not interrupted and waited >= DEFAULT_CLOSE_GRACE:
                    interrupted = True
                    self._cond.release()
                    try:
                        assert interrupt is not None
                        interrupt()
                    finally:
                        self._cond.acquire()
                    continue
                wait = 0.05 if interrupted else DEFAULT_CLOSE_GRACE - waited
                self._cond.wait(max(wait, 0.001))
        return first


class AsyncOperationGate(_Gate):
    """The gate for backends whose operations are coroutines on one event loop: counts
    in-flight operations, refuses new ones once closing, and lets :meth:`close` *await*
    the ones in flight (never blocking the loop). No lock: one loop runs them all.

    Args:
        where: the store's redacted URL, for :class:`StoreClosed` messages.
    """

    __slots__ = ("_idle",)

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self._idle: asyncio.Event | None = None

    def enter(self, action: str | None = None) -> None:
        """Start an operation; pair with :meth:`exit`.

        Raises:
            StoreClosed: the store is closed or closing.
        """
        self.check(action)
        self._active += 1

    def exit(self) -> None:
        """End an operation started with :meth:`enter`."""
        self._active -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()

    async def close(self, *, interrupt: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Refuse new operations and await the ones in flight, for at most four times
        :data:`DEFAULT_CLOSE_GRACE` (an operation that ignores its interruption must not
        hang ``close()``).

        Args:
            interrupt: awaited once after :data:`DEFAULT_CLOSE_GRACE` if some still run
                (cancel their statements); they then fail with :class:`StoreClosed`.

        Returns:
            True for the first call (the caller releases its resources), False when the
            gate was already closed.
        """
        first = not self._closed
        self._closed = True
        if self._active == 0:
            return first
        if self._idle is None:
            self._idle = asyncio.Event()
        idle = self._idle
        start = time.monotonic()
        try:
            async with asyncio.timeout(DEFAULT_CLOSE_GRACE):
                await idle.wait()
            return first
        except TimeoutError:
            pass
        if interrupt is not None:
            await interrupt()
        left = 4 * DEFAULT_CLOSE_GRACE - (time.monotonic() - start)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(left, 0.01)):
                await idle.wait()
        return first


async def settle(fut: asyncio.Future[Any]) -> None:
    """Wait until ``fut`` is done, however many cancels the caller gets meanwhile (an outer
    timeout, a task group), and retrieve its outcome (the caller's cancel is its answer
    now: not logged as never retrieved). A cancelled write calls it before re-raising, so
    nothing of the write happens after the caller saw CancelledError."""
    while not fut.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({fut})
    if not fut.cancelled():
        fut.exception()
