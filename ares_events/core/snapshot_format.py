"""What a snapshot is: its fields, digest and seal, and the checks of its values (a cache of
a fold, never the truth; the seal: docs/security.md). Backends store :data:`SnapshotRow`
tuples.

It may import the core's events, :mod:`ares_events.errors` and the chain format.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import blake3

from ares_events.chain import ChainKey, canonical_json
from ares_events.core.events import format_at, parse_at, validate_name
from ares_events.errors import InvalidEvent

__all__ = [
    "HASH_SIZE",
    "Snapshot",
    "SnapshotCheck",
    "SnapshotInfo",
    "SnapshotRow",
    "check_hash",
    "check_int",
    "info_of",
    "normalize_time",
    "row_of",
    "row_problem",
    "seal_reason",
    "snapshot_of_row",
    "snapshot_seal",
    "state_digest",
    "validate_snapshot",
]

HASH_SIZE: Final = 32


def state_digest(state_json: bytes) -> bytes:
    """``blake3(canonical_json(state))``: 32 bytes, never keyed."""
    return blake3.blake3(state_json).digest()


_SEAL_PREFIX: Final = b"ares-events/snapshot-seal/v1\x00"


def snapshot_seal(snap: Snapshot, key: ChainKey | None) -> bytes:
    """The seal of ``snap``: a MAC under ``key`` (keyed store) or a plain digest over
    canonical JSON of every field recovery trusts (docs/security.md)."""
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
        _check_fields(stream_id, projection, projection_version, at_version, at_hash)
        state_json = _encode_state(state, stream_id)
        return cls(
            stream_id=stream_id,
            projection=projection,
            projection_version=projection_version,
            at_version=at_version,
            at_hash=bytes(at_hash),
            state=state,
            state_json=state_json,
            state_digest=state_digest(state_json),
            created_at=normalize_time(created_at, stream_id),
        )

    @property
    def state_size(self) -> int:
        """Length of the stored state in bytes."""
        return len(self.state_json)

    def info(self) -> SnapshotInfo:
        """The snapshot's description without its state."""
        return SnapshotInfo(**{name: getattr(self, name) for name in _INFO_FIELDS})

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
        d = {name: getattr(self, name) for name in _INFO_FIELDS}  # keys in field order
        d.update(at_hash=self.at_hash.hex(), state_digest=self.state_digest.hex())
        d["created_at"] = format_at(self.created_at)
        return d | ({"problem": self.problem} if self.problem else {})


_INFO_FIELDS: Final = tuple(f.name for f in fields(SnapshotInfo) if f.name != "problem")


class SnapshotCheck(NamedTuple):
    """Outcome of :meth:`SnapshotStore.load_checked`; unpacks as ``(snapshot, reason)``.

    ``(snapshot, None)``: a verified snapshot. ``(None, None)``: there is none.
    ``(None, reason)``: one is stored but must be ignored, and ``reason`` says why.
    """

    snapshot: Snapshot | None
    reason: str | None


SnapshotRow = tuple[Any, Any, Any, Any, Any, Any, Any]
"""One stored snapshot as its backend returns it: projection_version, at_version, at_hash,
state, state_digest, created_at, seal (None only in a damaged row), as the
database holds them; the store checks their types (a tampered row is a reason, not a crash)."""


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def info_of(row: tuple[Any, ...]) -> SnapshotInfo:
    """A listing row ``(stream_id, projection, projection_version, at_version, at_hash,
    state size, state_digest, created_at)`` as a :class:`SnapshotInfo`; a malformed row
    (a tampered table) is an info with ``problem`` set instead of an exception, so audits
    go on."""
    try:
        if not (type(row[2]) is int and type(row[3]) is int):
            raise TypeError("projection_version and at_version must be integers")
        return SnapshotInfo(
            stream_id=str(row[0]),
            projection=str(row[1]),
            projection_version=row[2],
            at_version=row[3],
            at_hash=bytes(row[4]),
            state_size=int(row[5] or 0),
            state_digest=bytes(row[6]),
            created_at=parse_at(row[7]),
        )
    except (TypeError, ValueError) as exc:
        return SnapshotInfo(
            stream_id=str(row[0]),
            projection=str(row[1]),
            projection_version=-1,
            at_version=row[3] if type(row[3]) is int else 0,
            at_hash=b"",
            state_digest=b"",
            state_size=0,
            created_at=_EPOCH,
            problem=f"{type(exc).__name__}: {exc}",
        )


