"""The archive's formats, with no I/O: segments, manifests and the segment index
(docs/archive.md, "Format").

It may import the core, :mod:`ares_events.chain` and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import blake3
import orjson

from ares_events.chain import canonical_json
from ares_events.core.events import PayloadRef, RecordedEvent
from ares_events.errors import ArchiveError

__all__ = [
    "BLOCK_EVENTS",
    "INDEX_KEY",
    "MAGIC",
    "RETENTION_TYPE",
    "SEGMENT_EVENTS",
    "THROUGH_KEY",
    "Block",
    "Manifest",
    "ObjectRef",
    "SegmentEntry",
    "SegmentIndex",
    "StreamRange",
    "decode_block",
    "encode_segment",
    "first_event",
    "parse_through",
    "row_of",
    "span",
    "stored",
    "streams_digest",
    "through_problem",
    "through_update",
    "tombstone_fields",
    "tombstone_problem",
]

MAGIC: Final = b"ARESSEG1\n"
INDEX_KEY: Final = "archive/catalog"
RETENTION_TYPE: Final = "archive.segment.retired"
THROUGH_KEY: Final = "archive/through"
"""``"<last archived position> <segment index revision>"``: what a reader checks around each
page (small, so the segment index itself is read only when it changed). A fast path
only: the segment index is the truth, and a reader takes the archive's end from the index
of the revision the row names (:func:`through_update` keeps the revision from going back)."""
SEGMENT_EVENTS: Final = 65_536
"""Default events per segment."""
BLOCK_EVENTS: Final = 1024
"""Events per compressed block: the unit a reader fetches and decodes."""
FORMAT: Final = 1
ZLIB_LEVEL: Final = 6  # measured (docs/archive.md): level 9 is 1.4% smaller, several times slower


def _digest(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An archive object: content-addressed key (hex blake3), size in bytes, digest."""

    key: str
    size: int
    digest: bytes

    @classmethod
    def of(cls, data: bytes) -> ObjectRef:
        """The reference of ``data`` as the archive's blob store will key it."""
        d = _digest(data)
        return cls(d.hex(), len(data), d)

    def as_payload_ref(self) -> PayloadRef:
        """The same reference in the blob layer's terms (its ``get`` checks size and
        digest)."""
        return PayloadRef(self.key, self.size, self.digest)

    def to_doc(self) -> dict[str, Any]:
        """The JSON form."""
        return {"key": self.key, "size": self.size, "digest": self.digest.hex()}

    @classmethod
    def from_doc(cls, d: Any) -> ObjectRef:
        """Parse the JSON form (ValueError/KeyError/TypeError on a bad one)."""
        return cls(str(d["key"]), int(d["size"]), bytes.fromhex(d["digest"]))


@dataclass(frozen=True, slots=True)
class Block:
    """One compressed block of a segment: where it is and what it holds."""

    offset: int
    length: int
    first_position: int
    last_position: int
    count: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class StreamRange:
    """A stream's events in one segment: versions ``first..last`` at positions
    ``first_position..last_position``, and the hash of its last one (where the chain
    continues)."""

    first: int
    last: int
    first_position: int
    last_position: int
    last_hash: bytes
    blocks: tuple[int, ...] = ()
    """The blocks that hold its events (a reader decodes only those)."""


_SPAN: Final = ("seq", "first_position", "last_position", "events")


def span(x: Manifest | SegmentEntry) -> dict[str, int]:
    """The ``seq``, positions and ``events`` of a segment, as its documents spell them."""
    return {k: getattr(x, k) for k in _SPAN}


def _span_of(d: Any) -> dict[str, Any]:
    return {k: int(d[k]) for k in _SPAN}


def _range_doc(r: StreamRange) -> list[Any]:
    return [r.first, r.last, r.first_position, r.last_position, r.last_hash.hex(), list(r.blocks)]


def _stream_range(r: Sequence[Any]) -> StreamRange:
    blocks = tuple(int(b) for b in r[5]) if len(r) > 5 else ()
    return StreamRange(int(r[0]), int(r[1]), int(r[2]), int(r[3]), bytes.fromhex(r[4]), blocks)


