"""Erasure of an archived event: its segment rewritten with that payload erased.

Blocking I/O (the asyncio face runs it on a worker thread). It may import the core,
:mod:`ares_events.errors`, the blob stores and this package.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ares_events.archive.segment import (
    INDEX_KEY,
    THROUGH_KEY,
    Manifest,
    ObjectRef,
    SegmentEntry,
    SegmentIndex,
    decode_block,
    encode_segment,
    through_update,
)
from ares_events.archive.source import ArchiveSource
from ares_events.core.events import ErasedPayloadRef, RecordedEvent
from ares_events.errors import ArchiveError

logger = logging.getLogger(__name__)

__all__ = ["erase_archived", "put_checked", "record_through", "settle_pending", "swap_index"]


def put_checked(source: ArchiveSource, ix: SegmentIndex, data: bytes, seq: int) -> ObjectRef:
    """Write ``data`` to the archive and read it back (size and blake3 checked).

    Raises:
        ArchiveError: what was read back differs (``corrupted``) or is gone (``missing``).
        StoreUnavailable: the archive cannot be reached.
    """
    blobs = source.blobs(ix)
    ref = ObjectRef.of(data)
    blobs.put(data, digest=ref.digest)
    back = blobs.get(ref.as_payload_ref())
    if back != data:  # get() checked size and digest; equal bytes is the same check again
        raise ArchiveError("corrupted", seq, ref.key, "read back differs from what was written")
    return ref


def erase_archived(
    source: ArchiveSource,
    ix: SegmentIndex,
    stream_id: str,
    version: int,
    position: int,
    event_hash: bytes,
    ref: ErasedPayloadRef,
    blob_key: str | None,
) -> tuple[SegmentIndex, int, list[str]] | None:
    """Rewrite the segment holding the event (matched on stream, version, position and
    hash); return the new segment index, how many users of its blob to assume, and the keys
    of the replaced objects; None when no archived row matches, or it is erased already
    (the caller reports what erasing an erased event reports: nothing changed).

    A spilled payload's blob is never deleted here (events in the database may share it,
    which this cannot count): it is reported as shared, and ``gc-blobs`` removes it later.

    Raises:
        ArchiveError: the segment is missing or altered.
    """
    entry = ix.segment_at(position)
    if entry is None or entry.retired is not None:
        return None
    m = source.manifest(ix, entry)
    events = source.segment_events(ix, entry)
    # the segment's block size: the manifest's stream ranges name blocks
    block_events = next((b.count for b in m.blocks if b.count), 1)
    hit = next((i for i, e in enumerate(events) if e.position == position), None)
    if hit is None:
        return None
    e = events[hit]
    if (e.stream_id, e.version, e.hash) != (stream_id, version, event_hash):
        return None
    if e.payload_erased:
        # A concurrent erasure of the same event won the swap. Rewriting it again would
        # write the same segment bytes under the same key and name that key as replaced.
        return None
    events[hit] = RecordedEvent(
        e.stream_id, e.version, e.position, e.event_id_str, e.type, e.module, None,
        e.metadata_json, e.at, e.prev_hash, e.hash, ref,
    )  # fmt: skip
    refs = sum(1 for x in events if x.payload_ref is not None and x.payload_ref.key == blob_key)
    data, blocks = encode_segment(events, block_events=block_events)
    seg_ref = put_checked(source, ix, data, entry.seq)
    # every block of the new object decodes to the rows we meant to write
    for b in blocks:
        back = source.blobs(ix).read_range(seg_ref.key, b.offset, b.length)
        decode_block(back, b, entry.seq, seg_ref.key)
    new_m: Manifest = dataclasses.replace(m, segment=seg_ref, blocks=blocks, erased=m.erased + 1)
    man_ref = put_checked(source, ix, new_m.to_bytes(), entry.seq)
    new_entry: SegmentEntry = dataclasses.replace(entry, manifest=man_ref, segment=seg_ref)
    logger.info("erased archived stream %r version %d (segment %d)", stream_id, version, entry.seq)
    old = [entry.manifest.key, entry.segment.key]
    new_ix = dataclasses.replace(ix.with_segment(new_entry), pending=(*ix.pending, *old))
    return new_ix, refs + (1 if blob_key else 0), old


def settle_pending(
    inner: Any, source: ArchiveSource, text: str | None, ix: SegmentIndex
) -> tuple[str | None, SegmentIndex]:
    """Delete the objects the segment index lists as replaced, then clear the list (a
    compare-and-set: if the segment index changed meanwhile, the next run clears it)."""
    if not ix.pending:
        return text, ix
    source.drop_objects(ix, list(ix.pending))
    clean = dataclasses.replace(ix, pending=())
    clean_text = clean.to_json()
    if inner.meta_swap(INDEX_KEY, text, clean_text):
        return clean_text, clean
    return text, ix


def swap_index(inner: Any, text: str | None, ix: SegmentIndex, seq: int, why: str) -> str:
    """Record ``ix`` in place of the segment index ``text`` (a compare-and-set), then its
    end row; returns the text recorded.

    Raises:
        ArchiveError: the segment index changed meanwhile (kind ``busy``).
    """
    new_text = ix.to_json()
    if not inner.meta_swap(INDEX_KEY, text, new_text):
        changed = _what_changed(text, inner.meta_get(INDEX_KEY))
        raise ArchiveError("busy", seq, INDEX_KEY, f"{changed or why}; run again")
    record_through(inner, ix)
    return new_text


def record_through(inner: Any, ix: SegmentIndex) -> None:
    """Write ``archive/through`` for the recorded segment index ``ix`` (a compare-and-set
    that never moves the row back to an older revision: a writer stalled between its index
    swap and this write leaves a later writer's row as it is)."""
    while True:  # a lost swap means another writer moved the row: look at it again
        raw = inner.meta_get(THROUGH_KEY)
        new = through_update(raw, ix)
        if new is None or inner.meta_swap(THROUGH_KEY, raw, new):
            return


def _what_changed(before: str | None, now: str | None) -> str | None:
    """What changed the segment index from ``before`` to ``now`` (None: cannot tell)."""
    if now is None:
        return "the segment index is gone"
    try:
        old = SegmentIndex.from_json(before) if before is not None else None
        new = SegmentIndex.from_json(now)
    except ArchiveError:
        return None
    was = {s.seq: s for s in old.segments} if old is not None else {}
    what = []
    for s in new.segments:
        p = was.get(s.seq)
        if p is None:
            what.append(f"another archive run recorded segment {s.seq}")
        elif s.retired is not None and p.retired is None:
            what.append(f"retention retired segment {s.seq}")
        elif s.manifest != p.manifest:
            what.append(f"an erasure rewrote segment {s.seq}")
    if not what and old is not None and new.pending != old.pending:
        what.append("another run deleted the objects an erasure replaced")
    return "the segment index changed meanwhile: " + ", ".join(what) if what else None
