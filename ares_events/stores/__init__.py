"""Stores chosen by URL: ``open_store()``, ``open_async_store()``, ``register_store()``,
``available_schemes()``.

What lives here: the backends, each implementing the core's recorder protocol
(:mod:`~ares_events.stores.memory`, :mod:`~ares_events.stores.sqlite`,
:mod:`~ares_events.stores.postgres`, each with its snapshot table's rows and read models,
whose SQL both SQL backends share: :mod:`~ares_events.stores.sql_read_models`), the Redis
cache wrapper (:mod:`~ares_events.stores.cache`), the worker-thread adapter that gives a
blocking backend its asyncio face (:mod:`~ares_events.stores.threaded`), blob stores
(:mod:`~ares_events.stores.blobs`), opening by URL (:mod:`~ares_events.stores.opening_async`,
``opening`` generated from it), the scheme registry (``_registry``), SQL migrations
(``_migrations``), and ``Settings`` (:mod:`~ares_events.stores.settings`). A plugin
implements the recorder protocols of :mod:`ares_events.core.recorder` over the values of
:mod:`ares_events.core.backend`.

It may import the core, :mod:`ares_events.errors` and :mod:`ares_events.chain`; never
verification, projections, the agent runtime, the CLI or an integration. The core never
imports a store: it reaches backends through the recorder protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ares_events.core.backend import Capability
from ares_events.core.recorder import Recorder
from ares_events.core.store import EventStore
from ares_events.core.store_async import AsyncEventStore
from ares_events.core.url import StoreURL
from ares_events.stores import _registry
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


def register_store(scheme: str, target: str | type[Any], *, replace: bool = False) -> None:
    """Register a backend class (or ``"module:Class"``) for a URL scheme.

    Raises:
        ConfigError: already registered and ``replace`` is False.
    """
    _registry.register(scheme, target, replace=replace)


def registered_stores() -> Mapping[str, str | type[Any]]:
    """Read-only view of scheme -> backend."""
    return _registry.view()


def available_schemes() -> list[str]:
    """Every registered scheme, sorted."""
    return sorted(_registry.view())
