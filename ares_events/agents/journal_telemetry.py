"""Spans and metrics of journaled runs, after OpenTelemetry's GenAI conventions
(``invoke_agent``, ``chat {model}``, ``execute_tool {name}``: docs/observability.md).
The helpers are blocking context managers, so one code serves both faces of the journal.
None of them raises when the telemetry pipeline does (``telemetry.guarded``): a
journal's steps never fail because of it.

It may import the core.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Final

from ares_events.core import telemetry
from ares_events.core.telemetry import Telemetry, error_type, guarded

__all__ = ["TRACE_KEY", "CallSpan", "RunTrace", "call_span", "start_run"]

TRACE_KEY: Final = "trace_context"
"""Metadata key of the trace context stored with ``run.started`` and ``run.gate``."""

_MODEL: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}$")
_MAX_CONTENT: Final = 64 * 1024


class RunTrace:
    """The ``invoke_agent`` span of one journal (see the module docstring)."""

    __slots__ = ("_span", "_tel", "run_id")

    def __init__(self, tel: Telemetry, span: Any, run_id: str) -> None:
        self._tel = tel
        self._span = span
        self.run_id = run_id

    @property
    def context(self) -> Any:
        """An OpenTelemetry context with this span current (for children)."""
        return self._tel.otel.trace.set_span_in_context(self._span)

    def attach(self) -> Any:
        """Make the span current; returns the token for :meth:`detach` (None when that
        failed)."""
        with guarded("context"):
            return self._tel.otel.context.attach(self.context)
        return None

    def detach(self, token: Any) -> None:
        """Undo :meth:`attach`."""
        if token is not None:
            with guarded("context"):
                self._tel.otel.context.detach(token)

    def metadata(self) -> dict[str, Any] | None:
        """``{TRACE_KEY: {"traceparent": ...}}`` of this span, for an event's metadata."""
        token = self.attach()
        if token is None:
            return None  # not current: the context read would be another span's
        try:
            ctx = telemetry.trace_context()
        finally:
            self.detach(token)
        return {TRACE_KEY: ctx} if ctx else None

    def opened(self, journal: Any, origin: Any) -> None:
        """After ``journal`` opened the run: what recovery found, and a link to the trace of
        the run's first incarnation (``origin``: the metadata of its ``run.started``)."""
        span = self._span
        with guarded("span update"):
            span.set_attribute("ares_events.journal.resumed", journal.resumed)
            span.set_attribute("ares_events.recovery.source", journal.recovered_from)
            span.set_attribute("ares_events.stream.version", journal.version)
            if isinstance(origin, Mapping):
                link = telemetry.link_to(origin.get(TRACE_KEY), {"ares_events.link": "resumes"})
                if link is not None and link.context.span_id != span.get_span_context().span_id:
                    span.add_link(link.context, link.attributes)

    def event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the run's span (an interrupt, an in-doubt call)."""
        with guarded("span update"):
            self._span.add_event(name, dict(attributes))

    def end(self, status: str, exc: BaseException | None = None) -> None:
        """End the span with the run's status (idempotent)."""
        span = self._span
        with guarded("span update"):  # still end it below
            if not span.is_recording():
                return
            span.set_attribute("ares_events.journal.status", status)
        self._tel.end_span(span, exc)


