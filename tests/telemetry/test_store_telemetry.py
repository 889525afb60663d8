"""Spans and metrics of store operations, replay, recovery, verification and audits,
checked with the OpenTelemetry SDK's in-memory exporters against real stores."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import ares_events as ae
from ares_events.core import telemetry
from tests.fixtures.servers import TEST_PASSWORD
from tests.telemetry.otel_helpers import Otel, attrs, parent_id

SECRET = "PAYLOAD-MARKER-7f3a"
KEY = "ab" * 32


def _event(i: int = 0) -> ae.NewEvent:
    return ae.NewEvent(
        type="task.noted", module="tests", payload={"note": SECRET, "i": i}, metadata={"m": SECRET}
    )


def _system(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def test_append_is_a_client_span_under_the_callers_span(otel: Otel, real_url: str) -> None:
    """An append is a CLIENT span ``append ares_events`` with the database conventions'
    attributes, a child of the caller's current span, timed in the duration histogram."""
    with ae.open_store(real_url) as store, otel.tracer.start_as_current_span("caller") as parent:
        res = store.append("agent-1", [_event(), _event(1)], expected_version=ae.NO_STREAM)
    span = otel.span("append ares_events")
    assert span.kind is SpanKind.CLIENT
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    a = attrs(span)
    assert a["db.system.name"] == _system(real_url)
    assert a["db.operation.name"] == "append"
    assert a["db.collection.name"] == "ares_events"
    assert a["ares_events.stream.id"] == "agent-1"
    assert a["ares_events.event.count"] == 2
    assert a["ares_events.stream.version"] == res.version == 2
    if _system(real_url) == "postgresql":
        assert a["server.address"] == "127.0.0.1"
        assert isinstance(a["server.port"], int)
        assert a["db.namespace"]
    assert otel.total("ares_events.events.appended", **{"db.system.name": _system(real_url)}) == 2
    points = [
        p
        for p in otel.metrics()["db.client.operation.duration"]
        if p.attributes["db.operation.name"] == "append"
    ]
    assert len(points) == 1
    assert tuple(points[0].explicit_bounds) == telemetry.DB_DURATION_BUCKETS
    assert points[0].count == 1


def test_a_duplicate_append_counts_nothing(otel: Otel, real_url: str) -> None:
    """Re-appending the same event id writes nothing, and no event is counted."""
    ev = _event()
    with ae.open_store(real_url) as store:
        store.append("s", [ev])
        store.append("s", [ev])
    spans = otel.spans("append ares_events")
    assert [attrs(s)["ares_events.append.duplicate"] for s in spans] == [False, True]
    assert otel.total("ares_events.events.appended") == 1


def test_a_failed_append_says_its_error_type_not_its_message(otel: Otel, real_url: str) -> None:
    """A ConcurrencyError marks the span (status, error.type, an exception event with
    the type only) and the duration point; the exception propagates unchanged."""
    with ae.open_store(real_url) as store:
        store.append("s", [_event()])
        with pytest.raises(ae.ConcurrencyError):
            store.append("s", [_event()], expected_version=5)
    failed = [
        s for s in otel.spans("append ares_events") if s.status.status_code is StatusCode.ERROR
    ]
    assert len(failed) == 1
    assert attrs(failed[0])["error.type"] == "ares_events.ConcurrencyError"
    assert [dict(attrs(e)) for e in failed[0].events] == [
        {"exception.type": "ares_events.ConcurrencyError"}
    ]
    errors = [
        p
        for p in otel.metrics()["db.client.operation.duration"]
        if p.attributes.get("error.type") == "ares_events.ConcurrencyError"
    ]
    assert len(errors) == 1


def test_read_span_lasts_until_the_iterator_ends(otel: Otel, real_url: str) -> None:
    """A lazy read is one CLIENT span from the call to the iterator's end, parented at
    the call, with the number of events it returned."""
    with ae.open_store(real_url) as store:
        store.append("s", [_event(i) for i in range(5)])
        with otel.tracer.start_as_current_span("caller") as parent:
            it = store.read("s", from_version=2)
        assert otel.spans("read ares_events") == []  # still open
        assert len(list(it)) == 4
        assert len(list(store.read_all(limit=3))) == 3
    span = otel.span("read ares_events")
    assert span.kind is SpanKind.CLIENT
    assert parent_id(span) == parent.get_span_context().span_id
    assert attrs(span)["db.response.returned_rows"] == 4
    assert attrs(otel.span("read_all ares_events"))["db.response.returned_rows"] == 3


