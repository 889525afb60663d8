"""Built-in projections: expected states, strict vs tolerant folds, determinism (hypothesis)."""

from __future__ import annotations

import copy
import dataclasses
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.chain import canonical_json
from ares_events.core.catalog import EventSchemaError
from ares_events.core.events import RecordedEvent, format_at
from ares_events.projections import (
    AgentStateProjection,
    GenealogyProjection,
    Projection,
    RecoveryStateProjection,
    RunStateProjection,
    fold,
)
from ares_events.projections.tables import encode_state
from tests.fixtures.tier import examples

T0 = datetime(2025, 1, 1, tzinfo=UTC)
ZERO = b"\x00" * 32


def ev(
    type_: str,
    payload: Any,
    version: int,
    *,
    seconds: float | None = None,
    stream: str = "agent-1",
    meta: dict[str, Any] | None = None,
) -> RecordedEvent:
    """A recorded event built in memory, at ``T0 + seconds`` (default: version seconds)."""
    at = format_at(T0 + timedelta(seconds=version if seconds is None else seconds))
    return RecordedEvent(
        stream,
        version,
        version,
        str(uuid.UUID(int=version)),
        type_,
        "test",
        canonical_json(payload),
        canonical_json(meta or {}),
        at,
        ZERO,
        ZERO,
    )


def seq(*items: tuple[str, Any], stream: str = "agent-1") -> list[RecordedEvent]:
    """Events numbered 1.. from (type, payload) pairs."""
    return [ev(t, p, i, stream=stream) for i, (t, p) in enumerate(items, 1)]


AGENT_LIFE = [
    ("session.created", {"session_id": "sess-1", "entry_id": "e1"}),
    ("task.created", {"task_id": "t1"}),
    ("task.created", {"task_id": "t2"}),
    ("task.created", {"task_id": "t3"}),
    ("agent.started", {"instance_id": "i-1"}),
    ("task.completed", {"task_id": "t1"}),
    ("agent.dead", {"cause": "oom"}),
    ("failover.triggered", {"reason": "heartbeat lost"}),
    ("agent.resurrected", {"instance_id": "i-2", "attempt": 1}),
    ("failover.completed", {"instance_id": "i-2"}),
    ("task.failed", {"task_id": "t2", "error": "timeout"}),
    ("vendor.metric", {"cpu": 1}),
]

RUN = [
    ("run.started", {"code_revision": "rev-a", "prompt_hash": "ph"}),
    ("model.call.requested", {"step": 1, "messages_hash": "m1", "params": {"model": "x"}}),
    (
        "model.responded",
        {"step": 1, "completion": {"text": "c1"}, "usage": {"input_tokens": 10, "output": 4}},
    ),
    ("tool.call.requested", {"name": "search", "args": {"q": "a"}, "idempotency_key": "run:1"}),
    ("tool.returned", {"idempotency_key": "run:1", "result": ["hit"]}),
    ("state.patched", {"key": "notes", "value": ["a"]}),
    ("model.call.requested", {"step": 2, "messages_hash": "m2", "params": {}}),
    (
        "model.responded",
        {"step": 2, "completion": "c2", "usage": {"input_tokens": 7, "output": 3, "cached": True}},
    ),
    ("tool.call.requested", {"name": "ticket", "args": {"t": 1}, "idempotency_key": "run:2"}),
    ("tool.call.requested", {"name": "mail", "args": {}, "idempotency_key": "run:3"}),
    ("tool.returned", {"idempotency_key": "run:3", "error": "smtp down"}),
    ("state.patched", {"key": "notes", "value": ["a", "b"]}),
    ("run.interrupted", {"reason": "needs approval"}),
]


def test_agent_state_after_a_realistic_life() -> None:
    """AgentStateProjection: session, status, tasks, instance, restarts, deaths, last event."""
    st_ = fold(AgentStateProjection(), seq(*AGENT_LIFE)).state
    assert st_["session_id"] == "sess-1"
    assert st_["status"] == "running"
    assert st_["pending_tasks"] == ["t3"]
    assert st_["done_tasks"] == ["t1"] and st_["failed_tasks"] == ["t2"]
    assert st_["instance_id"] == "i-2"
    assert (st_["restarts"], st_["deaths"]) == (1, 1)
    assert st_["version"] == 12
    assert st_["last_event"]["type"] == "vendor.metric" and st_["last_event"]["version"] == 12


def test_agent_state_stopped_is_not_dead() -> None:
    """A voluntary stop leaves status 'stopped' and no death."""
    st_ = fold(
        AgentStateProjection(),
        seq(("agent.started", {"instance_id": "i"}), ("agent.stopped", {"reason": "done"})),
    ).state
    assert st_["status"] == "stopped" and st_["deaths"] == 0


