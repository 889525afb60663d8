"""The archive as a reader sees it: the segment index, manifests and blocks, checked
and cached (docs/archive.md). Blocking I/O; the asyncio face calls it on a worker thread.

It may import the core, :mod:`ares_events.errors` and the blob stores.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Final

from ares_events.archive.segment import Manifest, SegmentEntry, SegmentIndex, decode_block
from ares_events.core.events import RecordedEvent
from ares_events.errors import ArchiveError, BlobCorrupted, BlobMissing, ConfigError

logger = logging.getLogger(__name__)

__all__ = [
    "ARCHIVE_READ_NICE",
    "CACHE_EVENTS",
    "ArchiveSource",
    "StreamCursor",
    "archive_read_nice",
]

CACHE_EVENTS: Final = 65_536
"""Decoded events kept in the block cache (least recently used blocks go first)."""

StreamCursor = tuple[int, int]
"""Where a stream read goes on: (index of the segment in the segment index, block index)."""

_BlockKey = tuple[str, int]

ARCHIVE_READ_NICE = 19
"""The niceness of the thread that fetches and decodes archived blocks (Linux): cold reads
take the CPU hot ones leave."""


def archive_read_nice(env: Mapping[str, str] = os.environ) -> int:
    """``ARES_ARCHIVE_READ_NICE`` (0 = archive reads run at the caller's priority), default
    :data:`ARCHIVE_READ_NICE`.

    Raises:
        ConfigError: not an integer from 0 to 19.
    """
    raw = env.get("ARES_ARCHIVE_READ_NICE")
    if not raw:
        return ARCHIVE_READ_NICE
    with contextlib.suppress(ValueError):
        if 0 <= (value := int(raw)) <= 19:
            return value
    raise ConfigError(f"ARES_ARCHIVE_READ_NICE must be an integer from 0 to 19, got {raw!r}")


def _lower_priority(nice: int) -> None:
    """Run the calling thread at niceness ``nice`` or lower (Linux: niceness is per thread)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), nice))
    except OSError as exc:  # a sandbox that forbids it: reads still work, at normal priority
        logger.debug("archive reader keeps its priority: %s", exc)


@contextlib.contextmanager
def _fetching(seq: int, key: str, what: str) -> Iterator[None]:
    """The blob layer's errors of an archive object as :class:`ArchiveError` naming it."""
    try:
        yield
    except BlobMissing as exc:
        raise ArchiveError("missing", seq, key, f"{what} not in the archive") from exc
    except BlobCorrupted as exc:
        raise ArchiveError("corrupted", seq, key, f"{what}: {exc.detail}") from exc


