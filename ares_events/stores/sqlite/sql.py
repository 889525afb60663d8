"""The SQL of the SQLite backend, as module constants (``?`` placeholders).

It may import nothing from the package.
"""

from __future__ import annotations

from typing import Final

_COLUMNS: Final = (
    "stream_id, version, position, event_id, type, module, payload, metadata, "
    "recorded_at, prev_hash, hash, payload_ref"
)
# Keyset on (version, position): unique per row even if two rows share a version, and
# served in order by the (stream_id, version) index, whose entries end with the rowid.
SELECT_STREAM: Final = (
    f"SELECT {_COLUMNS} FROM ares_events WHERE stream_id = ? "
    "AND version >= ? AND version <= ? AND (version, position) > (?, ?) "
    "ORDER BY version, position LIMIT ?"
)
SELECT_ALL: Final = (
    f"SELECT {_COLUMNS} FROM ares_events WHERE position > ? ORDER BY position LIMIT ?"
)
# The audit's order check: three columns, no event objects.
SELECT_POSITIONS: Final = (
    "SELECT position, stream_id, version FROM ares_events WHERE position > ? "
    "ORDER BY position LIMIT ?"
)
# One application's events (prefix_range): a range on stream_id, BINARY collation (UTF-8
# byte order = code point order), so no character is a wildcard.
SELECT_ALL_RANGE: Final = (
    f"SELECT {_COLUMNS} FROM ares_events WHERE position > ? "
    "AND stream_id >= ? AND stream_id < ? ORDER BY position LIMIT ?"
)
SELECT_ALL_FROM: Final = (
    f"SELECT {_COLUMNS} FROM ares_events WHERE position > ? "
    "AND stream_id >= ? ORDER BY position LIMIT ?"
)
SELECT_IDS: Final = f"SELECT {_COLUMNS} FROM ares_events WHERE event_id IN (%s)"
SELECT_HEAD: Final = "SELECT version, head_hash FROM ares_streams WHERE stream_id = ?"
SELECT_HEADS: Final = (
    "SELECT stream_id, version, head_hash FROM ares_streams "
    "WHERE stream_id > ? ORDER BY stream_id LIMIT ?"
)
# One page of heads (Capability.STREAM_PAGES): the primary key's BINARY order, a range for
# the prefix (prefix_range), so no character is a wildcard and the index serves both. One
# lower bound only (the cursor or the prefix, whichever is higher): with two, the planner
# may start the scan at the lower one.
_HEADS_WHERE: Final = "SELECT stream_id, version, head_hash FROM ares_streams WHERE stream_id "
SELECT_HEADS_RANGE_GT: Final = _HEADS_WHERE + "> ? AND stream_id < ? ORDER BY stream_id LIMIT ?"
SELECT_HEADS_RANGE_GE: Final = _HEADS_WHERE + ">= ? AND stream_id < ? ORDER BY stream_id LIMIT ?"
SELECT_HEADS_FROM_GE: Final = _HEADS_WHERE + ">= ? ORDER BY stream_id LIMIT ?"
SELECT_LAST_POSITION: Final = "SELECT coalesce(max(position), 0) FROM ares_events"
SELECT_HEAD_AND_POSITION: Final = (
    "SELECT (SELECT version FROM ares_streams WHERE stream_id = ?), "
    "(SELECT head_hash FROM ares_streams WHERE stream_id = ?), "
    "(SELECT coalesce(max(position), 0) FROM ares_events)"
)
INSERT_EVENT: Final = (
    "INSERT INTO ares_events (position, stream_id, version, event_id, type, "
    "module, payload, payload_ref, metadata, recorded_at, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The native writer's append of one batch (stores/sqlite/writes.py): several rows in one
# statement (up to 64: 642 values, under SQLite's oldest default limit of 999), the stream
# id (?1) and the batch's recorded_at (?2) bound once, ten values a row (?3...). When the
# batch's events share type, module and metadata (?3-?5), those are bound once too,
# positions and versions count up from ?6 and ?7, and a row binds four values (event_id,
# payload, prev_hash, hash). The Python path binds INSERT_EVENT's plain placeholders:
# Python 3.12.0-3.12.3's sqlite3 warns about numbered ones given a list.
_INSERT_EVENTS_HEAD: Final = INSERT_EVENT.split("VALUES")[0] + "VALUES "


def insert_events_values(n: int, shared: bool = False) -> str:
    """The INSERT of ``n`` rows of one stream and one ``recorded_at`` (see above)."""
    if shared:
        rows = (
            f"(?6+{i},?1,?7+{i},?{b},?3,?4,?{b + 1},NULL,?5,?2,?{b + 2},?{b + 3})"
            for i, b in enumerate(range(8, 8 + 4 * n, 4))
        )
    else:
        rows = (
            f"(?{b},?1,?{b + 1},?{b + 2},?{b + 3},?{b + 4},?{b + 5},?{b + 6},?{b + 7},?2,"
            f"?{b + 8},?{b + 9})"
            for b in range(3, 3 + 10 * n, 10)
        )
    return _INSERT_EVENTS_HEAD + ",".join(rows)


UPSERT_HEAD: Final = (
    "INSERT INTO ares_streams (stream_id, version, head_hash) VALUES (?, ?, ?) "
    "ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, "
    "head_hash = excluded.head_hash"
)
SELECT_TRACKING: Final = "SELECT position FROM ares_tracking WHERE name = ?"
UPSERT_TRACKING: Final = (
    "INSERT INTO ares_tracking (name, position) VALUES (?, ?) "
    "ON CONFLICT (name) DO UPDATE SET position = excluded.position"
)
SELECT_META: Final = "SELECT value FROM ares_meta WHERE key = ?"
INSERT_META_IF_ABSENT: Final = (
    "INSERT INTO ares_meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO NOTHING"
)
UPSERT_META: Final = (
    "INSERT INTO ares_meta (key, value) VALUES (?, ?) "
    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
HAS_META_TABLE: Final = (
    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'ares_meta'"
)
# Integrity scans for the audit: keys that must be unique but are not (a tampered file
# whose unique indexes were dropped). position is the rowid, unique by construction.
SELECT_DUPLICATE_VERSIONS: Final = (
    "SELECT stream_id, version, count(*), min(position) FROM ares_events "
    "GROUP BY stream_id, version HAVING count(*) > 1 ORDER BY stream_id, version"
)
SELECT_DUPLICATE_IDS: Final = (
    "SELECT event_id, count(*), min(position) FROM ares_events "
    "GROUP BY event_id HAVING count(*) > 1 ORDER BY min(position)"
)
CREATE_META: Final = (
    "CREATE TABLE IF NOT EXISTS ares_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"
)

# -- snapshots ------------------------------------------------------------------------

SQLITE_UPSERT: Final = (
    "INSERT INTO ares_snapshots (stream_id, projection, projection_version, at_version, "
    "at_hash, state, state_digest, created_at, seal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (stream_id, projection) DO UPDATE SET "
    "projection_version = excluded.projection_version, at_version = excluded.at_version, "
    "at_hash = excluded.at_hash, state = excluded.state, "
    "state_digest = excluded.state_digest, created_at = excluded.created_at, "
    "seal = excluded.seal"
)
SQLITE_SELECT: Final = (
    "SELECT projection_version, at_version, at_hash, state, state_digest, created_at, seal "
    "FROM ares_snapshots WHERE stream_id = ? AND projection = ?"
)
SQLITE_DELETE_ONE: Final = "DELETE FROM ares_snapshots WHERE stream_id = ? AND projection = ?"
SQLITE_DELETE_STREAM: Final = "DELETE FROM ares_snapshots WHERE stream_id = ?"
_SQLITE_INFO_COLUMNS: Final = (
    "stream_id, projection, projection_version, at_version, at_hash, length(state), "
    "state_digest, created_at"
)
SQLITE_LIST_ALL: Final = (
    f"SELECT {_SQLITE_INFO_COLUMNS} FROM ares_snapshots "
    "WHERE stream_id > ? OR (stream_id = ? AND projection > ?) "
    "ORDER BY stream_id, projection LIMIT ?"
)
SQLITE_LIST_STREAM: Final = (
    f"SELECT {_SQLITE_INFO_COLUMNS} FROM ares_snapshots "
    "WHERE stream_id = ? AND projection > ? ORDER BY projection LIMIT ?"
)
