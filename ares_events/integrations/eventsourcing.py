"""Persistence module for the `eventsourcing <https://eventsourcing.readthedocs.io>`_ library
(``PERSISTENCE_MODULE=ares_events.integrations.eventsourcing``): one hash-chained stream
per aggregate; docs/integrations.md has the settings and the mapping.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import gc
import itertools
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar
from uuid import UUID

from eventsourcing.application import Application
from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    DataError,
    InfrastructureFactory,
    IntegrityError,
    Notification,
    OperationalError,
    PersistenceError,
    ProcessRecorder,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, EnvType, resolve_topic

from ares_events.core.backend import TrackingRecord
from ares_events.core.events import (
    ERASURE_STREAM,
    ERASURE_TYPE,
    NO_STREAM,
    SNAPSHOT_COVERS,
    ExpectedVersion,
    NewEvent,
    RecordedEvent,
)
from ares_events.errors import (
    ConcurrencyError,
    InvalidEvent,
    PayloadErased,
    StoreError,
    StoreUnavailable,
)
from ares_events.integrations._eventsourcing_store import (
    MODULE,
    AresDatastore,
    ChainVerificationError,
    open_datastore,
)

__all__ = [
    "AresAggregateRecorder",
    "AresApplicationRecorder",
    "AresDatastore",
    "AresFactory",
    "AresProcessRecorder",
    "AresSubscription",
    "AresTrackingRecorder",
    "ChainVerificationError",
    "Factory",
    "PayloadErasedError",
]

R = TypeVar("R")
_MAX_TYPE: Final = 256
_SNAPSHOT_IDS: Final = uuid.UUID("6f0d2c1e-5b8a-4f55-9a57-0e4b2f8c7a31")
_Batch = tuple[str, list[NewEvent], ExpectedVersion]


def _to_new_event(
    ev: StoredEvent, module: str, extra: dict[str, Any] | None = None, event_id: Any = None
) -> NewEvent:
    topic = ev.topic
    meta: dict[str, Any] = {"originator_version": ev.originator_version}
    if len(topic) > _MAX_TYPE:
        meta["topic"] = topic
    if isinstance(ev.originator_id, str):
        meta["id_type"] = "str"
    if extra:
        meta.update(extra)
    ids = {"event_id": event_id} if event_id is not None else {}
    try:
        payload = {"state": ev.state.decode("utf-8")}
    except UnicodeDecodeError:
        payload = {"state_b64": base64.b64encode(ev.state).decode("ascii")}
    return NewEvent(type=topic[:_MAX_TYPE], module=module, payload=payload, metadata=meta, **ids)


class PayloadErasedError(DataError):
    """An aggregate read met an event whose payload was erased (``ares-events erase``).

    eventsourcing's ``DataError`` (a ``PersistenceError``: the stored data cannot make the
    aggregate), raised from the ares-events ``PayloadErased``. ``originator_id`` and
    ``originator_version`` name the event as eventsourcing does, ``stream_id`` and
    ``version`` as ares-events does.
    """

    def __init__(
        self, originator_id: UUID | str, originator_version: int, stream_id: str, version: int
    ) -> None:
        self.originator_id = originator_id
        self.originator_version = originator_version
        self.stream_id = stream_id
        self.version = version
        super().__init__(
            f"aggregate {originator_id} version {originator_version} (stream {stream_id!r} "
            f"version {version}) had its payload erased with ares-events erase: the event "
            "cannot be read, nor the aggregate rebuilt past it"
        )


def _to_stored(e: RecordedEvent, originator_id: UUID | str, cls: type[Any] = StoredEvent) -> Any:
    """The eventsourcing record of ``e`` (PayloadErasedError when its payload was erased)."""
    try:
        payload = e.payload
    except PayloadErased as exc:
        ov = e.metadata["originator_version"]
        raise PayloadErasedError(originator_id, ov, e.stream_id, e.version) from exc
    s = payload.get("state")
    state = s.encode("utf-8") if s is not None else base64.b64decode(payload["state_b64"])
    ids = {"id": e.position} if cls is Notification else {}
    version = e.metadata["originator_version"]
    return cls(originator_id, version, e.metadata.get("topic", e.type), state, **ids)


_ERRORS: Final = (ConcurrencyError, InvalidEvent, StoreError)
"""What :func:`_translate` maps (raised ``from`` the ares-events error)."""


def _translate(exc: Exception) -> Exception:
    """eventsourcing's error for an ares-events one: a conflict (or a reused event id) is
    an ``IntegrityError`` a caller may retry, an unreachable store an ``OperationalError``."""
    if isinstance(exc, ConcurrencyError):
        return IntegrityError(str(exc))
    if isinstance(exc, StoreUnavailable):
        return OperationalError(str(exc))
    if isinstance(exc, InvalidEvent):
        return IntegrityError(str(exc)) if exc.field == "event_id" else PersistenceError(str(exc))
    return PersistenceError(str(exc))


@contextlib.contextmanager
def _translated(errors: tuple[type[Exception], ...] = (StoreError,)) -> Iterator[None]:
    """:func:`_translate` of the ``errors`` the block raises."""
    try:
        yield
    except errors as exc:
        raise _translate(exc) from exc


class AresAggregateRecorder(AggregateRecorder):
    """Aggregate recorder: one ares-events stream per aggregate, whose original versions
    must be consecutive (they become the stream's versions); for another ``purpose``
    (``"snapshots"``), one stream ``<purpose>/<stream id>`` per aggregate, one event per
    record at any original version (each (aggregate, version) at most once)."""

    def __init__(self, datastore: AresDatastore, purpose: str = "events") -> None:
        self.datastore = datastore
        self.store = datastore.store
        self.purpose = purpose
        self.snapshots = purpose != "events"
        self.module = MODULE if not self.snapshots else f"{MODULE}.{purpose}"
        # Snapshot recorders: the lowest erased version of each of the application's
        # streams, from the erasure records read so far (their stream's version).
        self._erased: dict[str, int] = {}
        self._erasures_read = 0
        self._erasures_lock = threading.Lock()

    def insert_events(
        self, stored_events: Sequence[StoredEvent], **kwargs: Any
    ) -> Sequence[int] | None:
        """Write stored events atomically (all aggregates in one transaction); an
        application recorder returns their notification ids.

        Raises:
            IntegrityError: a version conflict (or a reused tracking record).
            OperationalError: the store cannot be reached.
        """
        ids = self._insert(stored_events, kwargs.get("tracking"))
        return ids if isinstance(self, ApplicationRecorder) else None

    def _insert(self, stored_events: Sequence[StoredEvent], tracking: Tracking | None) -> list[int]:
        if not stored_events and tracking is None:
            return []
        ds = self.datastore
        groups: dict[str, list[StoredEvent]] = {}
        for ev in stored_events:
            groups.setdefault(ds.stream_id(ev.originator_id), []).append(ev)
        track = _tracking(tracking)
        if self.snapshots:
            return self._insert_snapshots(groups, track)
        for evs in groups.values():
            for a, b in itertools.pairwise(evs):
                if b.originator_version != a.originator_version + 1:
                    raise IntegrityError(
                        f"aggregate {a.originator_id}: versions {a.originator_version} and "
                        f"{b.originator_version} are not consecutive"
                    )
        # Expected versions from the learnt offsets; an unknown stream is assumed new, and
        # a wrong guess (the stream exists) is corrected once after reading its offset.
        guessed: set[str] = set()
        for attempt in range(2):
            batches: list[_Batch] = []
            for sid, evs in groups.items():
                first = evs[0].originator_version
                off = ds._offsets.get(sid) if attempt == 0 else ds.offset(sid)
                if off is None:
                    guessed.add(sid)
                    expected: ExpectedVersion = NO_STREAM
                else:
                    expected = first - off
                    if expected < 0:
                        raise IntegrityError(
                            f"aggregate {evs[0].originator_id}: version {first} is before the "
                            f"stream's first version {off}"
                        )
                batches.append((sid, [_to_new_event(e, self.module) for e in evs], expected))
            try:
                results = self._append(batches, track)
            except _ERRORS as exc:
                if isinstance(exc, ConcurrencyError) and attempt == 0 and exc.stream_id in guessed:
                    continue
                raise _translate(exc) from exc
            for (sid, _, _), r in zip(batches, results, strict=True):
                if r.duplicate:
                    raise IntegrityError(f"stream {sid!r}: these events are already stored")
                ds.remember(sid, groups[sid][-1].originator_version - r.version + 1)
            return _positions(batches, results)
        raise AssertionError("unreachable")  # pragma: no cover

    def _append(self, batches: list[_Batch], track: TrackingRecord | None) -> list[Any]:
        if len(batches) == 1 and track is None:
            sid, evs, exp = batches[0]
            # The single-stream append is the backend's fastest path.
            return [self.store.append(sid, evs, expected_version=exp)]
        return self.store.append_many(batches, tracking=track)

    def _insert_snapshots(
        self, groups: dict[str, list[StoredEvent]], track: TrackingRecord | None
    ) -> list[int]:
        for _ in range(10):
            batches: list[_Batch] = []
            for sid, evs in groups.items():
                ssid = f"{self.purpose}/{sid}"
                head = self.store.head(ssid)
                last_v: int | None = None
                ordered = True
                if head is not None:
                    for last in self.store.read(ssid, head.version, head.version, 1):
                        last_v = int(last.metadata["originator_version"])
                        ordered = bool(last.metadata.get("ordered"))
                # The aggregate's stream version each snapshot folds up to (``covers``: an
                # erasure of that version or an earlier one erases the snapshot too). No
                # events yet (offset unknown): none, and erasures leave the snapshot (reads
                # still skip it once an erased event is at or below its version).
                off = self.datastore.offset(sid)
                new = []
                for ev in evs:
                    v = ev.originator_version
                    ordered = ordered and (last_v is None or v > last_v)
                    last_v = v if last_v is None else max(last_v, v)
                    meta: dict[str, Any] = {"ordered": ordered}
                    if off is not None:
                        meta[SNAPSHOT_COVERS] = v - off + 1
                    # One (aggregate, version) once: the event id is derived from them.
                    eid = uuid.uuid5(_SNAPSHOT_IDS, f"{ssid}\x00{v}")
                    new.append(_to_new_event(ev, self.module, meta, eid))
                batches.append((ssid, new, head.version if head else NO_STREAM))
            try:
                results = self._append(batches, track)
            except _ERRORS as exc:
                moved = isinstance(exc, ConcurrencyError) and not (
                    "already used" in str(exc) or "different content" in str(exc)
                )
                if moved:
                    continue  # another snapshot was written meanwhile: recompute
                raise _translate(exc) from exc
            if any(r.duplicate for r in results):
                raise IntegrityError("snapshot already recorded at this version")
            return _positions(batches, results)
        raise IntegrityError("snapshot stream kept changing while writing")

    def select_events(
        self,
        originator_id: UUID | str,
        *,
        gt: int | None = None,
        lte: int | None = None,
        desc: bool = False,
        limit: int | None = None,
    ) -> Sequence[StoredEvent]:
        """Events of one aggregate with ``gt < originator_version <= lte``.

        Raises:
            OperationalError: the store cannot be reached.
            PayloadErasedError: an event in the range had its payload erased.
        """
        if limit is not None and limit <= 0:
            return []
        select = self._usable_snapshots if self.snapshots else self._select
        with _translated():
            recs = select(originator_id, gt, lte, desc, limit)
        return [_to_stored(e, originator_id) for e in recs]

    def _usable_snapshots(
        self,
        originator_id: UUID | str,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[RecordedEvent]:
        """The snapshots a read may start from: not those taken at or after an erased
        event (they hold its content; ``ares-events erase`` erases them too, but not those
        written without ``covers``: by earlier versions, or before the aggregate had
        events), nor erased ones (a snapshot is only a shortcut: the read falls back to an
        earlier one, or to the events, which raise for the erased one)."""
        ds = self.datastore
        sid = ds.stream_id(originator_id)
        erasures = self._erasures()
        erased = erasures.get(sid)
        if erased is None and f"{self.purpose}/{sid}" not in erasures:
            return self._select_snapshots(originator_id, gt, lte, desc, limit)
        if erased is not None:
            off = ds.offset(sid)
            if off is not None:  # below the erased event's original version
                first_erased = off + erased - 1
                lte = first_erased - 1 if lte is None else min(lte, first_erased - 1)
        recs = self._select_snapshots(originator_id, gt, lte, desc, None)
        usable = [e for e in recs if not e.payload_erased]
        return usable[:limit] if limit is not None else usable

    def _erasures(self) -> dict[str, int]:
        """The lowest erased version of each of the application's (snapshot) streams, after
        reading the erasure records appended since the last call (usually none)."""
        prefixes = (self.datastore.stream_prefix, f"{self.purpose}/{self.datastore.stream_prefix}")
        with self._erasures_lock:
            for e in self.store.read(ERASURE_STREAM, self._erasures_read + 1):
                self._erasures_read = e.version
                p = e.payload if e.type == ERASURE_TYPE and not e.payload_erased else None
                if not isinstance(p, dict):
                    continue
                s, v = p.get("stream_id"), p.get("version")
                if isinstance(s, str) and type(v) is int and s.startswith(prefixes):
                    self._erased[s] = min(v, self._erased.get(s, v))
            return self._erased

    def _select(
        self,
        originator_id: UUID | str,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[RecordedEvent]:
        ds = self.datastore
        sid = ds.stream_id(originator_id)
        head = ds.head(sid)  # verified reads only: read before the events, they stop there
        if gt is None and lte is None and not desc:
            recs = ds.read(sid, 1, None, limit, head)
            if recs:
                m = recs[0]
                ds.remember(sid, int(m.metadata["originator_version"]) - m.version + 1)
            else:
                ds.check_not_legacy(originator_id)
            return recs
        off = ds.offset(sid)
        if off is None:
            if gt is None:
                ds.check_not_legacy(originator_id)
            return []
        lo = 1 if gt is None else max(1, gt - off + 2)
        hi = None if lte is None else lte - off + 1
        if hi is not None and hi < lo:
            return []
        if not desc:
            return ds.read(sid, lo, hi, limit, head)
        if hi is None or limit is not None:
            if not ds.verify_reads:
                top = self.store.stream_version(sid)
            elif head is None:
                ds.read(sid, lo, hi, None, None)  # events without a head row: a finding
                return []
            else:
                top = head.version
            hi = top if hi is None else min(hi, top)
        if limit is not None:
            lo = max(lo, hi - limit + 1)
        return ds.read(sid, lo, hi, None, head)[::-1] if lo <= hi else []

    def _select_snapshots(
        self,
        originator_id: UUID | str,
        gt: int | None,
        lte: int | None,
        desc: bool,
        limit: int | None,
    ) -> list[RecordedEvent]:
        ds = self.datastore
        ssid = f"{self.purpose}/{ds.stream_id(originator_id)}"
        store = self.store
        head = ds.head(ssid)
        if ds.verify_reads:
            top = head.version if head is not None else 0
        else:
            top = store.stream_version(ssid)
        if top == 0:
            if head is None and ds.verify_reads:
                ds.read(ssid, 1, None, None, None)  # no head: no events either, or a finding
            return []
        last = next(iter(store.read(ssid, top, top, 1)), None)
        if last is None:
            if ds.verify_reads:
                ds.read(ssid, top, top, 1, head)  # the head's event is gone: truncated
            return []

        def ov(e: RecordedEvent) -> int:
            return int(e.metadata["originator_version"])

        def keep(e: RecordedEvent) -> bool:
            v = ov(e)
            return (gt is None or v > gt) and (lte is None or v <= lte)

        # Original versions increase with stream versions: bisect for the range (the
        # probes only choose the range; the events returned are read, and verified, below).
        def first_above(bound: int) -> int | None:
            a, b = 1, top + 1  # first stream version whose original version > bound
            while a < b:
                mid = (a + b) // 2
                e = next(iter(store.read(ssid, mid, mid, 1)), None)
                if e is None:
                    return None  # a missing row: the scan below reads what is there
                if ov(e) > bound:
                    b = mid
                else:
                    a = mid + 1
            return a

        recs: list[RecordedEvent] | None = None
        if last.metadata.get("ordered"):
            lo = 1 if gt is None else first_above(gt)
            if lte is None or ov(last) <= lte:
                hi: int | None = top
            else:
                above = first_above(lte)
                hi = None if above is None else above - 1
            if lo is not None and hi is not None:
                if hi < lo:
                    return []
                if desc and limit is not None:
                    lo = max(lo, hi - limit + 1)
                recs = ds.read(ssid, lo, hi, None, head)
        if recs is None:
            # Written out of order at some point (rare), or a row is missing: read the
            # stream and sort.
            recs = sorted((e for e in ds.read(ssid, 1, None, None, head) if keep(e)), key=ov)
        if desc:
            recs.reverse()
        return recs[:limit] if limit is not None else recs


def _positions(batches: list[_Batch], results: Any) -> list[int]:
    """The positions of the events appended in ``batches``, in order."""
    return [
        p
        for (_, news, _), r in zip(batches, results, strict=True)
        for p in range(r.position - len(news) + 1, r.position + 1)
    ]


def _tracking(tracking: Tracking | None) -> TrackingRecord | None:
    if tracking is None:
        return None
    return TrackingRecord(f"eventsourcing:{tracking.application_name}", tracking.notification_id)


def _originator(stream_id: str, prefix: str, meta_json: bytes) -> UUID | str:
    raw = stream_id[len(prefix) :]
    if b'"id_type"' not in meta_json:
        with contextlib.suppress(ValueError):
            return UUID(raw)
    return raw


class AresApplicationRecorder(AresAggregateRecorder, ApplicationRecorder):
    """Application recorder: notification ids are ares-events global positions."""

    def select_notifications(
        self,
        start: int | None,
        limit: int,
        stop: int | None = None,
        topics: Sequence[str] = (),
        *,
        inclusive_of_start: bool = True,
    ) -> Sequence[Notification]:
        """This application's events in global order, ``start <= id <= stop``, except
        those whose payload was erased (docs/integrations.md, "Erasure").

        Raises:
            OperationalError: the store cannot be reached.
        """
        after = 0 if start is None else max(start - int(inclusive_of_start), 0)
        wanted = frozenset(topics)
        ds = self.datastore
        prefix = ds.stream_prefix
        out: list[Notification] = []
        page = max(limit, 100)
        with _translated():
            while len(out) < limit:
                # The backend filters by prefix: other applications' events are not read.
                chunk = list(self.store.read_all(after, page, stream_prefix=prefix or None))
                picked: list[RecordedEvent] = []
                done = len(chunk) < page
                for e in chunk:
                    if stop is not None and e.position > stop:
                        done = True
                        break
                    if e.module != MODULE:  # read_all already kept this prefix only
                        continue
                    if wanted and e.metadata.get("topic", e.type) not in wanted:
                        continue
                    if e.payload_erased:
                        # Nobody can process it any more: left out as a topic filter
                        # leaves events out, so followers move past it (an id gap, which
                        # eventsourcing allows) instead of failing on it forever.
                        continue
                    picked.append(e)
                    if len(out) + len(picked) >= limit:
                        done = True
                        break
                ds.verify_notifications(picked)
                for e in picked:
                    oid = _originator(e.stream_id, prefix, e.metadata_json)
                    out.append(_to_stored(e, oid, Notification))
                if done:
                    return out
                after = chunk[-1].position
        return out

    def max_notification_id(self) -> int | None:
        """The id of this application's last notification (None when it has none).

        Raises:
            OperationalError: the store cannot be reached.
        """
        with _translated():
            return self.datastore.last_position()

    def subscribe(
        self, gt: int | None = None, topics: Sequence[str] = ()
    ) -> Subscription[ApplicationRecorder]:
        """Notifications after ``gt``, blocking for new ones (woken by the store)."""
        return AresSubscription(self, gt=gt, topics=topics)


class AresSubscription(Subscription[AresApplicationRecorder]):
    """Iterates notifications, waiting with the store's ``wait_for`` wake-ups."""

    def __init__(
        self, recorder: AresApplicationRecorder, gt: int | None = None, topics: Sequence[str] = ()
    ) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._buffer: list[Notification] = []
        self._index = 0
        self._scanned = gt or 0

    def __next__(self) -> Notification:
        """The next notification, waiting for one; the iteration ends when the
        subscription is stopped or its store closed.

        Raises:
            OperationalError: the store cannot be reached.
            ChainVerificationError: verified reads found a tampered event.
        """
        try:
            return self._next()
        except (StoreError, PersistenceError) as exc:
            if self._recorder.store.closed:
                raise StopIteration from None
            if isinstance(exc, StoreError):
                raise _translate(exc) from exc
            raise

    def _next(self) -> Notification:
        recorder = self._recorder
        store = recorder.store
        while not self._has_been_stopped:
            if self._index < len(self._buffer):
                n = self._buffer[self._index]
                self._index += 1
                self._last_notification_id = n.id
                return n
            # Read the visible bound first: the scan below sees every event up to it.
            bound = store.last_position()
            self._buffer = list(
                recorder.select_notifications(
                    start=self._scanned, limit=500, topics=self._topics, inclusive_of_start=False
                )
            )
            self._index = 0
            if self._buffer:
                self._scanned = self._buffer[-1].id
            elif bound > self._scanned:
                self._scanned = bound  # events up to the bound exist but none match
            else:
                store.wait_for(self._scanned, 0.2)  # woken early by a commit
        raise StopIteration


class AresTrackingRecorder(TrackingRecorder):
    """Tracking recorder: the store's tracking table (one row per application)."""

    def __init__(self, datastore: AresDatastore) -> None:
        self.datastore = datastore
        self.store = datastore.store

    def insert_tracking(self, tracking: Tracking) -> None:
        """Record that ``tracking.application_name`` processed ``notification_id``.

        Raises:
            IntegrityError: the id is not above the application's tracked id.
        """
        with _translated(_ERRORS):
            self.store.append_many([], tracking=_tracking(tracking))

    def max_tracking_id(self, application_name: str) -> int | None:
        """The highest notification id tracked for ``application_name``, or None."""
        with _translated():
            return self.store.tracked_position(f"eventsourcing:{application_name}")


class AresProcessRecorder(AresApplicationRecorder, AresTrackingRecorder, ProcessRecorder):
    """Process recorder: events and tracking record in one transaction."""


class AresFactory(InfrastructureFactory[AresTrackingRecorder]):
    """Infrastructure factory: recorders over one ares-events store (the settings are in
    docs/integrations.md).

    Raises:
        OSError: no ``ARES_STORE_URL``.
        ConfigError: a bad setting, or a store in the old unprefixed layout while the
            prefix is derived from the application's name.
    """

    aggregate_recorder_class = AresAggregateRecorder
    application_recorder_class = AresApplicationRecorder
    tracking_recorder_class = AresTrackingRecorder
    process_recorder_class = AresProcessRecorder

    def __init__(self, env: Environment | EnvType | None) -> None:
        super().__init__(env)
        self.datastore = open_datastore(self.env)
        _LIVE.add(self)

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        """An aggregate recorder (``purpose="snapshots"``: the snapshot streams)."""
        return self.aggregate_recorder_class(self.datastore, purpose)

    def application_recorder(self) -> ApplicationRecorder:
        """An application recorder (``APPLICATION_RECORDER_TOPIC`` may name a subclass)."""
        return self._make(self.APPLICATION_RECORDER_TOPIC, self.application_recorder_class)

    def tracking_recorder(
        self, tracking_recorder_class: type[AresTrackingRecorder] | None = None
    ) -> AresTrackingRecorder:
        """A tracking recorder (a subclass may be given, or named by topic)."""
        if tracking_recorder_class is not None:
            return tracking_recorder_class(self.datastore)
        return self._make(self.TRACKING_RECORDER_TOPIC, self.tracking_recorder_class)

    def process_recorder(self) -> ProcessRecorder:
        """A process recorder (``PROCESS_RECORDER_TOPIC`` may name a subclass)."""
        return self._make(self.PROCESS_RECORDER_TOPIC, self.process_recorder_class)

    def _make(self, topic_key: str, default: Callable[[AresDatastore], R]) -> R:
        topic = self.env.get(topic_key)
        make: Callable[[AresDatastore], R] = resolve_topic(topic) if topic else default
        return make(self.datastore)

    def close(self) -> None:
        """Close the store."""
        self.datastore.close()


Factory = AresFactory

_LIVE: Final[weakref.WeakSet[AresFactory]] = weakref.WeakSet()
"""The factories not yet garbage collected (:func:`_quiet_exit`)."""
_QUIET: Final[dict[type[Any], type[Any]]] = {}


def _no_del(self: Any) -> None:
    """``__del__`` once the interpreter is exiting: nothing (no global to look up)."""


@atexit.register  # registered at import: runs after the atexit hooks registered later
def _quiet_exit() -> None:
    """Keep ``Application.__del__`` of this module's applications from running while
    Python tears modules down.

    An application still referenced when the program ends (a module global, say) may be
    freed only while module globals are being cleared; its ``__del__`` then calls
    ``contextlib.suppress`` after ``contextlib`` was cleared and prints "Exception ignored
    in: Application.__del__ ... TypeError" (a System whose classes live in ``__main__``
    does this every time). ``eventsourcing.sqlite`` escapes by accident (its applications
    sit in reference cycles, freed once stderr is gone). Here, before any module is torn
    down, each such application gets a subclass of its class whose ``__del__`` does
    nothing: its store is closed at exit anyway (``AresDatastore``), which is all a late
    ``close()`` would do.
    """
    if not _LIVE:
        return
    live = {id(f) for f in _LIVE}
    for obj in gc.get_objects():
        # type(), not isinstance(): no __class__ of a proxy (a dead weakref.proxy
        # raises) is looked up.
        if not issubclass(type(obj), Application) or id(vars(obj).get("factory")) not in live:
            continue
        cls = type(obj)
        # A class that will not be subclassed here (its __init_subclass__ refuses, a
        # layout forbids the __class__ change) is left as it is: at worst the message
        # this hook exists to keep away, never a new one.
        with contextlib.suppress(Exception):
            quiet = _QUIET.get(cls)
            if quiet is None:
                # The same name (and eventsourcing ``name``) as the class, so that nothing
                # an exit hook might still print or look up changes.
                ns = {"__del__": _no_del, "__module__": cls.__module__, "name": cls.name}
                meta: Any = type(cls)  # ABCMeta for a ProcessApplication
                quiet = _QUIET[cls] = meta(cls.__name__, (cls,), ns)
                quiet.__qualname__ = cls.__qualname__
            obj.__class__ = quiet
