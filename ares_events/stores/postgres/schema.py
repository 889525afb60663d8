"""Schema of the PostgreSQL backend: create or migrate it on open, or only verify it.

It may import :mod:`ares_events.errors`, psycopg, the migration list and this package's SQL.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg
from psycopg import sql

from ares_events.errors import SchemaVersionError
from ares_events.stores._migrations.postgres import MIGRATIONS
from ares_events.stores.postgres.sql import (
    CREATE_META,
    CREATE_SCHEMA,
    LOCK_MIGRATIONS,
    META_EXISTS,
    SCHEMA_EXISTS,
    SELECT_SCHEMA_VERSION,
    UPSERT_SCHEMA_VERSION,
)

logger = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "prepare_schema", "schema_exists"]

SCHEMA_VERSION: Final = len(MIGRATIONS)


def prepare_schema(conn: psycopg.Connection[Any], schema: str, where: str, migrate: bool) -> None:
    """Bring ``schema`` to :data:`SCHEMA_VERSION`, or with ``migrate=False`` only check it
    (creating nothing). ``conn`` is autocommit: the migration runs in its own transaction.

    Raises:
        SchemaVersionError: the schema is ahead of this build, or behind it and
            ``migrate`` is False.
    """
    q = sql.Identifier(schema)
    if not migrate:
        # Verify only: never create anything.
        found = 0
        exists = conn.execute(
            META_EXISTS, (sql.Identifier(schema, "ares_meta").as_string(conn),)
        ).fetchone()
        if exists and exists[0]:
            row = conn.execute(sql.SQL(SELECT_SCHEMA_VERSION).format(s=q)).fetchone()
            found = int(row[0]) if row else 0
        if found != SCHEMA_VERSION:
            raise SchemaVersionError(found, SCHEMA_VERSION, where)
        return
    with conn.transaction():
        # Two processes opening a fresh database at once: the second waits here
        # and then finds the schema current.
        conn.execute(LOCK_MIGRATIONS, (f"ares-events:migrate:{schema}",))
        conn.execute(sql.SQL(CREATE_SCHEMA).format(s=q))
        conn.execute(sql.SQL(CREATE_META).format(s=q))
        row = conn.execute(sql.SQL(SELECT_SCHEMA_VERSION).format(s=q)).fetchone()
        found = int(row[0]) if row else 0
        if found > SCHEMA_VERSION:
            raise SchemaVersionError(found, SCHEMA_VERSION, where)
        for step in range(found, SCHEMA_VERSION):
            for stmt in MIGRATIONS[step]:
                conn.execute(sql.SQL(stmt).format(schema=q))
            logger.info("postgresql %s: migrated schema %d -> %d", where, step, step + 1)
        if found != SCHEMA_VERSION:
            conn.execute(sql.SQL(UPSERT_SCHEMA_VERSION).format(s=q), (str(SCHEMA_VERSION),))


def schema_exists(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """Why ``schema`` holds no ares-events store, or None when it does (reads only)."""
    row = conn.execute(SCHEMA_EXISTS, (schema,)).fetchone()
    if not row or not row[0]:
        return f"schema {schema!r} does not exist"
    row = conn.execute(
        META_EXISTS, (sql.Identifier(schema, "ares_meta").as_string(conn),)
    ).fetchone()
    if not row or not row[0]:
        return f"schema {schema!r} holds no ares-events tables"
    return None
