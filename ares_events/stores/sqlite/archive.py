"""Archiving in the SQLite backend: :class:`SQLiteArchiving`, a mixin of
:class:`~ares_events.stores.sqlite.SQLiteRecorder`.

It may import the core, :mod:`ares_events.errors` and this package.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from typing import Final

from ares_events.core.backend import ArchivedRow, rows_differ
from ares_events.errors import StoreError, StoreUnavailable
from ares_events.stores.sqlite.sql import SELECT_META, UPSERT_META

__all__ = ["SQLiteArchiving"]

SELECT_ARCHIVED: Final = (
    "SELECT position, hash, payload_ref FROM ares_events "
    "WHERE position >= ? AND position <= ? ORDER BY position"
)
DELETE_ARCHIVED: Final = "DELETE FROM ares_events WHERE position = ?"


class SQLiteArchiving:
    """``meta_swap`` and ``delete_archived`` (a mixin: the recorder provides these)."""

    transaction: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    scrubbing: Callable[[], contextlib.AbstractContextManager[None]]
    describe: Callable[[], str]

    def meta_swap(self, key: str, expected: str | None, value: str) -> bool:
        """Store ``value`` under ``key`` if the stored value is ``expected`` (one
        ``BEGIN IMMEDIATE`` transaction, so two writers cannot both win).

        Raises:
            StoreClosed: the store is closed.
            StoreError: the write failed.
        """
        try:
            with self.transaction() as c:
                row = c.execute(SELECT_META, (key,)).fetchone()
                if (None if row is None else str(row[0])) != expected:
                    return False
                c.execute(UPSERT_META, (key, value))
                return True
        except sqlite3.Error as exc:
            raise StoreError(f"writing metadata of {self.describe()} failed: {exc}") from exc

    def delete_archived(
        self,
        first_position: int,
        last_position: int,
        expected: Sequence[ArchivedRow],
    ) -> int:
        """Delete the rows a segment holds, checked row by row, in one transaction
        (freed pages zeroed: the payloads are in the archive now, not in this file);
        rows of the range the segment does not hold stay.

        Raises:
            StoreError: the rows differ from the segment (nothing deleted).
            StoreClosed: the store is closed.
            StoreUnavailable: the database stayed locked or failed.
        """
        what = f"delete of archived positions {first_position}..{last_position}"
        try:
            with self.scrubbing(), self.transaction() as c:
                rows = c.execute(SELECT_ARCHIVED, (first_position, last_position)).fetchall()
                wanted = {e[0] for e in expected}
                if not any(r[0] in wanted for r in rows):
                    return 0  # deleted by an earlier run that stopped before its end
                problem = rows_differ(rows, expected)
                if problem is not None:
                    raise StoreError(f"{what} in {self.describe()} refused: {problem}")
                c.executemany(DELETE_ARCHIVED, ((e[0],) for e in expected))
                return len(expected)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{what} in {self.describe()} failed: {exc}") from exc
