"""What the blocking and the asyncio event store share: ONE core for both faces.

:class:`StoreCore` is the base of :class:`~ares_events.core.store.EventStore` and
:class:`~ares_events.core.store_async.AsyncEventStore`. Everything that decides lives
here, once: argument checks, validation and canonical encoding of events
(:func:`~ares_events.core.events.prepare`), the metadata and inline-payload limits, the
plan of a multi-stream append, how a backend's outcome becomes an
:class:`~ares_events.core.events.AppendResult`, the resolution of an idempotent
re-append (or the conflict it is), and the store identity (checked on open, recorded at
the first write). Sealing (versions and link hashes) is
:meth:`~ares_events.core.recorder.Batch.seal`, run by the backend inside its write
transaction. The two faces differ only in how they wait for I/O: the identity logic is
written as :mod:`~ares_events.core.sansio` steps both drive, and everything else here is
pure.

It may import the core's other modules, :mod:`ares_events.errors` and the chain format.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import (
    AppendResult,
    ErasedPayloadRef,
    ExpectedVersion,
    NewEvent,
    PreparedEvent,
    RecordedEvent,
    _normalize_expected,
    prepare,
    same_event,
    validate_name,
)
from ares_events.core.identity import (
    DEFAULT_BLOBS,
    IDENTITY_KEY,
    BlobsIdentity,
    StoreIdentity,
    check_configured,
)
from ares_events.core.recorder import AppendOutcome, Capability, TrackingRecord
from ares_events.core.sansio import Call, Steps
from ares_events.errors import ConfigError, EventNotFound, InvalidEvent, StoreClosed, StoreError
from ares_events.integrity.chain import ChainKey, genesis, link_hash

if TYPE_CHECKING:
    from ares_events.stores.blobs.base import BlobStore

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_INLINE_BYTES",
    "MAX_METADATA_BYTES",
    "Conflict",
    "PlannedBatch",
    "StoreCore",
    "check_after",
    "check_range",
]

DEFAULT_MAX_INLINE_BYTES: Final = 64 * 1024 * 1024
"""A payload stored inline (not spilled to a blob store) may be at most this big."""
MAX_METADATA_BYTES: Final = 1024 * 1024
"""Canonical metadata is hashed into every header; it may be at most this big."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """A re-append that is not an exact one: the face raises ``ConcurrencyError`` with the
    stream's current version (which it reads: I/O)."""

    stream_id: str
    expected: str
    detail: str


@dataclass(slots=True)
class PlannedBatch:
    """One batch of an ``append_many``, validated and encoded (spill not yet applied)."""

    stream_id: str
    prepared: list[PreparedEvent]
    expected: ExpectedVersion


