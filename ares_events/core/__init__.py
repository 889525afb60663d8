"""The core: the event model, the backend contract and the store that sits on it.

What lives here, by what a reader looks for:

- events: :mod:`~ares_events.core.events` (``NewEvent``, ``RecordedEvent``, validation
  and canonical encoding), :mod:`~ares_events.core.catalog` (typed payload schemas);
- the backend contract: :mod:`~ares_events.core.backend` (``Batch``, ``Head``,
  ``Capability``: the values a recorder takes and returns), :mod:`~ares_events.core.recorder_async`
  (the recorder protocols, one per capability), :mod:`~ares_events.core.url` (``StoreURL``);
- the store: :mod:`~ares_events.core.store_async` (``AsyncEventStore``) with the rules both
  faces share in :mod:`~ares_events.core.rules`, the identity in
  :mod:`~ares_events.core.identity` and safe close in :mod:`~ares_events.core.lifecycle`;
- snapshots: :mod:`~ares_events.core.snapshot_format` (what a snapshot is) and
  :mod:`~ares_events.core.snapshots_async` (the store that checks them);
- read models: :mod:`~ares_events.core.read_models` (what a backend keeps for the
  projection runner and the Merkle log's checkpoints).
- telemetry: :mod:`~ares_events.core.telemetry` (OpenTelemetry providers, spans, metric
  instruments; ``ae.telemetry``) and :mod:`~ares_events.core.traced` (the decorators on
  the store, replay, verification and audits).

Each ``*_async`` module is written by hand; the module of the same name without
``_async`` is the blocking face, generated from it (``tools/async_to_sync.py``).

It may import only :mod:`ares_events.errors`, :mod:`ares_events.chain` and itself. It
never imports a backend (``stores``), verification, projections, the agent runtime, the
CLI or an integration: backends plug in from above through the recorder protocol.
"""
