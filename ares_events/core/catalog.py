"""The event catalog: typed payload schemas (pydantic v2) for the events agents write,
versioned, with :func:`upcast` to bring old payloads up to date (the event types:
docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ares_events.core.events import NewEvent, RecordedEvent
from ares_events.errors import InvalidEvent

__all__ = [
    "CATALOG",
    "CURRENT_VERSIONS",
    "EventSchemaError",
    "Payload",
    "new_event",
    "parse",
    "register_upcaster",
    "schema_for",
    "upcast",
]


class EventSchemaError(InvalidEvent):
    """A stored event does not match its catalog schema (names stream and version)."""

    def __init__(
        self, type_: str, problem: str, *, stream_id: str | None = None, version: int | None = None
    ) -> None:
        self.type = type_
        self.version = version
        where = f" at version {version}" if version is not None else ""
        super().__init__(f"payload of {type_!r}{where}", problem, stream_id=stream_id)


EventSchemaError.__module__ = "ares_events"


CATALOG: Final[dict[str, type[Payload]]] = {}
"""Every event type of the catalog and its payload model."""


class Payload(BaseModel):
    """Base of every catalog payload: unknown fields are kept, not rejected.

    ``class TaskCreated(Payload, event="task.created")`` enters a model in :data:`CATALOG`.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    def __init_subclass__(cls, event: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if event is not None:
            CATALOG[event] = cls


# -- lifecycle ---------------------------------------------------------------------------


class SessionCreated(Payload, event="session.created"):
    session_id: str
    entry_id: str | None = None
    root_msg_id: str | None = None


class TaskCreated(Payload, event="task.created"):
    task_id: str


class TaskCompleted(Payload, event="task.completed"):
    task_id: str


class TaskFailed(Payload, event="task.failed"):
    task_id: str
    error: str


class AgentStarted(Payload, event="agent.started"):
    instance_id: str


class AgentStopped(Payload, event="agent.stopped"):
    """A voluntary stop, never taken for a crash."""

    reason: str


class AgentDead(Payload, event="agent.dead"):
    cause: str


class AgentResurrected(Payload, event="agent.resurrected"):
    instance_id: str
    attempt: int


class FailoverTriggered(Payload, event="failover.triggered"):
    reason: str


class FailoverCompleted(Payload, event="failover.completed"):
    instance_id: str


# -- durable runs ------------------------------------------------------------------------


class RunStarted(Payload, event="run.started"):
    """The version gate's inputs."""

    code_revision: str
    prompt_hash: str


class ModelCallRequested(Payload, event="model.call.requested"):
    """Intention, appended before each attempt of the call.

    ``messages`` (absent when prompts are not recorded) and ``params`` are the redacted
    request; ``messages_hash`` is the blake3 of the recorded messages' canonical JSON.
    """

    step: int
    messages_hash: str
    params: dict[str, Any]
    attempt: int = 1


class ModelCallAttemptFailed(Payload, event="model.call.failed"):
    """One attempt of a model step raised (the step stays open)."""

    step: int
    attempt: int
    error_type: str
    error: str
    error_class: str | None = None


class ModelResponded(Payload, event="model.responded"):
    """Outcome, appended before the agent reads it."""

    step: int
    completion: Any
    usage: dict[str, Any]


class ToolCallRequested(Payload, event="tool.call.requested"):
    """Intention, with the idempotency key ``run_id:step_n``, appended before each attempt
    (every attempt of a step has the same key)."""

    name: str
    args: Any
    idempotency_key: str
    step: int | None = None
    attempt: int = 1
    args_hash: str | None = None


class ToolCallAttemptFailed(Payload, event="tool.call.failed"):
    """One attempt of a tool step raised (the step stays open)."""

    idempotency_key: str
    step: int
    attempt: int
    error_type: str
    error: str
    error_class: str | None = None


class ToolCallNotDone(Payload, event="tool.call.not_done"):
    """A human found that an in-doubt call did not land; the next attempt runs it again
    with the same key."""

    idempotency_key: str
    by: str


class StepAbandoned(Payload, event="step.abandoned"):
    """The loop made another call after a failed attempt, giving up on the step."""

    step: int


class ToolReturned(Payload, event="tool.returned"):
    """A result or an error (exactly one is meaningful)."""

    idempotency_key: str
    result: Any = None
    error: Any = None

    @model_validator(mode="before")
    @classmethod
    def _result_or_error(cls, data: Any) -> Any:
        if isinstance(data, dict) and "result" not in data and "error" not in data:
            raise ValueError("tool.returned needs a 'result' or an 'error'")
        return data


class StatePatched(Payload, event="state.patched"):
    key: str
    value: Any


class RunInterrupted(Payload, event="run.interrupted"):
    """The run is paused; the process may exit."""

    reason: str


class RunResumed(Payload, event="run.resumed"):
    by: str


class RunCompleted(Payload, event="run.completed"):
    """The run finished (no fields)."""


class RunFailed(Payload, event="run.failed"):
    error: str


class RunCancelled(Payload, event="run.cancelled"):
    """An operator stopped the run for good."""

    by: str


class RunGate(Payload, event="run.gate"):
    """The version gate's decision on resume."""

    decision: str
    code_revision: str
    prompt_hash: str


CURRENT_VERSIONS: dict[str, int] = dict.fromkeys(CATALOG, 1)
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
_UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def register_upcaster(type_: str, from_version: int, fn: Upcaster) -> None:
    """Register ``fn`` to turn a ``type_`` payload of ``from_version`` into the next one.

    Registering raises the type's current schema version to ``from_version + 1`` if it
    was lower.
    """
    _UPCASTERS[(type_, from_version)] = fn
    CURRENT_VERSIONS[type_] = max(CURRENT_VERSIONS.get(type_, 1), from_version + 1)


def schema_for(type_: str) -> type[Payload] | None:
    """The payload model of ``type_``, or None for types outside the catalog."""
    return CATALOG.get(type_)


def upcast(type_: str, payload: Any, schema_version: int) -> Any:
    """Apply registered upcasters from ``schema_version`` to the current version."""
    current = CURRENT_VERSIONS.get(type_, 1)
    v = schema_version
    while v < current:
        fn = _UPCASTERS.get((type_, v))
        if fn is None:
            raise EventSchemaError(type_, f"no upcaster from schema version {v} to {v + 1}")
        payload = fn(dict(payload))
        v += 1
    return payload


def parse(event: RecordedEvent) -> Payload | None:
    """Validate ``event``'s payload against the catalog (after upcasting).

    Returns:
        The typed payload, or None when the type is outside the catalog.

    Raises:
        EventSchemaError: the payload does not match its schema (names stream, version).
        PayloadErased: the event's payload was erased.
    """
    model = CATALOG.get(event.type)
    if model is None:
        return None

    def fail(problem: str) -> EventSchemaError:
        return EventSchemaError(
            event.type, problem, stream_id=event.stream_id, version=event.version
        )

    payload = event.payload
    meta = event.metadata
    schema_version = meta.get("schema", 1) if meta else 1
    try:
        if schema_version != CURRENT_VERSIONS[event.type]:
            payload = upcast(event.type, payload, int(schema_version))
        if not isinstance(payload, dict):
            raise fail(f"payload must be an object, got {type(payload).__name__}")
        return model.model_validate(payload)
    except ValidationError as exc:
        raise fail(_problem(exc)) from None
    except EventSchemaError as exc:
        if exc.stream_id is None:
            raise fail(exc.problem) from None
        raise


def _problem(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first.get("loc", ())) or "payload"
    return f"{loc}: {first.get('msg')}"


def new_event(
    type_: str, module: str, payload: dict[str, Any] | None = None, **kwargs: Any
) -> NewEvent:
    """Build a :class:`NewEvent` whose payload is validated against the catalog first.

    Raises:
        EventSchemaError: the payload does not match the type's schema.
    """
    payload = payload or {}
    model = CATALOG.get(type_)
    if model is not None:
        try:
            model.model_validate(payload)
        except ValidationError as exc:
            raise EventSchemaError(type_, _problem(exc)) from None
    meta = dict(kwargs.pop("metadata", {}) or {})
    if CURRENT_VERSIONS.get(type_, 1) != 1:
        meta.setdefault("schema", CURRENT_VERSIONS[type_])
    return NewEvent(type=type_, module=module, payload=payload, metadata=meta, **kwargs)
