"""Citus administration of a cell store: where each cell lives, moving a cell, rebalancing
(blocking only).

It may import the core, :mod:`ares_events.errors` and this package.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from ares_events.errors import ConfigError, StoreError, StoreUnavailable

logger = logging.getLogger(__name__)

__all__ = ["CellPlacement", "cell_placements", "move_cell", "rebalance"]

PLACEMENT_SQL: Final = (
    "SELECT n.nodename, n.nodeport, pg_size_pretty(citus_relation_size(s.logicalrelid)) "
    "FROM pg_dist_shard s JOIN pg_dist_placement p USING (shardid) "
    "JOIN pg_dist_node n USING (groupid) WHERE s.logicalrelid = to_regclass(%s)"
)
MOVE_SQL: Final = (
    "SELECT citus_schema_move(%s::regnamespace, %s, %s, "
    "shard_transfer_mode => %s::citus.shard_transfer_mode)"
)
REBALANCE_SQL: Final = (
    "SELECT citus_rebalance_start(shard_transfer_mode => %s::citus.shard_transfer_mode)"
)
REBALANCE_WAIT_SQL: Final = "SELECT citus_rebalance_wait()"
MODES: Final = ("auto", "force_logical", "block_writes")


@dataclass(frozen=True, slots=True)
class CellPlacement:
    """Where one cell lives: its schema, the worker's host and port, the events' size."""

    cell: str
    host: str
    port: int
    size: str


def _cells(store: Any, mode: str = "auto") -> Any:
    from ares_events.core.recorder import backend_of

    rec = backend_of(store.recorder)
    if not getattr(rec, "citus", False):
        raise ConfigError(f"{store.url} is not a citus:// cell store")
    if mode not in MODES:
        raise ConfigError(f"shard transfer mode must be one of {', '.join(MODES)}, got {mode!r}")
    return rec


@contextlib.contextmanager
def _asking(store: Any, rec: Any, what: str) -> Iterator[None]:
    """A request Citus refuses (a cell already on that worker, an unknown node) is the
    caller's to change, exit 2, named by the store's own URL, not a cell's internal one;
    a lost server stays StoreUnavailable."""
    try:
        with rec.cells[0]._translate_errors(what):
            yield
    except StoreUnavailable:
        raise
    except StoreError as exc:
        why = str(exc.__cause__ or exc).strip().splitlines()[0]
        raise ConfigError(f"{what} of {store.url}: Citus refused: {why}") from exc


def cell_placements(store: Any) -> list[CellPlacement]:
    """Where each cell of a ``citus://`` store lives now.

    Raises:
        ConfigError: not a ``citus://`` store.
        StoreUnavailable: the coordinator cannot be reached.
    """
    rec = _cells(store)
    out = []
    with rec.cells[0].connection() as conn:
        for name in rec.cell_map.cells:
            row = conn.execute(PLACEMENT_SQL, (f'"{name}".ares_events',)).fetchone()
            if row is not None:
                out.append(CellPlacement(name, str(row[0]), int(row[1]), str(row[2])))
    return out


def move_cell(store: Any, cell: str, host: str, port: int, *, mode: str = "auto") -> None:
    """Move one cell (schema) of a ``citus://`` store to the worker ``host:port``, online;
    ``mode`` is Citus's shard transfer mode (:data:`MODES`, docs/scaling.md).

    Raises:
        ConfigError: not a ``citus://`` store, an unknown cell or mode, or Citus refused
            the move (the message says why).
        StoreUnavailable: the coordinator cannot be reached.
    """
    rec = _cells(store, mode)
    if cell not in rec.cell_map.cells:
        raise ConfigError(
            f"{store.url} has no cell {cell!r}; cells: {', '.join(rec.cell_map.cells)}"
        )
    logger.info("moving cell %s of %s to %s:%d (%s)", cell, store.url, host, port, mode)
    with rec.cells[0].connection() as conn, _asking(store, rec, f"moving cell {cell}"):
        conn.execute(MOVE_SQL, (cell, host, port, mode))


def rebalance(store: Any, *, mode: str = "auto") -> None:
    """Run Citus's rebalancer (it spreads the distributed schemas over the workers, a
    new one included) and wait for it to finish.

    Raises:
        ConfigError: not a ``citus://`` store, an unknown mode, or Citus refused.
        StoreUnavailable: the coordinator cannot be reached.
    """
    rec = _cells(store, mode)
    with rec.cells[0].connection() as conn, _asking(store, rec, "rebalancing"):
        conn.execute(REBALANCE_SQL, (mode,))
        conn.execute(REBALANCE_WAIT_SQL)
