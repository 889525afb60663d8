"""OpenTelemetry spans and metrics for the store, verification, recovery and the agent
runtime (the ``otel`` extra; docs/observability.md). Without an SDK every helper hands
back one shared no-op object. A telemetry call that raises (a span processor, a
sampler, an instrument of the application's pipeline) never fails the operation it
observes: :func:`warn_once` logs it and the operation goes on.

It may import :mod:`ares_events.errors` and nothing else from the package;
``opentelemetry`` is imported on first use.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace, TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

__all__ = [
    "CAPTURE_CONTENT_ENV",
    "DB_DURATION_BUCKETS",
    "EVENTS_TABLE",
    "GENAI_DURATION_BUCKETS",
    "METRIC_ATTRIBUTES",
    "Operation",
    "Telemetry",
    "configure",
    "current",
    "error_type",
    "link_to",
    "operation",
    "store_attributes",
    "trace_context",
]

EVENTS_TABLE: Final = "ares_events"
"""``db.collection.name`` of event operations (the events table of the SQL backends)."""

DB_DURATION_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)
"""The database conventions' advised buckets of ``db.client.operation.duration``."""

GENAI_DURATION_BUCKETS: Final = tuple(0.01 * 2**i for i in range(14))  # 0.01 .. 81.92
"""The GenAI conventions' advised buckets of ``gen_ai.client.operation.duration``."""

CAPTURE_CONTENT_ENV: Final = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' opt-in for message content on spans (``true`` to capture)."""

METRIC_ATTRIBUTES: Final = frozenset(
    {
        "db.system.name",
        "db.operation.name",
        "db.collection.name",
        "db.namespace",
        "server.address",
        "server.port",
        "error.type",
        "gen_ai.operation.name",
        "gen_ai.request.model",
        "gen_ai.token.type",
        "ares_events.operation.name",
        "ares_events.finding.kind",
        "ares_events.projection.name",
        "ares_events.journal.from_log",
        "ares_events.death.cause",
    }
)
"""Every attribute key a metric of ares-events may carry; each has a bounded set of
values (a test checks it)."""

logger = logging.getLogger(__name__)

_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_once(kind: str, exc: Exception) -> None:
    """Log that a telemetry call of ``kind`` (``span start``, ``metric``, ...) raised
    ``exc``, which the caller then drops: a WARNING the first time for each kind (since
    :func:`configure`), DEBUG after. Only the exception's class is logged: its message or
    traceback may quote span attributes or captured content."""
    # The OpenTelemetry error-handling principle: instrumentation never breaks the
    # application. A broken pipeline usually fails on every call, hence once per kind.
    with _warned_lock:
        first = kind not in _warned
        _warned.add(kind)
    level = logging.WARNING if first else logging.DEBUG
    logger.log(
        level,
        "OpenTelemetry %s failed (%s); the operation goes on without it%s",
        kind,
        error_type(exc),
        " (further failures of this kind are logged at DEBUG)" if first else "",
    )


class guarded:
    """``with guarded(kind): ...``: telemetry calls that must never fail the operation
    they observe. An ``Exception`` they raise is logged (:func:`warn_once`) and dropped;
    an interrupt goes through. Stateless: one may serve every thread."""

    __slots__ = ("kind",)

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if isinstance(exc, Exception):
            warn_once(self.kind, exc)
            return True
        return False


