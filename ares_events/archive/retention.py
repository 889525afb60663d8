"""Retention: delete archived segments past a horizon, leaving a verifiable tombstone
(docs/archive.md, "Erasure and retention").

It may import the core, stores, integrity and the projections below it.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ares_events.archive.erase import settle_pending, swap_index
from ares_events.archive.job import _archive_reader, _cutoff
from ares_events.archive.segment import (
    RETENTION_TYPE,
    span,
    streams_digest,
    tombstone_fields,
)
from ares_events.core.events import RECORD_STREAMS, RETENTION_STREAM, NewEvent, utc_now_at
from ares_events.core.faces import blocking
from ares_events.errors import ArchiveError, InvalidEvent
from ares_events.stores.cache import CachedRecorder

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = ["RETENTION_STREAM", "RETENTION_TYPE", "RetireReport", "retire", "streams_digest"]

_NS: Final = uuid.UUID("0b1e3a55-25aa-4c1e-9d0e-a7c41e5e7a25")


@dataclass
class RetireReport:
    """What one retention run did: the segments retired (seq, positions, events, the
    record's position), and how many events they held."""

    segments: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return dataclasses.asdict(self)


def retire(
    store: EventStore, *, before: int | timedelta | datetime, reason: str, by: str
) -> RetireReport:
    """Retire the archived segments whose events all lie before ``before`` (docs/archive.md,
    "Erasure and retention"). Through a store with the Redis cache, the cached tails of
    the retired segments' streams are dropped (docs/operations.md, "Erasure and the cache").

    Args:
        store: a store with an archive.
        before: a global position, a ``datetime``, or an age (``timedelta``): a segment
            goes only when its last event is below the position or older than the time.
        reason: why (kept in the record: the legal basis; no personal data).
        by: who asked.

    Raises:
        InvalidEvent: an empty ``reason`` or ``by``.
        ArchiveError: a segment to retire is missing or altered, holds retention or
            erasure records (kind ``records``: an archive written before the run kept them
            in the database), or another run changed the segment index meanwhile.
        StoreUnavailable: the store or the archive cannot be reached.
    """
    store = blocking(store, "ares_events.archive.retention.retire")
    for name, value in (("reason", reason), ("by", by)):
        if not isinstance(value, str) or not value.strip():
            raise InvalidEvent(name, "must be a non-empty string (who retired, and why)")
    rec = _archive_reader(store)
    inner, source = rec.inner, rec.source
    report = RetireReport()
    text, ix = rec._index_text()
    if ix is None:
        return report
    text, ix = settle_pending(inner, source, text, ix)
    cutoff_pos, cutoff_at = _cutoff(before, inner.last_position())
    for entry in list(ix.segments):
        if entry.retired is not None:
            # objects a crashed run left
            source.drop_objects(ix, [entry.segment.key, entry.manifest.key])
            continue
        if entry.last_position >= cutoff_pos:
            break
        m = source.manifest(ix, entry)
        if cutoff_at is not None:
            last = source.block(ix, entry, len(m.blocks) - 1)
            if max(e.at for e in last) >= cutoff_at:
                break
        held = sorted(RECORD_STREAMS & m.streams.keys())
        if held:  # archived before the run kept them: retired, they would be lost
            raise ArchiveError(
                "records", entry.seq, entry.manifest.key,
                f"holds events of {', '.join(held)}, the records the audit checks tombstones "
                "and erasures against: it is not retired (nor any segment after it)",
            )  # fmt: skip
        ends = {sid: (r.last, r.last_hash) for sid, r in m.streams.items()}
        payload = {
            **tombstone_fields(entry, ends),
            "segment_root": m.segment_root.hex(),
            "streams": len(ends),
            "reason": reason,
            "by": by,
        }
        rid = str(uuid.uuid5(_NS, f"{entry.seq}:{entry.manifest.key}"))  # the same on every run
        res = store.append(
            RETENTION_STREAM,
            [NewEvent(type=RETENTION_TYPE, module="ares-events", payload=payload, event_id=rid)],
        )
        tomb = {**payload, "record_position": res.position, "retired_at": utc_now_at()}
        ix = ix.with_segment(dataclasses.replace(entry, retired=tomb, streams_end=ends))
        text = swap_index(inner, text, ix, entry.seq, "the segment index changed")
        # Retired now (the swap is the commit): a stream's cached tail may hold its
        # retired events, and its stamp still matches the head (retirement changes no
        # head). Dropped as an erasure drops it, after the commit: a read before it
        # that refills the tail is refused (the erasure epoch is replaced too).
        if isinstance(store.recorder, CachedRecorder):
            store.recorder.drop_tails(sorted(ends))
        source.drop_objects(ix, [entry.segment.key, entry.manifest.key])
        report.segments.append({**span(entry), "record_position": res.position})
        report.events += entry.events
        logger.info("retired archive segment %d (%d events): %s", entry.seq, entry.events, reason)
    return report
