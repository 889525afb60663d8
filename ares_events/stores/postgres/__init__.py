"""PostgreSQL backend: the production system of record (``postgresql://`` or
``postgres://``; docs/architecture.md, "PostgreSQL"), one concern per module.

It may import the core, :mod:`ares_events.errors`, psycopg and psycopg_pool, and
:mod:`ares_events.stores._migrations`.
"""

from __future__ import annotations

from ares_events.stores.postgres.recorder import MAX_BATCH, PostgresRecorder
from ares_events.stores.postgres.recorder_async import AsyncPostgresRecorder
from ares_events.stores.postgres.schema import SCHEMA_VERSION
from ares_events.stores.postgres.snapshots import PostgresSnapshotRows
from ares_events.stores.postgres.snapshots_async import AsyncPostgresSnapshotRows

__all__ = [
    "MAX_BATCH",
    "SCHEMA_VERSION",
    "AsyncPostgresRecorder",
    "AsyncPostgresSnapshotRows",
    "PostgresRecorder",
    "PostgresSnapshotRows",
]
