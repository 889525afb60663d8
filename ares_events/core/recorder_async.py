"""The recorder protocol: what a backend implements, and one small protocol per capability
(:data:`REQUIRES`), checked once when the store opens (:func:`check_capabilities`).

It may import the core's events and backend values, and :mod:`ares_events.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from ares_events.core.backend import (
    AppendOutcome,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    TrackingRecord,
)
from ares_events.core.events import ErasedPayloadRef, ExpectedVersion, RecordedEvent
from ares_events.errors import StoreError

if TYPE_CHECKING:
    from ares_events.core.read_models import ReadModels
    from ares_events.core.snapshot_format import Snapshot, SnapshotInfo, SnapshotRow

__all__ = [
    "REQUIRES",
    "AsyncAppendsMany",
    "AsyncArchives",
    "AsyncErases",
    "AsyncHasDefaultBlobs",
    "AsyncKeepsMetadata",
    "AsyncKeepsReadModels",
    "AsyncKeepsSnapshots",
    "AsyncPagesStreams",
    "AsyncRecorder",
    "AsyncScansDuplicates",
    "AsyncScansPositions",
    "AsyncSnapshotRows",
    "AsyncWakes",
    "AsyncWraps",
    "backend_of",
    "check_capabilities",
    "system_of_record",
]


@runtime_checkable
class AsyncRecorder(Protocol):
    """What every backend implements (the write protocol: :mod:`ares_events.core.backend`)."""

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the recorder declares (a class attribute, usually)."""

    def describe(self) -> str:
        """The store's location, redacted (safe to log)."""

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append atomically, following the write protocol."""

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """Events of one stream in version order, lazily."""

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """Events of every stream in global position order, lazily.

        With ``stream_prefix`` (never empty when given), only the events of streams whose
        id starts with it, as the range condition of
        :func:`~ares_events.core.events.prefix_range`; ``limit`` counts those events.
        """

    async def head(self, stream_id: str) -> Head | None:
        """The stream's head row, or None when the stream does not exist."""

    def heads(self) -> AsyncIterator[tuple[str, Head]]:
        """Every stream head, ordered by stream id."""

    async def last_position(self) -> int:
        """The highest global position visible to ``read_all`` (0 when empty)."""

    async def close(self) -> None:
        """Release connections and files; calls in flight fail with ``StoreClosed``.
        Idempotent."""


@runtime_checkable
class AsyncAppendsMany(Protocol):
    """:attr:`Capability.MULTI_STREAM_APPEND`: several streams and a tracking record in
    one transaction (the protocol of :mod:`ares_events.core.backend`)."""

    async def append_many(
        self, batches: Sequence[tuple[Batch, ExpectedVersion]], tracking: TrackingRecord | None
    ) -> list[AppendOutcome]:
        """One outcome per batch; nothing written unless every check passed."""

    async def tracked_position(self, name: str) -> int | None:
        """The position last tracked for ``name``, or None."""


@runtime_checkable
class AsyncErases(Protocol):
    """:attr:`Capability.ERASE`: replace one event's payload, in one transaction, by an
    :class:`~ares_events.core.events.ErasedPayloadRef`, matched on stream, version,
    position and hash (a row rewritten since it was read is never touched); count the
    other rows whose payload lives in the same blob; drop any cached copy."""

    async def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """See the class docstring."""


@runtime_checkable
class AsyncArchives(Protocol):
    """:attr:`Capability.ARCHIVE`: what moving old events to an archive needs from the
    database (the archive itself is a blob store: :mod:`ares_events.archive`)."""

    async def meta_swap(self, key: str, expected: str | None, value: str) -> bool:
        """Store ``value`` under ``key`` only if the stored value is ``expected`` (None:
        absent), in one transaction; True when it was stored."""

    async def delete_archived(
        self,
        first_position: int,
        last_position: int,
        expected: Sequence[tuple[int, bytes, str | None]],
    ) -> int:
        """Delete the rows at positions ``first_position..last_position`` in one
        transaction, if and only if they are exactly ``expected`` (position, hash and
        stored ``payload_ref`` text of each, in position order): a row added, missing,
        rewritten or erased since the segment was written rolls everything back (a
        :class:`~ares_events.errors.StoreError` naming the first difference). Rows
        already deleted (a resumed run) count as none; returns how many were deleted."""


@runtime_checkable
class AsyncWakes(Protocol):
    """:attr:`Capability.WAKEUPS`: wait for new events without polling."""

    async def wait_for(self, position: int, timeout: float) -> bool:
        """True once an event after ``position`` is visible, False after ``timeout``."""


