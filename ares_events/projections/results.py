"""What a replay or a recovery returns, the same on both faces."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from ares_events.integrity.findings import Finding, FindingsReport
from ares_events.projections.base import SkippedEvent

__all__ = ["DEFAULT_MAX_REPLAY", "RecoveryReport", "RecoverySource", "ReplayResult"]

DEFAULT_MAX_REPLAY: Final = 10_000
"""Events a replay or a recovery folds at most, unless told otherwise."""
S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ReplayResult(FindingsReport, Generic[S]):
    """Outcome of :func:`replay`."""

    state: S
    version: int
    """Version of the last event folded (``from_version - 1`` when none)."""
    replayed: int
    capped: bool
    """True when ``max_replay`` stopped the fold before the end of the stream."""
    head_version: int
    last_hash: bytes | None
    findings: list[Finding] = field(default_factory=list)

    @property
    def truncated(self) -> bool:
        """True when the head says there are more events than the stream holds."""
        return any(f.kind == "truncated" for f in self.findings)


class RecoverySource(enum.StrEnum):
    """Where the recovered state came from."""

    SNAPSHOT = "snapshot"
    EVENTS = "events"
    EMPTY = "empty"


@dataclass(slots=True)
class RecoveryReport:
    """What :func:`recover` found and rebuilt."""

    stream_id: str
    projection: str
    state: Any
    version: int
    """Stream version the state reflects."""
    source: RecoverySource
    replayed: int
    """Events folded after the snapshot (or from the start)."""
    head_version: int
    truncated: bool
    capped: bool
    findings: list[Finding] = field(default_factory=list)
    snapshot_version: int | None = None
    """``at_version`` of the snapshot used, if any."""
    snapshot_ignored: str | None = None
    """Why a stored snapshot was not used (None when used or when there was none)."""
    skipped: list[SkippedEvent] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the chain checked clean, nothing was capped or skipped."""
        return not self.findings and not self.capped and not self.skipped

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the state included)."""
        return {
            "stream_id": self.stream_id,
            "projection": self.projection,
            "state": self.state,
            "version": self.version,
            "source": str(self.source),
            "replayed": self.replayed,
            "head_version": self.head_version,
            "truncated": self.truncated,
            "capped": self.capped,
            "ok": self.ok,
            "snapshot_version": self.snapshot_version,
            "snapshot_ignored": self.snapshot_ignored,
            "findings": [f.to_dict() for f in self.findings],
            "skipped": [s.to_dict() for s in self.skipped],
        }
