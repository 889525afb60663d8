"""Snapshots, backend-independent: the value types and the verification every store shares.

A snapshot is a cache of a fold, never the truth. It records the stream, the projection's
name and version, ``at_version`` (the last event folded), ``at_hash`` (that event's hash),
the state as canonical JSON and ``state_digest = blake3(state)``. One snapshot is kept per
(stream, projection): saving replaces the previous one (an UPSERT; last write wins).

:meth:`SnapshotStore.load` checks a snapshot before returning it: the projection version
(when asked), the state digest, and that ``at_hash`` is still the hash of the stream's
event at ``at_version``. Anything else raises :class:`~ares_events.errors.SnapshotMismatch`
with the reason; :meth:`SnapshotStore.load_checked` returns the reason instead, so
recovery can report why a snapshot was ignored. A wrong snapshot is never returned.

Every stored snapshot also carries a *seal* over everything recovery trusts: stream,
projection and its version, ``at_version``, ``at_hash``, the state digest and the time
(:func:`snapshot_seal`). With a chain key the seal is a keyed MAC (blake3 keyed with a
subkey derived from the chain key), so whoever can write the database but lacks the key
cannot forge a snapshot that recovery accepts: a state rewritten with its digest
recomputed, or a snapshot pointed at an earlier ``at_version`` so its tail would be folded
twice, fails the seal and is ignored (the stream is replayed, and the report says why).
Without a chain key the seal is a plain digest: it catches corruption, not forgery
(docs/security.md says exactly what each mode protects). A keyed store ignores snapshots
without a seal (written before seals existed); an unkeyed one accepts them.

Where snapshots are stored is the backend's business: :func:`snapshot_store_for` (what
``EventStore.snapshots`` uses) asks the backend recorder, under any wrapper, for its
``snapshot_store(event_store)``. The built-in memory, SQLite and PostgreSQL stores
(:mod:`ares_events.stores.snapshots`) subclass :class:`_BaseSnapshotStore`, which holds
the checks, and only move rows; a third-party recorder provides its own the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, runtime_checkable

import blake3
import orjson

from ares_events.core.events import format_at, parse_at, validate_name
from ares_events.core.sansio import Call, Steps, run
from ares_events.errors import InvalidEvent, SnapshotMismatch, StoreError
from ares_events.integrity.chain import ChainKey, canonical_json

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = [
    "Snapshot",
    "SnapshotCheck",
    "SnapshotInfo",
    "SnapshotStore",
    "make_snapshot",
    "make_snapshot_steps",
    "snapshot_seal",
    "snapshot_store_for",
    "state_digest",
]

HASH_SIZE: Final = 32

# -- value objects --------------------------------------------------------------------------


def state_digest(state_json: bytes) -> bytes:
    """``blake3(canonical_json(state))``: 32 bytes, never keyed."""
    return blake3.blake3(state_json).digest()


_SEAL_PREFIX: Final = b"ares-events/snapshot-seal/v1\x00"


def snapshot_seal(snap: Snapshot, key: ChainKey | None) -> bytes:
    """The seal of ``snap``: a MAC under ``key`` (keyed store) or a plain digest over
    canonical JSON of every field recovery trusts (see the module docstring)."""
    record = canonical_json(
        {
            "stream": snap.stream_id,
            "projection": snap.projection,
            "projection_version": snap.projection_version,
            "at_version": snap.at_version,
            "at_hash": bytes(snap.at_hash).hex(),
            "state": bytes(snap.state_digest).hex(),
            "created_at": format_at(snap.created_at),
        },
        field="snapshot",
    )
    if key is None:
        return blake3.blake3(_SEAL_PREFIX + record).digest()
    return key.mac("snapshot seal", record)


@dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """The state of one projection folded over a stream up to ``at_version``.

    Build one with :meth:`Snapshot.of` or :func:`make_snapshot`; both encode the state and
    compute its digest. The ``repr`` never shows the state (it can be large).

    Attributes:
        stream_id: the stream folded.
        projection: the projection's name.
        projection_version: the projection's version (a snapshot of another version is
            ignored by recovery).
        at_version: the version of the last event folded (>= 1).
        at_hash: the hash of the stream's event at ``at_version`` (32 bytes).
        state: the folded state, a JSON value.
        state_json: ``canonical_json(state)``, exactly as stored and digested.
        state_digest: ``blake3(state_json)`` (32 bytes).
        created_at: when the snapshot was made (aware, UTC, microsecond precision).
        seal: set by the snapshot store when it saves or loads the snapshot
            (:func:`snapshot_seal`); None on a snapshot not yet saved.
    """

    stream_id: str
    projection: str
    projection_version: int
    at_version: int
    at_hash: bytes
    state: Any = field(hash=False)
    state_json: bytes
    state_digest: bytes
    created_at: datetime
    seal: bytes | None = field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        stream_id: str,
        projection: str,
        *,
        projection_version: int,
        at_version: int,
        at_hash: bytes,
        state: Any,
        created_at: datetime | None = None,
    ) -> Snapshot:
        """Encode ``state`` and build a snapshot (nothing is read or written).

        Raises:
            InvalidEvent: a bad name, version or hash, or a state that is not canonical
                JSON (names the path inside the state).
        """
        validate_name(stream_id, "stream_id")
        validate_name(projection, "projection", stream_id=stream_id)
        _check_int(projection_version, "projection_version", 0, stream_id)
        _check_int(at_version, "at_version", 1, stream_id)
        _check_hash(at_hash, "at_hash", stream_id)
        try:
            state_json = canonical_json(state, field="state")
        except InvalidEvent as exc:
            raise InvalidEvent(exc.field, exc.problem, stream_id=stream_id) from None
        return cls(
            stream_id=stream_id,
            projection=projection,
            projection_version=projection_version,
            at_version=at_version,
            at_hash=bytes(at_hash),
            state=state,
            state_json=state_json,
            state_digest=state_digest(state_json),
            created_at=_normalize_time(created_at, stream_id),
        )

    @property
    def state_size(self) -> int:
        """Length of the stored state in bytes."""
        return len(self.state_json)

    def info(self) -> SnapshotInfo:
        """The snapshot's description without its state."""
        return SnapshotInfo(
            stream_id=self.stream_id,
            projection=self.projection,
            projection_version=self.projection_version,
            at_version=self.at_version,
            at_hash=self.at_hash,
            state_digest=self.state_digest,
            state_size=len(self.state_json),
            created_at=self.created_at,
        )

    def __repr__(self) -> str:
        return (
            f"Snapshot(stream_id={self.stream_id!r}, projection={self.projection!r}, "
            f"projection_version={self.projection_version}, at_version={self.at_version}, "
            f"at_hash={self.at_hash.hex()[:16]}…, state_size={len(self.state_json)})"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class SnapshotInfo:
    """A stored snapshot described without its state (for listings and the CLI)."""

    stream_id: str
    projection: str
    projection_version: int
    at_version: int
    at_hash: bytes
    state_digest: bytes
    state_size: int
    created_at: datetime
    problem: str | None = None
    """Why the stored row could not be read as a snapshot (a malformed row), else None."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (digests in hex, time as ``YYYY-MM-DDTHH:MM:SS.ffffffZ``)."""
        return {
            "stream_id": self.stream_id,
            "projection": self.projection,
            "projection_version": self.projection_version,
            "at_version": self.at_version,
            "at_hash": self.at_hash.hex(),
            "state_digest": self.state_digest.hex(),
            "state_size": self.state_size,
            "created_at": format_at(self.created_at),
            **({"problem": self.problem} if self.problem else {}),
        }


class SnapshotCheck(NamedTuple):
    """Outcome of :meth:`SnapshotStore.load_checked`; unpacks as ``(snapshot, reason)``.

    ``(snapshot, None)``: a verified snapshot. ``(None, None)``: there is none.
    ``(None, reason)``: one is stored but must be ignored, and ``reason`` says why.
    """

    snapshot: Snapshot | None
    reason: str | None


@runtime_checkable
class SnapshotStore(Protocol):
    """Latest snapshot per (stream, projection), in the same database as the events."""

    def save(self, snapshot: Snapshot) -> Snapshot:
        """Check ``snapshot`` against the stream and store it, replacing the previous one."""
        ...

    def load(
        self,
        stream_id: str,
        projection: str,
        version: int | None = None,
        *,
        verify: bool = True,
    ) -> Snapshot | None:
        """The latest snapshot, verified, or None when there is none."""
        ...

    def load_checked(
        self, stream_id: str, projection: str, version: int | None = None
    ) -> SnapshotCheck:
        """Like :meth:`load`, returning the reason instead of raising."""
        ...

    def check(self, snapshot: Snapshot, version: int | None = None) -> str | None:
        """Why ``snapshot`` must not be used, or None when it matches the stream."""
        ...

    def verify_all(self, stream_id: str | None = None) -> Iterator[tuple[SnapshotInfo, str | None]]:
        """Check every stored snapshot: ``(info, reason or None)``."""
        ...

    def delete(self, stream_id: str, projection: str | None = None) -> int:
        """Delete one snapshot, or every snapshot of the stream; returns how many."""
        ...

    def list(self, stream_id: str | None = None) -> Iterator[SnapshotInfo]:
        """Every stored snapshot (without state), ordered by stream and projection."""
        ...

    def close(self) -> None:
        """Release resources (the event store owns the connections)."""
        ...


# -- shared core ---------------------------------------------------------------------------

# A stored row: projection_version, at_version, at_hash, state, state_digest, created_at,
# seal (None in rows written before seals existed). Backends return column values as the
# database holds them; _load checks their types (a tampered row is a reason, not a crash).
_Row = tuple[Any, Any, Any, Any, Any, Any, Any]


class _SnapshotLogic:
    """The checks every snapshot store shares, blocking or asyncio, written once as
    :mod:`~ares_events.core.sansio` steps. Port calls: ``get_row(stream_id, projection)``,
    ``put_row(snapshot)``, ``read_at(stream_id, version)`` (the first event at or after
    ``version``, or None) and ``stream_version(stream_id)``."""

    _store: Any

    def _save_steps(self, snapshot: Snapshot) -> Steps[Snapshot]:
        _validate(snapshot)
        reason = yield from self._stream_reason_steps(snapshot)
        if reason is not None:
            raise SnapshotMismatch(snapshot.stream_id, snapshot.projection, reason)
        sealed = replace(snapshot, seal=snapshot_seal(snapshot, self._store.chain_key))
        yield Call("put_row", sealed)
        logger.debug(
            "saved snapshot of %r for stream %r at version %d",
            snapshot.projection,
            snapshot.stream_id,
            snapshot.at_version,
        )
        return sealed

    def _check_steps(self, snapshot: Snapshot, version: int | None) -> Steps[str | None]:
        if not isinstance(snapshot, Snapshot):
            raise InvalidEvent("snapshot", f"expected a Snapshot, got {type(snapshot).__name__}")
        if version is not None:
            _check_int(version, "version", 0, snapshot.stream_id)
            if snapshot.projection_version != version:
                return f"projection version {snapshot.projection_version} != {version}"
        if state_digest(snapshot.state_json) != snapshot.state_digest:
            return "state digest mismatch"
        reason = yield from self._stream_reason_steps(snapshot)
        return reason or self._seal_reason(snapshot)

    def _load_steps(
        self, stream_id: str, projection: str, version: int | None, *, verify: bool
    ) -> Steps[tuple[Snapshot | None, str | None]]:
        validate_name(stream_id, "stream_id")
        validate_name(projection, "projection", stream_id=stream_id)
        if version is not None:
            _check_int(version, "version", 0, stream_id)
        row = yield Call("get_row", stream_id, projection)
        if row is None:
            return None, None
        pv, at_version, at_hash, state_json, digest, created, seal = row
        problem = _row_problem(row)
        if problem is not None:
            return None, f"malformed snapshot row: {problem}"
        if verify:
            if version is not None and pv != version:
                return None, f"projection version {pv} != {version}"
            if state_digest(state_json) != digest:
                return None, "state digest mismatch"
        try:
            created_at = parse_at(created)
            snap = Snapshot(
                stream_id=stream_id,
                projection=projection,
                projection_version=pv,
                at_version=at_version,
                at_hash=bytes(at_hash),
                state=None,
                state_json=bytes(state_json),
                state_digest=bytes(digest),
                created_at=created_at,
                seal=None if seal is None else bytes(seal),
            )
            if verify:
                # The stream, then the seal, before decoding: a forged state is never parsed.
                reason = yield from self._stream_reason_steps(snap)
                reason = reason or self._seal_reason(snap)
                if reason is not None:
                    return None, reason
            snap = replace(snap, state=orjson.loads(state_json))
        except (orjson.JSONDecodeError, ValueError) as exc:
            # Only reachable when the digest was recomputed over garbage, or unverified.
            return None, f"stored snapshot cannot be decoded: {exc}"
        return snap, None

    def _seal_reason(self, snap: Snapshot) -> str | None:
        """Why ``snap``'s seal does not hold (None: it holds, or an unkeyed store's snapshot
        predates seals)."""
        key = self._store.chain_key
        if snap.seal is None:
            if key is None:
                return None
            return (
                "snapshot is not sealed with the store's chain key (written before seals "
                "existed, or by someone without the key)"
            )
        if snap.seal != snapshot_seal(snap, key):
            if key is None:
                return "snapshot seal mismatch (a field was altered)"
            return (
                "snapshot seal does not verify under the store's chain key (forged, or "
                "written under another key)"
            )
        return None

    def _stream_reason_steps(self, snap: Snapshot) -> Steps[str | None]:
        """Why the stream does not contain ``snap.at_hash`` at ``snap.at_version``."""
        at = snap.at_version
        event = yield Call("read_at", snap.stream_id, at)
        if event is None:
            head = yield Call("stream_version", snap.stream_id)
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


class _SyncPort:
    """A blocking snapshot store and its event store as the port of the steps."""

    __slots__ = ("_owner",)

    def __init__(self, owner: _BaseSnapshotStore) -> None:
        self._owner = owner

    def get_row(self, stream_id: str, projection: str) -> _Row | None:
        return self._owner._get(stream_id, projection)

    def put_row(self, snap: Snapshot) -> None:
        self._owner._put(snap)

    def read_at(self, stream_id: str, version: int) -> Any:
        return next(iter(self._owner._store.read(stream_id, from_version=version, limit=1)), None)

    def stream_version(self, stream_id: str) -> int:
        return int(self._owner._store.stream_version(stream_id))


class _BaseSnapshotStore(_SnapshotLogic):
    """The blocking snapshot store: the shared checks over row primitives that
    subclasses implement (``_put``, ``_get``, ``_remove``, ``_infos``)."""

    def __init__(self, store: EventStore) -> None:
        self._store = store

    # backend primitives -------------------------------------------------------------------

    def _put(self, snap: Snapshot) -> None:
        raise NotImplementedError

    def _get(self, stream_id: str, projection: str) -> _Row | None:
        raise NotImplementedError

    def _remove(self, stream_id: str, projection: str | None) -> int:
        raise NotImplementedError

    def _infos(self, stream_id: str | None) -> Iterator[SnapshotInfo]:
        raise NotImplementedError

    # public API ---------------------------------------------------------------------------

    def save(self, snapshot: Snapshot) -> Snapshot:
        """Check ``snapshot`` against the stream and store it, replacing the previous
        snapshot of the same (stream, projection).

        Returns:
            The snapshot as stored.

        Raises:
            InvalidEvent: not a :class:`Snapshot`, a bad field, or a state that is not
                canonical JSON or disagrees with ``state_json`` / ``state_digest``.
                Nothing is written.
            SnapshotMismatch: ``at_version`` is beyond the stream or ``at_hash`` is not the
                hash of the event at ``at_version``. Nothing is written.
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
        """
        return run(self._save_steps(snapshot), _SyncPort(self))

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
            verify: check the state digest and ``at_hash`` against the stream (default).
                ``verify=False`` returns the stored snapshot unchecked (for inspection).

        Raises:
            InvalidEvent: a bad stream id, projection name or version.
            SnapshotMismatch: the stored snapshot does not match (``reason`` says how:
                projection version, state digest, ``at_hash``, or a stream shorter than
                ``at_version``).
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
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
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
        """
        snap, reason = self._load(stream_id, projection, version, verify=True)
        return _checked(stream_id, projection, snap, reason)

    def check(self, snapshot: Snapshot, version: int | None = None) -> str | None:
        """Why ``snapshot`` must not be used, or None when it matches the stream.

        Checks, in order: the projection version (when ``version`` is given), the state
        digest, the seal (when the snapshot has one, and always in a keyed store), and
        that the stream's event at ``at_version`` exists and has ``at_hash``.

        Raises:
            InvalidEvent: ``snapshot`` is not a :class:`Snapshot` or ``version`` is bad.
            StoreUnavailable: the database cannot be reached.
        """
        return run(self._check_steps(snapshot, version), _SyncPort(self))

    def verify_all(self, stream_id: str | None = None) -> Iterator[tuple[SnapshotInfo, str | None]]:
        """Check every stored snapshot (for audits): ``(info, reason or None)``.

        Raises:
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
        """
        for info in self.list(stream_id):
            if info.problem is not None:
                yield info, f"malformed snapshot row: {info.problem}"
                continue
            _, reason = self._load(info.stream_id, info.projection, None, verify=True)
            yield info, reason

    def delete(self, stream_id: str, projection: str | None = None) -> int:
        """Delete the snapshot of ``projection``, or every snapshot of the stream.

        Returns:
            How many snapshots were deleted.

        Raises:
            InvalidEvent: a bad stream id or projection name.
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
        """
        _check_delete(stream_id, projection)
        n = self._remove(stream_id, projection)
        logger.debug("deleted %d snapshot(s) of stream %r", n, stream_id)
        return n

    def close(self) -> None:
        """Nothing to release: the event store owns the connections."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._store.url!r})"

    def list(self, stream_id: str | None = None) -> Iterator[SnapshotInfo]:
        """Every stored snapshot without its state, ordered by stream id then projection.

        Raises:
            InvalidEvent: a bad stream id.
            StoreUnavailable: the database cannot be reached.
            StoreError: the database failed.
        """
        if stream_id is not None:
            validate_name(stream_id, "stream_id")
        return self._infos(stream_id)

    # internals ----------------------------------------------------------------------------

    def _load(
        self, stream_id: str, projection: str, version: int | None, *, verify: bool
    ) -> tuple[Snapshot | None, str | None]:
        return run(self._load_steps(stream_id, projection, version, verify=verify), _SyncPort(self))


def _checked(
    stream_id: str, projection: str, snap: Snapshot | None, reason: str | None
) -> SnapshotCheck:
    if reason is not None:
        logger.debug("snapshot of %r for stream %r ignored: %s", projection, stream_id, reason)
        return SnapshotCheck(None, reason)
    return SnapshotCheck(snap, None)


def _check_delete(stream_id: str, projection: str | None) -> None:
    validate_name(stream_id, "stream_id")
    if projection is not None:
        validate_name(projection, "projection", stream_id=stream_id)


def _row_problem(row: _Row) -> str | None:
    """What is wrong with the column types of a stored snapshot row, or None."""
    pv, at_version, at_hash, state_json, digest, created, seal = row
    checks = (
        ("projection_version", pv, int),
        ("at_version", at_version, int),
        ("at_hash", at_hash, bytes),
        ("state", state_json, bytes),
        ("state_digest", digest, bytes),
        ("created_at", created, str),
    )
    for name, value, want in checks:
        if want is bytes and isinstance(value, bytearray | memoryview):
            continue
        if type(value) is not want:
            return f"{name} is {type(value).__name__}, expected {want.__name__}"
    if seal is not None and not isinstance(seal, bytes | bytearray | memoryview):
        return f"seal is {type(seal).__name__}, expected bytes"
    return None


def _check_int(value: object, name: str, minimum: int, stream_id: str | None) -> None:
    if type(value) is not int or value < minimum:
        raise InvalidEvent(name, f"must be an int >= {minimum}, got {value!r}", stream_id=stream_id)


def _check_hash(value: object, name: str, stream_id: str | None) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != HASH_SIZE:
        raise InvalidEvent(name, f"must be {HASH_SIZE} bytes", stream_id=stream_id)


def _normalize_time(value: datetime | None, stream_id: str) -> datetime:
    if value is None:
        value = datetime.now(UTC)
    elif not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidEvent("created_at", "must be a timezone-aware datetime", stream_id=stream_id)
    # Through the stored text form, so a saved snapshot equals the one loaded back.
    return parse_at(format_at(value))


def _validate(snap: object) -> None:
    """Refuse anything that is not a self-consistent :class:`Snapshot`."""
    if not isinstance(snap, Snapshot):
        raise InvalidEvent("snapshot", f"expected a Snapshot, got {type(snap).__name__}")
    sid = snap.stream_id
    validate_name(sid, "stream_id")
    validate_name(snap.projection, "projection", stream_id=sid)
    _check_int(snap.projection_version, "projection_version", 0, sid)
    _check_int(snap.at_version, "at_version", 1, sid)
    _check_hash(snap.at_hash, "at_hash", sid)
    _check_hash(snap.state_digest, "state_digest", sid)
    if not isinstance(snap.created_at, datetime) or snap.created_at.tzinfo is None:
        raise InvalidEvent("created_at", "must be a timezone-aware datetime", stream_id=sid)
    try:
        encoded = canonical_json(snap.state, field="state")
    except InvalidEvent as exc:
        raise InvalidEvent(exc.field, exc.problem, stream_id=sid) from None
    if encoded != snap.state_json:
        raise InvalidEvent(
            "state_json", "is not canonical_json(state); build with Snapshot.of()", stream_id=sid
        )
    if state_digest(encoded) != snap.state_digest:
        raise InvalidEvent("state_digest", "is not blake3(state_json)", stream_id=sid)


def make_snapshot(
    store: EventStore,
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
    return run(
        make_snapshot_steps(stream_id, projection_name, projection_version, state, at_version),
        _StorePort(store),
    )


def make_snapshot_steps(
    stream_id: str, projection_name: str, projection_version: int, state: Any, at_version: int
) -> Steps[Snapshot]:
    """:func:`make_snapshot` as steps (port calls ``read_at`` and ``stream_version``)."""
    validate_name(stream_id, "stream_id")
    validate_name(projection_name, "projection", stream_id=stream_id)
    _check_int(at_version, "at_version", 1, stream_id)
    event = yield Call("read_at", stream_id, at_version)
    if event is None or event.version != at_version:
        version = yield Call("stream_version", stream_id)
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


class _StorePort:
    """An event store as the port of :func:`make_snapshot_steps`."""

    __slots__ = ("_store",)

    def __init__(self, store: Any) -> None:
        self._store = store

    def read_at(self, stream_id: str, version: int) -> Any:
        return next(iter(self._store.read(stream_id, from_version=version, limit=1)), None)

    def stream_version(self, stream_id: str) -> int:
        return int(self._store.stream_version(stream_id))


# -- dispatch --------------------------------------------------------------------------------


def _unwrap(recorder: Any) -> Any:
    """The backend under any wrappers (a wrapper keeps its backend in ``.inner``)."""
    seen = 0
    while getattr(recorder, "inner", None) is not None and seen < 16:
        recorder = recorder.inner
        seen += 1
    return recorder


def snapshot_store_for(store: EventStore) -> SnapshotStore:
    """The snapshot store in the same database as ``store``'s events.

    Asked of the backend recorder (under any wrapper): its ``snapshot_store(event_store)``
    hook provides it. The built-in memory, SQLite and PostgreSQL recorders have one.

    Raises:
        StoreError: the backend has no snapshot table.
    """
    recorder = _unwrap(store.recorder)
    hook = getattr(recorder, "snapshot_store", None)
    if not callable(hook):
        raise StoreError(
            f"store {store.url} has no snapshot store: backend {type(recorder).__name__} "
            "does not provide one (expose snapshot_store(event_store) on the recorder)"
        )
    provided: SnapshotStore = hook(store)
    return provided
