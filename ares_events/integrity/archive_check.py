"""The deep audit's archive pass: every segment the catalog names is fetched again from
the archive, its manifest and every block checked against the digests the database
recorded, and its event count compared with the catalog's. A segment that is missing,
altered or unreadable is a finding (``archive_missing``, ``archive_corrupted``,
``archive_unreadable``), as is a catalog whose segments overlap (``archive_order``).
Retired segments (tombstones) are counted, not fetched.

It may import the core, the stores (the archive's reader) and this package's findings.
"""

from __future__ import annotations

from typing import Any

from ares_events.errors import ArchiveError
from ares_events.integrity.findings import AuditReport, Finding

__all__ = ["check_archive"]


def check_archive(recorder: Any, report: AuditReport) -> None:
    """Check every archived segment of ``recorder``'s store (see the module docstring);
    nothing when the store never archived."""
    if not hasattr(recorder, "archive_catalog"):
        return
    from ares_events.stores.archive.source import ArchiveSource

    try:
        cat = recorder.archive_catalog()
    except ArchiveError as exc:
        report.findings.append(Finding(f"archive_{exc.kind}", None, None, str(exc)))
        return
    if cat is None:
        return
    # A private source with no cache: every byte comes from the archive now.
    source = ArchiveSource(cache_events=0)
    report.segments_checked = 0
    prev = 0
    try:
        for entry in cat.segments:
            if entry.first_position <= prev or entry.last_position < entry.first_position:
                report.findings.append(
                    Finding(
                        "archive_order",
                        None,
                        None,
                        f"segment {entry.seq} covers positions {entry.first_position}.."
                        f"{entry.last_position}, after a segment ending at {prev}",
                    )
                )
            prev = max(prev, entry.last_position)
            report.segments_checked += 1
            if entry.retired is not None:
                continue
            try:
                m = source.manifest(cat, entry)
                n = sum(len(source.block(cat, entry, i)) for i in range(len(m.blocks)))
            except ArchiveError as exc:
                report.findings.append(Finding(f"archive_{exc.kind}", None, None, str(exc)))
                continue
            if n != entry.events or m.events != entry.events:
                report.findings.append(
                    Finding(
                        "archive_corrupted",
                        None,
                        None,
                        f"segment {entry.seq} holds {n} events, the catalog says {entry.events}",
                    )
                )
    finally:
        source.close()