def test_recovery_state_after_a_realistic_life() -> None:
    """RecoveryStateProjection: session, pending tasks, last version, last failover."""
    st_ = fold(RecoveryStateProjection(), seq(*AGENT_LIFE)).state
    assert st_["session_id"] == "sess-1"
    assert st_["pending_tasks"] == ["t3"]
    assert st_["last_version"] == 12
    lf = st_["last_failover"]
    assert lf["reason"] == "heartbeat lost" and lf["version"] == 8
    assert lf["completed"] is True and lf["instance_id"] == "i-2"


def test_recovery_state_failover_in_progress() -> None:
    """A triggered failover without completion is reported as not completed."""
    st_ = fold(RecoveryStateProjection(), seq(("failover.triggered", {"reason": "r"}))).state
    assert st_["last_failover"]["completed"] is False


def _life_with_deaths(times: list[float]) -> list[RecordedEvent]:
    out: list[RecordedEvent] = []
    v = 0
    for i, t in enumerate(times):
        v += 1
        out.append(ev("agent.dead", {"cause": f"c{i}"}, v, seconds=t))
        v += 1
        out.append(
            ev("agent.resurrected", {"instance_id": f"i-{i}", "attempt": i + 1}, v, seconds=t + 1)
        )
    return out


def test_genealogy_records_deaths_and_resurrections() -> None:
    """Every death (cause, time, version) and resurrection (new instance) is kept in order."""
    g = GenealogyProjection(flap_deaths=3, flap_window_s=60)
    st_ = fold(g, _life_with_deaths([0, 500])).state
    assert [d["cause"] for d in st_["deaths"]] == ["c0", "c1"]
    assert st_["deaths"][1]["at"] == format_at(T0 + timedelta(seconds=500))
    assert [(r["instance_id"], r["attempt"]) for r in st_["resurrections"]] == [
        ("i-0", 1),
        ("i-1", 2),
    ]
    assert st_["flapping"] is False


def test_genealogy_flapping_needs_n_deaths_within_window() -> None:
    """N deaths within the window set the flapping flag; the same N spread out do not."""
    g = GenealogyProjection(flap_deaths=3, flap_window_s=60)
    spread = fold(g, _life_with_deaths([0, 100, 200, 300])).state
    assert spread["flapping"] is False and spread["max_deaths_in_window"] == 1
    two_close = fold(g, _life_with_deaths([0, 100, 130])).state
    assert two_close["flapping"] is False and two_close["max_deaths_in_window"] == 2
    burst = fold(g, _life_with_deaths([0, 100, 130, 155])).state
    assert burst["flapping"] is True and burst["max_deaths_in_window"] == 3


def test_a_genealogy_snapshot_under_one_flap_rule_is_not_resumed_under_another() -> None:
    """The flap rule is part of the projection's name: a snapshot taken under the default
    rule (as `snapshot take` does) is not used by a fold under a stricter one, whose
    recovery then equals its full replay."""
    with ae.open_store("memory://") as store:
        started = ae.NewEvent(type="agent.started", module="runtime", payload={"instance_id": "i1"})
        dead = ae.NewEvent(type="agent.dead", module="runtime", payload={"cause": "oom"})
        store.append("a", [started])
        for _ in range(4):
            store.append("a", [dataclasses.replace(dead, event_id=uuid.uuid4())])
        ae.snapshot(store, "a", GenealogyProjection())
        strict = GenealogyProjection(flap_deaths=3, flap_window_s=30)
        assert GenealogyProjection(5, 30).name == "genealogy" != strict.name
        rec = ae.recover(store, "a", strict, snapshots=store.snapshots)
        assert rec.source == "events" and rec.state["flapping"] is True
        assert rec.state == ae.recover(store, "a", strict).state
        assert ae.recover(store, "a", GenealogyProjection(), snapshots=store.snapshots).source == (
            "snapshot"
        )


def test_genealogy_flapping_clears_when_deaths_leave_the_window() -> None:
    """A death long after a burst counts only recent deaths: the flag drops again."""
    g = GenealogyProjection(flap_deaths=2, flap_window_s=10)
    st_ = fold(g, _life_with_deaths([0, 5, 1000])).state
    assert st_["flapping"] is False and st_["max_deaths_in_window"] == 2


def test_genealogy_rejects_bad_rule() -> None:
    """A flap rule of zero deaths or a non-positive window is refused."""
    with pytest.raises(ValueError):
        GenealogyProjection(flap_deaths=0)
    with pytest.raises(ValueError):
        GenealogyProjection(flap_window_s=0)


