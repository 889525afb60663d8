"""An append's statements, both ways: :func:`insert_values` runs the multi-row INSERT for
``SQLiteRecorder._append_rows`` (the reference, and the path of anything unusual), and
:func:`new_writer` gives a connection its ``_native.SQLiteWriter``, which runs the whole
append in one native call on the connection's own sqlite3 handle (issue 33;
docs/architecture.md, "Following a call down to its SQL").

It may import the core, :mod:`ares_events.chain` and this package.
"""

from __future__ import annotations

import functools
import sqlite3
import sys
from typing import Any, Final

from ares_events.chain import _native, genesis
from ares_events.core.events import ANY, NO_STREAM, STREAM_EXISTS, ExpectedVersion, PreparedEvent
from ares_events.stores.sqlite.sql import (
    SELECT_HEAD_AND_POSITION,
    UPSERT_HEAD,
    insert_events_values,
)

__all__ = ["NATIVE_WRITES", "expected_code", "insert_sql", "insert_values", "new_writer"]

insert_sql = functools.cache(insert_events_values)
"""The INSERT of ``k`` rows (built once per size; both paths use it)."""

# Rows per multi-row INSERT: a batch of up to 64 rows is one statement of exactly its
# size (built once per size, then in sqlite3's statement cache); a larger one is cut into
# 64-row statements and its rest. 64 rows bind 642 values, under SQLite's oldest default
# limit (999).
_MAX_ROWS: Final = 64


def insert_values(
    c: sqlite3.Connection, stream_id: str, shared: list[Any], values: list[Any]
) -> None:
    """The rows of one stream (``Batch.insert_params``' ``shared`` and ``values``) in
    statements of up to :data:`_MAX_ROWS` rows."""
    uniform = len(shared) > 1  # type, module and metadata bound once (Batch.insert_params)
    width = 4 if uniform else 10
    n = len(values) // width
    for start in range(0, n, _MAX_ROWS):
        k = min(_MAX_ROWS, n - start)
        bound = [stream_id, *shared]
        if uniform:  # this statement's first position and version
            bound[5] += start
            bound[6] += start
        rows = values[width * start : width * (start + k)]
        c.execute(insert_sql(k, uniform), bound + rows)


def _native_writes() -> bool:
    """Whether the writer can run here: the C extension is built and on, this is CPython
    (the writer reads the handle at the start of its ``sqlite3.Connection``), and the
    SQLite functions were found in the very library Python's ``_sqlite3`` runs on."""
    path = getattr(sys.modules.get("_sqlite3"), "__file__", None)
    if _native is None or sys.implementation.name != "cpython" or not path:
        return False
    major, minor, patch = sqlite3.sqlite_version_info
    return bool(_native.sqlite_setup(path, major * 1_000_000 + minor * 1000 + patch))


NATIVE_WRITES: bool = _native_writes()
"""Read at each connection's first append: tests switch it off to run the Python path."""

_EXPECT_CODE: Final = {ANY: -1, NO_STREAM: -2, STREAM_EXISTS: -3}


def expected_code(expected: ExpectedVersion) -> int:
    """The writer's code for an expected version: the version itself, or -1 (any), -2 (no
    stream), -3 (the stream exists)."""
    return expected if isinstance(expected, int) else _EXPECT_CODE[expected]


def new_writer(conn: sqlite3.Connection) -> Any:
    """A writer for ``conn`` (its statements prepared; ``close()`` it before ``conn``).

    Raises:
        sqlite3.Error: a statement does not prepare.
    """
    return _native.SQLiteWriter(
        conn,
        "BEGIN IMMEDIATE",
        SELECT_HEAD_AND_POSITION,
        UPSERT_HEAD,
        "COMMIT",
        "ROLLBACK",
        insert_sql,
        genesis,
        PreparedEvent,
        sqlite3.OperationalError,
        sqlite3.DatabaseError,
    )
