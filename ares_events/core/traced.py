"""Decorators that trace store operations, replay, recovery, verification and audits, for
both faces (docs/observability.md).

It may import :mod:`ares_events.core.telemetry` only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

from ares_events.core.telemetry import Operation, bounded, current, guarded, operation

__all__ = [
    "appended",
    "appended_many",
    "audited",
    "projection_lag",
    "recovered",
    "replayed",
    "traced",
    "traced_reads",
    "verified",
]

F = TypeVar("F", bound=Callable[..., Any])
Done = Callable[[Operation, tuple[Any, ...], dict[str, Any], Any], None]


def traced(name: str, done: Done | None = None, *, activity: bool = False) -> Callable[[F], F]:
    """Decorate a store method, or a function whose first argument is a store (either
    face): a traced, timed :func:`operation` named ``name``; ``done(op, args, kwargs,
    result)`` adds what the result tells (counts, versions). The span carries
    ``ares_events.stream.id`` when the next argument is a stream id. Without telemetry
    the function runs as it is, after one check; with it, a telemetry failure never
    changes the result or the exception (:class:`~ares_events.core.telemetry.guarded`)."""

    def deco(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def traced_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                if current() is None:
                    return await fn(self, *args, **kwargs)
                with operation(self.url, name, _stream_attr(args, kwargs), activity=activity) as op:
                    return _done(done, op, args, kwargs, await fn(self, *args, **kwargs))

            return traced_async  # type: ignore[return-value]

        @functools.wraps(fn)
        def traced_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
            if current() is None:
                return fn(self, *args, **kwargs)
            with operation(self.url, name, _stream_attr(args, kwargs), activity=activity) as op:
                return _done(done, op, args, kwargs, fn(self, *args, **kwargs))

        return traced_sync  # type: ignore[return-value]

    return deco


def traced_reads(name: str) -> Callable[[F], F]:
    """Decorate a store method that returns a lazy iterator of events (either face): a
    CLIENT span from the call to the iterator's end (its parent: the span current at the
    call), with ``db.response.returned_rows``, and its duration in
    ``db.client.operation.duration`` (the time the caller spends between events is in
    it: a lazy read lasts as long as its reader)."""

    def deco(fn: F) -> F:
        @functools.wraps(fn)
        def reads(self: Any, *args: Any, **kwargs: Any) -> Any:
            events = fn(self, *args, **kwargs)  # the arguments are checked at the call
            op = operation(self.url, name, _stream_attr(args, kwargs))
            if not isinstance(op, Operation):
                return events
            op.start(current=False)
            if hasattr(events, "__anext__"):
                return _async_reads(op, events)
            return _sync_reads(op, events)

        return reads  # type: ignore[return-value]

    return deco


def _done(done: Done | None, op: Any, args: tuple[Any, ...], kw: dict[str, Any], res: Any) -> Any:
    # The operation has succeeded (an append has committed): what describes its result
    # must not turn it into a failure.
    if done is not None and isinstance(op, Operation):
        with guarded("span update"):
            done(op, args, kw, res)
    return res


def _stream_attr(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    sid = args[0] if args else kwargs.get("stream_id")
    return {"ares_events.stream.id": sid} if isinstance(sid, str) else {}


def _sync_reads(op: Operation, events: Any) -> Iterator[Any]:
    n, exc = 0, None
    try:
        for e in events:
            n += 1
            yield e
    except BaseException as e:
        exc = e
        raise
    finally:
        close = getattr(events, "close", None)
        if close is not None:
            close()
        op.set("db.response.returned_rows", n)
        op.__exit__(None, exc, None)


async def _async_reads(op: Operation, events: Any) -> AsyncIterator[Any]:
    n, exc = 0, None
    try:
        async for e in events:
            n += 1
            yield e
    except BaseException as e:
        exc = e
        raise
    finally:
        close = getattr(events, "aclose", None)
        if close is not None:
            await close()
        op.set("db.response.returned_rows", n)
        op.__exit__(None, exc, None)


def appended(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any], res: Any) -> None:
    """``done`` of an append: the stream version, and the events counted unless the
    append was a duplicate (nothing written)."""
    duplicate = bool(getattr(res, "duplicate", False))
    events: Any = args[1] if len(args) > 1 else kwargs.get("events")
    n = len(events) if hasattr(events, "__len__") else 0
    op.set("ares_events.event.count", n)
    op.set("ares_events.append.duplicate", duplicate)
    version = getattr(res, "version", None)
    if isinstance(version, int):
        op.set("ares_events.stream.version", version)
    m = op.telemetry.metrics
    if m is not None and not duplicate and n:
        m.appended.add(n, {"db.system.name": op.system})


def appended_many(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any], res: Any) -> None:
    """``done`` of ``append_many``: batches and events written."""
    results = res if isinstance(res, list) else []
    batches = args[0] if args else kwargs.get("batches", ())
    pairs = zip(batches, results, strict=False)
    n = sum(len(batch[1]) for batch, r in pairs if not getattr(r, "duplicate", False))
    op.set("db.operation.batch.size", len(results))
    op.set("ares_events.event.count", n)
    m = op.telemetry.metrics
    if m is not None and n:
        m.appended.add(n, {"db.system.name": op.system})


def replayed(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any], res: Any) -> None:
    """``done`` of a replay: events folded, whether the cap stopped it, its findings (the
    metrics of a recovery or a snapshot are counted here, by the replay inside them)."""
    n = int(getattr(res, "replayed", 0))
    capped = bool(getattr(res, "capped", False))
    findings = list(getattr(res, "findings", ()))
    op.set("ares_events.replay.events", n)
    op.set("ares_events.replay.capped", capped)
    op.set("ares_events.stream.version", int(getattr(res, "version", 0)))
    op.set("ares_events.findings", len(findings))
    tel = op.telemetry
    m = tel.metrics
    system = op.system
    if m is not None:
        if n:
            m.replayed.add(n, {"db.system.name": system})
        if capped:
            m.capped.add(1, {"db.system.name": system})
    tel.record_findings(findings, "replay", system)


def recovered(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any], res: Any) -> None:
    """``done`` of a recovery: where the state came from and how much was replayed."""
    op.set("ares_events.recovery.source", str(getattr(res, "source", "")))
    op.set("ares_events.projection.name", str(getattr(res, "projection", "")))
    op.set("ares_events.replay.events", int(getattr(res, "replayed", 0)))
    op.set("ares_events.replay.capped", bool(getattr(res, "capped", False)))
    op.set("ares_events.snapshot.ignored", getattr(res, "snapshot_ignored", None) is not None)
    op.set("ares_events.findings", len(getattr(res, "findings", ())))


def verified(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any], res: Any) -> None:
    """``done`` of ``verify_stream``: events checked and findings (counted by kind)."""
    findings = list(getattr(res, "findings", ()))
    op.set("ares_events.events.checked", int(getattr(res, "events_checked", 0)))
    op.set("ares_events.findings", len(findings))
    op.telemetry.record_findings(findings, "verify", op.system)


def audited(op: Operation, args: tuple[Any, ...], kwargs: dict[str, Any], res: Any) -> None:
    """``done`` of an audit: what was checked and the findings (counted by kind)."""
    findings = list(getattr(res, "findings", ()))
    for field in ("streams_checked", "events_checked", "blobs_checked", "snapshots_checked"):
        op.set(f"ares_events.{field.replace('_', '.', 1)}", int(getattr(res, field, 0)))
    op.set("ares_events.audit.deep", bool(kwargs.get("deep", False)))
    op.set("ares_events.findings", len(findings))
    op.telemetry.record_findings(findings, "audit", op.system)


def projection_lag(store: Any, projection: str, position: int) -> None:
    """Set ``ares_events.projection.lag``: events after ``position`` (the projection's
    cursor) in ``store``'s log (one ``last_position`` read, only when metrics are on)."""
    tel = current()
    if tel is None or tel.metrics is None:
        return
    lag = max(0, int(store.last_position()) - position)
    tel.metrics.projection_lag.set(lag, {"ares_events.projection.name": bounded(projection)})
