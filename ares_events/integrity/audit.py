"""The integrity audit: every stream, the global order, erasures, uniqueness and (deep)
every blob and snapshot, reported as findings (never an exception on a bad row).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ares_events.archive.check import check_archive
from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.segment import SegmentIndex
from ares_events.core.backend import Capability, Head
from ares_events.core.events import ERASURE_STREAM, ERASURE_TYPE, MalformedPayloadRef, RecordedEvent
from ares_events.core.faces import blocking
from ares_events.core.recorder import system_of_record
from ares_events.core.traced import audited, traced
from ares_events.errors import ArchiveError, BlobError, BlobMissing
from ares_events.integrity.anchors import verify_anchors
from ares_events.integrity.findings import AuditReport, Finding
from ares_events.integrity.notes import VerifierKey
from ares_events.integrity.verifier import ChainVerifier, _type_name, malformed_reason
from ares_events.integrity.verify import check_stream, stream_report

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = ["audit"]


@traced("audit", audited, activity=True)
def audit(
    store: EventStore,
    *,
    deep: bool = False,
    progress: Callable[[int, int], None] | None = None,
    anchors: str | None = None,
    anchor_keys: Sequence[VerifierKey] | None = None,
) -> AuditReport:
    """Verify every stream, the global positions and (``deep=True``) every spilled blob
    and every snapshot: a pass per stream, then one over the global positions, which also
    finds streams without a head row (the passes: docs/architecture.md).

    Args:
        store: the store to audit.
        deep: also fetch every spilled payload and check its digest, and check every
            snapshot against its stream (``snapshot_mismatch`` findings).
        progress: called as ``progress(events_done, events_total)`` now and then.
        anchors: an anchor location URL; also check the store still extends every signed checkpoint
            there (see :mod:`ares_events.integrity.anchors`); a location with no anchor at all is a
            ``no_anchor`` finding, and ``anchors_checked`` says how many were checked.
        anchor_keys: verifier keys trusted for the location's signed checkpoints (default:
            the log keys the store recorded).

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    store = blocking(store, "ae.integrity.audit")
    report = AuditReport()
    key = store.chain_key
    blobs_seen: set[str] = set()
    done = 0
    # Straight from the system of record, under any cache wrapper.
    recorder = system_of_record(store.recorder)
    heads: dict[str, Head] = {}
    for sid, head in recorder.heads():
        if type(sid) is not str:
            _add(report, "malformed_row", repr(sid), None, f"head row: stream_id is {sid!r:.60}")
            continue
        heads[sid] = head
    expected = sum(h.version for h in heads.values() if type(h.version) is int)
    erased: list[RecordedEvent] = []

    def seen(page: list[RecordedEvent]) -> None:
        nonlocal done
        for e in page:
            ref = e[11]
            if ref is None:
                continue
            if ref.erased:
                erased.append(e)
            elif deep and not isinstance(ref, MalformedPayloadRef) and ref.key not in blobs_seen:
                blobs_seen.add(ref.key)
                report.blobs_checked += 1
                _check_blob(store, e, report)
        before = done
        done += len(page)
        if progress is not None and done // 1000 != before // 1000:
            progress(done, max(expected, done))

    seg_index = _segment_index(recorder, report)
    for sid, head in heads.items():
        # A stream whose oldest events were retired goes on from the tombstone.
        sv, sh = (seg_index.retired_end(sid) if seg_index is not None else None) or (0, None)
        ver = ChainVerifier(sid, key, start_version=sv, start_hash=sh)
        r = report.streams[sid] = stream_report(ver, *check_stream(store, sid, ver, head, seen))
        report.findings.extend(r.findings)
    report.events_checked = done
    total = store.last_position()
    gapless = Capability.GAPLESS_POSITIONS in store.capabilities
    orphans: dict[str, ChainVerifier] = {}
    versions: dict[str, int] = {}  # stream -> the highest version met in position order
    last_pos = 0
    retired = seg_index.retired_ranges() if seg_index is not None else []
    for pos, sid, version in _positions(recorder, report):
        if type(pos) is not int or type(sid) is not str or type(version) is not int:
            # A row no stream pass can see (its stream id or version is not of its type).
            where = sid if type(sid) is str else repr(sid)
            _add(report, "malformed_row", where, None, _scan_problem(pos, sid, version))
            continue
        if pos > total:
            continue  # appended after the audit started
        if pos <= last_pos:
            _add(report, "position_order", sid, version, f"position {pos} after {last_pos}")
        elif gapless and pos != last_pos + 1 and not _retired(retired, last_pos + 1, pos - 1):
            missing = f"positions {last_pos + 1}..{pos - 1} are missing"
            _add(report, "position_gap", sid, version, missing)
        last_pos = max(last_pos, pos)
        prior = versions.get(sid)  # a version 0 or below is the stream pass's to report
        if prior is not None and version <= prior:  # read_all would give it out of order
            before = f"version {version} at position {pos} after version {prior}"
            _add(report, "position_order", sid, version, before)
        versions[sid] = version if prior is None else max(version, prior)
        if sid not in heads and sid not in orphans:
            orphans[sid] = ChainVerifier(sid, key)
    for sid, ov in sorted(orphans.items()):
        # Events of a stream without a head row (a deleted head): checked from the system
        # of record like the others.
        n, ohead = check_stream(store, sid, ov, None, seen)
        if ohead is not None:
            continue  # a stream created after the audit started
        r = report.streams[sid] = stream_report(ov, n, None)
        report.findings.extend(r.findings)
        report.events_checked += n
    report.streams_checked = len(report.streams)
    if deep:
        check_archive(recorder, seg_index, report)
    _check_erasures(store, recorder, erased, report)
    _check_uniqueness(recorder, report)
    if deep and Capability.SNAPSHOTS in store.capabilities:
        # A snapshot that no longer matches its stream (edited state, a rewritten or
        # truncated stream, a forged seal) is ignored by recovery; the audit says so.
        for info, reason in store.snapshots.verify_all():
            report.snapshots_checked += 1
            if reason is not None:
                detail = f"snapshot of {info.projection!r}: {reason}"
                _add(report, "snapshot_mismatch", info.stream_id, info.at_version, detail)
    if anchors is not None:
        check = verify_anchors(store, anchors, keys=anchor_keys)
        report.anchors_checked = check.anchors_checked
        report.findings.extend(check.findings)
    if progress is not None:
        progress(report.events_checked, max(total, report.events_checked))
    return report


