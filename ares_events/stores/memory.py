"""In-process store: ``memory://`` (private per open) or ``memory://NAME`` (shared by name).

Fast and not durable; for tests, examples and ephemeral agents. ``close()`` ends this
handle (every later call raises :class:`~ares_events.errors.StoreClosed`, and waiters in
``wait_for`` wake up with it); the data of ``memory://NAME`` stays for the other handles
of that name until the process ends.
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ares_events.core.events import (
    ErasedPayloadRef,
    ExpectedVersion,
    RecordedEvent,
    check_expected_version,
)
from ares_events.core.recorder import (
    AppendOutcome,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    StoreURL,
    TrackingRecord,
    check_tracking,
)
from ares_events.errors import ConfigError, StoreClosed, StoreNotFound

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.stores.snapshots import MemorySnapshotStore

logger = logging.getLogger(__name__)

__all__ = ["MemoryRecorder"]


@dataclass
class _Data:
    lock: threading.RLock = field(default_factory=threading.RLock)
    streams: dict[str, list[RecordedEvent]] = field(default_factory=dict)
    heads: dict[str, Head] = field(default_factory=dict)
    log: list[RecordedEvent] = field(default_factory=list)
    ids: dict[str, RecordedEvent] = field(default_factory=dict)
    snapshots: dict[tuple[str, str], Any] = field(default_factory=dict)
    tracking: dict[str, int] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)
    watchers: set[Callable[[], None]] = field(default_factory=set)
    """Called (under the lock, so they must not block) after every append: how asyncio
    waiters of :mod:`~ares_events.stores.memory_async` wake up, whichever face appended."""
    cond: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self.cond = threading.Condition(self.lock)

    def notify(self) -> None:
        """Wake every waiter, blocking or asyncio (the caller holds the lock)."""
        self.cond.notify_all()
        for wake in list(self.watchers):
            wake()


def _fresh(e: RecordedEvent) -> RecordedEvent:
    """A new event sharing only immutable parts with the stored one, so a reader that
    mutates its decoded payload or metadata cannot change what later reads return."""
    return RecordedEvent(
        e.stream_id,
        e.version,
        e.position,
        e.event_id_str,
        e.type,
        e.module,
        e._payload_bytes,
        e.metadata_json,
        e.at,
        e.prev_hash,
        e.hash,
        e.payload_ref,
    )


_NAMED: dict[str, _Data] = {}
_NAMED_LOCK = threading.Lock()
_OPTIONS = ("create",)


class MemoryRecorder:
    """Backend keeping everything in Python lists, guarded by one lock."""

    scheme: ClassVar[tuple[str, ...]] = ("memory",)
    async_recorder: ClassVar[str] = "ares_events.stores.memory_async:AsyncMemoryRecorder"
    """The asyncio face (``ae.open_async_store``), sharing this store's data."""
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.GAPLESS_POSITIONS,
            Capability.WAKEUPS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
            Capability.ERASE,
        }
    )

    def __init__(self, name: str | None = None, *, create: bool = True) -> None:
        self.name = name
        self._closed = False
        if name:
            with _NAMED_LOCK:
                data = _NAMED.get(name)
                if data is None:
                    if not create:
                        raise StoreNotFound(
                            self.describe(), "no store of that name in this process"
                        )
                    data = _NAMED[name] = _Data()
                self._d = data
        else:
            if not create:
                raise StoreNotFound(self.describe(), "a private memory store is always new")
            self._d = _Data()

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> MemoryRecorder:
        """``memory://`` or ``memory://NAME``.

        Raises:
            ConfigError: a query parameter or keyword option (the memory store has none).
        """
        url.check_params(())
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown option(s) {', '.join(unknown)} for {url.redacted()}; "
                f"valid: {', '.join(_OPTIONS)}"
            )
        name = (url.host or "") + url.path.strip("/")
        return cls(name or None, create=bool(options.get("create", True)))

    def describe(self) -> str:
        """Human-readable location."""
        return f"memory://{self.name or ''}"

    def _check(self, action: str | None = None) -> None:
        if self._closed:
            raise StoreClosed(self.describe(), action)

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append under the store's lock."""
        d = self._d
        stream_id = batch.stream_id
        with d.lock:
            self._check(f"append to stream {stream_id!r}")
            existing = [d.ids[i] for i in batch.event_ids if i in d.ids]
            if existing:
                return AppendOutcome([_fresh(e) for e in existing], duplicate=True)
            head = d.heads.get(stream_id)
            check_expected_version(stream_id, expected_version, head.version if head else 0)
            sealed = batch.seal(head)
            pos = len(d.log)
            recs = [s.recorded(stream_id, pos + i + 1) for i, s in enumerate(sealed)]
            d.streams.setdefault(stream_id, []).extend(recs)
            d.log.extend(recs)
            for r in recs:
                d.ids[r.event_id_str] = r
            d.heads[stream_id] = Head(recs[-1].version, recs[-1].hash)
            d.notify()
            return AppendOutcome(recs)

    def append_many(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
    ) -> list[AppendOutcome]:
        """Append several batches (and a tracking record) atomically under the lock."""
        d = self._d
        with d.lock:
            self._check("append_many")
            dups = [[_fresh(d.ids[i]) for i in b.event_ids if i in d.ids] for b, _ in batches]
            if any(dups):
                return [AppendOutcome(x, duplicate=bool(x)) for x in dups]
            if tracking is not None:
                check_tracking(tracking, d.tracking.get(tracking.name))
            sealed_all = []
            for b, expected in batches:
                head = d.heads.get(b.stream_id)
                check_expected_version(b.stream_id, expected, head.version if head else 0)
                sealed_all.append(b.seal(head))
            # Nothing is written before every check passed: all or nothing.
            out = []
            for (b, _), sealed in zip(batches, sealed_all, strict=True):
                pos = len(d.log)
                recs = [s.recorded(b.stream_id, pos + i + 1) for i, s in enumerate(sealed)]
                d.streams.setdefault(b.stream_id, []).extend(recs)
                d.log.extend(recs)
                for r in recs:
                    d.ids[r.event_id_str] = r
                d.heads[b.stream_id] = Head(recs[-1].version, recs[-1].hash)
                out.append(AppendOutcome(recs))
            if tracking is not None:
                d.tracking[tracking.name] = tracking.position
            d.notify()
            return out

    def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """Replace the event's payload with ``ref`` in every index, under the lock."""
        d = self._d
        with d.lock:
            self._check(f"erase of stream {stream_id!r} version {version}")
            evs = d.streams.get(stream_id, [])
            old = evs[version - 1] if 0 < version <= len(evs) else None
            if old is None or old.position != position or old.hash != event_hash:
                return EraseOutcome(False)
            new = RecordedEvent(*old[:6], None, *old[7:11], ref)  # type: ignore[call-arg]
            evs[version - 1] = new
            i = bisect.bisect_left(d.log, position, key=lambda e: e.position)
            if i < len(d.log) and d.log[i].position == position:
                d.log[i] = new
            d.ids[old.event_id_str] = new
            refs = 0
            if blob_key:
                refs = sum(
                    1
                    for e in d.log
                    if e.payload_ref is not None
                    and not e.payload_ref.erased
                    and e.payload_ref.key == blob_key
                )
            return EraseOutcome(True, refs)

    def tracked_position(self, name: str) -> int | None:
        """The tracked position of ``name``, or None."""
        with self._d.lock:
            self._check()
            return self._d.tracking.get(name)

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Slice of the stream's list (versions are 1-based list indexes)."""
        with self._d.lock:
            self._check(f"read of stream {stream_id!r}")
            evs = self._d.streams.get(stream_id, [])
            start = max(from_version, 1) - 1
            stop = len(evs) if to_version is None else min(to_version, len(evs))
            if limit is not None:
                stop = min(stop, start + limit)
            chunk = evs[start:stop]
        return map(_fresh, chunk)

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> Iterator[RecordedEvent]:
        """Slice of the global log (filtered by stream id prefix when given)."""
        with self._d.lock:
            self._check("read_all")
            log = self._d.log
            start = bisect.bisect_right(log, after_position, key=lambda e: e.position)
            if stream_prefix:
                want = len(log) if limit is None else limit
                chunk: list[RecordedEvent] = []
                for i in range(start, len(log)):
                    if len(chunk) >= want:
                        break
                    if log[i].stream_id.startswith(stream_prefix):
                        chunk.append(log[i])
            else:
                stop = len(log) if limit is None else min(len(log), start + limit)
                chunk = log[start:stop]
        return map(_fresh, chunk)

    def head(self, stream_id: str) -> Head | None:
        """Current head."""
        with self._d.lock:
            self._check()
            return self._d.heads.get(stream_id)

    def heads(self) -> Iterator[tuple[str, Head]]:
        """All heads, sorted by stream id."""
        with self._d.lock:
            self._check()
            items = sorted(self._d.heads.items())
        return iter(items)

    def last_position(self) -> int:
        """Number of events in the log."""
        with self._d.lock:
            self._check()
            return len(self._d.log)

    def wait_for(self, position: int, timeout: float) -> bool:
        """Block until an event beyond ``position`` exists or ``timeout`` passes."""
        with self._d.cond:
            self._check()
            found = self._d.cond.wait_for(
                lambda: self._closed or len(self._d.log) > position, timeout
            )
            self._check()
            return found

    @property
    def snapshot_table(self) -> dict[tuple[str, str], Any]:
        """Backing dict of the memory snapshot store."""
        return self._d.snapshots

    def snapshot_store(self, event_store: EventStore) -> MemorySnapshotStore:
        """The snapshot store beside these events (``EventStore.snapshots`` asks for it)."""
        from ares_events.stores.snapshots import MemorySnapshotStore

        return MemorySnapshotStore(event_store, self.snapshot_table, self._check)

    def meta_get(self, key: str) -> str | None:
        """A value of the store's metadata (its identity lives there)."""
        with self._d.lock:
            self._check()
            return self._d.meta.get(key)

    def meta_put_if_absent(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless one is there; return the stored value."""
        with self._d.lock:
            self._check()
            return self._d.meta.setdefault(key, value)

    def meta_set(self, key: str, value: str) -> None:
        """Store ``value`` under ``key``, replacing what is there."""
        with self._d.lock:
            self._check()
            self._d.meta[key] = value

    def find_duplicates(self) -> Iterator[tuple[str, Any, Any, int, Any]]:
        """Uniqueness violations (none: this store cannot hold any); for the audit."""
        self._check()
        return iter(())

    def close(self) -> None:
        """End this handle: later calls raise StoreClosed, waiters wake up. Idempotent."""
        with self._d.cond:
            self._closed = True
            self._d.cond.notify_all()
