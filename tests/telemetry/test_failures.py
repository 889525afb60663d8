"""A telemetry pipeline that raises (a span processor's on_start or on_end, a sampler, a
metric instrument, a meter provider) never fails an operation: an append commits once
and returns, reads, replays, verifications, audits, journaled runs and supervisors work,
the operation's own exceptions reach the caller unchanged, and each kind of failure is
logged once as a WARNING. Real SDK providers, real SQLite files and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import ExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Sampler, SamplingResult
from opentelemetry.util.types import Attributes

import ares_events as ae
from ares_events.agents import supervision
from ares_events.core import telemetry
from ares_events.integrity import audit, averify_stream, verify_stream

SECRET = "PAYLOAD-MARKER-c41d"
STREAM = "stream-marker-9e07"


class Boom(Exception):
    """What the broken pipeline raises."""


class RaiseOnStart(SpanProcessor):
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        raise Boom("on_start")


class RaiseOnEnd(SpanProcessor):
    def on_end(self, span: ReadableSpan) -> None:
        raise Boom("on_end")


class RaiseSampler(Sampler):
    def should_sample(self, *args: Any, **kwargs: Any) -> SamplingResult:
        raise Boom("sampler")

    def get_description(self) -> str:
        return "raises"


class RaiseOnMeasurement(ExemplarFilter):
    """Consulted by the SDK on every add/record: the instrument call raises."""

    def should_sample(
        self, value: float, time_unix_nano: int, attributes: Attributes, context: Context
    ) -> bool:
        raise Boom("measurement")


class RaiseOnGetMeter(MeterProvider):
    def get_meter(self, *args: Any, **kwargs: Any) -> Any:
        raise Boom("get_meter")


def _tracing(broken: str, exporter: InMemorySpanExporter) -> TracerProvider:
    if broken == "sampler":
        tp = TracerProvider(sampler=RaiseSampler())
    else:
        tp = TracerProvider()
    # The working exporter first: with on_end broken the spans are still exported.
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    if broken == "on_start":
        tp.add_span_processor(RaiseOnStart())
    if broken in ("on_end", "on_end+measurement"):
        tp.add_span_processor(RaiseOnEnd())
    return tp


def _metering(broken: str) -> MeterProvider:
    reader = InMemoryMetricReader()
    if broken == "get_meter":
        return RaiseOnGetMeter(metric_readers=[reader])
    if broken in ("measurement", "on_end+measurement"):
        return MeterProvider(metric_readers=[reader], exemplar_filter=RaiseOnMeasurement())
    return MeterProvider(metric_readers=[reader])


BROKEN = ["on_start", "on_end", "sampler", "measurement", "get_meter", "on_end+measurement"]


@pytest.fixture(params=BROKEN)
def broken(request: pytest.FixtureRequest) -> Iterator[InMemorySpanExporter]:
    """ares-events configured with a pipeline broken as the parameter says."""
    exporter = InMemorySpanExporter()
    tp, mp = _tracing(request.param, exporter), _metering(request.param)
    telemetry.configure(tracer_provider=tp, meter_provider=mp)
    try:
        yield exporter
    finally:
        telemetry._reset_for_tests()
        mp.shutdown()
        tp.shutdown()


def _event(i: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="task.noted", module="tests", payload={"note": SECRET, "i": i})


def test_append_commits_once_and_read_replay_verify_audit_return(
    broken: InMemorySpanExporter, real_url: str
) -> None:
    """An append returns its result and the store holds the event exactly once; read,
    replay, verify and audit return their results."""
    with ae.open_store(real_url) as store:
        res = store.append(STREAM, [_event()], expected_version=ae.NO_STREAM)
        assert res.version == 1
        head = store.head(STREAM)
        assert head is not None and head.version == 1
        assert [e.version for e in store.read(STREAM)] == [1]
        assert [e.stream_id for e in store.read_all()] == [STREAM]
        assert ae.replay(store, STREAM, lambda n, e: n + 1, 0).state == 1
        assert verify_stream(store, STREAM).ok
        assert audit(store).ok
        batch = store.append_many([("other", [_event(1)], ae.NO_STREAM)])
        assert [r.version for r in batch] == [1]
        assert [e.stream_id for e in store.read_all()] == [STREAM, "other"]


def test_async_append_commits_once_and_read_replay_verify_return(
    broken: InMemorySpanExporter, real_url: str
) -> None:
    """The asyncio face: an append returns and the event is stored once; read, replay
    and verify return their results."""

    async def main() -> None:
        store = await ae.open_async_store(real_url)
        try:
            res = await store.append(STREAM, [_event()], expected_version=ae.NO_STREAM)
            assert res.version == 1
            assert [e.version async for e in store.read(STREAM)] == [1]
            assert [e.stream_id async for e in store.read_all()] == [STREAM]
            assert (await ae.areplay(store, STREAM, lambda n, e: n + 1, 0)).state == 1
            assert (await averify_stream(store, STREAM)).ok
        finally:
            await store.close()

    asyncio.run(main())


def test_the_operations_own_exception_reaches_the_caller(
    broken: InMemorySpanExporter, tmp_path: Path
) -> None:
    """A ConcurrencyError raised by the append itself reaches the caller unchanged (sync
    and async), and nothing more was written."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        store.append(STREAM, [_event()])
        with pytest.raises(ae.ConcurrencyError) as caught:
            store.append(STREAM, [_event(1)], expected_version=ae.NO_STREAM)
        assert (caught.value.stream_id, caught.value.actual) == (STREAM, 1)
        assert [e.version for e in store.read(STREAM)] == [1]

    async def main() -> None:
        store = await ae.open_async_store(url)
        try:
            with pytest.raises(ae.ConcurrencyError) as caught:
                await store.append(STREAM, [_event(1)], expected_version=0)
            assert (caught.value.stream_id, caught.value.actual) == (STREAM, 1)
        finally:
            await store.close()

    asyncio.run(main())


