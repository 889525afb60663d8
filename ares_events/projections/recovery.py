"""Snapshot-first recovery: ``ae.recover``, ``ae.snapshot`` and the ``Snapshotter`` policy.

Recovery loads the latest snapshot of the projection (ignored, with the reason in the
report, when its projection version differs, its ``at_hash`` no longer matches the
stream or its state digest is wrong), then folds the tail after ``at_version`` while
checking the chain from ``at_hash`` and comparing the end with the stream head. Cost is
O(tail), not O(stream). The replay cap is honoured and never silent.

Each is written once as steps (:mod:`ares_events.core.sansio`) and driven blocking
(:func:`recover`, :func:`snapshot`) or with asyncio (:func:`arecover`,
:func:`asnapshot`).
"""

from __future__ import annotations

import enum
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ares_events.core.events import RecordedEvent
from ares_events.core.ports import StorePort, port_for
from ares_events.core.sansio import Call, Steps, arun, run
from ares_events.errors import ChainIntegrityError, ConfigError, SnapshotMismatch
from ares_events.integrity.findings import Finding
from ares_events.projections.base import Projection, SkippedEvent, apply_one
from ares_events.projections.replay import DEFAULT_MAX_REPLAY, replay_steps

if TYPE_CHECKING:
    from ares_events.core.snapshots import Snapshot
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore
    from ares_events.integrity.chain import ChainKey

logger = logging.getLogger(__name__)

__all__ = [
    "RecoveryReport",
    "RecoverySource",
    "Snapshotter",
    "arecover",
    "asnapshot",
    "recover",
    "recover_steps",
    "snapshot",
    "snapshot_steps",
]


class RecoverySource(enum.StrEnum):
    """Where the recovered state came from."""

    SNAPSHOT = "snapshot"
    EVENTS = "events"
    EMPTY = "empty"


