"""Snapshot-first recovery: ``ae.arecover``, ``ae.asnapshot`` and the snapshot policy
(``ae.recover``, ``ae.snapshot`` and ``ae.Snapshotter`` are generated from this module).

Recovery loads the latest snapshot of the projection (ignored, with the reason in the
report, when its projection version differs, its ``at_hash`` no longer matches the
stream, its seal fails or its state digest is wrong), then folds the tail after
``at_version`` while checking the chain from ``at_hash`` and comparing the end with the
stream head. Cost is O(tail), not O(stream). The replay cap is honoured and never silent.

It may import the core, the stores, integrity and this package's other modules.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ares_events.core.events import RecordedEvent
from ares_events.core.faces import ASYNC
from ares_events.core.snapshots_async import amake_snapshot
from ares_events.errors import ChainIntegrityError, ConfigError, SnapshotMismatch
from ares_events.projections.base import Projection, SkippedEvent, apply_one
from ares_events.projections.replay_async import areplay
from ares_events.projections.results import DEFAULT_MAX_REPLAY, RecoveryReport, RecoverySource

if ASYNC:
    from ares_events.stores.threaded import async_face, async_snapshots

if TYPE_CHECKING:
    from ares_events.core.snapshot_format import Snapshot
    from ares_events.core.store import EventStore  # as is
    from ares_events.core.store_async import AsyncEventStore

logger = logging.getLogger(__name__)

__all__ = [
    "AsyncSnapshotter",
    "RecoveryReport",
    "RecoverySource",
    "arecover",
    "asnapshot",
]


async def arecover(
    store: AsyncEventStore | EventStore,
    stream_id: str,
    projection: Projection,
    *,
    snapshots: Any = None,
    max_replay: int = DEFAULT_MAX_REPLAY,
    strict: bool = False,
    tolerant: bool = False,
) -> RecoveryReport:
    """Rebuild ``projection``'s state of ``stream_id``: snapshot first, then the tail.

    Args:
        store: the event store (on the asyncio face, a blocking store works too).
        stream_id: the stream (an agent or a run).
        projection: the fold to rebuild.
        snapshots: a snapshot store (``store.snapshots``), or None to replay only.
        max_replay: fold at most this many events (reported as ``capped``).
        strict: raise instead of reporting when the cap is hit or the chain is broken.
        tolerant: skip (and list) events that fail their schema instead of raising.

    Raises:
        EventSchemaError: an event fails its schema and ``tolerant`` is False.
        ReplayCapExceeded: ``strict`` and the cap was reached.
        ChainIntegrityError: ``strict`` and the chain or head check found problems.
        StoreUnavailable: the store cannot be reached.
    """
    if ASYNC:
        store = async_face(store)
        snapshots = async_snapshots(store, snapshots)
    snap: Snapshot | None = None
    ignored: str | None = None
    if snapshots is not None:
        try:
            snap = await snapshots.load(stream_id, projection.name, projection.version)
        except SnapshotMismatch as exc:
            logger.warning(
                "ignoring snapshot of %s for %r: %s", projection.name, stream_id, exc.reason
            )
            ignored = exc.reason
    skipped: list[SkippedEvent] = []
    strict_schema = not tolerant

    def step(state: Any, event: RecordedEvent) -> Any:
        return apply_one(projection, state, event, strict=strict_schema, skipped=skipped)

    if snap is not None:
        initial, from_version, start_hash = snap.state, snap.at_version + 1, snap.at_hash
    else:
        initial, from_version, start_hash = projection.initial(), 1, None
    res = await areplay(
        store,
        stream_id,
        step,
        initial,
        from_version=from_version,
        start_hash=start_hash,
        max_replay=max_replay,
        strict=strict,
    )
    if snap is not None:
        source = RecoverySource.SNAPSHOT
    elif res.replayed:
        source = RecoverySource.EVENTS
    else:
        source = RecoverySource.EMPTY
    return RecoveryReport(
        stream_id,
        projection.name,
        res.state,
        res.version,
        source,
        res.replayed,
        res.head_version,
        res.truncated,
        res.capped,
        list(res.findings),
        snap.at_version if snap else None,
        ignored,
        skipped,
    )


async def asnapshot(
    store: AsyncEventStore | EventStore,
    stream_id: str,
    projection: Projection,
    *,
    snapshots: Any = None,
    max_replay: int | None = None,
) -> Snapshot | None:
    """Fold ``stream_id`` (from its latest good snapshot) and save a snapshot now.

    Returns:
        The saved snapshot, or None when the stream is empty.

    Raises:
        ChainIntegrityError: the chain has findings (a snapshot of a broken chain would
            launder it).
        EventSchemaError: an event fails its schema.
        StoreUnavailable: the store cannot be reached.
    """
    if ASYNC:
        store = async_face(store)
        snapshots = async_snapshots(store, snapshots)
    snaps = snapshots if snapshots is not None else store.snapshots
    rep = await arecover(
        store,
        stream_id,
        projection,
        snapshots=snaps,
        max_replay=max_replay if max_replay is not None else 2**62,
    )
    if rep.findings:
        raise ChainIntegrityError(stream_id, rep.findings)
    if rep.version == 0:
        return None
    if rep.source is RecoverySource.SNAPSHOT and rep.replayed == 0:
        loaded: Snapshot | None = await snaps.load(stream_id, projection.name, projection.version)
        return loaded
    snap = await amake_snapshot(
        store, stream_id, projection.name, projection.version, rep.state, rep.version
    )
    await snaps.save(snap)
    logger.debug("snapshot of %s for %r at version %d", projection.name, stream_id, rep.version)
    return snap


class AsyncSnapshotter:
    """Policy: write a snapshot every ``every`` events of a stream.

    Call :meth:`after_append` with each append's stream and version (the journal and the
    projection runner do); it snapshots each projection when the stream crosses a
    multiple of ``every``.
    """

    def __init__(
        self,
        store: AsyncEventStore | EventStore,
        projections: list[Projection],
        *,
        every: int = 100,
        snapshots: Any = None,
    ) -> None:
        if every <= 0:
            raise ConfigError("every must be a positive number of events")
        if ASYNC:
            store = async_face(store)
            snapshots = async_snapshots(store, snapshots)
        self.store = store
        self.projections = list(projections)
        self.every = every
        self.snapshots = snapshots if snapshots is not None else store.snapshots
        self._last: dict[tuple[str, str], int] = {}
        self.taken = 0

    async def due(self, stream_id: str, version: int, projection: Projection) -> bool:
        """True when ``version`` is at least ``every`` past the last snapshot."""
        key = (stream_id, projection.name)
        last = self._last.get(key)
        if last is None:
            try:
                snap = await self.snapshots.load(
                    stream_id, projection.name, projection.version, verify=False
                )
            except SnapshotMismatch:
                snap = None
            last = snap.at_version if snap is not None else 0
            self._last[key] = last
        return version // self.every > last // self.every

    async def after_append(self, stream_id: str, version: int) -> int:
        """Snapshot every projection that is due; returns how many were written."""
        n = 0
        for p in self.projections:
            if await self.due(stream_id, version, p):
                snap = await asnapshot(self.store, stream_id, p, snapshots=self.snapshots)
                if snap is not None:
                    self._last[(stream_id, p.name)] = snap.at_version
                    n += 1
        self.taken += n
        return n
