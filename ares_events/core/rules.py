"""The pure rules of the store's operations, shared by both faces: no I/O.

It may import the core's events and backend values, and :mod:`ares_events.errors`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from ares_events.core.backend import AppendOutcome, TrackingRecord, fresh_result
from ares_events.core.events import (
    AppendResult,
    ExpectedVersion,
    NewEvent,
    PreparedEvent,
    RecordedEvent,
    _normalize_expected,
    prepare,
    same_event,
    validate_name,
)
from ares_events.errors import InvalidEvent

__all__ = [
    "DEFAULT_MAX_INLINE_BYTES",
    "Conflict",
    "PlannedBatch",
    "check_after",
    "check_range",
    "duplicate_result",
    "events_arg",
    "many_results",
    "plan_many",
    "tracking_arg",
]

DEFAULT_MAX_INLINE_BYTES: Final = 64 * 1024 * 1024
"""A payload stored inline (not spilled to a blob store) may be at most this big."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """A re-append that is not an exact one: the face raises ``ConcurrencyError`` with the
    stream's current version (which it reads: I/O)."""

    stream_id: str
    expected: str
    detail: str


@dataclass(slots=True)
class PlannedBatch:
    """One batch of an ``append_many``, validated and encoded (spill not yet applied)."""

    stream_id: str
    prepared: list[PreparedEvent]
    expected: ExpectedVersion


def _count(value: object, least: int, none: bool = False) -> bool:
    """``value`` is an int from ``least`` to the largest signed 64-bit one (a column's range:
    nothing stored lies past it), or None where ``none``."""
    return (none and value is None) or (type(value) is int and least <= value < 2**63)


def check_range(from_version: int, to_version: int | None, limit: int | None) -> None:
    """Check the arguments of a stream read.

    Raises:
        InvalidEvent: a bad bound or limit.
    """
    if not _count(from_version, 1):
        raise InvalidEvent(
            "from_version", f"must be an int from 1 to 2**63-1, got {from_version!r}"
        )
    if not _count(to_version, 0, none=True):
        raise InvalidEvent(
            "to_version", f"must be an int from 0 to 2**63-1 or None, got {to_version!r}"
        )
    if not _count(limit, 0, none=True):
        raise InvalidEvent("limit", f"must be an int from 0 to 2**63-1 or None, got {limit!r}")


def check_timeout(timeout: object) -> float:
    """A wait's ``timeout``: a number of seconds, finite and >= 0 (never a bool, NaN,
    which no clock ever passes, or text).

    Raises:
        InvalidEvent: anything else.
    """
    if type(timeout) not in (int, float) or not 0 <= timeout < float("inf"):  # type: ignore[operator]
        raise InvalidEvent(
            "timeout", f"must be a finite number of seconds >= 0, got {timeout!r:.40}"
        )
    return float(timeout)  # type: ignore[arg-type]


def check_after(
    after_position: int,
    limit: int | None,
    stream_prefix: str | None = None,
    *,
    cursors: bool = False,
    name: str = "after_position",
) -> None:
    """Check the arguments of ``read_all`` (``cursors``: a cell store's merged cursor,
    which its cell map checks, may pass 2**63-1; ``name``: the position's in the call).

    Raises:
        InvalidEvent: a bad position, limit or prefix.
    """
    past = cursors and type(after_position) is int and after_position >= 2**63
    if not (_count(after_position, 0) or past):
        raise InvalidEvent(name, f"must be an int from 0 to 2**63-1, got {after_position!r:.40}")
    check_range(1, None, limit)
    if stream_prefix is not None and type(stream_prefix) is not str:
        raise InvalidEvent(
            "stream_prefix", f"must be a str or None, got {type(stream_prefix).__name__}"
        )


def events_arg(stream_id: str, events: Any) -> Sequence[NewEvent]:
    """``events`` as a non-empty sequence of NewEvent (a single event is accepted).

    Raises:
        InvalidEvent: not a sequence, or empty.
    """
    if type(events) is list and events:  # the usual call, before the ABC check
        return events
    if isinstance(events, NewEvent):
        return [events]
    if not isinstance(events, Sequence) or isinstance(events, str | bytes):
        raise InvalidEvent("events", "must be a sequence of ae.NewEvent", stream_id=stream_id)
    if not events:
        raise InvalidEvent("events", "at least one event is required", stream_id=stream_id)
    return events


