"""Persistence module for the `eventsourcing <https://eventsourcing.readthedocs.io>`_ library
(``PERSISTENCE_MODULE=ares_events.integrations.eventsourcing``): one hash-chained stream
per aggregate; docs/integrations.md has the settings and the mapping.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, TypeVar
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
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
from ares_events.core.events import NO_STREAM, ExpectedVersion, NewEvent, RecordedEvent
from ares_events.errors import ConcurrencyError, InvalidEvent, StoreError, StoreUnavailable
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


def _to_stored(e: RecordedEvent, originator_id: UUID | str, cls: type[Any] = StoredEvent) -> Any:
    s = e.payload.get("state")
    state = s.encode("utf-8") if s is not None else base64.b64decode(e.payload["state_b64"])
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
        if self.snapshots:
            return self._insert_snapshots(groups, _tracking(tracking))
        for evs in groups.values():
            for a, b in itertools.pairwise(evs):
                if b.originator_version != a.originator_version + 1:
                    raise IntegrityError(
                        f"aggregate {a.originator_id}: versions {a.originator_version} and "
                        f"{b.originator_version} are not consecutive"
                    )
        track = _tracking(tracking)
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
                new = []
                for ev in evs:
                    v = ev.originator_version
                    ordered = ordered and (last_v is None or v > last_v)
                    last_v = v if last_v is None else max(last_v, v)
                    # One (aggregate, version) once: the event id is derived from them.
                    eid = uuid.uuid5(_SNAPSHOT_IDS, f"{ssid}\x00{v}")
                    new.append(_to_new_event(ev, self.module, {"ordered": ordered}, eid))
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
        """
        if limit is not None and limit <= 0:
            return []
        select = self._select_snapshots if self.snapshots else self._select
        with _translated():
            recs = select(originator_id, gt, lte, desc, limit)
        return [_to_stored(e, originator_id) for e in recs]

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
    if b'"id_type"' in meta_json:
        return raw
    try:
        return UUID(raw)
    except ValueError:
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
        """This application's events in global order, ``start <= id <= stop``.

        Raises:
            OperationalError: the store cannot be reached.
        """
        after = 0 if start is None else (start - 1 if inclusive_of_start else start)
        after = max(after, 0)
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
