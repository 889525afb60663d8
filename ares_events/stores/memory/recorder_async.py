"""The memory recorder: :class:`AsyncMemoryRecorder` (one face written, the other generated).

It may import the core, :mod:`ares_events.errors` and :mod:`.data`.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Final

from ares_events.core.backend import (
    AppendOutcome,
    Batch,
    Capability,
    EraseOutcome,
    Head,
    TrackingRecord,
    check_tracking,
)
from ares_events.core.events import (
    ErasedPayloadRef,
    ExpectedVersion,
    RecordedEvent,
    check_expected_version,
)
from ares_events.core.faces import ASYNC
from ares_events.core.snapshot_format import Snapshot, SnapshotInfo, SnapshotRow, info_of, row_of
from ares_events.core.url import StoreURL
from ares_events.errors import ConfigError, StoreClosed
from ares_events.stores.memory.data import MemoryData, data_for, fresh
from ares_events.stores.memory.read_models import MemoryReadModels

__all__ = ["FAIR_EVERY", "AsyncMemoryRecorder", "AsyncMemorySnapshotRows"]

FAIR_EVERY: Final = 256
"""A read yields to the event loop after this many events."""
_OPTIONS: Final = ("create",)


if ASYNC:
    import asyncio

    async def _fair() -> None:
        await asyncio.sleep(0)

    async def _each(items: Iterable[Any], rec: Any = None) -> AsyncIterator[Any]:
        # Once before anything: a task that loops over short reads still lets others run.
        await _fair()
        for i, x in enumerate(items, 1):
            if rec is not None and rec._closed:  # a forgotten read, closed under it
                rec._check("read")
            yield x
            if i % FAIR_EVERY == 0:
                await _fair()

    def _wake(fut: asyncio.Future[None]) -> None:
        if not fut.done():
            fut.set_result(None)

else:

    def _fair() -> None:
        """Nothing to let run on the blocking face."""

    # The blocking face has no event loop to yield to: no counter on its read path.
    def _each(items: Iterable[Any], rec: Any = None) -> Iterator[Any]:
        for x in items:
            if rec is not None and rec._closed:  # a forgotten read, closed under it
                rec._check("read")
            yield x


class AsyncMemoryRecorder:
    """Backend keeping everything in Python lists, guarded by one lock."""

    scheme: ClassVar[tuple[str, ...]] = ("memory",)
    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {
            Capability.GAPLESS_POSITIONS,
            Capability.WAKEUPS,
            Capability.SNAPSHOTS,
            Capability.MULTI_STREAM_APPEND,
            Capability.ERASE,
            Capability.METADATA,
            Capability.DUPLICATE_SCAN,
            Capability.POSITION_SCAN,
            Capability.STREAM_PAGES,
            Capability.READ_MODELS,
        }
    )

    def __init__(self, name: str | None = None, *, create: bool = True) -> None:
        self.name = name
        self._closed = False
        self._d: MemoryData = data_for(name, create=create, where=self.describe())
        if ASYNC:
            self._waiters: set[asyncio.Future[None]] = set()

    @classmethod
    async def open_url(cls, url: StoreURL, **options: Any) -> AsyncMemoryRecorder:
        """``memory://`` or ``memory://NAME``.

        Raises:
            ConfigError: a query parameter or an unknown option (only ``create``).
            StoreNotFound: ``create=False`` and there is no such store.
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

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()!r})"

    def _check(self, action: str | None = None) -> None:
        if self._closed:
            raise StoreClosed(self.describe(), action)

    @contextlib.asynccontextmanager
    async def _locked(self, action: str | None = None) -> AsyncIterator[MemoryData]:
        await _fair()
        with self._d.lock:
            self._check(action)
            yield self._d

    # -- writes ----------------------------------------------------------------------------

    def _insert(self, stream_id: str, sealed: Sequence[Any]) -> list[RecordedEvent]:
        d = self._d
        pos = len(d.log)
        recs = [s.recorded(stream_id, pos + i + 1) for i, s in enumerate(sealed)]
        d.streams.setdefault(stream_id, []).extend(recs)
        d.log.extend(recs)
        for r in recs:
            d.ids[r.event_id_str] = r
        d.heads[stream_id] = Head(recs[-1].version, recs[-1].hash)
        return recs

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append under the store's lock."""
        action = f"append to stream {batch.stream_id!r}"
        (out,) = await self._append([(batch, expected_version)], None, action)
        return out

    async def append_many(
        self, batches: Sequence[tuple[Batch, ExpectedVersion]], tracking: TrackingRecord | None
    ) -> list[AppendOutcome]:
        """Append several batches (and a tracking record) atomically under the lock."""
        return await self._append(batches, tracking, "append_many")

    async def _append(
        self,
        batches: Sequence[tuple[Batch, ExpectedVersion]],
        tracking: TrackingRecord | None,
        action: str,
    ) -> list[AppendOutcome]:
        await _fair()
        d = self._d
        with d.lock:
            self._check(action)
            dups = [[fresh(d.ids[i]) for i in b.event_ids if i in d.ids] for b, _ in batches]
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
            out = [
                AppendOutcome(self._insert(b.stream_id, sealed))
                for (b, _), sealed in zip(batches, sealed_all, strict=True)
            ]
            if tracking is not None:
                d.tracking[tracking.name] = tracking.position
            d.cond.notify_all()  # blocking waiters
            for wake in list(d.watchers):  # asyncio waiters
                wake()
            return out

    async def erase(
        self,
        stream_id: str,
        version: int,
        position: int,
        event_hash: bytes,
        ref: ErasedPayloadRef,
        blob_key: str | None = None,
    ) -> EraseOutcome:
        """Replace the event's payload with ``ref`` in every index, under the lock."""
        async with self._locked(f"erase of stream {stream_id!r} version {version}") as d:
            evs = d.streams.get(stream_id, [])
            old = evs[version - 1] if 0 < version <= len(evs) else None
            if old is None or old.position != position or old.hash != event_hash:
                return EraseOutcome(False)
            if old.payload_ref is not None and old.payload_ref.erased:
                return EraseOutcome(False)  # erased already (a concurrent erasure won)
            new = RecordedEvent(*old[:6], None, *old[7:11], ref)  # type: ignore[call-arg]
            evs[version - 1] = new
            i = bisect.bisect_left(d.log, position, key=lambda e: e.position)
            if i < len(d.log) and d.log[i].position == position:
                d.log[i] = new
            d.ids[old.event_id_str] = new
            live = (e.payload_ref for e in d.log if e.payload_ref and not e.payload_ref.erased)
            return EraseOutcome(True, sum(r.key == blob_key for r in live) if blob_key else 0)

    async def tracked_position(self, name: str) -> int | None:
        async with self._locked() as d:
            return d.tracking.get(name)

    # -- reads -----------------------------------------------------------------------------

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """A slice of the stream (versions are 1-based list indexes), taken now."""
        with self._d.lock:
            self._check(f"read of stream {stream_id!r}")
            evs = self._d.streams.get(stream_id, [])
            start = max(from_version, 1) - 1
            stop = len(evs) if to_version is None else min(to_version, len(evs))
            if limit is not None:
                stop = min(stop, start + limit)
            chunk = evs[start:stop]
        return _each(map(fresh, chunk), self)

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> AsyncIterator[RecordedEvent]:
        """A slice of the global log (of the streams under ``stream_prefix``), taken now."""
        with self._d.lock:
            self._check("read_all")
            log = self._d.log
            start = bisect.bisect_right(log, after_position, key=lambda e: e.position)
            if stream_prefix:
                rest = map(log.__getitem__, range(start, len(log)))  # no copy, no skip
                hits = (e for e in rest if e.stream_id.startswith(stream_prefix))
                chunk = list(itertools.islice(hits, limit))
            else:
                chunk = log[start : None if limit is None else start + limit]
        return _each(map(fresh, chunk), self)

    def positions(self, after_position: int) -> AsyncIterator[tuple[Any, Any, Any]]:
        """``(position, stream_id, version)`` of the global log after ``after_position``,
        taken now; for the audit."""
        with self._d.lock:
            self._check("positions")
            log = self._d.log
            start = bisect.bisect_right(log, after_position, key=lambda e: e.position)
            rows = [(e[2], e[0], e[1]) for e in log[start:]]
        return _each(rows)

    async def head(self, stream_id: str) -> Head | None:
        async with self._locked() as d:
            return d.heads.get(stream_id)

    def heads(self) -> AsyncIterator[tuple[str, Head]]:
        """All heads, sorted by stream id."""
        with self._d.lock:
            self._check()
            items = sorted(self._d.heads.items())
        return _each(items)

    async def heads_page(
        self, after: str, limit: int, prefix: str | None
    ) -> list[tuple[str, Head]]:
        """One page of heads in stream id order (a partial sort: O(n log limit))."""
        async with self._locked() as d:
            heads = d.heads
            ids = [
                sid for sid in heads if sid > after and (prefix is None or sid.startswith(prefix))
            ]
            return [(sid, heads[sid]) for sid in heapq.nsmallest(limit, ids)]

    async def last_position(self) -> int:
        """Number of events in the log."""
        async with self._locked() as d:
            return len(d.log)

    async def wait_for(self, position: int, timeout: float) -> bool:
        """Wait until an event beyond ``position`` exists or ``timeout`` passes; woken by
        appends of either face.

        Raises:
            StoreClosed: this handle is closed (also while waiting).
        """
        if ASYNC:
            await _fair()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + max(timeout, 0.0)
            data = self._d
            while True:
                self._check()
                fut: asyncio.Future[None] = loop.create_future()

                def wake(f: asyncio.Future[None] = fut) -> None:
                    # Runs in the appender's thread; a loop that is gone has no waiter left.
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(_wake, f)

                with data.lock:
                    data.watchers.add(wake)
                self._waiters.add(fut)
                try:
                    # Checked after registering: an append in between still wakes us.
                    with data.lock:
                        if len(data.log) > position:
                            return True
                    left = deadline - loop.time()
                    if left <= 0:
                        return False
                    # asyncio.timeout, not wait_for: wait_for can swallow a cancellation
                    # that races with the future's completion (Python < 3.12).
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await fut
                finally:
                    self._waiters.discard(fut)
                    with data.lock:
                        data.watchers.discard(wake)
        else:
            with self._d.cond:
                self._check()
                found = self._d.cond.wait_for(
                    lambda: self._closed or len(self._d.log) > position, timeout
                )
                self._check()
                return found

    # -- metadata, snapshots, scans --------------------------------------------------------

    async def meta_get(self, key: str) -> str | None:
        """A value of the store's metadata (its identity lives there)."""
        async with self._locked() as d:
            return d.meta.get(key)

    async def meta_put_if_absent(self, key: str, value: str) -> str:
        async with self._locked() as d:
            return d.meta.setdefault(key, value)

    async def meta_set(self, key: str, value: str) -> None:
        async with self._locked() as d:
            d.meta[key] = value

    def find_duplicates(self) -> AsyncIterator[tuple[str, Any, Any, int, Any]]:
        """Uniqueness violations (none: this store cannot hold any); for the audit."""
        self._check()
        return _each(())

    @property
    def snapshot_table(self) -> dict[tuple[str, str], Any]:
        """The snapshot table: ``(stream_id, projection)`` -> stored row."""
        return self._d.snapshots

    def snapshot_rows(self) -> AsyncMemorySnapshotRows:
        """The snapshot table beside these events (shared by every handle of the store)."""
        return AsyncMemorySnapshotRows(self._d.snapshots, self._check)

    def read_models(self) -> MemoryReadModels:
        """The read models beside these events (shared by every handle of the store)."""
        return self._d.read_models

    async def close(self) -> None:
        """End this handle: later calls raise StoreClosed, waiters wake up. Idempotent."""
        with self._d.cond:
            self._closed = True
            self._d.cond.notify_all()
        if ASYNC:
            for fut in list(self._waiters):
                _wake(fut)


