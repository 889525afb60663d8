"""The agent runtime: the write-ahead run journal, process supervision and the demo.

What lives here: :mod:`~ares_events.agents.journal` (``Journal``: model and tool calls
recorded before they run, replayed after a crash; the public face of ``journal_core``,
``journal_async``, ``journal_errors``, ``journal_decorators`` and ``recording``),
:mod:`~ares_events.agents.runs` (looking at runs without writing, and the operator's
resolve / resume / cancel), :mod:`~ares_events.agents.supervision`
(``ProcessSupervisor``, heartbeats, death and resurrection events),
:mod:`~ares_events.agents.resurrection` (the kill -9 demo's agents and supervisor) and
:mod:`~ares_events.agents.demo` (the simple demo).

It may import the core, the stores, integrity and projections (everything below it). The
core never imports the runtime; the CLI and integrations sit above it.
"""