def test_replay_and_recover_nest_their_reads(otel: Otel, real_url: str) -> None:
    """recover -> replay -> read, each a child of the one before; the replayed events
    and a capped replay are counted."""
    with ae.open_store(real_url) as store:
        store.append("s", [_event(i) for i in range(7)])
        rec = ae.recover(store, "s", ae.projections.RecoveryStateProjection(), snapshots=None)
        capped = ae.replay(store, "s", lambda n, e: n + 1, 0, max_replay=3)
    assert rec.replayed == 7 and capped.capped
    recover = otel.span("ares_events.recover")
    assert recover.kind is SpanKind.INTERNAL
    assert attrs(recover)["ares_events.recovery.source"] == "events"
    assert attrs(recover)["ares_events.replay.events"] == 7
    replays = otel.spans("ares_events.replay")
    inner = next(s for s in replays if s.parent and s.parent.span_id == recover.context.span_id)
    reads = otel.spans("read ares_events")
    assert any(r.parent and r.parent.span_id == inner.context.span_id for r in reads)
    outer = next(s for s in replays if s is not inner)
    assert attrs(outer)["ares_events.replay.capped"] is True
    assert otel.total("ares_events.events.replayed") == 7 + 3
    assert otel.total("ares_events.replay.capped") == 1
    ops = {
        p.attributes["ares_events.operation.name"]
        for p in otel.metrics()["ares_events.operation.duration"]
    }
    assert {"recover", "replay"} <= ops


def test_verify_and_audit_count_findings_by_kind(otel: Otel, tmp_path: Path) -> None:
    """A tampered row is a finding of verify_stream and of the audit; both are spans,
    and the findings metric counts them by kind (never by stream)."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    with ae.open_store(url) as store:
        store.append("s", [_event(i) for i in range(3)])
    with contextlib.closing(sqlite3.connect(tmp_path / "events.db")) as c, c:
        c.execute("UPDATE ares_events SET type = 'task.forged' WHERE version = 2")
    with ae.open_store(url) as store, otel.tracer.start_as_current_span("caller") as parent:
        report = ae.integrity.verify_stream(store, "s")
        audit = ae.integrity.audit(store)
    assert not report.ok and not audit.ok
    caller = parent.get_span_context().span_id
    verify = otel.span("ares_events.verify")
    assert verify.kind is SpanKind.INTERNAL
    assert parent_id(verify) == caller
    assert parent_id(otel.span("ares_events.audit")) == caller
    assert attrs(verify)["ares_events.findings"] == len(report.findings)
    assert attrs(verify)["ares_events.events.checked"] == 3
    span = otel.span("ares_events.audit")
    assert attrs(span)["ares_events.streams.checked"] == 1
    assert attrs(span)["ares_events.findings"] == len(audit.findings)
    kind = report.findings[0].kind
    assert otel.total(
        "ares_events.verification.findings", **{"db.operation.name": "verify"}
    ) == len(report.findings)
    assert (
        otel.total(
            "ares_events.verification.findings",
            **{"db.operation.name": "audit", "ares_events.finding.kind": kind},
        )
        >= 1
    )


def test_no_payload_password_or_chain_key_is_emitted(otel: Otel, real_url: str) -> None:
    """Spans and metrics of every store operation carry neither payloads nor metadata,
    nor the PostgreSQL password, nor the chain key."""
    with ae.open_store(real_url, chain_key=KEY) as store:
        store.append("s", [_event(i) for i in range(3)])
        with pytest.raises(ae.InvalidEvent):
            store.append("s", [ae.NewEvent(type="x.y", module="t", payload={SECRET: float("nan")})])
        list(store.read("s"))
        ae.recover(store, "s", ae.projections.RecoveryStateProjection(), snapshots=store.snapshots)
        ae.snapshot(store, "s", ae.projections.RecoveryStateProjection())
        ae.integrity.verify_stream(store, "s")
        ae.integrity.audit(store, deep=True)
    text = "\n".join(otel.strings())
    assert otel.spans()
    for secret in (SECRET, KEY, TEST_PASSWORD, "p@ss"):
        assert secret not in text


def test_metric_attributes_are_bounded(otel: Otel, real_url: str) -> None:
    """Every metric attribute key is one of the bounded ones, and no value is a stream
    id, whatever the streams are called."""
    streams = [f"agent-{i}-unique" for i in range(5)]
    with ae.open_store(real_url) as store:
        for sid in streams:
            store.append(sid, [_event()])
            list(store.read(sid))
            ae.replay(store, sid, lambda n, e: n + 1, 0)
            ae.integrity.verify_stream(store, sid)
        ae.integrity.audit(store)
    metrics = otel.metrics()
    assert metrics
    for name, points in metrics.items():
        for p in points:
            assert set(p.attributes) <= telemetry.METRIC_ATTRIBUTES, (name, p.attributes)
            assert not set(map(str, p.attributes.values())) & set(streams), name


def test_without_an_sdk_nothing_is_recorded(tmp_path: Path) -> None:
    """With the API and no SDK configured, telemetry is off and the store works; with
    OpenTelemetry not importable at all, too (a child process without it)."""
    telemetry._reset_for_tests()
    assert telemetry.current() is None
    with ae.open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        store.append("s", [_event()])
        assert len(list(store.read("s"))) == 1
    assert telemetry.current() is None
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import ares_events as ae\n"
        "from ares_events.core import telemetry\n"
        f"s = ae.open_store('sqlite:///{tmp_path / 'b.db'}')\n"
        "s.append('s', [ae.NewEvent(type='a.b', module='m', payload={})])\n"
        "print(ae.replay(s, 's', lambda n, e: n + 1, 0).state, telemetry.current())\n"
        "try:\n"
        "    telemetry.configure(tracer_provider=object())\n"
        "except ae.MissingDependencyError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout.splitlines()
    assert out[0] == "1 None"
    assert "pip install 'ares-events[otel]'" in out[1]
