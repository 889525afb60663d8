"""The PostgreSQL append protocol and read paging, written once for both faces.

The blocking recorder (psycopg ``Connection``, :mod:`.writes`) and the asyncio recorder
(psycopg ``AsyncConnection``, :mod:`.recorder_async`) run the very same protocol: the
steps below (:mod:`ares_events.core.sansio`) decide every statement and every check,
and a small *port* per face sends the statements:

- ``one(stmt)`` / ``all(stmt)``: one statement, its first row / all rows;
- ``pipeline(stmts)``: several statements in one round trip (libpq pipeline mode, synced
  once at the end), then each statement's result as its ``fetch`` asks.

Any exception leaves the connection's transaction rolled back by the face's driver
(:func:`~ares_events.stores.postgres.connection.rollback_quietly` or its async twin).

Read paging (keysets on ``(version, position)`` within a stream, on ``position``
globally, on ``stream_id`` for heads) is the pure :class:`StreamPager`,
:class:`PositionPager` and :class:`KeyPager` both faces loop over.

It may import the core, :mod:`ares_events.errors` and this package's SQL.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Final, Literal

import psycopg
from psycopg import sql

from ares_events.core.events import (
    STREAM_EXISTS,
    ExpectedVersion,
    RecordedEvent,
    check_expected_version,
)
from ares_events.core.recorder import (
    AppendOutcome,
    Batch,
    Head,
    SealedEvent,
    TrackingRecord,
    check_tracking,
    prefix_range,
)
from ares_events.core.sansio import Call, Steps
from ares_events.errors import ConcurrencyError, InvalidEvent, StoreError
from ares_events.stores.postgres.arrays import ByteaArray, TextArray
from ares_events.stores.postgres.sql import (
    BEGIN,
    COMMIT,
    LOCK_MANY,
    LOCK_STREAM,
    ROLLBACK,
    row_to_event,
)

logger = logging.getLogger(__name__)

__all__ = [
    "MAX_BATCH",
    "RETRIES",
    "KeyPager",
    "PositionPager",
    "PostgresAppendProtocol",
    "Stmt",
    "StreamPager",
    "check_batch_size",
    "prefix_query",
    "retryable",
]

MAX_BATCH: Final = 65535
"""Events per append: the low 16 bits of a position index the event in its batch."""
RETRIES: Final = 3
"""Attempts of an append that hit a unique violation (a concurrent append of its ids)."""
_POSITION_SHIFT: Final = 65536
_MAX_XID: Final = 2**47  # xid * 65536 must stay below 2**63
_HEAD_CACHE_SIZE: Final = 10_000  # predicted heads kept (cleared when full)
_MAX_KEY: Final = 2**63 - 1

Fetch = Literal["none", "one", "all"]


class Stmt:
    """One statement for a port: query, arguments, psycopg options, what to fetch."""

    __slots__ = ("args", "binary", "fetch", "prepare", "query")

    def __init__(
        self,
        query: str | sql.Composed,
        args: Sequence[Any] | None = None,
        *,
        binary: bool = False,
        prepare: bool | None = None,
        fetch: Fetch = "none",
    ) -> None:
        self.query = query
        self.args = args
        self.binary = binary
        self.prepare = prepare
        self.fetch = fetch


def check_batch_size(n: int, stream_id: str | None = None) -> None:
    """Refuse a batch whose positions would not fit (before any I/O).

    Raises:
        InvalidEvent: more than :data:`MAX_BATCH` events.
    """
    if n > MAX_BATCH:
        raise InvalidEvent(
            "events",
            f"a postgresql append holds at most {MAX_BATCH} events, got {n}",
            stream_id=stream_id,
        )


def retryable(exc: StoreError, attempt: int) -> bool:
    """An append to retry: a concurrent append of the same event id to another stream
    committed first (a unique violation); the retry's id check then reports it."""
    return attempt + 1 < RETRIES and isinstance(exc.__cause__, psycopg.errors.UniqueViolation)


