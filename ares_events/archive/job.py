"""The archive run (docs/archive.md): seal old events into segments, verify and record
them, and only then delete their rows.

It may import the core, stores, integrity and the projections below it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ares_events.archive.erase import put_checked, record_through, settle_pending, swap_index
from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.segment import (
    BLOCK_EVENTS,
    MAGIC,
    SEGMENT_EVENTS,
    Manifest,
    SegmentEntry,
    SegmentIndex,
    decode_block,
    encode_segment,
    first_event,
    span,
    stored,
    stream_ranges,
)
from ares_events.archive.source import ArchiveSource
from ares_events.core.backend import ArchivedRow, Capability
from ares_events.core.blobs import BlobInfo
from ares_events.core.events import (
    RECORD_STREAMS,
    ErasedPayloadRef,
    RecordedEvent,
    format_at,
    utc_now_at,
)
from ares_events.core.faces import blocking
from ares_events.core.identity import IDENTITY_KEY, BlobsIdentity, StoreIdentity
from ares_events.core.recorder import system_of_record
from ares_events.errors import (
    ArchiveError,
    BlobMissing,
    ChainIntegrityError,
    ConfigError,
    ProofError,
    StoreError,
)
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import Checkpoint, sign_checkpoint
from ares_events.integrity.findings import Finding
from ares_events.integrity.verifier import ChainVerifier
from ares_events.projections.merkle import TILE_WIDTH, MerkleLog
from ares_events.stores.blobs.gc import check_apart, parse_duration
from ares_events.stores.cache import CachedRecorder

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.integrity.notes import SigningKey

logger = logging.getLogger(__name__)

__all__ = ["ArchiveReport", "archive", "parse_before"]

STEPS: Final = ("written", "verified", "recorded", "deleted")
"""The steps of one segment, in order (what the crash tests stop after)."""


def _step(name: str) -> None:
    """Called after each of :data:`STEPS` (the crash tests replace it to ``kill -9``)."""


@dataclass
class ArchiveReport:
    """What one archive run did.

    Attributes:
        archive: the archive's location (no credentials).
        through: the last archived position after the run.
        segments: one dict per sealed segment (seq, positions, events, bytes, tree size, root).
        events_archived: events sealed by this run.
        rows_deleted: database rows removed (this run's and any a crashed run left).
        resumed: segments of an earlier, interrupted run whose rows this run deleted.
        kept: events left in the database inside archived ranges (each stream's last one).
        archive_bytes: bytes written to the archive (segments and manifests).
        row_bytes: the stored size of the archived events' columns in the database.
    """

    archive: str
    through: int = 0
    segments: list[dict[str, Any]] = field(default_factory=list)
    events_archived: int = 0
    rows_deleted: int = 0
    resumed: int = 0
    kept: int = 0
    archive_bytes: int = 0
    row_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``ares-events archive --json``)."""
        return dataclasses.asdict(self)


def parse_before(text: str, option: str = "--before") -> int | timedelta:
    """``--before``: a global position (``120000``) or an age (``90d``, ``12h``, ``30m``,
    ``45s``, ``2w``, ``7y``: a year is 365 days).

    Raises:
        ConfigError: neither.
    """
    t = text.strip().lower()
    if t.isdigit() and int(t) < 2**63:
        return int(t)
    try:
        return parse_duration(t)
    except ConfigError as exc:
        raise ConfigError(
            f"{option} must be a position (e.g. 120000) or an age of up to 1000 years (e.g. "
            f"90d, 12h), got {text!r:.40}"
        ) from exc


def _archive_reader(store: EventStore) -> ArchiveRecorder:
    """The store's archive reader, plugged in (under any cache) if the store had none."""
    rec = system_of_record(store.recorder)
    if isinstance(rec, ArchiveRecorder):
        return rec
    if Capability.CELL_CURSORS in rec.capabilities:
        raise ConfigError(
            f"store {store.url}: its cells are on separate servers, with a position space "
            "each, and an archive segment is a range of one position space: archive cells "
            "that share one clock (pgcells:// schemas of one database, citus://)"
        )
    if Capability.ARCHIVE not in rec.capabilities or Capability.METADATA not in rec.capabilities:
        raise ConfigError(
            f"store {store.url}: its backend cannot archive (Capability.ARCHIVE: SQLite, "
            "PostgreSQL and cells on one clock can)"
        )
    reader = ArchiveRecorder(rec)
    if isinstance(store.recorder, CachedRecorder):
        store.recorder.inner = reader
    else:
        store.recorder = reader
    return reader


def archive(
    store: EventStore,
    to: str,
    *,
    before: int | timedelta | datetime,
    segment_events: int = SEGMENT_EVENTS,
    block_events: int = BLOCK_EVENTS,
    key: SigningKey | None = None,
    max_segments: int | None = None,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> ArchiveReport:
    """Archive the events before ``before`` to the blob store at ``to`` (docs/archive.md gives
    the order of steps and what a crash leaves).

    Args:
        store: a SQLite, PostgreSQL or cell store on one clock (blocking face).
        to: ``s3://bucket/prefix?...`` or ``file:///dir``; not the store's blob location,
            nor inside it or around it. Recorded in the store's segment index and identity
            when the first segment is committed; later runs must name the same location.
        before: archive events at positions below this one, or recorded before this
            time (a ``datetime``) or longer than this ago (a ``timedelta``).
        segment_events: events per segment at most.
        block_events: events per compressed block (the unit a reader fetches): smaller
            blocks make point reads of archived events cheaper and compress worse.
        key: sign a checkpoint of the Merkle log at each segment's end.
        max_segments: stop after this many segments (None: as many as there are).
        progress: called with each sealed segment's line of the report.

    Raises:
        ConfigError: ``to`` overlaps the blob location, or is another location than the
            one this store archives to; a bad ``before``; a backend that cannot archive.
        ChainIntegrityError: the events to archive do not verify (nothing is written).
        ArchiveError: what was read back differs from what was written, or another run
            changed the segment index meanwhile.
        StoreUnavailable: the store or the archive cannot be reached.
    """
    store = blocking(store, "ares_events.archive.job.archive")
    for name, n in (("segment_events", segment_events), ("block_events", block_events)):
        if n < 1:
            raise ConfigError(f"{name} must be at least 1, got {n!r}")
    rec = _archive_reader(store)
    inner, source = rec.inner, rec.source
    from ares_events.stores.blobs import open_blobs

    with open_blobs(to, create=True) as target:
        location, url = target.location, str(getattr(target, "url", to))
    check_apart(store.blobs, location)
    text, ix = rec._index_text()
    # The segment index binds the store to its location from its first commit on; a run
    # that fails or finds nothing before that binds nothing.
    recorded = ix is not None
    if ix is None:  # (and text is None: nothing was ever archived)
        ix = SegmentIndex(location, url)
    elif ix.location != location:
        raise ConfigError(f"store {store.url} archives to {ix.location}, not to {location}")
    else:  # recorded already, unless a run stopped between its first commit and that
        _record_identity(store, inner, ix)
    report = ArchiveReport(location)
    text, ix = settle_pending(inner, source, text, ix)  # an erasure's leftovers
    # An interrupted run: segments recorded whose rows are still here.
    report.resumed, report.rows_deleted, text, ix = _finish_deletes(inner, source, text, ix)
    if ix.segments:  # a crash between the segment index and its end row: write the end again
        record_through(inner, ix)  # never back: a later writer's row stays
    mlog = MerkleLog(store)
    mlog.catch_up()
    cutoff_pos, cutoff_at = _cutoff(before, inner.last_position())
    heads: dict[str, int] = {}
    while max_segments is None or len(report.segments) < max_segments:
        events, kept, end = _collect(
            inner, ix.through, segment_events, cutoff_pos, cutoff_at, heads
        )
        report.kept += kept
        if not events:
            break
        _check_chains(events, store)
        entry, manifest, nbytes = _seal(source, ix, events, mlog, key, block_events)
        report.archive_bytes += nbytes
        ix = ix.with_segment(entry)
        # Listed before the swap, so every object in it was written before our commit.
        listed = None if report.segments else _listing(source, ix, entry)
        text = swap_index(
            inner, text, ix, entry.seq, "another archive run changed the segment index"
        )
        if not recorded:  # before any row goes: a store opened from now on reads through
            _record_identity(store, inner, ix)
            recorded = True
        _step("recorded")
        if listed is not None:
            _sweep(source, ix, mlog, *listed)
        n, text, ix = _delete(inner, source, text, ix, entry, events)
        report.rows_deleted += n
        _step("deleted")
        line = {
            **span(entry),
            "bytes": entry.segment.size,
            "tree_size": entry.tree_size,
            "root": entry.root.hex(),
            "checkpoint": manifest.checkpoint is not None,
        }
        report.segments.append(line)
        report.events_archived += len(events)
        report.row_bytes += sum(_row_size(e) for e in events)
        if progress is not None:
            progress(line)
        if end:
            break
    report.through = ix.through
    logger.info(
        "archived %d events in %d segments to %s (through position %d)",
        report.events_archived, len(report.segments), location, report.through,
    )  # fmt: skip
    return report


def _listing(
    source: ArchiveSource, ix: SegmentIndex, entry: SegmentEntry
) -> tuple[list[BlobInfo], datetime] | None:
    """The archive's objects and ``entry``'s segment's modified time (None: not listed)."""
    infos = list(source.blobs(ix).list_blobs())
    t = next((i.modified for i in infos if i.key == entry.segment.key), None)
    return None if t is None else (infos, t)


def _sweep(
    source: ArchiveSource, ix: SegmentIndex, mlog: MerkleLog, infos: list[BlobInfo], t: datetime
) -> None:
    """Delete this store's objects of ``infos`` that ``ix`` does not reference (left by an
    interrupted or outraced run or erasure; an erased payload's old object stays otherwise).

    Safe while others write: our swap compared the whole index text, and everything listed
    predates it (``t`` is no later); a re-put of the same bytes is kept by
    ``if_older_than``; another store's objects (not its Merkle log's) are left alone."""
    blobs = source.blobs(ix)
    live = ix.live_keys()
    for info in infos:
        if info.key in live or info.modified >= t or not _ours(blobs, mlog, info):
            continue
        if blobs.delete(info.key, if_older_than=t):
            logger.info("deleted unrecorded archive object %s", info.key)


def _ours(blobs: Any, mlog: MerkleLog, info: BlobInfo) -> bool:
    """Whether ``info`` is a manifest or segment sealed from this store's Merkle log."""
    try:
        data = blobs.read_range(info.key, 0, info.size)
        if data.startswith(MAGIC):  # a segment: its first event's leaf is ours
            e = first_event(data, info.key)
            i = mlog.index_of(e.position)
            return i is not None and mlog.leaf_hash(i) == merkle.leaf_hash(e.hash)
        m = Manifest.from_bytes(data, info.key)
        return mlog.root(m.tree_size) == m.root
    except (ArchiveError, BlobMissing, ProofError, ValueError, TypeError, IndexError, KeyError):
        return False


def _row_size(e: RecordedEvent) -> int:
    raw = e._payload_bytes
    ref = e.payload_ref
    return (
        len(e.stream_id.encode()) + 16 + 36 + len(e.type) + len(e.module) + len(e.at)
        + (len(raw) if raw is not None else 0) + len(e.metadata_json) + 64
        + (len(ref.to_json()) if ref is not None else 0)
    )  # fmt: skip


def _record_identity(store: EventStore, inner: Any, ix: SegmentIndex) -> None:
    """Record the committed index's location in the store's identity (what makes
    ``open_store`` read through): only after the index's compare-and-set, so two runs to
    different locations cannot both be recorded; an uncommitted one is replaced."""
    for _ in range(3):
        raw = inner.meta_get(IDENTITY_KEY)
        if raw is None:
            return  # a store never written to has nothing to archive
        ident = StoreIdentity.from_json(raw, store.url)
        if ident.archive is None or ident.archive.location != ix.location:
            new = dataclasses.replace(ident, archive=BlobsIdentity(ix.location, ix.url))
            if not inner.meta_swap(IDENTITY_KEY, raw, new.to_json()):
                continue
            ident = new
        store._identity = ident  # what replay and verify consult to look for retired segments
        return
    raise ArchiveError("busy", None, IDENTITY_KEY, "the identity kept changing; run again")


def _cutoff(before: int | timedelta | datetime, last: int) -> tuple[int, str | None]:
    """(archive positions below this, and recorded before this ``at`` or None)."""
    if isinstance(before, bool):
        raise ConfigError("before must be a position, a datetime or a timedelta")
    if isinstance(before, int):
        if before < 1:
            raise ConfigError(f"before must be a position of at least 1, got {before}")
        return min(before, last + 1), None
    if isinstance(before, timedelta):
        before = datetime.now(UTC) - before
    if before.tzinfo is None:
        raise ConfigError("before must be an aware datetime (UTC)")
    return last + 1, format_at(before.astimezone(UTC))


def _collect(
    inner: Any, after: int, want: int, cutoff_pos: int, cutoff_at: str | None, heads: dict[str, int]
) -> tuple[list[RecordedEvent], int, bool]:
    """The next segment's events after ``after`` (streams' last events and record streams
    left out), how many were left out, and whether the cutoff was reached."""
    events: list[RecordedEvent] = []
    kept = 0
    pos = after
    while len(events) < want:
        page = list(inner.read_all(pos, min(4096, (want - len(events)) * 2 + 16)))
        if not page:
            return events, kept, True
        for e in page:
            p = e.position
            if type(p) is not int or type(e.version) is not int or type(e.stream_id) is not str:
                raise ChainIntegrityError(
                    None, [Finding("malformed_row", None, None, f"row at position {p!r}")]
                )
            if p >= cutoff_pos or (cutoff_at is not None and e.at >= cutoff_at):
                return events, kept, True
            if e.stream_id in RECORD_STREAMS:
                kept += 1
                pos = p
                continue
            head = heads.get(e.stream_id)
            if head is None or head <= e.version:
                h = inner.head(e.stream_id)
                head = heads[e.stream_id] = h.version if h is not None else 0
            if e.version >= head:
                kept += 1  # the stream's last event stays: tails never need the archive
            else:
                events.append(e)
                if len(events) == want:
                    return events, kept, False
            pos = p
    return events, kept, False


def _check_chains(events: list[RecordedEvent], store: EventStore) -> None:
    by_stream: dict[str, list[RecordedEvent]] = {}
    for e in events:
        by_stream.setdefault(e.stream_id, []).append(e)
    findings: list[Finding] = []
    for sid, run in by_stream.items():
        first = run[0]
        start = first.prev_hash if first.version > 1 else None
        v = ChainVerifier(sid, store.chain_key, start_version=first.version - 1, start_hash=start)
        for i in range(0, len(run), 64):
            v.check_page(run[i : i + 64])
        findings.extend(v.findings)
    if findings:
        raise ChainIntegrityError(None, findings)


def _seal(
    source: ArchiveSource,
    ix: SegmentIndex,
    events: list[RecordedEvent],
    mlog: MerkleLog,
    key: SigningKey | None,
    block_events: int,
) -> tuple[SegmentEntry, Manifest, int]:
    seq = ix.segments[-1].seq + 1 if ix.segments else 1
    leaves = [merkle.leaf_hash(e.hash) for e in events]
    size = _check_leaves(mlog, events, leaves)
    root = mlog.root(size)
    checkpoint = None if key is None else sign_checkpoint(Checkpoint(key.name, size, root), key)
    data, blocks = encode_segment(events, block_events=block_events)
    seg_ref = put_checked(source, ix, data, seq)
    manifest = Manifest(
        seq, events[0].position, events[-1].position, len(events), seg_ref, blocks,
        stream_ranges(events, block_events=block_events), size, root, merkle.root(leaves),
        checkpoint, utc_now_at(),
    )  # fmt: skip
    mbytes = manifest.to_bytes()
    man_ref = put_checked(source, ix, mbytes, seq)
    _step("written")
    # Read back: every block digest-checked and decoded, every row as the database had it.
    blobs = source.blobs(ix)
    back = blobs.get(man_ref.as_payload_ref())
    if Manifest.from_bytes(back, man_ref.key) != manifest:
        raise ArchiveError("corrupted", seq, man_ref.key, "manifest read back differs")
    got: list[RecordedEvent] = []
    for b in blocks:
        got.extend(
            decode_block(blobs.read_range(seg_ref.key, b.offset, b.length), b, seq, seg_ref.key)
        )
    if [stored(e) for e in got] != [stored(e) for e in events]:
        raise ArchiveError("corrupted", seq, seg_ref.key, "segment read back differs")
    if merkle.root([merkle.leaf_hash(e.hash) for e in got]) != manifest.segment_root:
        raise ArchiveError("corrupted", seq, seg_ref.key, "segment root differs")
    _step("verified")
    entry = SegmentEntry(
        seq, manifest.first_position, manifest.last_position, len(events), man_ref, seg_ref,
        size, root,
    )  # fmt: skip
    return entry, manifest, len(data) + len(mbytes)


def _check_leaves(mlog: MerkleLog, events: list[RecordedEvent], leaves: list[bytes]) -> int:
    """Check ``leaves`` against the Merkle log; the tree's size at the last one."""
    first = mlog.index_of(events[0].position)
    last = mlog.index_of(events[-1].position)
    if first is None or last is None:
        raise StoreError("the Merkle log does not hold the events to archive (catch it up)")
    tiles = mlog._tiles()
    j = 0
    for i in range(first, last + 1):
        # the stored leaf hashes, straight from the bottom tiles (32 bytes each)
        hashes, _ = tiles.get(0, i // TILE_WIDTH)
        off = (i % TILE_WIDTH) * 32
        if j < len(leaves) and hashes[off : off + 32] == leaves[j]:
            j += 1
    if j != len(leaves):
        e = events[j]
        raise StoreError(
            f"stream {e.stream_id!r} version {e.version}: its hash is not its Merkle leaf "
            "(rebuild the Merkle log, then archive)"
        )
    return last + 1


def _expected(events: list[RecordedEvent]) -> list[ArchivedRow]:
    refs = [None if e.payload_ref is None else e.payload_ref.to_json().decode() for e in events]
    return [(e.position, e.hash, ref, e.stream_id) for e, ref in zip(events, refs, strict=True)]


def _delete(
    inner: Any, source: ArchiveSource, text: str | None, ix: SegmentIndex, entry: SegmentEntry,
    events: list[RecordedEvent],
) -> tuple[int, str | None, SegmentIndex]:  # fmt: skip
    """Delete the segment's rows (erasures made since it was written carried into it
    first); the rows deleted and the segment index now."""
    for _ in range(3):
        try:
            n = inner.delete_archived(entry.first_position, entry.last_position, _expected(events))
            return int(n), text, ix
        except ArchiveError:
            raise
        except StoreError:
            text, ix, entry, events = _reseal(inner, source, text, ix, entry, events)
    raise ArchiveError(
        "changed", entry.seq, entry.segment.key,
        "its rows keep changing while they are archived; run the archive again",
    )  # fmt: skip


def _reseal(
    inner: Any, source: ArchiveSource, text: str | None, ix: SegmentIndex, entry: SegmentEntry,
    events: list[RecordedEvent],
) -> tuple[str | None, SegmentIndex, SegmentEntry, list[RecordedEvent]]:  # fmt: skip
    """Carry erasures made in the database since the segment was written into it."""
    from ares_events.archive.erase import erase_archived

    db: dict[int, RecordedEvent] = {}
    pos = entry.first_position - 1
    while True:
        page = list(inner.read_all(pos, 4096))
        for e in page:
            if type(e.position) is int and e.position <= entry.last_position:
                db[e.position] = e
        if len(page) < 4096 or page[-1].position > entry.last_position:
            break
        pos = page[-1].position
    for e in events:
        d = db.get(e.position)
        if d is None or d.hash != e.hash:
            raise ArchiveError(
                "changed", entry.seq, entry.segment.key,
                f"the row at position {e.position} is gone or differs from the archived one: "
                "audit the store",
            )  # fmt: skip
        ref = d.payload_ref
        if isinstance(ref, ErasedPayloadRef) and not e.payload_erased:
            done = erase_archived(source, ix, e.stream_id, e.version, e.position, e.hash, ref, None)
            if done is None:
                continue
            new_ix = done[0]
            new_text = swap_index(inner, text, new_ix, entry.seq, "the segment index changed")
            text, ix = settle_pending(inner, source, new_text, new_ix)
    found = ix.segment_at(entry.first_position)
    assert found is not None and found.seq == entry.seq
    return text, ix, found, source.segment_events(ix, found)


def _finish_deletes(
    inner: Any, source: ArchiveSource, text: str | None, ix: SegmentIndex
) -> tuple[int, int, str | None, SegmentIndex]:
    """Delete rows an interrupted run left (newest segment first, until one is done);
    (segments, rows) and the segment index now."""
    segs, rows = 0, 0
    for entry in reversed(ix.segments):
        if entry.retired is not None:
            break
        events = source.segment_events(ix, entry)
        n, text, ix = _delete(inner, source, text, ix, entry, events)
        if n == 0:
            break
        segs, rows = segs + 1, rows + n
    return segs, rows, text, ix
