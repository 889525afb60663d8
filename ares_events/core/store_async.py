"""The event store: validation, encoding, chaining, identity and spill over a narrow backend
(over 800 lines because every public operation of the store, with its docstring, is here).

It may import the core's other modules, :mod:`ares_events.errors` and the chain format.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from operator import attrgetter
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from ares_events.chain import ChainKey, genesis, link_hash
from ares_events.core.backend import Batch, Capability, Head, TrackingRecord, fresh_result
from ares_events.core.blobs import BlobStore
from ares_events.core.events import (
    ANY,
    MAX_METADATA_BYTES,
    RECORD_STREAMS,
    AppendResult,
    ErasedPayloadRef,
    ExpectedVersion,
    NewEvent,
    PayloadRef,
    PreparedEvent,
    RecordedEvent,
    _normalize_expected,
    prepare,
    utc_now_at,
    validate_name,
)
from ares_events.core.faces import ASYNC, blocking, on_asyncio
from ares_events.core.identity import (
    BLOBS_OWNER_KEY,
    DEFAULT_BLOBS,
    IDENTITY_KEY,
    BlobsIdentity,
    StoreIdentity,
    check_configured,
)
from ares_events.core.iterators_async import aclosing_iter, afirst
from ares_events.core.recorder_async import AsyncRecorder, check_capabilities
from ares_events.core.row_pages import PagedRead
from ares_events.core.rules import (
    DEFAULT_MAX_INLINE_BYTES,
    Conflict,
    check_after,
    check_range,
    check_timeout,
    duplicate_result,
    events_arg,
    many_results,
    plan_many,
    tracking_arg,
)
from ares_events.core.traced import appended, appended_many, traced, traced_reads
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    EventNotFound,
    InvalidEvent,
    StoreClosed,
    StoreError,
    StoreUnavailable,
)

if ASYNC:
    import asyncio
    from asyncio import Lock, sleep
else:
    from threading import Lock
    from time import sleep

if TYPE_CHECKING:
    from ares_events.core.snapshots_async import AsyncSnapshotStore

logger = logging.getLogger(__name__)
_size = attrgetter("size")  # of a PreparedEvent

__all__ = [
    "DEFAULT_MAX_INLINE_BYTES",
    "MAX_METADATA_BYTES",
    "SUBSCRIBE_PAGE",
    "AsyncEventStore",
    "aemit",
]

SUBSCRIBE_PAGE: Final = 1000
"""Events ``subscribe()`` reads per ``read_all`` page."""
_POLL_MAX: Final = 0.25


def _failing_loader(exc: BaseException) -> Callable[[PayloadRef], bytes]:
    def load(ref: PayloadRef) -> bytes:
        raise exc

    return load


def _preload(e: RecordedEvent) -> RecordedEvent:
    """In a worker thread: fetch a spilled payload now; a failure is raised on reading it."""
    try:
        e.payload_bytes  # noqa: B018 - fetches, checks and keeps the bytes
    except Exception as exc:  # raised again, unchanged, when the payload is read
        return e._with_loader(_failing_loader(exc))
    return e


class AsyncEventStore:
    """A hash-chained, append-only event store over one backend.

    Open one with :func:`open_async_store` and close it (it is a context manager too).
    Constructed directly over a recorder, the asyncio face checks the recorded identity
    at :meth:`open` or before its first operation, the blocking face at once.

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
        StoreError: the recorder declares a capability it does not implement.
        StoreUnavailable: the backend cannot be reached.
    """

    def __init__(
        self,
        recorder: AsyncRecorder,
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
        self.recorder: AsyncRecorder = recorder
        self._url = url or recorder.describe()
        self._caps = check_capabilities(recorder, self._url)
        self._cursors = Capability.CELL_CURSORS in self._caps  # read_all takes merged cursors
        self.max_inline_bytes = max_inline_bytes
        self.chain_key = ChainKey.coerce(chain_key)
        self.blobs = blobs
        self.spill_threshold = spill_threshold
        self._snapshots: Any = None
        self._closed = False
        self._blobs_identity: BlobsIdentity | str | None = None
        if blobs is not None and default_blobs:
            self._blobs_identity = DEFAULT_BLOBS
        elif blobs is not None:
            self._blobs_identity = BlobsIdentity(getattr(blobs, "location", blobs.url), blobs.url)
        self._identity: StoreIdentity | None = identity
        self._check_identity = check_identity
        self._keeps_identity = Capability.METADATA in self._caps
        # True until the identity is known to be recorded as this store writes.
        self._identity_pending = self._keeps_identity
        self._identity_lock = Lock()
        self._blobs_claimed = False
        self._loaded = not (check_identity and self._keeps_identity)
        if ASYNC:
            pass  # no I/O in a constructor: open() or the first operation checks
        else:
            self._ready()

    @classmethod
    async def open(cls, recorder: AsyncRecorder, **kwargs: Any) -> AsyncEventStore:
        """Construct over ``recorder`` and check the recorded identity now.

        Raises:
            ConfigError: the store records another chain mode, chain key or blob location.
            StoreUnavailable: the backend cannot be reached.
        """
        store = cls(recorder, **kwargs)
        await store._ready()
        return store

    def __repr__(self) -> str:
        keyed = ", keyed" if self.chain_key is not None else ""
        return f"{type(self).__name__}({self._url!r}{keyed})"

    # -- info ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The store's URL, redacted (safe to log)."""
        return self._url

    @property
    def capabilities(self) -> frozenset[Capability]:
        """What the backend declares it supports."""
        return self._caps

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

    # -- identity ------------------------------------------------------------------------

    async def _ready(self) -> None:
        """Read (unless given) and check the recorded identity, once."""
        if self._loaded:
            return
        async with self._identity_lock:
            if self._loaded:
                return
            known = self._identity  # as given to the constructor: nothing set it since
            if known is None:
                raw = await self.recorder.meta_get(IDENTITY_KEY)  # type: ignore[attr-defined]
                if raw is not None:
                    known = StoreIdentity.from_json(raw, self._url)
            if known is not None:
                self._identity = known
                check_configured(known, self.chain_key, self._blobs_identity, self._url)
                self._identity_pending = known.blobs is None and self._blobs_identity is not None
            self._loaded = True

    async def record_identity(self, *, relocate_blobs: bool = False) -> StoreIdentity | None:
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
        await self._ready()
        if not self._keeps_identity:
            return None
        rec: Any = self.recorder
        async with self._identity_lock:
            if relocate_blobs:
                await self.claim_blobs()
                raw = await rec.meta_get(IDENTITY_KEY)
                while raw is not None:
                    current = StoreIdentity.from_json(raw, self._url)
                    problem = current.chain_problem(self.chain_key)
                    if problem is not None:
                        raise ConfigError(f"store {self._url}: {problem}")
                    moved = dataclasses.replace(current, blobs=self._blobs_identity)
                    # An archive run may record its location meanwhile (a compare-and-set
                    # too): write over what was read, or read again, never lose it.
                    if Capability.ARCHIVE not in self._caps:
                        await rec.meta_set(IDENTITY_KEY, moved.to_json())
                    elif not await rec.meta_swap(IDENTITY_KEY, raw, moved.to_json()):
                        raw = await rec.meta_get(IDENTITY_KEY)
                        continue
                    self._identity, self._identity_pending = moved, False
                    self._check_identity = True  # configured exactly as recorded now
                    logger.info("store %s: blob location recorded anew", self._url)
                    return moved
                self._check_identity = True
                self._identity_pending = True
            if self._identity_pending:
                await self._record_identity()
            return self._identity

    async def _before_write(self) -> None:
        """Before this object's first write: check, then record (or complete) the identity."""
        await self._ready()
        if not self._check_identity:
            raise ConfigError(
                f"store {self._url} was opened with check_identity=False (for reading under "
                "another configuration); it does not write"
            )
        if self._identity_pending:
            async with self._identity_lock:
                if self._identity_pending:
                    await self._record_identity()

    async def _record_identity(self) -> None:
        rec: Any = self.recorder
        if isinstance(self._blobs_identity, BlobsIdentity):
            # The identity names the blob location as this store's: never one another
            # store owns (reopening with a location of its own would then be refused).
            # A backend's default folder is its own by its name: claimed at a spill.
            await self.claim_blobs()
        current = self._identity
        if current is None:
            raw = await rec.meta_get(IDENTITY_KEY)  # another writer may have recorded it
            if raw is None:
                if await rec.last_position() > 0:
                    await self._check_unrecorded_chain()
                mine = StoreIdentity.new(self.chain_key, self._blobs_identity, from_position=1)
                raw = await rec.meta_put_if_absent(IDENTITY_KEY, mine.to_json())
            stored = StoreIdentity.from_json(raw, self._url)
            check_configured(stored, self.chain_key, self._blobs_identity, self._url)
            current = stored
        if current.blobs is None and self._blobs_identity is not None:
            current = dataclasses.replace(current, blobs=self._blobs_identity)
            await rec.meta_set(IDENTITY_KEY, current.to_json())
        self._identity = current
        self._identity_pending = False
        logger.info("store %s: identity %s", self._url, current.describe_chain())

    async def _check_unrecorded_chain(self) -> None:
        """A store written before identities existed: its first stream's first event must
        verify under the configured chain key before an identity says it does."""
        found = await afirst(self.recorder.heads())
        if found is None:
            return
        sid, _ = found
        event = await afirst(self.recorder.read(sid, 1, 1, 1))
        if event is None:
            return
        try:
            ok = link_hash(genesis(sid), event.header(), self.chain_key) == event.hash
        except (TypeError, ValueError, AttributeError):
            ok = False
        if not ok:
            key = self.chain_key
            mode = "no chain key" if key is None else f"chain key id {key.fingerprint()}"
            raise ConfigError(
                f"store {self._url} has no recorded identity and its first event (stream "
                f"{sid!r}) does not verify with {mode}: it was written with another "
                "chain configuration, or the event was altered (run `ares-events audit`)"
            )

    async def claim_blobs(self, *, write: bool = True) -> None:
        """Check that the blob location is this store's, claiming it when no store has
        (docs/blobs.md, "One location, one store"); done before this object first writes
        or deletes a blob. ``write=False`` checks only (a dry run) and records nothing.

        Raises:
            ConfigError: another store claimed the location (nothing was written).
            StoreUnavailable: the backend or the blob store cannot be reached.
        """
        blobs = self.blobs
        if self._blobs_claimed or blobs is None or not self._keeps_identity:
            return
        self._check_open("claiming the blob location")
        await self._ready()
        rec: Any = self.recorder
        token = await rec.meta_get(BLOBS_OWNER_KEY)
        if token is None and write:
            token = await rec.meta_put_if_absent(BLOBS_OWNER_KEY, secrets.token_hex(16))
        await asyncio.to_thread(lambda: blobs.claim(token, write=write))
        self._blobs_claimed = write

    # -- writes --------------------------------------------------------------------------

    @traced("append", appended)
    async def append(
        self, stream_id: str, events: Sequence[NewEvent], *, expected_version: ExpectedVersion = ANY
    ) -> AppendResult:
        """Append ``events`` to ``stream_id`` atomically: all of them or none.

        On the asyncio face, cancelling the awaiting task cancels the append where it
        stands: it committed or it did not by the time the task sees ``CancelledError``.
        Which one is not known to the task: re-append the same event ids to find out.

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
            ConfigError: a payload would spill to a blob location another store claimed
                (:meth:`claim_blobs`); nothing was written.
            StoreClosed: the store is closed (also while the append was in flight).
            StoreUnavailable: the backend cannot be reached; nothing was written.
        """
        if self._closed:
            raise StoreClosed(self._url, f"append to stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        expected = _normalize_expected(expected_version)
        events = events_arg(stream_id, events)
        if self._identity_pending or not self._loaded or not self._check_identity:
            await self._before_write()
        fresh = prepare(stream_id, events, utc_now_at())
        prepared = await self._spill(stream_id, fresh)
        outcome = await self.recorder.append(Batch(stream_id, prepared, self.chain_key), expected)
        if prepared is not fresh:  # some payload spilled (_spill returns the list it was given)
            await self._keep_spilled(fresh, prepared)
        if outcome.duplicate:
            res = duplicate_result(stream_id, prepared, outcome.events)
            if isinstance(res, Conflict):
                raise await self._conflict(res)
            return res
        return fresh_result(stream_id, prepared, outcome)

    @traced("append_many", appended_many)
    async def append_many(
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
        track = tracking_arg(tracking)
        if not batches and track is None:
            raise InvalidEvent("batches", "at least one batch (or a tracking record) is required")
        if Capability.MULTI_STREAM_APPEND not in self._caps:
            if len(batches) == 1 and track is None:
                sid, evs, exp = batches[0]
                return [await self.append(sid, evs, expected_version=exp)]
            raise StoreError(
                f"store {self._url} cannot append to several streams atomically "
                "(its backend does not declare MULTI_STREAM_APPEND)"
            )
        await self._before_write()
        plan = plan_many(batches, utc_now_at())
        fresh = [b.prepared for b in plan]
        for b in plan:
            b.prepared = await self._spill(b.stream_id, b.prepared)
        work = [(Batch(b.stream_id, b.prepared, self.chain_key), b.expected) for b in plan]
        rec: Any = self.recorder
        outcomes = await rec.append_many(work, track)
        for f, b in zip(fresh, plan, strict=True):
            if b.prepared is not f:
                await self._keep_spilled(f, b.prepared)
        res = many_results(plan, outcomes)
        if isinstance(res, Conflict):
            raise await self._conflict(res)
        return res

    @traced("erase_payload")
    async def erase_payload(self, stream_id: str, version: int) -> tuple[RecordedEvent, int | None]:
        """Remove one event's payload from the backend, keeping its digest and size (the
        chain commits to them, so every link hash, Merkle leaf and checkpoint stays valid),
        and delete its blob when no other event's payload lives in it and no append
        refreshed it since the erasure began (``gc-blobs`` deletes such a one later).

        This is the storage half of an erasure; :func:`ares_events.erase` is the whole of
        it (the erasure record, snapshots, read models). Idempotent: an erased event is
        returned as it is, and of concurrent erasures of one event only one erases it (the
        others get the erased event).

        Returns:
            The event as it was before (its payload still readable in this object only
            when it was inline), and the number of other events sharing its blob (None
            when it had no blob or was already erased). A blob none shares may still
            exist: refreshed meanwhile, it is left to ``gc-blobs``.

        Raises:
            InvalidEvent: ``stream_id`` is one of the store's record streams (erasures,
                retention).
            EventNotFound: no event at ``stream_id`` ``version``.
            ConfigError: the blob location belongs to another store (:meth:`claim_blobs`);
                nothing was erased.
            StoreError: the backend does not declare ``ERASE``, or the row was rewritten
                while it was erased (retry).
            StoreUnavailable: the backend or the blob store cannot be reached.
        """
        self._check_open(f"erase of stream {stream_id!r} version {version}")
        validate_name(stream_id, "stream_id")
        if stream_id in RECORD_STREAMS:
            raise InvalidEvent(
                "stream_id",
                f"{stream_id!r} holds the store's own records, which the audit checks "
                "erasures and retired segments against: they are never erased",
            )
        if Capability.ERASE not in self._caps:
            raise StoreError(f"store {self._url} cannot erase payloads (no ERASE capability)")
        if type(version) is not int or version < 1:
            raise EventNotFound(stream_id, version, "versions start at 1")
        await self._before_write()
        # Before anything changes, also for an inline payload: an erasure of several
        # events (erase_events) is never left half done by a refusal at a spilled one.
        await self.claim_blobs()
        found = await afirst(self.recorder.read(stream_id, version, version, 1))
        if found is None or found.version != version:
            raise EventNotFound(stream_id, version)
        ref = found.payload_ref
        if ref is not None and ref.erased:
            return found, None
        erased = ErasedPayloadRef(key="", size=found.payload_size, digest=found.payload_digest)
        blob_key = ref.key if ref is not None and ref.key else None
        started = datetime.now(UTC)
        rec: Any = self.recorder
        outcome = await rec.erase(stream_id, version, found.position, found.hash, erased, blob_key)
        if not outcome.erased:
            now = await afirst(self.recorder.read(stream_id, version, version, 1))
            if now is not None and now.hash == found.hash and now.payload_erased:
                return now, None  # a concurrent erasure of the same event won
            raise StoreError(
                f"stream {stream_id!r} version {version} changed while it was being erased "
                "(rewritten): read it again"
            )
        blobs = self.blobs
        if blob_key is not None and outcome.blob_refs == 0 and blobs is not None:
            # A blob an append (of the same payload) refreshed after we started is kept.
            await asyncio.to_thread(lambda: blobs.delete(blob_key, if_older_than=started))
        logger.info("erased the payload of stream %r version %d", stream_id, version)
        return found, (outcome.blob_refs if blob_key is not None else None)

    async def tracked_position(self, name: str) -> int | None:
        """The position last tracked for ``name`` by :meth:`append_many`, or None.

        Raises:
            StoreError: the backend does not declare ``MULTI_STREAM_APPEND``.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        validate_name(name, "tracking name")
        if Capability.MULTI_STREAM_APPEND not in self._caps:
            raise StoreError(f"store {self._url} keeps no tracking records")
        await self._ready()
        rec: Any = self.recorder
        return await rec.tracked_position(name)  # type: ignore[no-any-return]

    async def _keep_spilled(self, fresh: list[PreparedEvent], spilled: list[PreparedEvent]) -> None:
        """Once an append has committed, write each blob it spilled again (a refresh when it
        is there). An erasure or a ``gc-blobs`` that counted the blob's users before the
        commit and deletes it after then finds it refreshed and keeps it, or has deleted it
        already and it is back: the blob of a committed event is never lost for good."""
        again = [
            (f.payload_bytes, f.digest)
            for f, s in zip(fresh, spilled, strict=True)
            if s is not f and f.payload_bytes is not None
        ]
        blobs = self.blobs
        if not again or blobs is None:
            return
        try:
            await asyncio.to_thread(lambda: [blobs.put(data, digest=d) for data, d in again])
        except StoreUnavailable as exc:  # the events are in: say so, do not fail the append
            logger.warning(
                "appended, but could not refresh %d spilled blob(s) after the commit "
                "(a concurrent erasure or gc may delete one): %s",
                len(again),
                exc,
            )

    async def _spill(self, stream_id: str, prepared: list[PreparedEvent]) -> list[PreparedEvent]:
        """Write payloads over the threshold to the blob store, before the append commits
        (on a worker thread on the asyncio face: blob stores are blocking); then refuse a
        payload still inline and over ``max_inline_bytes``. The list it was given comes
        back when nothing can spill."""
        biggest = max(map(_size, prepared))  # one C loop; spilling keeps each size
        blobs, limit = self.blobs, self.spill_threshold
        # Only a blob store decides what spills; this spares a call when nothing can.
        if blobs is not None and biggest > limit:
            await self.claim_blobs()
            prepared = await asyncio.to_thread(lambda: [blobs.spill(p, limit) for p in prepared])
        if biggest <= self.max_inline_bytes:  # the usual case
            return prepared
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

    async def _conflict(self, c: Conflict) -> ConcurrencyError:
        version = await self.stream_version(c.stream_id)
        return ConcurrencyError(c.stream_id, c.expected, version, c.detail)

    # -- reads ---------------------------------------------------------------------------

    @traced_reads("read")
    def read(
        self,
        stream_id: str,
        from_version: int = 1,
        to_version: int | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[RecordedEvent]:
        """Events of ``stream_id`` with ``from_version <= version <= to_version``, in
        version order, as a lazy iterator (one page in memory, on any stream length).
        The arguments are checked at the call.

        Raises:
            InvalidEvent: a bad stream id or range.
            StoreClosed: the store is closed (also between pages).
            StoreUnavailable: the backend cannot be reached.
        """
        if self._closed:
            raise StoreClosed(self._url, f"read of stream {stream_id!r}")
        validate_name(stream_id, "stream_id")
        check_range(from_version, to_version, limit)
        events: Any = self.recorder.read(stream_id, from_version, to_version, limit)
        if self._loaded:
            if self.blobs is None:
                # Nothing to add to the backend's events: hand its iterator out as it is.
                return events  # type: ignore[no-any-return]
            if type(events) is PagedRead:
                # Rows become events as they are taken; the blob store is attached to
                # those with a payload reference only (no generator around the read).
                attach = self.blobs.attach
                fast: Any = events.with_slow(lambda slow: lambda row: attach(slow(row)))
                return fast  # type: ignore[no-any-return]
        return self._events(events)

    @traced_reads("read_all")
    def read_all(
        self,
        after_position: int = 0,
        limit: int | None = None,
        *,
        stream_prefix: str | None = None,
    ) -> AsyncIterator[RecordedEvent]:
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
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open("read_all")
        check_after(after_position, limit, stream_prefix, cursors=self._cursors)
        if stream_prefix:
            # Passed only when asked for: recorders written before the keyword still work.
            events = self.recorder.read_all(after_position, limit, stream_prefix=stream_prefix)
        else:
            events = self.recorder.read_all(after_position, limit)
        return self._events(events) if not self._loaded or self.blobs is not None else events

    async def _events(self, source: AsyncIterator[RecordedEvent]) -> AsyncIterator[RecordedEvent]:
        await self._ready()
        blobs = self.blobs
        async with aclosing_iter(source) as events:
            async for e in events:
                if e.payload_ref is None or blobs is None:
                    yield e
                    continue
                if ASYNC:
                    yield await asyncio.to_thread(_preload, blobs.attach(e))
                else:
                    yield blobs.attach(e)  # fetched when its payload is first read

    async def stream_version(self, stream_id: str) -> int:
        """The stream's version from its head row; 0 when the stream does not exist.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        head = await self.head(stream_id)
        return head.version if head else 0

    async def head(self, stream_id: str) -> Head | None:
        """The stream's head (version and hash of the last event), or None.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        validate_name(stream_id, "stream_id")
        if not self._loaded:
            await self._ready()
        return await self.recorder.head(stream_id)

    async def streams(self) -> AsyncIterator[tuple[str, int]]:
        """Every stream with its version, ordered by stream id.

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        await self._ready()
        async with aclosing_iter(self.recorder.heads()) as heads:
            async for sid, h in heads:
                yield sid, h.version

    async def streams_page(
        self, *, after: str = "", prefix: str | None = None, limit: int = 100
    ) -> list[tuple[str, Head]]:
        """One page of streams with their heads, in the order of :meth:`streams`.

        Pass the last id of a page as ``after`` for the next one. A backend with
        :attr:`Capability.STREAM_PAGES` reads one page from its index (memory, SQLite,
        PostgreSQL); any other backend's heads are scanned from the start, lazily.

        Args:
            after: only ids above this one (``""``: from the first).
            prefix: only ids that start with this, exactly (no character is a wildcard);
                None or ``""``: every stream.
            limit: at most this many (1 or more).

        Raises:
            InvalidEvent: a bad ``after``, ``prefix`` or ``limit``.
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        if not isinstance(after, str) or not isinstance(prefix, (str, type(None))):
            raise InvalidEvent("streams_page", "after and prefix must be strings")
        if type(limit) is not int or limit <= 0:
            raise InvalidEvent("streams_page", f"limit must be a positive int, got {limit!r}")
        await self._ready()
        prefix = prefix or None
        if Capability.STREAM_PAGES in self._caps:
            return await self.recorder.heads_page(after, limit, prefix)  # type: ignore[attr-defined, no-any-return]
        out: list[tuple[str, Head]] = []
        async with aclosing_iter(self.recorder.heads()) as heads:
            async for sid, h in heads:
                if sid > after and (prefix is None or sid.startswith(prefix)):
                    out.append((sid, h))
                    if len(out) >= limit:
                        break
        return out

    async def last_position(self) -> int:
        """The highest global position visible to ``read_all`` (0 for an empty store).

        Raises:
            StoreClosed: the store is closed.
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open()
        await self._ready()
        return await self.recorder.last_position()

    async def wait_for(self, position: int, timeout: float) -> bool:
        """Wait until an event after ``position`` is visible to ``read_all``, or
        ``timeout`` seconds pass: the backend's wake-ups (PostgreSQL LISTEN/NOTIFY, the
        memory store's) where it has them, else polling with backoff (5 ms doubling to
        250 ms).

        Returns:
            True when an event after ``position`` exists.

        Raises:
            InvalidEvent: ``position`` is not an int from 0, or ``timeout`` is not a finite
                number of seconds >= 0.
            StoreClosed: the store is closed (also while waiting).
            StoreUnavailable: the backend cannot be reached.
        """
        check_after(position, None, cursors=self._cursors, name="position")
        timeout = check_timeout(timeout)
        self._check_open()
        await self._ready()
        if Capability.WAKEUPS in self._caps:
            rec: Any = self.recorder
            return bool(await rec.wait_for(position, timeout))
        deadline = time.monotonic() + timeout
        delay = 0.005
        while True:
            self._check_open()
            if await self.recorder.last_position() > position:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            await sleep(min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

    def subscribe(
        self, after_position: int = 0, *, page: int = SUBSCRIBE_PAGE
    ) -> AsyncIterator[RecordedEvent]:
        """Every event after ``after_position``, in position order, then each new one as
        it commits: an endless iterator (break out of it, or close the store).

        It pages through :meth:`read_all` and, once caught up, waits with
        :meth:`wait_for` (LISTEN/NOTIFY on PostgreSQL, polling elsewhere). It never skips
        an event: ``read_all`` returns only positions below which nothing can commit
        any more, so an event whose transaction commits late is seen in its place.
        Resume after a restart by passing the last position processed.

        Raises:
            InvalidEvent: a bad position or page size.
            StoreClosed: the store was closed (ends the iteration).
            StoreUnavailable: the backend cannot be reached.
        """
        self._check_open("subscribe")
        check_after(after_position, None, cursors=self._cursors)
        if type(page) is not int or page < 1:
            raise InvalidEvent("page", f"must be an int >= 1, got {page!r}")
        return self._subscription(after_position, page)

    async def _subscription(self, position: int, page: int) -> AsyncIterator[RecordedEvent]:
        while True:
            n = 0
            async with aclosing_iter(self.read_all(position, page)) as events:
                async for e in events:
                    position = e.position
                    n += 1
                    yield e
            if n < page:
                await self.wait_for(position, 30.0)

    @property
    def snapshots(self) -> AsyncSnapshotStore:
        """The snapshot store in the same database as the events.

        Raises:
            StoreClosed: the store is closed.
            StoreError: the backend has no snapshot table.
        """
        self._check_open()
        if self._snapshots is None:
            # Imported on first use: most programs never touch snapshots.
            from ares_events.core.snapshots_async import async_snapshot_store_for

            self._snapshots = async_snapshot_store_for(self)
        return self._snapshots  # type: ignore[no-any-return]

    # -- lifecycle -----------------------------------------------------------------------

    async def close(self) -> None:
        """Release the backend's connections. Idempotent and safe from any thread or task.

        From now on every call raises :class:`StoreClosed`. Operations already running
        elsewhere finish, or are interrupted after a short grace and raise
        :class:`StoreClosed`; waiters and subscribers wake up with it; no connection
        outlives this call.
        """
        self._closed = True
        await self.recorder.close()
        if self.blobs is not None:
            await asyncio.to_thread(self.blobs.close)

    async def __aenter__(self) -> AsyncEventStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def aemit(
    store: AsyncEventStore,
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
    if ASYNC:  # a blocking store would append, then fail the await on its result
        store = on_asyncio(store, "aemit", "ae.emit")
    else:  # an asyncio store's append would return a coroutine nobody awaits
        store = blocking(store, "ae.emit", "ares_events.core.store_async.aemit")
    payload = {} if payload is None else payload
    event = NewEvent(type=type, module=module, payload=payload, metadata=metadata or {})
    return await store.append(stream_id, [event], expected_version=expected_version)
