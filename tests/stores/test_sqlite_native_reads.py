"""The SQLite recorder's native read (``SQLiteWriter.rows``, issue 33): every read returns
exactly what ``conn.execute(sql, args).fetchall()`` returns, raises what it raises, and
hands back (None) what it does not take, so the Python path decides."""

from __future__ import annotations

import contextlib
import gc
import math
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import StoreError
from ares_events.stores.sqlite import SQLiteRecorder
from ares_events.stores.sqlite import sql as sqlite_sql
from ares_events.stores.sqlite import writes as sqlite_writes
from tests.fixtures.tier import examples

pytestmark = pytest.mark.skipif(
    not sqlite_writes.NATIVE_WRITES,
    reason="needs the C extension (pip install -e . builds it) on CPython",
)


def _rec(store: ae.EventStore) -> SQLiteRecorder:
    rec = backend_of(store.recorder)
    assert isinstance(rec, SQLiteRecorder)
    return rec


def _fields(e: ae.RecordedEvent) -> tuple[Any, ...]:
    return (
        e.stream_id, e.version, e.position, e.event_id, e.type, e.module, e.payload,
        e.metadata, e.at, e.prev_hash, e.hash, e.payload_ref,
    )  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    """Equal values of equal types (a NaN equals a NaN)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ae.EventStore]:
    with ae.open_store(f"sqlite:///{tmp_path / 'events.db'}") as s:
        yield s


_value = st.one_of(
    st.none(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=300),
    st.binary(max_size=300),
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(_value, _value, _value), max_size=40), cut=st.integers(0, 45))
def test_rows_are_fetchall_for_any_values(tmp_path_factory: Any, rows: Any, cut: int) -> None:
    """Integers, floats, text of any code point, blobs (empty ones too) and NULLs come back
    as fetchall gives them, in its order, with a bound parameter applied."""
    path = tmp_path_factory.mktemp("rows") / "events.db"
    with ae.open_store(f"sqlite:///{path}") as s:
        rec = _rec(s)
        conn, w = rec._conn(), rec._writer()
        assert w is not None
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, a, b, c)")
        conn.executemany("INSERT INTO t (a, b, c) VALUES (?, ?, ?)", rows)
        sql = "SELECT a, b, c, k FROM t WHERE k > ? ORDER BY k"
        got, want = w.rows(sql, (cut,)), conn.execute(sql, (cut,)).fetchall()
        assert got is not None and len(got) == len(want)
        for g, r in zip(got, want, strict=True):
            assert type(g) is tuple and all(_same(x, y) for x, y in zip(g, r, strict=True))
        assert (
            w.rows("SELECT count(*), 1.5, NULL, x'', '' FROM t", ())
            == conn.execute("SELECT count(*), 1.5, NULL, x'', '' FROM t").fetchall()
        )


def _history(s: ae.EventStore) -> None:
    for i in range(30):
        s.append(
            f"agent-{i % 4}",
            [
                ae.NewEvent(
                    type="step.done",
                    module="m",
                    payload={"i": i, "text": "é" * (i * 50), "ok": i % 3 == 0},
                    metadata={"trace": f"t{i}"} if i % 2 else {},
                )
                for _ in range(1 + i % 3)
            ],
        )


def test_every_read_of_the_store_matches_the_python_path(
    store: ae.EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read statement of the recorder, by the writer and by fetchall, on a store with
    several streams, metadata and payloads past a page; then the store's reads as a user
    sees them, with the native read on and off."""
    _history(store)
    rec = _rec(store)
    conn, w = rec._conn(), rec._writer()
    assert w is not None
    reads = [
        (sqlite_sql.SELECT_STREAM, ("agent-1", 1, 2**62, 0, 2**63 - 1, 5)),
        (sqlite_sql.SELECT_ALL, (3, 100)),
        (sqlite_sql.SELECT_ALL_RANGE, (0, "agent-1", "agent-3", 100)),
        (sqlite_sql.SELECT_POSITIONS, (0, 1000)),
        (sqlite_sql.SELECT_HEAD, ("agent-2",)),
        (sqlite_sql.SELECT_HEADS, ("", 10)),
        (sqlite_sql.SELECT_LAST_POSITION, ()),
        (sqlite_sql.SELECT_META, ("schema_version",)),
    ]
    for sql, args in reads:
        want = conn.execute(sql, args).fetchall()
        assert want, sql
        assert w.rows(sql, args) == want, sql

    def seen() -> Any:
        return (
            [_fields(e) for e in store.read_all()],
            {sid: [_fields(e) for e in store.read(sid)] for sid, _ in store.streams()},
            list(store.streams_page(prefix="agent-", limit=2)),
            [_fields(e) for e in store.read("agent-3", from_version=4, limit=3)],
        )

    native = seen()
    monkeypatch.setattr(
        sqlite_writes, "rows", lambda _w, c, sql, args: c.execute(sql, args).fetchall()
    )
    assert seen() == native
    assert ae.integrity.verify_stream(store, "agent-0").ok


