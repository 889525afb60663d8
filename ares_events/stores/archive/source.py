"""The archive as a reader sees it: the catalog (parsed from the database's record),
manifests and blocks (fetched from the archive's blob store, checked, cached).

Blocking I/O; the asyncio face calls it on a worker thread. Every object is checked
before use: a manifest against the size and blake3 digest the catalog records, a block
against the digest its manifest records. A miss is an :class:`~ares_events.errors.ArchiveError`,
never an empty answer.

It may import the core, :mod:`ares_events.errors` and the blob stores.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any, Final

from ares_events.core.events import RecordedEvent
from ares_events.errors import ArchiveError, BlobCorrupted, BlobMissing
from ares_events.stores.archive.segment import (
    Catalog,
    Manifest,
    SegmentEntry,
    decode_block,
)

logger = logging.getLogger(__name__)

__all__ = ["CACHE_EVENTS", "ArchiveSource", "StreamCursor"]

CACHE_EVENTS: Final = 65_536
"""Decoded events kept in the block cache (least recently used blocks go first)."""

StreamCursor = tuple[int, int]
"""Where a stream read goes on: (index of the segment in the catalog, block index)."""


class ArchiveSource:
    """Catalog, manifests and blocks of one store's archive (thread-safe)."""

    def __init__(self, *, cache_events: int = CACHE_EVENTS) -> None:
        self._lock = threading.Lock()
        self._text: str | None = None
        self._catalog: Catalog | None = None
        self._blobs: Any = None
        self._blobs_url: str | None = None
        self._manifests: dict[str, Manifest] = {}
        self._blocks: OrderedDict[tuple[str, int], list[RecordedEvent]] = OrderedDict()
        self._cached = 0
        self._limit = cache_events
        self.fetches = 0
        """Blocks fetched from the archive (for tests and the benchmark)."""

    # -- catalog and objects ---------------------------------------------------------------

    def catalog(self, text: str | None) -> Catalog | None:
        """The catalog stored as ``text`` (parsed once per distinct text).

        Raises:
            ArchiveError: the record does not parse.
        """
        with self._lock:
            if text is None:
                self._text, self._catalog = None, None
                return None
            if text != self._text:
                self._catalog = Catalog.from_json(text)
                self._text = text
            return self._catalog

    def blobs(self, cat: Catalog) -> Any:
        """The archive's blob store (opened once, without creating anything)."""
        with self._lock:
            if self._blobs is None or self._blobs_url != cat.url:
                from ares_events.stores.blobs import open_blobs

                if self._blobs is not None:
                    self._blobs.close()
                self._blobs = open_blobs(cat.url, create=False)
                self._blobs_url = cat.url
            return self._blobs

    def manifest(self, cat: Catalog, entry: SegmentEntry) -> Manifest:
        """The manifest of ``entry``, checked against the catalog.

        Raises:
            ArchiveError: missing, altered, unreadable or not this segment's.
        """
        key = entry.manifest.key
        got = self._manifests.get(key)
        if got is not None:
            return got
        if entry.retired is not None:
            raise ArchiveError("retired", entry.seq, key, f"retired: {entry.retired}")
        try:
            data = self.blobs(cat).get(entry.manifest.as_payload_ref())
        except BlobMissing as exc:
            raise ArchiveError("missing", entry.seq, key, "manifest not in the archive") from exc
        except BlobCorrupted as exc:
            raise ArchiveError("corrupted", entry.seq, key, f"manifest: {exc.detail}") from exc
        m = Manifest.from_bytes(data, key)
        if (
            m.seq != entry.seq
            or m.first_position != entry.first_position
            or m.last_position != entry.last_position
            or m.segment != entry.segment
        ):
            raise ArchiveError("corrupted", entry.seq, key, "manifest is not this segment's")
        self._manifests[key] = m
        return m

    def block(self, cat: Catalog, entry: SegmentEntry, index: int) -> list[RecordedEvent]:
        """The events of block ``index`` of ``entry`` (one ranged read, digest-checked).

        Raises:
            ArchiveError: the segment or its manifest is missing, altered or unreadable.
        """
        m = self.manifest(cat, entry)
        b = m.blocks[index]
        ck = (m.segment.key, b.offset)
        with self._lock:
            hit = self._blocks.get(ck)
            if hit is not None:
                self._blocks.move_to_end(ck)
                return hit
        try:
            data = self.blobs(cat).read_range(m.segment.key, b.offset, b.length)
        except BlobMissing as exc:
            raise ArchiveError(
                "missing", entry.seq, m.segment.key, "segment not in the archive"
            ) from exc
        events = decode_block(data, b, entry.seq, m.segment.key)
        self.fetches += 1
        with self._lock:
            if ck not in self._blocks:
                self._blocks[ck] = events
                self._cached += len(events)
                while self._cached > self._limit and len(self._blocks) > 1:
                    _, old = self._blocks.popitem(last=False)
                    self._cached -= len(old)
        return events

    def forget(self) -> None:
        """Drop every cached manifest and block (after an archived payload was erased)."""
        with self._lock:
            self._manifests.clear()
            self._blocks.clear()
            self._cached = 0

    def close(self) -> None:
        """Close the archive's blob store."""
        with self._lock:
            if self._blobs is not None:
                self._blobs.close()
                self._blobs = None

    # -- what the reads need ---------------------------------------------------------------

    def events_after(
        self, cat: Catalog, position: int, prefix: str | None
    ) -> tuple[list[RecordedEvent], int]:
        """Archived events after ``position`` from the next block that has any, and the
        position up to which the archive has now been read (the block's last one, or the
        end of a retired segment, whose events are gone).

        Raises:
            ArchiveError: a segment or manifest is missing, altered or unreadable.
        """
        entry = cat.after(position)
        if entry is None:
            return [], position
        if entry.retired is not None:
            return [], entry.last_position
        m = self.manifest(cat, entry)
        for i, b in enumerate(m.blocks):
            if b.last_position <= position:
                continue
            events = self.block(cat, entry, i)
            out = [e for e in events if e.position > position]
            if prefix:
                out = [e for e in out if e.stream_id.startswith(prefix)]
            return out, b.last_position
        return [], entry.last_position

    def stream_chunk(
        self, cat: Catalog, stream_id: str, version: int, cursor: StreamCursor | None
    ) -> tuple[list[RecordedEvent], StreamCursor | None]:
        """Archived events of ``stream_id`` from ``version`` on, out of the next block that
        holds any, and the cursor to go on from (None: the archive has no more of them).

        Raises:
            ArchiveError: a segment or manifest is missing, altered or unreadable.
        """
        segs = cat.segments
        si, bi = cursor if cursor is not None else (0, -1)
        while si < len(segs):
            entry = segs[si]
            if entry.retired is not None:
                si, bi = si + 1, -1
                continue
            m = self.manifest(cat, entry)
            r = m.streams.get(stream_id)
            if r is None or r.last < version:
                si, bi = si + 1, -1
                continue
            # the stream's own blocks when the manifest lists them, else every block of its range
            wanted = r.blocks or range(len(m.blocks))
            for i in wanted:
                if i < bi:
                    continue
                b = m.blocks[i]
                if b.last_position < r.first_position:
                    continue
                if b.first_position > r.last_position:
                    break
                out = [
                    e
                    for e in self.block(cat, entry, i)
                    if e.stream_id == stream_id and e.version >= version
                ]
                if out:
                    return out, (si, i + 1)
            si, bi = si + 1, -1
        return [], None

    def drop_objects(self, cat: Catalog, keys: list[str]) -> None:
        """Delete replaced archive objects (after the catalog no longer names them) and
        forget every cached block."""
        blobs = self.blobs(cat)
        for key in keys:
            blobs.delete(key)
        self.forget()
