"""Erasure: remove an event's payload and keep the log verifiable (docs/proofs.md)."""

from __future__ import annotations

import contextlib
import logging
import secrets
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.backend import Capability
from ares_events.core.events import (
    ERASURE_STREAM,
    ERASURE_TYPE,
    MAX_NAME_LENGTH,
    SNAPSHOT_COVERS,
    SNAPSHOT_STREAM_PREFIX,
    NewEvent,
    RecordedEvent,
)
from ares_events.core.faces import blocking
from ares_events.core.recorder import backend_of
from ares_events.errors import ConcurrencyError, ConfigError, InvalidEvent
from ares_events.projections.merkle import MERKLE_PROJECTION
from ares_events.projections.tables import tables_for

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

logger = logging.getLogger(__name__)

__all__ = ["ERASURE_STREAM", "ERASURE_TYPE", "SALT_FIELD", "ErasureReport", "erase", "salted"]

ERASURE_MODULE: Final = "ares-events"
SALT_FIELD: Final = "_ares_salt"
"""The field :func:`salted` adds (32 random hex digits)."""
PAYLOAD_FREE: Final = frozenset({MERKLE_PROJECTION})
"""Read models that never read payloads: an erasure leaves them alone."""
_RECORD_IDS: Final = uuid.UUID("5a0e4f3c-8a1d-5b7e-9c2f-6d4b3a2e1f00")
"""Namespace of the erasure records' event ids (:func:`erasure_record`)."""


def salted(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``payload`` with a random 128-bit salt field (:data:`SALT_FIELD`).

    Append the result instead of ``payload`` when it holds low-entropy personal data: the
    chain keeps the payload's digest forever, and without a salt an erased ``{"ssn":
    ...}`` could be recovered by hashing every candidate. The salt is part of the payload,
    so erasing the payload erases it too.

    Raises:
        InvalidEvent: ``payload`` is not a JSON object, or already has the field.
    """
    if not isinstance(payload, Mapping):
        raise InvalidEvent("payload", "only a JSON object can be salted")
    if SALT_FIELD in payload:
        raise InvalidEvent("payload", f"already has a {SALT_FIELD!r} field")
    return {**payload, SALT_FIELD: secrets.token_hex(16)}


@dataclass(slots=True)
class ErasureReport:
    """What :func:`erase` did."""

    stream_id: str
    version: int
    position: int
    event_id: str
    payload_digest: bytes
    payload_size: int
    already_erased: bool = False
    """The payload was erased before this call (nothing removed now)."""
    blob_key: str | None = None
    blob_deleted: bool = False
    blob_shared_by: int = 0
    """Other events whose (equal) payload lives in the same blob: it was kept for them."""
    blob_left_for_gc: bool = False
    """No other event uses the blob, but an append of the same payload refreshed it after
    the erasure began (it may not have committed yet): it was kept, and ``gc-blobs``
    deletes it once it is old and still unreferenced."""
    snapshots_deleted: int = 0
    """Snapshots of the store's snapshot store (``store.snapshots``) deleted: they folded
    the event."""
    snapshot_events_erased: int = 0
    """Snapshot events (stream ``snapshots/<stream_id>``, metadata ``covers`` at or after
    the version: :data:`~ares_events.core.events.SNAPSHOT_STREAM_PREFIX`) erased by this
    call, each recorded like the event (those erased before are not counted)."""
    read_models_reset: list[str] = field(default_factory=list)
    record_position: int | None = None
    """Global position of the ``payload.erased`` record (None: already recorded)."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self) | {"payload_digest": self.payload_digest.hex()}
        at = d.pop("record_position")
        return d | {"record_stream": ERASURE_STREAM, "record_position": at}