def test_what_it_does_not_take_goes_to_sqlite3(store: ae.EventStore) -> None:
    """A parameter count that does not match, values sqlite3 binds its own way (a bool, a
    float, an int past 64 bits) and text that is not UTF-8 are handed back: None."""
    rec = _rec(store)
    conn, w = rec._conn(), rec._writer()
    assert w is not None
    sql = "SELECT ? + 0"
    assert w.rows(sql, ()) is None
    assert w.rows(sql, (1, 2)) is None
    assert w.rows(sql, (True,)) is None
    assert w.rows(sql, (1.25,)) is None
    assert w.rows(sql, (2**64,)) is None
    assert w.rows(sql, (7,)) == [(7,)]  # the statement is whole after each hand-back
    conn.execute("CREATE TABLE bad (t TEXT)")
    conn.execute("INSERT INTO bad VALUES (CAST(x'ff' AS TEXT))")
    assert w.rows("SELECT t FROM bad", ()) is None
    with pytest.raises(sqlite3.OperationalError, match="decode"):
        sqlite_writes.rows(w, conn, "SELECT t FROM bad", ())


def test_errors_are_sqlite3s(store: ae.EventStore) -> None:
    """A statement that does not prepare, and one interrupted from another thread while it
    runs (what close() does after its grace), raise the exception sqlite3 raises, with its
    error code; the statement and the connection are whole after."""
    rec = _rec(store)
    conn, w = rec._conn(), rec._writer()
    assert w is not None
    with pytest.raises(sqlite3.OperationalError, match="no such table") as native:
        w.rows("SELECT * FROM nowhere", ())
    with pytest.raises(sqlite3.OperationalError) as python:
        conn.execute("SELECT * FROM nowhere")
    assert native.value.sqlite_errorcode == python.value.sqlite_errorcode
    endless = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
        "SELECT count(*) FROM c WHERE x < ?"
    )
    timer = threading.Timer(0.2, conn.interrupt)  # the steps let other threads run
    timer.start()
    with pytest.raises(sqlite3.OperationalError, match="interrupt") as stopped:
        w.rows(endless, (0,))
    timer.join()
    assert stopped.value.sqlite_errorcode == sqlite3.SQLITE_INTERRUPT
    store.append("s", [ae.NewEvent(type="t", module="m", payload={})])
    assert (
        w.rows(sqlite_sql.SELECT_HEAD, ("s",))
        == conn.execute(sqlite_sql.SELECT_HEAD, ("s",)).fetchall()
    )


def test_a_read_only_store_reads_natively_and_still_refuses_appends(tmp_path: Path) -> None:
    path = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{path}") as s:
        _history(s)
        want = [_fields(e) for e in s.read_all()]
    with ae.open_store(f"sqlite:///{path}", read_only=True) as ro:
        assert [_fields(e) for e in ro.read_all()] == want
        assert _rec(ro)._writer() is not None
        with pytest.raises(StoreError, match="read-only"):
            ro.append("x", [ae.NewEvent(type="t", module="m", payload={})])


