"""The SQLite recorder's native write path (``_native.SQLiteWriter``, issue 33): the rows,
heads and outcomes it writes are exactly the Python path's, it hands every unusual case
back to that path, and it maps SQLite's errors the same way."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.chain import ChainKey, _native
from ares_events.core.backend import Batch
from ares_events.core.events import ExpectedVersion, prepare, utc_now_at
from ares_events.core.recorder import backend_of
from ares_events.errors import ConcurrencyError, StoreClosed, StoreUnavailable
from ares_events.stores.sqlite import SQLiteRecorder
from ares_events.stores.sqlite import writes as sqlite_writes
from tests.fixtures.tier import examples

pytestmark = pytest.mark.skipif(
    not sqlite_writes.NATIVE_WRITES,
    reason="needs the C extension (pip install -e . builds it) on CPython",
)


def _ev(n: int, **kw: Any) -> ae.NewEvent:
    return ae.NewEvent(type=kw.pop("type", "t"), module="m", payload={"n": n}, **kw)


def _dump(path: Path) -> tuple[list[Any], list[Any]]:
    with contextlib.closing(sqlite3.connect(path)) as c:
        return (
            c.execute("SELECT * FROM ares_events ORDER BY position").fetchall(),
            c.execute("SELECT * FROM ares_streams ORDER BY stream_id").fetchall(),
        )


def _rec(store: ae.EventStore) -> SQLiteRecorder:
    rec = backend_of(store.recorder)
    assert isinstance(rec, SQLiteRecorder)
    return rec


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ae.EventStore]:
    with ae.open_store(f"sqlite:///{tmp_path / 'events.db'}") as s:
        yield s


def test_file_stores_write_natively_and_the_switches_turn_it_off(
    store: ae.EventStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file store's appends go through the writer; an in-memory store, a store opened
    while NATIVE_WRITES is off, and a process with ARES_EVENTS_NO_NATIVE=1 do not."""
    store.append("s", [_ev(0)])
    assert _rec(store)._writer() is not None
    with ae.open_store("sqlite://") as mem:  # shared between threads under one lock
        mem.append("s", [_ev(0)])
        assert _rec(mem)._writer() is None
    monkeypatch.setattr(sqlite_writes, "NATIVE_WRITES", False)
    with ae.open_store(f"sqlite:///{tmp_path / 'off.db'}") as off:
        off.append("s", [_ev(0)])
        assert _rec(off)._writer() is None
    code = "import ares_events.stores.sqlite.writes as w; print(w.NATIVE_WRITES)"
    env = {**os.environ, "ARES_EVENTS_NO_NATIVE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


class _Proxy:
    """What an instrumented ``sqlite3.connect`` (OpenTelemetry's, wrapt's ObjectProxy)
    returns: it forwards every call and claims the Connection class."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        object.__setattr__(self, "_conn", conn)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return sqlite3.Connection


def test_an_instrumented_connection_takes_the_python_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy from a patched ``sqlite3.connect`` passes ``isinstance`` but holds no
    handle: appends go through it on the Python path and are read back whole."""
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **kw: _Proxy(real(*a, **kw)))
    with ae.open_store(f"sqlite:///{tmp_path / 'events.db'}") as s:
        assert isinstance(_rec(s)._conn(), sqlite3.Connection)
        s.append("s", [_ev(0), _ev(1)])
        s.append("s", [_ev(2)], expected_version=2)
        assert _rec(s)._writer() is None
        assert [e.payload["n"] for e in s.read("s")] == [0, 1, 2]
        assert ae.integrity.verify_stream(s, "s").ok
    with contextlib.closing(real(":memory:")) as conn, pytest.raises(TypeError, match="needs a"):
        sqlite_writes.new_writer(_Proxy(conn))  # type: ignore[arg-type]
    # Instrumented before the import: the check opens its probe from the class itself.
    code = (
        "import sqlite3\n"
        "sqlite3.connect = lambda *a, **kw: (_ for _ in ()).throw(AssertionError('used'))\n"
        "import ares_events.stores.sqlite.writes as w; print(w.NATIVE_WRITES)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"


# One step of a history: (stream index, expected version code, events' shapes).
_event = st.tuples(
    st.sampled_from(["t", "u"]),  # type: equal types share their values in one statement
    st.sampled_from([None, {}, {"k": "v"}]),  # metadata
    st.integers(0, 3),  # payload
)
_step = st.tuples(
    st.integers(0, 2),
    st.sampled_from(["right", "wrong", "any", "no_stream", "exists"]),
    st.one_of(
        st.lists(_event, min_size=1, max_size=4),
        st.lists(_event, min_size=60, max_size=140),  # past one 64-row statement
    ),
    st.booleans(),  # re-append this step's batch (an idempotent retry)
)


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(_step, min_size=1, max_size=8), keyed=st.booleans())
def test_rows_outcomes_and_errors_match_the_python_path(
    tmp_path_factory: pytest.TempPathFactory, steps: list[Any], keyed: bool
) -> None:
    """The same batches appended by both paths give the same outcomes (versions,
    positions, duplicates, the same ConcurrencyError) and byte-identical tables."""
    d = tmp_path_factory.mktemp("paths")
    key = ChainKey(bytes(range(32))) if keyed else None
    fast = SQLiteRecorder(d / "fast.db")
    slow = SQLiteRecorder(d / "slow.db")
    slow._local.writer = None  # this thread's appends take the Python path
    try:
        for sidx, how, shapes, again in steps:
            sid = f"stream-{sidx}"
            version = fast.head(sid)
            current = 0 if version is None else version.version
            choices: dict[str, ExpectedVersion] = {
                "right": current,
                "wrong": current + 1,
                "any": ae.ANY,
                "no_stream": ae.NO_STREAM,
                "exists": ae.STREAM_EXISTS,
            }
            expected = choices[how]
            events = [
                ae.NewEvent(type=t, module="m", payload={"n": p}, metadata=m) for t, m, p in shapes
            ]
            batch = Batch(sid, prepare(sid, events, utc_now_at()), key)
            for _ in range(2 if again else 1):
                outcomes: list[Any] = []
                for rec in (fast, slow):
                    try:
                        out = rec.append(batch, expected)
                        outcomes.append((out.version, out.position, out.duplicate, len(out.events)))
                    except ConcurrencyError as exc:
                        outcomes.append(str(exc))
                assert outcomes[0] == outcomes[1]
        assert slow._writer() is None and fast._writer() is not None
    finally:
        fast.close()
        slow.close()
    assert _dump(d / "fast.db") == _dump(d / "slow.db")


