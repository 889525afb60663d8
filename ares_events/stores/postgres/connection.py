# Generated from connection_async.py by tools/async_to_sync.py: do not edit.
"""Connections of the PostgreSQL backend, per face: the pool (its reconnect cap and
health check), the outage probe, a clean rollback.

It may import :mod:`ares_events.errors`, psycopg, psycopg_pool and this package's driver
glue.
"""

from __future__ import annotations

import contextlib
import select
import time
from typing import TYPE_CHECKING, Any, Final

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from ares_events.stores.postgres.driver import close_at_exit
from ares_events.stores.postgres.sql import ROLLBACK, SET_STATEMENT_TIMEOUT

if TYPE_CHECKING:
    from ares_events.stores.postgres.options import PostgresOptions

__all__ = [
    "MAX_RECONNECT_DELAY",
    "PROBE_TIMEOUT",
    "AresPool",
    "check_alive",
    "open_pool",
    "probe_server",
    "rollback_quietly",
]

PROBE_TIMEOUT: Final = 3
"""Seconds (libpq ``connect_timeout``) the direct question to the server may take."""
MAX_RECONNECT_DELAY: Final = 1.0
"""The pool retries a lost server at least this often (seconds)."""


class AresPool(psycopg_pool.ConnectionPool):
    """A psycopg_pool pool whose reconnection delay is capped, so a server that comes back
    is used within about :data:`MAX_RECONNECT_DELAY` seconds, and whose :meth:`getconn`
    drops dead connections without a pause."""

    def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        if attempt is not None and getattr(attempt, "delay", 0.0) > MAX_RECONNECT_DELAY / 2:
            attempt.delay = MAX_RECONNECT_DELAY / 2  # doubled (after a failure) to the cap
        super()._add_connection(attempt, growing)

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """A pooled connection that passed :func:`check_alive`. After a restart or a
        failover every idle connection is dead: each is dropped (and replaced) and the
        next one tried at once, where psycopg_pool's own ``check`` would sleep 1, 2, 4...
        seconds after each and could use up the whole ``timeout``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            conn = super().getconn(max(deadline - time.monotonic(), 0.001))
            try:
                check_alive(conn)
            except psycopg.Error:
                conn.close()  # also when only its socket was found unusable
                self._putconn(conn, from_getconn=True)  # replaced, as by psycopg_pool
            except BaseException:
                self._putconn(conn, from_getconn=True)  # a cancellation: not lost
                raise
            else:
                return conn


def probe_server(conninfo: str, connect_kwargs: dict[str, Any]) -> BaseException | None:
    """Connect once, directly, with a short timeout: None when the server answers, else
    the error (to report a dead server as such, not as an exhausted pool)."""
    try:
        timeout = int(connect_kwargs.get("connect_timeout") or PROBE_TIMEOUT)
    except (TypeError, ValueError):
        timeout = PROBE_TIMEOUT
    timeout = max(1, min(timeout, PROBE_TIMEOUT))
    kwargs = {**connect_kwargs, "connect_timeout": str(timeout), "autocommit": True}
    try:
        conn = psycopg.Connection.connect(conninfo, **kwargs)
        conn.close()
    except psycopg.Error as exc:
        return exc
    return None


def check_alive(conn: psycopg.Connection[Any]) -> None:
    """The pool's health check (in :meth:`AresPool.getconn`): ping a connection only
    when it has something to read (a terminated backend's error and EOF after a restart
    or ``pg_terminate_backend``), which fails a dead one without a round trip otherwise.

    Raises:
        psycopg.OperationalError: the connection is closed or its socket unusable.
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError) as exc:
        raise psycopg.OperationalError(f"the connection's socket is unusable: {exc}") from exc
    if readable:
        conn.execute("")


def rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End a failed append's transaction so the connection goes back to the pool clean."""
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        with contextlib.suppress(psycopg.Error):
            conn.execute(ROLLBACK, prepare=False)


def open_pool(opts: PostgresOptions) -> AresPool:
    """The pool for ``opts``, with the reconnect cap, the health check (in its
    ``getconn``) and ``statement_timeout`` on every connection; the asyncio pool is not
    opened yet (``await pool.open()``), the blocking one is."""
    configure = None
    if opts.statement_timeout is not None:
        value = f"{opts.statement_timeout}ms"

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute(SET_STATEMENT_TIMEOUT, (value,))

    pool = AresPool(
        "",
        kwargs=opts.connect_kwargs,
        min_size=opts.pool_min,
        max_size=opts.pool_max,
        timeout=opts.pool_timeout,
        configure=configure,
        name="ares-events",
        open=False,
    )
    pool.open()
    return close_at_exit(pool)  # its worker threads, stopped while they still can be
