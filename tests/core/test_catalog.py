"""The event catalog: required fields, kept extras, schema errors, upcasters, foreign types."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import ares_events as ae
from ares_events import catalog
from ares_events.core.catalog import CATALOG, CURRENT_VERSIONS, EventSchemaError, parse
from ares_events.projections import (
    AgentStateProjection,
    GenealogyProjection,
    Projection,
    RecoveryStateProjection,
    RunStateProjection,
    fold,
)

# One valid payload per catalog type (only the required fields).
VALID: dict[str, dict[str, Any]] = {
    "session.created": {"session_id": "s1"},
    "task.created": {"task_id": "t1"},
    "task.completed": {"task_id": "t1"},
    "task.failed": {"task_id": "t1", "error": "boom"},
    "agent.started": {"instance_id": "i-1"},
    "agent.stopped": {"reason": "done"},
    "agent.dead": {"cause": "oom"},
    "agent.resurrected": {"instance_id": "i-2", "attempt": 1},
    "failover.triggered": {"reason": "heartbeat"},
    "failover.completed": {"instance_id": "i-3"},
    "run.started": {"code_revision": "abc", "prompt_hash": "p1"},
    "model.call.requested": {"step": 1, "messages_hash": "m1", "params": {"t": 0}},
    "model.responded": {"step": 1, "completion": "hi", "usage": {"input_tokens": 3}},
    "model.call.failed": {"step": 1, "attempt": 1, "error_type": "RateLimited", "error": "429"},
    "tool.call.requested": {"name": "search", "args": {"q": "x"}, "idempotency_key": "r:1"},
    "tool.returned": {"idempotency_key": "r:1", "result": {"ok": True}},
    "tool.call.failed": {
        "idempotency_key": "r:1",
        "step": 1,
        "attempt": 1,
        "error_type": "TimeoutError",
        "error": "gateway timed out",
    },
    "tool.call.not_done": {"idempotency_key": "r:1", "by": "alice"},
    "step.abandoned": {"step": 1},
    "state.patched": {"key": "k", "value": [1, 2]},
    "run.interrupted": {"reason": "approval"},
    "run.resumed": {"by": "alice"},
    "run.completed": {},
    "run.failed": {"error": "bad"},
    "run.cancelled": {"by": "alice"},
    "run.gate": {"decision": "continue", "code_revision": "abc", "prompt_hash": "p1"},
}

REQUIRED: list[tuple[str, str]] = [(t, f) for t, p in VALID.items() for f in p]

ALL_BUILTINS: list[Projection] = [
    AgentStateProjection(),
    RecoveryStateProjection(),
    GenealogyProjection(),
    RunStateProjection(),
]


@pytest.fixture
def mem() -> Iterator[ae.EventStore]:
    """A private in-memory store."""
    with ae.open_store("memory://") as s:
        yield s


@pytest.fixture
def restore_registry() -> Iterator[None]:
    """Put the upcaster registry and schema versions back as they were."""
    saved_versions = dict(CURRENT_VERSIONS)
    saved_upcasters = dict(catalog._UPCASTERS)
    yield
    CURRENT_VERSIONS.clear()
    CURRENT_VERSIONS.update(saved_versions)
    catalog._UPCASTERS.clear()
    catalog._UPCASTERS.update(saved_upcasters)


def _one(store: ae.EventStore, stream: str, type_: str, payload: Any, **meta: Any) -> Any:
    ae.emit(store, stream, type_, "test", payload, metadata=meta or None)
    return list(store.read(stream))[-1]


def test_catalog_covers_the_issue_types() -> None:
    """Every type the issue lists is in the catalog, each with a valid example here."""
    assert set(VALID) == set(CATALOG)


@pytest.mark.parametrize("type_", sorted(VALID))
def test_valid_payload_parses(mem: ae.EventStore, type_: str) -> None:
    """A payload with the required fields parses into its typed model."""
    p = parse(_one(mem, "a", type_, VALID[type_]))
    assert isinstance(p, CATALOG[type_])
    for k, v in VALID[type_].items():
        assert getattr(p, k) == v


@pytest.mark.parametrize(("type_", "field"), REQUIRED)
def test_missing_required_field_names_stream_and_version(
    mem: ae.EventStore, type_: str, field: str
) -> None:
    """Dropping a required field raises EventSchemaError naming the stream and version."""
    ae.emit(mem, "agent-9", "other.thing", "test", {})
    payload = {k: v for k, v in VALID[type_].items() if k != field}
    ev = _one(mem, "agent-9", type_, payload)
    with pytest.raises(EventSchemaError) as info:
        parse(ev)
    err = info.value
    assert err.stream_id == "agent-9" and err.version == 2 and err.type == type_
    assert "'agent-9'" in str(err) and "version 2" in str(err) and field in str(err)


def test_tool_returned_needs_result_or_error(mem: ae.EventStore) -> None:
    """tool.returned with neither a result nor an error is a schema error."""
    ev = _one(mem, "r", "tool.returned", {"idempotency_key": "r:1"})
    with pytest.raises(EventSchemaError, match="result"):
        parse(ev)


def test_wrong_field_type_is_a_schema_error(mem: ae.EventStore) -> None:
    """A field of the wrong type (step as text) is rejected with the field named."""
    ev = _one(mem, "r", "model.call.requested", {"step": "one", "messages_hash": "m", "params": {}})
    with pytest.raises(EventSchemaError, match="step"):
        parse(ev)


def test_non_object_payload_is_a_schema_error(mem: ae.EventStore) -> None:
    """A catalog type whose payload is not an object names stream and version."""
    ev = _one(mem, "r", "task.created", ["t1"])
    with pytest.raises(EventSchemaError, match="object") as info:
        parse(ev)
    assert (info.value.stream_id, info.value.version) == ("r", 1)


@pytest.mark.parametrize("type_", sorted(VALID))
def test_unknown_extra_fields_are_kept(mem: ae.EventStore, type_: str) -> None:
    """Fields a newer writer added are kept on the parsed payload, not rejected."""
    p = parse(_one(mem, "a", type_, {**VALID[type_], "added_in_v9": {"x": 1}}))
    assert p is not None
    assert p.model_extra == {"added_in_v9": {"x": 1}}


def test_new_event_validates_before_append() -> None:
    """catalog.new_event refuses a bad payload before anything is written."""
    ok = catalog.new_event("task.created", "runtime", {"task_id": "t1"})
    assert ok.type == "task.created" and ok.payload == {"task_id": "t1"}
    with pytest.raises(EventSchemaError, match="task_id"):
        catalog.new_event("task.created", "runtime", {})
    assert catalog.new_event("x.custom", "runtime", {"any": 1}).payload == {"any": 1}


def test_upcaster_folds_old_event_through_new_code(
    mem: ae.EventStore, restore_registry: None
) -> None:
    """A v1 payload with an old field name upcasts and folds through the current projection."""
    # v1 of task.created called the field "id"; v2 calls it "task_id".
    ae.emit(mem, "a", "task.created", "test", {"id": "old-task"})
    catalog.register_upcaster("task.created", 1, lambda p: {"task_id": p.pop("id"), **p})
    assert CURRENT_VERSIONS["task.created"] == 2
    # New writers stamp the schema version; the new event needs no upcasting.
    mem.append("a", [catalog.new_event("task.created", "test", {"task_id": "new-task"})])
    events = list(mem.read("a"))
    assert events[1].metadata == {"schema": 2}
    parsed = parse(events[0])
    assert parsed is not None and parsed.task_id == "old-task"  # type: ignore[attr-defined]
    st = fold(RecoveryStateProjection(), events).state
    assert st["pending_tasks"] == ["old-task", "new-task"]


def test_missing_upcaster_is_a_schema_error(mem: ae.EventStore, restore_registry: None) -> None:
    """An event at a schema version with no upcaster path raises naming stream and version."""
    catalog.register_upcaster("task.created", 2, lambda p: p)  # 2 -> 3 only; 1 -> 2 missing
    ev = _one(mem, "a", "task.created", {"task_id": "t"})
    with pytest.raises(EventSchemaError, match="no upcaster from schema version 1") as info:
        parse(ev)
    assert (info.value.stream_id, info.value.version) == ("a", 1)


def test_types_outside_catalog_read_as_plain_events(mem: ae.EventStore) -> None:
    """A foreign type stays readable and every built-in projection ignores it."""
    ae.emit(mem, "a", "task.created", "test", {"task_id": "t1"})
    ae.emit(mem, "a", "vendor.telemetry", "vendor", {"cpu": 0.5, "task_id": 7})
    ae.emit(mem, "a", "session.created", "test", {"session_id": "s1"})
    events = list(mem.read("a"))
    foreign = events[1]
    assert foreign.type == "vendor.telemetry" and foreign.payload == {"cpu": 0.5, "task_id": 7}
    assert parse(foreign) is None
    for p in ALL_BUILTINS:
        with_foreign = fold(p, events).state
        without = fold(p, [events[0], events[2]]).state
        # Only bookkeeping of "last event seen" may move; the domain state is untouched.
        for k in ("last_event", "version", "last_version"):
            with_foreign.pop(k, None)
            without.pop(k, None)
        assert with_foreign == without, p.name