def erase(
    store: EventStore, stream_id: str, version: int, *, reason: str, by: str
) -> ErasureReport:
    """Erase the payload of ``stream_id`` ``version`` and record who did it and why.

    docs/proofs.md ("Erasure") gives every step. Idempotent: erasing an erased event changes
    nothing (and appends the record only if an interrupted erasure left none).

    Args:
        store: the store (its backend must declare ``Capability.ERASE``).
        reason: why (kept in the erasure record: do not put the erased data here).
        by: who asked (a user or service name).

    Raises:
        InvalidEvent: an empty ``reason`` or ``by``.
        EventNotFound: no such event.
        StoreError: the backend cannot erase (no ``ERASE`` capability).
        StoreUnavailable: the store or the blob store cannot be reached.
    """
    store = blocking(store, "ae.erase")
    for name, value in (("reason", reason), ("by", by)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidEvent(name, "must be a non-empty string (who erased, and why)")
    with scrubbing(store):  # no step leaves a copy behind
        before, shared = store.erase_payload(stream_id, version)
        ref = before.payload_ref
        already = ref is not None and ref.erased
        report = ErasureReport(
            stream_id, version, before.position, before.event_id_str, before.payload_digest,
            before.payload_size, already_erased=already,
            blob_key=ref.key if ref is not None and not already else None,
        )  # fmt: skip
        if report.blob_key is not None:
            report.blob_shared_by = shared or 0
            if shared == 0 and store.blobs is not None:  # kept only when refreshed meanwhile
                report.blob_left_for_gc = store.blobs.exists(report.blob_key)
                report.blob_deleted = not report.blob_left_for_gc
        report.snapshots_deleted = _drop_snapshots(store, stream_id, version)
        records: dict[str, dict[str, Any]] | None = None
        for snap in _covering_snapshot_events(store, stream_id, version):
            # Erased and recorded like the event (its content is in them), before the
            # event's own record, which comes last; idempotent in the same way.
            old, _shared = store.erase_payload(snap.stream_id, snap.version)
            if not old.payload_erased:
                report.snapshot_events_erased += 1
            else:  # erased before: record it only if that erasure left no record
                if records is None:
                    records = erasure_records(store)
                if old.event_id_str in records:
                    continue
            with contextlib.suppress(ConcurrencyError):
                store.append(ERASURE_STREAM, [erasure_record(old, reason, by)])
        report.read_models_reset = reset_read_models(store, before.position)
        if not already or before.event_id_str not in erasure_records(store):
            # The record's id is derived from the erased event: of concurrent erasers, one
            # record lands (the same record again is a duplicate; another reason or name
            # under that id is a ConcurrencyError: recorded already).
            with contextlib.suppress(ConcurrencyError):
                res = store.append(ERASURE_STREAM, [erasure_record(before, reason, by)])
                if not res.duplicate:
                    report.record_position = res.position
        logger.info(
            "erased stream %r version %d (record at position %s)", stream_id, version,
            report.record_position,
        )  # fmt: skip
        return report


def scrubbing(store: EventStore | AsyncEventStore) -> contextlib.AbstractContextManager[Any]:
    """Where the backend can (SQLite, blocking), this thread's deletes zero the bytes they
    free and its log is truncated at the end; elsewhere, nothing. An erasure's steps run
    inside one."""
    scrub = getattr(backend_of(store.recorder), "scrubbing", None)
    return scrub() if callable(scrub) else contextlib.nullcontext()


def erasure_record(e: RecordedEvent, reason: str, by: str) -> NewEvent:
    """The ``payload.erased`` record of erasing ``e`` (what :func:`erase` appends to
    :data:`ERASURE_STREAM`, and the adapters that erase do too). Its event id is derived
    from the erased event (its stream, version and hash), so that concurrent erasers append
    one record; records are matched by their payload's ``event_id``."""
    name = f"{e.stream_id}\n{e.version}\n{e.hash.hex()}"
    return NewEvent(
        event_id=uuid.uuid5(_RECORD_IDS, name),
        type=ERASURE_TYPE,
        module=ERASURE_MODULE,
        payload={
            "stream_id": e.stream_id,
            "version": e.version,
            "position": e.position,
            "event_id": e.event_id_str,
            "type": e.type,
            "payload_digest": e.payload_digest.hex(),
            "payload_size": e.payload_size,
            "reason": reason,
            "by": by,
        },
    )


def erasure_records(store: EventStore) -> dict[str, dict[str, Any]]:
    """Every erasure record, by the erased event's id (the latest record wins)."""
    out: dict[str, dict[str, Any]] = {}
    for e in store.read(ERASURE_STREAM):
        if e.type != ERASURE_TYPE or e.payload_erased:
            continue
        p = e.payload
        if isinstance(p, dict) and isinstance(p.get("event_id"), str):
            out[p["event_id"]] = {**p, "record_version": e.version, "at": e.at}
    return out


def _drop_snapshots(store: EventStore, stream_id: str, version: int) -> int:
    if Capability.SNAPSHOTS not in store.capabilities:
        return 0
    snaps = store.snapshots
    stale = [i.projection for i in snaps.list(stream_id) if i.at_version >= version]
    return sum(int(snaps.delete(stream_id, name)) for name in stale)


def _covering_snapshot_events(
    store: EventStore, stream_id: str, version: int
) -> list[RecordedEvent]:
    """The events of ``snapshots/<stream_id>`` whose metadata ``covers`` is an int at or
    after ``version`` (they fold its content)."""
    snaps = SNAPSHOT_STREAM_PREFIX + stream_id
    if len(snaps) > MAX_NAME_LENGTH or store.head(snaps) is None:
        return []  # too long to be a stream id (head() would refuse it), or no such stream
    return [
        e
        for e in store.read(snaps)
        if type(c := e.metadata.get(SNAPSHOT_COVERS)) is int and c >= version
    ]


def reset_read_models(store: EventStore | AsyncEventStore, position: int) -> list[str]:
    """Empty and rewind every read model (but the payload-free ones) that folded the
    event at ``position``; return their names. Blocking on either face (so are the read
    models)."""
    try:
        tables = tables_for(store)
    except ConfigError:
        return []
    done = []
    for name in tables.names():
        if name in PAYLOAD_FREE or (meta := tables.meta(name)) is None:
            continue
        folded = meta.position >= position or (
            meta.building_table is not None and meta.building_position >= position
        )
        if folded and tables.reset(name):
            done.append(name)
    return done
