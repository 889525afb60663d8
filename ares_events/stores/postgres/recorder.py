# Generated from recorder_async.py by tools/async_to_sync.py: do not edit.
"""over 800 lines because the recorder is one read from the public call down to its SQL:
connections, the append protocol, reads, metadata, erasure, wake-ups and close of the
PostgreSQL backend, written once for both faces.

It may import the core, :mod:`ares_events.errors`, psycopg and psycopg_pool, and the other
modules of this package.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from time import sleep
from typing import TYPE_CHECKING, Any, ClassVar, Final, TypeVar
from urllib.parse import quote

import psycopg
import psycopg_pool
from psycopg import sql

from ares_events.core.backend import (
    AppendOutcome,
    ArchivedRow,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    SealedEvent,
    TrackingRecord,
    check_tracking,
    rows_differ,
)
from ares_events.core.events import (
    ErasedPayloadRef,
    ExpectedVersion,
    PayloadRef,
    RecordedEvent,
    check_expected_version,
    prefix_range,
)
from ares_events.core.lifecycle import OperationGate
from ares_events.core.url import StoreURL
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    InvalidEvent,
    StoreClosed,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
)
from ares_events.stores.postgres.clock import ServerClock, column_arrays, event_row, ref_text
from ares_events.stores.postgres.connection import open_pool, probe_server, rollback_quietly
from ares_events.stores.postgres.driver import (
    FIRST_WAIT,
    DriverErrors,
    SingleConnection,
    check_server,
    scrub,
)
from ares_events.stores.postgres.listener import Listener, poll_for, wait_for
from ares_events.stores.postgres.options import check_schema_name, parse_options
from ares_events.stores.postgres.schema import prepare_schema, schema_exists
from ares_events.stores.postgres.sql import (
    BEGIN,
    COMMIT,
    LOCK_MANY,
    LOCK_STREAM,
    ROLLBACK,
    Statements,
    channel_for,
    row_to_event,
)
from ares_events.stores.sql_read_models import postgres_read_models

if TYPE_CHECKING:
    from ares_events.stores.postgres.snapshots import PostgresSnapshotRows
    from ares_events.stores.sql_read_models import SQLReadModels

logger = logging.getLogger(__name__)
T = TypeVar("T")

__all__ = ["MAX_BATCH", "RETRIES", "PostgresRecorder"]

MAX_BATCH: Final = 65535
"""Events per append: the low 16 bits of a position index the event in its batch."""
RETRIES: Final = 3
"""Attempts of an append that hit a unique violation (a concurrent append of its ids)."""
_POSITION_SHIFT: Final = 65536
_MAX_XID: Final = 2**47  # xid * 65536 must stay below 2**63
_HEAD_CACHE_SIZE: Final = 10_000  # predicted heads kept (cleared when full)
_FAR: Final = 2**62
_CATCH_UP: Final = 1.0  # seconds a read waits for this recorder's own appends (_catch_up)


def _check_batch_size(n: int, stream_id: str | None = None) -> None:
    if n > MAX_BATCH:
        raise InvalidEvent(
            "events",
            f"a postgresql append holds at most {MAX_BATCH} events, got {n}",
            stream_id=stream_id,
        )


def _cursor(conn: Any) -> Any:
    """The connection's binary cursor, made once (one per statement costs more CPU)."""
    cur = conn.__dict__.get("_ares_cursor")
    if cur is None or cur.closed:
        cur = conn.__dict__["_ares_cursor"] = conn.cursor(binary=True)
    return cur


def _prepare_on(
    conn: psycopg.Connection[Any],
    schema: str,
    where: str,
    create: bool,
    migrate: bool,
    clock: ServerClock,
) -> None:
    if not create:
        problem = schema_exists(conn, schema)
        if problem is not None:
            raise StoreNotFound(where, f"{problem} (create it with `ares-events init`)")
    prepare_schema(conn, schema, f"schema {schema!r} of {where}", migrate)
    clock.check_schema(conn, schema, where)


