"""PostgreSQL backend: the production system of record (``postgresql://`` or ``postgres://``).

The write protocol (a one-statement fast path and a locked path, per-stream advisory locks),
xid-ordered global positions and their visibility bound, wake-ups and the URL parameters
are described in docs/architecture.md ("PostgreSQL") and docs/configuration.md.

What lives here, one concern per module: :mod:`.recorder_async` (``AsyncPostgresRecorder``,
the whole read and write path; ``PostgresRecorder`` in :mod:`.recorder` is generated from
it), :mod:`.sql` (every statement, as module constants, and :class:`~.sql.Statements`,
which names them), :mod:`.options` (URL parameters), :mod:`.driver` (error translation,
scrubbing, the health check's socket test), :mod:`.connection_async` (pools and probes;
``connection`` generated), :mod:`.listener_async` (LISTEN and waiting; ``listener``
generated), :mod:`.snapshots_async` (the snapshot table's rows; ``snapshots`` generated),
:mod:`.arrays` (binary array parameters), :mod:`.clock` (where positions and the visibility
bound come from, and the statements that write under them; a cell layout gives its own)
and :mod:`.schema` (migrations on open).

It may import the core, :mod:`ares_events.errors`, psycopg and psycopg_pool, and
:mod:`ares_events.stores._migrations`. Importing it without the ``postgres`` extra raises
``ImportError`` (the registry turns that into ``MissingDependencyError``).
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