class StoreCore:
    """Configuration, identity and the pure decisions of an event store (see the module
    docstring). Not used directly: open a store with ``ae.open_store`` or
    ``ae.open_async_store``.

    Args:
        recorder: the backend (a blocking ``Recorder`` or an asyncio ``AsyncRecorder``).
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
    """

    def __init__(
        self,
        recorder: Any,
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
        self._check_identity = check_identity
        self._keeps_identity = callable(getattr(recorder, "meta_get", None))
        # True until the identity is known to be recorded as this store writes.
        self._identity_pending = self._keeps_identity

    # -- info ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL, redacted (safe to log)."""
        return self._url

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the backend declares it supports."""
        caps: frozenset[Capability] = self.recorder.capabilities
        return caps

    @property
    def identity(self) -> StoreIdentity | None:
        """What the store recorded about itself (chain mode and key id, blob location,
        format), or None before its first write or on a backend that keeps none."""
        return self._identity

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def _check_open(self, action: str | None = None) -> None:
        if self._closed:
            raise StoreClosed(self._url, action)

    def _repr(self, name: str) -> str:
        keyed = ", keyed" if self.chain_key is not None else ""
        return f"{name}({self._url!r}{keyed})"

    # -- identity (steps: the faces drive them with their recorder port) -----------------

    def _load_identity_steps(self, known: StoreIdentity | None) -> Steps[None]:
        """Read (unless ``known``) and check the recorded identity.

        Raises:
            ConfigError: the store records another chain mode, key or blob location.
        """
        if known is None:
            raw = yield Call("meta_get", IDENTITY_KEY)
            if raw is None:
                return
            known = StoreIdentity.from_json(raw, self._url)
        self._identity = known
        check_configured(known, self.chain_key, self._blobs_identity, self._url)
        self._identity_pending = known.blobs is None and self._blobs_identity is not None

    def _record_identity_request_steps(self, relocate_blobs: bool) -> Steps[StoreIdentity | None]:
        """``record_identity()``: see :meth:`EventStore.record_identity`."""
        if relocate_blobs:
            raw = yield Call("meta_get", IDENTITY_KEY)
            if raw is not None:
                current = StoreIdentity.from_json(raw, self._url)
                problem = current.chain_problem(self.chain_key)
                if problem is not None:
                    raise ConfigError(f"store {self._url}: {problem}")
                moved = StoreIdentity(
                    current.format, current.keys, self._blobs_identity, current.created_at
                )
                yield Call("meta_set", IDENTITY_KEY, moved.to_json())
                self._identity, self._identity_pending = moved, False
                self._check_identity = True  # configured exactly as recorded now
                logger.info("store %s: blob location recorded anew", self._url)
                return moved
            self._check_identity = True
            self._identity_pending = True
        if self._identity_pending:
            yield from self._record_identity_steps()
        return self._identity

    def _refuse_unchecked_writes(self) -> None:
        """A store opened with ``check_identity=False`` never writes.

        Raises:
            ConfigError: it was opened so.
        """
        if not self._check_identity:
            raise ConfigError(
                f"store {self._url} was opened with check_identity=False (for reading under "
                "another configuration); it does not write"
            )

    def _record_identity_steps(self) -> Steps[None]:
        current = self._identity
        if current is None:
            raw = yield Call("meta_get", IDENTITY_KEY)  # another writer may have recorded it
            if raw is None:
                if (yield Call("last_position")) > 0:
                    yield from self._check_unrecorded_chain_steps()
                mine = StoreIdentity.new(self.chain_key, self._blobs_identity, from_position=1)
                raw = yield Call("meta_put_if_absent", IDENTITY_KEY, mine.to_json())
            stored = StoreIdentity.from_json(raw, self._url)
            check_configured(stored, self.chain_key, self._blobs_identity, self._url)
            current = stored
        if current.blobs is None and self._blobs_identity is not None:
            current = StoreIdentity(
                current.format, current.keys, self._blobs_identity, current.created_at
            )
            yield Call("meta_set", IDENTITY_KEY, current.to_json())
        self._identity = current
        self._identity_pending = False
        logger.info("store %s: identity %s", self._url, current.describe_chain())

    def _check_unrecorded_chain_steps(self) -> Steps[None]:
        """A store written before identities existed: its first stream's first event must
        verify under the configured chain key before an identity says it does.

        Raises:
            ConfigError: it does not (another key, no key, or an altered event).
        """
        found = yield Call("first_event")
        if found is None:
            return
        sid, first = found
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

    # -- erasure (steps: port calls read_one, erase, delete_blob) ------------------------

    def _check_erase(self, stream_id: str, version: int) -> None:
        """The checks of ``erase_payload`` before any I/O.

        Raises:
            StoreClosed: the store is closed.
            InvalidEvent: a bad stream id.
            StoreError: the backend does not declare ``ERASE``.
            EventNotFound: ``version`` is not a version.
        """
        self._check_open(f"erase of stream {stream_id!r} version {version}")
        validate_name(stream_id, "stream_id")
        if Capability.ERASE not in self.recorder.capabilities:
            raise StoreError(f"store {self._url} cannot erase payloads (no ERASE capability)")
        if type(version) is not int or version < 1:
            raise EventNotFound(stream_id, version, "versions start at 1")

    def _erase_steps(self, stream_id: str, version: int) -> Steps[tuple[RecordedEvent, int | None]]:
        """See :meth:`EventStore.erase_payload`."""
        found = yield Call("read_one", stream_id, version)
        event = found if found is not None and found.version == version else None
        if event is None:
            raise EventNotFound(stream_id, version)
        ref = event.payload_ref
        if ref is not None and ref.erased:
            return event, None
        erased = ErasedPayloadRef(key="", size=event.payload_size, digest=event.payload_digest)
        blob_key = ref.key if ref is not None and ref.key else None
        started = datetime.now(UTC)
        outcome = yield Call(
            "erase", stream_id, version, event.position, event.hash, erased, blob_key
        )
        if not outcome.erased:
            raise StoreError(
                f"stream {stream_id!r} version {version} changed while it was being erased "
                "(erased by someone else, or rewritten): read it again"
            )
        if blob_key is not None and outcome.blob_refs == 0 and self.blobs is not None:
            # A blob an append (of the same payload) refreshed after we started is kept.
            yield Call("delete_blob", blob_key, started)
        logger.info("erased the payload of stream %r version %d", stream_id, version)
        return event, (outcome.blob_refs if blob_key is not None else None)

    # -- appends: the pure parts ---------------------------------------------------------

    @staticmethod
    def _events_arg(stream_id: str, events: Any) -> Sequence[NewEvent]:
        """``events`` as a non-empty sequence of NewEvent (a single event is accepted).

        Raises:
            InvalidEvent: not a sequence, or empty.
        """
        if isinstance(events, NewEvent):
            return [events]
        if not isinstance(events, Sequence) or isinstance(events, str | bytes):
            raise InvalidEvent("events", "must be a sequence of ae.NewEvent", stream_id=stream_id)
        if not events:
            raise InvalidEvent("events", "at least one event is required", stream_id=stream_id)
        return events

    def _encode(self, stream_id: str, events: Sequence[NewEvent], at: str) -> list[PreparedEvent]:
        """Validate and encode (no I/O), refusing metadata over its limit.

        Raises:
            InvalidEvent: bad input, or metadata over :data:`MAX_METADATA_BYTES`.
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
        return prepared

    def _may_spill(self, prepared: Sequence[PreparedEvent]) -> bool:
        """True when a blob store is configured and some payload is over the threshold
        (the blob store decides; this only spares a call when nothing can spill)."""
        if self.blobs is None:
            return False
        limit = self.spill_threshold
        return any(p.size > limit for p in prepared)

    def _check_inline(self, stream_id: str, prepared: Sequence[PreparedEvent]) -> None:
        """After spilling: refuse a payload still inline and over ``max_inline_bytes``.

        Raises:
            InvalidEvent: such a payload (names the event's index).
        """
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

    @staticmethod
    def _result(
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
            tuple(p.uid if p.uid is not None else uuid.UUID(p.event_id) for p in prepared),
        )

    @staticmethod
    def _duplicate(
        stream_id: str, prepared: Sequence[PreparedEvent], stored: list[RecordedEvent]
    ) -> AppendResult | Conflict:
        """The original result of an exact re-append, or the conflict it is instead."""
        by_id = {r.event_id_str: r for r in stored}
        if len(by_id) != len(prepared):
            return Conflict(
                stream_id,
                "a new batch",
                f"{len(by_id)} of the {len(prepared)} event ids are already stored; a batch is "
                "either entirely new or an exact re-append",
            )
        for i, p in enumerate(prepared):
            r = by_id.get(p.event_id)
            if r is None or r.stream_id != stream_id:
                where = f"stream {r.stream_id!r}" if r is not None else "another batch"
                return Conflict(
                    stream_id,
                    "a new event id",
                    f"event #{i} id {p.event_id} is already used in {where}",
                )
            if not same_event(p, r):
                return Conflict(
                    stream_id,
                    "an exact re-append",
                    f"event #{i} id {p.event_id} is stored at version {r.version} with "
                    "different content",
                )
        versions = sorted(r.version for r in stored)
        if versions != list(range(versions[0], versions[0] + len(versions))):
            return Conflict(stream_id, "an exact re-append", "the ids belong to different batches")
        last = max(stored, key=lambda r: r.version)
        return AppendResult(
            stream_id,
            last.version,
            last.position,
            tuple(by_id[p.event_id].event_id for p in prepared),
            duplicate=True,
        )

    @staticmethod
    def _tracking_arg(tracking: TrackingRecord | tuple[str, int] | None) -> TrackingRecord | None:
        """``tracking`` as a checked :class:`TrackingRecord` (or None).

        Raises:
            InvalidEvent: a bad name or position.
        """
        if tracking is None:
            return None
        if not isinstance(tracking, TrackingRecord):
            tracking = TrackingRecord(*tracking)
        validate_name(tracking.name, "tracking name")
        if type(tracking.position) is not int or not 0 <= tracking.position < 2**63:
            raise InvalidEvent(
                "tracking position", f"must be an int >= 0, got {tracking.position!r}"
            )
        return tracking

    def _plan_many(
        self, batches: Sequence[tuple[str, Sequence[NewEvent], ExpectedVersion]], at: str
    ) -> list[PlannedBatch]:
        """Validate and encode every batch of an ``append_many`` (no I/O): each stream at
        most once, no event id in two batches.

        Raises:
            InvalidEvent: bad input (names the stream and the event's index).
        """
        seen_streams: set[str] = set()
        seen_ids: set[str] = set()
        plan: list[PlannedBatch] = []
        for stream_id, given, expected_version in batches:
            validate_name(stream_id, "stream_id")
            if stream_id in seen_streams:
                raise InvalidEvent(
                    "batches", "a stream appears in more than one batch", stream_id=stream_id
                )
            seen_streams.add(stream_id)
            expected = _normalize_expected(expected_version)
            events = self._events_arg(stream_id, given)
            prepared = self._encode(stream_id, events, at)
            for i, p in enumerate(prepared):
                if p.event_id in seen_ids:
                    raise InvalidEvent(
                        "event_id",
                        f"{p.event_id} appears in two batches",
                        stream_id=stream_id,
                        index=i,
                    )
                seen_ids.add(p.event_id)
            plan.append(PlannedBatch(stream_id, prepared, expected))
        return plan

    def _many_results(
        self, plan: Sequence[PlannedBatch], outcomes: Sequence[AppendOutcome]
    ) -> list[AppendResult] | Conflict:
        """The results of an ``append_many``, or the conflict a partial re-append is."""
        if any(o.duplicate for o in outcomes):
            if not all(o.duplicate for o in outcomes):
                dup = next(b.stream_id for b, o in zip(plan, outcomes, strict=True) if o.duplicate)
                return Conflict(
                    dup,
                    "a new batch",
                    "some batches of this append_many are already stored and some are not; "
                    "a call is either entirely new or an exact re-append",
                )
            out: list[AppendResult] = []
            for b, o in zip(plan, outcomes, strict=True):
                res = self._duplicate(b.stream_id, b.prepared, o.events)
                if isinstance(res, Conflict):
                    return res
                out.append(res)
            return out
        return [
            self._result(b.stream_id, b.prepared, o) for b, o in zip(plan, outcomes, strict=True)
        ]


def check_range(from_version: int, to_version: int | None, limit: int | None) -> None:
    """Check the arguments of a stream read.

    Raises:
        InvalidEvent: a bad bound or limit.
    """
    if type(from_version) is not int or from_version < 1:
        raise InvalidEvent("from_version", f"must be an int >= 1, got {from_version!r}")
    if to_version is not None and (type(to_version) is not int or to_version < 0):
        raise InvalidEvent("to_version", f"must be an int >= 0 or None, got {to_version!r}")
    if limit is not None and (type(limit) is not int or limit < 0):
        raise InvalidEvent("limit", f"must be an int >= 0 or None, got {limit!r}")


def check_after(after_position: int, limit: int | None, stream_prefix: str | None = None) -> None:
    """Check the arguments of ``read_all``.

    Raises:
        InvalidEvent: a bad position, limit or prefix.
    """
    if type(after_position) is not int or after_position < 0:
        raise InvalidEvent("after_position", f"must be an int >= 0, got {after_position!r}")
    check_range(1, None, limit)
    if stream_prefix is not None and type(stream_prefix) is not str:
        raise InvalidEvent(
            "stream_prefix", f"must be a str or None, got {type(stream_prefix).__name__}"
        )
