"""Integrity findings and the reports that carry them: :class:`Finding`,
:class:`VerifyReport` (one stream) and :class:`AuditReport` (a whole store), apart so that
the anchors and the verifier do not import each other. It imports nothing from the package.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["AuditReport", "Finding", "VerifyReport"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One integrity problem: what, where, and a human-readable detail."""

    kind: str
    stream_id: str | None
    version: int | None
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)

    def __str__(self) -> str:
        where = f"{self.stream_id!r}" if self.stream_id is not None else "store"
        if self.version is not None:
            where += f" v{self.version}"
        return f"{self.kind} at {where}: {self.detail}"


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """Result of verifying one stream."""

    stream_id: str
    findings: list[Finding]
    events_checked: int
    version: int
    """Last version read from the events."""
    head_version: int
    """Version the head row claims (0 when there is no head)."""

    @property
    def ok(self) -> bool:
        """True when there are no findings."""
        return not self.findings

    @property
    def truncated(self) -> bool:
        """True when events are missing from the tail."""
        return any(f.kind == "truncated" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "stream_id": self.stream_id,
            "ok": self.ok,
            "events_checked": self.events_checked,
            "version": self.version,
            "head_version": self.head_version,
            "findings": [f.to_dict() for f in self.findings],
        }


@dataclass(slots=True)
class AuditReport:
    """Result of auditing a whole store."""

    streams_checked: int = 0
    events_checked: int = 0
    blobs_checked: int = 0
    snapshots_checked: int = 0
    findings: list[Finding] = field(default_factory=list)
    streams: dict[str, VerifyReport] = field(default_factory=dict)
    anchors_checked: int | None = None
    """How many anchors were checked (None when the audit was not asked to)."""
    segments_checked: int | None = None
    """Archived segments fetched and checked by a deep audit (None: no archive, or not deep)."""
    erased: list[dict[str, Any]] = field(default_factory=list)
    """Events whose payload was erased (information, not findings): stream_id, version,
    position, event_id, and by / reason / record_version from the erasure record."""

    @property
    def ok(self) -> bool:
        """True when there are no findings."""
        return not self.findings

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "ok": self.ok,
            "streams_checked": self.streams_checked,
            "events_checked": self.events_checked,
            "blobs_checked": self.blobs_checked,
            "snapshots_checked": self.snapshots_checked,
            "anchors_checked": self.anchors_checked,
            "segments_checked": self.segments_checked,
            "erased": self.erased,
            "findings": [f.to_dict() for f in self.findings],
        }
