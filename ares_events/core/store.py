"""The core event store: validation, encoding, chaining and spill over a narrow backend.

:class:`EventStore` is what :func:`ares_events.open_store` returns. It validates and
encodes events once, hands the backend a :class:`~ares_events.core.recorder.Batch` that
seals the chain inside the backend's write transaction, and resolves idempotent
re-appends.

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
import uuid
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import (
    ANY,
    AppendResult,
    ErasedPayloadRef,
    ExpectedVersion,
    NewEvent,
    RecordedEvent,
    _normalize_expected,
    prepare,
    same_event,
    utc_now_at,
    validate_name,
)
from ares_events.core.identity import (
    DEFAULT_BLOBS,
    IDENTITY_KEY,
    BlobsIdentity,
    StoreIdentity,
    check_configured,
)
from ares_events.core.recorder import Batch, Capability, Head, Recorder, TrackingRecord
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    EventNotFound,
    InvalidEvent,
    StoreClosed,
    StoreError,
)
from ares_events.integrity.chain import ChainKey, genesis, link_hash

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
        self.recorder = recorder
        self.max_inline_bytes = max_inline_bytes
        self.chain_key = ChainKey.coerce(chain_key)
        self.blobs = blobs
        self.spill_threshold = spill_threshold
        self._url = url or getattr(recorder, "describe", lambda: type(recorder).__name__)()
        self._snapshots: Any = None
        self._closed = False
        self._blobs_identity: BlobsIdentity | str | None = None
        if blobs is not None:
            self._blobs_identity = (
                DEFAULT_BLOBS
                if default_blobs
                else BlobsIdentity(getattr(blobs, "location", blobs.url), blobs.url)
            )
        self._identity: StoreIdentity | None = identity
        self._identity_lock = threading.Lock()
        self._check_identity = check_identity
        # True until the identity is known to be recorded as this store writes.
        self._identity_pending = callable(getattr(recorder, "meta_get", None))
        if check_identity and self._identity_pending:
            self._load_identity(identity)

    # -- info ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL, redacted (safe to log)."""
        return self._url

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the backend declares it supports."""
        return self.recorder.capabilities

    @property
    def identity(self) -> StoreIdentity | None:
        """What the store recorded about itself (chain mode and key id, blob location,
        format), or None before its first write or on a backend that keeps none."""
        return self._identity

    def _load_identity(self, known: StoreIdentity | None) -> None:
        if known is None:
            raw = self.recorder.meta_get(IDENTITY_KEY)  # type: ignore[attr-defined]
            if raw is None:
                return
            known = StoreIdentity.from_json(raw, self._url)
        ident = self._identity = known
        check_configured(ident, self.chain_key, self._blobs_identity, self._url)
        self._identity_pending = ident.blobs is None and self._blobs_identity is not None

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
        if not callable(getattr(self.recorder, "meta_get", None)):
            return None
        rec: Any = self.recorder
        with self._identity_lock:
            if relocate_blobs:
                raw = rec.meta_get(IDENTITY_KEY)
                if raw is not None:
                    current = StoreIdentity.from_json(raw, self._url)
                    problem = current.chain_problem(self.chain_key)
                    if problem is not None:
                        raise ConfigError(f"store {self._url}: {problem}")
                    moved = StoreIdentity(
                        current.format, current.keys, self._blobs_identity, current.created_at
                    )
                    rec.meta_set(IDENTITY_KEY, moved.to_json())
                    self._identity, self._identity_pending = moved, False
                    self._check_identity = True  # configured exactly as recorded now
                    logger.info("store %s: blob location recorded anew", self._url)
                    return moved
                self._check_identity = True
                self._identity_pending = True
            if self._identity_pending:
                self._record_identity()
        return self._identity

    def _ensure_identity(self) -> None:
        """Before the first write of this store object: record (or complete) the identity."""
        if not self._check_identity:
            raise ConfigError(
                f"store {self._url} was opened with check_identity=False (for reading under "
                "another configuration); it does not write"
            )
        with self._identity_lock:
            if self._identity_pending:
                self._record_identity()

    def _record_identity(self) -> None:
        rec: Any = self.recorder
        current = self._identity
        if current is None:
            raw = rec.meta_get(IDENTITY_KEY)  # another writer may have recorded it since
            if raw is None:
                if rec.last_position() > 0:
                    self._check_unrecorded_chain()
                mine = StoreIdentity.new(self.chain_key, self._blobs_identity, from_position=1)
                raw = rec.meta_put_if_absent(IDENTITY_KEY, mine.to_json())
            stored = StoreIdentity.from_json(raw, self._url)
            check_configured(stored, self.chain_key, self._blobs_identity, self._url)
            current = stored
        if current.blobs is None and self._blobs_identity is not None:
            current = StoreIdentity(
                current.format, current.keys, self._blobs_identity, current.created_at
            )
            rec.meta_set(IDENTITY_KEY, current.to_json())
        self._identity = current
        self._identity_pending = False
        logger.info("store %s: identity %s", self._url, current.describe_chain())

    def _check_unrecorded_chain(self) -> None:
        """A store written before identities existed: its first stream's first event must
        verify under the configured chain key before an identity says it does.

        Raises:
            ConfigError: it does not (another key, no key, or an altered event).
        """
        for sid, _ in self.recorder.heads():
            first = next(iter(self.recorder.read(sid, 1, 1, 1)), None)
            if first is None:
                return
            try:
                ok = link_hash(genesis(sid), first.header(), self.chain_key) == first.hash
            except (TypeError, ValueError, AttributeError):
                ok = False
            if not ok:
                mode = (
                    f"chain key id {self.chain_key.fingerprint()}"
                    if self.chain_key is not None
                    else "no chain key"
                )
                raise ConfigError(
                    f"store {self._url} has no recorded identity and its first event (stream "
                    f"{sid!r}) does not verify with {mode}: it was written with another "
                    "chain configuration, or the event was altered (run `ares-events audit`)"
                )
            return

    def _check_open(self, action: str | None = None) -> None:
        if self._closed:
            raise StoreClosed(self._url, action)

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
        if self._closed:
            raise StoreClosed(self._url, f"append to stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        expected = _normalize_expected(expected_version)
        if isinstance(events, NewEvent):
            events = [events]
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise InvalidEvent("events", "must be a sequence of ae.NewEvent", stream_id=stream_id)
        if not events:
            raise InvalidEvent("events", "at least one event is required", stream_id=stream_id)
        if self._identity_pending or not self._check_identity:
            self._ensure_identity()
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
        self._check_open("append_many")
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
        if self._identity_pending or not self._check_identity:
            self._ensure_identity()
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
        self._check_open(f"erase of stream {stream_id!r} version {version}")
        validate_name(stream_id, "stream_id")
        if Capability.ERASE not in self.recorder.capabilities:
            raise StoreError(f"store {self._url} cannot erase payloads (no ERASE capability)")
        if type(version) is not int or version < 1:
            raise EventNotFound(stream_id, version, "versions start at 1")
        if self._identity_pending or not self._check_identity:
            self._ensure_identity()
        event = next(
            (e for e in self.recorder.read(stream_id, version, version, 1) if e.version == version),
            None,
        )
        if event is None:
            raise EventNotFound(stream_id, version)
        ref = event.payload_ref
        if ref is not None and ref.erased:
            return event, None
        erased = ErasedPayloadRef(key="", size=event.payload_size, digest=event.payload_digest)
        blob_key = ref.key if ref is not None and ref.key else None
        started = datetime.now(UTC)
        outcome = self.recorder.erase(  # type: ignore[attr-defined]
            stream_id, version, event.position, event.hash, erased, blob_key
        )
        if not outcome.erased:
            raise StoreError(
                f"stream {stream_id!r} version {version} changed while it was being erased "
                "(erased by someone else, or rewritten): read it again"
            )
        if blob_key is not None and outcome.blob_refs == 0 and self.blobs is not None:
            # A blob an append (of the same payload) refreshed after we started is kept.
            self.blobs.delete(blob_key, if_older_than=started)
        logger.info("erased the payload of stream %r version %d", stream_id, version)
        return event, (outcome.blob_refs if blob_key is not None else None)

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
        if self._closed:
            raise StoreClosed(self._url, f"read of stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        _check_range(from_version, to_version, limit)
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
        if type(after_position) is not int or after_position < 0:
            raise InvalidEvent("after_position", f"must be an int >= 0, got {after_position!r}")
        _check_range(1, None, limit)
        if stream_prefix is not None and type(stream_prefix) is not str:
            raise InvalidEvent(
                "stream_prefix", f"must be a str or None, got {type(stream_prefix).__name__}"
            )
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

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

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