def test_run_state_after_a_realistic_run() -> None:
    """RunStateProjection: step, status, completions, usage totals, tools, dangling, patches."""
    st_ = fold(RunStateProjection(), seq(*RUN, stream="run-1")).state
    assert st_["status"] == "paused"
    assert st_["step"] == 3  # run:3 is the highest step seen
    assert (st_["code_revision"], st_["prompt_hash"]) == ("rev-a", "ph")
    assert st_["completions"] == {"1": {"text": "c1"}, "2": "c2"}
    assert st_["usage"] == {"input_tokens": 17, "output": 7}  # bools are not summed
    assert st_["usage_by_step"]["2"] == {"input_tokens": 7, "output": 3, "cached": True}
    calls = st_["tool_calls"]
    assert calls["run:1"]["status"] == "returned" and calls["run:1"]["result"] == ["hit"]
    assert calls["run:2"]["status"] == "requested"
    assert calls["run:3"]["status"] == "error" and calls["run:3"]["error"] == "smtp down"
    assert st_["dangling"] == ["run:2"]
    assert st_["state"] == {"notes": ["a", "b"]}
    assert st_["interrupt"] == {
        "reason": "needs approval",
        "at": format_at(T0 + timedelta(seconds=13)),
        "version": 13,
    }


def test_run_state_resume_and_complete() -> None:
    """run.resumed clears the interrupt and counts; run.completed and run.failed end it."""
    base = [
        *RUN,
        ("run.resumed", {"by": "alice"}),
        ("tool.returned", {"idempotency_key": "run:2", "result": 1}),
    ]
    st_ = fold(RunStateProjection(), seq(*base)).state
    assert st_["status"] == "running" and st_["interrupt"] is None and st_["resumes"] == 1
    assert st_["dangling"] == []
    done = fold(RunStateProjection(), seq(*base, ("run.completed", {}))).state
    assert done["status"] == "completed"
    failed = fold(RunStateProjection(), seq(*base, ("run.failed", {"error": "e"}))).state
    assert failed["status"] == "failed" and failed["error"] == "e"


BROKEN = [
    ("session.created", {"session_id": "s"}),
    ("task.created", {"task_id": "t1"}),
    ("task.created", {"taskid": "typo"}),
    ("task.created", {"task_id": "t2"}),
    ("agent.dead", {}),
]


def test_strict_fold_raises_with_stream_and_version() -> None:
    """By default a bad catalog event stops the fold, naming the stream and version."""
    with pytest.raises(EventSchemaError) as info:
        fold(AgentStateProjection(), seq(*BROKEN, stream="agent-x"))
    assert (info.value.stream_id, info.value.version) == ("agent-x", 3)
    assert "'agent-x'" in str(info.value) and "version 3" in str(info.value)


def test_tolerant_fold_lists_every_skipped_event() -> None:
    """Tolerant mode skips bad events but lists each one with its version and reason."""
    res = fold(AgentStateProjection(), seq(*BROKEN, stream="agent-x"), strict=False)
    assert [(s.stream_id, s.version, s.type) for s in res.skipped] == [
        ("agent-x", 3, "task.created"),
        ("agent-x", 5, "agent.dead"),
    ]
    assert "task_id" in res.skipped[0].reason and "cause" in res.skipped[1].reason
    assert res.state["pending_tasks"] == ["t1", "t2"] and res.state["deaths"] == 0
    assert res.applied == 5


def test_recover_strict_and_tolerant(store: ae.EventStore) -> None:
    """ae.recover raises on a bad event by default; tolerant=True reports every skip."""
    for t, p in BROKEN:
        ae.emit(store, "agent-x", t, "test", p)
    proj = RecoveryStateProjection()
    with pytest.raises(EventSchemaError) as info:
        ae.recover(store, "agent-x", proj)
    assert (info.value.stream_id, info.value.version) == ("agent-x", 3)
    rec = ae.recover(store, "agent-x", proj, tolerant=True)
    assert [s.version for s in rec.skipped] == [3, 5]
    assert rec.ok is False and rec.version == 5
    assert rec.state["pending_tasks"] == ["t1", "t2"]
    assert [s["version"] for s in rec.to_dict()["skipped"]] == [3, 5]


# -- hypothesis: determinism and any snapshot point -------------------------------------------

_tasks = st.sampled_from(["t1", "t2", "t3"])
_keys = st.sampled_from(["run:1", "run:2", "run:3", "other"])
_steps = st.integers(0, 6)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
    max_leaves=6,
)
_usage = st.dictionaries(
    st.sampled_from(["input_tokens", "output_tokens", "flag"]),
    st.integers(0, 100) | st.booleans(),
    max_size=3,
)

