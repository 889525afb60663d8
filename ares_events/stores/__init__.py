"""Stores chosen by URL: ``open_store()``, ``open_async_store()``, ``register_store()``,
``available_schemes()``; the backends, the Redis cache, blob stores and the scheme registry.

It may import the core, :mod:`ares_events.errors` and :mod:`ares_events.chain`; never
verification, projections, the agent runtime, the CLI or an integration.
"""

from __future__ import annotations

from ares_events.core.backend import Capability
from ares_events.core.recorder import Recorder
from ares_events.core.store import EventStore
from ares_events.core.store_async import AsyncEventStore
from ares_events.core.url import StoreURL
from ares_events.stores._registry import available_schemes, register_store, registered_stores
from ares_events.stores.opening import open_store
from ares_events.stores.opening_async import open_async_store

__all__ = [
    "AsyncEventStore",
    "Capability",
    "EventStore",
    "Recorder",
    "StoreURL",
    "available_schemes",
    "open_async_store",
    "open_store",
    "register_store",
    "registered_stores",
]
