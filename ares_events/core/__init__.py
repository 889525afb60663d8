"""The core: the event model (:mod:`~ares_events.core.events`), the backend contract
(:mod:`~ares_events.core.backend`, :mod:`~ares_events.core.recorder_async`), the store
(:mod:`~ares_events.core.store_async`), snapshots, read models and telemetry. Each
``*_async`` module is written by hand; its blocking twin is generated from it.

It may import only :mod:`ares_events.errors`, :mod:`ares_events.chain` and itself. It
never imports a backend (``stores``), verification, projections, the agent runtime, the
CLI or an integration: backends plug in from above through the recorder protocol.
"""