@runtime_checkable
class AsyncKeepsMetadata(Protocol):
    """:attr:`Capability.METADATA`: a small key/value table beside the events (the
    store's identity lives there)."""

    async def meta_get(self, key: str) -> str | None:
        """The value under ``key``, or None."""

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` unless a value is there; return the stored value."""

    async def meta_set(self, key: str, value: str) -> None:
        """Store ``value``, replacing what is there."""


@runtime_checkable
class AsyncSnapshotRows(Protocol):
    """The rows of a snapshot table: what a backend stores for the snapshot store, which
    holds every check (:mod:`ares_events.core.snapshots`)."""

    async def put(self, snap: Snapshot) -> None:
        """Insert or replace the row of ``(snap.stream_id, snap.projection)`` (a sealed
        snapshot: :func:`~ares_events.core.snapshot_format.row_of` is its row)."""

    async def get(self, stream_id: str, projection: str) -> SnapshotRow | None:
        """The row of ``(stream_id, projection)``, or None."""

    async def remove(self, stream_id: str, projection: str | None) -> int:
        """Delete the rows of a stream (one projection's, or all); return how many."""

    def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        """Every row's description (no state), ordered by stream and projection."""


@runtime_checkable
class AsyncKeepsSnapshots(Protocol):
    """:attr:`Capability.SNAPSHOTS`: a snapshot table in the same database."""

    def snapshot_rows(self) -> AsyncSnapshotRows:
        """The snapshot table's rows."""


@runtime_checkable
class AsyncScansDuplicates(Protocol):
    """:attr:`Capability.DUPLICATE_SCAN`: rows that break a uniqueness rule, for the audit
    (a healthy store has none)."""

    def find_duplicates(self) -> AsyncIterator[tuple[str, Any, Any, int, Any]]:
        """``(kind, stream_id or event id, version, count, position)``, kind one of
        ``duplicate_version``, ``duplicate_position``, ``duplicate_event_id``."""


@runtime_checkable
class AsyncScansPositions(Protocol):
    """:attr:`Capability.POSITION_SCAN`: the global order as bare tuples, for the audit
    (which checks positions and finds streams without a head, and needs nothing else)."""

    def positions(self, after_position: int) -> AsyncIterator[tuple[Any, Any, Any]]:
        """``(position, stream_id, version)`` of every row after ``after_position`` in
        position order, as stored (a tampered row may hold any type), with the
        visibility bound of ``read_all``; paged."""


@runtime_checkable
class AsyncPagesStreams(Protocol):
    """:attr:`Capability.STREAM_PAGES`: one page of stream heads, straight from the heads
    index (never a scan of every head)."""

    async def heads_page(
        self, after: str, limit: int, prefix: str | None
    ) -> list[tuple[str, Head]]:
        """At most ``limit`` heads of the streams whose id is above ``after`` (``""``:
        from the first) in the order of :meth:`AsyncRecorder.heads`; with ``prefix``
        (never empty when given), only the ids that start with it exactly (no wildcard)."""


@runtime_checkable
class AsyncHasDefaultBlobs(Protocol):
    """:attr:`Capability.DEFAULT_BLOBS`: a place for spilled payloads when none is
    configured (a SQLite file's ``<file>.blobs`` folder)."""

    def default_blobs_url(self) -> str | None:
        """A ``file://`` URL, or None (no I/O)."""


@runtime_checkable
class AsyncKeepsReadModels(Protocol):
    """:attr:`Capability.READ_MODELS`: read-model and checkpoint tables beside the
    events, created once per store by the backend (blocking on both faces: the runner
    that folds them is blocking)."""

    def read_models(self) -> ReadModels:
        """The store's read models (the same object on every call)."""


@runtime_checkable
class AsyncWraps(Protocol):
    """A recorder over another one (the Redis cache, a worker-thread adapter): integrity
    checks read the system of record under it, never a cache."""

    def uncached(self) -> AsyncRecorder:
        """The recorder under any cache (itself when it caches nothing)."""


REQUIRES: Final[dict[Capability, type]] = {
    Capability.MULTI_STREAM_APPEND: AsyncAppendsMany,
    Capability.ERASE: AsyncErases,
    Capability.WAKEUPS: AsyncWakes,
    Capability.METADATA: AsyncKeepsMetadata,
    Capability.SNAPSHOTS: AsyncKeepsSnapshots,
    Capability.DUPLICATE_SCAN: AsyncScansDuplicates,
    Capability.POSITION_SCAN: AsyncScansPositions,
    Capability.DEFAULT_BLOBS: AsyncHasDefaultBlobs,
    Capability.STREAM_PAGES: AsyncPagesStreams,
    Capability.ARCHIVE: AsyncArchives,
    Capability.READ_MODELS: AsyncKeepsReadModels,
}
"""The protocol each method-bearing capability requires (the others describe behaviour:
gapless positions, persistence, several processes)."""


def check_capabilities(recorder: object, where: str) -> frozenset[Capability]:
    """The capabilities ``recorder`` declares, once each is checked against its protocol.

    Raises:
        StoreError: a declared capability's methods are missing (names them).
    """
    caps = frozenset(getattr(recorder, "capabilities", frozenset()))
    for cap in sorted(caps, key=lambda c: c.value):
        proto = REQUIRES.get(cap)
        if proto is not None and not isinstance(recorder, proto):
            raise StoreError(
                f"store {where}: {type(recorder).__name__} declares Capability.{cap.name} "
                f"but does not implement {proto.__name__.removeprefix('Async')}"
            )
    return caps


def system_of_record(recorder: AsyncRecorder) -> AsyncRecorder:
    """The recorder under any cache wrapper (what integrity checks read)."""
    return recorder.uncached() if isinstance(recorder, AsyncWraps) else recorder


def backend_of(recorder: Any) -> Any:
    """The backend recorder under every wrapper (the cache, the archive reader), which
    each name the recorder they wrap as ``inner``: for the few callers that need the
    backend's own objects (its connection pool, its cells)."""
    inner = getattr(recorder, "inner", None)
    while inner is not None:
        recorder, inner = inner, getattr(inner, "inner", None)
    return recorder
