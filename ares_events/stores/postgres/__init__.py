"""PostgreSQL backend (``postgresql://`` or ``postgres://``): :class:`PostgresRecorder`.

What lives here: the recorder (:mod:`~ares_events.stores.postgres.recorder`).

It may import the core, :mod:`ares_events.errors`, :mod:`ares_events.integrity.chain`,
psycopg and psycopg_pool, and the other modules of this package. Importing it without
the ``postgres`` extra raises ``ImportError`` (the registry turns that into
``MissingDependencyError``).
"""

from __future__ import annotations

from ares_events.stores.postgres.recorder import MAX_BATCH, SCHEMA_VERSION, PostgresRecorder

__all__ = ["MAX_BATCH", "SCHEMA_VERSION", "PostgresRecorder"]
