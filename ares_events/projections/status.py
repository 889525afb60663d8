"""Read-only looks at what sits beside the events: the read-model registry and the signed
checkpoints, for reporting tools (the web console) that must create nothing, on any
backend: a table that does not exist is an empty list, a backend without such tables too.

It may import the core, the stores and this package's table modules.
"""

from __future__ import annotations

from typing import Any, Final

from ares_events.core.recorder import backend_of
from ares_events.core.store import EventStore
from ares_events.projections.checkpoint_store import TABLE as CHECKPOINTS_TABLE
from ares_events.projections.tables import PG_HAS_TABLE, SQLITE_HAS_TABLE, ProjectionMeta

__all__ = ["read_models", "stored_checkpoints"]

_REGISTRY: Final = "ares_projections"
_SELECT_REGISTRY: Final = (
    "SELECT name, projection_version, active_table, position, building_table, "
    "building_position, generation FROM {table} ORDER BY name LIMIT 1000"
)
_SELECT_CHECKPOINTS: Final = (
    "SELECT origin, tree_size, root, created_at FROM {table} "
    "ORDER BY tree_size DESC, origin LIMIT {limit}"
)


def _recorder(store: EventStore) -> Any:
    return backend_of(store.recorder)


def _select(store: EventStore, table: str, template: str) -> list[tuple[Any, ...]] | None:
    """Rows of ``template`` over ``table`` of a SQL backend, [] when it has no such table,
    None for a backend that is not SQL."""
    rec = _recorder(store)
    scheme = rec.scheme[0]
    if scheme == "sqlite":
        if not rec.fetch(SQLITE_HAS_TABLE, (table,))[0][0]:
            return []
        return [tuple(r) for r in rec.fetch(template.format(table=table))]
    if scheme in ("postgresql", "postgres"):
        qualified = '"{}".{}'.format(str(rec.schema).replace('"', '""'), table)
        with rec.connection() as conn:
            if not conn.execute(PG_HAS_TABLE, (qualified,)).fetchone()[0]:
                return []
            return [tuple(r) for r in conn.execute(template.format(table=qualified)).fetchall()]
    return None


def read_models(store: EventStore) -> list[ProjectionMeta]:
    """Every registered read model (position, generation, rebuild in progress), by name;
    [] when nothing was ever registered. Creates nothing.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    rows = _select(store, _REGISTRY, _SELECT_REGISTRY)
    if rows is None:
        data = getattr(_recorder(store), "_d", None)
        tables = getattr(data, "__dict__", {}).get("read_models")
        if tables is None:
            return []
        return [m for m in (tables.meta(n) for n in tables.names()) if m is not None]
    return [
        ProjectionMeta(str(r[0]), int(r[1]), r[2], int(r[3]), r[4], int(r[5]), int(r[6]))
        for r in rows
    ]


def stored_checkpoints(store: EventStore, *, limit: int = 20) -> list[tuple[str, int, bytes, str]]:
    """The newest signed checkpoints of the verifiable log, ``(origin, tree_size, root,
    created_at)`` by size, largest first; [] when none was ever signed. Creates nothing.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    template = _SELECT_CHECKPOINTS.replace("{limit}", str(int(limit)))
    rows = _select(store, CHECKPOINTS_TABLE, template)
    if rows is None:
        data = getattr(_recorder(store), "_d", None)
        found = getattr(data, "__dict__", {}).get("checkpoints")
        if found is None:
            return []
        rows = [(o, n, r, at) for o, n, r, _t, at in found.all()][::-1][:limit]
    return [(str(o), int(n), bytes(r), str(at)) for o, n, r, at in rows]
