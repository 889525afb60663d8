"""The SQLite recorder: :class:`SQLiteRecorder` (durability, concurrency and reads are in
docs/architecture.md, its URL parameters in docs/configuration.md).

It may import the core, :mod:`ares_events.errors` and this package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ares_events.core.backend import (
    AppendOutcome,
    Batch,
    Capability,
    Head,
    TrackingRecord,
    check_tracking,
)
from ares_events.core.events import (
    ExpectedVersion,
    RecordedEvent,
    check_expected_version,
    prefix_range,
)
from ares_events.core.lifecycle import OperationGate
from ares_events.core.row_pages import PagedRead, event_maker
from ares_events.core.url import StoreURL, parse_bool, parse_int, parse_seconds
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    StoreClosed,
    StoreError,
    StoreNotFound,
    StoreUnavailable,
)
from ares_events.stores.sql_read_models import SQLITE, SQLReadModels
from ares_events.stores.sqlite import writes
from ares_events.stores.sqlite.archive import SQLiteArchiving
from ares_events.stores.sqlite.erase import SQLiteErasure
from ares_events.stores.sqlite.read_only import (
    UnlockedRead,
    file_uri,
    reader_uri,
    require_schema,
)
from ares_events.stores.sqlite.schema import SCHEMA_KEY, prepare_schema
from ares_events.stores.sqlite.sql import (
    INSERT_EVENT,
    INSERT_META_IF_ABSENT,
    SELECT_ALL,
    SELECT_ALL_FROM,
    SELECT_ALL_RANGE,
    SELECT_DUPLICATE_IDS,
    SELECT_DUPLICATE_VERSIONS,
    SELECT_HEAD,
    SELECT_HEAD_AND_POSITION,
    SELECT_HEADS,
    SELECT_HEADS_FROM_GE,
    SELECT_HEADS_RANGE_GE,
    SELECT_HEADS_RANGE_GT,
    SELECT_IDS,
    SELECT_LAST_POSITION,
    SELECT_META,
    SELECT_POSITIONS,
    SELECT_STREAM,
    SELECT_TRACKING,
    UPSERT_HEAD,
    UPSERT_META,
    UPSERT_TRACKING,
)

if TYPE_CHECKING:
    from ares_events.stores.sqlite.snapshots import SQLiteSnapshotRows

logger = logging.getLogger(__name__)

__all__ = ["SQLiteRecorder"]


_SYNC_MODES: Final = {"full": "FULL", "normal": "NORMAL", "extra": "EXTRA"}
_PARAMS: Final = ("synchronous", "busy_timeout", "page_size", "migrate")
_OPTIONS: Final = (*_PARAMS, "create", "read_only")
_MAX_KEY: Final = 2**63 - 1
_URL_ESCAPES: Final = str.maketrans({"%": "%25", "#": "%23", "?": "%3F"})
"""What :meth:`SQLiteRecorder.describe` escapes so its URL leads back to the file."""


_row_to_event = event_maker()  # native when built: one C call a row (issue 33)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or "locked" in str(exc)


class SQLiteRecorder(SQLiteErasure, SQLiteArchiving):
    """SQLite backend (docs/architecture.md gives durability and concurrency)."""

    scheme: ClassVar[tuple[str, ...]] = ("sqlite",)
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.GAPLESS_POSITIONS,
            Capability.PERSISTENT,
            Capability.MULTI_PROCESS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
            Capability.ERASE,
            Capability.METADATA,
            Capability.DUPLICATE_SCAN,
            Capability.POSITION_SCAN,
            Capability.DEFAULT_BLOBS,
            Capability.STREAM_PAGES,
            Capability.ARCHIVE,
            Capability.READ_MODELS,
        }
    )

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        *,
        synchronous: str = "full",
        busy_timeout: float = 30.0,
        page_size: int = 256,
        migrate: bool = True,
        create: bool = True,
        read_only: bool = False,
    ) -> None:
        create = create and not read_only
        self.read_only = read_only
        if synchronous.lower() not in _SYNC_MODES:
            raise ConfigError(
                f"sqlite synchronous must be one of {', '.join(_SYNC_MODES)}, got {synchronous!r}"
            )
        if busy_timeout <= 0 or page_size <= 0:
            raise ConfigError("sqlite busy_timeout and page_size must be positive")
        # ":memory:" is sqlite3's (and SQLAlchemy's) name for it, never a file of that name
        self.path = None if path is None or os.fspath(path) == ":memory:" else Path(path)
        self._memory = self.path is None
        if not create:
            self._require_existing(busy_timeout)
        # Always a URI: a private shared-cache in-memory database (every thread of this
        # store sees the same data), or the file, which mode=rw never creates; a reader's
        # creates nothing it cannot remove (read_only.py), and one without locks is
        # checked after each read (self._unlocked).
        self._unlocked: UnlockedRead | None = None
        if self.path is None:
            mem_name = f"ares-mem-{id(self)}-{random.getrandbits(32)}"
            self._target = f"file:{mem_name}?mode=memory&cache=shared"
        elif read_only:
            self._target, self._unlocked = reader_uri(self.path, self.describe())
        else:
            self._target = file_uri(self.path, "rwc" if create else "rw")
        self._sync = _SYNC_MODES[synchronous.lower()]
        self._busy = busy_timeout
        self.page_size = page_size
        self._local = threading.local()
        # An in-memory database is shared between this store's threads through SQLite's
        # shared cache, whose table locks fail at once (SQLITE_LOCKED) instead of waiting:
        # serialize its statements in-process. File databases wait on the busy timeout.
        self._serial: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if self._memory else contextlib.nullcontext()
        )
        self._conns: list[sqlite3.Connection] = []
        self._writers: list[Any] = []  # finalized before their connections close
        self._conns_lock = threading.Lock()
        self._gate = OperationGate(self.describe())
        if self.path is not None and create:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreUnavailable(
                    f"cannot create the folder of sqlite store {self.describe()}: "
                    f"{exc.strerror or exc}"
                ) from exc
        try:
            self._keepalive = self._conn()  # holds an in-memory database open
            prepare_schema(self, migrate)
        except BaseException:
            self.close()  # the caller never gets this object: do not leak its connection
            raise
        logger.info("opened sqlite store %s", self.describe())

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> SQLiteRecorder:
        """Parse ``sqlite:///rel.db`` (relative), ``sqlite:////abs.db`` or ``sqlite://``.

        Raises:
            ConfigError: an unknown or invalid parameter.
        """
        p = url.check_params(_PARAMS)
        if url.host:
            raise ConfigError(
                f"sqlite URLs take no host: use sqlite:///relative.db or "
                f"sqlite:////absolute.db, got {url.redacted()}"
            )
        raw_path = url.path[1:] if url.path.startswith("/") else url.path
        where = url.redacted()
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(unknown)} for {where}; valid: {', '.join(_OPTIONS)}"
            )
        # Keyword options win over the URL's parameters, and are held to the same rules.
        kw: dict[str, Any] = {**p, **options}
        if "synchronous" in kw and type(kw["synchronous"]) is not str:
            got = kw["synchronous"]
            raise ConfigError(f"synchronous must be a string, got {got!r:.40} in {where}")
        if "busy_timeout" in kw:
            kw["busy_timeout"] = parse_seconds(kw["busy_timeout"], "busy_timeout", where)
        if "page_size" in kw:
            kw["page_size"] = parse_int(kw["page_size"], "page_size", where)
        for flag in ("migrate", "create", "read_only"):
            if flag in kw:
                kw[flag] = parse_bool(kw[flag], flag, where)
        return cls(raw_path or None, **kw)

    def describe(self) -> str:
        """Human-readable location: a URL that opens this file again (the characters a
        URL would read otherwise are escaped)."""
        if self.path is None:
            return "sqlite:// (in memory)"
        return "sqlite:///" + str(self.path).translate(_URL_ESCAPES)

    def default_blobs_url(self) -> str | None:
        """The embedded default blob store: a folder ``<file>.blobs`` next to the file."""
        return None if self.path is None else Path(f"{self.path.resolve()}.blobs").as_uri()

    # -- opening -------------------------------------------------------------------------

    def _require_existing(self, busy_timeout: float) -> None:
        if self.path is None:
            raise StoreNotFound(self.describe(), "an in-memory database is always new")
        if not self.path.is_file():
            what = "is not a file" if self.path.exists() else "no such file"
            raise StoreNotFound(self.describe(), f"{what} (create a store with `ares-events init`)")
        require_schema(self.path, self.describe(), busy_timeout)

    # -- connections ---------------------------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is not None:
            return conn
        try:
            conn = sqlite3.connect(
                self._target,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy,
            )
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open sqlite store {self.describe()}: {exc}") from exc
        # Registered at once, under the lock close() takes: a connection opened while
        # close() runs is either closed by it or refused here.
        with self._conns_lock:
            if self._gate.closed:
                conn.close()
                raise StoreClosed(self.describe())
            self._conns.append(conn)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy * 1000)}")
            if self.read_only:
                conn.execute("PRAGMA query_only = ON")  # SQLite refuses any write
            elif not self._memory:
                conn.execute("PRAGMA page_size = 2048")  # new files (docs/configuration.md)
                self._retry(lambda: conn.execute("PRAGMA journal_mode = WAL"))
            conn.execute(f"PRAGMA synchronous = {self._sync}")
            # Zero deleted and overwritten content where it costs no extra I/O: a read
            # model or snapshot that once held an erased payload leaves no copy in the
            # pages' free space (erasures themselves run with secure_delete fully on).
            conn.execute("PRAGMA secure_delete = FAST")
        except sqlite3.DatabaseError as exc:
            raise StoreUnavailable(f"cannot open sqlite store {self.describe()}: {exc}") from exc
        self._local.conn = conn
        return conn

    def _interrupt_all(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(sqlite3.Error):
                c.interrupt()

    def _retry(self, fn: Any, started: float | None = None) -> Any:
        """``fn()``, retried while the database is locked, until ``busy_timeout`` after
        ``started`` (default now): when a first try already found it locked, it began the
        wait (SQLite's busy handler waited through it), so a write waits ``busy_timeout``
        in all, not twice."""
        deadline = (time.monotonic() if started is None else started) + self._busy
        if started is not None and time.monotonic() >= deadline:
            raise self._locked()
        delay = 0.002
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc) or self._gate.closed:
                    raise
                if time.monotonic() >= deadline:
                    raise self._locked() from exc
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.2)

    def _locked(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"sqlite store {self.describe()} stayed locked for more than {self._busy:g}s"
        )

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction on this thread's connection (``BEGIN IMMEDIATE``, busy
        retries, commit or rollback). For tables that live beside the events (snapshots,
        read models); raw sqlite3 errors propagate.

        Raises:
            StoreClosed: the store is closed, or was closed while the transaction ran.
        """
        with self._gate.op(), self._write() as conn:
            yield conn

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A read transaction (deferred ``BEGIN``, always rolled back) on this thread's
        connection: one consistent view of the tables beside the events, also on a
        read-only store; raw sqlite3 errors propagate.

        Raises:
            StoreClosed: the store is closed, or was closed while the transaction ran.
            StoreUnavailable: a writer wrote a file read without locks (read_only.py).
        """
        with self._gate.op():
            conn = self._conn()
            with self._serial:
                self._retry(lambda: conn.execute("BEGIN"))
                try:
                    yield conn
                finally:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                    if self._unlocked is not None:
                        self._unlocked.check()

    def read_models(self) -> SQLReadModels:
        """The read-model and checkpoint tables in this file (one object per store, made
        on first use; a read-only store reads them and creates none)."""
        with self._conns_lock:
            found: SQLReadModels | None = getattr(self, "_read_models", None)
            if found is None:
                found = self._read_models = SQLReadModels(self.transaction, self.reading, SQLITE)
            return found

    def fetch(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """All rows of one read statement, retried while the database is busy; raw sqlite3
        errors propagate.

        Raises:
            StoreClosed: the store is closed, or was closed while the statement ran.
            StoreUnavailable: a writer wrote a file read without locks (read_only.py).
        """
        with self._gate.op():
            try:
                with self._serial:
                    w = self._writer()
                    return self._retry(lambda: writes.rows(w, self._conn(), sql, args))  # type: ignore[no-any-return]
            except sqlite3.Error as exc:
                if self._gate.closed:
                    raise StoreClosed(self.describe(), "read") from exc
                raise
            finally:  # no rows (nor a torn page's error) from a file written meanwhile
                if self._unlocked is not None:
                    self._unlocked.check()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction; the caller holds the gate."""
        with self._serial:
            conn = self._begin()
            try:
                yield conn
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
            self._commit(conn)

    def _begin(self, busy_since: float | None = None) -> sqlite3.Connection:
        """``BEGIN IMMEDIATE`` on this thread's connection (under ``_serial``): tried once,
        then retried while busy (a lambda and a retry loop cost more than the statement);
        ``busy_since``: when the native writer's first try, which found it locked, began."""
        if self.read_only:
            raise StoreError(f"sqlite store {self.describe()} is open read-only: no writes")
        conn = self._conn()
        if busy_since is not None:
            self._retry(lambda: conn.execute("BEGIN IMMEDIATE"), busy_since)
        else:
            self._busy_execute(conn, "BEGIN IMMEDIATE")
        return conn

    def _writer(self) -> Any:
        """This thread's native writer, made at its first append or read; None: the Python
        path (an in-memory database is shared between threads under ``_serial``)."""
        local = self._local
        try:
            return local.writer
        except AttributeError:
            pass
        conn = self._conn()
        # type(), not isinstance(): an instrumented sqlite3.connect (OpenTelemetry's) hands
        # back a proxy that passes isinstance but holds no handle the writer can read.
        native = writes.NATIVE_WRITES and issubclass(type(conn), sqlite3.Connection)
        writer = writes.new_writer(conn) if native and not self._memory else None
        if writer is not None:
            with self._conns_lock:
                self._writers.append(writer)
        local.writer = writer
        return writer

    def _busy_execute(self, conn: sqlite3.Connection, statement: str) -> None:
        started = time.monotonic()
        try:
            conn.execute(statement)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc):
                raise
            self._retry(lambda: conn.execute(statement), started)

    def _commit(self, conn: sqlite3.Connection) -> None:
        try:
            self._busy_execute(conn, "COMMIT")
        except BaseException:
            # A COMMIT that failed (interrupted by close, disk full) leaves the
            # transaction open: end it so the connection is clean.
            with contextlib.suppress(sqlite3.Error):
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            raise

    # -- writes --------------------------------------------------------------------------

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append in one ``BEGIN IMMEDIATE`` transaction (see the base module's protocol).
        Written out flat, without context managers: this is the hot path."""
        stream_id = batch.stream_id
        gate = self._gate
        gate.enter(f"append to stream {stream_id!r}")
        try:
            try:
                busy_since = None
                writer: Any = None if self.read_only else self._writer()
                args = None if writer is None else batch.writer_args()
                if args is not None:  # the whole append in one native call
                    exp = expected_version
                    code = exp if isinstance(exp, int) else writes.EXPECT_CODE[exp]
                    started = time.monotonic()
                    fast = writer.append(stream_id, args[0], code, batch.events, args[1])
                    if fast:
                        return AppendOutcome([], version=fast[0], position=fast[1])
                    if fast is False:  # it found the database locked (and waited)
                        busy_since = started
                with self._serial:
                    c = self._begin(busy_since)
                    try:
                        done = self._append_rows(c, batch, expected_version)
                    except BaseException:
                        with contextlib.suppress(sqlite3.Error):
                            c.execute("ROLLBACK")
                        raise
                    self._commit(c)
                return done
            except sqlite3.IntegrityError:
                # A reused event id violated the unique index: look the ids up.
                with self._write() as c:
                    existing = self._existing(c, batch)
                if existing:
                    return AppendOutcome(existing, duplicate=True)
                raise
        except sqlite3.Error as exc:
            raise self._failed(exc, f"append to stream {stream_id!r}") from exc
        finally:
            gate.exit()

    def _append_rows(
        self, c: sqlite3.Connection, batch: Batch, expected_version: ExpectedVersion
    ) -> AppendOutcome:
        stream_id = batch.stream_id
        version, head_hash, pos = c.execute(
            SELECT_HEAD_AND_POSITION, (stream_id, stream_id)
        ).fetchone()
        try:
            check_expected_version(stream_id, expected_version, version or 0)
        except ConcurrencyError:
            # A retried append whose first attempt committed: idempotent.
            existing = self._existing(c, batch)
            if existing:
                return AppendOutcome(existing, duplicate=True)
            raise
        # The rows straight from the prepared events, sealed on the way. A reused event
        # id violates the unique index: the transaction rolls back and the ids are looked
        # up by the caller. No lookup on the normal path. (The native writer's multi-row
        # INSERT numbers its placeholders, which Python 3.12.0-3.12.3's sqlite3 warns
        # about when given a list: this path binds plain ones.)
        head = Head(version, head_hash) if version else None
        rows, last_version, last_hash, pos = batch.insert_rows(head, pos)
        c.executemany(INSERT_EVENT, rows)
        c.execute(UPSERT_HEAD, (stream_id, last_version, last_hash))
        return AppendOutcome([], version=last_version, position=pos)

    def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Append several batches (and a tracking record) in one ``BEGIN IMMEDIATE``
        transaction: the database's write lock covers every stream (see the base module's
        multi-stream protocol)."""
        with self._appending(f"append to {len(batches)} stream(s)"):
            try:
                with self._write() as c:
                    if tracking is not None:
                        row = c.execute(SELECT_TRACKING, (tracking.name,)).fetchone()
                        check_tracking(tracking, row[0] if row else None)
                    pos = c.execute(SELECT_LAST_POSITION).fetchone()[0]
                    rows: list[tuple[Any, ...]] = []
                    heads: list[tuple[str, int, bytes]] = []
                    out: list[AppendOutcome] = []
                    for batch, expected in batches:
                        stream_id = batch.stream_id
                        head = c.execute(SELECT_HEAD, (stream_id,)).fetchone()
                        try:
                            check_expected_version(stream_id, expected, head[0] if head else 0)
                        except ConcurrencyError:
                            dups = [self._existing(c, b) for b, _ in batches]
                            if any(dups):
                                return [AppendOutcome(x, duplicate=bool(x)) for x in dups]
                            raise
                        batch_rows, last_version, last_hash, pos = batch.insert_rows(
                            Head(head[0], head[1]) if head else None, pos
                        )
                        rows += batch_rows
                        heads.append((stream_id, last_version, last_hash))
                        out.append(AppendOutcome([], version=last_version, position=pos))
                    # A reused event id violates the unique index: everything rolls back
                    # and the ids are looked up below.
                    c.executemany(INSERT_EVENT, rows)
                    c.executemany(UPSERT_HEAD, heads)
                    if tracking is not None:
                        c.execute(UPSERT_TRACKING, (tracking.name, tracking.position))
                return out
            except sqlite3.IntegrityError:
                with self._write() as c:
                    dups = [self._existing(c, b) for b, _ in batches]
                if any(dups):
                    return [AppendOutcome(x, duplicate=bool(x)) for x in dups]
                raise

    @contextlib.contextmanager
    def _appending(self, action: str) -> Iterator[None]:
        """An append inside the gate, its sqlite3 errors mapped (locked: unavailable)."""
        self._gate.enter(action)
        try:
            yield
        except sqlite3.Error as exc:
            raise self._failed(exc, action) from exc
        finally:
            self._gate.exit()

    def _failed(self, exc: sqlite3.Error, action: str) -> StoreError:
        if self._gate.closed:
            return StoreClosed(self.describe(), action)
        bad = StoreUnavailable if isinstance(exc, sqlite3.OperationalError) else StoreError
        return bad(f"{action} in {self.describe()} failed: {exc}")

    def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None."""
        rows = self._query(SELECT_TRACKING, (name,))
        return int(rows[0][0]) if rows else None

    @staticmethod
    def _existing(c: sqlite3.Connection, batch: Batch) -> list[RecordedEvent]:
        ids = batch.event_ids
        rows = c.execute(SELECT_IDS % ",".join("?" * len(ids)), ids).fetchall()
        return [_row_to_event(r) for r in rows]

    # -- reads ---------------------------------------------------------------------------

    def _query(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        try:
            return self.fetch(sql, args)
        except sqlite3.Error as exc:
            raise StoreError(f"read from {self.describe()} failed: {exc}") from exc

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read of one stream, on ``(version, position)``: a
        :class:`~ares_events.core.row_pages.PagedRead`, whose rows become events as they
        are taken (and whose pages a verifier checks straight from the rows)."""
        return PagedRead.over(self._stream_rows(stream_id, from_version, to_version, limit))

    def _stream_rows(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[list[tuple[Any, ...]]]:
        lo = max(from_version, 1)
        hi = to_version if to_version is not None else 2**62
        left = limit if limit is not None else 2**62
        page = self.page_size
        kv, kp = lo - 1, _MAX_KEY  # keyset: rows after (kv, kp)
        while left > 0:
            want = min(page, left)
            rows = self._query(SELECT_STREAM, (stream_id, lo, hi, kv, kp, want))
            if rows:
                yield rows
            if len(rows) < want:
                return
            left -= len(rows)
            kv, kp = rows[-1][1], rows[-1][2]
            if type(kv) is int:
                lo = max(lo, kv)

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> Iterator[RecordedEvent]:
        """Keyset-paged read in global order (of the streams under ``stream_prefix``)."""
        after, page = after_position, self.page_size
        left = limit if limit is not None else 2**62
        sql = SELECT_ALL
        bounds: tuple[str, ...] = ()
        if stream_prefix:
            lo, hi = prefix_range(stream_prefix)
            sql, bounds = (SELECT_ALL_FROM, (lo,)) if hi is None else (SELECT_ALL_RANGE, (lo, hi))
        while left > 0:
            rows = self._query(sql, (after, *bounds, min(page, left)))
            yield from map(_row_to_event, rows)
            if len(rows) < min(page, left):
                return
            left -= len(rows)
            after = rows[-1][2]

    def positions(self, after_position: int) -> Iterator[tuple[Any, Any, Any]]:
        """``(position, stream_id, version)`` in global order after ``after_position``,
        keyset-paged; for the audit."""
        after, page = after_position, self.page_size
        while True:
            rows = self._query(SELECT_POSITIONS, (after, page))
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1][0]

    def head(self, stream_id: str) -> Head | None:
        """The stream's head row."""
        rows = self._query(SELECT_HEAD, (stream_id,))
        return Head(rows[0][0], rows[0][1]) if rows else None

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every head, paged by stream id."""
        after = ""
        while True:
            page = self.heads_page(after, self.page_size, None)
            yield from page
            if len(page) < self.page_size:
                return
            after = page[-1][0]

    def heads_page(self, after: str, limit: int, prefix: str | None) -> list[tuple[str, Head]]:
        """One page of heads from the primary key (see the protocol)."""
        lo, hi = prefix_range(prefix) if prefix is not None else ("", None)
        inside = after >= lo  # one lower bound: the cursor inside the range (or past it), else lo
        if hi is None:
            sql = SELECT_HEADS if inside else SELECT_HEADS_FROM_GE
            rows = self._query(sql, (max(after, lo), limit))
        else:
            sql = SELECT_HEADS_RANGE_GT if inside else SELECT_HEADS_RANGE_GE
            rows = self._query(sql, (max(after, lo), hi, limit))
        return [(sid, Head(version, h)) for sid, version, h in rows]

    def last_position(self) -> int:
        """Highest committed position."""
        return int(self._query(SELECT_LAST_POSITION, ())[0][0])

    def schema_version(self) -> int:
        """The schema version recorded in the database (``ares-events init`` prints it)."""
        rows = self._query(SELECT_META, (SCHEMA_KEY,))
        return int(rows[0][0]) if rows else 0

    # -- metadata and integrity scans ----------------------------------------------------

    def meta_get(self, key: str) -> str | None:
        """A value of the ``ares_meta`` table (the store's identity lives there)."""
        rows = self._query(SELECT_META, (key,))
        return str(rows[0][0]) if rows else None

    def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is there; return the stored value.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the file stayed locked.
        """
        try:
            with self.transaction() as c:
                c.execute(INSERT_META_IF_ABSENT, (key, value))
                return str(c.execute(SELECT_META, (key,)).fetchone()[0])
        except sqlite3.Error as exc:
            raise StoreError(f"writing metadata of {self.describe()} failed: {exc}") from exc

    def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what is there.

        Raises:
            StoreClosed: the store is closed.
        """
        try:
            with self.transaction() as c:
                c.execute(UPSERT_META, (key, value))
        except sqlite3.Error as exc:
            raise StoreError(f"writing metadata of {self.describe()} failed: {exc}") from exc

    def find_duplicates(self) -> Iterator[tuple[str, Any, Any, int, Any]]:
        """Rows that break a uniqueness rule: ``(kind, stream_id or event id, version,
        count, first position)`` with kind ``duplicate_version`` or ``duplicate_event_id``
        (for the audit; a healthy file has none)."""
        for sid, version, n, pos in self._query(SELECT_DUPLICATE_VERSIONS, ()):
            yield "duplicate_version", sid, version, int(n), pos
        for eid, n, pos in self._query(SELECT_DUPLICATE_IDS, ()):
            yield "duplicate_event_id", eid, None, int(n), pos

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (for snapshot and projection tables in the same file)."""
        return self._conn()

    def snapshot_rows(self) -> SQLiteSnapshotRows:
        """The snapshot store in this file (``EventStore.snapshots`` asks for it)."""
        from ares_events.stores.sqlite.snapshots import SQLiteSnapshotRows

        return SQLiteSnapshotRows(self)

    def close(self) -> None:
        """Refuse new calls, let the ones in flight finish (or interrupt them after a
        grace), then close every connection (docs/architecture.md, "Closing"). Idempotent."""
        if not self._gate.close(interrupt=self._interrupt_all):
            return
        with self._conns_lock:
            conns, self._conns = self._conns, []
            writers, self._writers = self._writers, []
        for w in writers:
            w.close()
        for c in conns:
            with contextlib.suppress(sqlite3.Error):
                c.close()
        self._local = threading.local()
        logger.debug("closed sqlite store %s", self.describe())
