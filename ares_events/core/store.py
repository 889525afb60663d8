"""The core event store: validation, encoding, chaining and spill over a narrow backend.

:class:`EventStore` is what :func:`ares_events.open_store` returns. It validates and
encodes events once, hands the backend a :class:`~ares_events.core.recorder.Batch` that
seals the chain inside the backend's write transaction, and resolves idempotent
re-appends.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import (
    ANY,
    AppendResult,
    ExpectedVersion,
    NewEvent,
    RecordedEvent,
    _normalize_expected,
    prepare,
    same_event,
    utc_now_at,
    validate_name,
)
from ares_events.core.recorder import Batch, Capability, Head, Recorder, TrackingRecord
from ares_events.errors import ConcurrencyError, InvalidEvent, StoreError
from ares_events.integrity.chain import ChainKey

if TYPE_CHECKING:
    from ares_events.stores.blobs.base import BlobStore

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_INLINE_BYTES", "MAX_METADATA_BYTES", "EventStore", "emit"]

DEFAULT_MAX_INLINE_BYTES: Final = 64 * 1024 * 1024
"""A payload stored inline (not spilled to a blob store) may be at most this big."""
MAX_METADATA_BYTES: Final = 1024 * 1024
"""Canonical metadata is hashed into every header; it may be at most this big."""


class EventStore:
    """A hash-chained, append-only event store over one backend.

    Use as a context manager or call :meth:`close`.
    """

    def __init__(
        self,
        recorder: Recorder,
        *,
        chain_key: ChainKey | None = None,
        blobs: BlobStore | None = None,
        spill_threshold: int = 256 * 1024,
        url: str | None = None,
        max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES,
    ) -> None:
        self.recorder = recorder
        self.max_inline_bytes = max_inline_bytes
        self.chain_key = chain_key
        self.blobs = blobs
        self.spill_threshold = spill_threshold
        self._url = url or getattr(recorder, "describe", lambda: type(recorder).__name__)()
        self._snapshots: Any = None

    # -- info ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL, redacted (safe to log)."""
        return self._url

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the backend declares it supports."""
        return self.recorder.capabilities

    def __repr__(self) -> str:
        keyed = ", keyed" if self.chain_key is not None else ""
        return f"EventStore({self._url!r}{keyed})"

    # -- writes --------------------------------------------------------------------------

    def append(
        self, stream_id: str, events: Sequence[NewEvent], *, expected_version: ExpectedVersion = ANY
    ) -> AppendResult:
        """Append ``events`` to ``stream_id`` atomically: all of them or none.

        Args:
            stream_id: the stream (1-256 printable characters).
            events: one or more :class:`NewEvent`.
            expected_version: an int (the stream's current version; 0 = no stream),
                ``ae.ANY``, ``ae.NO_STREAM`` or ``ae.STREAM_EXISTS``.

        Returns:
            The stream's last version and the last global position written. When every
            event's ``event_id`` is already stored with the same content, nothing is
            written and the original result is returned (``duplicate=True``).

        Raises:
            InvalidEvent: bad input (names the field and the event's index).
            ConcurrencyError: the stream's version does not satisfy ``expected_version``,
                or an ``event_id`` is reused for a different event.
            StoreUnavailable: the backend cannot be reached; nothing was written.
        """
        validate_name(stream_id, "stream_id")
        expected = _normalize_expected(expected_version)
        if isinstance(events, NewEvent):
            events = [events]
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise InvalidEvent("events", "must be a sequence of ae.NewEvent", stream_id=stream_id)
        if not events:
            raise InvalidEvent("events", "at least one event is required", stream_id=stream_id)
        prepared = self._prepare(stream_id, events, utc_now_at())
        outcome = self.recorder.append(Batch(stream_id, prepared, self.chain_key), expected)
        recs = outcome.events
        if outcome.duplicate:
            return self._resolve_duplicate(stream_id, prepared, recs)
        if outcome.version is not None and outcome.position is not None:
            version, position = outcome.version, outcome.position
        else:
            version, position = recs[-1].version, recs[-1].position
        return AppendResult(
            stream_id,
            version,
            position,
            tuple(p.uid if p.uid is not None else uuid.UUID(p.event_id) for p in prepared),
        )

    def append_many(
        self,
        batches: Sequence[tuple[str, Sequence[NewEvent], ExpectedVersion]],
        *,
        tracking: TrackingRecord | tuple[str, int] | None = None,
    ) -> list[AppendResult]:
        """Append to several streams in one transaction: every batch or none.

        Each batch is ``(stream_id, events, expected_version)`` with the same rules as
        :meth:`append`. ``tracking`` (a :class:`TrackingRecord` or ``(name, position)``)
        is written in the same transaction; a name's tracked position only increases.
        The events of one call get consecutive global positions in batch order.

        The call is idempotent as a whole: when every event id is already stored, nothing
        is written and the original results come back (``duplicate=True``); a call that
        mixes stored and new ids is a :class:`ConcurrencyError`.

        Args:
            batches: one or more ``(stream_id, events, expected_version)``, each stream
                at most once. May be empty when ``tracking`` is given.
            tracking: optional consumer bookmark written atomically with the events.

        Returns:
            One :class:`AppendResult` per batch, in order.

        Raises:
            InvalidEvent: bad input (names the stream and the event's index).
            ConcurrencyError: an expected version is not satisfied, an event id is reused
                for a different event, or ``tracking`` is not above the tracked position.
            StoreError: the backend does not declare ``MULTI_STREAM_APPEND``.
            StoreUnavailable: the backend cannot be reached; nothing was written.
        """
        if tracking is not None and not isinstance(tracking, TrackingRecord):
            tracking = TrackingRecord(*tracking)
        if tracking is not None:
            validate_name(tracking.name, "tracking name")
            if type(tracking.position) is not int or not 0 <= tracking.position < 2**63:
                raise InvalidEvent(
                    "tracking position", f"must be an int >= 0, got {tracking.position!r}"
                )
        if not batches and tracking is None:
            raise InvalidEvent("batches", "at least one batch (or a tracking record) is required")
        if Capability.MULTI_STREAM_APPEND not in self.recorder.capabilities:
            if len(batches) == 1 and tracking is None:
                sid, evs, exp = batches[0]
                return [self.append(sid, evs, expected_version=exp)]
            raise StoreError(
                f"store {self._url} cannot append to several streams atomically "
                "(its backend does not declare MULTI_STREAM_APPEND)"
            )
        at = utc_now_at()
        seen_streams: set[str] = set()
        seen_ids: set[str] = set()
        prepared_all: list[list[Any]] = []
        work: list[tuple[Batch, ExpectedVersion]] = []
        for stream_id, given, expected_version in batches:
            validate_name(stream_id, "stream_id")
            if stream_id in seen_streams:
                raise InvalidEvent(
                    "batches", "a stream appears in more than one batch", stream_id=stream_id
                )
            seen_streams.add(stream_id)
            expected = _normalize_expected(expected_version)
            events = [given] if isinstance(given, NewEvent) else given
            if not isinstance(events, Sequence) or isinstance(events, str | bytes):
                raise InvalidEvent(
                    "events", "must be a sequence of ae.NewEvent", stream_id=stream_id
                )
            if not events:
                raise InvalidEvent("events", "at least one event is required", stream_id=stream_id)
            prepared = self._prepare(stream_id, events, at)
            for i, p in enumerate(prepared):
                if p.event_id in seen_ids:
                    raise InvalidEvent(
                        "event_id",
                        f"{p.event_id} appears in two batches",
                        stream_id=stream_id,
                        index=i,
                    )
                seen_ids.add(p.event_id)
            prepared_all.append(prepared)
            work.append((Batch(stream_id, prepared, self.chain_key), expected))
        outcomes = self.recorder.append_many(work, tracking)  # type: ignore[attr-defined]
        if any(o.duplicate for o in outcomes):
            if not all(o.duplicate for o in outcomes):
                dup = next(
                    b.stream_id for (b, _), o in zip(work, outcomes, strict=True) if o.duplicate
                )
                raise ConcurrencyError(
                    dup,
                    "a new batch",
                    self.stream_version(dup),
                    "some batches of this append_many are already stored and some are not; "
                    "a call is either entirely new or an exact re-append",
                )
            return [
                self._resolve_duplicate(b.stream_id, p, o.events)
                for (b, _), p, o in zip(work, prepared_all, outcomes, strict=True)
            ]
        results = []
        for (b, _), pb, o in zip(work, prepared_all, outcomes, strict=True):
            if o.version is not None and o.position is not None:
                version, position = o.version, o.position
            else:
                version, position = o.events[-1].version, o.events[-1].position
            results.append(
                AppendResult(
                    b.stream_id,
                    version,
                    position,
                    tuple(e.uid if e.uid is not None else uuid.UUID(e.event_id) for e in pb),
                )
            )
        return results

    def tracked_position(self, name: str) -> int | None:
        """The position last tracked for ``name`` by :meth:`append_many`, or None.

        Raises:
            StoreError: the backend does not declare ``MULTI_STREAM_APPEND``.
            StoreUnavailable: the backend cannot be reached.
        """
        validate_name(name, "tracking name")
        if Capability.MULTI_STREAM_APPEND not in self.recorder.capabilities:
            raise StoreError(f"store {self._url} keeps no tracking records")
        return self.recorder.tracked_position(name)  # type: ignore[attr-defined,no-any-return]

    def _prepare(self, stream_id: str, events: Sequence[NewEvent], at: str) -> list[Any]:
        """Validate and encode, spill big payloads, and refuse what cannot be stored inline.

        Raises:
            InvalidEvent: bad input, or a payload/metadata over the inline limits.
            StoreUnavailable: a blob could not be written (nothing is appended).
        """
        prepared = prepare(stream_id, events, at)
        for i, p in enumerate(prepared):
            if len(p.meta_json) > MAX_METADATA_BYTES:
                raise InvalidEvent(
                    "metadata",
                    f"is {len(p.meta_json):,} bytes; the limit is {MAX_METADATA_BYTES:,} "
                    "(metadata is hashed into every header: put big data in the payload)",
                    stream_id=stream_id,
                    index=i,
                )
        if self.blobs is not None:
            prepared = [self.blobs.spill(p, self.spill_threshold) for p in prepared]
        for i, p in enumerate(prepared):
            if p.payload_bytes is not None and p.size > self.max_inline_bytes:
                raise InvalidEvent(
                    "payload",
                    f"is {p.size:,} bytes; payloads stored inline are limited to "
                    f"{self.max_inline_bytes:,} bytes (open the store with a blob store, "
                    "blobs=..., to spill big payloads)",
                    stream_id=stream_id,
                    index=i,
                )
        return prepared

    def _resolve_duplicate(
        self, stream_id: str, prepared: list[Any], stored: list[RecordedEvent]
    ) -> AppendResult:
        by_id = {r.event_id_str: r for r in stored}
        if len(by_id) != len(prepared):
            raise ConcurrencyError(
                stream_id,
                "a new batch",
                self.stream_version(stream_id),
                f"{len(by_id)} of the {len(prepared)} event ids are already stored; a batch is "
                "either entirely new or an exact re-append",
            )
        for i, p in enumerate(prepared):
            r = by_id.get(p.event_id)
            if r is None or r.stream_id != stream_id:
                where = f"stream {r.stream_id!r}" if r is not None else "another batch"
                raise ConcurrencyError(
                    stream_id,
                    "a new event id",
                    self.stream_version(stream_id),
                    f"event #{i} id {p.event_id} is already used in {where}",
                )
            if not same_event(p, r):
                raise ConcurrencyError(
                    stream_id,
                    "an exact re-append",
                    self.stream_version(stream_id),
                    f"event #{i} id {p.event_id} is stored at version {r.version} with "
                    "different content",
                )
        versions = sorted(r.version for r in stored)
        if versions != list(range(versions[0], versions[0] + len(versions))):
            raise ConcurrencyError(
                stream_id,
                "an exact re-append",
                self.stream_version(stream_id),
                "the ids belong to different batches",
            )
        last = max(stored, key=lambda r: r.version)
        return AppendResult(
            stream_id,
            last.version,
            last.position,
            tuple(by_id[p.event_id].event_id for p in prepared),
            duplicate=True,
        )

    # -- reads ---------------------------------------------------------------------------

    def read(
        self,
        stream_id: str,
        from_version: int = 1,
        to_version: int | None = None,
        limit: int | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events of ``stream_id`` with ``from_version <= version <= to_version``, in
        version order, as a lazy iterator (constant memory on any stream length).

        Raises:
            InvalidEvent: a bad stream id or range.
            StoreUnavailable: the backend cannot be reached.
        """
        validate_name(stream_id, "stream_id")
        _check_range(from_version, to_version, limit)
        return self._attach(self.recorder.read(stream_id, from_version, to_version, limit))

    def read_all(
        self, after_position: int = 0, limit: int | None = None
    ) -> Iterator[RecordedEvent]:
        """Events of every stream in global position order, after ``after_position``.

        Raises:
            StoreUnavailable: the backend cannot be reached.
        """
        if type(after_position) is not int or after_position < 0:
            raise InvalidEvent("after_position", f"must be an int >= 0, got {after_position!r}")
        _check_range(1, None, limit)
        return self._attach(self.recorder.read_all(after_position, limit))

    def _attach(self, it: Iterator[RecordedEvent]) -> Iterator[RecordedEvent]:
        blobs = self.blobs
        if blobs is None:
            return it
        return (blobs.attach(e) if e.payload_ref is not None else e for e in it)

    def stream_version(self, stream_id: str) -> int:
        """The stream's version from its head row; 0 when the stream does not exist."""
        validate_name(stream_id, "stream_id")
        head = self.recorder.head(stream_id)
        return head.version if head else 0

    def head(self, stream_id: str) -> Head | None:
        """The stream's head (version and hash of the last event), or None."""
        validate_name(stream_id, "stream_id")
        return self.recorder.head(stream_id)

    def streams(self) -> Iterator[tuple[str, int]]:
        """Every stream with its version, ordered by stream id."""
        return ((sid, h.version) for sid, h in self.recorder.heads())

    def last_position(self) -> int:
        """The highest global position committed (0 for an empty store)."""
        return self.recorder.last_position()

    def wait_for(self, position: int, timeout: float) -> bool:
        """Block until an event after ``position`` is committed, or ``timeout`` seconds.

        Uses the backend's wake-ups where it has them, else polls gently.

        Returns:
            True when an event after ``position`` exists.
        """
        waiter = getattr(self.recorder, "wait_for", None)
        if waiter is not None:
            return bool(waiter(position, timeout))
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            if self.recorder.last_position() > position:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.25)

    @property
    def snapshots(self) -> Any:
        """The snapshot store in the same database as the events."""
        if self._snapshots is None:
            # Imported on first use: most programs never touch snapshots. The backend
            # provides the store (the core never imports a backend).
            from ares_events.core.snapshots import snapshot_store_for

            self._snapshots = snapshot_store_for(self)
        return self._snapshots

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Release the backend's connections. Idempotent."""
        self.recorder.close()
        if self.blobs is not None:
            self.blobs.close()

    def __enter__(self) -> EventStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _check_range(from_version: int, to_version: int | None, limit: int | None) -> None:
    if type(from_version) is not int or from_version < 1:
        raise InvalidEvent("from_version", f"must be an int >= 1, got {from_version!r}")
    if to_version is not None and (type(to_version) is not int or to_version < 0):
        raise InvalidEvent("to_version", f"must be an int >= 0 or None, got {to_version!r}")
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InvalidEvent("limit", f"must be an int >= 0 or None, got {limit!r}")


def emit(
    store: EventStore,
    stream_id: str,
    type: str,
    module: str,
    payload: Any = None,
    *,
    metadata: dict[str, Any] | None = None,
    expected_version: ExpectedVersion = ANY,
) -> AppendResult:
    """Append one event. ``module`` is required.

    Raises:
        InvalidEvent: bad input.
        ConcurrencyError: ``expected_version`` not satisfied.
        StoreUnavailable: the backend cannot be reached.
    """
    return store.append(
        stream_id,
        [
            NewEvent(
                type=type,
                module=module,
                payload={} if payload is None else payload,
                metadata=metadata or {},
            )
        ],
        expected_version=expected_version,
    )
