"""SQLite schema migrations (append-only). Each step is a tuple of statements."""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 0 -> 1: events and stream heads.
    (
        """CREATE TABLE ares_events (
            position    INTEGER PRIMARY KEY,  -- global order 1, 2, 3, ...
            stream_id   TEXT    NOT NULL,
            version     INTEGER NOT NULL,
            event_id    TEXT    NOT NULL,
            type        TEXT    NOT NULL,
            module      TEXT    NOT NULL,
            payload     BLOB,                 -- canonical JSON, NULL when spilled
            payload_ref TEXT,                 -- {"key","size","digest"} when spilled
            metadata    BLOB    NOT NULL,     -- canonical JSON object
            recorded_at TEXT    NOT NULL,     -- exactly the hashed "at" string
            prev_hash   BLOB    NOT NULL,
            hash        BLOB    NOT NULL
        )""",
        "CREATE UNIQUE INDEX ares_events_stream_version ON ares_events (stream_id, version)",
        "CREATE UNIQUE INDEX ares_events_event_id ON ares_events (event_id)",
        """CREATE TABLE ares_streams (
            stream_id TEXT PRIMARY KEY,
            version   INTEGER NOT NULL,
            head_hash BLOB    NOT NULL
        ) WITHOUT ROWID""",
    ),
    # 1 -> 2: snapshots (latest per stream and projection; a cache of a fold).
    (
        """CREATE TABLE ares_snapshots (
            stream_id          TEXT    NOT NULL,
            projection         TEXT    NOT NULL,
            projection_version INTEGER NOT NULL,
            at_version         INTEGER NOT NULL,
            at_hash            BLOB    NOT NULL,  -- event hash at at_version
            state              BLOB    NOT NULL,  -- canonical JSON of the state
            state_digest       BLOB    NOT NULL,  -- blake3(state)
            created_at         TEXT    NOT NULL,
            PRIMARY KEY (stream_id, projection)
        ) WITHOUT ROWID""",
    ),
    # 2 -> 3: tracking records (a consumer's exactly-once bookmark, written in the same
    # transaction as the events of an append_many; one row per name, only increasing).
    (
        """CREATE TABLE ares_tracking (
            name     TEXT    PRIMARY KEY,
            position INTEGER NOT NULL
        ) WITHOUT ROWID""",
    ),
    # 3 -> 4: snapshot seals (a MAC under the chain key in keyed stores, else a digest,
    # over every field recovery trusts; NULL in snapshots written before).
    ("ALTER TABLE ares_snapshots ADD COLUMN seal BLOB",),
)
