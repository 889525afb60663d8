"""Cell stores: many PostgreSQL stores (cells) behind one store, on Citus or plain servers
(``citus://``, ``pgcells://``; docs/scaling.md): layout, recorder, Citus administration
and clock.

It may import the core, :mod:`ares_events.errors` and the PostgreSQL backend.
"""

from __future__ import annotations

from ares_events.stores.cells.layout import CellMap, pack, partition_of, point, unpack
from ares_events.stores.cells.recorder import CellsRecorder, CellsSnapshotRows
from ares_events.stores.cells.recorder_async import AsyncCellsRecorder, AsyncCellsSnapshotRows

__all__ = [
    "AsyncCellsRecorder",
    "AsyncCellsSnapshotRows",
    "CellMap",
    "CellsRecorder",
    "CellsSnapshotRows",
    "pack",
    "partition_of",
    "point",
    "unpack",
]
