"""SQLite backend: the embedded default (``sqlite:///rel.db``, ``sqlite:////abs.db``,
``sqlite://`` for an in-memory database).

What lives here: :mod:`.recorder` (``SQLiteRecorder``: durability, concurrency, reads,
close), :mod:`.sql` (every statement), :mod:`.erase` (erasure and scrubbing) and
:mod:`.snapshots` (the snapshot table's rows), :mod:`.read_models` (the read-model tables'
transactions). SQLite has no asyncio driver: the asyncio
face runs this recorder on worker threads (:mod:`ares_events.stores.threaded`).

It may import the core, :mod:`ares_events.errors`, :mod:`ares_events.stores._migrations`
and :mod:`ares_events.stores.sql_read_models`.
"""

from __future__ import annotations

from ares_events.stores.sqlite.recorder import SCHEMA_VERSION, SQLiteRecorder
from ares_events.stores.sqlite.snapshots import SQLiteSnapshotRows

__all__ = ["SCHEMA_VERSION", "SQLiteRecorder", "SQLiteSnapshotRows"]
