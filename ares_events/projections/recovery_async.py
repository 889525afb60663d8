"""Folding a stream, verified: replay with a cap, recovery (snapshot first, then the
tail), snapshots and the snapshot policy; one face written, the other generated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial, reduce
from typing import TYPE_CHECKING, Any, TypeVar

from ares_events.core.events import RecordedEvent
from ares_events.core.faces import ASYNC, blocking
from ares_events.core.iterators_async import aclosing_iter, apages
from ares_events.core.snapshots_async import amake_snapshot
from ares_events.core.traced import recovered, replayed, traced
from ares_events.errors import (
    ChainIntegrityError,
    ConfigError,
    InvalidEvent,
    PayloadErased,
    ReplayCapExceeded,
    SnapshotMismatch,
)
from ares_events.integrity.verifier import PAGE, ChainVerifier
from ares_events.integrity.verify_async import achain_start
from ares_events.projections.base import ERASED_REASON, Projection, SkippedEvent, apply_one
from ares_events.projections.results import (
    DEFAULT_MAX_REPLAY,
    RecoveryReport,
    RecoverySource,
    ReplayResult,
)

if ASYNC:
    from ares_events.stores.threaded import async_face, async_snapshots

if TYPE_CHECKING:
    from ares_events.core.snapshot_format import Snapshot
    from ares_events.core.store import EventStore  # as is
    from ares_events.core.store_async import AsyncEventStore

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MAX_REPLAY",
    "AsyncSnapshotter",
    "RecoveryReport",
    "RecoverySource",
    "ReplayResult",
    "arecover",
    "areplay",
    "asnapshot",
]

S = TypeVar("S")


@traced("replay", replayed, activity=True)
async def areplay(
    store: AsyncEventStore | EventStore,
    stream_id: str,
    fold: Callable[[S, RecordedEvent], S],
    initial: S,
    *,
    from_version: int = 1,
    start_hash: bytes | None = None,
    max_replay: int = DEFAULT_MAX_REPLAY,
    strict: bool = False,
    verify: bool = True,
) -> ReplayResult[S]:
    """Fold ``stream_id`` from ``from_version`` through ``fold``, checking the chain.

    Args:
        store: the store (on the asyncio face, a blocking store works too: its calls run
            on worker threads).
        stream_id: the stream to fold.
        fold: ``fold(state, event) -> state``; must be pure.
        initial: the starting state (a snapshot's state when ``from_version > 1``).
        from_version: first version to fold.
        start_hash: hash of version ``from_version - 1`` (a snapshot's ``at_hash``); the
            chain is checked from there. Required when ``from_version > 1`` and verifying.
        max_replay: at most this many events are folded.
        strict: raise instead of reporting when the cap is hit or the chain is broken.
        verify: check the chain and the head (on by default).

    Raises:
        InvalidEvent: a bad ``max_replay``, ``from_version`` or a missing ``start_hash``.
        ReplayCapExceeded: strict mode and the cap was reached before the end.
        ChainIntegrityError: strict mode and the chain or head check found problems.
        StoreUnavailable: the store cannot be reached.
    """
    if ASYNC:
        store = async_face(store)
    else:
        store = blocking(store, "ae.replay", "ae.areplay")
    if type(max_replay) is not int or max_replay < 0:
        raise InvalidEvent("max_replay", f"must be an int >= 0, got {max_replay!r}")
    if type(from_version) is not int or from_version < 1:
        raise InvalidEvent("from_version", f"must be an int >= 1, got {from_version!r}")
    if verify and from_version > 1 and start_hash is None:
        raise InvalidEvent(
            "start_hash",
            f"is required to verify from version {from_version} (the hash of version "
            f"{from_version - 1}, e.g. a snapshot's at_hash)",
            stream_id=stream_id,
        )
    head = await store.head(stream_id)
    head_version = head.version if head and type(head.version) is int else 0
    if from_version == 1 and start_hash is None:
        # The stream's oldest events were retired from the archive: its chain (and the
        # fold) starts after them, from the tombstone's last hash.
        retired = await achain_start(store, stream_id)
        if retired is not None:
            from_version, start_hash = retired[0] + 1, retired[1]
    verifier = None
    if verify:
        verifier = ChainVerifier(
            stream_id, store.chain_key, start_version=from_version - 1, start_hash=start_hash
        )
    state = initial
    n = 0
    last: RecordedEvent | None = None
    capped = False
    start = from_version
    while True:
        progressed = False
        # Read one past the cap to learn whether the cap cut the stream short (no limit
        # past 2**63-1: no stream holds that many).
        events = store.read(stream_id, start, None, min(max_replay - n + 1, 2**63 - 1))
        async with aclosing_iter(apages(events, PAGE)) as each_page:
            async for page in each_page:
                rest: Sequence[RecordedEvent] = page
                while rest:
                    room = max_replay - n
                    if room == 0:
                        capped = True
                        break
                    chunk, rest = rest[:room], rest[room:]
                    if verifier is not None:
                        # Malformed rows (tampering) are reported and never folded.
                        chunk = verifier.check_page(chunk)
                    state = reduce(fold, chunk, state)  # the loop in C
                    if chunk:
                        n += len(chunk)
                        last = chunk[-1]
                        progressed = True
                if capped:
                    break
        version = last.version if last is not None else from_version - 1
        if (
            verifier is None
            or capped
            or head is None
            or type(head.version) is not int  # a malformed head row: check_head says so
            or version <= head.version
        ):
            break
        # A concurrent append moved the head past the one read first. Read the head again;
        # if it moved further still while the events were read, read up to it too, so a
        # stream that is being written is never reported as truncated. Events the head
        # names but the read cannot find stay a finding.
        head = await store.head(stream_id)
        head_version = head.version if head and type(head.version) is int else 0
        if head is None or head_version <= version or not progressed:
            break
        start = version + 1
    if verifier is not None and not capped:
        verifier.check_head(head)
    findings = verifier.findings if verifier is not None else []
    if capped and strict:
        raise ReplayCapExceeded(stream_id, max_replay, version)
    if findings and strict:
        raise ChainIntegrityError(stream_id, findings)
    last_hash = last.hash if last is not None else start_hash
    return ReplayResult(state, version, n, capped, head_version, last_hash, findings)


@traced("recover", recovered, activity=True)
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
    else:
        store = blocking(store, "ae.recover", "ae.arecover")
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
    step = partial(apply_one, projection, strict=not tolerant, skipped=skipped)
    if snap is not None:
        initial, from_version, start_hash = snap.state, snap.at_version + 1, snap.at_hash
    else:
        initial, from_version, start_hash = projection.initial(), 1, None
    res = await areplay(
        store, stream_id, step, initial, from_version=from_version, start_hash=start_hash,
        max_replay=max_replay, strict=strict,
    )  # fmt: skip
    source = RecoverySource.EVENTS if res.replayed else RecoverySource.EMPTY
    if snap is not None:
        source = RecoverySource.SNAPSHOT
    return RecoveryReport(
        stream_id, projection.name, res.state, res.version, source, res.replayed,
        res.head_version, res.truncated, res.capped, list(res.findings),
        snap.at_version if snap else None, ignored, skipped,
    )  # fmt: skip


@traced("snapshot", activity=True)
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
        PayloadErased: the fold skipped an erased payload (unless the projection
            ``accepts_erased``): nothing is saved.
        EventSchemaError: an event fails its schema.
        StoreUnavailable: the store cannot be reached.
    """
    if ASYNC:
        store = async_face(store)
        snapshots = async_snapshots(store, snapshots)
    else:
        store = blocking(store, "ae.snapshot", "ae.asnapshot")
    snaps = snapshots if snapshots is not None else store.snapshots
    cap = max_replay if max_replay is not None else 2**62
    rep = await arecover(store, stream_id, projection, snapshots=snaps, max_replay=cap)
    if rep.findings:
        raise ChainIntegrityError(stream_id, rep.findings)
    erased = [s for s in rep.skipped if s.reason == ERASED_REASON]
    if erased:
        # A fold that stepped over an erased payload is not the stream's state: saved, it
        # would let recovery (a journal's, which refuses such a run) start past the hole.
        raise PayloadErased(stream_id, erased[0].version)
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
        else:
            store = blocking(
                store, "ae.Snapshotter", "ares_events.projections.recovery_async.AsyncSnapshotter"
            )
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
                try:
                    snap = await asnapshot(self.store, stream_id, p, snapshots=self.snapshots)
                except PayloadErased:  # that stream is replayed whole from now on
                    self._last[(stream_id, p.name)] = version
                    continue
                if snap is not None:
                    self._last[(stream_id, p.name)] = snap.at_version
                    n += 1
        self.taken += n
        return n