def _check_erasures(
    store: EventStore, recorder: Any, erased: list[RecordedEvent], report: AuditReport
) -> None:
    """List erased payloads (information) and compare them with the erasure records
    (``erasure_unrecorded``, ``erasure_undone``)."""
    records: dict[str, tuple[dict[str, Any], int]] = {}
    try:
        for raw in recorder.read(ERASURE_STREAM, 1, None, None):
            if raw.type != ERASURE_TYPE or raw.payload_erased or malformed_reason(raw) is not None:
                continue
            r = raw
            if r.payload_ref is not None and store.blobs is not None:
                r = store.blobs.attach(r)  # a long reason may have spilled the record
            try:
                p = r.payload
            except (ValueError, BlobError):
                continue
            if isinstance(p, dict) and isinstance(p.get("event_id"), str):
                records[p["event_id"]] = (p, r.version)
    except ArchiveError as exc:  # the records' own segment is lost: a finding, go on
        _archive_finding(report, exc, ERASURE_STREAM, None)
    erased_ids = {e.event_id_str for e in erased}
    for e in erased:
        rec, rv = records.get(e.event_id_str, ({}, None))
        report.erased.append(
            {
                "stream_id": e.stream_id,
                "version": e.version,
                "position": e.position,
                "event_id": e.event_id_str,
                "by": rec.get("by"),
                "reason": rec.get("reason"),
                "record_version": rv,
            }
        )
        if rv is None:
            detail = (
                f"the payload was erased but no {ERASURE_TYPE} record in "
                f"{ERASURE_STREAM!r} names it (an interrupted erasure: run it again)"
            )
            _add(report, "erasure_unrecorded", e.stream_id, e.version, detail)
    for eid, (p, rv) in records.items():
        sid, ver = p.get("stream_id"), p.get("version")
        if eid in erased_ids or not isinstance(sid, str) or type(ver) is not int:
            continue
        try:
            now = next(iter(recorder.read(sid, ver, ver, 1)), None)
        except ArchiveError as exc:  # the event's segment is lost or damaged
            _archive_finding(report, exc, sid, ver)
            continue
        if now is not None and now.event_id_str == eid and not now.payload_erased:
            detail = (
                f"record {rv} of {ERASURE_STREAM!r} says this payload was erased, but "
                "it is stored again"
            )
            _add(report, "erasure_undone", sid, ver, detail)


