"""The read models of a store, as the catch-up runner uses them, and a look at them that
creates nothing (:func:`read_models`, :func:`stored_checkpoints`).
"""

from __future__ import annotations

import re
from typing import Any

import blake3

from ares_events.chain import canonical_json
from ares_events.core.backend import Capability
from ares_events.core.read_models import ProjectionMeta, ReadModels
from ares_events.errors import ConfigError

__all__ = ["encode_state", "read_models", "stored_checkpoints", "table_name", "tables_for"]

_SAFE = re.compile(r"[^a-z0-9_]")


def table_name(name: str, generation: int) -> str:
    """A safe SQL identifier for a projection's generation table, one per distinct name:
    a readable part (lowercase, ``[a-z0-9_]``) and 8 hex digits of blake3 of the exact
    name, so ``inj-x`` / ``inj_x`` or ``Agent`` / ``agent`` never share a table."""
    safe = _SAFE.sub("_", name.lower())[:32]
    tag = blake3.blake3(name.encode("utf-8")).hexdigest()[:8]
    return f"ares_rm_{safe}_{tag}_{generation}"


def encode_state(state: Any) -> bytes:
    """Canonical JSON of a projection state."""
    return canonical_json(state, field="projection state")


def tables_for(store: Any) -> ReadModels:
    """The read models of ``store``'s backend.

    Raises:
        ConfigError: the backend keeps no read models, or cannot for this store.
    """
    if Capability.READ_MODELS not in store.capabilities:
        raise ConfigError(f"store {store.url} has no read-model tables")
    return store.recorder.read_models()  # type: ignore[no-any-return]


def _tables(store: Any) -> ReadModels | None:
    try:
        return tables_for(store)
    except ConfigError:  # none here (cells on separate servers, a plugin without them)
        return None


def read_models(store: Any) -> list[ProjectionMeta]:
    """Every registered read model (position, generation, rebuild in progress), by name;
    [] when nothing was ever registered. Creates nothing.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    tables = _tables(store)
    if tables is None:
        return []
    return [m for m in map(tables.meta, tables.names()) if m is not None]


def stored_checkpoints(store: Any, *, limit: int = 20) -> list[tuple[str, int, bytes, str]]:
    """The newest signed checkpoints of the verifiable log, ``(origin, tree_size, root,
    created_at)`` by size, largest first; [] when none was ever signed. Creates nothing.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    tables = _tables(store)
    rows = [] if tables is None else tables.checkpoints.newest(limit)
    return [(o, n, r, at) for o, n, r, _note, at in rows]