def test_reused_event_ids_are_duplicates_or_conflicts(store: ae.EventStore) -> None:
    """An exact re-append returns the original result without writing; a reused id with
    other content is a ConcurrencyError, and nothing of that batch is written."""
    first = store.append("s", [_ev(0), _ev(1)], expected_version=ae.NO_STREAM)
    events = list(store.read("s"))
    again = [
        ae.NewEvent(type="t", module="m", payload={"n": n}, event_id=e.event_id)
        for n, e in enumerate(events)
    ]
    dup = store.append("s", again, expected_version=ae.NO_STREAM)
    assert dup.duplicate and (dup.version, dup.position) == (first.version, first.position)
    changed = [ae.NewEvent(type="t", module="m", payload={"n": 9}, event_id=events[0].event_id)]
    with pytest.raises(ConcurrencyError):
        store.append("s", changed)
    assert store.stream_version("s") == 2
    assert ae.integrity.verify_stream(store, "s").ok


def test_a_failed_statement_rolls_back_and_the_store_goes_on(store: ae.EventStore) -> None:
    """A full database (SQLITE_FULL from the writer's INSERT) is StoreUnavailable, writes
    nothing, and leaves the connection out of any transaction: the next append works."""
    store.append("s", [_ev(0)])
    conn = _rec(store).connection()  # this thread's connection, the writer's too
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages + 1}")
    big = [ae.NewEvent(type="t", module="m", payload={"x": "y" * 3000}) for _ in range(40)]
    with pytest.raises(StoreUnavailable) as ei:
        store.append("s", big)
    assert "full" in str(ei.value)
    assert not conn.in_transaction
    conn.execute("PRAGMA max_page_count = 4294967294")
    assert store.stream_version("s") == 1
    assert store.append("s", [_ev(1)], expected_version=1).version == 2
    assert ae.integrity.verify_stream(store, "s").ok