class _Instrument:
    """A metric instrument whose calls never raise (see :func:`warn_once`)."""

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def add(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        """Add to a counter."""
        with guarded("metric"):
            self._inner.add(amount, attributes)

    def record(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        """Record a histogram point."""
        with guarded("metric"):
            self._inner.record(amount, attributes)

    def set(self, amount: float, attributes: Mapping[str, Any] | None = None) -> None:
        """Set a gauge."""
        with guarded("metric"):
            self._inner.set(amount, attributes)


_SYSTEMS: Final = {
    "sqlite": "sqlite",
    "postgresql": "postgresql",
    "postgres": "postgresql",
    "citus": "postgresql",
    "memory": "ares_events.memory",
}
_BOUNDED: Final = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")


_COUNTERS: Final = {  # attribute: (name, unit, description)
    "appended": ("ares_events.events.appended", "{event}", "Events appended."),
    "replayed": ("ares_events.events.replayed", "{event}", "Events folded by replay and recovery."),
    "capped": ("ares_events.replay.capped", "{replay}", "Replays that stopped at max_replay."),
    "findings": (
        "ares_events.verification.findings",
        "{finding}",
        "Integrity findings of verification, audits, replays and recoveries.",
    ),
    "journal_calls": (
        "ares_events.journal.calls",
        "{call}",
        "Model and tool calls of journaled runs (from_log: answered from the log).",
    ),
    "journal_retries": (
        "ares_events.journal.retries",
        "{attempt}",
        "Attempts of a journaled call after its first one.",
    ),
    "deaths": ("ares_events.agent.deaths", "{death}", "Agent deaths recorded."),
    "resurrections": (
        "ares_events.agent.resurrections",
        "{resurrection}",
        "Agent resurrections recorded.",
    ),
    "flapping": ("ares_events.agent.flapping", "{death}", "Deaths of agents that were flapping."),
    "gave_up": ("ares_events.agent.gave_up", "{agent}", "Agents left dead at the restart cap."),
}


def _instruments(meter: Any) -> SimpleNamespace:
    # All created at once: a meter caches them anyway.
    made = dict(
        {
            attr: meter.create_counter(name, unit=unit, description=description)
            for attr, (name, unit, description) in _COUNTERS.items()
        },
        db_duration=meter.create_histogram(
            "db.client.operation.duration",
            unit="s",
            description="Duration of ares-events store operations.",
            explicit_bucket_boundaries_advisory=list(DB_DURATION_BUCKETS),
        ),
        op_duration=meter.create_histogram(
            "ares_events.operation.duration",
            unit="s",
            description="Duration of replays, recoveries, snapshots, verifications, audits.",
            explicit_bucket_boundaries_advisory=list(DB_DURATION_BUCKETS),
        ),
        projection_lag=meter.create_gauge(
            "ares_events.projection.lag",
            unit="{event}",
            description="Events in the log that a projection has not applied yet.",
        ),
        genai_duration=meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="Duration of model calls made by journaled runs (not replayed).",
            explicit_bucket_boundaries_advisory=list(GENAI_DURATION_BUCKETS),
        ),
        genai_tokens=meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Tokens a model call used, as its reply reported them.",
        ),
        backoff=meter.create_histogram(
            "ares_events.supervisor.backoff",
            unit="s",
            description="Delays a supervisor waits before resurrecting an agent.",
        ),
    )
    return SimpleNamespace(**{attr: _Instrument(inst) for attr, inst in made.items()})


class Telemetry:
    """The tracer and instruments in use (see :func:`current`).

    Attributes:
        tracer: the tracer, or None when only metrics are configured.
        metrics: the instruments, or None when only traces are configured.
        capture_content: record messages, tool arguments and results on journal spans
            (the GenAI conventions' opt-in; off by default).
    """

    __slots__ = ("capture_content", "metrics", "otel", "tracer")

    def __init__(self, otel: Any, tracer: Any, meter: Any, capture_content: bool) -> None:
        self.otel = otel
        self.tracer = tracer
        self.metrics: SimpleNamespace | None = None
        if meter is not None:
            with guarded("setup"):  # no metrics then; spans may still work
                self.metrics = _instruments(meter)
        self.capture_content = capture_content

    def start_span(
        self,
        name: str,
        attributes: Mapping[str, Any],
        *,
        kind: str = "INTERNAL",
        parent: Any = None,
    ) -> Any:
        """A started span (not made current), or None without a tracer or when starting
        it raised (a sampler's or span processor's failure: :func:`warn_once`)."""
        if self.tracer is None:
            return None
        with guarded("span start"):
            kind_ = getattr(self.otel.trace.SpanKind, kind)
            return self.tracer.start_span(
                name, context=parent, kind=kind_, attributes=dict(attributes)
            )
        return None

    def end_span(self, span: Any, exc: BaseException | None = None) -> None:
        """End ``span``, marking it failed by ``exc``'s type: ``error.type``, an ERROR
        status and an ``exception`` event with the type only (never its message, which
        may quote a payload). Never raises (:func:`warn_once`)."""
        if span is None:
            return
        if exc is not None:
            with guarded("span update"):  # still end it below
                et = error_type(exc)
                span.set_attribute("error.type", et)
                span.set_status(self.otel.trace.Status(self.otel.trace.StatusCode.ERROR, et))
                span.add_event("exception", {"exception.type": et})
        with guarded("span end"):
            # A processor's on_end runs inside end(): after an append has committed, so
            # its failure must not reach the caller as the append's.
            span.end()

    def add_event(self, name: str, attributes: Mapping[str, Any]) -> None:
        """An event on the current span (a no-op when it is not recording)."""
        if self.tracer is not None:
            with guarded("span update"):
                self.otel.trace.get_current_span().add_event(name, dict(attributes))

    def record_findings(self, findings: Iterable[Any], operation: str, system: str) -> None:
        """Count findings by kind (in ``ares_events.verification.findings``)."""
        m = self.metrics
        if m is None:
            return
        attrs = {"db.operation.name": operation, "db.system.name": system}
        with guarded("metric"):  # a finding's kind that does not read
            for f in findings:
                kind = bounded(getattr(f, "kind", ""))
                m.findings.add(1, {**attrs, "ares_events.finding.kind": kind})