@dataclass(slots=True)
class RecoveryReport:
    """What :func:`recover` found and rebuilt."""

    stream_id: str
    projection: str
    state: Any
    version: int
    """Stream version the state reflects."""
    source: RecoverySource
    replayed: int
    """Events folded after the snapshot (or from the start)."""
    head_version: int
    truncated: bool
    capped: bool
    findings: list[Finding] = field(default_factory=list)
    snapshot_version: int | None = None
    """``at_version`` of the snapshot used, if any."""
    snapshot_ignored: str | None = None
    """Why a stored snapshot was not used (None when used or when there was none)."""
    skipped: list[SkippedEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the chain checked clean, nothing was capped or skipped."""
        return not self.findings and not self.capped and not self.skipped

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the state included)."""
        return {
            "stream_id": self.stream_id,
            "projection": self.projection,
            "state": self.state,
            "version": self.version,
            "source": str(self.source),
            "replayed": self.replayed,
            "head_version": self.head_version,
            "truncated": self.truncated,
            "capped": self.capped,
            "ok": self.ok,
            "snapshot_version": self.snapshot_version,
            "snapshot_ignored": self.snapshot_ignored,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
        }


def recover(
    store: EventStore,
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
        store: the event store.
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
    steps = recover_steps(
        store.chain_key,
        stream_id,
        projection,
        snapshots=snapshots,
        max_replay=max_replay,
        strict=strict,
        tolerant=tolerant,
    )
    return run(steps, StorePort(store))


async def arecover(
    store: AsyncEventStore,
    stream_id: str,
    projection: Projection,
    *,
    snapshots: Any = None,
    max_replay: int = DEFAULT_MAX_REPLAY,
    strict: bool = False,
    tolerant: bool = False,
) -> RecoveryReport:
    """The asyncio twin of :func:`recover` (the same steps): ``snapshots`` is
    ``store.snapshots`` of the async store, or None to replay only.

    Raises:
        EventSchemaError: an event fails its schema and ``tolerant`` is False.
        ReplayCapExceeded: ``strict`` and the cap was reached.
        ChainIntegrityError: ``strict`` and the chain or head check found problems.
        StoreUnavailable: the store cannot be reached.
    """
    steps = recover_steps(
        store.chain_key,
        stream_id,
        projection,
        snapshots=snapshots,
        max_replay=max_replay,
        strict=strict,
        tolerant=tolerant,
    )
    return await arun(steps, port_for(store))


def recover_steps(
    chain_key: ChainKey | None,
    stream_id: str,
    projection: Projection,
    *,
    snapshots: Any = None,
    max_replay: int = DEFAULT_MAX_REPLAY,
    strict: bool = False,
    tolerant: bool = False,
) -> Steps[RecoveryReport]:
    """:func:`recover` as steps over a store port (:mod:`ares_events.core.ports`)."""
    snap: Snapshot | None = None
    ignored: str | None = None
    if snapshots is not None:
        try:
            snap = yield Call(
                "invoke", snapshots.load, stream_id, projection.name, projection.version
            )
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
    res = yield from replay_steps(
        chain_key,
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


def snapshot(
    store: EventStore,
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
    snaps = snapshots if snapshots is not None else store.snapshots
    steps = snapshot_steps(store.chain_key, stream_id, projection, snaps, max_replay)
    return run(steps, StorePort(store))


async def asnapshot(
    store: AsyncEventStore,
    stream_id: str,
    projection: Projection,
    *,
    snapshots: Any = None,
    max_replay: int | None = None,
) -> Snapshot | None:
    """The asyncio twin of :func:`snapshot` (the same steps).

    Raises:
        ChainIntegrityError: the chain has findings.
        EventSchemaError: an event fails its schema.
        StoreUnavailable: the store cannot be reached.
    """
    snaps = snapshots if snapshots is not None else store.snapshots
    steps = snapshot_steps(store.chain_key, stream_id, projection, snaps, max_replay)
    return await arun(steps, port_for(store))


def snapshot_steps(
    chain_key: ChainKey | None,
    stream_id: str,
    projection: Projection,
    snapshots: Any,
    max_replay: int | None = None,
) -> Steps[Snapshot | None]:
    """:func:`snapshot` as steps over a store port."""
    from ares_events.core.snapshots import make_snapshot_steps

    rep = yield from recover_steps(
        chain_key,
        stream_id,
        projection,
        snapshots=snapshots,
        max_replay=max_replay if max_replay is not None else 2**62,
    )
    if rep.findings:
        raise ChainIntegrityError(stream_id, rep.findings)
    if rep.version == 0:
        return None
    if rep.source is RecoverySource.SNAPSHOT and rep.replayed == 0:
        loaded: Snapshot | None = yield Call(
            "invoke", snapshots.load, stream_id, projection.name, projection.version
        )
        return loaded
    snap = yield from make_snapshot_steps(
        stream_id, projection.name, projection.version, rep.state, rep.version
    )
    yield Call("invoke", snapshots.save, snap)
    logger.debug("snapshot of %s for %r at version %d", projection.name, stream_id, rep.version)
    return snap


class Snapshotter:
    """Policy: write a snapshot every ``every`` events of a stream.

    Call :meth:`after_append` with each append's result (the journal and the projection
    runner do); it snapshots each projection when the stream crosses a multiple of
    ``every``. Over an asyncio store, drive :meth:`after_append_steps` with an async
    port (the ``AsyncJournal`` does).
    """

    def __init__(
        self,
        store: EventStore | AsyncEventStore,
        projections: list[Projection],
        *,
        every: int = 100,
        snapshots: Any = None,
    ) -> None:
        if every <= 0:
            raise ConfigError("every must be a positive number of events")
        self.store = store
        self.projections = list(projections)
        self.every = every
        self.snapshots = snapshots if snapshots is not None else store.snapshots
        self._last: dict[tuple[str, str], int] = {}
        self.taken = 0

    def due(self, stream_id: str, version: int, projection: Projection) -> bool:
        """True when ``version`` is at least ``every`` past the last snapshot (a blocking
        store; asyncio code drives :meth:`after_append_steps`)."""
        return run(self._due_steps(stream_id, version, projection), self._blocking_port())

    def _due_steps(self, stream_id: str, version: int, projection: Projection) -> Steps[bool]:
        key = (stream_id, projection.name)
        last = self._last.get(key)
        if last is None:
            try:
                snap = yield Call(
                    "invoke",
                    functools.partial(self.snapshots.load, verify=False),
                    stream_id,
                    projection.name,
                    projection.version,
                )
            except SnapshotMismatch:
                snap = None
            last = snap.at_version if snap is not None else 0
            self._last[key] = last
        return version // self.every > last // self.every

    def after_append(self, stream_id: str, version: int) -> int:
        """Snapshot every projection that is due; returns how many were written (a
        blocking store; asyncio code drives :meth:`after_append_steps`)."""
        return run(self.after_append_steps(stream_id, version), self._blocking_port())

    def _blocking_port(self) -> StorePort:
        from ares_events.core.store_async import AsyncEventStore

        if isinstance(self.store, AsyncEventStore):
            raise ConfigError(
                "Snapshotter.after_append() needs a blocking store; over an asyncio store, "
                "drive after_append_steps() with its port (AsyncJournal does)"
            )
        return StorePort(self.store)

    def after_append_steps(self, stream_id: str, version: int) -> Steps[int]:
        """:meth:`after_append` as steps over a store port (the store's face)."""
        n = 0
        for p in self.projections:
            if (yield from self._due_steps(stream_id, version, p)):
                snap = yield from snapshot_steps(self.store.chain_key, stream_id, p, self.snapshots)
                if snap is not None:
                    self._last[(stream_id, p.name)] = snap.at_version
                    n += 1
        self.taken += n
        return n