def _model(messages: Any, params: Any) -> ae.ModelReply:
    return ae.ModelReply("ok", {"input_tokens": 3, "output_tokens": 2})


def test_journal_steps_work(broken: InMemorySpanExporter, tmp_path: Path) -> None:
    """A journaled run opens, makes its model and tool calls (each once), completes,
    and opens again replaying them from the log (both faces)."""
    calls = {"tool": 0}

    def tool(args: Any, key: str) -> int:
        calls["tool"] += 1
        return 7

    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        with ae.Journal(store, "run-1") as j:
            assert j.model_call([{"role": "user", "content": SECRET}], {"model": "m"}, call=_model)
            assert j.tool_call("t", {"a": SECRET}, call=tool) == 7
            j.complete({"ok": True})
        assert j.status == "completed"
        with ae.Journal(store, "run-1") as again:  # resumed: the answers come from the log
            assert again.resumed
            assert again.model_call(
                [{"role": "user", "content": SECRET}], {"model": "m"}, call=_model
            )
            assert again.tool_call("t", {"a": SECRET}, call=tool) == 7
        assert calls["tool"] == 1

    async def main() -> None:
        store = await ae.open_async_store(f"sqlite:///{tmp_path / 'a.db'}")
        try:
            j = await ae.AsyncJournal.open(store, "run-2")
            async with j:
                await j.model_call(["hi"], {"model": "m"}, call=_model)
                assert await j.tool_call("t", {}, call=tool) == 7
                await j.complete()
            assert j.status == "completed"
        finally:
            await store.close()

    asyncio.run(main())
    assert calls["tool"] == 2


def test_a_supervisor_runs(broken: InMemorySpanExporter, tmp_path: Path) -> None:
    """A supervisor records deaths and resurrections and reaches its restart cap."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        sup = supervision.ProcessSupervisor(
            store, max_restarts=1, backoff_base=0.01, backoff_cap=0.02
        )
        sup.register("agent-x", [sys.executable, "-c", "raise SystemExit(3)"])
        sup.start()
        assert sup.run(tick=0.01, timeout=60)
        types = [e.type for e in store.read("agent-x")]
    assert types.count("agent.dead") == 2
    assert types.count("agent.resurrected") == 1


def test_each_kind_of_failure_is_logged_once(
    broken: InMemorySpanExporter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Repeated operations log each kind of telemetry failure once, as a WARNING on the
    ares_events loggers, without payload content or the stream id."""
    caplog.set_level(logging.WARNING, logger="ares_events")
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        for i in range(3):
            store.append(STREAM, [_event(i)])
            assert len(list(store.read(STREAM))) == i + 1
            ae.replay(store, STREAM, lambda n, e: n + 1, 0)
    # configure() asks the providers for a tracer and a meter: a broken one warns then.
    records = caplog.get_records("setup") + caplog.records
    warned = [r for r in records if r.levelno == logging.WARNING]
    assert warned, "a failure of the pipeline is not silent"
    messages = [r.getMessage() for r in warned]
    assert len(messages) == len(set(messages)), messages
    for r in warned:
        assert r.name.startswith("ares_events."), r.name
        assert SECRET not in r.getMessage() and STREAM not in r.getMessage()
        assert r.exc_info is None  # a traceback would carry the exception's message


def test_nothing_is_logged_when_the_pipeline_works(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A working pipeline records spans and logs no warning."""
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry.configure(tracer_provider=tp)
    caplog.set_level(logging.WARNING, logger="ares_events")
    try:
        with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
            store.append(STREAM, [_event()])
    finally:
        telemetry._reset_for_tests()
        tp.shutdown()
    assert [s.name for s in exporter.get_finished_spans()] == ["append ares_events"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
