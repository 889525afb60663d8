"""PostgreSQL backend: the production system of record (``postgresql://`` or ``postgres://``).

Connections come from a psycopg_pool ``ConnectionPool`` (autocommit connections; each
operation takes one and gives it back). A connection found dead when it is taken from the
pool (the server restarted, an admin terminated the backend) is replaced, so the next call
after a restart reconnects. The check costs no round trip in the normal case: a
terminated backend leaves an error and EOF readable on the socket, and only then is the
connection pinged.

**Writes** follow the protocol in :mod:`ares_events.core.recorder` with no global lock:
``pg_advisory_xact_lock(hashtextextended(stream_id, 0))`` serializes appends to *one stream
only*. Two paths, the same guarantees:

* Fast path, one statement (one round trip, its own transaction): the batch is sealed
  against the head this store *predicts* (the head its last append to the stream left, or
  "new stream"), and ``ares_append()`` (migration step 3) takes the stream lock, checks
  the event ids, reads the head, and writes the events, the head and a ``pg_notify`` only
  when the head is the predicted one. Nothing forks: the check runs under the lock in the
  transaction that inserts.
* Locked path, two round trips (a cache miss on an existing stream, or a misprediction):
  ``BEGIN``; the lock; then, in a later statement (a fresh snapshot that sees every append
  that held the lock before), the head, the id check and ``pg_current_xact_id()``; the
  batch is sealed against that head; one statement inserts the events (``unnest`` of
  binary arrays), upserts the head and queues ``pg_notify``; ``COMMIT``.

**Global positions** follow transaction-id order: ``position = xid * 65536 + index``
(``xid`` is the 64-bit ``xid8`` of the appending transaction, so batches hold at most
65,535 events). ``read_all`` and ``last_position`` only return rows below a bound computed
in the same statement: the smallest xid in progress in the statement's snapshot
(``pg_snapshot_xip(pg_current_snapshot())``), ignoring xids then running in *another*
database (they cannot write here), else the snapshot's xmax. Every transaction with a
smaller xid has ended and is seen by the snapshot, and every transaction still running or
yet to start has a larger xid, so no row can ever appear below a position already
returned. A reader polling with ``after_position`` therefore never skips an event whose
transaction committed after a later one became visible. Positions are strictly increasing
and stable but not gap-free (no ``GAPLESS_POSITIONS``). The cost: a write transaction in
progress in the same database (any table; or a prepared transaction, or one whose session
this role cannot see) holds back ``read_all`` visibility until it ends; reads of one stream
(``read``) are not affected.

**Wake-ups**: a background thread holds one ``LISTEN`` connection per store (opened on the
first :meth:`PostgresRecorder.wait_for`); waiters recheck :meth:`last_position` after every
notification, so a wake-up is never missed.

URL parameters owned here: ``schema`` (default ``public``; created when missing),
``pool_min`` (default 1), ``pool_max`` (default 10), ``pool_timeout`` (seconds to wait for
a free connection, default 30; then ``StoreUnavailable``), ``statement_timeout``
(milliseconds, set on every pooled connection), ``page_size`` (rows per read page, default
2000), ``migrate`` (true|false, default true), ``notify`` (true|false, default true: a
NOTIFY with every append; false for write-heavy loads with several writers, and
``wait_for`` then polls). Every other parameter must be a libpq option (``sslmode``,
``connect_timeout`` (default 10 here), ``application_name``, ...) and is passed through.
Passwords go percent-encoded in the URL's userinfo, never in the query.
"""

from __future__ import annotations

import contextlib
import logging
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import quote

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.pq import TransactionStatus

from ares_events.core.events import (
    STREAM_EXISTS,
    ExpectedVersion,
    PayloadRef,
    RecordedEvent,
    check_expected_version,
)
from ares_events.core.recorder import (
    AppendOutcome,
    Batch,
    Capability,
    Head,
    SealedEvent,
    StoreURL,
    TrackingRecord,
    check_tracking,
    parse_bool,
)
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    InvalidEvent,
    SchemaVersionError,
    StoreError,
    StoreUnavailable,
)
from ares_events.stores._migrations.postgres import MIGRATIONS

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.stores.snapshots import PostgresSnapshotStore

logger = logging.getLogger(__name__)

__all__ = ["PostgresRecorder"]

SCHEMA_VERSION: Final = len(MIGRATIONS)
MAX_BATCH: Final = 65535
"""Events per append: the low 16 bits of a position index the event in its batch."""
_POSITION_SHIFT: Final = 65536
_MAX_XID: Final = 2**47  # xid * 65536 must stay below 2**63
_HEAD_CACHE_SIZE: Final = 10_000  # predicted heads kept (cleared when full)
_FAST_OK, _FAST_HEAD_MOVED, _FAST_DUPLICATE = 0, 1, 2

# -- SQL ------------------------------------------------------------------------------------
# Statements are templates: {s} is the quoted schema (psycopg.sql.Identifier).

