"""PostgreSQL backend: the production system of record (``postgresql://`` or ``postgres://``).

Connections come from a psycopg_pool ``ConnectionPool`` (autocommit connections; each
operation takes one and gives it back). A connection found dead when it is taken from the
pool (the server restarted, an admin terminated the backend) is replaced, so the next call
after a restart reconnects. The check costs no round trip in the normal case: a
terminated backend leaves an error and EOF readable on the socket, and only then is the
connection pinged.

**Writes** follow the protocol in :mod:`ares_events.core.recorder` with no global lock:
``pg_advisory_xact_lock(hashtextextended(stream_id, 0))`` serializes appends to *one stream
only*. Two paths, the same guarantees:

* Fast path, one plain statement (one round trip, its own transaction): the batch is
  sealed against the head this store *predicts* (the head its last append to the stream
  left, or "new stream"); the statement takes the stream lock first, then updates the
  head row only if it still holds the predicted version and hash (or inserts it only if
  the stream has none), inserts the events only if it did, and queues a ``pg_notify``.
  Nothing forks: the head row guards the prediction in the transaction that inserts (an
  ``UPDATE`` re-checks its condition on the newest row version, ``ON CONFLICT`` sees every
  committed row). A failed prediction writes nothing and returns NULL; a reused event id
  fails the statement (unique violation) and writes nothing; both go to the locked path.
* Locked path, two round trips (a cache miss on an existing stream, or a misprediction):
  ``BEGIN``; the lock; then, in a later statement (a fresh snapshot that sees every append
  that held the lock before), the head, the id check and ``pg_current_xact_id()``; the
  batch is sealed against that head; one statement inserts the events (``unnest`` of
  binary arrays), upserts the head and queues ``pg_notify``; ``COMMIT``.

**Global positions** follow transaction-id order: ``position = xid * 65536 + index``
(``xid`` is the 64-bit ``xid8`` of the appending transaction, so batches hold at most
65,535 events). ``read_all`` and ``last_position`` only return rows below a bound computed
in the same statement: the smallest xid in progress in the statement's snapshot
(``pg_snapshot_xip(pg_current_snapshot())``), ignoring xids then running in *another*
database (they cannot write here), else the snapshot's xmax. Every transaction with a
smaller xid has ended and is seen by the snapshot, and every transaction still running or
yet to start has a larger xid, so no row can ever appear below a position already
returned. A reader polling with ``after_position`` therefore never skips an event whose
transaction committed after a later one became visible. Positions are strictly increasing
and stable but not gap-free (no ``GAPLESS_POSITIONS``). The cost: a write transaction in
progress in the same database (any table; or a prepared transaction, or one whose session
this role cannot see) holds back ``read_all`` visibility until it ends; reads of one stream
(``read``) are not affected.

**Wake-ups**: a background thread holds one ``LISTEN`` connection per store (opened on the
first ``wait_for``); waiters recheck :meth:`last_position` after every
notification, so a wake-up is never missed.

URL parameters owned here: ``schema`` (default ``public``; created when missing),
``pool_min`` (default 1), ``pool_max`` (default 10), ``pool_timeout`` (seconds to wait for
a free connection, default 30; then ``StoreUnavailable``), ``statement_timeout``
(milliseconds, set on every pooled connection), ``page_size`` (rows per read page, default
2000), ``migrate`` (true|false, default true), ``notify`` (true|false, default true: a
NOTIFY with every append; false for write-heavy loads with several writers, and
``wait_for`` then polls). Every other parameter must be a libpq
option (``sslmode``, ``connect_timeout`` (default 10 here), ``application_name``, ...)
and is passed through.
Passwords go percent-encoded in the URL's userinfo, never in the query.

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
