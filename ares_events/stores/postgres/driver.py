"""Driver glue both PostgreSQL faces share: :class:`DriverErrors`, password scrubbing, the
check at open and :class:`SingleConnection`.

It may import :mod:`ares_events.errors`, psycopg and psycopg_pool.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar
from urllib.parse import quote

import psycopg
import psycopg_pool

from ares_events.errors import StoreClosed, StoreError, StoreUnavailable

if TYPE_CHECKING:
    from ares_events.stores.postgres.options import PostgresOptions

__all__ = [
    "FIRST_WAIT",
    "DriverErrors",
    "SingleConnection",
    "check_server",
    "relays_loss",
    "scrub",
]


FIRST_WAIT: Final = 1.0
"""Seconds a call waits for a pooled connection before it asks the server directly."""


class SingleConnection:
    """Pool-like wrapper of one caller-owned connection (used one operation at a time)."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self._lock = threading.RLock()

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        """The wrapped connection, held exclusively until :meth:`putconn`."""
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise psycopg_pool.PoolTimeout(f"the connection stayed busy for {timeout} sec")
        return self.conn

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        """Give the connection back (the next caller may take it)."""
        self._lock.release()

    def close(self, timeout: float | None = None) -> None:
        """The caller owns the connection: nothing to release."""


def scrub(text: str, secret: str | None) -> str:
    """Remove a password (and its percent-encoded form) from a driver message."""
    if secret:
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            text = text.replace(form, "***")
    return text


def relays_loss(exc: psycopg.Error, messages: tuple[str, ...]) -> bool:
    """Whether the error's own message holds one of ``messages`` (a lost node relayed as
    another kind of error). Not its DETAIL, which may quote stored values: a unique
    violation on a key that reads like a lost node is still a unique violation."""
    text = exc.diag.message_primary or str(exc)
    return any(m in text for m in messages)


@dataclass(slots=True, repr=False)  # repr would show the secret
class DriverErrors:
    """Map driver and pool errors to ares_events errors (always ``from exc``), as a
    context manager (a class: every operation enters two, and a generator-based one
    costs several times more). ``timeout_label`` is called only on a pool timeout;
    ``secret`` is scrubbed from driver messages; an error whose own message holds one of
    ``lost`` (:func:`relays_loss`) is a lost node however the server classed it (Citus
    relays a worker's loss as an internal error).

    Raises:
        StoreUnavailable: pool exhausted, statement cancelled, connection, server or
            node lost.
        StoreError: the pool is closed, or any other database error.
    """

    what: str
    description: str
    _: KW_ONLY
    statement_timeout: int | None
    timeout_label: Callable[[], str]
    secret: str | None
    lost: tuple[str, ...] = ()

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
            limit = "statement_timeout"
            if self.statement_timeout:
                limit = f"statement_timeout of {self.statement_timeout} ms"
            nothing = "; nothing was written" if what.startswith("append") else ""
            raise StoreUnavailable(
                f"{what} in {description} was cancelled by the server ({limit} "
                f"exceeded, or cancelled by an administrator){nothing}"
            ) from exc
        lost = isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)
        raise (StoreUnavailable if lost or relays_loss(exc, self.lost) else StoreError)(
            f"{what} in {description} failed: {scrub(str(exc).strip(), self.secret)}"
        ) from exc


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


_OPEN_POOLS: weakref.WeakSet[Any] = weakref.WeakSet()
_P = TypeVar("_P")


def close_at_exit(pool: _P) -> _P:
    """``pool`` (a blocking psycopg_pool pool), closed at interpreter exit if still open:
    a pool left to its finalizer waits 5 s for each worker thread it can no longer stop
    once the interpreter is finalizing (Python 3.13: ~20 s before an unclosed store's
    program ends). atexit runs while threads still run."""
    _OPEN_POOLS.add(pool)
    return pool


@atexit.register
def _close_pools() -> None:
    for pool in list(_OPEN_POOLS):
        with contextlib.suppress(Exception):  # exiting: nothing to report to
            pool.close(timeout=1.0)