def row_of(snap: Snapshot) -> SnapshotRow:
    """The row a backend stores for a sealed snapshot (the key is its stream and
    projection)."""
    return (
        snap.projection_version,
        snap.at_version,
        bytes(snap.at_hash),
        snap.state_json,
        bytes(snap.state_digest),
        format_at(snap.created_at),
        snap.seal,
    )


def seal_reason(snap: Snapshot, key: ChainKey | None, *, stored: bool = True) -> str | None:
    """Why ``snap``'s seal does not hold under ``key`` (None: it holds). An unsealed
    snapshot not ``stored`` (made, not saved yet) is checked by a keyed store only."""
    if snap.seal is None:
        if key is None and not stored:
            return None
        # Every save seals, keyed or not: a stored row without one had its seal removed
        # (moving a snapshot back then costs nothing) or was written without the key.
        return "snapshot is not sealed (its seal was removed, or it was written without the key)"
    if snap.seal != snapshot_seal(snap, key):
        if key is None:
            return "snapshot seal mismatch (a field was altered)"
        return (
            "snapshot seal does not verify under the store's chain key (forged, or "
            "written under another key)"
        )
    return None


def snapshot_of_row(stream_id: str, projection: str, row: SnapshotRow) -> Snapshot:
    """The snapshot a well-formed row holds, its state not decoded yet (``state=None``).

    Raises:
        ValueError: a bad ``created_at``.
    """
    pv, at_version, at_hash, state_json, digest, created, seal = row
    return Snapshot(
        stream_id=stream_id,
        projection=projection,
        projection_version=pv,
        at_version=at_version,
        at_hash=bytes(at_hash),
        state=None,
        state_json=bytes(state_json),
        state_digest=bytes(digest),
        created_at=parse_at(created),
        seal=None if seal is None else bytes(seal),
    )


def row_problem(row: SnapshotRow) -> str | None:
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


def check_int(value: object, name: str, minimum: int, stream_id: str | None) -> None:
    if type(value) is not int or value < minimum:
        raise InvalidEvent(name, f"must be an int >= {minimum}, got {value!r}", stream_id=stream_id)


def check_hash(value: object, name: str, stream_id: str | None) -> None:
    if not isinstance(value, bytes | bytearray) or len(value) != HASH_SIZE:
        raise InvalidEvent(name, f"must be {HASH_SIZE} bytes", stream_id=stream_id)


def _check_fields(
    stream_id: str, projection: str, projection_version: int, at_version: int, at_hash: bytes
) -> None:
    validate_name(stream_id, "stream_id")
    validate_name(projection, "projection", stream_id=stream_id)
    check_int(projection_version, "projection_version", 0, stream_id)
    check_int(at_version, "at_version", 1, stream_id)
    check_hash(at_hash, "at_hash", stream_id)


def _encode_state(state: Any, stream_id: str) -> bytes:
    try:
        return canonical_json(state, field="state")
    except InvalidEvent as exc:
        raise InvalidEvent(exc.field, exc.problem, stream_id=stream_id) from None


def normalize_time(value: datetime | None, stream_id: str) -> datetime:
    if value is None:
        value = datetime.now(UTC)
    elif not isinstance(value, datetime) or value.tzinfo is None:
        raise InvalidEvent("created_at", "must be a timezone-aware datetime", stream_id=stream_id)
    # Through the stored text form, so a saved snapshot equals the one loaded back.
    return parse_at(format_at(value))


def validate_snapshot(snap: object) -> None:
    """Refuse anything that is not a self-consistent :class:`Snapshot`."""
    if not isinstance(snap, Snapshot):
        raise InvalidEvent("snapshot", f"expected a Snapshot, got {type(snap).__name__}")
    sid = snap.stream_id
    _check_fields(sid, snap.projection, snap.projection_version, snap.at_version, snap.at_hash)
    check_hash(snap.state_digest, "state_digest", sid)
    if not isinstance(snap.created_at, datetime) or snap.created_at.tzinfo is None:
        raise InvalidEvent("created_at", "must be a timezone-aware datetime", stream_id=sid)
    encoded = _encode_state(snap.state, sid)
    if encoded != snap.state_json:
        raise InvalidEvent(
            "state_json", "is not canonical_json(state); build with Snapshot.of()", stream_id=sid
        )
    if state_digest(encoded) != snap.state_digest:
        raise InvalidEvent("state_digest", "is not blake3(state_json)", stream_id=sid)
