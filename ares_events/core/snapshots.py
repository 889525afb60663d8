# Generated from snapshots_async.py by tools/async_to_sync.py: do not edit.
"""The snapshot store: the latest snapshot per (stream, projection), checked against the
stream before it is returned (``store.snapshots``); a wrong snapshot is never returned.

It may import the core's other modules and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ares_events.core.backend import Capability
from ares_events.core.events import RecordedEvent, validate_name
from ares_events.core.iterators import first
from ares_events.core.snapshot_format import (
    Snapshot,
    SnapshotCheck,
    SnapshotInfo,
    check_int,
    row_problem,
    seal_reason,
    snapshot_of_row,
    snapshot_seal,
    state_digest,
    validate_snapshot,
)
from ares_events.errors import ArchiveError, InvalidEvent, SnapshotMismatch, StoreError

if TYPE_CHECKING:
    from ares_events.chain import ChainKey
    from ares_events.core.recorder import SnapshotRows


class Events(Protocol):
    """What the snapshot store reads of its event store (the store itself, typed by
    what is used, so the two modules do not import each other)."""

    chain_key: ChainKey | None

    @property
    def url(self) -> str:
        """The store's URL, redacted."""

    def read(
        self,
        stream_id: str,
        from_version: int = 1,
        to_version: int | None = None,
        limit: int | None = None,
    ) -> Iterator[RecordedEvent]:
        """Events of one stream in version order."""

    def stream_version(self, stream_id: str) -> int:
        """The stream's version from its head row."""


logger = logging.getLogger(__name__)

__all__ = ["Events", "SnapshotStore", "make_snapshot", "snapshot_store_for"]


def _event_at(store: Events, stream_id: str, version: int) -> RecordedEvent | None:
    """The first event of the stream at or after ``version``, or None."""
    return first(store.read(stream_id, from_version=version, limit=1))


