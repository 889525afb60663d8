"""The SQL of the PostgreSQL backend, as module constants (``{s}``: the quoted schema), and
the row -> event mapping.

It may import the core's value types and psycopg's types only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, fields
from typing import Final

from psycopg import sql

from ares_events.core.events import RecordedEvent

_COLUMNS: Final = (
    "stream_id, version, position, event_id::text, type, module, payload, metadata, "
    "recorded_at, prev_hash, hash, payload_ref"
)
# Rows below this bound are final (docs/architecture.md, "Global order and read_all"); every
# read takes ``GREATEST(bound, %s)`` with one past the highest position it returned before.
VISIBLE_BOUND: Final = (
    "(SELECT coalesce(min(x.xid::text::bigint),"
    " pg_snapshot_xmax(pg_current_snapshot())::text::bigint) * 65536"
    " FROM pg_snapshot_xip(pg_current_snapshot()) AS x(xid)"
    " WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.backend_xid = x.xid::xid"
    " AND a.datid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())))"
)

BEGIN: Final = "BEGIN"
COMMIT: Final = "COMMIT"
ROLLBACK: Final = "ROLLBACK"
LOCK_STREAM: Final = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
SELECT_HEAD_FOR_APPEND: Final = (
    "SELECT h.version, h.head_hash, pg_current_xact_id()::text::bigint, "
    "EXISTS (SELECT 1 FROM {s}.ares_events WHERE event_id = ANY(%s::text[]::uuid[])) "
    "FROM (SELECT 1) AS one LEFT JOIN {s}.ares_streams h ON h.stream_id = %s"
)
SELECT_IDS: Final = (
    f"SELECT {_COLUMNS} FROM {{s}}.ares_events WHERE event_id = ANY(%s::text[]::uuid[])"
)
# The fast path of an append (docs/architecture.md, "Fast path"): lock, guarded head row,
# events only when the head was written; the last position, or NULL when nothing was.
_LOCK: Final = "lk AS (SELECT pg_advisory_xact_lock(hashtextextended(%b::text, 0)))"
_HEAD_NEXT: Final = (
    "UPDATE {s}.ares_streams SET version = %b::bigint, head_hash = %b::bytea"
    " WHERE stream_id = %b::text AND version = %b::bigint AND head_hash = %b::bytea"
    " AND EXISTS (SELECT 1 FROM lk)"
    " RETURNING pg_current_xact_id()::text::bigint AS xid"
)
_HEAD_FIRST: Final = (
    "INSERT INTO {s}.ares_streams (stream_id, version, head_hash)"
    " SELECT %b::text, %b::bigint, %b::bytea WHERE EXISTS (SELECT 1 FROM lk)"
    " ON CONFLICT (stream_id) DO NOTHING"
    " RETURNING pg_current_xact_id()::text::bigint AS xid"
)
_INSERT_ONE: Final = (
    "INSERT INTO {s}.ares_events (position, stream_id, version, event_id, type, module,"
    " payload, payload_ref, metadata, recorded_at, prev_hash, hash)"
    " SELECT head.xid * 65536, %b::text, %b::bigint, %b::text::uuid, %b::text, %b::text,"
    " %b::bytea, %b::text, %b::bytea, %b::text, %b::bytea, %b::bytea FROM head"
    " RETURNING position"
)
_INSERT_BATCH: Final = (
    "INSERT INTO {s}.ares_events (position, stream_id, version, event_id, type, module,"
    " payload, payload_ref, metadata, recorded_at, prev_hash, hash)"
    " SELECT head.xid * 65536 + x.i - 1, %b::text, %b::bigint + x.i, x.e::uuid,"
    " x.t, x.m, x.p, x.r, x.md, x.a, x.ph, x.h"
    " FROM head, unnest(%b::text[], %b::text[], %b::text[], %b::bytea[], %b::text[],"
    " %b::bytea[], %b::text[], %b::bytea[], %b::bytea[])"
    " WITH ORDINALITY AS x(e, t, m, p, r, md, a, ph, h, i)"
    " RETURNING position"
)
_LAST_AND_WAKEUP: Final = (
    " SELECT m, CASE WHEN %b::text IS NULL OR m IS NULL THEN NULL"
    " ELSE pg_notify(%b::text, m::text) END"
    " FROM (SELECT max(position) AS m FROM ins) AS last"
)


def _fast(head: str, insert: str) -> str:
    return f"WITH {_LOCK}, head AS ({head}), ins AS ({insert}){_LAST_AND_WAKEUP}"


APPEND_NEXT_ONE: Final = _fast(_HEAD_NEXT, _INSERT_ONE)
APPEND_NEXT_BATCH: Final = _fast(_HEAD_NEXT, _INSERT_BATCH)
APPEND_FIRST_ONE: Final = _fast(_HEAD_FIRST, _INSERT_ONE)
APPEND_FIRST_BATCH: Final = _fast(_HEAD_FIRST, _INSERT_BATCH)
# append_many: the advisory locks of every stream (and of the tracking name) in ONE order,
# sorted by lock key, so two multi-stream appends can never deadlock (and a single-stream
# append holds one lock only). The sort feeds the aggregate row by row in key order.
LOCK_MANY: Final = (
    "SELECT count(pg_advisory_xact_lock(k)) FROM (SELECT DISTINCT hashtextextended(x, 0) AS k"
    " FROM unnest(%s::text[]) AS x ORDER BY 1) AS keys"
)
SELECT_HEADS_FOR_APPEND: Final = (
    "SELECT h.version, h.head_hash FROM unnest(%s::text[]) WITH ORDINALITY AS x(s, i)"
    " LEFT JOIN {s}.ares_streams h ON h.stream_id = x.s ORDER BY x.i"
)
SELECT_XID_IDS_TRACKING: Final = (
    "SELECT pg_current_xact_id()::text::bigint, "
    "EXISTS (SELECT 1 FROM {s}.ares_events WHERE event_id = ANY(%s::text[]::uuid[])), "
    "(SELECT position FROM {s}.ares_tracking WHERE name = %s)"
)
INSERT_MANY: Final = (
    "WITH ins AS ("
    " INSERT INTO {s}.ares_events (position, stream_id, version, event_id, type, module,"
    " payload, payload_ref, metadata, recorded_at, prev_hash, hash)"
    " SELECT %b::bigint * 65536 + x.i - 1, x.sid, x.v, x.e::uuid,"
    " x.t, x.m, x.p, x.r, x.md, x.a, x.ph, x.h"
    " FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::text[], %b::bytea[],"
    " %b::text[], %b::bytea[], %b::text[], %b::bytea[], %b::bytea[])"
    " WITH ORDINALITY AS x(sid, v, e, t, m, p, r, md, a, ph, h, i)"
    "), head AS ("
    " INSERT INTO {s}.ares_streams (stream_id, version, head_hash)"
    " SELECT * FROM unnest(%b::text[], %b::bigint[], %b::bytea[])"
    " ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,"
    " head_hash = excluded.head_hash"
    "), trk AS ("
    " INSERT INTO {s}.ares_tracking (name, position) SELECT %b::text, %b::bigint"
    " WHERE %b::text IS NOT NULL"
    " ON CONFLICT (name) DO UPDATE SET position = excluded.position"
    ") SELECT CASE WHEN %b::text IS NULL THEN NULL ELSE pg_notify(%b::text, %b::text) END"
)
# Erasure (see the recorder's erase): matched on the hash too, and only while not erased
# (a second, concurrent erasure matches nothing); the blob's other users are counted in the
# same transaction (an erased reference holds no "key").
ERASE_PAYLOAD: Final = (
    "UPDATE {s}.ares_events SET payload = NULL, payload_ref = %s "
    "WHERE stream_id = %s AND version = %s AND position = %s AND hash = %s "
    "AND (payload_ref IS NULL OR strpos(payload_ref, '\"erased\":true') = 0)"
)
COUNT_BLOB_REFS: Final = "SELECT count(*) FROM {s}.ares_events WHERE payload_ref LIKE %s"
# Archiving (Capability.ARCHIVE): a compare-and-set of a metadata value (the row locked, or
# inserted only if absent), and the checked delete of the rows a segment holds.
SELECT_META_FOR_UPDATE: Final = "SELECT value FROM {s}.ares_meta WHERE key = %s FOR UPDATE"
UPDATE_META: Final = "UPDATE {s}.ares_meta SET value = %s WHERE key = %s"
SELECT_ARCHIVED: Final = (
    "SELECT position, hash, payload_ref FROM {s}.ares_events "
    "WHERE position >= %s AND position <= %s ORDER BY position FOR UPDATE"
)
DELETE_ARCHIVED: Final = "DELETE FROM {s}.ares_events WHERE position = ANY(%s::bigint[])"
SELECT_TRACKING: Final = "SELECT position FROM {s}.ares_tracking WHERE name = %s"
# Ordered by version only: the (stream_id, version) index gives that order, so a page
# reads just its rows whatever the table's statistics say (ordering by position too made
# the planner, before the table was analyzed, sort every remaining row for each page).
# The recorder holds back the last version of a full page and starts the next page at
# it, so two rows of one version (a table whose unique index was dropped) both come out,
# once each, ordered by position (SELECT_STREAM_VERSION, for a group filling a page).
SELECT_STREAM: Final = (
    f"SELECT {_COLUMNS} FROM {{s}}.ares_events WHERE stream_id = %s "
    "AND version >= %s AND version <= %s ORDER BY version LIMIT %s"
)
SELECT_STREAM_VERSION: Final = (
    f"SELECT {_COLUMNS} FROM {{s}}.ares_events WHERE stream_id = %s AND version = %s "
    "ORDER BY position"
)
# Reads in global order after a position: below the visibility bound raised to a floor
# (SELECT_ALL, SELECT_POSITIONS), or below a bound given as a parameter (*_BELOW): a bound
# read in a statement of its own (Citus' coordinator), or a merge's top, below which every
# cell's rows are final (a cell store on one clock): a read must not apply a fresh bound of
# its own there, which can come out lower. The audit's order check reads three columns.
_AFTER: Final = "FROM {s}.ares_events WHERE position > %s AND position < "
_VISIBLE: Final = f"GREATEST({VISIBLE_BOUND}, %s)"
ORDER_BY_POSITION: Final = " ORDER BY position LIMIT %s"
# One application's events (prefix_range): a range on stream_id in byte order whatever
# the database's collation (COLLATE "C"), so no character is a wildcard.
RANGE: Final = ' AND stream_id COLLATE "C" >= %s AND stream_id COLLATE "C" < %s'
FROM: Final = ' AND stream_id COLLATE "C" >= %s'
SELECT_ALL_BELOW: Final = f"SELECT {_COLUMNS} {_AFTER}%s"
SELECT_ALL: Final = f"SELECT {_COLUMNS} {_AFTER}{_VISIBLE}{ORDER_BY_POSITION}"
SELECT_ALL_RANGE: Final = f"SELECT {_COLUMNS} {_AFTER}{_VISIBLE}{RANGE}{ORDER_BY_POSITION}"
SELECT_ALL_FROM: Final = f"SELECT {_COLUMNS} {_AFTER}{_VISIBLE}{FROM}{ORDER_BY_POSITION}"
SELECT_POSITIONS: Final = (
    f"SELECT position, stream_id, version {_AFTER}{_VISIBLE}{ORDER_BY_POSITION}"
)
SELECT_POSITIONS_BELOW: Final = f"SELECT position, stream_id, version {_AFTER}%s{ORDER_BY_POSITION}"
# The bound alone: a read after this recorder's own append waits for it to pass (_catch_up).
SELECT_BOUND: Final = f"SELECT {VISIBLE_BOUND}"
SELECT_LAST_POSITION: Final = (
    "SELECT coalesce(max(position), 0) FROM {s}.ares_events "
    f"WHERE position < GREATEST({VISIBLE_BOUND}, %s)"
)
SELECT_HEAD: Final = "SELECT version, head_hash FROM {s}.ares_streams WHERE stream_id = %s"
_HEADS_WHERE: Final = "SELECT stream_id, version, head_hash FROM {s}.ares_streams WHERE stream_id "
SELECT_HEADS: Final = _HEADS_WHERE + "> %s ORDER BY stream_id LIMIT %s"
# One page of heads (Capability.STREAM_PAGES), from the primary key in the column's own
# order, as SELECT_HEADS. Under a byte-order collation (C, POSIX, C.UTF-8) the prefix is a
# range the index serves; under any other one, starts_with() keeps the result exact (a
# collation may sort ids with the prefix apart), scanning the index from ``after``.
SELECT_HEADS_RANGE_GT: Final = _HEADS_WHERE + "> %s AND stream_id < %s ORDER BY stream_id LIMIT %s"
SELECT_HEADS_RANGE_GE: Final = _HEADS_WHERE + ">= %s AND stream_id < %s ORDER BY stream_id LIMIT %s"
SELECT_HEADS_FROM_GE: Final = _HEADS_WHERE + ">= %s ORDER BY stream_id LIMIT %s"
SELECT_HEADS_STARTING: Final = (
    _HEADS_WHERE + "> %s AND starts_with(stream_id, %s) ORDER BY stream_id LIMIT %s"
)
SELECT_BYTE_ORDER: Final = (
    "SELECT datcollate IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8') AND datlocprovider = 'c' "
    "FROM pg_database WHERE datname = current_database()"
)
LISTEN: Final = "LISTEN {channel}"
SET_STATEMENT_TIMEOUT: Final = "SELECT set_config('statement_timeout', %s, false)"
# Schema management: serialized across processes by a transaction-scoped advisory lock.
LOCK_MIGRATIONS: Final = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
SCHEMA_EXISTS: Final = "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = %s)"
META_EXISTS: Final = "SELECT to_regclass(%s) IS NOT NULL"
# Citus's catalog of distributed schemas (schema-based sharding), when it is installed.
DIST_CATALOG: Final = "SELECT to_regclass('pg_catalog.pg_dist_schema') IS NOT NULL"
DISTRIBUTED_SCHEMA: Final = (
    "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_dist_schema WHERE schemaid = to_regnamespace(%s))"
)
CREATE_SCHEMA: Final = "CREATE SCHEMA IF NOT EXISTS {s}"
CREATE_META: Final = (
    "CREATE TABLE IF NOT EXISTS {s}.ares_meta (key text PRIMARY KEY, value text NOT NULL)"
)
SELECT_META: Final = "SELECT value FROM {s}.ares_meta WHERE key = %s"
INSERT_META_IF_ABSENT: Final = (
    "INSERT INTO {s}.ares_meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING"
)
UPSERT_META: Final = (
    "INSERT INTO {s}.ares_meta (key, value) VALUES (%s, %s) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
# Integrity scans for the audit (a healthy schema has unique indexes and returns nothing).
SELECT_DUPLICATE_VERSIONS: Final = (
    "SELECT stream_id, version, count(*), min(position) FROM {s}.ares_events "
    "GROUP BY stream_id, version HAVING count(*) > 1 ORDER BY stream_id, version"
)
SELECT_DUPLICATE_POSITIONS: Final = (
    "SELECT min(stream_id), min(version), count(*), position FROM {s}.ares_events "
    "GROUP BY position HAVING count(*) > 1 ORDER BY position"
)
SELECT_DUPLICATE_IDS: Final = (
    "SELECT event_id::text, count(*), min(position) FROM {s}.ares_events "
    "GROUP BY event_id HAVING count(*) > 1 ORDER BY min(position)"
)
SELECT_SCHEMA_VERSION: Final = "SELECT value FROM {s}.ares_meta WHERE key = 'schema_version'"
UPSERT_SCHEMA_VERSION: Final = (
    "INSERT INTO {s}.ares_meta (key, value) VALUES ('schema_version', %s) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


# Snapshots: one row per (stream, projection), replaced on save.
SNAPSHOT_UPSERT: Final = (
    "INSERT INTO {s}.ares_snapshots (stream_id, projection, projection_version, at_version, "
    "at_hash, state, state_digest, created_at, seal) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
    "ON CONFLICT (stream_id, projection) DO UPDATE SET "
    "projection_version = excluded.projection_version, at_version = excluded.at_version, "
    "at_hash = excluded.at_hash, state = excluded.state, "
    "state_digest = excluded.state_digest, created_at = excluded.created_at, "
    "seal = excluded.seal"
)
SNAPSHOT_SELECT: Final = (
    "SELECT projection_version, at_version, at_hash, state, state_digest, created_at, seal "
    "FROM {s}.ares_snapshots WHERE stream_id = %s AND projection = %s"
)
SNAPSHOT_DELETE_ONE: Final = (
    "DELETE FROM {s}.ares_snapshots WHERE stream_id = %s AND projection = %s"
)
SNAPSHOT_DELETE_STREAM: Final = "DELETE FROM {s}.ares_snapshots WHERE stream_id = %s"
_SNAPSHOT_INFO_COLUMNS: Final = (
    "stream_id, projection, projection_version, at_version, at_hash, octet_length(state), "
    "state_digest, created_at"
)
SNAPSHOT_LIST_ALL: Final = (
    "SELECT " + _SNAPSHOT_INFO_COLUMNS + " FROM {s}.ares_snapshots "
    'WHERE (stream_id COLLATE "C", projection COLLATE "C") > (%s, %s) '
    'ORDER BY stream_id COLLATE "C", projection COLLATE "C" LIMIT %s'
)
SNAPSHOT_LIST_STREAM: Final = (
    "SELECT " + _SNAPSHOT_INFO_COLUMNS + " FROM {s}.ares_snapshots "
    'WHERE stream_id = %s AND projection COLLATE "C" > %s '
    'ORDER BY projection COLLATE "C" LIMIT %s'
)


@dataclass(frozen=True, slots=True)
class Statements:
    """Every statement of one schema's store, rendered once: a recorder names each one
    (``self.sql.append_next_one``); each field's ``sql`` metadata is its module constant."""

    schema: str
    append_next_one: sql.Composed = field(metadata={"sql": APPEND_NEXT_ONE})
    append_next_batch: sql.Composed = field(metadata={"sql": APPEND_NEXT_BATCH})
    append_first_one: sql.Composed = field(metadata={"sql": APPEND_FIRST_ONE})
    append_first_batch: sql.Composed = field(metadata={"sql": APPEND_FIRST_BATCH})
    head_for_append: sql.Composed = field(metadata={"sql": SELECT_HEAD_FOR_APPEND})
    ids: sql.Composed = field(metadata={"sql": SELECT_IDS})
    stream: sql.Composed = field(metadata={"sql": SELECT_STREAM})
    stream_version: sql.Composed = field(metadata={"sql": SELECT_STREAM_VERSION})
    all: sql.Composed = field(metadata={"sql": SELECT_ALL})
    all_range: sql.Composed = field(metadata={"sql": SELECT_ALL_RANGE})
    all_from: sql.Composed = field(metadata={"sql": SELECT_ALL_FROM})
    positions: sql.Composed = field(metadata={"sql": SELECT_POSITIONS})
    last: sql.Composed = field(metadata={"sql": SELECT_LAST_POSITION})
    bound: sql.Composed = field(metadata={"sql": SELECT_BOUND})
    head: sql.Composed = field(metadata={"sql": SELECT_HEAD})
    heads: sql.Composed = field(metadata={"sql": SELECT_HEADS})
    heads_for_append: sql.Composed = field(metadata={"sql": SELECT_HEADS_FOR_APPEND})
    heads_range_gt: sql.Composed = field(metadata={"sql": SELECT_HEADS_RANGE_GT})
    heads_range_ge: sql.Composed = field(metadata={"sql": SELECT_HEADS_RANGE_GE})
    heads_from_ge: sql.Composed = field(metadata={"sql": SELECT_HEADS_FROM_GE})
    heads_starting: sql.Composed = field(metadata={"sql": SELECT_HEADS_STARTING})
    byte_order: sql.Composed = field(metadata={"sql": SELECT_BYTE_ORDER})
    xid_ids_tracking: sql.Composed = field(metadata={"sql": SELECT_XID_IDS_TRACKING})
    insert_many: sql.Composed = field(metadata={"sql": INSERT_MANY})
    tracking: sql.Composed = field(metadata={"sql": SELECT_TRACKING})
    meta: sql.Composed = field(metadata={"sql": SELECT_META})
    meta_insert: sql.Composed = field(metadata={"sql": INSERT_META_IF_ABSENT})
    meta_upsert: sql.Composed = field(metadata={"sql": UPSERT_META})
    dup_versions: sql.Composed = field(metadata={"sql": SELECT_DUPLICATE_VERSIONS})
    dup_positions: sql.Composed = field(metadata={"sql": SELECT_DUPLICATE_POSITIONS})
    dup_ids: sql.Composed = field(metadata={"sql": SELECT_DUPLICATE_IDS})
    schema_version: sql.Composed = field(metadata={"sql": SELECT_SCHEMA_VERSION})
    erase: sql.Composed = field(metadata={"sql": ERASE_PAYLOAD})
    blob_refs: sql.Composed = field(metadata={"sql": COUNT_BLOB_REFS})
    meta_for_update: sql.Composed = field(metadata={"sql": SELECT_META_FOR_UPDATE})
    meta_update: sql.Composed = field(metadata={"sql": UPDATE_META})
    archived: sql.Composed = field(metadata={"sql": SELECT_ARCHIVED})
    archived_delete: sql.Composed = field(metadata={"sql": DELETE_ARCHIVED})
    snapshot_upsert: sql.Composed = field(metadata={"sql": SNAPSHOT_UPSERT})
    snapshot_select: sql.Composed = field(metadata={"sql": SNAPSHOT_SELECT})
    snapshot_delete_one: sql.Composed = field(metadata={"sql": SNAPSHOT_DELETE_ONE})
    snapshot_delete_stream: sql.Composed = field(metadata={"sql": SNAPSHOT_DELETE_STREAM})
    snapshot_list_all: sql.Composed = field(metadata={"sql": SNAPSHOT_LIST_ALL})
    snapshot_list_stream: sql.Composed = field(metadata={"sql": SNAPSHOT_LIST_STREAM})

    @classmethod
    def for_schema(cls, schema: str) -> Statements:
        """The statements with ``{s}`` bound to ``schema`` (both faces use these)."""
        q = sql.Identifier(schema)
        done = {f.name: render_for(q, f.metadata["sql"]) for f in fields(cls) if f.metadata}
        return cls(schema=schema, **done)


def render_for(schema: sql.Identifier, text: str) -> sql.Composed:
    """``text`` with ``{s}`` bound to ``schema``, rendered once: a Composed of one SQL part
    costs the driver one encode per execute, instead of walking and quoting the parts
    again (~2 us an append)."""
    return sql.Composed([sql.SQL(sql.SQL(text).format(s=schema).as_string(None))])


def channel_for(schema: str) -> str:
    """The NOTIFY channel of a schema's store (at most 63 bytes, PostgreSQL's limit)."""
    channel = f"ares_events:{schema}"
    if len(channel.encode()) > 63:
        channel = "ares_events:" + hashlib.sha256(schema.encode()).hexdigest()[:32]
    return channel


# Rows are selected in exactly the layout RecordedEvent._from_row takes (one C-level tuple
# build per event).
row_to_event: Final = RecordedEvent._from_row