def _archive_finding(
    report: AuditReport, exc: ArchiveError, stream_id: str | None, version: int | None
) -> None:
    """An archive read that failed, as a finding, once (the position scan may have met the
    same segment already)."""
    kind = f"archive_{exc.kind}"
    if not any(f.kind == kind and f.detail == str(exc) for f in report.findings):
        _add(report, kind, stream_id, version, str(exc))


def _segment_index(recorder: Any, report: AuditReport) -> SegmentIndex | None:
    """The store's archive segment index (None: no archive, or unreadable: a finding)."""
    if not isinstance(recorder, ArchiveRecorder):
        return None  # a store opened without an archive never reads its index
    try:
        return recorder.segment_index()
    except ArchiveError as exc:
        _archive_finding(report, exc, None, None)
        return None


def _retired(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    """True when every position ``lo..hi`` lies in a retired segment's range."""
    for first, last in ranges:
        if first <= lo <= last:
            lo = last + 1
            if lo > hi:
                return True
    return False


def _positions(recorder: Any, report: AuditReport) -> Iterator[tuple[Any, Any, Any]]:
    """``(position, stream_id, version)`` of every row in global order, archived ones
    included (an unreadable archive ends the scan with a finding)."""
    if Capability.POSITION_SCAN in recorder.capabilities:
        rows: Iterator[tuple[Any, Any, Any]] = recorder.positions(0)
    else:
        rows = ((e[2], e[0], e[1]) for e in recorder.read_all(0, None))
    try:
        yield from rows
    except ArchiveError as exc:
        _archive_finding(report, exc, None, None)


def _scan_problem(position: Any, stream_id: Any, version: Any) -> str:
    """Why a scanned ``(position, stream_id, version)`` is not a row (as
    :func:`malformed_reason` says it), after the position."""
    for name, value, want in (
        ("stream_id", stream_id, "TEXT"),
        ("version", version, "INTEGER"),
        ("position", position, "INTEGER"),
    ):
        got = _type_name(value)
        if got != want:
            return f"position {position!r}: {name} is {got}, expected {want}"
    return f"position {position!r}: unreadable row"


def _check_uniqueness(recorder: Any, report: AuditReport) -> None:
    """Rows that share a (stream, version), a position or an event id (only a tampered
    database has them), each reported once, not again after the stream pass."""
    if Capability.DUPLICATE_SCAN not in recorder.capabilities:
        return
    seen = {(f.kind, f.stream_id, f.version) for f in report.findings}
    for kind, who, version, n, pos in recorder.find_duplicates():
        sid = who if kind != "duplicate_event_id" else None
        if (kind, sid, version) in seen:
            continue
        what = {
            "duplicate_version": f"{n} rows hold version {version!r}",
            "duplicate_position": f"{n} rows hold position {pos!r}",
            "duplicate_event_id": f"{n} rows hold event id {who!r}",
        }[kind]
        where = sid if sid is None or type(sid) is str else repr(sid)
        detail = f"{what} (first at position {pos!r}); the unique index was bypassed"
        _add(report, kind, where, version if type(version) is int else None, detail)


def _check_blob(store: EventStore, e: RecordedEvent, report: AuditReport) -> None:
    ref = e.payload_ref
    assert ref is not None
    kind, detail = "blob_missing", f"blob {ref.key}: no blob store configured"
    if store.blobs is not None:
        try:
            store.blobs.verify(ref)
            return
        except BlobMissing as exc:
            detail = exc.detail
        except BlobError as exc:
            kind, detail = "blob_corrupted", exc.detail
    _add(report, kind, e.stream_id, e.version, detail)


def _add(report: AuditReport, kind: str, stream_id: Any, version: Any, detail: str) -> None:
    report.findings.append(Finding(kind, stream_id, version, detail))
