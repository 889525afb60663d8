"""What a backend with :attr:`~ares_events.core.backend.Capability.READ_MODELS` hands out:
the catch-up runner's read-model tables and the Merkle log's signed checkpoints (blocking
objects on both faces; a table never written reads as empty).

It may import :mod:`ares_events.errors` only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from ares_events.errors import StoreError

__all__ = ["READ_MODEL_TABLE", "CheckpointStore", "Cursor", "ProjectionMeta", "ReadModels"]

Cursor = Literal["live", "building", "none"]
"""Which registry cursor a commit moves (``none``: a scratch table, no cursor)."""

READ_MODEL_TABLE: Final = re.compile(r"ares_rm_[a-z0-9_]+")
"""Every name :func:`~ares_events.projections.tables.table_name` makes (and made before it
added a hash): a registry row naming anything else is damaged. A backend puts these names
into SQL as they are, so this is also what keeps a tampered row from naming the events'
table (an erasure empties the tables its registry row names)."""


@dataclass(frozen=True, slots=True)
class ProjectionMeta:
    """Registry row of one projection: its version, the live table and its cursor, and a
    table being rebuilt with its own cursor."""

    name: str
    projection_version: int
    active_table: str | None
    position: int
    building_table: str | None
    building_position: int
    generation: int

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ProjectionMeta:
        """The registry row a backend read, checked field by field: what this library
        writes and nothing else, before any of it reaches SQL or arithmetic.

        Raises:
            StoreError: the row is damaged (a table that is no read-model table, a cursor
                or version that is no integer); no table it names was touched.
        """
        meta = cls(*row)
        checks = (
            ("name", isinstance(meta.name, str)),
            ("projection_version", type(meta.projection_version) is int),  # True is no int
            ("active_table", _is_table(meta.active_table)),
            ("position", _is_count(meta.position)),
            ("building_table", _is_table(meta.building_table)),
            ("building_position", _is_count(meta.building_position)),
            ("generation", _is_count(meta.generation)),
        )
        for name, ok in checks:
            if not ok:
                raise StoreError(
                    f"the registry row of read model {meta.name!r:.80} is damaged: {name} "
                    f"is {getattr(meta, name)!r:.80}, which this library never writes (tables "
                    "are named ares_rm_[a-z0-9_]+, cursors and versions are integers); no table "
                    "it names was touched: restore the row from a backup, or delete it and the "
                    "read model's ares_rm_ tables to rebuild it from the log"
                )
        return meta


def _is_table(value: object) -> bool:
    return value is None or (isinstance(value, str) and bool(READ_MODEL_TABLE.fullmatch(value)))


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


class CheckpointStore(Protocol):
    """Where a log keeps the checkpoints it signed (one row per ``(origin, size)``)."""

    def put(self, origin: str, size: int, root: bytes, note: str) -> None:
        """Keep a signed checkpoint (the first one of a size stays)."""

    def at_size(self, size: int) -> str | None:
        """The signed note of exactly ``size``, or None."""

    def origin(self) -> str | None:
        """The origin of the first checkpoint stored (the log's identity), or None."""

    def all(self) -> list[tuple[str, int, bytes, str, str]]:
        """Every ``(origin, size, root, note, created_at)`` by size."""

    def newest(self, limit: int) -> list[tuple[str, int, bytes, str, str]]:
        """The ``limit`` rows of the largest sizes, largest first."""


class ReadModels(Protocol):
    """Read-model tables: a registry row per projection, one table per generation.

    Rows and the cursor are written in one transaction, and every cursor move is a
    compare-and-set, so each event is applied exactly once even across crashes and races.
    """

    @property
    def checkpoints(self) -> CheckpointStore:
        """The signed checkpoints of the Merkle log, beside the read models."""

    def meta(self, name: str) -> ProjectionMeta | None:
        """The registry row, or None (also when nothing was ever registered).

        Raises:
            StoreError: the stored row is damaged (:meth:`ProjectionMeta.from_row`).
        """

    def put_meta(self, meta: ProjectionMeta) -> None:
        """Create the registry row unless one exists (its own transaction)."""

    def start_building(self, name: str, table: str, seen: ProjectionMeta) -> bool:
        """Point the registry's building slot at ``table`` (generation
        ``seen.generation + 1``, cursor 0) if the row still has ``seen``'s generation and
        building table: one compare-and-set, so of two rebuilds that read the same row
        only one claims the slot. Returns False (nothing written) when it changed."""

    def swap(self, name: str, table: str, position: int, projection_version: int) -> bool:
        """Make the building table live, if it is still ``table`` at ``position``."""

    def create(self, table: str) -> None:
        """Create an empty generation table."""

    def drop(self, table: str) -> None:
        """Drop a generation table."""

    def load(self, table: str, keys: list[str]) -> dict[str, Any]:
        """States of ``keys`` that exist."""

    def commit(
        self,
        table: str,
        rows: Mapping[str, tuple[bytes, int]],
        name: str,
        cursor: Cursor,
        expected: int,
        new: int,
    ) -> bool:
        """Upsert rows (canonical JSON, position) and move the ``cursor`` from
        ``expected`` to ``new``, in ONE transaction. Returns False (nothing written) when
        the registry no longer says ``table`` at ``expected``."""

    def scan(self, table: str) -> Iterator[tuple[str, Any]]:
        """Every (key, state), ordered by key, paged."""

    def read_live(self, name: str) -> tuple[ProjectionMeta, dict[str, Any]] | None:
        """The registry row and every (key, state) of its live table, read as one
        consistent view (one snapshot): a commit of a runner meanwhile is in both or in
        neither. None when the projection has no live table.

        Raises:
            StoreError: the registry row is damaged, or its live table is missing or
                damaged.
        """

    def names(self) -> list[str]:
        """Every projection in the registry."""

    def reset(self, name: str) -> bool:
        """Empty the projection's tables and rewind its cursors to 0, in one transaction
        (the next runner pass folds the log again). False when it is not registered."""
