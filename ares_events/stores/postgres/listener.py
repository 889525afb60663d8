"""Wake-ups of the PostgreSQL backend: one ``LISTEN`` connection in a background thread.

Appends send a ``NOTIFY`` on the store's channel (unless ``notify=false``); waiters block
on the listener's condition and recheck the visible position after every notification,
so a wake-up is never missed. Without notifications, waiting polls with backoff.

It may import psycopg and this package's SQL and connection helpers.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from ares_events.stores.postgres.connection import scrub
from ares_events.stores.postgres.sql import LISTEN

logger = logging.getLogger(__name__)

__all__ = ["Listener", "poll_for", "wait_for"]


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


def wait_for(
    listener: Listener,
    last_position: Callable[[], int],
    position: int,
    timeout: float,
    deadline: float,
) -> bool:
    """Block until ``last_position()`` is beyond ``position``, or until ``deadline``
    (``time.monotonic()``; ``timeout`` seconds from the call).

    The position is rechecked after LISTEN is active and after every notification.
    """
    listener.wait_until_ready(min(max(timeout, 0.0), 5.0))
    poll = 0.0  # 0: rely on notifications alone
    while True:
        with listener.cond:
            gen = listener.generation
            healthy = listener.listening
        if last_position() > position:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not healthy:
            # Listener reconnecting: poll gently meanwhile.
            poll = min(max(poll * 2, 0.05), 1.0)
        wait = left if poll == 0.0 else min(left, poll)
        with listener.cond:
            woke = listener.cond.wait_for(lambda g=gen: listener.generation != g, wait)  # type: ignore[misc]
        if woke and healthy:
            # A commit was announced but may not be visible yet (an older transaction
            # still runs, maybe one that will not notify): poll with backoff until then.
            poll = min(max(poll * 2, 0.01), 1.0)


def poll_for(last_position: Callable[[], int], position: int, deadline: float) -> bool:
    """Poll ``last_position()`` with backoff (5 ms doubling to 250 ms) until ``deadline``."""
    delay = 0.005
    while True:
        if last_position() > position:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(delay, left))
        delay = min(delay * 2, 0.25)