class SnapshotStore:
    """Latest snapshot per (stream, projection), in the same database as the events.
    Besides what each method lists, any may raise ``StoreUnavailable`` (the database cannot
    be reached) or ``StoreError`` (the database failed).

    Args:
        store: the event store whose streams the snapshots fold.
        rows: the backend's snapshot table.
    """

    def __init__(self, store: Events, rows: SnapshotRows) -> None:
        self._store = store
        self._rows = rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._store.url!r})"

    def save(self, snapshot: Snapshot) -> Snapshot:
        """Check ``snapshot`` against the stream, seal it and store it, replacing the
        previous snapshot of the same (stream, projection).

        Returns:
            The snapshot as stored (with its seal).

        Raises:
            InvalidEvent: not a :class:`Snapshot`, a bad field, or a state that is not
                canonical JSON or disagrees with ``state_json`` / ``state_digest``.
                Nothing is written.
            SnapshotMismatch: ``at_version`` is beyond the stream or ``at_hash`` is not the
                hash of the event at ``at_version``. Nothing is written.
        """
        validate_snapshot(snapshot)
        reason = self._stream_reason(snapshot)
        if reason is not None:
            raise SnapshotMismatch(snapshot.stream_id, snapshot.projection, reason)
        sealed = replace(snapshot, seal=snapshot_seal(snapshot, self._store.chain_key))
        self._rows.put(sealed)
        logger.debug(
            "saved snapshot of %r for stream %r at version %d",
            snapshot.projection,
            snapshot.stream_id,
            snapshot.at_version,
        )
        return sealed

    def load(
        self,
        stream_id: str,
        projection: str,
        version: int | None = None,
        *,
        verify: bool = True,
    ) -> Snapshot | None:
        """The latest snapshot of ``projection`` for ``stream_id``, or None.

        Args:
            stream_id: the stream.
            projection: the projection's name.
            version: the projection version the caller folds with; a snapshot of another
                version is a mismatch. None accepts any version.
            verify: check the state digest, the seal and ``at_hash`` against the stream
                (default). ``verify=False`` returns the stored snapshot unchecked (for
                inspection).

        Raises:
            InvalidEvent: a bad stream id, projection name or version.
            SnapshotMismatch: the stored snapshot does not match (``reason`` says how:
                projection version, state digest, seal, ``at_hash``, or a stream shorter
                than ``at_version``).
        """
        snap, reason = self._load(stream_id, projection, version, verify=verify)
        if reason is not None:
            raise SnapshotMismatch(stream_id, projection, reason)
        return snap

    def load_checked(
        self, stream_id: str, projection: str, version: int | None = None
    ) -> SnapshotCheck:
        """Load and verify without raising on a mismatch.

        Returns:
            ``(snapshot, None)`` when a verified snapshot exists, ``(None, None)`` when
            none is stored, ``(None, reason)`` when the stored one must be ignored.

        Raises:
            InvalidEvent: a bad stream id, projection name or version.
        """
        snap, reason = self._load(stream_id, projection, version, verify=True)
        if reason is not None:
            logger.debug("snapshot of %r for stream %r ignored: %s", projection, stream_id, reason)
        return SnapshotCheck(snap, reason)  # _load gives no snapshot with a reason

    def check(self, snapshot: Snapshot, version: int | None = None) -> str | None:
        """Why ``snapshot`` must not be used, or None when it matches the stream.

        Checks, in order: the projection version (when ``version`` is given), the state
        digest, that the stream's event at ``at_version`` exists and has ``at_hash``, and
        the seal (when the snapshot has one, and always in a keyed store).

        Raises:
            InvalidEvent: ``snapshot`` is not a :class:`Snapshot` or ``version`` is bad.
        """
        if not isinstance(snapshot, Snapshot):
            raise InvalidEvent("snapshot", f"expected a Snapshot, got {type(snapshot).__name__}")
        if version is not None:
            check_int(version, "version", 0, snapshot.stream_id)
            if snapshot.projection_version != version:
                return f"projection version {snapshot.projection_version} != {version}"
        if state_digest(snapshot.state_json) != snapshot.state_digest:
            return "state digest mismatch"
        reason = self._stream_reason(snapshot)
        return reason or seal_reason(snapshot, self._store.chain_key, stored=False)

    def verify_all(self, stream_id: str | None = None) -> Iterator[tuple[SnapshotInfo, str | None]]:
        """Check every stored snapshot (for audits): ``(info, reason or None)``; an event
        to check that is in a damaged archive segment is a reason, not an ``ArchiveError``."""
        # Listed first: checking reads the stream, which a backend may not do while a
        # listing of its snapshot table is open.
        infos = list(self.list(stream_id))
        for info in infos:
            if info.problem is not None:
                yield info, f"malformed snapshot row: {info.problem}"
                continue
            try:
                _, reason = self._load(info.stream_id, info.projection, None, verify=True)
            except ArchiveError as exc:  # a finding like the others: the audit goes on
                at = info.at_version
                reason = f"the event it seals (version {at}) is in a damaged archive segment: {exc}"
            yield info, reason

    def delete(self, stream_id: str, projection: str | None = None) -> int:
        """Delete the snapshot of ``projection``, or every snapshot of the stream.

        Returns:
            How many snapshots were deleted.

        Raises:
            InvalidEvent: a bad stream id or projection name.
        """
        validate_name(stream_id, "stream_id")
        if projection is not None:
            validate_name(projection, "projection", stream_id=stream_id)
        n = self._rows.remove(stream_id, projection)
        logger.debug("deleted %d snapshot(s) of stream %r", n, stream_id)
        return n

    def list(self, stream_id: str | None = None) -> Iterator[SnapshotInfo]:
        """Every stored snapshot without its state, ordered by stream id then projection.

        Raises:
            InvalidEvent: a bad stream id.
        """
        if stream_id is not None:
            validate_name(stream_id, "stream_id")
        return self._rows.infos(stream_id)

    def close(self) -> None:
        """Nothing to release: the event store owns the connections."""

    def _load(
        self, stream_id: str, projection: str, version: int | None, *, verify: bool
    ) -> tuple[Snapshot | None, str | None]:
        validate_name(stream_id, "stream_id")
        validate_name(projection, "projection", stream_id=stream_id)
        if version is not None:
            check_int(version, "version", 0, stream_id)
        row = self._rows.get(stream_id, projection)
        if row is None:
            return None, None
        problem = row_problem(row)
        if problem is not None:
            return None, f"malformed snapshot row: {problem}"
        pv, _, _, state_json, digest, _, _ = row
        if verify:
            if version is not None and pv != version:
                return None, f"projection version {pv} != {version}"
            if state_digest(state_json) != digest:
                return None, "state digest mismatch"
        try:
            snap = snapshot_of_row(stream_id, projection, row)
            if verify:
                # The stream, then the seal, before decoding: a forged state is never parsed.
                reason = self._stream_reason(snap)
                reason = reason or seal_reason(snap, self._store.chain_key)
                if reason is not None:
                    return None, reason
            snap = replace(snap, state=orjson.loads(state_json))
        except (orjson.JSONDecodeError, ValueError) as exc:
            # Only reachable when the digest was recomputed over garbage, or unverified.
            return None, f"stored snapshot cannot be decoded: {exc}"
        return snap, None

    def _stream_reason(self, snap: Snapshot) -> str | None:
        """Why the stream does not contain ``snap.at_hash`` at ``snap.at_version``."""
        at = snap.at_version
        event = _event_at(self._store, snap.stream_id, at)
        if event is None:
            head = self._store.stream_version(snap.stream_id)
            if head >= at:
                return (
                    f"stream is shorter than at_version {at} (head says version {head}; truncated?)"
                )
            return f"stream is shorter than at_version {at} (stream is at version {head})"
        if event.version != at:
            return f"stream has no event at version {at} (next is {event.version}; deleted?)"
        if event.hash != snap.at_hash:
            return f"at_hash does not match stream at version {at}"
        return None


