"""Bring a SQLite file to this build's schema (:data:`SCHEMA_VERSION`) at open.

It may import the core, :mod:`ares_events.errors` and :mod:`ares_events.stores._migrations`.
"""

from __future__ import annotations

import logging
import sqlite3
from typing import Any, Final

from ares_events.errors import SchemaVersionError, StoreError
from ares_events.stores._migrations.sqlite import MIGRATIONS
from ares_events.stores.sqlite.sql import CREATE_META, SELECT_META, UPSERT_META

logger = logging.getLogger(__name__)

__all__ = ["SCHEMA_KEY", "SCHEMA_VERSION", "prepare_schema", "schema_version_of"]

SCHEMA_VERSION: Final = len(MIGRATIONS)
SCHEMA_KEY: Final = "schema_version"
"""Its ``ares_meta`` row."""


def schema_version_of(value: object, where: str) -> int:
    """The ``schema_version`` row of ``ares_meta`` as a number; a value that is not one
    (edited, damaged) is a damaged store, never migrated from or past.

    Raises:
        StoreError: names the value (cut) and the store.
    """
    # Not "-1" (it would index MIGRATIONS from the end), "4.0" nor superscript digits.
    if (type(value) is int and value >= 0) or (
        type(value) is str and value.isascii() and value.isdigit()
    ):
        return int(value)
    raise StoreError(
        f"cannot read schema of {where}: its schema_version in ares_meta is "
        f"{str(value)[:40]!r}, not a version number (the database is damaged)"
    )


def prepare_schema(rec: Any, migrate: bool) -> None:
    """Check (read-only store) or create and migrate the schema of ``rec``, a
    :class:`~ares_events.stores.sqlite.recorder.SQLiteRecorder` being opened (typed
    ``Any``: the recorder imports this module).

    Raises:
        SchemaVersionError: another version, and no migration allowed (or possible).
        StoreError: the file is damaged or not a database.
        StoreUnavailable: it stayed locked past ``busy_timeout`` (creating or migrating).
    """
    where = rec.describe()
    # Read without the write lock first: a store at this schema (and any read-only one)
    # opens without it, so a reader never waits for another's long write transaction.
    try:
        with rec.reading() as conn:
            row = conn.execute(SELECT_META, (SCHEMA_KEY,)).fetchone()
    except sqlite3.Error as exc:
        if rec.read_only:
            raise StoreError(f"cannot read schema of {where}: {exc}") from exc
        row = None  # no ares_meta yet (or no database: the write below says so)
    found = schema_version_of(row[0], where) if row else 0
    if found == SCHEMA_VERSION:
        return
    if rec.read_only:
        raise SchemaVersionError(found, SCHEMA_VERSION, where)
    try:
        with rec.transaction() as c:
            c.execute(CREATE_META)
            row = c.execute(SELECT_META, (SCHEMA_KEY,)).fetchone()
            found = schema_version_of(row[0], where) if row else 0
            if found > SCHEMA_VERSION or (found < SCHEMA_VERSION and not migrate):
                raise SchemaVersionError(found, SCHEMA_VERSION, where)
            for step in range(found, SCHEMA_VERSION):
                # statement by statement: executescript() would COMMIT mid-transaction
                for stmt in MIGRATIONS[step]:
                    c.execute(stmt)
                logger.info("sqlite store %s: migrated schema %d -> %d", where, step, step + 1)
            if found != SCHEMA_VERSION:
                c.execute(UPSERT_META, (SCHEMA_KEY, str(SCHEMA_VERSION)))
    except sqlite3.Error as exc:
        raise StoreError(f"cannot prepare schema of {where}: {exc}") from exc
