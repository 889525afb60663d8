"""Read-only looks at what sits beside the events: the read-model registry and the signed
checkpoints, for reporting tools (the web console) that must create nothing, on any
backend: a table that does not exist is an empty list, a backend without such tables too.

It may import the core, the stores and this package's table modules.
"""

from __future__ import annotations

from ares_events.core.read_models import ProjectionMeta, ReadModels
from ares_events.core.store import EventStore
from ares_events.errors import ConfigError
from ares_events.projections.tables import tables_for

__all__ = ["read_models", "stored_checkpoints"]


def _tables(store: EventStore) -> ReadModels | None:
    try:
        return tables_for(store)
    except ConfigError:  # no read models here (cells on separate servers, say)
        return None


def read_models(store: EventStore) -> list[ProjectionMeta]:
    """Every registered read model (position, generation, rebuild in progress), by name;
    [] when nothing was ever registered. Creates nothing.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    tables = _tables(store)
    if tables is None:
        return []
    return [m for m in map(tables.meta, tables.names()) if m is not None]


def stored_checkpoints(store: EventStore, *, limit: int = 20) -> list[tuple[str, int, bytes, str]]:
    """The newest signed checkpoints of the verifiable log, ``(origin, tree_size, root,
    created_at)`` by size, largest first; [] when none was ever signed. Creates nothing.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    tables = _tables(store)
    rows = [] if tables is None else tables.checkpoints.newest(limit)
    return [(o, n, r, at) for o, n, r, _note, at in rows]