def test_spilled_payloads_take_the_python_path(tmp_path: Path) -> None:
    """A batch with a payload in the blob store (which the C pass does not seal) is
    appended by the Python path inside the same call, and reads back whole."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url, blobs=f"file://{tmp_path / 'blobs'}", spill_threshold=64) as s:
        s.append("s", [_ev(0)])
        s.append("s", [ae.NewEvent(type="t", module="m", payload={"x": "y" * 500}), _ev(2)])
        got = list(s.read("s"))
        assert [e.payload_ref is not None for e in got] == [False, True, False]
        assert got[1].payload == {"x": "y" * 500}
        assert ae.integrity.verify_stream(s, "s").ok


def test_threads_share_a_store_each_with_its_own_writer(store: ae.EventStore) -> None:
    """Eight threads appending at once (own streams and one shared stream, optimistic
    retries on the shared one): every event is there once, each chain verifies, and the
    global positions have no gap."""
    rounds = 40

    def work(k: int) -> None:
        for i in range(rounds):
            store.append(f"own-{k}", [_ev(i)], expected_version=i)
            while True:
                v = store.stream_version("shared")
                try:
                    store.append("shared", [_ev(i)], expected_version=v)
                    break
                except ConcurrencyError:
                    continue

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.stream_version("shared") == 8 * rounds
    assert all(store.stream_version(f"own-{k}") == rounds for k in range(8))
    positions = [e.position for e in store.read_all()]
    assert positions == list(range(1, 16 * rounds + 1))
    assert ae.integrity.audit(store).ok


def test_closed_store_refuses_appends(tmp_path: Path) -> None:
    """After close, an append is StoreClosed (the writer's statements are finalized before
    the connections close)."""
    s = ae.open_store(f"sqlite:///{tmp_path / 'e.db'}")
    s.append("s", [_ev(0)])
    rec = _rec(s)
    writer = rec._writer()
    s.close()
    with pytest.raises(StoreClosed):
        s.append("s", [_ev(1)])
    # A writer whose connection is gone hands every append back (None): never a crash.
    assert writer.append("s", b'"s"', 1, [], None) is None
    assert _native is not None


@pytest.mark.parametrize("head_hash", [b"short", "x" * 32, b"", 7])
def test_a_tampered_head_is_handed_to_the_python_path(tmp_path: Path, head_hash: Any) -> None:
    """A stream head whose hash is not 32 bytes (a tampered file) is left to the Python
    path: both paths write the same rows, or fail the same way."""
    results: list[Any] = []
    first = Batch("s", prepare("s", [_ev(0)], "2026-12-06T05:00:00.000000Z"), None)
    second = Batch("s", prepare("s", [_ev(1)], "2026-12-06T05:00:01.000000Z"), None)
    for name, native in (("fast", True), ("slow", False)):
        path = tmp_path / f"{name}.db"
        rec = SQLiteRecorder(path)
        if not native:
            rec._local.writer = None
        try:
            rec.append(first, ae.NO_STREAM)
            with contextlib.closing(sqlite3.connect(path)) as c, c:
                c.execute("UPDATE ares_streams SET head_hash = ?", (head_hash,))
            try:
                out = rec.append(second, 1)
                results.append(("ok", out.version, out.position))
            except Exception as exc:  # compared between the paths
                results.append((type(exc).__name__, str(exc)))
        finally:
            rec.close()
    assert results[0] == results[1]
    assert _dump(tmp_path / "fast.db") == _dump(tmp_path / "slow.db")