class AsyncMemorySnapshotRows:
    """Snapshot rows in a dict (the same row the SQL backends store):
    :class:`~ares_events.core.recorder_async.AsyncSnapshotRows`."""

    def __init__(self, table: dict[tuple[str, str], SnapshotRow], check: Any) -> None:
        self._table = table
        self._check = check

    async def put(self, snap: Snapshot) -> None:
        await _fair()
        self._check()
        self._table[(snap.stream_id, snap.projection)] = row_of(snap)

    async def get(self, stream_id: str, projection: str) -> SnapshotRow | None:
        await _fair()
        self._check()
        return self._table.get((stream_id, projection))

    async def remove(self, stream_id: str, projection: str | None) -> int:
        await _fair()
        self._check()
        if projection is not None:
            return 1 if self._table.pop((stream_id, projection), None) is not None else 0
        keys = [k for k in builtins.list(self._table) if k[0] == stream_id]
        return sum(1 for k in keys if self._table.pop(k, None) is not None)

    def infos(self, stream_id: str | None) -> AsyncIterator[SnapshotInfo]:
        self._check()
        items = sorted(
            (k, v)
            for k, v in builtins.list(self._table.items())
            if stream_id is None or k[0] == stream_id
        )
        return _each(
            info_of((sid, proj, pv, at_v, at_hash, len(state), digest, created))
            for (sid, proj), (pv, at_v, at_hash, state, digest, created, _) in items
        )