EVENT = st.one_of(
    st.tuples(
        st.just("session.created"), st.fixed_dictionaries({"session_id": st.text(max_size=4)})
    ),
    st.tuples(st.just("task.created"), st.fixed_dictionaries({"task_id": _tasks})),
    st.tuples(st.just("task.completed"), st.fixed_dictionaries({"task_id": _tasks})),
    st.tuples(
        st.just("task.failed"), st.fixed_dictionaries({"task_id": _tasks, "error": st.just("e")})
    ),
    st.tuples(st.just("agent.started"), st.fixed_dictionaries({"instance_id": _tasks})),
    st.tuples(st.just("agent.stopped"), st.fixed_dictionaries({"reason": st.just("r")})),
    st.tuples(st.just("agent.dead"), st.fixed_dictionaries({"cause": st.just("c")})),
    st.tuples(
        st.just("agent.resurrected"),
        st.fixed_dictionaries({"instance_id": _tasks, "attempt": st.integers(1, 5)}),
    ),
    st.tuples(st.just("failover.triggered"), st.fixed_dictionaries({"reason": st.just("r")})),
    st.tuples(st.just("failover.completed"), st.fixed_dictionaries({"instance_id": _tasks})),
    st.tuples(
        st.just("run.started"),
        st.fixed_dictionaries({"code_revision": st.just("a"), "prompt_hash": st.just("p")}),
    ),
    st.tuples(
        st.just("model.call.requested"),
        st.fixed_dictionaries({"step": _steps, "messages_hash": st.just("m"), "params": _usage}),
    ),
    st.tuples(
        st.just("model.responded"),
        st.fixed_dictionaries({"step": _steps, "completion": _json, "usage": _usage}),
    ),
    st.tuples(
        st.just("tool.call.requested"),
        st.fixed_dictionaries({"name": st.just("n"), "args": _json, "idempotency_key": _keys}),
    ),
    st.tuples(
        st.just("tool.returned"),
        st.fixed_dictionaries({"idempotency_key": _keys, "result": _json}),
    ),
    st.tuples(
        st.just("tool.returned"),
        st.fixed_dictionaries({"idempotency_key": _keys, "error": st.just("x")}),
    ),
    st.tuples(st.just("state.patched"), st.fixed_dictionaries({"key": _tasks, "value": _json})),
    st.tuples(st.just("run.interrupted"), st.fixed_dictionaries({"reason": st.just("r")})),
    st.tuples(st.just("run.resumed"), st.fixed_dictionaries({"by": st.just("b")})),
    st.tuples(st.just("run.completed"), st.just({})),
    st.tuples(st.just("run.failed"), st.fixed_dictionaries({"error": st.just("e")})),
    st.tuples(st.just("vendor.other"), st.fixed_dictionaries({"x": _json})),
)


@st.composite
def streams(draw: st.DrawFn) -> list[RecordedEvent]:
    """A stream of catalog and foreign events with increasing times (gaps 0-40 s)."""
    items = draw(st.lists(EVENT, max_size=30))
    gaps = draw(st.lists(st.integers(0, 40), min_size=len(items), max_size=len(items)))
    out: list[RecordedEvent] = []
    t = 0
    for i, ((type_, payload), gap) in enumerate(zip(items, gaps, strict=True), 1):
        t += gap
        out.append(ev(type_, payload, i, seconds=t))
    return out


def _projections() -> list[Projection]:
    return [
        AgentStateProjection(),
        RecoveryStateProjection(),
        GenealogyProjection(flap_deaths=2, flap_window_s=30),
        RunStateProjection(),
    ]


HYP = settings(
    max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@HYP
@given(events=streams())
def test_fold_is_deterministic(events: list[RecordedEvent]) -> None:
    """The same events always fold to the same state (and never touch the events)."""
    payloads = [copy.deepcopy(e.payload) for e in events]
    for p in _projections():
        first = fold(p, events).state
        second = fold(p, events).state
        assert first == second, p.name
        assert encode_state(first) == encode_state(second)
    assert [e.payload for e in events] == payloads


@HYP
@given(events=streams(), data=st.data())
def test_fold_from_any_snapshot_point_equals_full_fold(
    events: list[RecordedEvent], data: st.DataObject
) -> None:
    """For any k, folding events[k:] from the state at k (also after JSON) equals the full fold."""
    k = data.draw(st.integers(0, len(events)), label="k")
    for p in _projections():
        full = fold(p, events).state
        head = fold(p, events[:k]).state
        stored = orjson.loads(encode_state(head))  # what a snapshot keeps
        from_json = fold(p, events[k:], state=stored).state
        from_live = fold(p, events[k:], state=fold(p, events[:k]).state).state
        assert from_live == full, p.name
        assert from_json == full, p.name
        assert encode_state(from_json) == encode_state(full)