def bounded(value: Any) -> str:
    """``value`` when it looks like a code-defined name (``hash_mismatch``), else
    ``other``: a metric attribute never takes an unbounded value."""
    return value if isinstance(value, str) and _BOUNDED.match(value) else "other"


def error_type(exc: BaseException) -> str:
    """The fully qualified class name of ``exc`` (``error.type``; bounded)."""
    cls = type(exc)
    mod = cls.__module__
    return cls.__qualname__ if mod == "builtins" else f"{mod}.{cls.__qualname__}"


# -- which providers ----------------------------------------------------------------------


class _Otel:
    """The imported API modules (one attribute access away)."""

    __slots__ = ("context", "metrics", "metrics_state", "propagator", "trace")

    def __init__(self) -> None:
        from opentelemetry import context, metrics, trace
        from opentelemetry.metrics import _internal as metrics_state
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.context = context
        self.metrics = metrics
        self.metrics_state = metrics_state
        self.trace = trace
        self.propagator = TraceContextTextMapPropagator()
        # Once, through the public calls: they load a provider named by the
        # OTEL_PYTHON_*_PROVIDER variables and make it the global one.
        trace.get_tracer_provider()
        metrics.get_meter_provider()

    def unset(self) -> bool:
        """True while neither global provider is set (the no-SDK case: two attribute
        reads, where the public getters would read the environment on every call)."""
        return (
            getattr(self.trace, "_TRACER_PROVIDER", 0) is None
            and getattr(self.metrics_state, "_METER_PROVIDER", 0) is None
        )


_otel: _Otel | None = None
_missing = False  # the extra is not installed: known after the first call
_broken = False  # the providers raised when asked for a tracer and a meter
_active: Telemetry | None = None
_explicit: tuple[Any, Any, bool | None, bool] | None = None
_env_capture: bool | None = None
_SCOPE: Final = "ares_events"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("ares-events")
    except Exception:  # an uninstalled checkout: the scope has no version then
        return ""


def _probe() -> Telemetry | None:
    global _otel, _missing, _active, _env_capture, _broken
    if _missing or _broken:
        return None
    if _otel is None:
        try:
            _otel = _Otel()
        except ImportError:
            _missing = True
            return None
        except Exception as exc:  # a provider named by OTEL_PYTHON_*_PROVIDER that fails
            warn_once("setup", exc)
            _broken = True
            return None
    otel = _otel
    if _explicit is not None:
        tp, mp, capture, enabled = _explicit
        if not enabled:
            return None
    elif otel.unset():
        return None  # probed again next time: an SDK may be configured later
    else:
        tp, mp, capture = otel.trace.get_tracer_provider(), otel.metrics.get_meter_provider(), None
    # The API's proxy and no-op providers mean no SDK is configured.
    t, m = otel.trace, otel.metrics_state
    tracing = tp is not None and not isinstance(tp, t.ProxyTracerProvider | t.NoOpTracerProvider)
    no_meter = m._ProxyMeterProvider | otel.metrics.NoOpMeterProvider
    metering = mp is not None and not isinstance(mp, no_meter)
    if not (tracing or metering):
        return None  # probed again next time: an SDK may be configured later
    version = _version()
    tracer = meter = None
    with guarded("setup"):
        tracer = tp.get_tracer(_SCOPE, version) if tracing else None
    with guarded("setup"):
        meter = mp.get_meter(_SCOPE, version) if metering else None
    if tracer is None and meter is None:
        # Not asked again until configure(): probing on every operation would cost
        # each of them a failing call.
        _broken = True
        return None
    if capture is None:
        # OpenTelemetry's own opt-in variable, read once, the way every OpenTelemetry
        # instrumentation reads it (the one environment read below the CLI and Settings).
        if _env_capture is None:
            _env_capture = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
        capture = _env_capture
    # Global providers are set once per process, so the result is kept.
    _active = Telemetry(otel, tracer, meter, capture)
    return _active


