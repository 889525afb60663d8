"""Wake-ups of the PostgreSQL backend: one ``LISTEN`` connection in a background thread
(:class:`Listener`), or in a task of the event loop for the asyncio face
(:class:`AsyncListener`); both wait with the same steps (:func:`wait_steps`).

Appends send a ``NOTIFY`` on the store's channel (unless ``notify=false``); waiters block
on the listener's condition and recheck the visible position after every notification,
so a wake-up is never missed. Without notifications, waiting polls with backoff.

It may import the core, psycopg and this package's SQL and connection helpers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from ares_events.core.sansio import Call, Steps, arun, run
from ares_events.stores.postgres.connection import scrub
from ares_events.stores.postgres.sql import LISTEN

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncListener",
    "Listener",
    "await_for",
    "poll_for",
    "poll_steps",
    "wait_for",
    "wait_steps",
]


class Listener:
    """One LISTEN connection in a background thread; waiters block on a condition."""

    def __init__(self, connect: Any, channel: str, where: str, secret: str | None) -> None:
        self._connect = connect
        self._secret = secret
        self._channel = channel
        self._where = where
        self.cond = threading.Condition()
        self.generation = 0
        self.listening = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ares-events-listen", daemon=True)
        self._thread.start()

    def _bump(self, listening: bool) -> None:
        with self.cond:
            self.generation += 1
            self.listening = listening
            self.cond.notify_all()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self._connect()
                conn.execute(sql.SQL(LISTEN).format(channel=sql.Identifier(self._channel)))
                self._bump(True)
                backoff = 0.05
                while not self._stop.is_set():
                    for _ in conn.notifies(timeout=0.2):
                        self._bump(True)
            except Exception as exc:  # the thread must survive any failure
                logger.warning(
                    "wake-up listener of %s lost its connection (%s: %s); retrying in %.2fs",
                    self._where,
                    type(exc).__name__,
                    scrub(str(exc).strip(), self._secret),
                    backoff,
                )
                self._bump(False)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def wait_until_ready(self, timeout: float) -> bool:
        """Block until LISTEN is active (or ``timeout``)."""
        with self.cond:
            return self.cond.wait_for(lambda: self.listening, timeout)

    def close(self) -> None:
        """Stop the thread and close its connection."""
        self._stop.set()
        self._thread.join(5.0)


def wait_steps(position: int, timeout: float, deadline: float) -> Steps[bool]:
    """Wait until ``last_position()`` is beyond ``position``, or until ``deadline``
    (``time.monotonic()``; ``timeout`` seconds from the call): the logic both faces run.

    The position is rechecked after LISTEN is active and after every notification. Port
    calls: ``ready(timeout)``, ``state()`` -> ``(generation, listening)``,
    ``last_position()``, ``changed(generation, seconds)`` -> bool.
    """
    yield Call("ready", min(max(timeout, 0.0), 5.0))
    poll = 0.0  # 0: rely on notifications alone
    while True:
        gen, healthy = yield Call("state")
        if (yield Call("last_position")) > position:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not healthy:
            # Listener reconnecting: poll gently meanwhile.
            poll = min(max(poll * 2, 0.05), 1.0)
        wait = left if poll == 0.0 else min(left, poll)
        woke = yield Call("changed", gen, wait)
        if woke and healthy:
            # A commit was announced but may not be visible yet (an older transaction
            # still runs, maybe one that will not notify): poll with backoff until then.
            poll = min(max(poll * 2, 0.01), 1.0)


def poll_steps(position: int, deadline: float) -> Steps[bool]:
    """Poll ``last_position()`` with backoff (5 ms doubling to 250 ms) until ``deadline``.
    Port calls: ``last_position()``, ``sleep(seconds)``."""
    delay = 0.005
    while True:
        if (yield Call("last_position")) > position:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        yield Call("sleep", min(delay, left))
        delay = min(delay * 2, 0.25)


class _Port:
    """The blocking listener and position reader as the port of the waiting steps."""

    __slots__ = ("_listener", "last_position")

    def __init__(self, listener: Listener | None, last_position: Callable[[], int]) -> None:
        self._listener = listener
        self.last_position = last_position

    def ready(self, timeout: float) -> bool:
        assert self._listener is not None
        return self._listener.wait_until_ready(timeout)

    def state(self) -> tuple[int, bool]:
        assert self._listener is not None
        with self._listener.cond:
            return self._listener.generation, self._listener.listening

    def changed(self, gen: int, wait: float) -> bool:
        listener = self._listener
        assert listener is not None
        with listener.cond:
            return listener.cond.wait_for(lambda: listener.generation != gen, wait)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def wait_for(
    listener: Listener,
    last_position: Callable[[], int],
    position: int,
    timeout: float,
    deadline: float,
) -> bool:
    """Block until ``last_position()`` is beyond ``position``, or until ``deadline``
    (see :func:`wait_steps`)."""
    return run(wait_steps(position, timeout, deadline), _Port(listener, last_position))


def poll_for(last_position: Callable[[], int], position: int, deadline: float) -> bool:
    """Poll ``last_position()`` with backoff until ``deadline`` (see :func:`poll_steps`)."""
    return run(poll_steps(position, deadline), _Port(None, last_position))


class AsyncListener:
    """The asyncio listener: one LISTEN ``AsyncConnection`` in a task of the store's loop;
    waiters await a generation change (see :func:`wait_steps`).

    Args:
        connect: a coroutine function returning an autocommit ``AsyncConnection``.
        channel: the NOTIFY channel.
        where: the store's redacted URL (for log lines).
        secret: the password, scrubbed from logged driver messages.
    """

    def __init__(
        self,
        connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        channel: str,
        where: str,
        secret: str | None,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._where = where
        self._secret = secret
        self.generation = 0
        self.listening = False
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def bump(self, listening: bool) -> None:
        """A notification (or a change of health): wake every waiter."""
        self.generation += 1
        self.listening = listening
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self._connect()
                await conn.execute(sql.SQL(LISTEN).format(channel=sql.Identifier(self._channel)))
                self.bump(True)
                backoff = 0.05
                async for _ in conn.notifies():
                    self.bump(True)
                raise psycopg.OperationalError("the notification stream ended")
            except Exception as exc:  # the task must survive any failure
                logger.warning(
                    "wake-up listener of %s lost its connection (%s: %s); retrying in %.2fs",
                    self._where,
                    type(exc).__name__,
                    scrub(str(exc).strip(), self._secret),
                    backoff,
                )
                self.bump(False)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await conn.close()

    async def wait_until_ready(self, timeout: float) -> bool:
        """Wait until LISTEN is active (or ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self.listening:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._changed.wait()
        return True

    async def changed(self, gen: int, wait: float) -> bool:
        """Wait until the generation moves past ``gen`` (or ``wait`` seconds)."""
        if self.generation != gen:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait):
                await self._changed.wait()
        return self.generation != gen

    async def close(self) -> None:
        """Stop the task and close its connection; waiters wake up."""
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task
        self.bump(False)


class _AsyncPort:
    """The asyncio listener and position reader as the port of the waiting steps."""

    __slots__ = ("_listener", "last_position")

    def __init__(
        self, listener: AsyncListener | None, last_position: Callable[[], Awaitable[int]]
    ) -> None:
        self._listener = listener
        self.last_position = last_position

    async def ready(self, timeout: float) -> bool:
        assert self._listener is not None
        return await self._listener.wait_until_ready(timeout)

    async def state(self) -> tuple[int, bool]:
        assert self._listener is not None
        return self._listener.generation, self._listener.listening

    async def changed(self, gen: int, wait: float) -> bool:
        assert self._listener is not None
        return await self._listener.changed(gen, wait)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def await_for(
    listener: AsyncListener | None,
    last_position: Callable[[], Awaitable[int]],
    position: int,
    timeout: float,
) -> bool:
    """The asyncio twin of :func:`wait_for` (``listener=None``: :func:`poll_for`)."""
    deadline = time.monotonic() + max(timeout, 0.0)
    port = _AsyncPort(listener, last_position)
    if listener is None:
        return await arun(poll_steps(position, deadline), port)
    return await arun(wait_steps(position, timeout, deadline), port)
