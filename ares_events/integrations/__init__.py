"""Adapters that plug ares-events into other libraries.

What lives here: :mod:`~ares_events.integrations.eventsourcing`, the persistence module
of the ``eventsourcing`` library (its import path is what ``PERSISTENCE_MODULE`` names),
with its store side (opening, stream prefixes, verified reads) in
``_eventsourcing_store``.

An integration is top layer: it may import anything in the package, and its own third
party library; nothing in the package imports an integration.
"""
