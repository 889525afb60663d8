"""Read models in the SQLite backend: :class:`SQLiteReadModels`, a mixin of
:class:`~ares_events.stores.sqlite.SQLiteRecorder`.

It may import the core and :mod:`ares_events.stores.sql_read_models`.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ares_events.stores.sql_read_models import SQLITE, SQLReadModels

__all__ = ["SQLiteReadModels"]


class SQLiteReadModels:
    """``read_models`` and the read transaction it reads in (a mixin: the recorder
    provides the rest)."""

    transaction: Callable[[], contextlib.AbstractContextManager[sqlite3.Connection]]
    _gate: Any
    _conn: Callable[[], sqlite3.Connection]
    _serial: contextlib.AbstractContextManager[Any]
    _retry: Callable[[Any], Any]
    _conns_lock: threading.Lock

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """A read transaction (deferred ``BEGIN``, always rolled back) on this thread's
        connection: one consistent view of the tables beside the events, also on a
        read-only store; raw sqlite3 errors propagate.

        Raises:
            StoreClosed: the store is closed, or was closed while the transaction ran.
        """
        with self._gate.op():
            conn = self._conn()
            with self._serial:
                self._retry(lambda: conn.execute("BEGIN"))
                try:
                    yield conn
                finally:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")

    def read_models(self) -> SQLReadModels:
        """The read-model and checkpoint tables in this file (one object per store, made
        on first use; a read-only store reads them and creates none)."""
        with self._conns_lock:
            found: SQLReadModels | None = getattr(self, "_read_models", None)
            if found is None:
                found = self._read_models = SQLReadModels(self.transaction, self.reading, SQLITE)
            return found