_COLUMNS: Final = (
    "stream_id, version, position, event_id::text, type, module, payload, metadata, "
    "recorded_at, prev_hash, hash, payload_ref"
)
# Rows below this bound are final. The bound is the smallest xid that was in progress in
# this statement's snapshot, skipping xids that are (checked after the snapshot was taken)
# still running in *another* database, which can never write here; with none left, the
# snapshot's xmax. Every transaction below the bound has ended and was seen by the
# snapshot, and every one that is running, or starts later, has an xid at or above it.
# An xid whose session is gone, is in this database, or is hidden from this role bounds
# the read (conservative). A row's position is xid * 65536 + index.
_VISIBLE_BOUND: Final = (
    "(SELECT coalesce(min(x.xid::text::bigint),"
    " pg_snapshot_xmax(pg_current_snapshot())::text::bigint) * 65536"
    " FROM pg_snapshot_xip(pg_current_snapshot()) AS x(xid)"
    " WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid = x.xid::xid"
    " AND a.datid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())))"
)

BEGIN: Final = "BEGIN"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
LOCK_STREAM: Final = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
SELECT_HEAD_FOR_APPEND: Final = (
    "SELECT h.version, h.head_hash, pg_current_xact_id()::text::bigint, "
    "EXISTS (SELECT 1 FROM {s}.ares_events WHERE event_id = ANY(%s::text[]::uuid[])) "
    "FROM (SELECT 1) AS one LEFT JOIN {s}.ares_streams h ON h.stream_id = %s"
)
SELECT_IDS: Final = (
    f"SELECT {_COLUMNS} FROM {{s}}.ares_events WHERE event_id = ANY(%s::text[]::uuid[])"
)
INSERT_EVENTS: Final = (
    "WITH ins AS ("
    " INSERT INTO {s}.ares_events (position, stream_id, version, event_id, type, module,"
    " payload, payload_ref, metadata, recorded_at, prev_hash, hash)"
    " SELECT %b::bigint * 65536 + x.i - 1, %b::text, %b::bigint + x.i, x.e::uuid,"
    " x.t, x.m, x.p, x.r, x.md, x.a, x.ph, x.h"
    " FROM unnest(%b::text[], %b::text[], %b::text[], %b::bytea[], %b::text[], %b::bytea[],"
    " %b::text[], %b::bytea[], %b::bytea[]) WITH ORDINALITY AS x(e, t, m, p, r, md, a, ph, h, i)"
    "), head AS ("
    " INSERT INTO {s}.ares_streams (stream_id, version, head_hash)"
    " VALUES (%b::text, %b::bigint, %b::bytea)"
    " ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,"
    " head_hash = excluded.head_hash"
    ") SELECT CASE WHEN %b::text IS NULL THEN NULL ELSE pg_notify(%b::text, %b::text) END"
)
APPEND_FAST: Final = (
    "SELECT r_status, r_version, r_hash, r_xid FROM {s}.ares_append(%b::text, %b::bigint, "
    "%b::bytea, %b::text, %b::text[], %b::text[], %b::text[], %b::bytea[], %b::text[], "
    "%b::bytea[], %b::text[], %b::bytea[], %b::bytea[])"
)
# append_many: the advisory locks of every stream (and of the tracking name) in ONE order,
# sorted by lock key, so two multi-stream appends can never deadlock (and a single-stream
# append holds one lock only). The sort feeds the aggregate row by row in key order.
LOCK_MANY: Final = (
    "SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT DISTINCT hashtextextended(x, 0) AS k"
    " FROM unnest(%s::text[]) AS x ORDER BY 1) AS keys"
)
SELECT_HEADS_FOR_APPEND: Final = (
    "SELECT h.version, h.head_hash FROM unnest(%s::text[]) WITH ORDINALITY AS x(s, i)"
    " LEFT JOIN {s}.ares_streams h ON h.stream_id = x.s ORDER BY x.i"
)
SELECT_XID_IDS_TRACKING: Final = (
    "SELECT pg_current_xact_id()::text::bigint, "
    "EXISTS (SELECT 1 FROM {s}.ares_events WHERE event_id = ANY(%s::text[]::uuid[])), "
    "(SELECT position FROM {s}.ares_tracking WHERE name = %s)"
)
INSERT_MANY: Final = (
    "WITH ins AS ("
    " INSERT INTO {s}.ares_events (position, stream_id, version, event_id, type, module,"
    " payload, payload_ref, metadata, recorded_at, prev_hash, hash)"
    " SELECT %b::bigint * 65536 + x.i - 1, x.sid, x.v, x.e::uuid,"
    " x.t, x.m, x.p, x.r, x.md, x.a, x.ph, x.h"
    " FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[], %b::bytea[],"
    " %b::text[], %b::bytea[], %b::text[], %b::bytea[], %b::bytea[])"
    " WITH ORDINALITY AS x(sid, v, e, t, m, p, r, md, a, ph, h, i)"
    "), head AS ("
    " INSERT INTO {s}.ares_streams (stream_id, version, head_hash)"
    " SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bytea[])"
    " ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,"
    " head_hash = excluded.head_hash"
    "), trk AS ("
    " INSERT INTO {s}.ares_tracking (name, position) SELECT %b::text, %b::bigint"
    " WHERE %b::text IS NOT NULL"
    " ON CONFLICT (name) DO UPDATE SET position = excluded.position"
    ") SELECT CASE WHEN %b::text IS NULL THEN NULL ELSE pg_notify(%b::text, %b::text) END"
)
SELECT_TRACKING: Final = "SELECT position FROM {s}.ares_tracking WHERE name = %s"
SELECT_STREAM: Final = (
    f"SELECT {_COLUMNS} FROM {{s}}.ares_events WHERE stream_id = %s "
    "AND version >= %s AND version <= %s ORDER BY version LIMIT %s"
)
SELECT_ALL: Final = (
    f"SELECT {_COLUMNS} FROM {{s}}.ares_events WHERE position > %s "
    f"AND position < {_VISIBLE_BOUND} ORDER BY position LIMIT %s"
)
SELECT_LAST_POSITION: Final = (
    f"SELECT coalesce(max(position), 0) FROM {{s}}.ares_events WHERE position < {_VISIBLE_BOUND}"
)
SELECT_HEAD: Final = "SELECT version, head_hash FROM {s}.ares_streams WHERE stream_id = %s"
SELECT_HEADS: Final = (
    "SELECT stream_id, version, head_hash FROM {s}.ares_streams "
    "WHERE stream_id > %s ORDER BY stream_id LIMIT %s"
)
LISTEN: Final = "LISTEN {channel}"
SET_STATEMENT_TIMEOUT: Final = "SELECT set_config('statement_timeout', %s, false)"
# Schema management: serialized across processes by a transaction-scoped advisory lock.
LOCK_MIGRATIONS: Final = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
SCHEMA_EXISTS: Final = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)"
META_EXISTS: Final = "SELECT to_regclass(%s) IS NOT NULL"
CREATE_SCHEMA: Final = "CREATE SCHEMA IF NOT EXISTS {s}"
CREATE_META: Final = (
    "CREATE TABLE IF NOT EXISTS {s}.ares_meta (key text PRIMARY KEY, value text NOT NULL)"
)
SELECT_SCHEMA_VERSION: Final = "SELECT value FROM {s}.ares_meta WHERE key = 'schema_version'"
UPSERT_SCHEMA_VERSION: Final = (
    "INSERT INTO {s}.ares_meta (key, value) VALUES ('schema_version', %s) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)

# -- URL parameters -------------------------------------------------------------------------

_OWN_PARAMS: Final = (
    "schema",
    "pool_min",
    "pool_max",
    "pool_timeout",
    "statement_timeout",
    "page_size",
    "migrate",
    "notify",
)
# libpq options that carry a secret: refused in the query string, where they would be shown.
_SECRET_PARAMS: Final = frozenset(
    {"password", "sslpassword", "oauth_client_secret", "scram_client_key", "scram_server_key"}
)


def _libpq_options() -> frozenset[str]:
    return frozenset(o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults())


def _row_to_event_slow(row: Any) -> RecordedEvent:
    ref = row[11]
    return RecordedEvent(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        row[8],
        row[9],
        row[10],
        PayloadRef.from_json(ref) if ref else None,
    )


# Rows are selected in exactly the layout RecordedEvent._from_row takes (one C-level tuple
# build per event when the core provides it).
_row_to_event: Callable[[Any], RecordedEvent] = getattr(
    RecordedEvent, "_from_row", _row_to_event_slow
)


def _check_alive(conn: psycopg.Connection[Any]) -> None:
    """Pool ``check``: fail a connection the server has closed, without a round trip.

    An idle pooled connection has nothing to read; a terminated backend (restart,
    ``pg_terminate_backend``) has sent an error and EOF. Only then ping it, which raises
    on a dead connection (and the pool replaces it).
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError) as exc:
        raise psycopg.OperationalError(f"the connection's socket is unusable: {exc}") from exc
    if readable:
        conn.execute("")


class _SingleConnection:
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


class _Listener:
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
                    _scrub(str(exc).strip(), self._secret),
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


class PostgresRecorder:
    """PostgreSQL backend (see the module docstring for the guarantees and their cost).

    Attributes:
        pool: the ``psycopg_pool.ConnectionPool`` (or a pool-like wrapper of a single
            caller-owned connection) every operation draws from.
        schema: the schema holding ``ares_events``, ``ares_streams``, ``ares_snapshots``.
    """

    scheme: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.PERSISTENT,
            Capability.MULTI_PROCESS,
            Capability.WAKEUPS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
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

        Raises:
            ConfigError: bad schema name or page size.
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        if not isinstance(schema, str) or not schema or len(schema.encode()) > 63:
            raise ConfigError(f"postgresql schema must be 1-63 bytes, got {schema!r}")
        if type(page_size) is not int or page_size <= 0:
            raise ConfigError(f"postgresql page_size must be a positive int, got {page_size!r}")
        self.schema = schema
        self.page_size = page_size
        self._secret = secret or None
        self._owns_pool = owns_pool
        self._pool_timeout = pool_timeout
        self._statement_timeout = statement_timeout
        self._closed = False
        self._listener: _Listener | None = None
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
            self.pool = _SingleConnection(source)
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
        q = sql.Identifier(schema)
        self._sql = {
            name: sql.SQL(text).format(s=q)
            for name, text in {
                "append_fast": APPEND_FAST,
                "head_for_append": SELECT_HEAD_FOR_APPEND,
                "ids": SELECT_IDS,
                "insert": INSERT_EVENTS,
                "stream": SELECT_STREAM,
                "all": SELECT_ALL,
                "last": SELECT_LAST_POSITION,
                "head": SELECT_HEAD,
                "heads": SELECT_HEADS,
                "heads_for_append": SELECT_HEADS_FOR_APPEND,
                "xid_ids_tracking": SELECT_XID_IDS_TRACKING,
                "insert_many": INSERT_MANY,
                "tracking": SELECT_TRACKING,
            }.items()
        }
        channel = f"ares_events:{schema}"
        if len(channel.encode()) > 63:
            import hashlib

            channel = "ares_events:" + hashlib.sha256(schema.encode()).hexdigest()[:32]
        self.channel = channel
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
        where = url.redacted()
        params = url.params
        libpq = _libpq_options()
        secret = sorted(set(params) & _SECRET_PARAMS)
        if secret:
            raise ConfigError(
                f"parameter(s) {', '.join(secret)} carry a secret and must not be in the "
                "query string of a store URL; put the password percent-encoded in the URL "
                "(postgresql://user:password@host/db) or use a passfile"
            )
        unknown = sorted(set(params) - set(_OWN_PARAMS) - libpq)
        unknown_opts = sorted(set(options) - set(_OWN_PARAMS))
        if unknown or unknown_opts:
            raise ConfigError(
                f"unknown parameter(s) {', '.join(unknown + unknown_opts)} for {where}; "
                f"valid: {', '.join(_OWN_PARAMS)}, or any libpq option "
                f"({', '.join(sorted(libpq - _SECRET_PARAMS))})"
            )
        own: dict[str, Any] = {k: v for k, v in params.items() if k in _OWN_PARAMS}
        own.update(options)
        schema = own.get("schema", "public")
        pool_min = _int_opt(own, "pool_min", 1, where, minimum=0)
        pool_max = _int_opt(own, "pool_max", max(10, pool_min), where, minimum=1)
        if pool_min > pool_max:
            raise ConfigError(
                f"pool_min ({pool_min}) must not exceed pool_max ({pool_max}) in {where}"
            )
        pool_timeout = _float_opt(own, "pool_timeout", 30.0, where)
        stmt_timeout = (
            _int_opt(own, "statement_timeout", 0, where, minimum=1)
            if "statement_timeout" in own
            else None
        )
        page_size = _int_opt(own, "page_size", 2000, where, minimum=1)
        migrate = _bool_opt(own, "migrate", where)
        notify = _bool_opt(own, "notify", where)
        kwargs: dict[str, Any] = {k: v for k, v in params.items() if k in libpq}
        if url.host:
            kwargs.setdefault("host", url.host)
        if url.port:
            kwargs.setdefault("port", str(url.port))
        if url.username:
            kwargs.setdefault("user", url.username)
        if url.password is not None:
            kwargs["password"] = url.password
        dbname = url.path.lstrip("/")
        if dbname:
            kwargs.setdefault("dbname", dbname)
        # Never wait forever for a server that does not answer (libpq's default is to wait).
        kwargs.setdefault("connect_timeout", "10")
        kwargs["autocommit"] = True
        configure = None
        if stmt_timeout is not None:
            value = f"{stmt_timeout}ms"

            def configure(conn: psycopg.Connection[Any]) -> None:
                conn.execute(SET_STATEMENT_TIMEOUT, (value,))

        secret_pw = url.password
        try:
            # One direct connection first: a clear error (refused, no such database, auth)
            # instead of a pool that retries in the background.
            psycopg.connect(**kwargs).close()
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to {where}: {_scrub(str(exc).strip(), secret_pw)}"
            ) from exc
        pool: psycopg_pool.ConnectionPool[Any] = psycopg_pool.ConnectionPool(
            "",
            kwargs=kwargs,
            min_size=pool_min,
            max_size=pool_max,
            timeout=pool_timeout,
            check=_check_alive,
            configure=configure,
            name="ares-events",
            open=True,
        )
        try:
            if pool_min:
                pool.wait(timeout=max(pool_timeout, 1.0))
            return cls(
                pool,
                schema=schema,
                migrate=bool(migrate),
                page_size=page_size,
                pool_timeout=pool_timeout,
                statement_timeout=stmt_timeout,
                description=where,
                owns_pool=True,
                secret=secret_pw,
                notify=notify,
            )
        except psycopg_pool.PoolTimeout as exc:
            pool.close()
            raise StoreUnavailable(
                f"cannot open {pool_min} connection(s) to {where} within {pool_timeout:g}s"
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

    @contextlib.contextmanager
    def _translate_errors(self, what: str) -> Iterator[None]:
        """Map driver and pool errors to ares_events errors (always ``from exc``)."""
        try:
            yield
        except psycopg_pool.PoolTimeout as exc:
            raise StoreUnavailable(
                f"{what} in {self._description}: the connection pool is exhausted "
                f"(no free connection within {self._timeout_label()}; raise pool_max or "
                "pool_timeout)"
            ) from exc
        except psycopg_pool.PoolClosed as exc:
            raise StoreError(f"{what}: store {self._description} is closed") from exc
        except psycopg.errors.QueryCanceled as exc:
            limit = (
                f"statement_timeout of {self._statement_timeout} ms"
                if self._statement_timeout
                else "statement_timeout"
            )
            raise StoreUnavailable(
                f"{what} in {self._description} was cancelled by the server ({limit} "
                "exceeded, or cancelled by an administrator); nothing was written"
                if what.startswith("append")
                else f"{what} in {self._description} was cancelled by the server ({limit} "
                "exceeded, or cancelled by an administrator)"
            ) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreUnavailable(
                f"{what} in {self._description} failed: {self._scrub(exc)}"
            ) from exc
        except psycopg.Error as exc:
            raise StoreError(f"{what} in {self._description} failed: {self._scrub(exc)}") from exc

    def _timeout_label(self) -> str:
        t = self._pool_timeout
        if t is None:
            t = getattr(self.pool, "timeout", None)
        return f"{t:g}s" if isinstance(t, int | float) else "the pool timeout"

    def _scrub(self, exc: BaseException) -> str:
        return _scrub(str(exc).strip(), self._secret)

    @contextlib.contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled autocommit connection for the block (snapshots, projections, admin).

        Raises:
            StoreUnavailable: no connection became free within ``pool_timeout``.
            StoreError: the store is closed.
        """
        if self._closed:
            raise StoreError(f"store {self._description} is closed")
        with self._translate_errors("taking a connection"):
            cm = self.pool.connection(self._pool_timeout)
            conn = cm.__enter__()
        try:
            yield conn
        except BaseException as exc:
            if not cm.__exit__(type(exc), exc, exc.__traceback__):
                raise
        else:
            cm.__exit__(None, None, None)

    def _query(self, what: str, query: sql.Composed, args: tuple[Any, ...]) -> list[Any]:
        if self._closed:
            raise StoreError(f"{what}: store {self._description} is closed")
        with self._translate_errors(what), self.pool.connection(self._pool_timeout) as conn:
            return conn.execute(query, args, binary=True).fetchall()  # type: ignore[no-any-return]

    # -- schema ----------------------------------------------------------------------------

    def _prepare_schema(self, migrate: bool) -> None:
        q = sql.Identifier(self.schema)
        where = f"schema {self.schema!r} of {self._description}"
        with (
            self._translate_errors(f"preparing {where}"),
            self.pool.connection(self._pool_timeout) as conn,
        ):
            if not migrate:
                # Verify only: never create anything.
                found = 0
                exists = conn.execute(
                    META_EXISTS, (f"{_quote_ident(self.schema)}.ares_meta",)
                ).fetchone()
                if exists and exists[0]:
                    row = conn.execute(sql.SQL(SELECT_SCHEMA_VERSION).format(s=q)).fetchone()
                    found = int(row[0]) if row else 0
                if found != SCHEMA_VERSION:
                    raise SchemaVersionError(found, SCHEMA_VERSION, where)
                return
            with conn.transaction():
                # Two processes opening a fresh database at once: the second waits here
                # and then finds the schema current.
                conn.execute(LOCK_MIGRATIONS, (f"ares-events:migrate:{self.schema}",))
                conn.execute(sql.SQL(CREATE_SCHEMA).format(s=q))
                conn.execute(sql.SQL(CREATE_META).format(s=q))
                row = conn.execute(sql.SQL(SELECT_SCHEMA_VERSION).format(s=q)).fetchone()
                found = int(row[0]) if row else 0
                if found > SCHEMA_VERSION:
                    raise SchemaVersionError(found, SCHEMA_VERSION, where)
                for step in range(found, SCHEMA_VERSION):
                    for stmt in MIGRATIONS[step]:
                        conn.execute(sql.SQL(stmt).format(schema=q))
                    logger.info("postgresql %s: migrated schema %d -> %d", where, step, step + 1)
                if found != SCHEMA_VERSION:
                    conn.execute(sql.SQL(UPSERT_SCHEMA_VERSION).format(s=q), (str(SCHEMA_VERSION),))

    def schema_version(self) -> int:
        """The schema version recorded in ``ares_meta`` (``ares-events init`` prints it).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        query = sql.SQL(SELECT_SCHEMA_VERSION).format(s=sql.Identifier(self.schema))
        rows = self._query("reading the schema version", query, ())
        return int(rows[0][0]) if rows else 0

    # -- writes ----------------------------------------------------------------------------

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append in one transaction, serialized per stream only (see the module docstring).

        Raises:
            InvalidEvent: more than 65,535 events in one batch.
            ConcurrencyError: ``expected_version`` is not satisfied.
            StoreUnavailable: the server, the pool or the connection failed; nothing was
                written (unless the failure hit the COMMIT itself: re-append the same
                event ids to find out, appends are idempotent).
            StoreError: any other database error.
        """
        stream_id = batch.stream_id
        n = len(batch.events)
        if n > MAX_BATCH:
            raise InvalidEvent(
                "events",
                f"a postgresql append holds at most {MAX_BATCH} events, got {n}",
                stream_id=stream_id,
            )
        if self._closed:
            raise StoreError(f"append to stream {stream_id!r}: store {self._description} is closed")
        what = f"append to stream {stream_id!r}"
        attempts = 3
        for attempt in range(attempts):
            try:
                with self._translate_errors(what), self.pool.connection(self._pool_timeout) as conn:
                    outcome = self._append_fast(conn, batch, expected_version)
                    if outcome is None:
                        outcome = self._append_tx(conn, batch, expected_version)
                    return outcome
            except StoreError as exc:
                self._heads.pop(stream_id, None)
                # A concurrent append of the same event id to another stream committed
                # first: retry, and the idempotency check reports it.
                if attempt + 1 < attempts and isinstance(
                    exc.__cause__, psycopg.errors.UniqueViolation
                ):
                    logger.debug("%s: unique violation, retrying", what)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _remember(self, stream_id: str, head: Head | None) -> None:
        heads = self._heads
        if head is None or head.version == 0:
            heads.pop(stream_id, None)
            return
        if len(heads) >= _HEAD_CACHE_SIZE and stream_id not in heads:
            heads.clear()
        heads[stream_id] = head

    def _append_fast(
        self, conn: psycopg.Connection[Any], batch: Batch, expected_version: ExpectedVersion
    ) -> AppendOutcome | None:
        """One statement, when the head can be predicted; None means "use the locked path"."""
        if not self.predict_heads:
            return None
        stream_id = batch.stream_id
        head = self._heads.get(stream_id)
        if head is None and (
            expected_version is STREAM_EXISTS
            or (isinstance(expected_version, int) and expected_version > 0)
        ):
            return None  # the stream should exist but its head is unknown here
        try:
            check_expected_version(stream_id, expected_version, head.version if head else 0)
        except ConcurrencyError:
            return None  # the prediction may be stale: the locked path decides
        sealed = batch.seal(head)
        row = conn.execute(
            self._sql["append_fast"], self._append_params(batch, sealed, head), binary=True
        ).fetchone()
        assert row is not None
        status, version, head_hash, xid = row
        if status == _FAST_OK:
            last = sealed[-1]
            self._remember(stream_id, Head(last.version, last.hash))
            first = xid * _POSITION_SHIFT
            return AppendOutcome([s.recorded(stream_id, first + i) for i, s in enumerate(sealed)])
        if status == _FAST_DUPLICATE:
            rows = conn.execute(self._sql["ids"], (batch.event_ids,), binary=True).fetchall()
            return AppendOutcome([_row_to_event(r) for r in rows], duplicate=True)
        self._remember(stream_id, Head(version, head_hash) if version else None)
        logger.debug("append to %r: head moved (now version %s), locked path", stream_id, version)
        return None

    def _append_params(
        self, batch: Batch, sealed: list[SealedEvent], head: Head | None
    ) -> tuple[Any, ...]:
        """Arguments of ``ares_append()`` for a sealed batch (also used by tests that drive
        an append by hand inside their own transaction)."""
        evs = [s.event for s in sealed]
        return (
            batch.stream_id,
            head.version if head else 0,
            head.hash if head else b"",
            self.channel if self.notify else None,
            [e.event_id for e in evs],
            [e.type for e in evs],
            [e.module for e in evs],
            [e.payload_bytes for e in evs],
            [r.to_json().decode() if (r := e.payload_ref) is not None else None for e in evs],
            [e.meta_json for e in evs],
            [e.at for e in evs],
            [s.prev_hash for s in sealed],
            [s.hash for s in sealed],
        )

    def _append_tx(
        self, conn: psycopg.Connection[Any], batch: Batch, expected_version: ExpectedVersion
    ) -> AppendOutcome:
        stream_id = batch.stream_id
        ids = batch.event_ids
        q = self._sql
        try:
            with conn.pipeline():
                # Round trip 1: lock the stream, then (new statement, fresh snapshot) read
                # the head, look for the ids and get this transaction's xid.
                conn.execute(BEGIN, prepare=False)
                conn.execute(LOCK_STREAM, (stream_id,))
                # Unprepared: planned for the table as it is now (see migration step 3).
                row = conn.execute(
                    q["head_for_append"], (ids, stream_id), binary=True, prepare=False
                ).fetchone()
                assert row is not None
                version, head_hash, xid, exists = row
                if exists:
                    rows = conn.execute(q["ids"], (ids,), binary=True, prepare=False).fetchall()
                    conn.execute(ROLLBACK, prepare=False)
                    return AppendOutcome([_row_to_event(r) for r in rows], duplicate=True)
                head = Head(version, head_hash) if version is not None else None
                self._remember(stream_id, head)
                check_expected_version(stream_id, expected_version, version or 0)
                if xid >= _MAX_XID:
                    raise StoreError(
                        f"transaction id {xid} of {self._description} is too large for "
                        "ares-events positions (xid * 65536 must fit in a bigint)"
                    )
                sealed = batch.seal(head)
                base = version or 0
                first = xid * _POSITION_SHIFT
                evs = [s.event for s in sealed]
                refs = [e.payload_ref for e in evs]
                last = sealed[-1]
                channel = self.channel if self.notify else None
                # Round trip 2: events, head and wake-up in one statement, then COMMIT.
                conn.execute(
                    q["insert"],
                    (
                        xid,
                        stream_id,
                        base,
                        [e.event_id for e in evs],
                        [e.type for e in evs],
                        [e.module for e in evs],
                        [e.payload_bytes for e in evs],
                        [r.to_json().decode() if r is not None else None for r in refs],
                        [e.meta_json for e in evs],
                        [e.at for e in evs],
                        [s.prev_hash for s in sealed],
                        [s.hash for s in sealed],
                        stream_id,
                        last.version,
                        last.hash,
                        channel,
                        channel,
                        str(first + len(sealed) - 1),
                    ),
                )
                conn.execute(COMMIT, prepare=False)
        except BaseException:
            _rollback_quietly(conn)
            raise
        self._remember(stream_id, Head(last.version, last.hash))
        return AppendOutcome([s.recorded(stream_id, first + i) for i, s in enumerate(sealed)])

    def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Append several batches (and a tracking record) in one transaction.

        The stream locks (and the tracking name's) are taken in one sorted order, so
        concurrent multi-stream appends cannot deadlock; then, in later statements (fresh
        snapshots), the heads, the ids and the tracked position are read and checked,
        every batch is sealed against its head, and one statement writes the events
        (consecutive positions ``xid * 65536 + i`` in batch order), the heads, the
        tracking row and the wake-up.

        Raises:
            InvalidEvent: more than 65,535 events in all.
            ConcurrencyError: an expected version or the tracking record is not satisfied.
            StoreUnavailable: the server, the pool or the connection failed.
            StoreError: any other database error.
        """
        n = sum(len(b.events) for b, _ in batches)
        if n > MAX_BATCH:
            raise InvalidEvent(
                "events", f"a postgresql append holds at most {MAX_BATCH} events, got {n}"
            )
        if self._closed:
            raise StoreError(f"append_many: store {self._description} is closed")
        what = f"append to {len(batches)} stream(s)"
        for attempt in range(3):
            try:
                with self._translate_errors(what), self.pool.connection(self._pool_timeout) as conn:
                    return self._append_many_tx(conn, batches, tracking)
            except StoreError as exc:
                for b, _ in batches:
                    self._heads.pop(b.stream_id, None)
                if attempt < 2 and isinstance(exc.__cause__, psycopg.errors.UniqueViolation):
                    continue  # a concurrent append of the same ids: the id check decides
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _append_many_tx(
        self,
        conn: psycopg.Connection[Any],
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        q = self._sql
        streams = [b.stream_id for b, _ in batches]
        ids = [i for b, _ in batches for i in b.event_ids]
        keys = list(streams)
        if tracking is not None:
            keys.append(f"ares-tracking:{tracking.name}")
        name = tracking.name if tracking is not None else None
        try:
            with conn.pipeline():
                conn.execute(BEGIN, prepare=False)
                conn.execute(LOCK_MANY, (keys,), prepare=False)
                heads_cur = conn.execute(
                    q["heads_for_append"], (streams,), binary=True, prepare=False
                )
                info_cur = conn.execute(
                    q["xid_ids_tracking"], (ids, name), binary=True, prepare=False
                )
                head_rows = heads_cur.fetchall()
                info = info_cur.fetchone()
            assert info is not None
            xid, exists, tracked = info
            if exists:
                rows = conn.execute(q["ids"], (ids,), binary=True, prepare=False).fetchall()
                conn.execute(ROLLBACK, prepare=False)
                found: dict[str, RecordedEvent] = {}
                for r in rows:
                    found[r[3]] = _row_to_event(r)
                outs = []
                for b, _ in batches:
                    dup = [found[i] for i in b.event_ids if i in found]
                    outs.append(AppendOutcome(dup, duplicate=bool(dup)))
                return outs
            if tracking is not None:
                check_tracking(tracking, tracked)
            if xid >= _MAX_XID:
                raise StoreError(
                    f"transaction id {xid} of {self._description} is too large for "
                    "ares-events positions (xid * 65536 must fit in a bigint)"
                )
            sealed_all: list[list[SealedEvent]] = []
            for (b, expected), (version, head_hash) in zip(batches, head_rows, strict=True):
                check_expected_version(b.stream_id, expected, version or 0)
                sealed_all.append(b.seal(Head(version, head_hash) if version else None))
            flat = [
                (b.stream_id, s) for (b, _), ss in zip(batches, sealed_all, strict=True) for s in ss
            ]
            evs = [s.event for _, s in flat]
            first = xid * _POSITION_SHIFT
            channel = self.channel if self.notify else None
            lasts = [ss[-1] for ss in sealed_all]
            conn.execute(
                q["insert_many"],
                (
                    xid,
                    [sid for sid, _ in flat],
                    [s.version for _, s in flat],
                    [e.event_id for e in evs],
                    [e.type for e in evs],
                    [e.module for e in evs],
                    [e.payload_bytes for e in evs],
                    [
                        r.to_json().decode() if (r := e.payload_ref) is not None else None
                        for e in evs
                    ],
                    [e.meta_json for e in evs],
                    [e.at for e in evs],
                    [s.prev_hash for _, s in flat],
                    [s.hash for _, s in flat],
                    streams,
                    [s.version for s in lasts],
                    [s.hash for s in lasts],
                    name,
                    tracking.position if tracking is not None else None,
                    name,
                    channel,
                    channel,
                    str(first + len(flat) - 1),
                ),
                binary=True,
                prepare=False,
            )
            conn.execute(COMMIT, prepare=False)
        except BaseException:
            _rollback_quietly(conn)
            raise
        out = []
        pos = first - 1
        for sid, ss in zip(streams, sealed_all, strict=True):
            pos += len(ss)
            self._remember(sid, Head(ss[-1].version, ss[-1].hash))
            out.append(AppendOutcome([], version=ss[-1].version, position=pos))
        return out

    def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None.

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        rows = self._query(f"tracked position of {name!r}", self._sql["tracking"], (name,))
        return int(rows[0][0]) if rows else None

    # -- reads -----------------------------------------------------------------------------

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read of one stream (each page a short statement)."""
        nxt = max(from_version, 1)
        hi = to_version if to_version is not None else 2**62
        left = limit if limit is not None else 2**62
        page = self.page_size
        what = f"read of stream {stream_id!r}"
        query = self._sql["stream"]
        while left > 0 and nxt <= hi:
            want = min(page, left)
            rows = self._query(what, query, (stream_id, nxt, hi, want))
            for r in rows:
                yield _row_to_event(r)
            if len(rows) < want:
                return
            left -= len(rows)
            nxt = rows[-1][1] + 1

    def read_all(self, after_position: int, limit: int | None) -> Iterator[RecordedEvent]:
        """Keyset-paged read in global order, only below the visibility bound (module docstring)."""
        after = after_position
        left = limit if limit is not None else 2**62
        page = self.page_size
        query = self._sql["all"]
        while left > 0:
            want = min(page, left)
            rows = self._query("read_all", query, (after, want))
            for r in rows:
                yield _row_to_event(r)
            if len(rows) < want:
                return
            left -= len(rows)
            after = rows[-1][2]

    def head(self, stream_id: str) -> Head | None:
        """The stream's head row."""
        rows = self._query(f"head of stream {stream_id!r}", self._sql["head"], (stream_id,))
        return Head(rows[0][0], rows[0][1]) if rows else None

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every head, paged by stream id."""
        after = ""
        while True:
            rows = self._query("listing streams", self._sql["heads"], (after, self.page_size))
            for sid, version, h in rows:
                yield sid, Head(version, h)
            if len(rows) < self.page_size:
                return
            after = rows[-1][0]

    def last_position(self) -> int:
        """Highest position visible to ``read_all`` (0 when empty)."""
        return int(self._query("last_position", self._sql["last"], ())[0][0])

    # -- wake-ups --------------------------------------------------------------------------

    def _connect_listener(self) -> psycopg.Connection[Any]:
        conninfo, kwargs = self._listen_args
        kwargs = {**kwargs, "autocommit": True}
        return psycopg.Connection.connect(conninfo, **kwargs)

    def _get_listener(self) -> _Listener:
        with self._listener_lock:
            if self._closed:
                raise StoreError(f"store {self._description} is closed")
            if self._listener is None:
                self._listener = _Listener(
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
            return self._poll_for(position, deadline)
        listener = self._get_listener()
        listener.wait_until_ready(min(max(timeout, 0.0), 5.0))
        poll = 0.0  # 0: rely on notifications alone
        while True:
            with listener.cond:
                gen = listener.generation
                healthy = listener.listening
            if self.last_position() > position:
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

    def _poll_for(self, position: int, deadline: float) -> bool:
        delay = 0.005
        while True:
            if self.last_position() > position:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.25)

    # -- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the listener and close the pool (when this store opened it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._owns_pool:
            self.pool.close()


def _rollback_quietly(conn: psycopg.Connection[Any]) -> None:
    """End a failed append's transaction so the connection goes back to the pool clean."""
    if conn.closed or conn.broken:
        return
    if conn.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
        with contextlib.suppress(psycopg.Error):
            conn.execute(ROLLBACK, prepare=False)


def _scrub(text: str, secret: str | None) -> str:
    """Remove a password (and its percent-encoded form) from a driver message."""
    if secret:
        for form in {secret, quote(secret, safe=""), quote(secret)}:
            text = text.replace(form, "***")
    return text


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _int_opt(opts: dict[str, Any], key: str, default: int, where: str, *, minimum: int) -> int:
    raw = opts.get(key, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be an integer, got {raw!r} in {where}") from None
    if value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value} in {where}")
    return value


def _bool_opt(opts: dict[str, Any], key: str, where: str) -> bool:
    return parse_bool(opts.get(key, True), key, where)


def _float_opt(opts: dict[str, Any], key: str, default: float, where: str) -> float:
    raw = opts.get(key, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} must be a number of seconds, got {raw!r} in {where}") from None
    if not value > 0:
        raise ConfigError(f"{key} must be > 0 seconds, got {value:g} in {where}")
    return value