def current() -> Telemetry | None:
    """The telemetry in use, or None when nothing would be recorded (no SDK configured,
    the extra not installed, or :func:`configure` turned it off)."""
    t = _active
    if t is not None:
        return t
    o = _otel
    if o is not None and _explicit is None and o.unset():
        return None  # the common case without an SDK: kept to a few attribute reads
    return _probe()


def configure(
    *,
    tracer_provider: Any = None,
    meter_provider: Any = None,
    capture_content: bool | None = None,
    enabled: bool = True,
) -> None:
    """Choose the providers ares-events uses (default: OpenTelemetry's global ones).

    Args:
        tracer_provider: a tracer provider; None with ``meter_provider`` given: no spans.
        meter_provider: a meter provider; None with ``tracer_provider`` given: no metrics.
        capture_content: record model messages, tool arguments and results on journal
            spans (default: the ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
            opt-in of the GenAI conventions).
        enabled: False: record nothing at all.

    With no argument, goes back to the global providers.

    Raises:
        MissingDependencyError: a provider is given and the ``otel`` extra is missing.
    """
    global _active, _explicit, _missing, _env_capture, _broken
    _active = None
    _missing = False
    _broken = False
    with _warned_lock:
        _warned.clear()  # a new pipeline's failures are worth a warning again
    if tracer_provider is None and meter_provider is None and enabled:
        _explicit = None
        if capture_content is not None:
            _env_capture = capture_content
        return
    _explicit = (tracer_provider, meter_provider, capture_content, enabled)
    if enabled and current() is None and _missing:
        from ares_events.errors import MissingDependencyError

        raise MissingDependencyError("OpenTelemetry", "otel")


# -- store operations ---------------------------------------------------------------------


_ATTRS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}


