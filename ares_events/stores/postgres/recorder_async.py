"""The asyncio PostgreSQL recorder: native psycopg ``AsyncConnection`` and
``psycopg_pool.AsyncConnectionPool``, the same SQL and the same guarantees.

Everything that decides is shared with the blocking recorder: the statements
(:mod:`.sql`), the append protocol (the one-statement fast path, the locked path,
per-stream advisory locks, xid-ordered positions, the multi-stream append:
:mod:`.protocol`), read paging, the visibility bound of ``read_all`` (it is in the SQL),
the waiting logic (:func:`~.listener.wait_steps`), error translation and the outage
diagnosis (a checkout that waits more than :data:`~.connection.FIRST_WAIT` seconds asks
the server directly: an unreachable server is reported at once) and the pool's capped
reconnect delay. Only the I/O differs: ``await``.

Opening runs once in a worker thread, on one blocking connection: the direct connection
check (a clear error instead of a pool retrying in the background), the ``create=False``
existence check and the schema migrations (or their verification with ``migrate=false``),
so the migration code exists once. Every later operation is native.

Close: ``await close()`` refuses new operations, lets the ones in flight finish for a
short grace, then cancels their statements on the server and closes the pool; the tasks
get :class:`~ares_events.errors.StoreClosed`, waiters and subscribers too.

It may import the core, :mod:`ares_events.errors`, psycopg and psycopg_pool, and the
other modules of this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
import psycopg_pool
from psycopg import sql

from ares_events.core.events import ErasedPayloadRef, ExpectedVersion, PayloadRef, RecordedEvent
from ares_events.core.lifecycle import AsyncOperationGate
from ares_events.core.recorder import (
    AppendOutcome,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    StoreURL,
    TrackingRecord,
)
from ares_events.core.sansio import Steps, arun
from ares_events.errors import ConfigError, StoreClosed, StoreError, StoreNotFound, StoreUnavailable
from ares_events.stores.postgres.connection import (
    FIRST_WAIT,
    aprobe_server,
    arollback_quietly,
    check_server,
    open_async_pool,
    scrub,
    translate_errors,
)
from ares_events.stores.postgres.listener import AsyncListener, await_for
from ares_events.stores.postgres.options import PostgresOptions, check_schema_name, parse_options
from ares_events.stores.postgres.protocol import (
    RETRIES,
    KeyPager,
    PositionPager,
    PostgresAppendProtocol,
    Stmt,
    StreamPager,
    check_batch_size,
    prefix_query,
    retryable,
)
from ares_events.stores.postgres.recorder import PostgresRecorder
from ares_events.stores.postgres.schema import prepare_schema, schema_exists
from ares_events.stores.postgres.sql import channel_for, compile_statements, row_to_event

if TYPE_CHECKING:
    from ares_events.core.snapshots_async import SnapshotRows

logger = logging.getLogger(__name__)

__all__ = ["AsyncPostgresRecorder"]


class AsyncPort:
    """Sends the protocol's statements over an ``AsyncConnection``."""

    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def one(self, s: Stmt) -> Any:
        cur = await self.conn.execute(s.query, s.args, binary=s.binary, prepare=s.prepare)
        return await cur.fetchone()

    async def all(self, s: Stmt) -> list[Any]:
        cur = await self.conn.execute(s.query, s.args, binary=s.binary, prepare=s.prepare)
        return await cur.fetchall()

    async def pipeline(self, stmts: Sequence[Stmt]) -> list[Any]:
        conn = self.conn
        async with conn.pipeline():
            curs = [
                await conn.execute(s.query, s.args, binary=s.binary, prepare=s.prepare)
                for s in stmts
            ]
        # One round trip: the pipeline is synced on exit, every result is here now.
        out: list[Any] = []
        for c, s in zip(curs, stmts, strict=True):
            if s.fetch == "one":
                out.append(await c.fetchone())
            elif s.fetch == "all":
                out.append(await c.fetchall())
            else:
                out.append(None)
        return out


async def arun_on(conn: psycopg.AsyncConnection[Any], steps: Steps[Any]) -> Any:
    """Drive protocol steps on ``conn``; any failure leaves no transaction open."""
    try:
        return await arun(steps, AsyncPort(conn))
    except BaseException:
        await arollback_quietly(conn)
        raise