def make_snapshot(
    store: Events,
    stream_id: str,
    projection_name: str,
    projection_version: int,
    state: Any,
    at_version: int,
) -> Snapshot:
    """Build a snapshot of ``state`` folded up to ``at_version``, reading ``at_hash`` from
    the stream. Nothing is written: pass the result to ``store.snapshots.save()``.

    Raises:
        InvalidEvent: a bad name or version, or a state that is not canonical JSON.
        SnapshotMismatch: the stream has no event at ``at_version``.
        StoreUnavailable: the store cannot be reached.
    """
    validate_name(stream_id, "stream_id")
    validate_name(projection_name, "projection", stream_id=stream_id)
    check_int(at_version, "at_version", 1, stream_id)
    event = _event_at(store, stream_id, at_version)
    if event is None or event.version != at_version:
        version = store.stream_version(stream_id)
        raise SnapshotMismatch(
            stream_id,
            projection_name,
            f"stream is shorter than at_version {at_version} (stream is at version {version})",
        )
    return Snapshot.of(
        stream_id,
        projection_name,
        projection_version=projection_version,
        at_version=at_version,
        at_hash=event.hash,
        state=state,
    )


def snapshot_store_for(store: Any) -> SnapshotStore:
    """The snapshot store beside ``store``'s events (its backend's snapshot table).

    Raises:
        StoreError: the backend has no snapshot table.
    """
    recorder: Any = store.recorder
    if Capability.SNAPSHOTS not in store.capabilities:
        raise StoreError(
            f"store {store.url} has no snapshot store: backend {type(recorder).__name__} "
            "does not declare Capability.SNAPSHOTS"
        )
    return SnapshotStore(store, recorder.snapshot_rows())
