"""The deep audit's archive pass: every segment fetched again and checked against its
recorded digests, every tombstone against its record.

It may import the core, the stores (the archive's reader) and this package's findings.
"""

from __future__ import annotations

from typing import Any

from ares_events.archive.segment import (
    RETENTION_TYPE,
    THROUGH_KEY,
    SegmentIndex,
    through_problem,
    tombstone_problem,
)
from ares_events.archive.source import ArchiveSource
from ares_events.core.events import RETENTION_STREAM
from ares_events.errors import ArchiveError, AresError
from ares_events.integrity.findings import AuditReport, Finding

__all__ = ["check_archive"]


def check_archive(recorder: Any, ix: SegmentIndex | None, report: AuditReport) -> None:
    """Check every segment ``ix`` (``recorder``'s segment index, None: nothing archived)
    names (docs/archive.md)."""
    if ix is None:
        return
    records: dict[Any, Any] | None = None
    # A private source with no cache: every byte comes from the archive now.
    source = ArchiveSource(cache_events=0)
    report.segments_checked = 0
    prev = 0

    def add(kind: str, detail: str) -> None:
        report.findings.append(Finding(kind, None, None, detail))

    # Readers go by the segment index, so a row that disagrees skips nothing; it is
    # still a write nobody made (or a rewrite by hand): reported.
    problem = through_problem(recorder.meta_get(THROUGH_KEY), ix)
    if problem is not None:
        add("archive_through", problem)
    try:
        for entry in ix.segments:
            if entry.first_position <= prev or entry.last_position < entry.first_position:
                add(
                    "archive_order",
                    f"segment {entry.seq} covers positions {entry.first_position}.."
                    f"{entry.last_position}, after a segment ending at {prev}",
                )
            prev = max(prev, entry.last_position)
            report.segments_checked += 1
            if entry.retired is not None:
                if records is None:
                    records = _records(recorder)
                problem = tombstone_problem(entry, records.get(entry.seq))
                if problem is not None:
                    add("retention_unrecorded", problem)
                continue
            try:
                m = source.manifest(ix, entry)
                n = sum(len(source.block(ix, entry, i)) for i in range(len(m.blocks)))
                source.check_segment(ix, entry)
            except ArchiveError as exc:
                add(f"archive_{exc.kind}", str(exc))
                continue
            if n != entry.events or m.events != entry.events:
                add(
                    "archive_corrupted",
                    f"segment {entry.seq} holds {n} events, its index line says {entry.events}",
                )
    finally:
        source.close()


def _records(recorder: Any) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for e in recorder.read(RETENTION_STREAM, 1, None, None):
        if e.type != RETENTION_TYPE or e.payload_erased:
            continue
        try:
            p = e.payload
        except (AresError, ValueError):  # an unreadable record is unmatched: reported below
            continue
        if isinstance(p, dict):
            out[p.get("seq")] = p
    return out
