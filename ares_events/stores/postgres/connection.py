"""Connections of the PostgreSQL backend: pool health check, a caller's single connection,
clean rollback, outage diagnosis, and the one place driver errors become ares_events errors.

Outages: the pool (:class:`AresPool`) retries a lost server at least every
:data:`MAX_RECONNECT_DELAY` seconds (psycopg_pool's own backoff doubles without a useful
cap, so the first call after a restart could wait many seconds), and a caller that gets
no connection within :data:`FIRST_WAIT` seconds asks the server directly
(:func:`probe_server`): a server that does not answer is reported as unreachable at
once, instead of as an exhausted pool after ``pool_timeout``.

It may import :mod:`ares_events.errors`, psycopg, psycopg_pool and this package's SQL.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

from ares_events.errors import StoreClosed, StoreError, StoreUnavailable
from ares_events.stores.postgres.sql import ROLLBACK, SET_STATEMENT_TIMEOUT

if TYPE_CHECKING:
    from ares_events.stores.postgres.options import PostgresOptions

__all__ = [
    "FIRST_WAIT",
    "MAX_RECONNECT_DELAY",
    "PROBE_TIMEOUT",
    "AresAsyncPool",
    "AresPool",
    "SingleConnection",
    "acheck_alive",
    "aprobe_server",
    "arollback_quietly",
    "check_alive",
    "check_server",
    "open_async_pool",
    "open_pool",
    "probe_server",
    "rollback_quietly",
    "scrub",
    "translate_errors",
]


FIRST_WAIT: Final = 1.0
"""Seconds a call waits for a pooled connection before it asks the server directly."""
PROBE_TIMEOUT: Final = 3
"""Seconds (libpq ``connect_timeout``) the direct question to the server may take."""
MAX_RECONNECT_DELAY: Final = 1.0
"""The pool retries a lost server at least this often (seconds)."""


class AresPool(psycopg_pool.ConnectionPool):
    """A psycopg_pool pool whose reconnection delay is capped at
    :data:`MAX_RECONNECT_DELAY`, so a server that comes back is used within about a
    second (psycopg_pool doubles the delay after every failed attempt)."""

    def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        if attempt is not None and getattr(attempt, "delay", 0.0) > MAX_RECONNECT_DELAY / 2:
            attempt.delay = MAX_RECONNECT_DELAY / 2  # doubled to at most the cap next
        super()._add_connection(attempt, growing)


class AresAsyncPool(psycopg_pool.AsyncConnectionPool):
    """The asyncio pool with the same capped reconnection delay as :class:`AresPool`."""

    async def _add_connection(self, attempt: Any, growing: bool = False) -> None:
        if attempt is not None and getattr(attempt, "delay", 0.0) > MAX_RECONNECT_DELAY / 2:
            attempt.delay = MAX_RECONNECT_DELAY / 2  # doubled to at most the cap next
        await super()._add_connection(attempt, growing)


def _probe_kwargs(connect_kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs = dict(connect_kwargs)
    try:
        timeout = int(kwargs.get("connect_timeout") or PROBE_TIMEOUT)
    except (TypeError, ValueError):
        timeout = PROBE_TIMEOUT
    kwargs["connect_timeout"] = str(max(1, min(timeout, PROBE_TIMEOUT)))
    kwargs["autocommit"] = True
    return kwargs


def probe_server(conninfo: str, connect_kwargs: dict[str, Any]) -> BaseException | None:
    """Connect once, directly, with a short timeout: None when the server answers, else
    the error (to report a dead server as such, not as an exhausted pool)."""
    try:
        psycopg.connect(conninfo, **_probe_kwargs(connect_kwargs)).close()
    except psycopg.Error as exc:
        return exc
    return None


async def aprobe_server(conninfo: str, connect_kwargs: dict[str, Any]) -> BaseException | None:
    """The asyncio twin of :func:`probe_server`."""
    try:
        conn = await psycopg.AsyncConnection.connect(conninfo, **_probe_kwargs(connect_kwargs))
        await conn.close()
    except psycopg.Error as exc:
        return exc
    return None


def _needs_ping(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """False for a healthy idle connection (nothing to read); True when the server sent
    something (an error and EOF after a restart or ``pg_terminate_backend``).

    Raises:
        psycopg.OperationalError: the connection is closed or its socket unusable.
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError) as exc:
        raise psycopg.OperationalError(f"the connection's socket is unusable: {exc}") from exc
    return bool(readable)


def check_alive(conn: psycopg.Connection[Any]) -> None:
    """Pool ``check``: fail a connection the server has closed, without a round trip.

    An idle pooled connection has nothing to read; a terminated backend (restart,
    ``pg_terminate_backend``) has sent an error and EOF. Only then ping it, which raises
    on a dead connection (and the pool replaces it).
    """
    if _needs_ping(conn):
        conn.execute("")


async def acheck_alive(conn: psycopg.AsyncConnection[Any]) -> None:
    """The asyncio pool's ``check`` (see :func:`check_alive`)."""
    if _needs_ping(conn):
        await conn.execute("")


