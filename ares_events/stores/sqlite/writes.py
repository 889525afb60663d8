"""The SQLite append and read in one native call each (issue 33): :func:`new_writer`
gives a connection its ``_native.SQLiteWriter``, which runs ``SQLiteRecorder._append_rows``'
statements on the connection's own sqlite3 handle, its rows in multi-row INSERTs of up to
64 rows (docs/architecture.md, "Following a call down to its SQL"), and :func:`rows` a read's
statement. ``_append_rows`` and ``fetchall`` stay the reference and the path of anything
unusual.

It may import the core, :mod:`ares_events.chain` and this package.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
from typing import Any, Final

from ares_events.chain import _native, genesis
from ares_events.core.events import ANY, NO_STREAM, STREAM_EXISTS, PreparedEvent
from ares_events.stores.sqlite.sql import (
    SELECT_HEAD_AND_POSITION,
    UPSERT_HEAD,
    insert_events_values,
)

__all__ = ["EXPECT_CODE", "NATIVE_WRITES", "new_writer", "rows"]

_insert_sql = functools.cache(insert_events_values)  # the INSERT of k rows, once a size


def _native_writes() -> bool:
    """Whether the writer can run here: the C extension is built and on, this is CPython,
    the SQLite functions were found in the very library Python's ``_sqlite3`` runs on, and
    a ``sqlite3.Connection`` of this interpreter was seen to start with the handle SQLite
    opened for it (the writer reads it there; the struct is private to CPython, so a
    release that moves it leaves appends on the Python path instead of misreading it)."""
    path = getattr(sys.modules.get("_sqlite3"), "__file__", None)
    # getattr: a module built before it had the writer has neither function
    setup = getattr(_native, "sqlite_setup", None)
    check = getattr(_native, "sqlite_handle_check", None)
    if setup is None or check is None or sys.implementation.name != "cpython" or not path:
        return False
    major, minor, patch = sqlite3.sqlite_version_info
    if not setup(path, major * 1_000_000 + minor * 1000 + patch):
        return False
    # The class, not sqlite3.connect, which instrumentation may have wrapped by now.
    return bool(check(sqlite3.Connection, sqlite3.Connection))


NATIVE_WRITES: bool = _native_writes()
"""Read at each connection's first append: tests switch it off to run the Python path."""

EXPECT_CODE: Final = {ANY: -1, NO_STREAM: -2, STREAM_EXISTS: -3}
"""The writer's code for a symbolic expected version (an int is itself)."""


def new_writer(conn: sqlite3.Connection) -> Any:
    """A writer for ``conn`` (its statements prepared; ``close()`` it before ``conn``), or
    None when one does not prepare (a damaged schema: the Python path's own statements say
    what is wrong, and a read that needs no missing table still works).

    Raises:
        TypeError: ``conn`` is not the checked ``sqlite3.Connection`` class.
    """
    try:
        return _native.SQLiteWriter(
            conn,
            "BEGIN IMMEDIATE",
            SELECT_HEAD_AND_POSITION,
            UPSERT_HEAD,
            "COMMIT",
            "ROLLBACK",
            _insert_sql,
            genesis,
            PreparedEvent,
            sqlite3.OperationalError,
            sqlite3.DatabaseError,
        )
    except sqlite3.Error:
        return None


def rows(writer: Any, conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[Any]:
    """``conn.execute(sql, args).fetchall()``, by the connection's writer when there is one
    and it takes the read (a read in a process that ever started a thread costs Python's
    sqlite3 an atomic operation on every column, which the writer's does not pay)."""
    found = None if writer is None else writer.rows(sql, args)
    return conn.execute(sql, args).fetchall() if found is None else found
