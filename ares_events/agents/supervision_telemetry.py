"""Span events and metrics of agent lifecycles and supervisors (docs/observability.md);
metrics carry a death's cause kind, never an agent id. None of them raises when the
telemetry pipeline does (``telemetry.guarded``).

It may import the core.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, Final

from ares_events.core import telemetry
from ares_events.core.telemetry import Telemetry, guarded

__all__ = ["backoff", "cause_kind", "death", "flapping", "gave_up", "resurrection", "supervising"]

_KINDS: Final = (
    ("killed by signal", "signal"),
    ("exit status", "exit"),
    ("missed heartbeat", "heartbeat"),
    ("lost", "lost"),
)


def cause_kind(cause: str) -> str:
    """The bounded kind of a death's cause (a metric attribute)."""
    return next((kind for prefix, kind in _KINDS if cause.startswith(prefix)), "other")


def _emit(
    event: str, agent_id: str, attrs: dict[str, Any], measure: Callable[[Any], object]
) -> None:
    """``event`` about ``agent_id`` on the current span, and ``measure(instruments)`` when
    metrics are on."""
    tel = telemetry.current()
    if tel is None:
        return
    tel.add_event(event, {"ares_events.agent.id": agent_id, **attrs})
    if tel.metrics is not None:
        measure(tel.metrics)


def death(agent_id: str, cause: str) -> None:
    """An agent died: a span event (with its id and cause) and a counted death."""
    kind = {"ares_events.death.cause": cause_kind(cause)}
    _emit("ares_events.agent.death", agent_id, kind, lambda m: m.deaths.add(1, kind))


def resurrection(agent_id: str, attempt: int) -> None:
    """An agent was resurrected."""
    attrs = {"ares_events.attempt": attempt}
    _emit("ares_events.agent.resurrection", agent_id, attrs, lambda m: m.resurrections.add(1))


def backoff(agent_id: str, attempt: int, delay: float) -> None:
    """A supervisor waits ``delay`` seconds before resurrecting an agent."""
    attrs = {"ares_events.attempt": attempt, "ares_events.backoff.seconds": delay}
    _emit("ares_events.supervisor.backoff", agent_id, attrs, lambda m: m.backoff.record(delay))


def flapping(agent_id: str, deaths: int, rule: tuple[int, float]) -> None:
    """An agent is flapping (``deaths`` deaths within the rule's window)."""
    attrs = {
        "ares_events.deaths": deaths,
        "ares_events.flap.deaths": rule[0],
        "ares_events.flap.window_s": float(rule[1]),
    }
    _emit("ares_events.agent.flapping", agent_id, attrs, lambda m: m.flapping.add(1))


def gave_up(agent_id: str, restarts: int) -> None:
    """An agent reached the restart cap and is left dead."""
    attrs = {"ares_events.restarts": restarts}
    _emit("ares_events.agent.gave_up", agent_id, attrs, lambda m: m.gave_up.add(1))


@contextlib.contextmanager
def _supervising(tel: Telemetry, agents: int) -> Iterator[None]:
    span = tel.start_span("ares_events.supervise", {"ares_events.agents": agents})
    if span is None:
        yield
        return
    token = failure = None
    with guarded("context"):
        token = tel.otel.context.attach(tel.otel.trace.set_span_in_context(span))
    try:
        yield
    except Exception as exc:
        # As OpenTelemetry's start_as_current_span: an Exception fails the span, an
        # interrupt (KeyboardInterrupt, SystemExit) does not.
        failure = exc
        raise
    finally:
        if token is not None:
            with guarded("context"):
                tel.otel.context.detach(token)
        tel.end_span(span, failure)


def supervising(agents: int) -> Any:
    """The ``ares_events.supervise`` span of a supervisor's run (current while it runs),
    or a no-op context manager."""
    tel = telemetry.current()
    if tel is None or tel.tracer is None:
        return telemetry.NO_OPERATION
    return _supervising(tel, agents)
