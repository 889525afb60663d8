"""The backend contract's values: what the core hands a recorder and what it gets back.

A recorder seals a :class:`Batch` (:meth:`Batch.seal`) against the head it read inside
its write transaction, so two writers can never fork a chain (the write protocol:
docs/architecture.md).

It may import the core's events, :mod:`ares_events.errors` and the chain format.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ares_events.chain import _NAME_CACHE, ChainKey, _cache_name, _native, genesis, link_hashes
from ares_events.core.events import AppendResult, PayloadRef, PreparedEvent, RecordedEvent
from ares_events.errors import ConcurrencyError

__all__ = [
    "AppendOutcome",
    "ArchivedRow",
    "Batch",
    "Capability",
    "EraseOutcome",
    "Head",
    "SealedEvent",
    "TrackingRecord",
    "check_tracking",
    "fresh_result",
    "insert_rows_reference",
    "params_of_rows",
    "rows_differ",
]

_native_insert_rows: Any = None if _native is None else _native.insert_rows
_INT_MAX = 2**63 - 1


class Capability(enum.Enum):
    """Optional behaviours a backend declares explicitly. Each one that adds methods has
    a protocol in :mod:`ares_events.core.recorder` (``REQUIRES``), checked when a store
    opens."""

    GAPLESS_POSITIONS = "gapless_positions"
    """Global positions are 1, 2, 3, ... with no holes (memory, SQLite)."""
    PERSISTENT = "persistent"
    """Data survives closing and reopening the store."""
    MULTI_PROCESS = "multi_process"
    """Several processes may append at once."""
    WAKEUPS = "wakeups"
    """``wait_for(position, timeout)`` returns when new events arrive, without polling."""
    SNAPSHOTS = "snapshots"
    """A snapshot table in the same database (``snapshot_rows()``)."""
    MULTI_STREAM_APPEND = "multi_stream_append"
    """``append_many(batches, tracking)``: one transaction over several streams, with an
    optional :class:`TrackingRecord`; and ``tracked_position(name)``."""
    ERASE = "erase"
    """``erase(stream_id, version, position, event_hash, ref) -> EraseOutcome``: replace
    one event's payload (inline bytes or blob reference) with an
    :class:`~ares_events.core.events.ErasedPayloadRef`, leaving every other column, the
    hash chain and the global order as they are (see :class:`EraseOutcome`)."""
    METADATA = "metadata"
    """``meta_get``/``meta_put_if_absent``/``meta_set``: a key/value table beside the
    events, where the store records its identity."""
    DUPLICATE_SCAN = "duplicate_scan"
    """``find_duplicates()``: rows that break a uniqueness rule, for the audit."""
    POSITION_SCAN = "position_scan"
    """``positions(after_position)``: ``(position, stream_id, version)`` of every row in
    global order, three columns and no event objects, for the audit's order check."""
    ARCHIVE = "archive"
    """``meta_swap(key, expected, value)`` (compare-and-set of a metadata value) and
    ``delete_archived(first_position, last_position, expected)`` (remove rows that an
    archive segment holds, checked row by row): the store can move old events to an
    archive (:mod:`ares_events.archive`)."""
    CELL_CURSORS = "cell_cursors"
    """A store of several cells: ``read_all`` merges them and each event it yields carries
    a cursor (one position per cell, packed in an int) that resumes the merge right after
    it; ``read`` and an append's result give an event's position within its cell (a
    "point", docs/scaling.md). Positions from ``read`` are not ``read_all`` cursors."""
    DEFAULT_BLOBS = "default_blobs"
    """``default_blobs_url()``: where spilled payloads go when no blob store is given."""
    STREAM_PAGES = "stream_pages"
    """``heads_page(after, limit, prefix)``: one page of stream heads in stream id order,
    from the backend's index (a console lists millions of streams a page at a time)."""
    READ_MODELS = "read_models"
    """``read_models()``: the read-model and checkpoint tables beside the events
    (:class:`~ares_events.core.read_models.ReadModels`)."""


@dataclass(frozen=True, slots=True)
class TrackingRecord:
    """ "``name`` has processed everything up to ``position``", written atomically with
    the events of an :meth:`~ares_events.core.store.EventStore.append_many` (a consumer's
    exactly-once bookmark). A name's tracked position only ever increases."""

    name: str
    position: int