def test_threads_read_while_one_appends(store: ae.EventStore) -> None:
    """Readers on their own connections while a writer appends: each read is a prefix of
    the stream, whole and verified, and the last read sees every event."""
    store.append("s", [ae.NewEvent(type="t", module="m", payload={"n": 0})])
    stop = threading.Event()
    failures: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                ns = [e.payload["n"] for e in store.read("s")]
                assert ns == list(range(len(ns)))
                assert ae.integrity.verify_stream(store, "s").ok
        except BaseException as exc:
            failures.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for t in readers:
        t.start()
    for n in range(1, 150):
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"n": n})], expected_version=n)
    stop.set()
    for t in readers:
        t.join()
    assert failures == []
    assert [e.payload["n"] for e in store.read("s")] == list(range(150))


def test_a_damaged_schema_reads_what_it_can(tmp_path: Path) -> None:
    """A file whose head table was dropped (tampering, a bad restore): the writer's
    statements do not prepare, so the thread takes the Python path, whose reads of the
    events work and whose head reads fail as before."""
    path = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{path}") as s:
        _history(s)
        want = [_fields(e) for e in s.read_all()]
    with contextlib.closing(sqlite3.connect(path)) as c, c:
        c.execute("DROP TABLE ares_streams")
    with ae.open_store(f"sqlite:///{path}", read_only=True) as ro:
        assert [_fields(e) for e in ro.read_all()] == want
        assert _rec(ro)._writer() is None
        with pytest.raises(StoreError, match="ares_streams"):
            ro.stream_version("agent-1")


def test_a_utf16_file_reads_the_same(tmp_path: Path) -> None:
    """A file made with UTF-16 text (a user who made it first, as configuration.md says
    for the page size): text comes back converted, not as the file's bytes."""
    path = tmp_path / "events.db"
    with contextlib.closing(sqlite3.connect(path)) as pre:
        pre.execute("PRAGMA encoding = 'UTF-16le'")
        pre.execute("CREATE TABLE notes (x)")  # the encoding is fixed by the first table
    with ae.open_store(f"sqlite:///{path}") as s:
        s.append("ünïcode-stream", [ae.NewEvent(type="t.é", module="m", payload={"x": "ü"})])
        rec = _rec(s)
        conn, w = rec._conn(), rec._writer()
        assert conn.execute("PRAGMA encoding").fetchone()[0] == "UTF-16le"
        assert w is not None
        assert (
            w.rows(sqlite_sql.SELECT_ALL, (0, 10))
            == conn.execute(sqlite_sql.SELECT_ALL, (0, 10)).fetchall()
        )
        [e] = list(s.read("ünïcode-stream"))
        assert (e.stream_id, e.type, e.payload) == ("ünïcode-stream", "t.é", {"x": "ü"})
        assert ae.integrity.verify_stream(s, "ünïcode-stream").ok


def test_a_read_inside_a_read_goes_to_fetchall(store: ae.EventStore) -> None:
    """A finalizer that the collector runs inside a read and that reads this thread's
    store: the inner read takes the Python path, and neither read sees the other's rows.
    (On 3.11 the collector runs at the read's first allocation, inside the native call;
    3.12 and later run it between bytecodes, here right after the call returns.)"""
    _history(store)
    rec = _rec(store)
    w = rec._writer()
    assert w is not None
    outer_args = (0, 7)
    want = rec._conn().execute(sqlite_sql.SELECT_ALL, outer_args).fetchall()
    inner_want = [_fields(e) for e in store.read_all()]
    inner: list[Any] = []
    state = {"in rows": False}

    class Reader:
        def __init__(self) -> None:
            self.me = self  # a cycle: only the collector frees it

        def __del__(self) -> None:
            inner.append((state["in rows"], [_fields(e) for e in store.read_all()]))

    old = gc.get_threshold()
    try:
        gc.collect()
        reader = Reader()
        gc.set_threshold(1)
        del reader  # garbage now; the next allocation collects it
        state["in rows"] = True
        got = w.rows(sqlite_sql.SELECT_ALL, outer_args)
        state["in rows"] = False
    finally:
        gc.set_threshold(*old)
        gc.collect()
    assert inner == [(True, inner_want)]  # it ran inside the read and read everything
    assert got == want
