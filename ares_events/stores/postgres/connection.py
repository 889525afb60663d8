# Generated from connection_async.py by tools/async_to_sync.py: do not edit.
"""Connections of the PostgreSQL backend, per face: the pool, the outage probe, a clean
rollback.

It may import :mod:`ares_events.errors`, psycopg, psycopg_pool and this package's driver
glue.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from ares_events.stores.postgres.driver import capped_delay, needs_ping, probe_kwargs
from ares_events.stores.postgres.sql import ROLLBACK, SET_STATEMENT_TIMEOUT

if TYPE_CHECKING:
    from ares_events.stores.postgres.options import PostgresOptions

__all__ = ["AresPool", "check_alive", "open_pool", "probe_server", "rollback_quietly"]


class AresPool(psycopg_pool.ConnectionPool):
    """A psycopg_pool pool whose reconnection delay is capped (:func:`.driver.capped_delay`)."""

    def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        capped_delay(attempt)
        super()._add_connection(attempt, growing)


def probe_server(conninfo: str, connect_kwargs: dict[str, Any]) -> BaseException | None:
    """Connect once, directly, with a short timeout: None when the server answers, else
    the error (to report a dead server as such, not as an exhausted pool)."""
    try:
        conn = psycopg.Connection.connect(conninfo, **probe_kwargs(connect_kwargs))
        conn.close()
    except psycopg.Error as exc:
        return exc
    return None


def check_alive(conn: psycopg.Connection[Any]) -> None:
    """Pool ``check``: ping a connection only when it has something to read (a terminated
    backend's error and EOF), which fails a dead one without a round trip otherwise."""
    if needs_ping(conn):
        conn.execute("")


def rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End a failed append's transaction so the connection goes back to the pool clean."""
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        with contextlib.suppress(psycopg.Error):
            conn.execute(ROLLBACK, prepare=False)


def open_pool(opts: PostgresOptions) -> AresPool:
    """The pool for ``opts``, with the reconnect cap, the health check and
    ``statement_timeout`` on every connection; the asyncio pool is not opened yet
    (``await pool.open()``), the blocking one is."""
    configure = None
    if opts.statement_timeout is not None:
        value = f"{opts.statement_timeout}ms"

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute(SET_STATEMENT_TIMEOUT, (value,))

    opened = True
    return AresPool(
        "",
        kwargs=opts.connect_kwargs,
        min_size=opts.pool_min,
        max_size=opts.pool_max,
        timeout=opts.pool_timeout,
        check=check_alive,
        configure=configure,
        name="ares-events",
        open=opened,
    )