def check_tracking(record: TrackingRecord, current: int | None) -> None:
    """Raise :class:`ConcurrencyError` unless ``record`` is above the tracked position.

    Backends call this inside their write transaction, under the tracking name's lock.

    Raises:
        ConcurrencyError: ``record.position`` is not above ``current``.
    """
    if current is not None and record.position <= current:
        raise ConcurrencyError(
            f"tracking:{record.name}",
            f"a position above {current}",
            current,
            f"position {record.position} is not above the tracked position",
        )


@dataclass(frozen=True, slots=True)
class Head:
    """A stream head: last version and the hash of that event."""

    version: int
    hash: bytes


@dataclass(slots=True)  # not frozen: one per appended event, internal
class SealedEvent:
    """A prepared event with its place in the chain, ready to insert."""

    event: PreparedEvent
    version: int
    prev_hash: bytes
    hash: bytes

    def recorded(self, stream_id: str, position: int) -> RecordedEvent:
        """Build the :class:`RecordedEvent` once the backend knows the position."""
        e = self.event
        return RecordedEvent(
            stream_id,
            self.version,
            position,
            e.event_id,
            e.type,
            e.module,
            e.payload_bytes,
            e.meta_json,
            e.at,
            self.prev_hash,
            self.hash,
            e.payload_ref,
        )


class Batch:
    """Events to append to one stream, validated and encoded by the core."""

    __slots__ = ("_key", "events", "stream_id")

    def __init__(
        self, stream_id: str, events: Sequence[PreparedEvent], key: ChainKey | None
    ) -> None:
        self.stream_id = stream_id
        self.events = list(events)
        self._key = key

    @property
    def event_ids(self) -> list[str]:
        """The events' ids, in order (a SQLite append reads them only for a reused id)."""
        return [e.event_id for e in self.events]

    def _after(self, head: Head | None) -> tuple[int, bytes]:
        if head is None or head.version == 0:
            return 0, genesis(self.stream_id)
        return head.version, head.hash

    def seal(self, head: Head | None) -> list[SealedEvent]:
        """Assign versions after ``head`` and compute the link hashes."""
        stream_id = self.stream_id
        version, prev = self._after(head)
        events = self.events
        # One call for the batch (the C loop when it is built, see chain.link_hashes).
        hashes = link_hashes(stream_id, version, prev, events, self._key)
        out = []
        for e, h in zip(events, hashes, strict=True):
            version += 1
            out.append(SealedEvent(e, version, prev, h))
            prev = h
        return out

    def insert_rows(
        self, head: Head | None, position: int
    ) -> tuple[list[tuple[Any, ...]], int, bytes, int]:
        """Seal after ``head`` and build the rows a SQL backend inserts, at the global
        positions after ``position``: ``(rows, last version, last hash, last position)``.
        Each row is ``(position, stream_id, version, event_id, type, module, payload,
        payload_ref JSON or None, metadata, recorded_at, prev_hash, hash)``. The C loop
        does it when it can; :func:`insert_rows_reference` is its reference.
        """
        c = self._c_rows(head, position, flat=False)
        if c is not None:
            (rows, last), version = c
            return rows, version, last, position + len(self.events)
        return insert_rows_reference(self.stream_id, self.seal(head), position)

    def writer_args(self) -> tuple[bytes, bytes | None] | None:
        """What a native writer seals this batch with (``_native.SQLiteWriter.append``):
        ``(the stream id as JSON, the chain key's bytes or None)``; None when the C pass
        does not take it."""
        if _native_insert_rows is None or type(self).seal is not Batch.seal:
            return None
        st = _NAME_CACHE.get(self.stream_id) or _cache_name(self.stream_id)
        return st, None if self._key is None else self._key.key

    def _c_rows(
        self, head: Head | None, position: int, *, flat: bool
    ) -> tuple[tuple[Any, ...], int] | None:
        """The C pass behind :meth:`insert_rows` (``flat``: the values the native SQLite
        writer binds, :func:`params_of_rows` their reference): ``(what
        ``_native.insert_rows`` returns, last version)``, or None when it does not take
        the batch."""
        args = self.writer_args()
        if args is None:
            return None
        stream_id = self.stream_id
        version, prev = self._after(head)
        n = len(self.events)
        if not (
            n
            and type(version) is int
            and version < _INT_MAX - n
            and type(position) is int
            and 0 <= position < _INT_MAX - n
            and type(prev) is bytes
            and len(prev) == 32
        ):
            return None
        st, k = args
        done = _native_insert_rows(
            stream_id, st, version, prev, position, self.events, k, PreparedEvent, flat
        )
        return None if done is None else (done, version + n)