def _prepare_blocking(
    conninfo: str,
    kwargs: dict[str, Any],
    *,
    schema: str,
    migrate: bool,
    create: bool,
    where: str,
    secret: str | None,
) -> None:
    """In a worker thread at open: existence check and migrations on one connection.

    Raises:
        StoreNotFound: ``create=False`` and the schema holds no store.
        StoreUnavailable: the server cannot be reached.
        SchemaVersionError: ``migrate=False`` and the schema is not current.
    """
    what = f"preparing schema {schema!r} of {where}"
    with (
        translate_errors(
            what, where, statement_timeout=None, timeout_label=lambda: "", secret=secret
        ),
        psycopg.connect(conninfo, **{**kwargs, "autocommit": True}) as conn,
    ):
        if not create:
            problem = schema_exists(conn, schema)
            if problem is not None:
                raise StoreNotFound(where, f"{problem} (create it with `ares-events init`)")
        prepare_schema(conn, schema, f"schema {schema!r} of {where}", migrate)


class AsyncPostgresRecorder(PostgresAppendProtocol):
    """The PostgreSQL backend for asyncio (see the module docstring).

    Open with :meth:`open_url` (what ``ae.open_async_store`` does) or :meth:`open` over a
    caller's ``AsyncConnectionPool``.
    """

    scheme: ClassVar[tuple[str, ...]] = PostgresRecorder.scheme
    capabilities: frozenset[Capability] = PostgresRecorder.capabilities

    def __init__(
        self,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        *,
        schema: str,
        description: str,
        page_size: int = 2000,
        pool_timeout: float | None = None,
        statement_timeout: int | None = None,
        owns_pool: bool = False,
        secret: str | None = None,
        notify: bool = True,
    ) -> None:
        self.pool = pool
        self.schema = schema
        self.page_size = page_size
        self.notify = notify
        self.predict_heads = True
        self._description = description
        self._secret = secret or None
        self._owns_pool = owns_pool
        self._pool_timeout = pool_timeout
        self._statement_timeout = statement_timeout
        self._heads: dict[str, Head] = {}
        self._sql = compile_statements(schema)
        self.channel = channel_for(schema)
        self._gate = AsyncOperationGate(description)
        self._inflight: set[psycopg.AsyncConnection[Any]] = set()
        self._listener: AsyncListener | None = None
        self._companion: PostgresRecorder | None = None
        conninfo, kw = pool.conninfo, pool.kwargs
        if not isinstance(conninfo, str) or not (kw is None or isinstance(kw, dict)):
            raise ConfigError(
                "AsyncPostgresRecorder needs a pool with a static conninfo and kwargs (they "
                "also open its LISTEN connection and the outage probe)"
            )
        self._listen_args: tuple[str, dict[str, Any]] = (conninfo, dict(kw or {}))

    # -- opening -------------------------------------------------------------------------

    @classmethod
    async def open_url(cls, url: StoreURL, **options: Any) -> AsyncPostgresRecorder:
        """Open ``postgresql://...`` (the URL parameters and options of the blocking
        recorder, see :mod:`ares_events.stores.postgres`).

        Raises:
            ConfigError: an unknown or invalid parameter.
            StoreNotFound: ``create=False`` and the schema holds no store.
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        opts = parse_options(url, options)
        await asyncio.to_thread(_open_checks, opts, url.password)
        pool = open_async_pool(opts)
        try:
            await pool.open(wait=bool(opts.pool_min), timeout=max(opts.pool_timeout, 1.0))
        except psycopg_pool.PoolTimeout as exc:
            await pool.close()
            raise StoreUnavailable(
                f"cannot open {opts.pool_min} connection(s) to {opts.where} "
                f"within {opts.pool_timeout:g}s"
            ) from exc
        except BaseException:
            await pool.close()
            raise
        logger.info("opened async postgresql store %s (schema %s)", opts.where, opts.schema)
        return cls(
            pool,
            schema=opts.schema,
            description=opts.where,
            page_size=opts.page_size,
            pool_timeout=opts.pool_timeout,
            statement_timeout=opts.statement_timeout,
            owns_pool=True,
            secret=url.password,
            notify=opts.notify,
        )

    @classmethod
    async def open(
        cls,
        pool: psycopg_pool.AsyncConnectionPool[Any],
        *,
        schema: str = "public",
        migrate: bool = True,
        create: bool = True,
        page_size: int = 2000,
        notify: bool = True,
        description: str = "postgresql://(caller-provided pool)",
    ) -> AsyncPostgresRecorder:
        """Use an open ``AsyncConnectionPool`` of autocommit connections (the caller keeps
        ownership: :meth:`close` does not close it).

        Raises:
            ConfigError: a bad schema name or page size.
            StoreNotFound: ``create=False`` and the schema holds no store.
            StoreUnavailable: the server cannot be reached.
            SchemaVersionError: ``migrate=False`` and the schema is not current.
        """
        check_schema_name(schema, description)
        if type(page_size) is not int or page_size <= 0:
            raise ConfigError(f"postgresql page_size must be a positive int, got {page_size!r}")
        rec = cls(pool, schema=schema, description=description, page_size=page_size, notify=notify)
        conninfo, kwargs = rec._listen_args
        await asyncio.to_thread(
            _prepare_blocking,
            conninfo,
            kwargs,
            schema=schema,
            migrate=migrate,
            create=create,
            where=description,
            secret=None,
        )
        return rec

    def describe(self) -> str:
        """The store's URL, redacted (no password)."""
        return self._description

    def __repr__(self) -> str:
        return f"AsyncPostgresRecorder({self._description!r}, schema={self.schema!r})"

    # -- connections -----------------------------------------------------------------------

    def _translate_errors(self, what: str) -> contextlib.AbstractContextManager[None]:
        return translate_errors(
            what,
            self._description,
            statement_timeout=self._statement_timeout,
            timeout_label=self._timeout_label,
            secret=self._secret,
        )

    def _timeout_label(self) -> str:
        t = self._pool_timeout if self._pool_timeout is not None else self.pool.timeout
        return f"{t:g}s"

    @contextlib.asynccontextmanager
    async def _conn(
        self, what: str, *, translate: bool = True
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """One unit of work on a pooled connection: the operation gate (close awaits
        it), the outage diagnosis and the error mapping, as in the blocking recorder.

        Raises:
            StoreClosed: the store is closed, or was closed while this ran.
            StoreUnavailable: the server is unreachable, or the pool is exhausted.
            StoreError: any other database error.
        """
        gate = self._gate
        gate.enter(what)
        try:
            with self._translate_errors(what):
                conn, cm = await self._checkout(what)
            self._inflight.add(conn)
            try:
                with self._translate_errors(what) if translate else contextlib.nullcontext():
                    try:
                        yield conn
                    except BaseException as exc:
                        if not await cm.__aexit__(type(exc), exc, exc.__traceback__):
                            raise
                    else:
                        await cm.__aexit__(None, None, None)
            finally:
                self._inflight.discard(conn)
        except (StoreError, psycopg.Error) as exc:
            if gate.closed and not isinstance(exc, StoreClosed):
                raise StoreClosed(self._description, what) from exc
            raise
        finally:
            gate.exit()

    async def _checkout(self, what: str) -> tuple[psycopg.AsyncConnection[Any], Any]:
        """A pooled connection and its entered ``pool.connection()`` context; after
        :data:`FIRST_WAIT` seconds without one, asks the server directly.

        Raises:
            StoreUnavailable: the server does not answer.
            psycopg_pool.PoolTimeout: no connection within ``pool_timeout``.
        """
        pool = self.pool
        total = self._pool_timeout if self._pool_timeout is not None else pool.timeout
        if total <= FIRST_WAIT:
            cm = pool.connection(total)
            return await cm.__aenter__(), cm
        started = time.monotonic()
        cm = pool.connection(FIRST_WAIT)
        try:
            return await cm.__aenter__(), cm
        except psycopg_pool.PoolTimeout:
            if self._gate.closed:
                raise
        conninfo, kwargs = self._listen_args
        problem = await aprobe_server(conninfo, kwargs)
        if problem is not None:
            raise StoreUnavailable(
                f"{what} in {self._description}: the PostgreSQL server cannot be reached "
                f"({scrub(' '.join(str(problem).split()), self._secret)})"
            ) from problem
        cm = pool.connection(max(total - (time.monotonic() - started), 0.001))
        return await cm.__aenter__(), cm

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A pooled autocommit connection for the block (snapshots, projections, admin).

        Raises:
            StoreClosed: the store is closed (also: closed while the block ran).
            StoreUnavailable: the server is unreachable or no connection became free.
        """
        async with self._conn("taking a connection", translate=False) as conn:
            yield conn

    async def _query(self, what: str, query: sql.Composed, args: tuple[Any, ...]) -> list[Any]:
        async with self._conn(what) as conn:
            cur = await conn.execute(query, args, binary=True)
            return await cur.fetchall()

    # -- writes ----------------------------------------------------------------------------

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append in one transaction, serialized per stream only (the blocking recorder's
        protocol, :meth:`PostgresAppendProtocol._append_steps`).

        Raises:
            InvalidEvent: more than 65,535 events in one batch.
            ConcurrencyError: ``expected_version`` is not satisfied.
            StoreClosed: the store was closed before or during the append.
            StoreUnavailable: the server, the pool or the connection failed.
            StoreError: any other database error.
        """
        check_batch_size(len(batch.events), batch.stream_id)
        what = f"append to stream {batch.stream_id!r}"
        for attempt in range(RETRIES):
            try:
                async with self._conn(what) as conn:
                    outcome: AppendOutcome = await arun_on(
                        conn, self._append_steps(batch, expected_version)
                    )
                    return outcome
            except BaseException as exc:  # cancelled too: the prediction may be stale
                self._forget([batch])
                if isinstance(exc, StoreError) and retryable(exc, attempt):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Several batches (and a tracking record) in one transaction.

        Raises:
            InvalidEvent: more than 65,535 events in all.
            ConcurrencyError: an expected version or the tracking record is not satisfied.
            StoreClosed: the store was closed before or during the append.
            StoreUnavailable: the server, the pool or the connection failed.
        """
        check_batch_size(sum(len(b.events) for b, _ in batches))
        what = f"append to {len(batches)} stream(s)"
        for attempt in range(RETRIES):
            try:
                async with self._conn(what) as conn:
                    outcomes: list[AppendOutcome] = await arun_on(
                        conn, self._many_steps(batches, tracking)
                    )
                    return outcomes
            except BaseException as exc:  # cancelled too: the predictions may be stale
                self._forget([b for b, _ in batches])
                if isinstance(exc, StoreError) and retryable(exc, attempt):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None."""
        rows = await self._query(f"tracked position of {name!r}", self._sql["tracking"], (name,))
        return int(rows[0][0]) if rows else None

    # -- reads -----------------------------------------------------------------------------

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """Keyset-paged read of one stream (each page a short statement)."""
        pager = StreamPager(stream_id, from_version, to_version, limit, self.page_size)
        return self._events(pager, self._sql["stream"], f"read of stream {stream_id!r}")

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """Keyset-paged read in global order, only below the visibility bound; only the
        streams under ``stream_prefix`` when given."""
        query, bounds = prefix_query(self._sql, stream_prefix)
        pager = PositionPager(after_position, limit, self.page_size, bounds)
        return self._events(pager, query, "read_all")

    async def _events(
        self, pager: StreamPager | PositionPager, query: sql.Composed, what: str
    ) -> AsyncIterator[RecordedEvent]:
        while (args := pager.args()) is not None:
            rows = await self._query(what, query, args)
            for r in rows:
                yield row_to_event(r)
            pager.advance(rows)

    async def head(self, stream_id: str) -> Head | None:
        """The stream's head row."""
        rows = await self._query(f"head of stream {stream_id!r}", self._sql["head"], (stream_id,))
        return Head(rows[0][0], rows[0][1]) if rows else None

    async def heads(self) -> AsyncIterator[tuple[str, Head]]:
        """Every head, paged by stream id."""
        pager = KeyPager(self.page_size)
        while (args := pager.args()) is not None:
            rows = await self._query("listing streams", self._sql["heads"], args)
            for sid, version, h in rows:
                yield sid, Head(version, h)
            pager.advance(rows)

    async def last_position(self) -> int:
        """Highest position visible to ``read_all`` (0 when empty)."""
        return int((await self._query("last_position", self._sql["last"], ()))[0][0])

    async def schema_version(self) -> int:
        """The schema version recorded in ``ares_meta``."""
        rows = await self._query("reading the schema version", self._sql["schema_version"], ())
        return int(rows[0][0]) if rows else 0

    # -- erasure ---------------------------------------------------------------------------

    async def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """Erase one payload in one transaction (the blocking recorder's statements)."""
        what = f"erase of stream {stream_id!r} version {version}"
        async with self._conn(what) as conn, conn.transaction():
            cur = await conn.execute(
                self._sql["erase"],
                (ref.to_json().decode(), stream_id, version, position, event_hash),
            )
            if cur.rowcount != 1:
                return EraseOutcome(False)
            refs = 0
            if blob_key:
                cur = await conn.execute(self._sql["blob_refs"], (PayloadRef.like_key(blob_key),))
                row = await cur.fetchone()
                refs = int(row[0]) if row else 0
        return EraseOutcome(True, refs)

    # -- metadata and integrity scans ----------------------------------------------------

    async def meta_get(self, key: str) -> str | None:
        """A value of the ``ares_meta`` table (the store's identity lives there)."""
        rows = await self._query("reading the store's metadata", self._sql["meta"], (key,))
        return str(rows[0][0]) if rows else None

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is there; return the stored value."""
        async with self._conn("writing the store's metadata") as conn, conn.transaction():
            await conn.execute(self._sql["meta_insert"], (key, value))
            cur = await conn.execute(self._sql["meta"], (key,))
            row = await cur.fetchone()
        assert row is not None
        return str(row[0])

    async def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what is there."""
        async with self._conn("writing the store's metadata") as conn:
            await conn.execute(self._sql["meta_upsert"], (key, value))

    async def find_duplicates(self) -> AsyncIterator[tuple[str, Any, Any, int, Any]]:
        """Rows that break a uniqueness rule (see the blocking recorder)."""
        q = self._sql
        for sid, version, n, pos in await self._query("audit scan", q["dup_versions"], ()):
            yield "duplicate_version", sid, version, int(n), pos
        for sid, version, n, pos in await self._query("audit scan", q["dup_positions"], ()):
            yield "duplicate_position", sid, version, int(n), pos
        for eid, n, pos in await self._query("audit scan", q["dup_ids"], ()):
            yield "duplicate_event_id", eid, None, int(n), pos

    def read_model_recorder(self) -> PostgresRecorder:
        """A blocking recorder on the same schema, for the read-model tables (folded by
        the blocking runner; an erasure resets them through it). Opened on first use with
        a pool of at most two connections, closed with this recorder. Blocking: only for
        blocking callers.

        Raises:
            StoreClosed: this recorder is closed.
            StoreUnavailable: the server cannot be reached.
        """
        self._gate.check("opening the read-model tables")
        if self._companion is None:
            conninfo, kwargs = self._listen_args
            pool = psycopg_pool.ConnectionPool(
                conninfo,
                kwargs={**kwargs, "autocommit": True},
                min_size=0,
                max_size=2,
                open=True,
                name="ares-events-read-models",
            )
            self._companion = PostgresRecorder(
                pool,
                schema=self.schema,
                migrate=False,
                description=self._description,
                owns_pool=True,
                secret=self._secret,
                notify=self.notify,
            )
        return self._companion

    def snapshot_rows(self, event_store: Any) -> SnapshotRows:
        """The ``ares_snapshots`` rows of this schema, natively async."""
        from ares_events.stores.postgres.snapshots_async import PostgresSnapshotRows

        return PostgresSnapshotRows(self, event_store)

    # -- wake-ups --------------------------------------------------------------------------

    async def _connect_listener(self) -> psycopg.AsyncConnection[Any]:
        conninfo, kwargs = self._listen_args
        return await psycopg.AsyncConnection.connect(conninfo, **{**kwargs, "autocommit": True})

    async def wait_for(self, position: int, timeout: float) -> bool:
        """Wait until an event after ``position`` is visible to ``read_all``, or
        ``timeout`` seconds pass: woken by ``NOTIFY`` (polling with ``notify=false``);
        never misses a wake-up.

        Raises:
            StoreClosed: the store is closed (also while waiting).
            StoreUnavailable: the server cannot be reached.
        """
        listener = None
        if self.notify:
            self._gate.check("waiting for events")
            if self._listener is None:
                self._listener = AsyncListener(
                    self._connect_listener, self.channel, self._description, self._secret
                )
            listener = self._listener
        return await await_for(listener, self.last_position, position, timeout)

    # -- lifecycle -------------------------------------------------------------------------

    async def _interrupt(self) -> None:
        """After close()'s grace: cancel the statements still running and, for a pool
        this store owns, fail the callers still waiting for a connection."""
        for conn in list(self._inflight):
            with contextlib.suppress(Exception):
                await conn.cancel_safe(timeout=2.0)
        if self._owns_pool:
            with contextlib.suppress(Exception):
                await self.pool.close(timeout=0.0)

    async def close(self) -> None:
        """Refuse new calls, await (or cancel) the ones in flight, stop the listener and
        close the pool (when this store opened it). Idempotent."""
        if not await self._gate.close(interrupt=self._interrupt):
            return
        listener, self._listener = self._listener, None
        if listener is not None:
            await listener.close()
        companion, self._companion = self._companion, None
        if companion is not None:
            await asyncio.to_thread(companion.close)
        if self._owns_pool:
            await self.pool.close()
        logger.debug("closed async postgresql store %s", self._description)


def _open_checks(opts: PostgresOptions, secret: str | None) -> None:
    """At open, in a worker thread: the direct connection check, then the schema."""
    check_server(opts, secret=secret)
    _prepare_blocking(
        "",
        opts.connect_kwargs,
        schema=opts.schema,
        migrate=bool(opts.migrate),
        create=opts.create,
        where=opts.where,
        secret=secret,
    )