def store_attributes(url: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(span attributes, metric attributes)`` of a store from its *redacted* URL:
    ``db.system.name``, ``db.collection.name``, and for a server ``server.address``,
    ``server.port`` and ``db.namespace`` (the database). Never the password (the URL is
    redacted, and only its host, port and path are read), never a SQLite file path."""
    cached = _ATTRS.get(url)
    if cached is not None:
        return cached
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0].lower()
    attrs: dict[str, Any] = {
        "db.system.name": _SYSTEMS.get(scheme, bounded(scheme)),
        "db.collection.name": EVENTS_TABLE,
    }
    if scheme in ("postgresql", "postgres", "citus"):
        try:
            host, port = parts.hostname, parts.port
        except ValueError:
            host, port = None, None
        if host:
            attrs["server.address"] = host
        if port:
            attrs["server.port"] = port
        db = parts.path.lstrip("/")
        if db and "/" not in db:
            attrs["db.namespace"] = db
    if len(_ATTRS) < 256:  # stores opened by a process are few; never grow without bound
        _ATTRS[url] = (attrs, attrs)
    return attrs, attrs


class Operation:
    """One store operation: a CLIENT span made current while it runs, and its duration
    in ``db.client.operation.duration``. Use :func:`operation`, as a context manager."""

    __slots__ = (
        "_activity",
        "_base",
        "_extra",
        "_metric",
        "_name",
        "_span",
        "_t0",
        "_tel",
        "_token",
    )

    def __init__(
        self,
        tel: Telemetry,
        name: str,
        base: Mapping[str, Any],
        metric: Mapping[str, Any],
        activity: bool = False,
    ) -> None:
        self._tel = tel
        self._name = name
        self._base = base
        self._metric = metric
        self._activity = activity
        self._extra: dict[str, Any] = {}
        self._span: Any = None
        self._token: Any = None
        self._t0 = 0.0

    @property
    def system(self) -> str:
        """``db.system.name`` of the store."""
        return str(self._base["db.system.name"])

    @property
    def telemetry(self) -> Telemetry:
        """The telemetry this operation records to."""
        return self._tel

    def set(self, key: str, value: Any) -> None:
        """Set a span attribute (an identifier, count or flag: never a payload); they
        are set together when the operation ends."""
        self._extra[key] = value

    def __enter__(self) -> Operation:
        return self.start()

    def start(self, *, current: bool = True) -> Operation:
        """Start the span and the clock; the span is made current unless ``current`` is
        False (a lazy read's span outlives the call that starts it)."""
        tel = self._tel
        if tel.tracer is not None:
            if self._activity:
                self._span = tel.start_span(f"ares_events.{self._name}", self._base)
            else:
                span_name = f"{self._name} {self._base['db.collection.name']}"
                self._span = tel.start_span(span_name, self._base, kind="CLIENT")
            if current and self._span is not None:
                otel = tel.otel
                with guarded("context"):
                    self._token = otel.context.attach(otel.trace.set_span_in_context(self._span))
        self._t0 = time.perf_counter()
        return self

    def __exit__(
        self, et: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        elapsed = time.perf_counter() - self._t0
        tel = self._tel
        failed = None if exc is None or isinstance(exc, GeneratorExit) else exc
        span = self._span
        if span is not None:
            # Each step on its own: whatever raises, the span still ends and the
            # operation's own result or exception goes to the caller unchanged.
            if self._token is not None:
                with guarded("context"):
                    tel.otel.context.detach(self._token)
            if self._extra:
                with guarded("span update"):
                    span.set_attributes(self._extra)
            tel.end_span(span, failed)
        if tel.metrics is not None:
            attrs = dict(self._metric)
            if failed is not None:
                attrs["error.type"] = error_type(failed)
            hist = tel.metrics.op_duration if self._activity else tel.metrics.db_duration
            hist.record(elapsed, attrs)


class _NoOperation:
    """What :func:`operation` returns when nothing is recorded."""

    __slots__ = ()
    system = ""

    def set(self, key: str, value: Any) -> None:
        """Nothing to set."""

    def __enter__(self) -> _NoOperation:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


NO_OPERATION: Final = _NoOperation()


def operation(
    url: str, name: str, attributes: Mapping[str, Any] | None = None, *, activity: bool = False
) -> Operation | _NoOperation:
    """A context manager that traces and times the store operation ``name`` of the store
    at ``url`` (redacted); ``attributes`` go on the span only, never in a metric. A no-op
    when nothing is recorded. An *activity* (replay, recover, verify, audit) is an
    INTERNAL span ``ares_events.{name}``, anything else a CLIENT span (docs/observability.md)."""
    tel = current()
    if tel is None:
        return NO_OPERATION
    span_attrs, metric_attrs = store_attributes(url)
    key = "ares_events.operation.name" if activity else "db.operation.name"
    base = {**span_attrs, key: name, **(attributes or {})}
    if activity:
        metric = {"db.system.name": metric_attrs["db.system.name"], key: name}
    else:
        metric = {**metric_attrs, key: name}
    return Operation(tel, name, base, metric, activity)


# -- trace context carried in the log -----------------------------------------------------


def trace_context() -> dict[str, str] | None:
    """The current span's W3C ``traceparent`` (``{"traceparent": ...}``) to store with a
    run, or None when no span is recording."""
    tel = current()
    if tel is None or tel.tracer is None:
        return None
    carrier: dict[str, str] = {}
    with guarded("trace context"):
        if not tel.otel.trace.get_current_span().get_span_context().is_valid:
            return None
        tel.otel.propagator.inject(carrier)
    tp = carrier.get("traceparent")
    return {"traceparent": tp} if tp else None


def link_to(carrier: Any, attributes: Mapping[str, Any] | None = None) -> Any:
    """A span link to the context stored in ``carrier`` (from :func:`trace_context`), or
    None when there is none or it does not parse."""
    tel = current()
    if tel is None or not isinstance(carrier, Mapping):
        return None
    tp = carrier.get("traceparent")
    if not isinstance(tp, str):
        return None
    with guarded("trace context"):
        ctx = tel.otel.propagator.extract({"traceparent": tp})
        sc = tel.otel.trace.get_current_span(ctx).get_span_context()
        return tel.otel.trace.Link(sc, dict(attributes or {})) if sc.is_valid else None
    return None


def timed() -> Callable[[], float]:
    """A stopwatch: call the result for the seconds since."""
    t0 = time.perf_counter()
    return lambda: time.perf_counter() - t0


def _reset_for_tests() -> None:
    """Forget the providers and the environment opt-in (tests only)."""
    global _env_capture
    configure()
    _env_capture = None