@dataclass(frozen=True, slots=True)
class Manifest:
    """What one segment holds (docs/archive.md, "Format")."""

    seq: int
    first_position: int
    last_position: int
    events: int
    segment: ObjectRef
    blocks: tuple[Block, ...]
    streams: dict[str, StreamRange]
    tree_size: int
    root: bytes
    segment_root: bytes
    checkpoint: str | None
    created_at: str
    erased: int = 0

    def to_bytes(self) -> bytes:
        """The stored form (canonical JSON)."""
        doc = {
            "format": FORMAT,
            "kind": "ares-events/archive-segment",
            **span(self),
            "segment": self.segment.to_doc(),
            "blocks": [
                [b.offset, b.length, b.first_position, b.last_position, b.count, b.digest.hex()]
                for b in self.blocks
            ],
            "streams": {sid: _range_doc(r) for sid, r in self.streams.items()},
            "merkle": {
                "tree_size": self.tree_size,
                "root": self.root.hex(),
                "segment_root": self.segment_root.hex(),
                "checkpoint": self.checkpoint,
            },
            "created_at": self.created_at,
            "erased": self.erased,
        }
        return canonical_json(doc, field="manifest")

    @classmethod
    def from_bytes(cls, data: bytes, key: str = "?") -> Manifest:
        """Parse the stored form.

        Raises:
            ArchiveError: not a manifest of this format (kind ``unreadable``).
        """
        try:
            d = orjson.loads(data)
            if d.get("kind") != "ares-events/archive-segment" or d.get("format") != FORMAT:
                raise ValueError(f"not an archive manifest of format {FORMAT}")
            m = d["merkle"]
            return cls(
                **_span_of(d),
                segment=ObjectRef.from_doc(d["segment"]),
                blocks=tuple(
                    Block(int(o), int(n), int(a), int(b), int(c), bytes.fromhex(h))
                    for o, n, a, b, c, h in d["blocks"]
                ),
                streams={str(sid): _stream_range(r) for sid, r in d["streams"].items()},
                tree_size=int(m["tree_size"]),
                root=bytes.fromhex(m["root"]),
                segment_root=bytes.fromhex(m["segment_root"]),
                checkpoint=m.get("checkpoint"),
                created_at=str(d.get("created_at", "")),
                erased=int(d.get("erased", 0)),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArchiveError("unreadable", None, key, f"manifest does not parse: {exc}") from exc


@dataclass(frozen=True, slots=True)
class SegmentEntry:
    """The segment index's line for one segment. ``retired`` (a tombstone) when the segment
    was deleted past a retention horizon: ``tombstone`` then says why and when, and
    ``streams_end`` keeps each stream's last version and hash in it, so verification
    continues from there."""

    seq: int
    first_position: int
    last_position: int
    events: int
    manifest: ObjectRef
    segment: ObjectRef
    tree_size: int
    root: bytes
    retired: dict[str, Any] | None = None
    streams_end: dict[str, tuple[int, bytes]] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        """The JSON form."""
        doc: dict[str, Any] = {
            **span(self),
            "manifest": self.manifest.to_doc(),
            "segment": self.segment.to_doc(),
            "tree_size": self.tree_size,
            "root": self.root.hex(),
        }
        if self.retired is not None:
            doc["retired"] = self.retired
            doc["streams_end"] = {s: [v, h.hex()] for s, (v, h) in self.streams_end.items()}
        return doc

    @classmethod
    def from_doc(cls, d: Any) -> SegmentEntry:
        """Parse the JSON form."""
        return cls(
            **_span_of(d),
            manifest=ObjectRef.from_doc(d["manifest"]),
            segment=ObjectRef.from_doc(d["segment"]),
            tree_size=int(d["tree_size"]),
            root=bytes.fromhex(d["root"]),
            retired=d.get("retired"),
            streams_end={
                str(s): (int(v), bytes.fromhex(h)) for s, (v, h) in d.get("streams_end", {}).items()
            },
        )


@dataclass(frozen=True, slots=True)
class SegmentIndex:
    """The store's record of its archive (docs/archive.md, "Format")."""

    location: str
    url: str
    segments: tuple[SegmentEntry, ...] = ()
    rev: int = 0
    pending: tuple[str, ...] = ()
    """Keys of objects a rewrite replaced (an erasure's old segment and manifest), to be
    deleted: listed here in the same swap that drops them from the segments, so a crash
    before the delete leaves them named, and the next run deletes them."""

    @property
    def through(self) -> int:
        """The last archived global position (0: nothing archived)."""
        return self.segments[-1].last_position if self.segments else 0

    def segment_at(self, position: int) -> SegmentEntry | None:
        """The segment holding ``position`` (None: not archived)."""
        segs = self.segments
        i = bisect.bisect_left(segs, position, key=lambda s: s.last_position)
        if i < len(segs) and segs[i].first_position <= position:
            return segs[i]
        # between two segments (a PostgreSQL sequence gap): the next one holds what follows
        return None

    def after(self, position: int) -> SegmentEntry | None:
        """The first segment with events after ``position`` (None: none)."""
        i = bisect.bisect_right(self.segments, position, key=lambda s: s.last_position)
        return self.segments[i] if i < len(self.segments) else None

    def retired_end(self, stream_id: str) -> tuple[int, bytes] | None:
        """The last version and hash of ``stream_id`` in retired segments (where its
        readable chain starts, trusted like a snapshot's ``at_hash``), or None."""
        end = None
        for entry in self.segments:
            if entry.retired is None:
                break  # retention removes the oldest segments only
            end = entry.streams_end.get(stream_id, end)
        return end

    def retired_ranges(self) -> list[tuple[int, int]]:
        """The position ranges of retired segments (their events are gone)."""
        return [(s.first_position, s.last_position) for s in self.segments if s.retired]

    def with_segment(self, entry: SegmentEntry) -> SegmentIndex:
        """The segment index with ``entry`` appended or replacing the one of its ``seq``."""
        segs = [s for s in self.segments if s.seq != entry.seq]
        segs.append(entry)
        segs.sort(key=lambda s: s.seq)
        return replace(self, segments=tuple(segs), rev=self.rev + 1)

    def to_json(self) -> str:
        """The stored form (canonical JSON)."""
        doc = {
            "format": FORMAT,
            "location": self.location,
            "url": self.url,
            "rev": self.rev,
            "segments": [s.to_doc() for s in self.segments],
        }
        if self.pending:
            doc["pending"] = list(self.pending)
        return canonical_json(doc, field="archive segment index").decode()

    def live_keys(self) -> frozenset[str]:
        """The keys of every manifest and segment object the index references (a retired
        segment's are gone)."""
        return frozenset(
            k for s in self.segments if s.retired is None for k in (s.manifest.key, s.segment.key)
        )

    @classmethod
    def from_json(cls, text: str) -> SegmentIndex:
        """Parse the stored form.

        Raises:
            ArchiveError: the record does not parse (kind ``unreadable``).
        """
        try:
            d = orjson.loads(text)
            if d.get("format") != FORMAT:
                raise ValueError(
                    f"segment index format {d.get('format')!r}, this build reads {FORMAT}"
                )
            return cls(
                location=str(d["location"]),
                url=str(d["url"]),
                segments=tuple(SegmentEntry.from_doc(s) for s in d["segments"]),
                rev=int(d.get("rev", 0)),
                pending=tuple(str(k) for k in d.get("pending", ())),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ArchiveError(
                "unreadable", None, INDEX_KEY, f"the segment index does not parse: {exc}"
            ) from exc


def parse_through(raw: str) -> tuple[int, int]:
    """``archive/through``'s ``"<last archived position> <revision>"``.

    Raises:
        ArchiveError: it does not parse (kind ``unreadable``).
    """
    try:
        through, rev = map(int, raw.split())
    except ValueError as exc:
        raise ArchiveError("unreadable", None, THROUGH_KEY, f"bad value {raw!r}") from exc
    return through, rev


def through_update(raw: str | None, ix: SegmentIndex) -> str | None:
    """The ``archive/through`` value to write in place of ``raw`` once ``ix`` is recorded,
    or None when ``raw`` already names ``ix``'s revision or a later one (the writer of a
    later index recorded its own row: writing ours would move the row back, and a reader
    that cached the older index would then skip what that later run deleted). A row that
    does not parse is replaced."""
    if raw is not None:
        try:
            if parse_through(raw)[1] >= ix.rev:
                return None
        except ArchiveError:
            pass
    return f"{ix.through} {ix.rev}"


def through_problem(raw: str | None, ix: SegmentIndex) -> str | None:
    """Why ``archive/through`` (``raw``) disagrees with the segment index ``ix`` beyond the
    lag of a writer between its two writes (a revision behind, an end not past the
    index's), or None. Readers go by the index either way; the audit reports it."""
    if raw is None:
        return None
    try:
        through, rev = parse_through(raw)
    except ArchiveError as exc:
        return exc.detail
    if rev > ix.rev or (rev == ix.rev and through != ix.through) or through > ix.through:
        return (
            f"{THROUGH_KEY} says position {through} at revision {rev}; the segment index "
            f"ends at {ix.through} at revision {ix.rev}"
        )
    return None


def row_of(e: RecordedEvent) -> list[Any]:
    """The segment row of an event (its stored columns, nothing decoded)."""
    # Tuple items, not properties: this runs for every archived event.
    raw, ref = e[6], e[11]
    return [
        e[0], e[1], e[2], e[3], e[4], e[5],
        None if raw is None else bytes(raw).decode(),
        bytes(e[7]).decode(), e[8], bytes(e[9]).hex(), bytes(e[10]).hex(),
        None if ref is None else ref.to_json().decode(),
    ]  # fmt: skip


def stored(e: RecordedEvent) -> tuple[Any, ...]:
    """Every stored column of an event, comparable (``==`` on events compares identity
    only: stream, version, position, hash)."""
    return (*e[:6], None if e[6] is None else bytes(e[6]), bytes(e[7]), *e[8:12])


def _event_of(r: Sequence[Any]) -> RecordedEvent:
    payload = r[6]
    return RecordedEvent._from_row((
        *r[:6], None if payload is None else payload.encode(), r[7].encode(), r[8],
        bytes.fromhex(r[9]), bytes.fromhex(r[10]), r[11],
    ))  # fmt: skip


def encode_segment(
    events: Sequence[RecordedEvent], *, block_events: int = BLOCK_EVENTS
) -> tuple[bytes, tuple[Block, ...]]:
    """The segment bytes of ``events`` (position order) and its block index."""
    out = bytearray(MAGIC)
    blocks = []
    for i in range(0, len(events), block_events):
        chunk = events[i : i + block_events]
        data = zlib.compress(orjson.dumps([row_of(e) for e in chunk]), ZLIB_LEVEL)
        first, last = chunk[0].position, chunk[-1].position
        blocks.append(Block(len(out), len(data), first, last, len(chunk), _digest(data)))
        out += data
    return bytes(out), tuple(blocks)


def decode_block(data: bytes, block: Block, seq: int, key: str) -> list[RecordedEvent]:
    """The events of one block's bytes, after checking them against the manifest.

    Raises:
        ArchiveError: the bytes differ from the block's digest (``corrupted``) or do not
            decode (``unreadable``).
    """
    if len(data) != block.length or _digest(data) != block.digest:
        raise ArchiveError(
            "corrupted", seq, key, f"block at offset {block.offset} differs from its manifest"
        )
    try:
        rows = orjson.loads(zlib.decompress(data))
        events = [_event_of(r) for r in rows]
    except (zlib.error, orjson.JSONDecodeError, TypeError, ValueError, IndexError) as exc:
        raise ArchiveError(
            "unreadable", seq, key, f"block at offset {block.offset} does not decode: {exc}"
        ) from exc
    if len(events) != block.count:
        raise ArchiveError("corrupted", seq, key, f"block at offset {block.offset}: wrong count")
    return events


def first_event(data: bytes, key: str) -> RecordedEvent:
    """The first event of the whole segment object ``data``, read without its manifest
    (to tell whose an object no segment index records is).

    Raises:
        ArchiveError: it is not a segment that decodes (kind ``unreadable``).
    """
    try:
        if not data.startswith(MAGIC):
            raise ValueError("no segment header")
        # The first block is the first zlib stream after the header.
        return _event_of(orjson.loads(zlib.decompressobj().decompress(data[len(MAGIC) :]))[0])
    except (zlib.error, orjson.JSONDecodeError, TypeError, ValueError, IndexError) as exc:
        raise ArchiveError("unreadable", None, key, f"not a segment that decodes: {exc}") from exc


def stream_ranges(
    events: Sequence[RecordedEvent], *, block_events: int = BLOCK_EVENTS
) -> dict[str, StreamRange]:
    """Each stream's version range, positions, last hash and blocks in ``events`` (as
    :func:`encode_segment` cuts them into blocks)."""
    spans: dict[str, list[Any]] = {}
    for i, e in enumerate(events):
        sid, b = e[0], i // block_events
        r = spans.get(sid)
        if r is None:
            spans[sid] = [e[1], e[1], e[2], e[2], e[10], [b]]
        else:
            r[1], r[3], r[4] = e[1], e[2], e[10]
            if r[5][-1] != b:
                r[5].append(b)
    return {
        sid: StreamRange(r[0], r[1], r[2], r[3], bytes(r[4]), tuple(r[5]))
        for sid, r in spans.items()
    }


def streams_digest(ends: dict[str, tuple[int, bytes]]) -> str:
    """Hex blake3 of the canonical JSON of every stream's last version and hash in a
    segment (what a retention record commits to)."""
    doc = {sid: [v, h.hex()] for sid, (v, h) in sorted(ends.items())}
    return blake3.blake3(canonical_json(doc, field="streams")).hexdigest()


def tombstone_fields(entry: SegmentEntry, ends: dict[str, tuple[int, bytes]]) -> dict[str, Any]:
    """What a retention record (and so the tombstone) commits to about the segment
    ``entry`` whose streams end at ``ends``."""
    return {
        **span(entry),
        "tree_size": entry.tree_size,
        "root": entry.root.hex(),
        "manifest_digest": entry.manifest.digest.hex(),
        "segment_digest": entry.segment.digest.hex(),
        "streams_digest": streams_digest(ends),
    }


def tombstone_problem(entry: SegmentEntry, record: Any) -> str | None:
    """Why a retired segment's tombstone does not match its retention record's payload
    (``record``, None when there is none), or None."""
    if not isinstance(record, dict):
        return f"retired segment {entry.seq} has no {RETENTION_TYPE} record"
    for k, v in tombstone_fields(entry, entry.streams_end).items():
        if record.get(k) != v:
            return f"retired segment {entry.seq}: its tombstone's {k} differs from its record"
    return None
