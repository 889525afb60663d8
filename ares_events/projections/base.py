"""The projection protocol and the fold that drives it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Protocol, runtime_checkable

from ares_events.core.catalog import EventSchemaError
from ares_events.core.events import RecordedEvent
from ares_events.errors import PayloadErased

__all__ = ["ERASED_REASON", "FoldResult", "Projection", "SkippedEvent", "fold"]


@runtime_checkable
class Projection(Protocol):
    """What every projection provides."""

    # Read-only properties, so a class attribute (``name: ClassVar[str] = ...``, as the
    # built-ins declare) satisfies the protocol as well as an instance attribute does.
    @property
    def name(self) -> str:
        """Stable name (read-model tables and snapshots are keyed by it)."""

    @property
    def version(self) -> int:
        """Bump when ``apply`` changes meaning."""

    def initial(self) -> Any:
        """The state before any event."""

    def apply(self, state: Any, event: RecordedEvent) -> Any:
        """The state after ``event``."""


@dataclass(frozen=True, slots=True)
class SkippedEvent:
    """An event a tolerant fold skipped, and why."""

    stream_id: str
    version: int
    position: int
    type: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(slots=True)
class FoldResult:
    """State after a fold, with the count and every skipped event."""

    state: Any
    applied: int = 0
    skipped: list[SkippedEvent] = field(default_factory=list)


ERASED_REASON: Final = "payload erased"
"""The ``reason`` of a :class:`SkippedEvent` whose payload was erased."""


def _skip(event: RecordedEvent, reason: str) -> SkippedEvent:
    return SkippedEvent(event.stream_id, event.version, event.position, event.type, reason)


def apply_one(
    projection: Projection,
    state: Any,
    event: RecordedEvent,
    *,
    strict: bool,
    skipped: list[SkippedEvent],
) -> Any:
    """Apply one event; in tolerant mode a schema failure is recorded and skipped.

    An event whose payload was erased is skipped (in both modes) and recorded with the
    reason :data:`ERASED_REASON`, unless the projection declares ``accepts_erased = True``
    (it then gets the event and must not read its payload).

    Raises:
        EventSchemaError: strict mode and the event does not match its schema.
    """
    if event.payload_erased and not getattr(projection, "accepts_erased", False):
        skipped.append(_skip(event, ERASED_REASON))
        return state
    try:
        return projection.apply(state, event)
    except PayloadErased:
        skipped.append(_skip(event, ERASED_REASON))
        return state
    except EventSchemaError as exc:
        if strict:
            raise
        skipped.append(_skip(event, exc.problem))
        return state


def fold(
    projection: Projection,
    events: Iterable[RecordedEvent],
    *,
    state: Any = None,
    strict: bool = True,
) -> FoldResult:
    """Fold ``events`` through ``projection`` (from ``initial()`` unless ``state`` given).

    Raises:
        EventSchemaError: strict mode and an event does not match its schema.
    """
    res = FoldResult(projection.initial() if state is None else state)
    for e in events:
        res.state = apply_one(projection, res.state, e, strict=strict, skipped=res.skipped)
        res.applied += 1
    return res