class PostgresAppendProtocol:
    """The write protocol of both PostgreSQL faces, as steps (a mixin: the recorder
    provides the attributes declared here). See the package docstring for the fast path,
    the locked path and the multi-stream append."""

    _sql: dict[str, sql.Composed]
    _heads: dict[str, Head]
    _description: str
    channel: str
    notify: bool
    predict_heads: bool

    def _remember(self, stream_id: str, head: Head | None) -> None:
        heads = self._heads
        if head is None or head.version == 0:
            heads.pop(stream_id, None)
            return
        if len(heads) >= _HEAD_CACHE_SIZE and stream_id not in heads:
            heads.clear()
        heads[stream_id] = head

    def _forget(self, batches: Sequence[Batch]) -> None:
        """A failed append: its predicted heads may be wrong now."""
        for b in batches:
            self._heads.pop(b.stream_id, None)

    def _append_steps(
        self, batch: Batch, expected_version: ExpectedVersion
    ) -> Steps[AppendOutcome]:
        """One append: the fast path when the head can be predicted, else the locked path."""
        outcome = yield from self._fast_steps(batch, expected_version)
        if outcome is None:
            outcome = yield from self._locked_steps(batch, expected_version)
        return outcome

    def _fast_steps(
        self, batch: Batch, expected_version: ExpectedVersion
    ) -> Steps[AppendOutcome | None]:
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
        query, params = self._fast_statement(batch, sealed, head)
        try:
            row = yield Call("one", Stmt(query, params, binary=True, fetch="one"))
        except psycopg.errors.UniqueViolation:
            # A reused event id (autocommit: the statement wrote nothing). The locked
            # path looks the ids up: an idempotent re-append, or the conflict it is.
            self._heads.pop(stream_id, None)
            return None
        last_position = row[0] if row is not None else None
        if last_position is None:
            self._heads.pop(stream_id, None)
            logger.debug("append to %r: head moved, locked path", stream_id)
            return None
        last = sealed[-1]
        self._remember(stream_id, Head(last.version, last.hash))
        # Nobody reads the events of a fresh append: the core needs the last version and
        # position only (the events of one append have consecutive positions).
        return AppendOutcome([], version=last.version, position=last_position)

    def _fast_statement(
        self, batch: Batch, sealed: list[SealedEvent], head: Head | None
    ) -> tuple[sql.Composed, tuple[Any, ...]]:
        """The one statement of the fast path for a batch sealed on the predicted ``head``
        (None: a new stream), and its arguments (also used by tests that run it by hand
        inside their own transaction)."""
        q = self._sql
        sid = batch.stream_id
        last = sealed[-1]
        channel = self.channel if self.notify else None
        if head is None or head.version == 0:
            kind = "first"
            guard: tuple[Any, ...] = (sid, last.version, last.hash)
        else:
            kind = "next"
            guard = (last.version, last.hash, sid, head.version, head.hash)
        if len(sealed) == 1:
            e = last.event
            ref = e.payload_ref
            rows: tuple[Any, ...] = (
                sid,
                last.version,
                e.event_id,
                e.type,
                e.module,
                e.payload_bytes,
                ref.to_json().decode() if ref is not None else None,
                e.meta_json,
                e.at,
                last.prev_hash,
                last.hash,
            )
            return q[f"append_{kind}_one"], (sid, *guard, *rows, channel, channel)
        evs = [s.event for s in sealed]
        rows = (
            sid,
            sealed[0].version - 1,
            TextArray([e.event_id for e in evs]),
            TextArray([e.type for e in evs]),
            TextArray([e.module for e in evs]),
            ByteaArray([e.payload_bytes for e in evs]),
            TextArray(
                [r.to_json().decode() if (r := e.payload_ref) is not None else None for e in evs]
            ),
            ByteaArray([e.meta_json for e in evs]),
            TextArray([e.at for e in evs]),
            ByteaArray([s.prev_hash for s in sealed]),
            ByteaArray([s.hash for s in sealed]),
        )
        return q[f"append_{kind}_batch"], (sid, *guard, *rows, channel, channel)

    def _check_xid(self, xid: int) -> None:
        if xid >= _MAX_XID:
            raise StoreError(
                f"transaction id {xid} of {self._description} is too large for "
                "ares-events positions (xid * 65536 must fit in a bigint)"
            )

    def _locked_steps(
        self, batch: Batch, expected_version: ExpectedVersion
    ) -> Steps[AppendOutcome]:
        """Two round trips under the stream's advisory lock (package docstring)."""
        stream_id = batch.stream_id
        ids = batch.event_ids
        q = self._sql
        # Round trip 1: lock the stream, then (new statement, fresh snapshot) read the
        # head, look for the ids and get this transaction's xid. Unprepared: planned for
        # the table as it is now (see migration step 3).
        _, _, row = yield Call(
            "pipeline",
            (
                Stmt(BEGIN, prepare=False),
                Stmt(LOCK_STREAM, (stream_id,)),
                Stmt(
                    q["head_for_append"], (ids, stream_id), binary=True, prepare=False, fetch="one"
                ),
            ),
        )
        assert row is not None
        version, head_hash, xid, exists = row
        if exists:
            rows, _ = yield Call(
                "pipeline",
                (
                    Stmt(q["ids"], (ids,), binary=True, prepare=False, fetch="all"),
                    Stmt(ROLLBACK, prepare=False),
                ),
            )
            return AppendOutcome([row_to_event(r) for r in rows], duplicate=True)
        head = Head(version, head_hash) if version is not None else None
        self._remember(stream_id, head)
        check_expected_version(stream_id, expected_version, version or 0)
        self._check_xid(xid)
        sealed = batch.seal(head)
        base = version or 0
        first = xid * _POSITION_SHIFT
        evs = [s.event for s in sealed]
        refs = [e.payload_ref for e in evs]
        last = sealed[-1]
        channel = self.channel if self.notify else None
        # Round trip 2: events, head and wake-up in one statement, then COMMIT.
        yield Call(
            "pipeline",
            (
                Stmt(
                    q["insert"],
                    (
                        xid,
                        stream_id,
                        base,
                        TextArray([e.event_id for e in evs]),
                        TextArray([e.type for e in evs]),
                        TextArray([e.module for e in evs]),
                        ByteaArray([e.payload_bytes for e in evs]),
                        TextArray([r.to_json().decode() if r is not None else None for r in refs]),
                        ByteaArray([e.meta_json for e in evs]),
                        TextArray([e.at for e in evs]),
                        ByteaArray([s.prev_hash for s in sealed]),
                        ByteaArray([s.hash for s in sealed]),
                        stream_id,
                        last.version,
                        last.hash,
                        channel,
                        channel,
                        str(first + len(sealed) - 1),
                    ),
                ),
                Stmt(COMMIT, prepare=False),
            ),
        )
        self._remember(stream_id, Head(last.version, last.hash))
        return AppendOutcome([], version=last.version, position=first + len(sealed) - 1)

    def _many_steps(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> Steps[list[AppendOutcome]]:
        """Several batches (and a tracking record) in one transaction.

        The stream locks (and the tracking name's) are taken in one sorted order, so
        concurrent multi-stream appends cannot deadlock; then, in later statements (fresh
        snapshots), the heads, the ids and the tracked position are read and checked,
        every batch is sealed against its head, and one statement writes the events
        (consecutive positions ``xid * 65536 + i`` in batch order), the heads, the
        tracking row and the wake-up.
        """
        q = self._sql
        streams = [b.stream_id for b, _ in batches]
        ids = [i for b, _ in batches for i in b.event_ids]
        keys = list(streams)
        if tracking is not None:
            keys.append(f"ares-tracking:{tracking.name}")
        name = tracking.name if tracking is not None else None
        _, _, head_rows, info = yield Call(
            "pipeline",
            (
                Stmt(BEGIN, prepare=False),
                Stmt(LOCK_MANY, (keys,), prepare=False),
                Stmt(q["heads_for_append"], (streams,), binary=True, prepare=False, fetch="all"),
                Stmt(q["xid_ids_tracking"], (ids, name), binary=True, prepare=False, fetch="one"),
            ),
        )
        assert info is not None
        xid, exists, tracked = info
        if exists:
            rows, _ = yield Call(
                "pipeline",
                (
                    Stmt(q["ids"], (ids,), binary=True, prepare=False, fetch="all"),
                    Stmt(ROLLBACK, prepare=False),
                ),
            )
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
        self._check_xid(xid)
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
        yield Call(
            "pipeline",
            (
                Stmt(
                    q["insert_many"],
                    (
                        xid,
                        TextArray([sid for sid, _ in flat]),
                        [s.version for _, s in flat],
                        TextArray([e.event_id for e in evs]),
                        TextArray([e.type for e in evs]),
                        TextArray([e.module for e in evs]),
                        ByteaArray([e.payload_bytes for e in evs]),
                        TextArray(
                            [
                                r.to_json().decode() if (r := e.payload_ref) is not None else None
                                for e in evs
                            ]
                        ),
                        ByteaArray([e.meta_json for e in evs]),
                        TextArray([e.at for e in evs]),
                        ByteaArray([s.prev_hash for _, s in flat]),
                        ByteaArray([s.hash for _, s in flat]),
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
                ),
                Stmt(COMMIT, prepare=False),
            ),
        )
        out = []
        pos = first - 1
        for sid, ss in zip(streams, sealed_all, strict=True):
            pos += len(ss)
            self._remember(sid, Head(ss[-1].version, ss[-1].hash))
            out.append(AppendOutcome([], version=ss[-1].version, position=pos))
        return out


# -- read paging (pure keyset state) ---------------------------------------------------


class StreamPager:
    """Keyset pages of one stream on ``(version, position)``: unique per row even in a
    table whose unique index was dropped and holds two rows of one version, so no row is
    skipped or returned twice."""

    __slots__ = ("hi", "kp", "kv", "left", "lo", "page", "stream_id", "want")

    def __init__(
        self,
        stream_id: str,
        from_version: int,
        to_version: int | None,
        limit: int | None,
        page: int,
    ) -> None:
        self.stream_id = stream_id
        self.lo = max(from_version, 1)
        self.hi = to_version if to_version is not None else 2**62
        self.left = limit if limit is not None else 2**62
        self.page = page
        self.kv, self.kp = self.lo - 1, _MAX_KEY
        self.want = 0

    def args(self) -> tuple[Any, ...] | None:
        """The next page's query arguments, or None when done."""
        if self.left <= 0:
            return None
        self.want = min(self.page, self.left)
        return (self.stream_id, self.lo, self.hi, self.kv, self.kp, self.want)

    def advance(self, rows: Sequence[Any]) -> None:
        """Move past a page just read."""
        if len(rows) < self.want:
            self.left = 0
            return
        self.left -= len(rows)
        self.kv, self.kp = rows[-1][1], rows[-1][2]
        if type(self.kv) is int:
            self.lo = max(self.lo, self.kv)


def prefix_query(
    statements: dict[str, sql.Composed], stream_prefix: str | None
) -> tuple[sql.Composed, tuple[str, ...]]:
    """The ``read_all`` statement and its stream-id bounds (:func:`prefix_range`) for an
    optional ``stream_prefix``."""
    if not stream_prefix:
        return statements["all"], ()
    lo, hi = prefix_range(stream_prefix)
    if hi is None:
        return statements["all_from"], (lo,)
    return statements["all_range"], (lo, hi)


class PositionPager:
    """Keyset pages in global position order (``read_all``), with the statement's
    stream-id ``bounds`` (see :func:`prefix_query`) between the position and the limit."""

    __slots__ = ("after", "bounds", "left", "page", "want")

    def __init__(
        self, after_position: int, limit: int | None, page: int, bounds: tuple[str, ...] = ()
    ) -> None:
        self.after = after_position
        self.left = limit if limit is not None else 2**62
        self.page = page
        self.bounds = bounds
        self.want = 0

    def args(self) -> tuple[Any, ...] | None:
        """The next page's query arguments, or None when done."""
        if self.left <= 0:
            return None
        self.want = min(self.page, self.left)
        return (self.after, *self.bounds, self.want)

    def advance(self, rows: Sequence[Any]) -> None:
        """Move past a page just read."""
        if len(rows) < self.want:
            self.left = 0
            return
        self.left -= len(rows)
        self.after = rows[-1][2]


class KeyPager:
    """Keyset pages on the first column (stream ids of ``heads()``)."""

    __slots__ = ("after", "done", "page")

    def __init__(self, page: int) -> None:
        self.after = ""
        self.page = page
        self.done = False

    def args(self) -> tuple[Any, ...] | None:
        """The next page's query arguments, or None when done."""
        return None if self.done else (self.after, self.page)

    def advance(self, rows: Sequence[Any]) -> None:
        """Move past a page just read."""
        if len(rows) < self.page:
            self.done = True
        else:
            self.after = rows[-1][0]