def params_of_rows(rows: Sequence[Sequence[Any]]) -> tuple[list[Any], list[Any]]:
    """The reference of the values a multi-row INSERT binds for ``rows`` (of
    :meth:`Batch.insert_rows`, which share one ``recorded_at``): ``(shared, values)``.
    ``shared`` is ``[recorded_at]`` and ``values`` ten a row ``(position, version,
    event_id, type, module, payload, payload_ref, metadata, prev_hash, hash)``; or, when the
    events share type, module and metadata, ``shared`` is ``[recorded_at, type, module,
    metadata, first position, first version]`` and ``values`` four a row ``(event_id,
    payload, prev_hash, hash)``. ``Batch._c_rows(..., flat=True)`` gives the values."""
    ats = {r[9] for r in rows}
    assert len(ats) == 1, "the rows do not share one recorded_at"
    r0 = rows[0]
    if all(r[4] == r0[4] and r[5] == r0[5] and r[8] == r0[8] for r in rows):
        values = [x for r in rows for x in (r[3], r[6], r[10], r[11])]
        return [r0[9], r0[4], r0[5], r0[8], r0[0], r0[2]], values
    values = [
        x for r in rows for x in (r[0], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[10], r[11])
    ]
    return [r0[9]], values


def insert_rows_reference(
    stream_id: str, sealed: Sequence[SealedEvent], position: int
) -> tuple[list[tuple[Any, ...]], int, bytes, int]:
    """:meth:`Batch.insert_rows` from sealed events, in Python (the reference)."""
    rows: list[tuple[Any, ...]] = []
    for s in sealed:
        position += 1
        e = s.event
        ref = e.payload_ref
        rows.append(
            (
                position,
                stream_id,
                s.version,
                e.event_id,
                e.type,
                e.module,
                e.payload_bytes,
                ref.to_json().decode() if ref else None,
                e.meta_json,
                e.at,
                s.prev_hash,
                s.hash,
            )
        )
    last = sealed[-1]
    return rows, last.version, last.hash, position


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What a backend's append returns: the events written, or the stored events that
    already carry the batch's ids (``duplicate=True``; nothing was written)."""

    events: list[RecordedEvent]
    duplicate: bool = False
    version: int | None = None
    """Last version written; backends may set it (with ``position``) and leave ``events``
    empty on the normal path, which saves building events nobody reads."""
    position: int | None = None


@dataclass(frozen=True, slots=True)
class EraseOutcome:
    """What a backend's ``erase`` returns.

    ``erased`` is True when the row (matched by stream, version, position *and* hash, so
    a row rewritten since it was read is never touched) now holds the erased reference;
    ``blob_refs`` counts the *other* events whose payload still lives in the same blob
    (counted in the same transaction; the core deletes the blob only when it is 0).
    """

    erased: bool
    blob_refs: int = 0


def fresh_result(
    stream_id: str, prepared: Sequence[PreparedEvent], outcome: AppendOutcome
) -> AppendResult:
    """The result of a fresh (not duplicate) append."""
    if outcome.version is not None and outcome.position is not None:
        version, position = outcome.version, outcome.position
    else:
        last = outcome.events[-1]
        version, position = last.version, last.position
    return AppendResult(
        stream_id,
        version,
        position,
        tuple([p.uid if p.uid is not None else uuid.UUID(p.event_id) for p in prepared]),
    )


ArchivedRow = tuple[int, bytes, "str | None", str]
"""What ``delete_archived`` (:attr:`Capability.ARCHIVE`) is told of each row an archive
segment holds: ``(position, hash, payload_ref JSON or None, stream_id)`` (the stream id
routes the row to its cell)."""


def rows_differ(rows: Sequence[Sequence[Any]], expected: Sequence[ArchivedRow]) -> str | None:
    """Why the database rows ``(position, hash, payload_ref)`` of a segment's position
    range do not hold exactly the rows the segment holds (``expected``), or None when
    they do; rows of the range the segment does not hold (each stream's last event,
    kept in the database) are left out of the comparison. What a backend's
    ``delete_archived`` checks before it deletes anything."""
    want = {e[0]: (e[1], e[2]) for e in expected}
    found = 0
    for pos, h, ref in rows:
        if pos not in want:
            continue
        found += 1
        eh, eref = want[pos]
        if bytes(h) != eh:
            return f"the row at position {pos} has another hash than the segment's"
        if _ref_of(ref) != _ref_of(eref):
            return f"the row at position {pos} changed its payload reference (erased?)"
    if found != len(want):
        return f"{len(want) - found} of the segment's {len(want)} rows are not in the database"
    return None


def _ref_of(raw: Any) -> PayloadRef | None:
    return None if raw is None else PayloadRef.parse_stored(raw)