class SingleConnection:
    """Pool-like wrapper of one caller-owned connection (used one operation at a time)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[psycopg.Connection[Any]]:
        """The wrapped connection, held exclusively for the duration of the block."""
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise psycopg_pool.PoolTimeout(f"the connection stayed busy for {timeout} sec")
        try:
            yield self.conn
        finally:
            self._lock.release()

    def close(self) -> None:
        """The caller owns the connection: nothing to release."""


def rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End a failed append's transaction so the connection goes back to the pool clean."""
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        with contextlib.suppress(psycopg.Error):
            conn.execute(ROLLBACK, prepare=False)


async def arollback_quietly(conn: psycopg.AsyncConnection[Any]) -> None:
    """The asyncio twin of :func:`rollback_quietly`."""
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        with contextlib.suppress(psycopg.Error):
            await conn.execute(ROLLBACK, prepare=False)


def scrub(text: str, secret: str | None) -> str:
    """Remove a password (and its percent-encoded form) from a driver message."""
    if secret:
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            text = text.replace(form, "***")
    return text


class translate_errors:  # named like the function it replaced
    """Map driver and pool errors to ares_events errors (always ``from exc``), as a
    context manager (a class: every operation enters two, and a generator-based one
    costs several times more).

    Args:
        what: the operation, for the message ("append to stream 'x'", ...).
        description: the store's redacted URL.
        statement_timeout: the configured limit in milliseconds, for the message.
        timeout_label: the pool timeout as text (called only on a pool timeout).
        secret: the password, scrubbed from driver messages.

    Raises:
        StoreUnavailable: pool exhausted, statement cancelled, connection or server lost.
        StoreError: the pool is closed, or any other database error.
    """

    __slots__ = ("description", "secret", "statement_timeout", "timeout_label", "what")

    def __init__(
        self,
        what: str,
        description: str,
        *,
        statement_timeout: int | None,
        timeout_label: Callable[[], str],
        secret: str | None,
    ) -> None:
        self.what = what
        self.description = description
        self.statement_timeout = statement_timeout
        self.timeout_label = timeout_label
        self.secret = secret

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or not isinstance(exc, psycopg.Error):
            return
        what, description = self.what, self.description
        if isinstance(exc, psycopg_pool.PoolTimeout):
            raise StoreUnavailable(
                f"{what} in {description}: the connection pool is exhausted "
                f"(no free connection within {self.timeout_label()}; raise pool_max or "
                "pool_timeout)"
            ) from exc
        if isinstance(exc, psycopg_pool.PoolClosed):
            raise StoreClosed(description, what) from exc
        if isinstance(exc, psycopg.errors.QueryCanceled):
            limit = (
                f"statement_timeout of {self.statement_timeout} ms"
                if self.statement_timeout
                else "statement_timeout"
            )
            raise StoreUnavailable(
                f"{what} in {description} was cancelled by the server ({limit} "
                "exceeded, or cancelled by an administrator); nothing was written"
                if what.startswith("append")
                else f"{what} in {description} was cancelled by the server ({limit} "
                "exceeded, or cancelled by an administrator)"
            ) from exc
        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            raise StoreUnavailable(
                f"{what} in {description} failed: {scrub(str(exc).strip(), self.secret)}"
            ) from exc
        raise StoreError(
            f"{what} in {description} failed: {scrub(str(exc).strip(), self.secret)}"
        ) from exc


def open_pool(opts: PostgresOptions, *, secret: str | None) -> psycopg_pool.ConnectionPool[Any]:
    """Check the server with one direct connection, then open the pool.

    The direct connection first gives a clear error (refused, no such database, auth)
    instead of a pool that retries in the background.

    Raises:
        StoreUnavailable: the server cannot be reached (the message never holds ``secret``).
    """
    kwargs = opts.connect_kwargs
    configure = None
    if opts.statement_timeout is not None:
        value = f"{opts.statement_timeout}ms"

        def configure(conn: psycopg.Connection[Any]) -> None:
            conn.execute(SET_STATEMENT_TIMEOUT, (value,))

    check_server(opts, secret=secret)
    return AresPool(
        "",
        kwargs=kwargs,
        min_size=opts.pool_min,
        max_size=opts.pool_max,
        timeout=opts.pool_timeout,
        check=check_alive,
        configure=configure,
        name="ares-events",
        open=True,
    )


def check_server(opts: PostgresOptions, *, secret: str | None) -> None:
    """One direct connection: a clear error (refused, no such database, auth) instead of
    a pool that retries in the background.

    Raises:
        StoreUnavailable: the server cannot be reached (the message never holds ``secret``).
    """
    try:
        psycopg.connect(**opts.connect_kwargs).close()
    except psycopg.Error as exc:
        raise StoreUnavailable(
            f"cannot connect to {opts.where}: {scrub(str(exc).strip(), secret)}"
        ) from exc


def open_async_pool(opts: PostgresOptions) -> psycopg_pool.AsyncConnectionPool[Any]:
    """The asyncio pool for ``opts`` (not opened yet: ``await pool.open()``), with the
    same reconnect cap, health check and ``statement_timeout`` as :func:`open_pool`."""
    configure = None
    if opts.statement_timeout is not None:
        value = f"{opts.statement_timeout}ms"

        async def configure(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(SET_STATEMENT_TIMEOUT, (value,))

    return AresAsyncPool(
        "",
        kwargs=opts.connect_kwargs,
        min_size=opts.pool_min,
        max_size=opts.pool_max,
        timeout=opts.pool_timeout,
        check=acheck_alive,
        configure=configure,
        name="ares-events-async",
        open=False,
    )
