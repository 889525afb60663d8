"""Blob garbage collection: :func:`gc_blobs` deletes orphan blobs older than a grace period
(:func:`parse_duration`).

It may import the blob stores of this package, the core's identity and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.backend import Capability
from ares_events.core.faces import blocking
from ares_events.core.identity import IDENTITY_KEY, StoreIdentity
from ares_events.core.recorder import system_of_record
from ares_events.errors import ConfigError
from ares_events.stores.blobs.file import FileBlobStore

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

__all__ = ["GcReport", "check_apart", "gc_blobs", "parse_duration", "recorded_archive"]

_DURATION_RE = re.compile(r"(\d+)([smhdwy])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 365 * 86400}
_LONGEST: Final = 1000 * 365 * 86400  # an age past this reaches before year 1000


def parse_duration(text: str) -> timedelta:
    """Parse ``"90s"``, ``"30m"``, ``"1h"``, ``"2d"``, ``"1w"``, ``"7y"`` (365 days) or a
    sum like ``"1h30m"``, of at most 1000 years.

    Raises:
        ConfigError: not of that form, or longer.
    """
    s = text.strip().lower() if isinstance(text, str) else ""
    parts = _DURATION_RE.findall(s)
    if not s or "".join(n + u for n, u in parts) != s:
        raise ConfigError(
            f"duration must look like 30s, 15m, 1h, 2d, 1w, 7y or 1h30m, got {text!r:.40}"
        )
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds > _LONGEST:
        raise ConfigError(f"duration {text!r:.40} is longer than 1000 years")
    return timedelta(seconds=seconds)


def check_apart(blobs: Any, archive: str | None) -> None:
    """Refuse a blob store ``blobs`` whose location is, contains or is inside an archive
    location (either None: nothing to compare). Both are compared as the blob stores give
    their ``location`` (a resolved folder, ``s3://bucket/prefix`` without endpoint or
    slashes at its ends), so two spellings of one place compare equal.

    Raises:
        ConfigError: they overlap: gc-blobs would delete the archive's objects, which no
            event references.
    """
    if blobs is None or archive is None:
        return
    where = str(getattr(blobs, "location", blobs.url))
    if _within(where, archive) or _within(archive, where):
        raise ConfigError(
            f"the blob location {where} overlaps the archive {archive} (the same place, or "
            "one inside the other): give each its own folder or prefix (gc-blobs would "
            "delete archive segments, which no event references)"
        )


def _within(inner: str, outer: str) -> bool:
    # "/" closes the outer one, so s3://b/arch2 is not inside s3://b/arch
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def recorded_archive(store: EventStore) -> str | None:
    """The archive location the store's identity records, read now (another process may
    have archived since this one opened the store); None: it records none."""
    if Capability.METADATA not in store.capabilities:
        return None
    raw = store.recorder.meta_get(IDENTITY_KEY)  # type: ignore[attr-defined]
    if raw is None:
        return None
    archive = StoreIdentity.from_json(raw, store.url).archive
    return None if archive is None else archive.location


@dataclass(slots=True)
class GcReport:
    """What :func:`gc_blobs` found and deleted (or would delete, in a dry run)."""

    dry_run: bool
    older_than: timedelta
    cutoff: datetime
    events_scanned: int = 0
    referenced_keys: int = 0
    blobs_listed: int = 0
    kept_referenced: int = 0
    kept_young: int = 0
    deleted: list[str] = field(default_factory=list)
    """Keys deleted (in a dry run: keys that would be deleted)."""
    bytes_deleted: int = 0
    temp_files_deleted: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the fields in order, the times as seconds and ISO text)."""
        rest = asdict(self)
        del rest["dry_run"], rest["older_than"], rest["cutoff"]
        head = {"dry_run": self.dry_run, "older_than_seconds": self.older_than.total_seconds()}
        return {**head, "cutoff": self.cutoff.isoformat(), **rest}


def gc_blobs(
    store: EventStore, older_than: timedelta, dry_run: bool = False, *, now: datetime | None = None
) -> GcReport:
    """Delete blobs no event references and that are older than ``older_than``; safe while
    appends go on (docs/blobs.md gives the order that makes it so).

    Args:
        store: an event store opened with ``blobs=``.
        older_than: grace period; must exceed the longest append (``1h`` is generous).
        dry_run: report what would be deleted, delete nothing.
        now: the current time (for tests); defaults to ``datetime.now(UTC)``.

    Returns:
        A :class:`GcReport`.

    Raises:
        ConfigError: the store has no blob store, its blob location belongs to another
            store or overlaps the archive its identity records, or ``older_than`` is
            negative.
        StoreUnavailable: the store or the blob store cannot be reached.
    """
    store = blocking(store, "ares_events.stores.blobs.gc_blobs")
    blobs = store.blobs
    if blobs is None:
        raise ConfigError(
            "gc-blobs needs a blob store: open the store with blobs=URL (on the command line: "
            "--blobs URL or ARES_BLOBS_URL)"
        )
    # Archive objects are referenced by the segment index, not by events: every one of
    # them would look like an orphan here.
    check_apart(blobs, recorded_archive(store))
    if older_than < timedelta(0):
        raise ConfigError(f"older_than must not be negative, got {older_than}")
    # Another store's blobs are orphans here: only the location's owner may delete (a dry
    # run checks and claims nothing).
    store.claim_blobs(write=not dry_run)
    cutoff = (now or datetime.now(UTC)) - older_than
    report = GcReport(dry_run=dry_run, older_than=older_than, cutoff=cutoff)
    referenced: set[str] = set()
    # The references come from the system of record, never through a cache: a cached
    # entry is no authority on which blobs are referenced, and a blob it failed to name
    # would be deleted for good.
    source = system_of_record(store.recorder)
    # Per-stream reads, not read_all: a backend's read_all may hold back committed events
    # (PostgreSQL hides rows above the oldest running write transaction), and a blob
    # referenced only by a hidden event must never look like an orphan.
    for stream_id, _version in list(store.streams()):
        for e in source.read(stream_id, 1, None, None):
            report.events_scanned += 1
            ref = e.payload_ref
            if ref is not None and not ref.erased:  # an erased payload has no blob
                referenced.add(ref.key)
    report.referenced_keys = len(referenced)
    for info in list(blobs.list_blobs()):
        report.blobs_listed += 1
        if info.key in referenced:
            report.kept_referenced += 1
        elif info.modified >= cutoff:
            report.kept_young += 1
        elif dry_run or blobs.delete(info.key, if_older_than=cutoff):
            report.deleted.append(info.key)
            report.bytes_deleted += info.size
        else:
            report.kept_young += 1  # refreshed by an append since it was listed
    if isinstance(blobs, FileBlobStore):
        for p in list(blobs.stale_temp_files(cutoff)):
            key = p.name[4:] if p.name.startswith(".gc-") else ""
            if key in referenced:
                # A gc that crashed between its rename and its unlink: put it back.
                if not dry_run:
                    blobs.restore_tombstone(p, key)
                continue
            report.temp_files_deleted.append(str(p.relative_to(blobs.root)))
            if not dry_run:
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
    logger.info(
        "gc-blobs%s: %d listed, %d referenced, %d young, %d %s",
        " (dry run)" if dry_run else "",
        report.blobs_listed,
        report.kept_referenced,
        report.kept_young,
        len(report.deleted),
        "to delete" if dry_run else "deleted",
    )
    return report
