"""The core event store: validation, encoding, chaining and spill over a narrow backend.

:class:`EventStore` is what :func:`ares_events.open_store` returns. It validates and
encodes events once, hands the backend a :class:`~ares_events.core.recorder.Batch` that
seals the chain inside the backend's write transaction, and resolves idempotent
re-appends. The decisions are shared with the asyncio face
(:class:`~ares_events.core.store_async.AsyncEventStore`) through
:class:`~ares_events.core.store_core.StoreCore`; this class adds the blocking I/O.

It also holds the store's identity (:mod:`ares_events.core.identity`): checked when the
store is opened, recorded at the first write, so a process configured with another chain
key (or none) or another blob location is refused before it writes anything. And it is
the first line of a safe close: after :meth:`EventStore.close` every call raises
:class:`~ares_events.errors.StoreClosed` (the backend's operation gate handles calls that
were already running in other threads).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ares_events.core.events import (
    ANY,
    AppendResult,
    ExpectedVersion,
    NewEvent,
    PreparedEvent,
    RecordedEvent,
    _normalize_expected,
    utc_now_at,
    validate_name,
)
from ares_events.core.identity import StoreIdentity
from ares_events.core.recorder import Batch, Capability, Head, Recorder, TrackingRecord
from ares_events.core.sansio import run
from ares_events.core.store_core import (
    DEFAULT_MAX_INLINE_BYTES,
    MAX_METADATA_BYTES,
    Conflict,
    StoreCore,
    check_after,
    check_range,
)
from ares_events.errors import ConcurrencyError, InvalidEvent, StoreClosed, StoreError
from ares_events.integrity.chain import ChainKey

if TYPE_CHECKING:
    from ares_events.stores.blobs.base import BlobStore

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_MAX_INLINE_BYTES", "MAX_METADATA_BYTES", "EventStore", "emit"]


class _RecorderPort:
    """The blocking recorder (and blob store) as the port of the identity and erasure
    steps of :class:`StoreCore`."""

    __slots__ = ("_blobs", "_rec")

    def __init__(self, recorder: Any, blobs: BlobStore | None = None) -> None:
        self._rec = recorder
        self._blobs = blobs

    def read_one(self, stream_id: str, version: int) -> RecordedEvent | None:
        return next(iter(self._rec.read(stream_id, version, version, 1)), None)

    def erase(self, *args: Any) -> Any:
        return self._rec.erase(*args)

    def delete_blob(self, key: str, if_older_than: datetime) -> None:
        assert self._blobs is not None
        self._blobs.delete(key, if_older_than=if_older_than)

    def meta_get(self, key: str) -> str | None:
        return self._rec.meta_get(key)  # type: ignore[no-any-return]

    def meta_put_if_absent(self, key: str, value: str) -> str:
        return self._rec.meta_put_if_absent(key, value)  # type: ignore[no-any-return]

    def meta_set(self, key: str, value: str) -> None:
        self._rec.meta_set(key, value)

    def last_position(self) -> int:
        return int(self._rec.last_position())

    def first_event(self) -> tuple[str, RecordedEvent | None] | None:
        for sid, _ in self._rec.heads():
            return sid, next(iter(self._rec.read(sid, 1, 1, 1)), None)
        return None


class EventStore(StoreCore):
    """A hash-chained, append-only event store over one backend.

    Use as a context manager or call :meth:`close`.

    Args:
        recorder: the backend.
        chain_key: key of the chain's keyed mode (a ChainKey, 32 bytes or 64 hex digits;
            None: unkeyed).
        blobs: blob store for spilled payloads (None: nothing spills).
        spill_threshold: payloads larger than this many bytes go to ``blobs``.
        url: the store's redacted URL (for messages).
        max_inline_bytes: the largest payload stored inline.
        default_blobs: ``blobs`` is the backend's default folder (recorded as such, so
            the store can be moved with its folder).
        check_identity: check the configuration against the identity the store
            recorded (default). False is for forensic tools that deliberately read a store
            under another configuration; such a store object refuses to write.
        identity: the identity already read by the caller (saves one read).

    Raises:
        ConfigError: the store records another chain mode, chain key or blob location
            (names what differs; nothing is written).
        StoreUnavailable: the backend cannot be reached.
    """

    def __init__(
        self,
        recorder: Recorder,
        *,
        chain_key: ChainKey | bytes | str | None = None,
        blobs: BlobStore | None = None,
        spill_threshold: int = 256 * 1024,
        url: str | None = None,
        max_inline_bytes: int = DEFAULT_MAX_INLINE_BYTES,
        default_blobs: bool = False,
        check_identity: bool = True,
        identity: StoreIdentity | None = None,
    ) -> None:
        super().__init__(
            recorder,
            chain_key=chain_key,
            blobs=blobs,
            spill_threshold=spill_threshold,
            url=url,
            max_inline_bytes=max_inline_bytes,
            default_blobs=default_blobs,
            check_identity=check_identity,
            identity=identity,
        )
        self.recorder: Recorder = recorder
        self._identity_lock = threading.Lock()
        if check_identity and self._keeps_identity:
            run(self._load_identity_steps(identity), _RecorderPort(recorder))

    def __repr__(self) -> str:
        return self._repr("EventStore")

    def record_identity(self, *, relocate_blobs: bool = False) -> StoreIdentity | None:
        """Record the store's identity now (``ares-events init`` does; the first write
        does it otherwise). Returns what is recorded (None when the backend keeps none).

        Args:
            relocate_blobs: replace the recorded blob location with this store's (after
                the blobs were moved; open the store with ``check_identity=False``, since
                its blob location differs from the recorded one). The chain part never
                changes: it must match the configured key.

        Raises:
            ConfigError: the store records another configuration, or a store written
                before identities existed does not verify under the configured chain key.
            StoreClosed: the store is closed.
        """
        self._check_open("recording the store identity")
        if not self._keeps_identity:
            return None
        with self._identity_lock:
            return run(
                self._record_identity_request_steps(relocate_blobs), _RecorderPort(self.recorder)
            )

    def _ensure_identity(self) -> None:
        """Before the first write of this store object: record (or complete) the identity."""
        self._refuse_unchecked_writes()
        with self._identity_lock:
            if self._identity_pending:
                run(self._record_identity_steps(), _RecorderPort(self.recorder))

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
        if self._closed:
            raise StoreClosed(self._url, f"append to stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        expected = _normalize_expected(expected_version)
        events = self._events_arg(stream_id, events)
        if self._identity_pending or not self._check_identity:
            self._ensure_identity()
        prepared = self._prepare(stream_id, events, utc_now_at())
        outcome = self.recorder.append(Batch(stream_id, prepared, self.chain_key), expected)
        if outcome.duplicate:
            return self._resolve_duplicate(stream_id, prepared, outcome.events)
        return self._result(stream_id, prepared, outcome)

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
        self._check_open("append_many")
        track = self._tracking_arg(tracking)
        if not batches and track is None:
            raise InvalidEvent("batches", "at least one batch (or a tracking record) is required")
        if Capability.MULTI_STREAM_APPEND not in self.recorder.capabilities:
            if len(batches) == 1 and track is None:
                sid, evs, exp = batches[0]
                return [self.append(sid, evs, expected_version=exp)]
            raise StoreError(
                f"store {self._url} cannot append to several streams atomically "
                "(its backend does not declare MULTI_STREAM_APPEND)"
            )
        if self._identity_pending or not self._check_identity:
            self._ensure_identity()
        plan = self._plan_many(batches, utc_now_at())
        for b in plan:
            b.prepared = self._spill(b.prepared)
        for b in plan:
            self._check_inline(b.stream_id, b.prepared)
        work = [(Batch(b.stream_id, b.prepared, self.chain_key), b.expected) for b in plan]
        outcomes = self.recorder.append_many(work, track)  # type: ignore[attr-defined]
        res = self._many_results(plan, outcomes)
        if isinstance(res, Conflict):
            raise self._conflict(res)
        return res

    def erase_payload(self, stream_id: str, version: int) -> tuple[RecordedEvent, int | None]:
        """Remove one event's payload from the backend, keeping its digest and size (the
        chain commits to them, so every link hash, Merkle leaf and checkpoint stays valid),
        and delete its blob when no other event's payload lives in it.

        This is the storage half of an erasure; :func:`ares_events.erase` is the whole of
        it (the erasure record, snapshots, read models). Idempotent: an erased event is
        returned as it is.

        Returns:
            The event as it was before (its payload still readable in this object only
            when it was inline), and the number of other events sharing its blob (None
            when it had no blob or was already erased).

        Raises:
            EventNotFound: no event at ``stream_id`` ``version``.
            StoreError: the backend does not declare ``ERASE``, or the row changed while
                it was erased (retry).
            StoreUnavailable: the backend or the blob store cannot be reached.
        """
        self._check_erase(stream_id, version)
        if self._identity_pending or not self._check_identity:
            self._ensure_identity()
        return run(self._erase_steps(stream_id, version), _RecorderPort(self.recorder, self.blobs))

    def tracked_position(self, name: str) -> int | None:
        """The position last tracked for ``name`` by :meth:`append_many`, or None.

        Raises:
            StoreError: the backend does not declare ``MULTI_STREAM_APPEND``.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        validate_name(name, "tracking name")
        if Capability.MULTI_STREAM_APPEND not in self.recorder.capabilities:
            raise StoreError(f"store {self._url} keeps no tracking records")
        return self.recorder.tracked_position(name)  # type: ignore[attr-defined,no-any-return]

    def _spill(self, prepared: list[PreparedEvent]) -> list[PreparedEvent]:
        """Write payloads over the threshold to the blob store (before the append commits).

        Raises:
            StoreUnavailable: a blob could not be written (nothing is appended).
        """
        blobs = self.blobs
        if blobs is None:
            return prepared
        return [blobs.spill(p, self.spill_threshold) for p in prepared]

    def _prepare(self, stream_id: str, events: Sequence[NewEvent], at: str) -> list[Any]:
        """Validate and encode, spill big payloads, and refuse what cannot be stored inline.

        Raises:
            InvalidEvent: bad input, or a payload/metadata over the inline limits.
            StoreUnavailable: a blob could not be written (nothing is appended).
        """
        prepared = self._spill(self._encode(stream_id, events, at))
        self._check_inline(stream_id, prepared)
        return prepared

    def _conflict(self, c: Conflict) -> ConcurrencyError:
        return ConcurrencyError(c.stream_id, c.expected, self.stream_version(c.stream_id), c.detail)

    def _resolve_duplicate(
        self, stream_id: str, prepared: list[Any], stored: list[RecordedEvent]
    ) -> AppendResult:
        res = self._duplicate(stream_id, prepared, stored)
        if isinstance(res, Conflict):
            raise self._conflict(res)
        return res

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
        if self._closed:
            raise StoreClosed(self._url, f"read of stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        check_range(from_version, to_version, limit)
        return self._attach(self.recorder.read(stream_id, from_version, to_version, limit))

    def read_all(
        self,
        after_position: int = 0,
        limit: int | None = None,
        *,
        stream_prefix: str | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events of every stream in global position order, after ``after_position``.

        Args:
            after_position: read the events after this position (exclusive).
            limit: at most this many events (None: all).
            stream_prefix: only the events of streams whose id starts with this (exactly:
                no character is a wildcard; ``limit`` counts these events only). The
                backend filters, so other streams' events are never transferred. None or
                ``""``: every stream.

        Raises:
            InvalidEvent: a bad position, limit or prefix.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open("read_all")
        check_after(after_position, limit, stream_prefix)
        if stream_prefix:
            # Passed only when asked for: recorders written before the keyword still work.
            it = self.recorder.read_all(after_position, limit, stream_prefix=stream_prefix)
            return self._attach(it)
        return self._attach(self.recorder.read_all(after_position, limit))

    def _attach(self, it: Iterator[RecordedEvent]) -> Iterator[RecordedEvent]:
        blobs = self.blobs
        if blobs is None:
            return it
        return (blobs.attach(e) if e.payload_ref is not None else e for e in it)

    def stream_version(self, stream_id: str) -> int:
        """The stream's version from its head row; 0 when the stream does not exist."""
        self._check_open()
        validate_name(stream_id, "stream_id")
        head = self.recorder.head(stream_id)
        return head.version if head else 0

    def head(self, stream_id: str) -> Head | None:
        """The stream's head (version and hash of the last event), or None."""
        self._check_open()
        validate_name(stream_id, "stream_id")
        return self.recorder.head(stream_id)

    def streams(self) -> Iterator[tuple[str, int]]:
        """Every stream with its version, ordered by stream id."""
        self._check_open()
        return ((sid, h.version) for sid, h in self.recorder.heads())

    def last_position(self) -> int:
        """The highest global position committed (0 for an empty store)."""
        self._check_open()
        return self.recorder.last_position()

    def wait_for(self, position: int, timeout: float) -> bool:
        """Block until an event after ``position`` is committed, or ``timeout`` seconds.

        Uses the backend's wake-ups where it has them, else polls gently.

        Returns:
            True when an event after ``position`` exists.

        Raises:
            StoreClosed: the store is closed (also while waiting).
        """
        self._check_open()
        waiter = getattr(self.recorder, "wait_for", None)
        if waiter is not None:
            return bool(waiter(position, timeout))
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            self._check_open()
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
        self._check_open()
        if self._snapshots is None:
            # Imported on first use: most programs never touch snapshots. The backend
            # provides the store (the core never imports a backend).
            from ares_events.core.snapshots import snapshot_store_for

            self._snapshots = snapshot_store_for(self)
        return self._snapshots

    # -- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        """Release the backend's connections. Idempotent and safe from any thread.

        From now on every call raises :class:`StoreClosed`. Calls already running in
        other threads finish first, or are interrupted after a short grace and raise
        :class:`StoreClosed`; no connection outlives this call.
        """
        self._closed = True
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
