"""The core: the event model, the backend contract and the store that sits on it.

What lives here: :mod:`~ares_events.core.events` (``NewEvent``, ``RecordedEvent``,
validation and encoding), :mod:`~ares_events.core.recorder` (the ``Recorder`` protocol a
backend implements, ``Batch``, ``Head``, ``Capability``, ``StoreURL``),
:mod:`~ares_events.core.store` (``EventStore``, ``emit``), :mod:`~ares_events.core.catalog`
(typed payload schemas) and :mod:`~ares_events.core.snapshots` (snapshot value types and
the backend-independent verification every snapshot store shares).

It may import only :mod:`ares_events.errors`, :mod:`ares_events.integrity.chain` and
itself. It never imports a backend (``stores``), verification, projections, the agent
runtime, the CLI or an integration: backends plug in from above through the ``Recorder``
protocol and the recorder's ``snapshot_store(event_store)`` hook.
"""
