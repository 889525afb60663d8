"""The agent runtime: the write-ahead run journal, process supervision and the demo.

What lives here: :mod:`~ares_events.agents.journal_async` (``AsyncJournal``: model and
tool calls recorded before they run, replayed after a crash; ``journal`` with
``Journal`` is generated from it, and is the import path of both), its leaf modules
``journal_rules`` (gates, stats), ``journal_errors``, ``journal_decorators`` and
``recording``; :mod:`~ares_events.agents.runs_async` (looking at runs without writing,
and the operator's resolve / resume / cancel; ``runs`` generated) over ``run_info`` (what
a run is); :mod:`~ares_events.agents.supervision`
(``ProcessSupervisor``, heartbeats, death and resurrection events),
:mod:`~ares_events.agents.resurrection` (the kill -9 demo's agents and supervisor) and
:mod:`~ares_events.agents.demo` (the simple demo). ``journal_telemetry`` and
``supervision_telemetry`` are their OpenTelemetry spans and metrics (docs/observability.md).

It may import the core, the stores, integrity and projections (everything below it). The
core never imports the runtime; the CLI and integrations sit above it.
"""
