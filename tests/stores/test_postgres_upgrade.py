"""PostgreSQL: the one-statement fast path of schema step 6 (issue 14).

A store written under schema version 5 (appends through the plpgsql ``ares_append()``)
is upgraded in place and keeps its chains; the plain statement that replaced the
function keeps the protocol's guarantees: a late commit is never skipped by read_all, a
stale head prediction or a reused event id writes nothing.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import ares_events as ae
from ares_events.core.backend import Batch, Head
from ares_events.core.events import prepare, utc_now_at
from ares_events.core.recorder import backend_of
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
    rec = backend_of(rec)  # the backend under the archive reader
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


def _functions(db_url: str, schema: str) -> list[str]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = %s ORDER BY 1",
            (schema,),
        ).fetchall()
    return [r[0] for r in rows]


def test_a_version_5_store_is_upgraded_in_place(postgres_url: str, postgres_db_url: str) -> None:
    """Events written by the old function stay verifiable; the upgraded store appends to
    the same chains (one event and batches, new and existing streams), records version 6
    and no longer has the function."""
    schema = _schema_of(postgres_url)
    _make_v5_store(postgres_db_url, schema)
    _v5_append(postgres_db_url, schema, "old", 3)
    assert _functions(postgres_db_url, schema) == ["ares_append"]
    with ae.open_store(postgres_url) as store:
        assert _rec(store).schema_version() == SCHEMA_VERSION == 6
        assert store.stream_version("old") == 3
        store.append("old", [_ev(3)], expected_version=3)
        store.append("old", [_ev(4), _ev(5)], expected_version=4)
        store.append("new", [_ev(0)])
        store.append("new2", [_ev(0), _ev(1)])
        assert [e.version for e in store.read("old")] == [1, 2, 3, 4, 5, 6]
        for sid in ("old", "new", "new2"):
            assert verify_stream(store, sid).ok
    assert _functions(postgres_db_url, schema) == []


def test_a_batch_on_a_predicted_head_never_lets_read_all_skip_its_late_commit(
    postgres_url: str, postgres_db_url: str
) -> None:
    """The fast statement for a batch on an existing stream, run by hand in a transaction
    left open, holds back a later committed append from read_all; after its commit both
    come back once, in order, and the chain verifies."""
    with ae.open_store(postgres_url) as store, psycopg.connect(postgres_db_url) as raw:
        rec = _rec(store)
        store.append("early", [_ev(0)])
        start = store.last_position()
        head = store.head("early")
        assert head is not None
        batch = Batch("early", prepare("early", [_ev(1), _ev(2)], utc_now_at()), None)
        row = raw.execute(*rec._fast_statement(batch, batch.seal(head), head)).fetchone()
        assert row is not None and row[0] is not None  # written, not committed
        late = store.append("late", [_ev(9)])
        assert list(store.read_all(after_position=start)) == []
        raw.commit()
        _wait_until(lambda: store.last_position() >= late.position, "both to be visible")
        got = [(e.stream_id, e.version, e.position) for e in store.read_all(after_position=start)]
        assert got == [
            ("early", 2, row[0] - 1),
            ("early", 3, row[0]),
            ("late", 1, late.position),
        ]
        assert verify_stream(store, "early").ok


def test_a_stale_prediction_or_a_used_id_writes_nothing(postgres_url: str) -> None:
    """The fast statement on a head that moved (or on a stream that exists when it
    predicted none) returns NULL; with an event id already stored it fails; neither
    writes anything. Through the store, both end in the locked path."""
    with ae.open_store(postgres_url) as store:
        rec = _rec(store)
        store.append("s", [_ev(0)])
        store.append("s", [_ev(1)])
        before = [(e.stream_id, e.version, e.hash) for e in store.read_all()]
        stale_head = Head(1, next(iter(store.read("s"))).hash)
        for head in (None, stale_head):
            for n in (1, 2):
                b = Batch("s", prepare("s", [_ev(i) for i in range(n)], utc_now_at()), None)
                with rec.connection() as conn:
                    row = conn.execute(*rec._fast_statement(b, b.seal(head), head)).fetchone()
                assert row == (None, None)
        used = Batch("u", prepare("u", [_ev(7)], utc_now_at()), None)
        first = next(iter(store.read("s")))
        used.events[0] = replace(used.events[0], event_id=first.event_id_str)
        with rec.connection() as conn, pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(*rec._fast_statement(used, used.seal(None), None))
        assert [(e.stream_id, e.version, e.hash) for e in store.read_all()] == before
        # Through the store: the same id re-appended is a ConcurrencyError (another
        # stream), an exact re-append is idempotent.
        again = store.append(
            "s",
            [
                ae.NewEvent(
                    type="t",
                    module="m",
                    payload={"n": 1},
                    event_id=list(store.read("s"))[1].event_id,
                )
            ],
        )
        assert again.duplicate and again.version == 2
        assert [(e.stream_id, e.version, e.hash) for e in store.read_all()] == before


_RACER = """
import sys, time, pathlib
import ares_events as ae
url, proc, n, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), pathlib.Path(sys.argv[4])
with ae.open_store(url) as store:
    store.append(f"own-{proc}", [ae.NewEvent(type="t", module="m")])  # open, warm up
    pathlib.Path(f"{go}.ready.{proc}").touch()
    while not go.exists():
        time.sleep(0.002)
    for k in range(n):
        size = 1 + (k + proc) % 3  # one-event and batch statements, first and next heads
        store.append("shared", [ae.NewEvent(type="t", module="m", payload={"p": proc, "k": k,
                                                                             "i": i})
                                for i in range(size)])
        store.append(f"own-{proc}", [ae.NewEvent(type="t", module="m", payload={"k": k})])
