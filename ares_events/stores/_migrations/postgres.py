"""PostgreSQL schema migrations (append-only): each step a tuple of statements, ``{schema}``
replaced by the quoted schema name."""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    # 0 -> 1: events and stream heads.
    (
        """CREATE TABLE {schema}.ares_events (
            position    bigint PRIMARY KEY,  -- xid * 65536 + index: increasing, not gap-free
            stream_id   text   NOT NULL,
            version     bigint NOT NULL,
            event_id    uuid   NOT NULL UNIQUE,
            type        text   NOT NULL,
            module      text   NOT NULL,
            payload     bytea,               -- canonical JSON, NULL when spilled
            payload_ref text,                -- JSON key/size/digest when spilled
            metadata    bytea  NOT NULL,     -- canonical JSON object
            recorded_at text   NOT NULL,     -- exactly the hashed "at" string
            prev_hash   bytea  NOT NULL,
            hash        bytea  NOT NULL,
            UNIQUE (stream_id, version)
        )""",
        """CREATE TABLE {schema}.ares_streams (
            stream_id text   PRIMARY KEY,
            version   bigint NOT NULL,
            head_hash bytea  NOT NULL
        )""",
    ),
    # 1 -> 2: snapshots (latest per stream and projection; a cache of a fold).
    (
        """CREATE TABLE {schema}.ares_snapshots (
            stream_id          text    NOT NULL,
            projection         text    NOT NULL,
            projection_version integer NOT NULL,
            at_version         bigint  NOT NULL,
            at_hash            bytea   NOT NULL,  -- event hash at at_version
            state              bytea   NOT NULL,  -- canonical JSON of the state
            state_digest       bytea   NOT NULL,  -- blake3(state)
            created_at         text    NOT NULL,
            PRIMARY KEY (stream_id, projection)
        )""",
    ),
    # 2 -> 3: the one-statement append (see PostgresRecorder.append). The caller sealed the
    # batch against a predicted head (base version and hash); under the stream's lock the
    # function checks the ids, then the head (each query of a VOLATILE plpgsql function
    # takes a fresh snapshot, so it sees every append that held the lock before), and
    # writes only when the prediction holds. Status 0: written (r_xid set); 1: the head
    # differs (r_version/r_hash are the actual head), nothing written; 2: some event id
    # already exists, nothing written.
    (
        """CREATE FUNCTION {schema}.ares_append(
            p_stream text, p_base bigint, p_base_hash bytea, p_channel text,
            p_ids text[], p_types text[], p_modules text[], p_payloads bytea[],
            p_refs text[], p_metas bytea[], p_ats text[], p_prevs bytea[], p_hashes bytea[]
        ) RETURNS TABLE (r_status integer, r_version bigint, r_hash bytea, r_xid bigint)
        LANGUAGE plpgsql VOLATILE
        -- Plan each lookup for the table as it is now: a plan cached while the table was
        -- new and empty (a sequential scan) would otherwise be kept until the next ANALYZE.
        SET plan_cache_mode = force_custom_plan
        AS $fn$
        DECLARE
            v_version bigint;
            v_hash bytea;
            v_xid bigint;
            v_n integer := cardinality(p_ids);
        BEGIN
            PERFORM pg_advisory_xact_lock(hashtextextended(p_stream, 0));
            IF EXISTS (SELECT 1 FROM {schema}.ares_events e
                       WHERE e.event_id = ANY(p_ids::uuid[])) THEN
                RETURN QUERY SELECT 2, NULL::bigint, NULL::bytea, NULL::bigint;
                RETURN;
            END IF;
            SELECT s.version, s.head_hash INTO v_version, v_hash
              FROM {schema}.ares_streams s WHERE s.stream_id = p_stream;
            IF coalesce(v_version, 0) <> p_base
               OR (v_version IS NOT NULL AND v_hash IS DISTINCT FROM p_base_hash) THEN
                RETURN QUERY SELECT 1, coalesce(v_version, 0), v_hash, NULL::bigint;
                RETURN;
            END IF;
            v_xid := pg_current_xact_id()::text::bigint;
            INSERT INTO {schema}.ares_events (position, stream_id, version, event_id, type,
                module, payload, payload_ref, metadata, recorded_at, prev_hash, hash)
            SELECT v_xid * 65536 + x.i - 1, p_stream, p_base + x.i, x.e::uuid, x.t, x.m,
                   x.p, x.r, x.md, x.a, x.ph, x.h
              FROM unnest(p_ids, p_types, p_modules, p_payloads, p_refs, p_metas, p_ats,
                          p_prevs, p_hashes)
                   WITH ORDINALITY AS x(e, t, m, p, r, md, a, ph, h, i);
            INSERT INTO {schema}.ares_streams AS s (stream_id, version, head_hash)
            VALUES (p_stream, p_base + v_n, p_hashes[v_n])
            ON CONFLICT (stream_id) DO UPDATE
               SET version = excluded.version, head_hash = excluded.head_hash;
            IF p_channel IS NOT NULL THEN  -- NULL: the store was opened with notify=false
                PERFORM pg_notify(p_channel, (v_xid * 65536 + v_n - 1)::text);
            END IF;
            RETURN QUERY SELECT 0, p_base + v_n, p_hashes[v_n], v_xid;
        END
        $fn$""",
    ),
    # 3 -> 4: tracking records (a consumer's exactly-once bookmark, written in the same
    # transaction as the events of an append_many; one row per name, only increasing).
    (
        """CREATE TABLE {schema}.ares_tracking (
            name     text   PRIMARY KEY,
            position bigint NOT NULL
        )""",
    ),
    # 4 -> 5: snapshot seals (a MAC under the chain key in keyed stores, else a digest,
    # over every field recovery trusts; NULL in snapshots written before).
    ("ALTER TABLE {schema}.ares_snapshots ADD COLUMN seal bytea",),
    # 5 -> 6: the fast path of an append is one plain statement now (issue 14), which
    # guards the predicted head with the head row itself (see PostgresAppendProtocol);
    # ares_append() cost a plpgsql call and a re-plan of its statements on every call
    # (force_custom_plan, ~100 us) and has no caller left.
    (
        """DROP FUNCTION IF EXISTS {schema}.ares_append(text, bigint, bytea, text, text[],
            text[], text[], bytea[], text[], bytea[], text[], bytea[], bytea[])""",
    ),
)
