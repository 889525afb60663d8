"""SQLite backend: the embedded default (``sqlite:///rel.db``, ``sqlite:////abs.db``,
``sqlite://`` in memory); its asyncio face runs on worker threads.

It may import the core, :mod:`ares_events.errors`, :mod:`ares_events.stores._migrations`
and :mod:`ares_events.stores.sql_read_models`.
"""

from __future__ import annotations

from ares_events.stores.sqlite.recorder import SQLiteRecorder
from ares_events.stores.sqlite.schema import SCHEMA_VERSION
from ares_events.stores.sqlite.snapshots import SQLiteSnapshotRows

__all__ = ["SCHEMA_VERSION", "SQLiteRecorder", "SQLiteSnapshotRows"]