print("ok")
"""


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
def test_processes_racing_the_fast_statement_and_the_locked_path_never_fork(
    postgres_url: str, tmp_path: Path
) -> None:
    """Real processes appending with ANY to one shared stream (each predicts the head its
    own last append left, so most predictions are stale and go to the locked path while
    others' fast statements commit) and to streams of their own: every append succeeds,
    nothing is lost or duplicated, the shared chain is one unforked chain."""
    procs, n = 4, 60
    go = tmp_path / "go"
    children = [
        subprocess.Popen(  # this Python running the code above
            [sys.executable, "-c", _RACER, postgres_url, str(p), str(n), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for p in range(procs)
    ]
    try:
        _wait_until(
            lambda: (
                all((tmp_path / f"go.ready.{p}").exists() for p in range(procs))
                or any(c.poll() is not None for c in children)
            ),
            "the children to be ready",
        )
        go.touch()
        outs = [c.communicate(timeout=DEADLINE * 4) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
    for c, (out, err) in zip(children, outs, strict=True):
        assert c.returncode == 0 and out.strip() == b"ok", err.decode()[-2000:]
    with ae.open_store(postgres_url) as store:
        evs = list(store.read("shared"))
        sizes = [1 + (k + p) % 3 for p in range(procs) for k in range(n)]
        assert [e.version for e in evs] == list(range(1, sum(sizes) + 1))
        got = sorted((e.payload["p"], e.payload["k"], e.payload["i"]) for e in evs)
        assert got == sorted(
            (p, k, i) for p in range(procs) for k in range(n) for i in range(1 + (k + p) % 3)
        )
        # a batch stays contiguous: its events have consecutive versions and positions
        by_batch: dict[tuple[int, int], list[ae.RecordedEvent]] = {}
        for e in evs:
            by_batch.setdefault((e.payload["p"], e.payload["k"]), []).append(e)
        for batch in by_batch.values():
            assert [e.version for e in batch] == list(
                range(batch[0].version, batch[0].version + len(batch))
            )
            assert [e.position for e in batch] == list(
                range(batch[0].position, batch[0].position + len(batch))
            )
        for p in range(procs):
            assert store.stream_version(f"own-{p}") == n + 1
        assert ae.integrity.audit(store).ok
