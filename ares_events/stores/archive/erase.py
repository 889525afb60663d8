"""Erasure of an archived event: the segment is rewritten with that one payload replaced by
its erased reference (every other byte of every row, so every chain hash, Merkle leaf and
proof, unchanged), written and read back, and only then put in the catalog in place of
the old one, whose objects are deleted after the catalog swap.

Blocking I/O (the asyncio face runs it on a worker thread). It may import the core,
:mod:`ares_events.errors`, the blob stores and this package.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from ares_events.core.events import ErasedPayloadRef, RecordedEvent
from ares_events.errors import ArchiveError
from ares_events.stores.archive.segment import (
    CATALOG_KEY,
    Catalog,
    Manifest,
    ObjectRef,
    SegmentEntry,
    decode_block,
    encode_segment,
)
from ares_events.stores.archive.source import ArchiveSource

logger = logging.getLogger(__name__)

__all__ = ["erase_archived", "put_checked", "settle_pending"]


def put_checked(source: ArchiveSource, cat: Catalog, data: bytes, seq: int) -> ObjectRef:
    """Write ``data`` to the archive and read it back (size and blake3 checked).

    Raises:
        ArchiveError: what was read back differs (``corrupted``) or is gone (``missing``).
        StoreUnavailable: the archive cannot be reached.
    """
    blobs = source.blobs(cat)
    ref = ObjectRef.of(data)
    blobs.put(data, digest=ref.digest)
    back = blobs.get(ref.as_payload_ref())
    if back != data:  # get() checked size and digest; equal bytes is the same check again
        raise ArchiveError("corrupted", seq, ref.key, "read back differs from what was written")
    return ref


def erase_archived(
    source: ArchiveSource,
    cat: Catalog,
    stream_id: str,
    version: int,
    position: int,
    event_hash: bytes,
    ref: ErasedPayloadRef,
    blob_key: str | None,
) -> tuple[Catalog, int, list[str]] | None:
    """Rewrite the segment holding the event (matched on stream, version, position and
    hash); return the new catalog, how many users of its blob to assume, and the keys of
    the replaced objects; None when no archived row matches.

    The blob of a spilled payload is never deleted here (it may be shared with events
    in the database, which this cannot count): it is reported as shared, and
    ``gc-blobs`` removes it once nothing references it.

    Raises:
        ArchiveError: the segment is missing or altered.
    """
    entry = cat.segment_at(position)
    if entry is None or entry.retired is not None:
        return None
    m = source.manifest(cat, entry)
    events: list[RecordedEvent] = []
    block_events = 0  # the segment's block size: the manifest's stream ranges name blocks
    for i in range(len(m.blocks)):
        got = source.block(cat, entry, i)
        block_events = block_events or len(got)
        events.extend(got)
    hit = None
    for i, e in enumerate(events):
        if e.position == position:
            if e.stream_id == stream_id and e.version == version and e.hash == event_hash:
                hit = i
            break
    if hit is None:
        return None
    e = events[hit]
    erased = RecordedEvent(
        e.stream_id, e.version, e.position, e.event_id_str, e.type, e.module, None,
        e.metadata_json, e.at, e.prev_hash, e.hash, ref,
    )  # fmt: skip
    events[hit] = erased
    refs = sum(1 for x in events if x.payload_ref is not None and x.payload_ref.key == blob_key)
    data, blocks = encode_segment(events, block_events=max(block_events, 1))
    seg_ref = put_checked(source, cat, data, entry.seq)
    # every block of the new object decodes to the rows we meant to write
    for b in blocks:
        back = source.blobs(cat).read_range(seg_ref.key, b.offset, b.length)
        decode_block(back, b, entry.seq, seg_ref.key)
    new_m: Manifest = dataclasses.replace(m, segment=seg_ref, blocks=blocks, erased=m.erased + 1)
    man_ref = put_checked(source, cat, new_m.to_bytes(), entry.seq)
    new_entry: SegmentEntry = dataclasses.replace(entry, manifest=man_ref, segment=seg_ref)
    logger.info("erased archived stream %r version %d (segment %d)", stream_id, version, entry.seq)
    old = [entry.manifest.key, entry.segment.key]
    new_cat = dataclasses.replace(cat.with_segment(new_entry), pending=(*cat.pending, *old))
    return new_cat, refs + (1 if blob_key else 0), old


def settle_pending(
    inner: Any, source: ArchiveSource, text: str | None, cat: Catalog
) -> tuple[str | None, Catalog]:
    """Delete the objects the catalog lists as replaced, then clear the list (a
    compare-and-set: if the catalog changed meanwhile, the next run clears it)."""
    if not cat.pending:
        return text, cat
    source.drop_objects(cat, list(cat.pending))
    clean = dataclasses.replace(cat, pending=())
    clean_text = clean.to_json()
    if inner.meta_swap(CATALOG_KEY, text, clean_text):
        return clean_text, clean
    return text, cat
