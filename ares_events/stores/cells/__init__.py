"""Cell stores: many PostgreSQL stores (cells) behind one store, distributed by Citus or
spread over plain servers (``citus://`` and ``pgcells://``; docs/scaling.md).

What lives here: :mod:`.layout` (partitions, the cell map, cursors and cell URLs, no I/O),
:mod:`.recorder_async` (``AsyncCellsRecorder``, written by hand) and :mod:`.recorder`
(``CellsRecorder``, generated from it), :mod:`.citus` (Citus administration: where a cell
lives, moving it), :mod:`.citus_clock` (the clock and the append path a Citus cell's
PostgreSQL recorder is given: positions from the coordinator, rows committed in one phase).

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
