"""Integrity findings and the reports that carry them: :class:`Finding`,
:class:`VerifyReport` (one stream) and :class:`AuditReport` (a whole store), apart so that
the anchors and the verifier do not import each other. It imports nothing from the package.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = ["AuditReport", "Finding", "FindingsReport", "VerifyReport", "report_dict"]


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


class FindingsReport:
    """Base of the reports that carry ``findings``: their ``ok``."""

    __slots__ = ()
    findings: list[Finding]

    @property
    def ok(self) -> bool:
        """True when there are no findings."""
        return not self.findings


def report_dict(report: Any, *, ok_at: int = 0, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The JSON-ready form of a report dataclass: its fields in order (but ``leave_out``),
    ``ok`` inserted at index ``ok_at``, and its findings last."""
    skip = ("findings", *leave_out)
    items = [(f.name, getattr(report, f.name)) for f in fields(report) if f.name not in skip]
    items.insert(ok_at, ("ok", report.ok))
    return dict(items) | {"findings": [f.to_dict() for f in report.findings]}


@dataclass(frozen=True, slots=True)
class VerifyReport(FindingsReport):
    """Result of verifying one stream."""

    stream_id: str
    findings: list[Finding]
    events_checked: int
    version: int
    """Last version read from the events."""
    head_version: int
    """Version the head row claims (0 when there is no head)."""

    @property
    def truncated(self) -> bool:
        """True when events are missing from the tail."""
        return any(f.kind == "truncated" for f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return report_dict(self, ok_at=1)


@dataclass(slots=True)
class AuditReport(FindingsReport):
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the per-stream reports)."""
        return report_dict(self, leave_out=("streams",))
