"""Writes of the PostgreSQL recorder: the one-statement fast path, the locked path and the
multi-stream append (see the package docstring for the protocol and its guarantees).

:class:`PostgresWrites` is a mixin of the recorder
(:class:`~ares_events.stores.postgres.recorder.PostgresRecorder`); it uses the recorder's
SQL, its ``_conn()`` unit of work and its head predictions. It may import the core,
:mod:`ares_events.errors`, psycopg and this package's SQL and connections.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from typing import Any, Final

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
)
from ares_events.errors import ConcurrencyError, InvalidEvent, StoreError
from ares_events.stores.postgres.connection import rollback_quietly
from ares_events.stores.postgres.sql import (
    BEGIN,
    COMMIT,
    LOCK_MANY,
    LOCK_STREAM,
    ROLLBACK,
    row_to_event,
)

logger = logging.getLogger(__name__)

__all__ = ["MAX_BATCH", "PostgresWrites"]

MAX_BATCH: Final = 65535
"""Events per append: the low 16 bits of a position index the event in its batch."""
_POSITION_SHIFT: Final = 65536
_MAX_XID: Final = 2**47  # xid * 65536 must stay below 2**63
_HEAD_CACHE_SIZE: Final = 10_000  # predicted heads kept (cleared when full)
_FAST_OK, _FAST_HEAD_MOVED, _FAST_DUPLICATE = 0, 1, 2


class PostgresWrites:
    """Appends (a mixin: the recorder provides the attributes declared here)."""

    _sql: dict[str, sql.Composed]
    _heads: dict[str, Head]
    _description: str
    channel: str
    notify: bool
    predict_heads: bool

    def _conn(
        self, what: str, *, translate: bool = True
    ) -> contextlib.AbstractContextManager[psycopg.Connection[Any]]:
        raise NotImplementedError

    def _query(self, what: str, query: sql.Composed, args: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

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
        what = f"append to stream {stream_id!r}"
        attempts = 3
        for attempt in range(attempts):
            try:
                with self._conn(what) as conn:
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
        what = f"append to {len(batches)} stream(s)"
        for attempt in range(3):
            try:
                with self._conn(what) as conn:
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
