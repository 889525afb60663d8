"""OpenTelemetry SDK set-up for the telemetry tests: in-memory span and metric exporters
behind :func:`ares_events.telemetry.configure` (no global provider is touched)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer
from opentelemetry.util.types import AttributeValue

from ares_events.core import telemetry


def attrs(item: ReadableSpan | Event) -> Mapping[str, AttributeValue]:
    """The attributes of a finished span or span event (the SDK always sets them, though
    the API types them as optional)."""
    assert item.attributes is not None, item.name
    return item.attributes


def parent_id(span: ReadableSpan) -> int:
    """The span id of ``span``'s parent (which it must have)."""
    assert span.parent is not None, span.name
    return span.parent.span_id


def start_time(span: ReadableSpan) -> int:
    """When a finished span started (ns since the epoch)."""
    assert span.start_time is not None, span.name
    return span.start_time


@dataclass
class Otel:
    """What the code under test emitted."""

    tracer_provider: TracerProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader

    @property
    def tracer(self) -> Tracer:
        return self.tracer_provider.get_tracer("tests")

    def spans(self, name: str | None = None) -> list[ReadableSpan]:
        got = list(self.exporter.get_finished_spans())
        return [s for s in got if name is None or s.name == name]

    def span(self, name: str) -> ReadableSpan:
        found = self.spans(name)
        assert len(found) == 1, (name, [s.name for s in self.spans()])
        return found[0]

    def metrics(self) -> dict[str, list[Any]]:
        """Metric name -> its data points."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        if data is None:
            return out
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out

    def total(self, name: str, **attrs: Any) -> float:
        """Sum of a counter's points whose attributes include ``attrs``."""
        total: float = sum(
            p.value
            for p in self.metrics().get(name, [])
            if all(p.attributes.get(k) == v for k, v in attrs.items())
        )
        return total

    def strings(self) -> list[str]:
        """Every string a span, span event, link or metric point carries (names,
        attribute keys and values), to search for what must never be there."""
        out: list[str] = []
        for s in self.spans():
            out.append(s.name)
            for attrs in [s.attributes, *(e.attributes for e in s.events)] + [
                ln.attributes for ln in s.links
            ]:
                for k, v in (attrs or {}).items():
                    out.extend([k, repr(v)])
            out.extend(e.name for e in s.events)
            if s.status.description:
                out.append(s.status.description)
        for name, points in self.metrics().items():
            out.append(name)
            for p in points:
                for k, v in p.attributes.items():
                    out.extend([k, repr(v)])
        return out


def otel_setup(capture_content: bool | None = None) -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    mp = MeterProvider(metric_readers=[reader])
    telemetry.configure(tracer_provider=tp, meter_provider=mp, capture_content=capture_content)
    try:
        yield Otel(tp, exporter, reader)
    finally:
        telemetry._reset_for_tests()
        mp.shutdown()
        tp.shutdown()