def start_run(run_id: str) -> RunTrace | None:
    """Start the ``invoke_agent`` span of ``run_id`` under the caller's current span, or
    None without a tracer."""
    tel = telemetry.current()
    if tel is None or tel.tracer is None:
        return None
    span = tel.start_span(
        "invoke_agent", {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": run_id}
    )
    return RunTrace(tel, span, run_id) if span is not None else None


class CallSpan:
    """One attempt of a model or tool call: its span and its metrics."""

    __slots__ = ("_attempt", "_from_log", "_op", "_span", "_t0", "_tel", "_token", "model")

    def __init__(self, tel: Telemetry, op: str, name: str, attrs: dict[str, Any], parent: Any):
        self._tel = tel
        self._op = op
        self._from_log = False
        self._attempt = 1
        self._token: Any = None
        self._t0 = telemetry.timed()
        self.model = attrs.get("gen_ai.request.model")
        kind = "CLIENT" if op == "chat" else "INTERNAL"
        self._span = tel.start_span(name, attrs, kind=kind, parent=parent)
        if self._span is not None:
            otel = tel.otel
            with guarded("context"):
                self._token = otel.context.attach(otel.trace.set_span_in_context(self._span))

    def begun(self, journal: Any, from_log: bool, call_id: str | None = None) -> None:
        """After the log was consulted: step, attempt, whether the log answers (and the
        tool call's id)."""
        self._from_log = from_log or bool(journal.replaying)
        self._attempt = int(journal.attempt)
        span = self._span
        if span is not None:
            with guarded("span update"):
                span.set_attribute("ares_events.journal.step", int(journal.position))
                span.set_attribute("ares_events.journal.attempt", int(journal.attempt))
                span.set_attribute("ares_events.journal.from_log", self._from_log)
                if call_id is not None:
                    span.set_attribute("gen_ai.tool.call.id", call_id)

    @property
    def capturing(self) -> bool:
        """True when content goes on this span (capture opted into)."""
        return self._span is not None and self._tel.capture_content

    def content(self, key: str, value: Any) -> None:
        """Message content, only when capture is opted into."""
        if self.capturing:
            try:
                text = json.dumps(value, ensure_ascii=False, default=repr)
            except (TypeError, ValueError):
                text = repr(value)
            with guarded("span update"):
                self._span.set_attribute(key, text[:_MAX_CONTENT])

    def usage(self, usage: Any) -> None:
        """Token usage as the model's reply reported it."""
        if not isinstance(usage, Mapping):
            return
        tokens = {
            "input": usage.get("input_tokens", usage.get("prompt_tokens")),
            "output": usage.get("output_tokens", usage.get("completion_tokens")),
        }
        m = self._tel.metrics
        for kind, n in tokens.items():
            if type(n) is not int or n < 0:
                continue
            if self._span is not None:
                with guarded("span update"):
                    self._span.set_attribute(f"gen_ai.usage.{kind}_tokens", n)
            if m is not None and not self._from_log:
                m.genai_tokens.record(n, {**self._op_attrs(), "gen_ai.token.type": kind})

    def _op_attrs(self) -> dict[str, Any]:
        attrs = {"gen_ai.operation.name": self._op}
        return {**attrs, "gen_ai.request.model": self.model} if self.model else attrs

    def __enter__(self) -> CallSpan:
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        tel = self._tel
        failed = exc if exc is not None and not isinstance(exc, GeneratorExit) else None
        if self._span is not None:
            if self._token is not None:
                with guarded("context"):
                    tel.otel.context.detach(self._token)
            tel.end_span(self._span, failed)
        m = tel.metrics
        if m is None:
            return
        failure = {"error.type": error_type(failed)} if failed is not None else {}
        op = {"gen_ai.operation.name": self._op}
        m.journal_calls.add(1, {**op, "ares_events.journal.from_log": self._from_log, **failure})
        if self._from_log:
            return
        if self._attempt > 1:
            m.journal_retries.add(1, op)
        if self._op == "chat":
            m.genai_duration.record(self._t0(), {**self._op_attrs(), **failure})


class _NoCall:
    __slots__ = ()
    capturing = False

    def _nothing(self, *args: Any) -> None:
        """Nothing recorded."""

    begun = content = usage = _nothing

    def __enter__(self) -> _NoCall:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NO_CALL: Final = _NoCall()


def call_span(
    journal: Any, op: str, *, tool: str | None = None, params: Any = None
) -> CallSpan | _NoCall:
    """The span of one model (``op="chat"``) or tool (``op="execute_tool"``) attempt of
    ``journal``: a child of the caller's current span, else of the run's span."""
    tel = telemetry.current()
    if tel is None:
        return NO_CALL
    attrs: dict[str, Any] = {"gen_ai.operation.name": op, "gen_ai.conversation.id": journal.run_id}
    if op == "chat":
        model = params.get("model") if isinstance(params, Mapping) else None
        model = model if isinstance(model, str) and _MODEL.match(model) else None
        name = f"chat {model}" if model else "chat"
        if model:
            attrs["gen_ai.request.model"] = model
    else:
        name = f"execute_tool {tool}"
        attrs["gen_ai.tool.name"] = tool
    parent = None
    run: RunTrace | None = getattr(journal, "_run_trace", None)
    if run is not None and tel.tracer is not None:
        with guarded("context"):
            current = tel.otel.trace.get_current_span()
            if not current.get_span_context().is_valid:
                parent = run.context  # no span of the caller's: the run's span is the parent
    return CallSpan(tel, op, name, attrs, parent)
