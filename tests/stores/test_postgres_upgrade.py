"""PostgreSQL: the cheaper appends of schema step 6 (issue 14).

A store written under schema version 5 (``ares_append()`` re-planning every call) is
upgraded in place and keeps its chain; the one-event ``ares_append1()`` keeps the
protocol's guarantees (late commits are never skipped, duplicates and stale heads are
reported, not written); the append functions keep generic plans but never plan a
sequential scan.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import psycopg
from psycopg import sql

import ares_events as ae
from ares_events.core.events import prepare, utc_now_at
from ares_events.core.recorder import Batch
from ares_events.integrity import verify_stream
from ares_events.stores._migrations.postgres import MIGRATIONS
from ares_events.stores.postgres import SCHEMA_VERSION, PostgresRecorder

DEADLINE = 60.0  # liveness bound for waits that must end (never a performance threshold)


def _ev(n: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"n": n})


def _schema_of(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&", maxsplit=1)[0]


def _rec(store: ae.EventStore) -> PostgresRecorder:
    rec = store.recorder
    assert isinstance(rec, PostgresRecorder)
    return rec


def _wait_until(cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _make_v5_store(db_url: str, schema: str) -> None:
    """The schema exactly as a version-5 build left it (steps 0..4, version recorded)."""
    q = sql.Identifier(schema)
    with psycopg.connect(db_url, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.SQL("CREATE SCHEMA {s}").format(s=q))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {s}.ares_meta (key text PRIMARY KEY, value text NOT NULL)"
            ).format(s=q)
        )
        for step in MIGRATIONS[:5]:
            for stmt in step:
                conn.execute(sql.SQL(stmt).format(schema=q))
        conn.execute(
            sql.SQL("INSERT INTO {s}.ares_meta VALUES ('schema_version', '5')").format(s=q)
        )


def _v5_append(db_url: str, schema: str, stream_id: str, n: int) -> None:
    """Append ``n`` events with the version-5 ``ares_append()`` (as an old build did)."""
    batch = Batch(stream_id, prepare(stream_id, [_ev(i) for i in range(n)], utc_now_at()), None)
    sealed = batch.seal(None)
    evs = [s.event for s in sealed]
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT r_status FROM {s}.ares_append(%s, 0, ''::bytea, NULL, %s, %s, %s, "
                "%s::bytea[], %s::text[], %s::bytea[], %s, %s::bytea[], %s::bytea[])"
            ).format(s=sql.Identifier(schema)),
            (
                stream_id,
                [e.event_id for e in evs],
                [e.type for e in evs],
                [e.module for e in evs],
                [e.payload_bytes for e in evs],
                [None for _ in evs],
                [e.meta_json for e in evs],
                [e.at for e in evs],
                [s.prev_hash for s in sealed],
                [s.hash for s in sealed],
            ),
        ).fetchone()
    assert row == (0,)


def _function_config(db_url: str, schema: str, name: str) -> list[str] | None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s AND p.proname = %s",
            (schema, name),
        ).fetchone()
    assert row is not None, f"function {name} missing"
    return row[0]  # type: ignore[no-any-return]


def test_a_version_5_store_is_upgraded_in_place(postgres_url: str, postgres_db_url: str) -> None:
    """Events written by the old function stay verifiable; the upgraded store appends to
    the same chains with the new functions and records version 6."""
    schema = _schema_of(postgres_url)
    _make_v5_store(postgres_db_url, schema)
    _v5_append(postgres_db_url, schema, "old", 3)
    assert _function_config(postgres_db_url, schema, "ares_append") == [
        "plan_cache_mode=force_custom_plan"
    ]
    with ae.open_store(postgres_url) as store:
        assert _rec(store).schema_version() == SCHEMA_VERSION == 6
        assert store.stream_version("old") == 3
        store.append("old", [_ev(3)], expected_version=3)  # one event: ares_append1
        store.append("old", [_ev(4), _ev(5)], expected_version=4)  # a batch: ares_append
        store.append("new", [_ev(0)])
        assert [e.version for e in store.read("old")] == [1, 2, 3, 4, 5, 6]
        assert verify_stream(store, "old").ok and verify_stream(store, "new").ok
    for name in ("ares_append", "ares_append1"):
        assert _function_config(postgres_db_url, schema, name) == ["enable_seqscan=off"]


def test_the_one_event_append_never_lets_read_all_skip_a_late_commit(
    postgres_url: str, postgres_db_url: str
) -> None:
    """``ares_append1()`` run by hand in a transaction left open holds back a later
    committed append from read_all; after its commit both come back once, in order."""
    with ae.open_store(postgres_url) as store, psycopg.connect(postgres_db_url) as raw:
        rec = _rec(store)
        batch = Batch("early", prepare("early", [_ev(0)], utc_now_at()), None)
        sealed = batch.seal(None)
        row = raw.execute(
            rec._sql["append_one"], rec._append_one_params(batch, sealed[0], None)
        ).fetchone()  # raw is not autocommit: this transaction stays open
        assert row is not None and row[0] == 0 and row[1] == 1 and row[2] == sealed[0].hash
        late = store.append("late", [_ev(9)])
        assert list(store.read_all()) == []
        raw.commit()
        _wait_until(lambda: store.last_position() >= late.position, "both to be visible")
        got = [(e.stream_id, e.position) for e in store.read_all()]
        assert got == [("early", row[3] * 65536), ("late", late.position)]
        assert verify_stream(store, "early").ok


def test_the_one_event_append_reports_a_moved_head_and_a_used_id(postgres_url: str) -> None:
    """Status 1 (the head is not the predicted one) and 2 (the id is stored) write nothing."""
    with ae.open_store(postgres_url) as store:
        rec = _rec(store)
        first = store.append("s", [_ev(0)])
        stale = Batch("s", prepare("s", [_ev(1)], utc_now_at()), None)
        with rec.connection() as conn:
            row = conn.execute(
                rec._sql["append_one"], rec._append_one_params(stale, stale.seal(None)[0], None)
            ).fetchone()
        head = store.head("s")
        assert head is not None
        assert row == (1, 1, head.hash, None)
        used = Batch("u", prepare("u", [_ev(7)], utc_now_at()), None)
        store.append("t", [ae.NewEvent(type="t", module="m", event_id=used.event_ids[0])])
        with rec.connection() as conn:
            row = conn.execute(
                rec._sql["append_one"], rec._append_one_params(used, used.seal(None)[0], None)
            ).fetchone()
        assert row is not None and row[0] == 2
        assert [e.version for e in store.read("s")] == [first.version]
        assert store.stream_version("u") == 0
