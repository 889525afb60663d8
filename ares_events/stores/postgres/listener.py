# Generated from listener_async.py by tools/async_to_sync.py: do not edit.
"""Wake-ups of the PostgreSQL backend: one ``LISTEN`` connection per store, and waiting.

It may import psycopg and this package's SQL and driver glue.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from time import sleep
from typing import Any, Final

import psycopg
from psycopg import sql

from ares_events.stores.postgres.driver import scrub
from ares_events.stores.postgres.sql import LISTEN

logger = logging.getLogger(__name__)

__all__ = ["Listener", "poll_for", "wait_for"]


class Listener:
    """One LISTEN connection, kept open (reconnecting with backoff) until :meth:`close`;
    every notification, and every change of its health, moves :attr:`generation`.

    Args:
        connect: opens an autocommit connection.
        channel: the NOTIFY channel.
        where: the store's redacted URL (for log lines).
        secret: the password, scrubbed from logged driver messages.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        channel: str,
        where: str,
        secret: str | None,
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._where = where
        self._secret = secret
        self.generation = 0
        self.bumped = float("-inf")
        """When :attr:`generation` last moved (``time.monotonic()``)."""
        self.listening = False
        self._stopped = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="ares-events-listen", daemon=True)
        self._thread.start()

    def _bump(self, listening: bool) -> None:
        self.bumped = time.monotonic()
        with self._cond:
            self.generation += 1
            self.listening = listening
            self._cond.notify_all()

    def _run(self) -> None:
        backoff = 0.05
        while not self._stopped:
            conn: psycopg.Connection[Any] | None = None
            try:
                conn = self._connect()
                conn.execute(sql.SQL(LISTEN).format(channel=sql.Identifier(self._channel)))
                self._bump(True)
                backoff = 0.05
                while not self._stopped:
                    # A bounded wait, so close() is seen within a fifth of a second.
                    for _ in conn.notifies(timeout=0.2):
                        self._bump(True)
            except Exception as exc:  # the listener must survive any failure
                logger.warning(
                    "wake-up listener of %s lost its connection (%s: %s); retrying in %.2fs",
                    self._where,
                    type(exc).__name__,
                    scrub(str(exc).strip(), self._secret),
                    backoff,
                )
                self._bump(False)
                sleep(backoff)
                backoff = min(backoff * 2, 2.0)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()

    def changed(self, gen: int, wait: float) -> bool:
        """Wait until :attr:`generation` moves past ``gen`` (or ``wait`` seconds)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.generation != gen, wait)

    def wait_until_ready(self, timeout: float) -> bool:
        """Wait until LISTEN is active (or ``timeout`` seconds)."""
        deadline = time.monotonic() + timeout
        while not self.listening:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.changed(self.generation, left)
        return True

    def close(self) -> None:
        """Stop listening and close the connection; waiters wake up."""
        self._stopped = True
        self._thread.join(5.0)
        self._bump(False)


IDLE_POLL: Final = 1.0
"""The longest a waiter goes without looking at the position (see :func:`wait_for`)."""


def wait_for(
    listener: Listener,
    last_position: Callable[[], int],
    position: int,
    timeout: float,
) -> bool:
    """Wait until ``last_position()`` is beyond ``position``, or ``timeout`` seconds.

    The position is rechecked after LISTEN is active, after every notification and at
    least every :data:`IDLE_POLL` seconds: a commit hidden behind a transaction that sends
    no notification (another writer's, a store's with ``notify=false``) becomes visible
    when that transaction ends, and nothing announces that.
    """
    deadline = time.monotonic() + max(timeout, 0.0)
    listener.wait_until_ready(min(max(timeout, 0.0), 5.0))
    # 0: rely on notifications (and the idle poll); a notification taken just before this
    # wait may announce a commit not visible yet: poll with backoff from the start then.
    poll = 0.01 if time.monotonic() - listener.bumped < IDLE_POLL else 0.0
    while True:
        gen, healthy = listener.generation, listener.listening
        if last_position() > position:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if not healthy:
            # Listener reconnecting: poll gently meanwhile.
            poll = min(max(poll * 2, 0.05), 1.0)
        woke = listener.changed(gen, min(left, poll or IDLE_POLL))
        if woke and healthy:
            # A commit was announced but may not be visible yet (an older transaction
            # still runs, maybe one that will not notify): poll with backoff until then.
            poll = min(max(poll * 2, 0.01), 1.0)


def poll_for(last_position: Callable[[], int], position: int, timeout: float) -> bool:
    """Poll ``last_position()`` with backoff (5 ms doubling to 250 ms) for ``timeout``
    seconds (a store opened with ``notify=false``)."""
    deadline = time.monotonic() + max(timeout, 0.0)
    delay = 0.005
    while True:
        if last_position() > position:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sleep(min(delay, left))
        delay = min(delay * 2, 0.25)