class ArchiveSource:
    """SegmentIndex, manifests and blocks of one store's archive (thread-safe)."""

    def __init__(self, *, cache_events: int = CACHE_EVENTS, nice: int | None = None) -> None:
        """``nice``: the fetching thread's niceness (default ``ARES_ARCHIVE_READ_NICE``, 19).

        Raises:
            ConfigError: ``ARES_ARCHIVE_READ_NICE`` is malformed.
        """
        self._lock = threading.Lock()
        self._nice = archive_read_nice() if nice is None else nice
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._inflight: dict[_BlockKey, Future[list[RecordedEvent]]] = {}
        self._gen = 0  # bumped by forget(): a fetch that began before it is not cached
        self._closed = False
        self._blobs: Any = None
        self._blobs_url: str | None = None
        self._manifests: dict[str, Manifest] = {}
        self._blocks: OrderedDict[_BlockKey, list[RecordedEvent]] = OrderedDict()
        self._cached = 0
        self._limit = cache_events
        self.fetches = 0
        """Blocks fetched from the archive (for tests and the benchmark)."""

    def blobs(self, ix: SegmentIndex) -> Any:
        """The archive's blob store (opened once, without creating anything)."""
        with self._lock:
            if self._blobs is None or self._blobs_url != ix.url:
                from ares_events.stores.blobs import open_blobs

                if self._blobs is not None:
                    self._blobs.close()
                self._blobs = open_blobs(ix.url, create=False)
                self._blobs_url = ix.url
            return self._blobs

    def manifest(self, ix: SegmentIndex, entry: SegmentEntry) -> Manifest:
        """The manifest of ``entry``, checked against the segment index.

        Raises:
            ArchiveError: missing, altered, unreadable or not this segment's.
        """
        key = entry.manifest.key
        got = self._manifests.get(key)
        if got is not None:
            return got
        if entry.retired is not None:
            raise ArchiveError("retired", entry.seq, key, f"retired: {entry.retired}")
        with _fetching(entry.seq, key, "manifest"):
            data = self.blobs(ix).get(entry.manifest.as_payload_ref())
        m = Manifest.from_bytes(data, key)
        said = (m.seq, m.first_position, m.last_position, m.segment)
        if said != (entry.seq, entry.first_position, entry.last_position, entry.segment):
            raise ArchiveError("corrupted", entry.seq, key, "manifest is not this segment's")
        self._manifests[key] = m
        return m

    def check_segment(self, ix: SegmentIndex, entry: SegmentEntry) -> None:
        """Check the whole segment object against the size and blake3 the database records,
        the bytes no block read covers included (its header, anything after the last block).

        Raises:
            ArchiveError: the segment is missing or altered.
        """
        with _fetching(entry.seq, entry.segment.key, "segment"):
            self.blobs(ix).verify(entry.segment.as_payload_ref())

    def block(self, ix: SegmentIndex, entry: SegmentEntry, index: int) -> list[RecordedEvent]:
        """The events of block ``index`` of ``entry`` (one ranged read, digest-checked, on
        the archive's low-priority thread).

        Raises:
            ArchiveError: the segment or its manifest is missing, altered or unreadable.
        """
        m = self.manifest(ix, entry)
        with self._lock:
            got = self._cached_or_fetching(ix, entry, m, index)
        if got is None:  # closed: no thread to wait on
            return self._load(ix, entry, m, index, -1)
        return got if isinstance(got, list) else got.result()

    def prefetch(self, ix: SegmentIndex, entry: SegmentEntry, index: int) -> None:
        """Start fetching block ``index`` of ``entry`` (its manifest is already read), unless
        it is cached or on its way; a failure surfaces when the block is asked for."""
        m = self._manifests.get(entry.manifest.key)
        if m is None or not 0 <= index < len(m.blocks):
            return
        with self._lock:
            self._cached_or_fetching(ix, entry, m, index)

    def _cached_or_fetching(
        self, ix: SegmentIndex, entry: SegmentEntry, m: Manifest, index: int
    ) -> list[RecordedEvent] | Future[list[RecordedEvent]] | None:
        """The cached block, or its fetch (started if need be); None once closed. Holds
        the lock."""
        ck = (m.segment.key, m.blocks[index].offset)
        hit = self._blocks.get(ck)
        if hit is not None:
            self._blocks.move_to_end(ck)
            return hit
        if self._closed:
            return None
        fut = self._inflight.get(ck)
        if fut is None:
            fut = self._executor().submit(self._load, ix, entry, m, index, self._gen)
            self._inflight[ck] = fut
        return fut

    def _executor(self) -> ThreadPoolExecutor:
        """The fetching thread's executor (a new one in a forked child). Holds the lock."""
        pid = os.getpid()
        if self._pool is None or self._pool_pid != pid:
            if self._pool_pid != pid:
                self._inflight.clear()  # the parent's fetches do not run here
            self._pool = ThreadPoolExecutor(
                1, "ares-archive", initializer=_lower_priority, initargs=(self._nice,)
            )
            self._pool_pid = pid
        return self._pool

    def _load(
        self, ix: SegmentIndex, entry: SegmentEntry, m: Manifest, index: int, gen: int
    ) -> list[RecordedEvent]:
        b = m.blocks[index]
        ck = (m.segment.key, b.offset)
        try:
            with _fetching(entry.seq, m.segment.key, "segment"):  # a range: nothing checked
                data = self.blobs(ix).read_range(m.segment.key, b.offset, b.length)
            events = decode_block(data, b, entry.seq, m.segment.key)
        except BaseException:
            with self._lock:
                self._inflight.pop(ck, None)
            raise
        with self._lock:
            self.fetches += 1
            self._inflight.pop(ck, None)
            if gen == self._gen and ck not in self._blocks:
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
            self._inflight.clear()
            self._cached = 0
            self._gen += 1

    def close(self) -> None:
        """Stop the fetching thread (after the fetch under way) and close the archive's
        blob store."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._inflight.clear()
            self._closed = True
        if pool is not None and self._pool_pid == os.getpid():
            pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            if self._blobs is not None:
                self._blobs.close()
                self._blobs = None

    def events_after(
        self, ix: SegmentIndex, position: int, prefix: str | None
    ) -> tuple[list[RecordedEvent], int]:
        """Archived events after ``position`` from the next block that has any, and the
        position up to which the archive has now been read (the block's last one, or the
        end of a retired segment, whose events are gone).

        Raises:
            ArchiveError: a segment or manifest is missing, altered or unreadable.
        """
        entry = ix.after(position)
        if entry is None:
            return [], position
        if entry.retired is not None:
            return [], entry.last_position
        m = self.manifest(ix, entry)
        for i, b in enumerate(m.blocks):
            if b.last_position <= position:
                continue
            events = self.block(ix, entry, i)
            self.prefetch(ix, entry, i + 1)  # a scan goes on into the next block
            out = [e for e in events if e.position > position]
            if prefix:
                out = [e for e in out if e.stream_id.startswith(prefix)]
            return out, b.last_position
        return [], entry.last_position

    def stream_chunk(
        self, ix: SegmentIndex, stream_id: str, version: int, cursor: StreamCursor | None
    ) -> tuple[list[RecordedEvent], StreamCursor | None]:
        """Archived events of ``stream_id`` from ``version`` on, out of the next block that
        holds any, and the cursor to go on from (None: the archive has no more of them).

        Raises:
            ArchiveError: a segment or manifest is missing, altered or unreadable.
        """
        segs = ix.segments
        si, bi = cursor if cursor is not None else (0, -1)
        while si < len(segs):
            entry = segs[si]
            m = self.manifest(ix, entry) if entry.retired is None else None  # retired: gone
            r = m.streams.get(stream_id) if m is not None else None
            if m is None or r is None or r.last < version:
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
                    for e in self.block(ix, entry, i)
                    if e.stream_id == stream_id and e.version >= version
                ]
                if out:
                    nxt = next((j for j in wanted if j > i), None)
                    if nxt is not None:
                        self.prefetch(ix, entry, nxt)
                    return out, (si, i + 1)
            si, bi = si + 1, -1
        return [], None

    def segment_events(self, ix: SegmentIndex, entry: SegmentEntry) -> list[RecordedEvent]:
        """Every event of ``entry``, block by block.

        Raises:
            ArchiveError: the segment or its manifest is missing, altered or unreadable.
        """
        m = self.manifest(ix, entry)
        return [e for i in range(len(m.blocks)) for e in self.block(ix, entry, i)]

    def drop_objects(self, ix: SegmentIndex, keys: list[str]) -> None:
        """Delete replaced archive objects (after the segment index ``ix`` no longer names
        them) and forget every cached block. A key ``ix`` still references is kept: objects
        are content-addressed, so a rewrite to the same bytes replaced a key by itself."""
        blobs = self.blobs(ix)
        live = ix.live_keys()
        for key in keys:
            if key not in live:
                blobs.delete(key)
        self.forget()