class PostgresRecorder:
    """PostgreSQL backend (docs/architecture.md gives the guarantees and their cost).

    Args:
        source: a pool of autocommit connections (``kwargs={"autocommit": True}``; the
            recorder runs its own transactions), opened by the caller, who keeps it; the
            blocking face also takes one ``psycopg.Connection`` (switched to autocommit
            and used one operation at a time).
        schema: schema of the tables; created when missing (``migrate=True``).
        migrate: apply pending migrations; False only verifies the schema version.
        create: create the schema and tables when missing; False opens an existing
            store only (reporting tools) and never creates anything.
        page_size: rows per keyset page of a read.
        pool_timeout: seconds to wait for a free connection (default: the pool's).
        statement_timeout: milliseconds, reported in timeout errors.
        description: redacted URL for messages and ``repr``.
        owns_pool: close ``source`` in :meth:`close`.
        secret: the password, scrubbed from any driver message that might echo it.
        notify: send a NOTIFY with every append (on commit). False trades wake-ups
            (``wait_for`` then polls with backoff) for commits that do not serialize on
            the server's notification-queue lock (see docs/architecture.md).
        clock: makes the clock of this schema's positions from its statements (default
            :class:`~.clock.ServerClock`, this server's transaction ids); a cell layout
            whose rows live on another node than its clock gives its own
            (:mod:`.clock`).

    Raises:
        ConfigError: a bad schema name, page size or source.
        StoreNotFound: ``create=False`` and the schema holds no ares-events store.
        StoreUnavailable: the server cannot be reached.
        SchemaVersionError: ``migrate=False`` and the schema is not current.
    """

    scheme: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.PERSISTENT,
            Capability.MULTI_PROCESS,
            Capability.WAKEUPS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
            Capability.ERASE,
            Capability.METADATA,
            Capability.DUPLICATE_SCAN,
            Capability.POSITION_SCAN,
            Capability.STREAM_PAGES,
            Capability.ARCHIVE,
            Capability.READ_MODELS,
        }
    )

    def __init__(
        self,
        source: Any,
        *,
        schema: str = "public",
        migrate: bool = True,
        create: bool = True,
        page_size: int = 2000,
        pool_timeout: float | None = None,
        statement_timeout: int | None = None,
        description: str | None = None,
        owns_pool: bool = False,
        secret: str | None = None,
        notify: bool = True,
        clock: Any = ServerClock,
    ) -> None:
        check_schema_name(schema, description or "the PostgreSQL store")
        if type(page_size) is not int or page_size <= 0:
            raise ConfigError(f"postgresql page_size must be a positive int, got {page_size!r}")
        self.schema = schema
        self.page_size = page_size
        self.notify = notify
        self.read_only = False
        """Every transaction is read-only (``read_only=True`` at open: the server refuses
        writes); tables beside the events are then read, never created."""
        self.sql = Statements.for_schema(schema)
        self._make_clock = clock
        self.clock = clock(self.sql)
        """Where positions and the visibility bound come from (:mod:`.clock`)."""
        self._final = 0  # see _below
        self._own = 0  # one past the highest position this recorder committed
        self._waited = 0  # the last _own a read gave up waiting for
        self.predict_heads = self.clock.predict_heads
        self.channel = channel_for(schema)
        self._secret = secret or None
        self._owns_pool = owns_pool
        self._statement_timeout = statement_timeout
        self._heads: dict[str, Head] = {}
        self._byte_order: bool | None = None  # the database sorts text by code point
        self._listener: Listener | None = None
        self._listener_lock = threading.Lock()
        self._inflight: set[Any] = set()
        self._inflight_lock = threading.Lock()
        self.pool: Any
        if isinstance(source, psycopg_pool.ConnectionPool):
            self.pool = source
            conninfo, kw = source.conninfo, source.kwargs
            if not isinstance(conninfo, str) or not (kw is None or isinstance(kw, dict)):
                # psycopg_pool >= 3.3 also takes callables; the LISTEN connection and the
                # outage probe need the values themselves.
                raise ConfigError(
                    f"{type(self).__name__} needs a pool with a static conninfo and kwargs"
                )
            self._listen_args: tuple[str, dict[str, Any]] = (conninfo, dict(kw or {}))
        elif isinstance(source, psycopg.Connection):
            if not source.autocommit:
                if source.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    raise ConfigError(
                        "the psycopg connection given to PostgresRecorder is inside a "
                        "transaction; pass an idle connection (it is switched to autocommit)"
                    )
                source.autocommit = True
            self.pool = SingleConnection(source)
            pw = source.pgconn.password
            self._listen_args = (source.info.dsn, {"password": pw.decode()} if pw else {})
        else:
            raise ConfigError(
                "PostgresRecorder needs a psycopg_pool.ConnectionPool or a psycopg.Connection, "
                f"got {type(source).__name__}"
            )
        self._description = description or self._describe_pool()
        # Seconds to wait for a free connection (None: as long as it takes).
        self._pool_timeout: float | None = (
            pool_timeout if pool_timeout is not None else getattr(self.pool, "timeout", None)
        )
        self._gate = OperationGate(self._description)
        with self._conn(f"preparing schema {schema!r}") as conn:
            _prepare_on(conn, schema, self._description, create, migrate, self.clock)
        logger.info("opened postgresql store %s (schema %s)", self._description, schema)
        self._read_models = postgres_read_models(self)

    @classmethod
    def open(cls, source: Any, **options: Any) -> PostgresRecorder:
        """Use an open pool of the caller's (see the class arguments); the caller keeps
        ownership: :meth:`close` does not close it.

        Raises:
            ConfigError: a bad schema name or page size.
            StoreNotFound: ``create=False`` and the schema holds no store.
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        return cls(source, **options)

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> PostgresRecorder:
        """Open ``postgresql://user:pw@host:port/db?schema=...&pool_max=...&sslmode=...``.

        Keyword ``options`` (``schema``, ``pool_min``, ``pool_max``, ``pool_timeout``,
        ``statement_timeout``, ``page_size``, ``migrate``, ``notify``, ``create``)
        override URL parameters.

        Raises:
            ConfigError: an unknown or invalid parameter (lists the valid ones).
            StoreNotFound: ``create=False`` and the schema holds no store.
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        clock = options.pop("clock", ServerClock)
        opts = parse_options(url, options)
        # One direct connection first: a clear error (refused, no such database, auth)
        # instead of a pool that retries in the background.
        check_server(opts, secret=url.password)
        pool = open_pool(opts)
        try:
            if opts.pool_min:  # the blocking pool is open: wait for its first connections
                pool.wait(timeout=max(opts.pool_timeout, 1.0))
            rec = cls.open(
                pool,
                schema=opts.schema,
                migrate=bool(opts.migrate),
                create=opts.create,
                page_size=opts.page_size,
                pool_timeout=opts.pool_timeout,
                statement_timeout=opts.statement_timeout,
                description=opts.where,
                owns_pool=True,
                secret=url.password,
                notify=opts.notify,
                clock=clock,
            )
            rec.read_only = opts.read_only
            return rec
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._description!r}, schema={self.schema!r})"

    def _describe_pool(self) -> str:
        conninfo, kwargs = self._listen_args
        try:
            info = psycopg.conninfo.conninfo_to_dict(conninfo, **kwargs)
            user = quote(str(info.get("user") or ""), safe="")
            host, port, db = info.get("host"), info.get("port") or 5432, info.get("dbname")
            return f"postgresql://{user}@{host}:{port}/{db}"
        except Exception:  # only a label; the first real call reports errors
            return "postgresql://(caller-provided pool)"

    def _translate_errors(self, what: str) -> DriverErrors:
        return DriverErrors(
            what,
            self._description,
            statement_timeout=self._statement_timeout,
            timeout_label=self._timeout_label,
            secret=self._secret,
            lost=self.clock.lost,
        )

    def _timeout_label(self) -> str:
        t = self._pool_timeout
        return f"{t:g}s" if isinstance(t, int | float) else "the pool timeout"

    @contextlib.contextmanager
    def _conn(self, what: str, *, translate: bool = True) -> Iterator[Any]:
        """One unit of work on a pooled connection: the gate, the outage diagnosis and the
        error mapping; ``translate=False`` leaves the block's driver errors to the caller."""
        gate = self._gate
        gate.enter(what)
        try:
            with self._translate_errors(what):
                conn = self._checkout(what)
            with self._inflight_lock:
                self._inflight.add(conn)
            try:
                with self._translate_errors(what) if translate else contextlib.nullcontext():
                    yield conn
            finally:
                with self._inflight_lock:
                    self._inflight.discard(conn)
                self.pool.putconn(conn)
        except (StoreError, psycopg.Error) as exc:
            if gate.closed and not isinstance(exc, StoreClosed):
                raise StoreClosed(self._description, what) from exc
            raise
        finally:
            gate.exit()

    def _checkout(self, what: str) -> Any:
        """A pooled connection; after :data:`FIRST_WAIT` seconds without one, an
        unreachable server is reported at once, a busy pool is waited for."""
        pool, total = self.pool, self._pool_timeout
        # getconn/putconn, not pool.connection(): that also enters the connection's own
        # context (a commit or rollback call), which an autocommit connection left idle by
        # every operation here does not need; putconn resets anything else.
        if total is None or total <= FIRST_WAIT:
            return pool.getconn(total)
        started = time.monotonic()
        try:
            return pool.getconn(FIRST_WAIT)
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
        return pool.getconn(max(total - (time.monotonic() - started), 0.001))

    @contextlib.contextmanager
    def connection(self) -> Iterator[Any]:
        """A pooled autocommit connection for the block (snapshots, projections, admin).

        Raises:
            StoreClosed: the store is closed (also: closed while the block ran).
            StoreUnavailable: the server is unreachable or no connection became free
                within ``pool_timeout``.
        """
        with self._conn("taking a connection", translate=False) as conn:
            yield conn

    def _query(self, what: str, query: sql.Composed, args: Sequence[Any]) -> list[Any]:
        with self._conn(what) as conn:
            cur = _cursor(conn)
            cur.execute(query, args)
            rows: list[Any] = cur.fetchall()
            return rows

    def _remember(self, stream_id: str, head: Head | None) -> None:
        heads = self._heads
        if head is None or head.version == 0:
            heads.pop(stream_id, None)
            return
        if len(heads) >= _HEAD_CACHE_SIZE and stream_id not in heads:
            heads.clear()
        heads[stream_id] = head

    def _check_xid(self, xid: int) -> None:
        if xid >= _MAX_XID:
            raise StoreError(
                f"transaction id {xid} of {self._description} is too large for "
                "ares-events positions (xid * 65536 must fit in a bigint)"
            )

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append in one transaction, serialized per stream only: one statement when the
        head can be predicted, else two round trips under the stream's lock.

        Raises:
            InvalidEvent: more than 65,535 events in one batch.
            ConcurrencyError: ``expected_version`` is not satisfied.
            StoreClosed: the store was closed before or during the append.
            StoreUnavailable: the server, the pool or the connection failed; nothing was
                written (unless the failure hit the COMMIT itself: re-append the same
                event ids to find out, appends are idempotent).
            StoreError: any other database error.
        """
        _check_batch_size(len(batch.events), batch.stream_id)

        def run(conn: Any) -> AppendOutcome:
            outcome = self._append_fast(conn, batch, expected_version)
            if outcome is None:
                with self.clock.writing(conn, self._description):
                    outcome = self._append_locked(conn, batch, expected_version)
            self._wrote(outcome)
            return outcome

        return self._appending(f"append to stream {batch.stream_id!r}", [batch], run)

    def _appending(self, what: str, batches: Sequence[Batch], run: Callable[[Any], T]) -> T:
        """``run`` on a pooled connection, retried after a unique violation (a concurrent
        append of the same ids, to any stream, committed first: the retry's id check decides)."""
        for attempt in range(RETRIES):
            try:
                with self._conn(what) as conn:
                    try:
                        return run(conn)
                    except BaseException:
                        rollback_quietly(conn)  # no transaction left open
                        raise
            except BaseException as exc:  # cancelled too: the predictions may be stale
                for b in batches:
                    self._heads.pop(b.stream_id, None)
                if (
                    attempt + 1 < RETRIES
                    and isinstance(exc, StoreError)
                    and isinstance(exc.__cause__, psycopg.errors.UniqueViolation)
                ):
                    logger.debug("%s: unique violation, retrying", what)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _append_fast(
        self, conn: Any, batch: Batch, expected_version: ExpectedVersion
    ) -> AppendOutcome | None:
        """One statement, when the head can be predicted; None means "use the locked path"."""
        if not self.predict_heads:
            return None
        stream_id = batch.stream_id
        head = self._heads.get(stream_id)
        try:
            check_expected_version(stream_id, expected_version, head.version if head else 0)
        except ConcurrencyError:
            # The prediction may be stale (or the head unknown here): the locked path decides.
            return None
        sealed = batch.seal(head)
        query, params = self._fast_statement(batch, sealed, head)
        try:
            cur = _cursor(conn)
            cur.execute(query, params)
            row = cur.fetchone()
        except psycopg.errors.UniqueViolation:
            # A reused event id (autocommit: the statement wrote nothing). The locked
            # path looks the ids up: an idempotent re-append, or the conflict it is.
            self._heads.pop(stream_id, None)
            return None
        if row is None or row[0] is None:
            self._heads.pop(stream_id, None)
            logger.debug("append to %r: head moved, locked path", stream_id)
            return None
        last = sealed[-1]
        self._remember(stream_id, Head(last.version, last.hash))
        # Nobody reads the events of a fresh append: the core needs the last version and
        # position only (the events of one append have consecutive positions).
        return AppendOutcome([], version=last.version, position=row[0])

    def _fast_statement(
        self, batch: Batch, sealed: list[SealedEvent], head: Head | None
    ) -> tuple[sql.Composed, tuple[Any, ...]]:
        """The one statement of the fast path for a batch sealed on the predicted ``head``
        (None: a new stream), and its arguments (also used by tests that run it by hand
        inside their own transaction)."""
        q = self.sql
        sid = batch.stream_id
        last = sealed[-1]
        channel = self.channel if self.notify else None
        first = head is None or head.version == 0
        guard: tuple[Any, ...] = (
            (sid, last.version, last.hash)
            if first
            else (last.version, last.hash, sid, head.version, head.hash)  # type: ignore[union-attr]
        )
        if len(sealed) == 1:
            query = q.append_first_one if first else q.append_next_one
            rows = event_row(sid, last)
        else:
            query = q.append_first_batch if first else q.append_next_batch
            rows = (sid, sealed[0].version - 1, *column_arrays(sealed))
        return query, (sid, *guard, *rows, channel, channel)

    def _pipeline(self, conn: Any, stmts: Sequence[tuple[Any, ...]]) -> list[Any]:
        """Statements ``(query, args, fetch)`` (fetch ``None``, ``"one"``, ``"all"``) in one
        round trip, unprepared (see migration step 3); each statement's fetch, in order."""
        with conn.pipeline():
            curs = [conn.execute(q, a, binary=True, prepare=False) for q, a, _ in stmts]
        return [
            (cur.fetchone() if fetch == "one" else cur.fetchall()) if fetch else None
            for cur, (_, _, fetch) in zip(curs, stmts, strict=True)
        ]

    def _stored(self, conn: Any, ids: list[str]) -> list[RecordedEvent]:
        """The stored events whose ids a batch reuses; the transaction is rolled back."""
        rows, _ = self._pipeline(conn, ((self.sql.ids, (ids,), "all"), (ROLLBACK, None, None)))
        return [row_to_event(r) for r in rows]

    def _append_locked(
        self, conn: Any, batch: Batch, expected_version: ExpectedVersion
    ) -> AppendOutcome:
        stream_id = batch.stream_id
        ids = batch.event_ids
        # Round trip 1: lock the stream, then (new statement, fresh snapshot) read the
        # head, look for the ids and get this transaction's xid.
        clock = self.clock
        got = self._pipeline(
            conn,
            (
                (BEGIN, None, None),
                (LOCK_STREAM, (stream_id,), None),
                (self.sql.head_for_append, (ids, stream_id), "one"),
                *clock.xid_statements,
            ),
        )
        version, head_hash, xid, exists = got[2]
        xid = clock.xid(xid, got)
        if exists:
            return AppendOutcome(self._stored(conn, ids), duplicate=True)
        head = Head(version, head_hash) if version is not None else None
        self._remember(stream_id, head)
        check_expected_version(stream_id, expected_version, version or 0)
        self._check_xid(xid)
        sealed = batch.seal(head)
        first = xid * _POSITION_SHIFT
        last = sealed[-1]
        channel = self.channel if self.notify else None
        # Round trip 2: events, head and wake-up (the clock's statements), then COMMIT.
        writes = clock.write_many(xid, [(stream_id, version or 0, sealed)], None, channel)
        self._pipeline(conn, (*writes, (COMMIT, None, None)))
        self._remember(stream_id, Head(last.version, last.hash))
        return AppendOutcome([], version=last.version, position=first + len(sealed) - 1)

    def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Several batches (and a tracking record) in one transaction, the locks taken in
        one sorted order (LOCK_MANY), positions consecutive in batch order.

        Raises:
            InvalidEvent: more than 65,535 events in all.
            ConcurrencyError: an expected version or the tracking record is not satisfied.
            StoreClosed: the store was closed before or during the append.
            StoreUnavailable: the server, the pool or the connection failed.
            StoreError: any other database error.
        """
        _check_batch_size(sum(len(b.events) for b, _ in batches))

        def run(conn: Any) -> list[AppendOutcome]:
            with self.clock.writing(conn, self._description):
                outcomes = self._append_many(conn, batches, tracking)
            for o in outcomes:
                self._wrote(o)
            return outcomes

        what = f"append to {len(batches)} stream(s)"
        return self._appending(what, [b for b, _ in batches], run)

    def _append_many(
        self,
        conn: Any,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        q, clock = self.sql, self.clock
        streams = [b.stream_id for b, _ in batches]
        ids = [i for b, _ in batches for i in b.event_ids]
        name = tracking.name if tracking is not None else None
        keys = streams if name is None else [*streams, f"ares-tracking:{name}"]
        got = self._pipeline(
            conn,
            (
                (BEGIN, None, None),
                (LOCK_MANY, (keys,), None),
                (q.heads_for_append, (streams,), "all"),
                (q.xid_ids_tracking, (ids, name), "one"),
                *clock.xid_statements,
            ),
        )
        head_rows = got[2]
        xid, exists, tracked = got[3]
        xid = clock.xid(xid, got)
        if exists:
            found = {e.event_id_str: e for e in self._stored(conn, ids)}
            dups = [[found[i] for i in b.event_ids if i in found] for b, _ in batches]
            return [AppendOutcome(d, duplicate=bool(d)) for d in dups]
        if tracking is not None:
            check_tracking(tracking, tracked)
        self._check_xid(xid)
        batches_sealed: list[tuple[str, int, list[SealedEvent]]] = []
        for (b, expected), (version, head_hash) in zip(batches, head_rows, strict=True):
            check_expected_version(b.stream_id, expected, version or 0)
            sealed = b.seal(Head(version, head_hash) if version else None)
            batches_sealed.append((b.stream_id, version or 0, sealed))
        channel = self.channel if self.notify else None
        track = (tracking.name, tracking.position) if tracking is not None else None
        writes = clock.write_many(xid, batches_sealed, track, channel)
        self._pipeline(conn, (*writes, (COMMIT, None, None)))
        out = []
        pos = xid * _POSITION_SHIFT - 1
        for sid, _, ss in batches_sealed:
            pos += len(ss)
            self._remember(sid, Head(ss[-1].version, ss[-1].hash))
            out.append(AppendOutcome([], version=ss[-1].version, position=pos))
        return out

    def _below(self, what: str) -> tuple[int, ...]:
        """The clock's visibility bound for the next read, when it comes from a statement
        of its own (Citus' coordinator); else the floor the read statements' own bound is
        raised to. Both wait for this recorder's own appends first (_catch_up)."""
        statement = self.clock.bound
        if statement is None:
            if self._own > self._final and self._own != self._waited:
                self._catch_up(what, self.sql.bound)
            return (self._final,)
        return (self._catch_up(what, statement),)

    def _catch_up(self, what: str, statement: sql.Composed) -> int:
        """The bound, raised to ``_final`` (below it all is final for good), after waiting up
        to ``_CATCH_UP`` s for it to pass this recorder's own appends (read your own writes).
        It stays below them while a lower position is in flight (reading past could skip its
        rows), or for an instant after another database's transaction ends (sql.py); giving
        up reads what is final and does not wait for those appends again."""
        own = self._own
        deadline = time.monotonic() + _CATCH_UP
        delay = 0.001
        while True:
            bound = max(self._final, int((self._query(what, statement, ()))[0][0]))
            self._final = bound
            if bound >= own or own == self._waited:
                return bound
            if time.monotonic() >= deadline:
                self._waited = own
                logger.debug("%s: positions below %d in flight after %gs", what, own, _CATCH_UP)
                return bound
            sleep(delay)
            delay = min(delay * 2, 0.05)

    def _wrote(self, outcome: AppendOutcome) -> None:
        """An append committed (or found its events stored): reads of this recorder wait
        until they are final (_catch_up)."""
        pos = outcome.position
        if pos is None:
            pos = max((e.position for e in outcome.events), default=0)
        if type(pos) is int and pos >= self._own:
            self._own = pos + 1

    def _seen(self, position: Any) -> None:
        """A read returned ``position``: every position up to it is final for good."""
        if type(position) is int and position >= self._final:
            self._final = position + 1

    def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None.

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        rows = self._query(f"tracked position of {name!r}", self.sql.tracking, (name,))
        return int(rows[0][0]) if rows else None

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read of one stream in version order, each page a short statement
        (see SELECT_STREAM for why a full page holds back its last version)."""
        what = f"read of stream {stream_id!r}"
        q, page = self.sql, self.page_size
        lo = max(from_version, 1)
        hi = to_version if to_version is not None else _FAR
        left = limit if limit is not None else _FAR
        while left > 0:
            want = min(page, left + 1)  # one more than asked tells "the end" from "more"
            rows = self._query(what, q.stream, (stream_id, lo, hi, want))
            if len(rows) < want or len(rows) > left:
                for e in map(row_to_event, rows[:left]):
                    yield e
                return
            last = rows[-1][1]
            cut = len(rows)
            while cut and rows[cut - 1][1] == last:
                cut -= 1
            if cut == 0:
                # One version fills the page: only a table whose unique index is gone.
                rows = self._query(what, q.stream_version, (stream_id, last))
                cut, lo = len(rows), last + 1
            else:
                lo = last
            for e in map(row_to_event, rows[: min(cut, left)]):
                yield e
            left -= cut

    def read_all(
        self,
        after_position: int,
        limit: int | None,
        *,
        stream_prefix: str | None = None,
        below: int | None = None,
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read in global order, only below the visibility bound (or below
        ``below``, a bound under which the caller knows every row is final: a cell
        store's merge); only the streams under ``stream_prefix`` when given (a range on
        ``stream_id`` in byte order, :func:`~ares_events.core.events.prefix_range`)."""
        clock = self.clock
        queries = (clock.all, clock.all_range, clock.all_from) if below is None else clock.below
        query = queries[0]
        bounds: tuple[str, ...] = ()
        if stream_prefix:
            lo, hi = prefix_range(stream_prefix)
            query, bounds = (queries[2], (lo,)) if hi is None else (queries[1], (lo, hi))
        page, after = self.page_size, after_position
        left = limit if limit is not None else _FAR
        while left > 0:
            want = min(page, left)
            bound = (below,) if below is not None else self._below("read_all")
            rows = self._query("read_all", query, (after, *bound, *bounds, want))
            if rows:
                self._seen(rows[-1][2])
            for r in rows:
                yield row_to_event(r)
            if len(rows) < want:
                return
            left -= len(rows)
            after = rows[-1][2]

    def positions(
        self, after_position: int, *, below: int | None = None
    ) -> Iterator[tuple[Any, Any, Any]]:
        """``(position, stream_id, version)`` in global order after ``after_position``,
        below the visibility bound (or ``below``, as :meth:`read_all`), keyset-paged; for
        the audit."""
        after, page = after_position, self.page_size
        query = self.clock.positions if below is None else self.clock.positions_below
        while True:
            bound = (below,) if below is not None else self._below("audit scan")
            rows = self._query("audit scan", query, (after, *bound, page))
            if rows:
                self._seen(rows[-1][0])
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1][0]

    def head(self, stream_id: str) -> Head | None:
        """The stream's head row."""
        rows = self._query(f"head of stream {stream_id!r}", self.sql.head, (stream_id,))
        return Head(rows[0][0], rows[0][1]) if rows else None

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every head, keyset-paged by stream id."""
        after, page = "", self.page_size
        while True:
            rows = self._query("listing streams", self.sql.heads, (after, page))
            for sid, version, h in rows:
                yield sid, Head(version, h)
            if len(rows) < page:
                return
            after = rows[-1][0]

    def heads_page(self, after: str, limit: int, prefix: str | None) -> list[tuple[str, Head]]:
        """One page of heads from the primary key (see the protocol and SELECT_HEADS_*)."""
        q = self.sql
        lo, hi = prefix_range(prefix) if prefix is not None else ("", None)
        if prefix is not None and self._byte_order is None:
            found = self._query("the database's collation", q.byte_order, ())
            self._byte_order = bool(found and found[0][0])
        inside = after >= lo  # one lower bound, as on SQLite: the cursor inside the range, else lo
        args: tuple[str, ...]
        if prefix is not None and not self._byte_order:
            query, args = q.heads_starting, (after, lo)
        elif hi is None:
            query, args = (q.heads if inside else q.heads_from_ge), (max(after, lo),)
        else:
            query, args = (q.heads_range_gt if inside else q.heads_range_ge), (max(after, lo), hi)
        rows = self._query("listing streams", query, (*args, limit))
        return [(sid, Head(version, h)) for sid, version, h in rows]

    def last_position(self) -> int:
        """Highest position visible to ``read_all`` (0 when empty)."""
        below = self._below("last_position")
        last = int((self._query("last_position", self.clock.last, below))[0][0])
        if last:
            self._seen(last)
        return last

    def schema_version(self) -> int:
        """The schema version recorded in ``ares_meta`` (``ares-events init`` prints it).

        Raises:
            StoreUnavailable: the server cannot be reached.
        """
        rows = self._query("reading the schema version", self.sql.schema_version, ())
        return int(rows[0][0]) if rows else 0

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
                self.sql.erase, (ref_text(ref), stream_id, version, position, event_hash)
            )
            if cur.rowcount != 1:
                return EraseOutcome(False)
            refs = 0
            if blob_key:
                cur = conn.execute(self.sql.blob_refs, (PayloadRef.like_key(blob_key),))
                row = cur.fetchone()
                refs = int(row[0]) if row else 0
        return EraseOutcome(True, refs)

    def delete_archived(
        self,
        first_position: int,
        last_position: int,
        expected: Sequence[ArchivedRow],
    ) -> int:
        """Delete the rows a segment holds, locked and checked row by row, in one
        transaction (a difference rolls it back: a ``StoreError`` naming it)."""
        what = f"delete of archived positions {first_position}..{last_position}"
        with self._conn(what) as conn, conn.transaction():
            cur = conn.execute(self.sql.archived, (first_position, last_position))
            rows = cur.fetchall()
            wanted = [e[0] for e in expected]
            keys = set(wanted)
            if not any(r[0] in keys for r in rows):
                return 0  # deleted by an earlier run that stopped before its end
            problem = rows_differ(rows, expected)
            if problem is not None:
                raise StoreError(f"{what} in {self.describe()} refused: {problem}")
            conn.execute(self.sql.archived_delete, (wanted,))
        return len(wanted)

    def meta_get(self, key: str) -> str | None:
        """A value of the ``ares_meta`` table (the store's identity lives there)."""
        rows = self._query("reading the store's metadata", self.sql.meta, (key,))
        return str(rows[0][0]) if rows else None

    def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is there; return the stored value."""
        with self._conn("writing the store's metadata") as conn, conn.transaction():
            conn.execute(self.sql.meta_insert, (key, value))
            cur = conn.execute(self.sql.meta, (key,))
            row = cur.fetchone()
        return str(row[0])

    def meta_swap(self, key: str, expected: str | None, value: str) -> bool:
        """Store ``value`` under ``key`` if the stored value is ``expected`` (the row
        locked; an absent one inserted only if still absent)."""
        with self._conn("writing the store's metadata") as conn, conn.transaction():
            cur = conn.execute(self.sql.meta_for_update, (key,))
            row = cur.fetchone()
            if (None if row is None else str(row[0])) != expected:
                return False
            if row is None:
                cur = conn.execute(self.sql.meta_insert, (key, value))
                return bool(cur.rowcount == 1)
            conn.execute(self.sql.meta_update, (value, key))
        return True

    def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what is there."""
        with self._conn("writing the store's metadata") as conn:
            conn.execute(self.sql.meta_upsert, (key, value))

    def find_duplicates(self) -> Iterator[tuple[str, Any, Any, int, Any]]:
        """Rows that break a uniqueness rule: ``(kind, stream_id or event id, version,
        count, position)`` with kind ``duplicate_version``, ``duplicate_position`` or
        ``duplicate_event_id`` (for the audit; a healthy schema has none)."""
        q = self.sql
        for kind, query in (("version", q.dup_versions), ("position", q.dup_positions)):
            for sid, version, n, pos in self._query("audit scan", query, ()):
                yield f"duplicate_{kind}", sid, version, int(n), pos
        for eid, n, pos in self._query("audit scan", q.dup_ids, ()):
            yield "duplicate_event_id", eid, None, int(n), pos

    def read_models(self) -> SQLReadModels:
        """The read-model and checkpoint tables of this schema (a read-only store
        reads them and creates none)."""
        return self._read_models

    def snapshot_rows(self) -> PostgresSnapshotRows:
        """The ``ares_snapshots`` rows of this schema."""
        from ares_events.stores.postgres.snapshots import PostgresSnapshotRows

        return PostgresSnapshotRows(self)

    def wait_for(self, position: int, timeout: float) -> bool:
        """Wait until an event after ``position`` is visible to ``read_all``, or
        ``timeout`` seconds pass (woken by ``NOTIFY``, else polling: :mod:`.listener`).

        Raises:
            StoreClosed: the store is closed (also while waiting).
            StoreUnavailable: the server cannot be reached.
        """
        if not self.notify:
            return poll_for(self.last_position, position, timeout)
        with self._listener_lock:
            self._gate.check("waiting for events")
            if self._listener is None:
                conninfo, kwargs = self._listen_args
                self._listener = Listener(
                    lambda: psycopg.Connection.connect(conninfo, **{**kwargs, "autocommit": True}),
                    self.channel,
                    self._description,
                    self._secret,
                )
            listener = self._listener
        return wait_for(listener, self.last_position, position, timeout)

    def _interrupt(self) -> None:
        """After close()'s grace: cancel running statements, fail pool waiters."""
        with self._inflight_lock:
            conns = list(self._inflight)
        for conn in conns:
            with contextlib.suppress(Exception):
                conn.cancel_safe(timeout=2.0)
        if self._owns_pool:
            with contextlib.suppress(Exception):
                self.pool.close(timeout=0.0)

    def close(self) -> None:
        """Refuse new calls, wait for (or cancel) the ones in flight, stop the listener
        and close the pool (when this store opened it). No connection of this store's pool
        outlives the call. Idempotent."""
        if not self._gate.close(interrupt=self._interrupt):
            return
        with self._listener_lock:
            listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if self._owns_pool:
            self.pool.close()
        logger.debug("closed postgresql store %s", self._description)
