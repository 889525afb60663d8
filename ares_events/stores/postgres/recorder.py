"""The PostgreSQL recorder: writes, reads and wake-ups over a psycopg_pool pool.

The guarantees and their cost (per-stream locking, positions in transaction-id order,
read visibility, wake-ups, URL parameters) are described in the package docstring,
:mod:`ares_events.stores.postgres`.

It may import the core, :mod:`ares_events.errors`, psycopg and psycopg_pool, and the other
modules of this package.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import quote

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.pq import TransactionStatus

from ares_events.core.events import (
    ErasedPayloadRef,
    PayloadRef,
    RecordedEvent,
)
from ares_events.core.lifecycle import OperationGate
from ares_events.core.recorder import (
    Capability,
    EraseOutcome,
    Head,
    StoreURL,
)
from ares_events.errors import (
    ConfigError,
    StoreClosed,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
)
from ares_events.stores.postgres.connection import (
    FIRST_WAIT,
    SingleConnection,
    open_pool,
    probe_server,
    scrub,
    translate_errors,
)
from ares_events.stores.postgres.listener import Listener, poll_for, wait_for
from ares_events.stores.postgres.options import check_schema_name, parse_options
from ares_events.stores.postgres.protocol import (
    KeyPager,
    PositionPager,
    StreamPager,
    prefix_query,
)
from ares_events.stores.postgres.schema import SCHEMA_VERSION, prepare_schema, schema_exists
from ares_events.stores.postgres.sql import (
    SELECT_SCHEMA_VERSION,
    channel_for,
    compile_statements,
    row_to_event,
)
from ares_events.stores.postgres.writes import MAX_BATCH, PostgresWrites

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.stores.snapshots import PostgresSnapshotStore

logger = logging.getLogger(__name__)

__all__ = ["MAX_BATCH", "SCHEMA_VERSION", "PostgresRecorder"]


class _Lease:
    """A connection taken with ``getconn``: exiting gives it back with ``putconn``."""

    __slots__ = ("conn", "pool")

    def __init__(self, pool: psycopg_pool.ConnectionPool[Any], conn: psycopg.Connection[Any]):
        self.pool = pool
        self.conn = conn

    def __exit__(self, *exc: object) -> None:
        self.pool.putconn(self.conn)


def _lease(
    pool: psycopg_pool.ConnectionPool[Any], timeout: float | None
) -> tuple[psycopg.Connection[Any], _Lease]:
    conn = pool.getconn(timeout)
    return conn, _Lease(pool, conn)


class PostgresRecorder(PostgresWrites):
    """PostgreSQL backend (see the package docstring for the guarantees and their cost).

    Attributes:
        pool: the ``psycopg_pool.ConnectionPool`` (or a pool-like wrapper of a single
            caller-owned connection) every operation draws from.
        schema: the schema holding ``ares_events``, ``ares_streams``, ``ares_snapshots``.
    """

    scheme: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    async_recorder: ClassVar[str] = (
        "ares_events.stores.postgres.recorder_async:AsyncPostgresRecorder"
    )
    """The native asyncio face (``ae.open_async_store``)."""
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.PERSISTENT,
            Capability.MULTI_PROCESS,
            Capability.WAKEUPS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
            Capability.ERASE,
        }
    )

    def __init__(
        self,
        source: psycopg_pool.ConnectionPool[Any] | psycopg.Connection[Any],
        *,
        schema: str = "public",
        migrate: bool = True,
        page_size: int = 2000,
        pool_timeout: float | None = None,
        statement_timeout: int | None = None,
        description: str | None = None,
        owns_pool: bool = False,
        secret: str | None = None,
        notify: bool = True,
        create: bool = True,
    ) -> None:
        """Use an existing pool or connection (the caller keeps ownership of either).

        Args:
            source: a ``psycopg_pool.ConnectionPool`` (opened by the caller, with
                autocommit connections: ``kwargs={"autocommit": True}``; the recorder runs its
                own transactions) or a ``psycopg.Connection`` (switched to autocommit and
                used one operation at a time).
            schema: schema of the tables; created when missing (``migrate=True``).
            migrate: apply pending migrations; False only verifies the schema version.
            page_size: rows per keyset page of a read.
            pool_timeout: seconds to wait for a free connection (default: the pool's).
            statement_timeout: milliseconds, reported in timeout errors.
            description: redacted URL for messages and ``repr``.
            owns_pool: close ``source`` in :meth:`close`.
            secret: the password, scrubbed from any driver message that might echo it.
            notify: send a NOTIFY with every append (on commit). False trades wake-ups
                (``wait_for`` then polls with backoff) for commits that do not serialize
                on the server's notification-queue lock (see docs/architecture.md).
            create: create the schema and tables when missing; False opens an existing
                store only (reporting tools) and never creates anything.

        Raises:
            ConfigError: bad schema name or page size.
            StoreNotFound: ``create=False`` and the schema holds no ares-events store.
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        check_schema_name(schema, description or "the PostgreSQL store")
        if type(page_size) is not int or page_size <= 0:
            raise ConfigError(f"postgresql page_size must be a positive int, got {page_size!r}")
        self.schema = schema
        self.page_size = page_size
        self._secret = secret or None
        self._owns_pool = owns_pool
        self._pool_timeout = pool_timeout
        self._statement_timeout = statement_timeout
        self._listener: Listener | None = None
        self._inflight: set[psycopg.Connection[Any]] = set()
        self._inflight_lock = threading.Lock()
        self._listener_lock = threading.Lock()
        self.notify = notify
        self._heads: dict[str, Head] = {}
        self.predict_heads = True
        """Use the one-statement fast path when the head can be predicted (see above)."""
        self.pool: Any
        if isinstance(source, psycopg_pool.ConnectionPool):
            self.pool = source
            conninfo, kw = source.conninfo, source.kwargs
            # psycopg_pool >= 3.3 also accepts callables returning them.
            self._listen_args: tuple[str, dict[str, Any]] = (
                conninfo() if callable(conninfo) else conninfo,
                dict((kw() if callable(kw) else kw) or {}),
            )
        elif isinstance(source, psycopg.Connection):
            if not source.autocommit:
                if source.info.transaction_status != TransactionStatus.IDLE:
                    raise ConfigError(
                        "the psycopg connection given to PostgresRecorder is inside a "
                        "transaction; pass an idle connection (it is switched to autocommit)"
                    )
                source.autocommit = True
            self.pool = SingleConnection(source)
            pw = source.pgconn.password
            self._listen_args = (
                source.info.dsn,
                {"password": pw.decode()} if pw else {},
            )
        else:
            raise ConfigError(
                "PostgresRecorder needs a psycopg_pool.ConnectionPool or a psycopg.Connection, "
                f"got {type(source).__name__}"
            )
        self._description = description or self._describe_conn()
        self._gate = OperationGate(self._description)
        self._sql = compile_statements(schema)
        self.channel = channel_for(schema)
        if not create:
            self._require_schema()
        self._prepare_schema(migrate)
        logger.info("opened postgresql store %s (schema %s)", self._description, schema)

    # -- opening -------------------------------------------------------------------------

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> PostgresRecorder:
        """Open ``postgresql://user:pw@host:port/db?schema=...&pool_max=...&sslmode=...``.

        Keyword ``options`` (``schema``, ``pool_min``, ``pool_max``, ``pool_timeout``,
        ``statement_timeout``, ``page_size``, ``migrate``) override URL parameters.

        Raises:
            ConfigError: an unknown or invalid parameter (lists the valid ones).
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        opts = parse_options(url, options)
        pool = open_pool(opts, secret=url.password)
        try:
            if opts.pool_min:
                pool.wait(timeout=max(opts.pool_timeout, 1.0))
            return cls(
                pool,
                schema=opts.schema,
                migrate=bool(opts.migrate),
                page_size=opts.page_size,
                pool_timeout=opts.pool_timeout,
                statement_timeout=opts.statement_timeout,
                description=opts.where,
                owns_pool=True,
                secret=url.password,
                notify=opts.notify,
                create=opts.create,
            )
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise StoreUnavailable(
                f"cannot open {opts.pool_min} connection(s) to {opts.where} "
                f"within {opts.pool_timeout:g}s"
            ) from exc
        except BaseException:
            pool.close()
            raise

    def describe(self) -> str:
        """The store's URL, redacted (no password)."""
        return self._description

    def snapshot_store(self, event_store: EventStore) -> PostgresSnapshotStore:
        """The snapshot store in this schema (``EventStore.snapshots`` asks for it)."""
        from ares_events.stores.snapshots import PostgresSnapshotStore

        return PostgresSnapshotStore(event_store, self)

    def __repr__(self) -> str:
        return f"PostgresRecorder({self._description!r}, schema={self.schema!r})"

    def _describe_conn(self) -> str:
        try:
            with self.pool.connection(self._pool_timeout) as conn:
                info = conn.info
                user = quote(info.user or "", safe="")
                return f"postgresql://{user}@{info.host}:{info.port}/{info.dbname}"
        except Exception:  # only a label; the first real call reports errors
            return "postgresql://(caller-provided connection)"

    # -- errors and connections -----------------------------------------------------------

    def _translate_errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Map driver and pool errors to ares_events errors (one place; always ``from exc``)."""
        return translate_errors(
            what,
            self._description,
            statement_timeout=self._statement_timeout,
            timeout_label=self._timeout_label,
            secret=self._secret,
        )

    def _timeout_label(self) -> str:
        t = self._pool_timeout
        if t is None:
            t = getattr(self.pool, "timeout", None)
        return f"{t:g}s" if isinstance(t, int | float) else "the pool timeout"

    @contextlib.contextmanager
    def _conn(self, what: str, *, translate: bool = True) -> Iterator[psycopg.Connection[Any]]:
        """One unit of work on a pooled connection: the operation gate (close waits for
        it), the outage diagnosis and the error mapping, in one place.

        ``translate=False`` maps only the checkout's errors and leaves the driver errors of
        the block to the caller (who names its own action), except after ``close()``.

        Raises:
            StoreClosed: the store is closed, or was closed while this ran.
            StoreUnavailable: the server is unreachable, or the pool is exhausted.
            StoreError: any other database error.
        """
        gate = self._gate
        gate.enter(what)
        try:
            with self._translate_errors(what):
                conn, cm = self._checkout(what)
            with self._inflight_lock:
                self._inflight.add(conn)
            try:
                with self._translate_errors(what) if translate else contextlib.nullcontext():
                    try:
                        yield conn
                    except BaseException as exc:
                        if not cm.__exit__(type(exc), exc, exc.__traceback__):
                            raise
                    else:
                        cm.__exit__(None, None, None)
            finally:
                with self._inflight_lock:
                    self._inflight.discard(conn)
        except (StoreError, psycopg.Error) as exc:
            if gate.closed and not isinstance(exc, StoreClosed):
                raise StoreClosed(self._description, what) from exc
            raise
        finally:
            gate.exit()

    def _checkout(self, what: str) -> tuple[psycopg.Connection[Any], Any]:
        """A pooled connection and the entered ``pool.connection()`` context to exit.

        Waits :data:`FIRST_WAIT` seconds, then asks the server directly: an unreachable
        server is reported at once; a reachable one means a busy pool, so the rest of
        ``pool_timeout`` is waited for.

        Raises:
            StoreUnavailable: the server does not answer.
            psycopg_pool.PoolTimeout: no connection within ``pool_timeout``.
        """
        pool = self.pool
        total = self._pool_timeout
        if total is None:
            total = getattr(pool, "timeout", None)
        if isinstance(pool, SingleConnection):
            cm = pool.connection(total)
            return cm.__enter__(), cm
        # getconn/putconn, not pool.connection(): that also enters the connection's own
        # context (a commit or rollback call, ~5 us), which an autocommit connection
        # left idle by every operation here does not need; putconn resets anything else.
        if total is None or total <= FIRST_WAIT:
            return _lease(pool, total)
        started = time.monotonic()
        try:
            return _lease(pool, FIRST_WAIT)
        except psycopg_pool.PoolTimeout:
            if self._gate.closed:
                raise
        conninfo, kwargs = self._listen_args
        problem = probe_server(conninfo, kwargs)
        if problem is not None:
            raise StoreUnavailable(
                f"{what} in {self._description}: the PostgreSQL server cannot be reached "
                f"({scrub(' '.join(str(problem).split()), self._secret)})"
            ) from problem
        return _lease(pool, max(total - (time.monotonic() - started), 0.001))

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection for the block (snapshots, projections, admin).

        Raises:
            StoreClosed: the store is closed (also: closed while the block ran).
            StoreUnavailable: the server is unreachable or no connection became free
                within ``pool_timeout``.
        """
        with self._conn("taking a connection", translate=False) as conn:
            yield conn

    def _query(self, what: str, query: sql.Composed, args: tuple[Any, ...]) -> list[Any]:
        with self._conn(what) as conn:
            return conn.execute(query, args, binary=True).fetchall()

    # -- schema ----------------------------------------------------------------------------

    def _prepare_schema(self, migrate: bool) -> None:
        where = f"schema {self.schema!r} of {self._description}"
        with self._conn(f"preparing {where}") as conn:
            prepare_schema(conn, self.schema, where, migrate)

    def _require_schema(self) -> None:
        """``create=False``: the schema must already hold an ares-events store.

        Raises:
            StoreNotFound: it does not exist, or holds no ares-events tables.
        """
        with self._conn("looking for the store") as conn:
            problem = schema_exists(conn, self.schema)
        if problem is not None:
            raise StoreNotFound(self._description, f"{problem} (create it with `ares-events init`)")

    def schema_version(self) -> int:
        """The schema version recorded in ``ares_meta`` (``ares-events init`` prints it).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        query = sql.SQL(SELECT_SCHEMA_VERSION).format(s=sql.Identifier(self.schema))
        rows = self._query("reading the schema version", query, ())
        return int(rows[0][0]) if rows else 0

    # -- reads -----------------------------------------------------------------------------

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read of one stream on ``(version, position)`` (each page a short
        statement)."""
        pager = StreamPager(stream_id, from_version, to_version, limit, self.page_size)
        what = f"read of stream {stream_id!r}"
        query = self._sql["stream"]
        while (args := pager.args()) is not None:
            rows = self._query(what, query, args)
            yield from map(row_to_event, rows)
            pager.advance(rows)

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read in global order, only below the visibility bound (module
        docstring); only the streams under ``stream_prefix`` when given."""
        query, bounds = prefix_query(self._sql, stream_prefix)
        pager = PositionPager(after_position, limit, self.page_size, bounds)
        while (args := pager.args()) is not None:
            rows = self._query("read_all", query, args)
            yield from map(row_to_event, rows)
            pager.advance(rows)

    def head(self, stream_id: str) -> Head | None:
        """The stream's head row."""
        rows = self._query(f"head of stream {stream_id!r}", self._sql["head"], (stream_id,))
        return Head(rows[0][0], rows[0][1]) if rows else None

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every head, paged by stream id."""
        pager = KeyPager(self.page_size)
        while (args := pager.args()) is not None:
            rows = self._query("listing streams", self._sql["heads"], args)
            for sid, version, h in rows:
                yield sid, Head(version, h)
            pager.advance(rows)

    def last_position(self) -> int:
        """Highest position visible to ``read_all`` (0 when empty)."""
        return int(self._query("last_position", self._sql["last"], ())[0][0])

    # -- erasure ---------------------------------------------------------------------------

    def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """Erase one payload in one transaction. The payload leaves the live row at once;
        its old row version is dead and VACUUM reclaims it (see docs/proofs.md for what
        PostgreSQL keeps on disk until then)."""
        what = f"erase of stream {stream_id!r} version {version}"
        with self._conn(what) as conn, conn.transaction():
            cur = conn.execute(
                self._sql["erase"],
                (ref.to_json().decode(), stream_id, version, position, event_hash),
            )
            if cur.rowcount != 1:
                return EraseOutcome(False)
            refs = 0
            if blob_key:
                row = conn.execute(
                    self._sql["blob_refs"], (PayloadRef.like_key(blob_key),)
                ).fetchone()
                refs = int(row[0]) if row else 0
        return EraseOutcome(True, refs)

    # -- metadata and integrity scans ----------------------------------------------------

    def meta_get(self, key: str) -> str | None:
        """A value of the ``ares_meta`` table (the store's identity lives there)."""
        rows = self._query("reading the store's metadata", self._sql["meta"], (key,))
        return str(rows[0][0]) if rows else None

    def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is there; return the stored value."""
        with self._conn("writing the store's metadata") as conn, conn.transaction():
            conn.execute(self._sql["meta_insert"], (key, value))
            row = conn.execute(self._sql["meta"], (key,)).fetchone()
        assert row is not None
        return str(row[0])

    def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what is there."""
        with self._conn("writing the store's metadata") as conn:
            conn.execute(self._sql["meta_upsert"], (key, value))

    def find_duplicates(self) -> Iterator[tuple[str, Any, Any, int, Any]]:
        """Rows that break a uniqueness rule: ``(kind, stream_id or event id, version,
        count, position)`` with kind ``duplicate_version``, ``duplicate_position`` or
        ``duplicate_event_id`` (for the audit; a healthy schema has none)."""
        q = self._sql
        for sid, version, n, pos in self._query("audit scan", q["dup_versions"], ()):
            yield "duplicate_version", sid, version, int(n), pos
        for sid, version, n, pos in self._query("audit scan", q["dup_positions"], ()):
            yield "duplicate_position", sid, version, int(n), pos
        for eid, n, pos in self._query("audit scan", q["dup_ids"], ()):
            yield "duplicate_event_id", eid, None, int(n), pos

    # -- wake-ups --------------------------------------------------------------------------

    def _connect_listener(self) -> psycopg.Connection[Any]:
        conninfo, kwargs = self._listen_args
        kwargs = {**kwargs, "autocommit": True}
        return psycopg.Connection.connect(conninfo, **kwargs)

    def _get_listener(self) -> Listener:
        with self._listener_lock:
            self._gate.check("waiting for events")
            if self._listener is None:
                self._listener = Listener(
                    self._connect_listener, self.channel, self._description, self._secret
                )
            return self._listener

    def wait_for(self, position: int, timeout: float) -> bool:
        """Block until an event after ``position`` is visible to ``read_all``, or
        ``timeout`` seconds pass. Woken by ``NOTIFY``; never misses a wake-up (the position
        is rechecked after LISTEN is active and after every notification).

        Returns:
            True when :meth:`last_position` is beyond ``position``.

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        deadline = time.monotonic() + max(timeout, 0.0)
        if not self.notify:
            return poll_for(self.last_position, position, deadline)
        return wait_for(self._get_listener(), self.last_position, position, timeout, deadline)

    # -- lifecycle -------------------------------------------------------------------------

    def _interrupt(self) -> None:
        """After close()'s grace: cancel the statements still running and, for a pool this
        store owns, fail the callers still waiting for a connection."""
        with self._inflight_lock:
            conns = list(self._inflight)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=2.0)
        if self._owns_pool:
            with contextlib.suppress(Exception):
                self.pool.close(timeout=0.0)

    def close(self) -> None:
        """Refuse new calls, wait for (or cancel) the ones in flight in other threads, stop
        the listener and close the pool (when this store opened it). No connection of this
        store's pool outlives the call. Idempotent.
        """
        if not self._gate.close(interrupt=self._interrupt):
            return
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._owns_pool:
            self.pool.close()
        logger.debug("closed postgresql store %s", self._description)
