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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final
from urllib.parse import quote

import psycopg
import psycopg_pool
from psycopg import sql
from psycopg.pq import TransactionStatus

from ares_events.core.events import (
    STREAM_EXISTS,
    ExpectedVersion,
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
)
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    InvalidEvent,
    StoreError,
    StoreUnavailable,
)
from ares_events.stores.postgres.connection import (
    SingleConnection,
    open_pool,
    rollback_quietly,
    translate_errors,
)
from ares_events.stores.postgres.listener import Listener, poll_for, wait_for
from ares_events.stores.postgres.options import parse_options
from ares_events.stores.postgres.schema import SCHEMA_VERSION, prepare_schema
from ares_events.stores.postgres.sql import (
    APPEND_FAST,
    BEGIN,
    COMMIT,
    INSERT_EVENTS,
    INSERT_MANY,
    LOCK_MANY,
    LOCK_STREAM,
    ROLLBACK,
    SELECT_ALL,
    SELECT_HEAD,
    SELECT_HEAD_FOR_APPEND,
    SELECT_HEADS,
    SELECT_HEADS_FOR_APPEND,
    SELECT_IDS,
    SELECT_LAST_POSITION,
    SELECT_SCHEMA_VERSION,
    SELECT_STREAM,
    SELECT_TRACKING,
    SELECT_XID_IDS_TRACKING,
    row_to_event,
)

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.stores.snapshots import PostgresSnapshotStore

logger = logging.getLogger(__name__)

__all__ = ["MAX_BATCH", "SCHEMA_VERSION", "PostgresRecorder"]

MAX_BATCH: Final = 65535
"""Events per append: the low 16 bits of a position index the event in its batch."""
_POSITION_SHIFT: Final = 65536
_MAX_XID: Final = 2**47  # xid * 65536 must stay below 2**63
_HEAD_CACHE_SIZE: Final = 10_000  # predicted heads kept (cleared when full)
_FAST_OK, _FAST_HEAD_MOVED, _FAST_DUPLICATE = 0, 1, 2


class PostgresRecorder:
    """PostgreSQL backend (see the package docstring for the guarantees and their cost).

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
        self._listener: Listener | None = None
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
        where = f"schema {self.schema!r} of {self._description}"
        with (
            self._translate_errors(f"preparing {where}"),
            self.pool.connection(self._pool_timeout) as conn,
        ):
            prepare_schema(conn, self.schema, where, migrate)

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
            return AppendOutcome([row_to_event(r) for r in rows], duplicate=True)
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
                    return AppendOutcome([row_to_event(r) for r in rows], duplicate=True)
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
            rollback_quietly(conn)
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
                    found[r[3]] = row_to_event(r)
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
            rollback_quietly(conn)
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
                yield row_to_event(r)
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
                yield row_to_event(r)
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

    def _get_listener(self) -> Listener:
        with self._listener_lock:
            if self._closed:
                raise StoreError(f"store {self._description} is closed")
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
