"""What a backend with :attr:`~ares_events.core.backend.Capability.READ_MODELS` hands out:
the catch-up runner's read-model tables and the Merkle log's signed checkpoints (blocking
objects on both faces; a table never written reads as empty).

It may import :mod:`ares_events.errors` only.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

__all__ = ["CheckpointStore", "Cursor", "ProjectionMeta", "ReadModels"]

Cursor = Literal["live", "building", "none"]
"""Which registry cursor a commit moves (``none``: a scratch table, no cursor)."""


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
        """The registry row, or None (also when nothing was ever registered)."""

    def put_meta(self, meta: ProjectionMeta) -> None:
        """Create the registry row unless one exists (its own transaction)."""

    def start_building(self, name: str, table: str, generation: int) -> None:
        """Point the registry's building slot at a fresh table, cursor 0."""

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

    def names(self) -> list[str]:
        """Every projection in the registry."""

    def reset(self, name: str) -> bool:
        """Empty the projection's tables and rewind its cursors to 0, in one transaction
        (the next runner pass folds the log again). False when it is not registered."""
