"""Signed checkpoints the log issued, stored beside the Merkle tree in the events' database.

One row per ``(origin, tree_size)``: the root and the whole signed note (the first one
signed at that size is kept), kept by the backend beside its read models
(:class:`~ares_events.core.read_models.CheckpointStore`). ``prove`` uses the latest one
that covers an event; the audit re-checks every one against the events. The verifier
keys that signed them are remembered in the store's metadata (``log_keys``), so an audit
can verify the witness's checkpoints without being told the key (``--vkey`` is the
stronger, outside source).
"""

from __future__ import annotations

import json
import threading
from typing import Any, Final

from ares_events.core.backend import Capability
from ares_events.core.read_models import CheckpointStore
from ares_events.projections.tables import tables_for

__all__ = ["LOG_KEYS", "checkpoints_for", "remember_key"]

LOG_KEYS: Final = "log_keys"
"""``ares_meta`` key: JSON list of the verifier keys that signed this log's checkpoints."""
_KEYS_LOCK = threading.Lock()


def checkpoints_for(store: Any) -> CheckpointStore:
    """The checkpoint table of ``store``'s backend.

    Raises:
        ConfigError: the backend keeps no tables beside its events.
    """
    return tables_for(store).checkpoints


def remember_key(store: Any, vkey: str) -> None:
    """Add ``vkey`` to the store's ``log_keys`` (a store without metadata keeps none)."""
    if Capability.METADATA not in store.capabilities:
        return
    rec = store.recorder
    with _KEYS_LOCK:
        try:
            keys = json.loads(rec.meta_get(LOG_KEYS) or "[]")
        except ValueError:
            keys = []
        keys = [k for k in keys if isinstance(k, str)] if isinstance(keys, list) else []
        if vkey not in keys:
            rec.meta_set(LOG_KEYS, json.dumps([*keys, vkey]))