def duplicate_result(
    stream_id: str, prepared: Sequence[PreparedEvent], stored: list[RecordedEvent]
) -> AppendResult | Conflict:
    """The original result of an exact re-append, or the conflict it is instead."""
    by_id = {r.event_id_str: r for r in stored}
    if len(by_id) != len(prepared):
        return Conflict(
            stream_id,
            "a new batch",
            f"{len(by_id)} of the {len(prepared)} event ids are already stored; a batch is "
            "either entirely new or an exact re-append",
        )
    for i, p in enumerate(prepared):
        r = by_id.get(p.event_id)
        if r is None or r.stream_id != stream_id:
            where = f"stream {r.stream_id!r}" if r is not None else "another batch"
            return Conflict(
                stream_id,
                "a new event id",
                f"event #{i} id {p.event_id} is already used in {where}",
            )
        if not same_event(p, r):
            return Conflict(
                stream_id,
                "an exact re-append",
                f"event #{i} id {p.event_id} is stored at version {r.version} with "
                "different content",
            )
    versions = sorted(r.version for r in stored)
    if versions != list(range(versions[0], versions[0] + len(versions))):
        return Conflict(stream_id, "an exact re-append", "the ids belong to different batches")
    last = max(stored, key=lambda r: r.version)
    return AppendResult(
        stream_id,
        last.version,
        last.position,
        tuple(by_id[p.event_id].event_id for p in prepared),
        duplicate=True,
    )


def tracking_arg(tracking: TrackingRecord | tuple[str, int] | None) -> TrackingRecord | None:
    """``tracking`` as a checked :class:`TrackingRecord` (or None).

    Raises:
        InvalidEvent: a bad name or position.
    """
    if tracking is None:
        return None
    if not isinstance(tracking, TrackingRecord):
        tracking = TrackingRecord(*tracking)
    validate_name(tracking.name, "tracking name")
    if type(tracking.position) is not int or not 0 <= tracking.position < 2**63:
        raise InvalidEvent("tracking position", f"must be an int >= 0, got {tracking.position!r}")
    return tracking


def plan_many(
    batches: Sequence[tuple[str, Sequence[NewEvent], ExpectedVersion]], at: str
) -> list[PlannedBatch]:
    """Validate and encode every batch of an ``append_many`` (no I/O): each stream at
    most once, no event id in two batches.

    Raises:
        InvalidEvent: bad input (names the stream and the event's index).
    """
    seen_streams: set[str] = set()
    seen_ids: set[str] = set()
    plan: list[PlannedBatch] = []
    for stream_id, given, expected_version in batches:
        validate_name(stream_id, "stream_id")
        if stream_id in seen_streams:
            raise InvalidEvent(
                "batches", "a stream appears in more than one batch", stream_id=stream_id
            )
        seen_streams.add(stream_id)
        expected = _normalize_expected(expected_version)
        events = events_arg(stream_id, given)
        prepared = prepare(stream_id, events, at)
        for i, p in enumerate(prepared):
            if p.event_id in seen_ids:
                raise InvalidEvent(
                    "event_id",
                    f"{p.event_id} appears in two batches",
                    stream_id=stream_id,
                    index=i,
                )
            seen_ids.add(p.event_id)
        plan.append(PlannedBatch(stream_id, prepared, expected))
    return plan


def many_results(
    plan: Sequence[PlannedBatch], outcomes: Sequence[AppendOutcome]
) -> list[AppendResult] | Conflict:
    """The results of an ``append_many``, or the conflict a partial re-append is."""
    if any(o.duplicate for o in outcomes):
        if not all(o.duplicate for o in outcomes):
            dup = next(b.stream_id for b, o in zip(plan, outcomes, strict=True) if o.duplicate)
            return Conflict(
                dup,
                "a new batch",
                "some batches of this append_many are already stored and some are not; "
                "a call is either entirely new or an exact re-append",
            )
        out: list[AppendResult] = []
        for b, o in zip(plan, outcomes, strict=True):
            res = duplicate_result(b.stream_id, b.prepared, o.events)
            if isinstance(res, Conflict):
                return res
            out.append(res)
        return out
    return [fresh_result(b.stream_id, b.prepared, o) for b, o in zip(plan, outcomes, strict=True)]
