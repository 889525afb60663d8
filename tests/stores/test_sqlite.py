"""SQLite-only behaviour: pragmas, URL forms, multi-process appends, locking, schema
versions and constant-memory reads."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    SchemaVersionError,
    StoreUnavailable,
)
from ares_events.integrity.verify import verify_stream
from ares_events.stores.sqlite import SCHEMA_VERSION, SQLiteRecorder, writes
from ares_events.testing import run_concurrent_appenders, store_state


def _url(path: Path, query: str = "") -> str:
    return f"sqlite:///{path}" + (f"?{query}" if query else "")


def _ev(n: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"n": n})


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Path of a not-yet-created SQLite file."""
    return tmp_path / "events.db"


@pytest.fixture
def sqlite_store(db: Path) -> Iterator[ae.EventStore]:
    """A fresh SQLite store on a file."""
    with ae.open_store(_url(db)) as s:
        yield s


def _recorder(store: ae.EventStore) -> SQLiteRecorder:
    rec = store.recorder
    rec = backend_of(rec)  # the backend under the archive reader
    assert isinstance(rec, SQLiteRecorder)
    return rec


# -- pragmas and parameters ---------------------------------------------------------------


def test_wal_and_synchronous_full_by_default(sqlite_store: ae.EventStore, db: Path) -> None:
    """A new file is in WAL mode and the store's connections use synchronous=FULL."""
    sqlite_store.append("s", [_ev()])
    with contextlib.closing(sqlite3.connect(db)) as other, other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn = _recorder(sqlite_store).connection()
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    seen: list[int] = []
    t = threading.Thread(
        target=lambda: seen.append(
            _recorder(sqlite_store).connection().execute("PRAGMA synchronous").fetchone()[0]
        )
    )
    t.start()
    t.join()
    assert seen == [2]  # every thread's connection, not only the first


@pytest.mark.parametrize(("mode", "value"), [("normal", 1), ("NORMAL", 1), ("extra", 3)])
def test_synchronous_opt_in(db: Path, mode: str, value: int) -> None:
    """?synchronous=normal|extra is honoured."""
    with ae.open_store(_url(db, f"synchronous={mode}")) as s:
        s.append("s", [_ev()])
        assert _recorder(s).connection().execute("PRAGMA synchronous").fetchone()[0] == value


def _file_page_size(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as other:
        return int(other.execute("PRAGMA page_size").fetchone()[0])


def test_new_file_gets_2k_pages_and_a_file_keeps_its_own(db: Path, tmp_path: Path) -> None:
    """A new file is made with 2 KiB pages; a file whose page size is already set (another
    build's store, or one a user made) keeps it, and reads, verifies and appends as before."""
    with ae.open_store(_url(db)) as s:
        s.append("s", [_ev()])
    assert _file_page_size(db) == 2048

    old = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(old)) as pre:
        pre.execute("PRAGMA page_size = 4096")
        pre.execute("PRAGMA journal_mode = WAL")
    with ae.open_store(_url(old)) as s:
        s.append("s", [_ev(n) for n in range(300)])  # more than one page of rows
    assert _file_page_size(old) == 4096
    with ae.open_store(_url(old)) as s:
        s.append("s", [_ev(300)], expected_version=300)
        assert [e.payload["n"] for e in s.read("s")] == list(range(301))
        assert verify_stream(s, "s").ok
    assert _file_page_size(old) == 4096


def test_unknown_parameter_lists_valid_ones(db: Path) -> None:
    """An unknown URL parameter raises ConfigError naming it and listing the valid ones."""
    with pytest.raises(ConfigError) as ei:
        ae.open_store(_url(db, "synchronus=full"))
    msg = str(ei.value)
    assert "synchronus" in msg
    for valid in ("synchronous", "busy_timeout", "page_size", "migrate"):
        assert valid in msg
    assert not db.exists()


@pytest.mark.parametrize(
    "query",
    [
        "synchronous=sometimes",
        "busy_timeout=abc",
        "busy_timeout=0",
        "busy_timeout=-1",
        "page_size=0",
        "page_size=1.5",
        "migrate=maybe",
    ],
)
def test_bad_parameter_values(db: Path, query: str) -> None:
    """A malformed parameter value raises ConfigError naming the store."""
    with pytest.raises(ConfigError) as ei:
        ae.open_store(_url(db, query))
    assert "sqlite" in str(ei.value)


@pytest.mark.parametrize(
    "options",
    [
        {"migrate": "maybe"},
        {"migrate": 2},
        {"page_size": 2.5},
        {"page_size": True},
        {"page_size": 10**30},
        {"page_size": "0"},
        {"busy_timeout": float("nan")},
        {"busy_timeout": "abc"},
        {"busy_timeout": False},
        {"synchronous": 1},
        {"spill_threshold": "ten"},
        {"spill_threshold": 0},
    ],
)
def test_keyword_options_are_held_to_the_urls_rules(db: Path, options: dict[str, Any]) -> None:
    """open_store's keyword options are checked like the URL's parameters: a ConfigError
    naming the option, and no file made (they used to pass unchecked: a raw TypeError, or
    a store that opened and failed on every read)."""
    with pytest.raises(ConfigError, match=next(iter(options))):
        ae.open_store(_url(db), **options)
    assert not db.exists()


def test_migrate_false_as_text_checks_instead_of_migrating(db: Path) -> None:
    """migrate="false" (a string, as from a config file) means what ?migrate=false means:
    the schema is only checked; it used to migrate (a non-empty string is truthy)."""
    for value in ("false", "0", "no", False):
        with pytest.raises(ae.SchemaVersionError):
            ae.open_store(_url(db), migrate=value)
    with ae.open_store(_url(db), migrate="true", page_size="64", busy_timeout="5") as s:
        s.append("s", [_ev()])
        assert _recorder(s).page_size == 64
    with ae.open_store(_url(db), migrate="false") as s:
        assert [e.version for e in s.read("s")] == [1]


def test_host_is_refused(tmp_path: Path) -> None:
    """sqlite://host/x.db is a ConfigError explaining the slash forms."""
    with pytest.raises(ConfigError) as ei:
        ae.open_store("sqlite://somehost/x.db")
    assert "sqlite:///" in str(ei.value)


def test_relative_and_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sqlite:///rel is relative to the working directory; sqlite:////abs is absolute."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    with ae.open_store("sqlite:///sub/rel.db") as rel:
        rel.append("s", [_ev()])
        assert _recorder(rel).path == Path("sub/rel.db")
    assert (work / "sub" / "rel.db").is_file()
    absolute = tmp_path / "elsewhere" / "abs.db"
    url = f"sqlite:///{absolute}"
    assert url.startswith("sqlite:////")
    with ae.open_store(url) as ab:
        ab.append("s", [_ev()])
        assert _recorder(ab).path == absolute
    assert absolute.is_file()
    assert not (work / str(absolute).lstrip("/")).exists()


def test_in_memory_database(tmp_path: Path) -> None:
    """sqlite:// is an in-memory database, shared by the store's threads and private to
    each open."""
    with ae.open_store("sqlite://") as a, ae.open_store("sqlite://") as b:
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                for k in range(20):
                    while True:
                        v = a.stream_version("s")
                        try:
                            a.append("s", [_ev(100 * i + k)], expected_version=v)
                            break
                        except ConcurrencyError:
                            continue
            except BaseException as exc:
                errors.append(exc)

        ts = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not errors, errors
        assert a.stream_version("s") == 80
        assert ae.integrity.audit(a).ok
        assert list(b.streams()) == []
    assert list(tmp_path.iterdir()) == []


def test_memory_name_is_the_in_memory_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:///:memory:`` (sqlite3's and SQLAlchemy's spelling) is the private in-memory
    database, as ``sqlite://``: no file of that name appears in the working directory."""
    monkeypatch.chdir(tmp_path)
    for store in (ae.open_store("sqlite:///:memory:"), ae.open_store("sqlite:///:memory:")):
        with store:
            store.append("s", [_ev()])
            assert _recorder(store).path is None
            assert store.stream_version("s") == 1  # each open is a database of its own
    rec = SQLiteRecorder(":memory:")
    assert rec.path is None
    rec.close()
    assert list(tmp_path.iterdir()) == []


def test_small_pages_read_correctly(db: Path) -> None:
    """Reads that cross page boundaries return exactly the requested range."""
    with ae.open_store(_url(db, "page_size=3")) as s:
        s.append("s", [_ev(i) for i in range(10)])
        s.append("t", [_ev(i) for i in range(4)])
        for from_v, to_v, limit in [
            (1, None, None),
            (2, 9, None),
            (1, None, 3),
            (1, None, 6),
            (4, 6, None),
            (3, None, 7),
            (1, 3, 5),
        ]:
            got = [e.version for e in s.read("s", from_v, to_v, limit)]
            want = list(range(from_v, (to_v or 10) + 1))[:limit]
            assert got == want, (from_v, to_v, limit)
        assert [e.position for e in s.read_all()] == list(range(1, 15))
        assert [e.position for e in s.read_all(after_position=5, limit=6)] == list(range(6, 12))
        assert [sid for sid, _ in s.streams()] == ["s", "t"]


# -- several processes --------------------------------------------------------------------


def _check_clean(url: str, expected: dict[str, int]) -> None:
    with ae.open_store(url) as s:
        assert dict(s.streams()) == expected
        report = ae.integrity.audit(s)
        assert report.ok, report.findings
        assert [e.position for e in s.read_all()] == list(range(1, sum(expected.values()) + 1))
        for sid, n in expected.items():
            assert [e.version for e in s.read(sid)] == list(range(1, n + 1))


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
def test_processes_appending_to_one_stream(db: Path, tmp_path: Path) -> None:
    """4 processes x 200 appends to one stream, retrying on ConcurrencyError: versions
    1..800, each event once, positions gap-free, chain unforked."""
    url = _url(db)
    out = run_concurrent_appenders(
        url, ["shared"], processes=4, appends=200, workdir=tmp_path, pause=0.002
    )
    assert [o["appended"] for o in out] == [200] * 4
    _check_clean(url, {"shared": 800})
    with ae.open_store(url) as s:
        got = sorted((e.payload["proc"], e.payload["k"]) for e in s.read("shared"))
    assert got == [(p, k) for p in range(4) for k in range(200)]


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
def test_processes_appending_to_different_streams(db: Path, tmp_path: Path) -> None:
    """4 processes x 200 appends, one stream each, all at once: nothing lost, every chain
    and the global positions clean, each stream in its process's order."""
    url = _url(db)
    streams = ["p0", "p1", "p2", "p3"]
    run_concurrent_appenders(url, streams, processes=4, appends=200, workdir=tmp_path)
    _check_clean(url, dict.fromkeys(streams, 200))
    with ae.open_store(url) as s:
        for p, sid in enumerate(streams):
            assert [(e.payload["proc"], e.payload["k"]) for e in s.read(sid)] == [
                (p, k) for k in range(200)
            ]


# -- locking ------------------------------------------------------------------------------


def test_lock_held_past_busy_timeout_is_store_unavailable(db: Path) -> None:
    """While another connection holds the write lock past busy_timeout, append raises
    StoreUnavailable, reads still work, nothing is written, and appends resume after."""
    with ae.open_store(_url(db, "busy_timeout=0.2")) as s:
        s.append("s", [_ev(0)])
        before = store_state(s)
        blocker = sqlite3.connect(db, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreUnavailable) as ei:
                s.append("s", [_ev(1)])
            assert "locked" in str(ei.value)
            assert isinstance(ei.value, ConnectionError)
            assert store_state(s) == before  # WAL readers are not blocked by the writer
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert s.append("s", [_ev(1)], expected_version=1).version == 2
        assert ae.integrity.verify_stream(s, "s").ok


def test_creating_a_store_while_locked_is_store_unavailable(db: Path) -> None:
    """Creating the schema in a file that stays write-locked past busy_timeout raises
    StoreUnavailable (a store already at this schema opens without the lock)."""
    with contextlib.closing(sqlite3.connect(db)) as c:
        c.execute("CREATE TABLE other (x)")
    blocker = sqlite3.connect(db, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable):
            ae.open_store(_url(db, "busy_timeout=0.2"))
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


# -- schema versions ----------------------------------------------------------------------


def test_schema_version_recorded(sqlite_store: ae.EventStore, db: Path) -> None:
    """A new file records the current schema version in ares_meta."""
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        row = c.execute("SELECT value FROM ares_meta WHERE key = 'schema_version'").fetchone()
    assert int(row[0]) == SCHEMA_VERSION >= 1


@pytest.mark.parametrize("how", ["option", "url"])
def test_migrate_false_on_fresh_file(db: Path, how: str) -> None:
    """migrate=False on a fresh file raises SchemaVersionError saying how to fix it, and
    leaves no schema behind."""
    with pytest.raises(SchemaVersionError) as ei:
        if how == "option":
            ae.open_store(_url(db), migrate=False)
        else:
            ae.open_store(_url(db, "migrate=false"))
    err = ei.value
    assert (err.found, err.expected) == (0, SCHEMA_VERSION)
    assert "migrate" in str(err)
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "ares_events" not in tables
    with ae.open_store(_url(db)) as s:  # migrating afterwards works
        assert s.append("s", [_ev()]).version == 1
    with ae.open_store(_url(db), migrate=False) as s:  # and a current file opens
        assert s.stream_version("s") == 1


def test_schema_ahead_of_build(sqlite_store: ae.EventStore, db: Path) -> None:
    """A file whose schema is newer than this build raises SchemaVersionError asking to
    upgrade."""
    sqlite_store.close()
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        c.execute("UPDATE ares_meta SET value = ? WHERE key = 'schema_version'", (99,))
    with pytest.raises(SchemaVersionError) as ei:
        ae.open_store(_url(db))
    assert ei.value.found == 99
    assert "upgrade" in str(ei.value)


# -- constant memory ----------------------------------------------------------------------

_COPY_ROWS = """
WITH RECURSIVE k(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM k WHERE n < ?)
INSERT INTO ares_events (position, stream_id, version, event_id, type, module, payload,
                         payload_ref, metadata, recorded_at, prev_hash, hash)
SELECT e.position + k.n * ?, e.stream_id, e.version + k.n * ?,
       printf('%08x-0000-4000-8000-%012x', k.n, e.position), e.type, e.module, e.payload,
       e.payload_ref, e.metadata, e.recorded_at, e.prev_hash, e.hash
FROM ares_events AS e, k
"""


@pytest.mark.slow
def test_reading_200k_events_holds_constant_memory(db: Path) -> None:
    """Iterating a 200k-event stream keeps peak traced memory far below the data size."""
    seed, copies = 2000, 100
    with ae.open_store(_url(db, "synchronous=normal")) as s:
        s.append(
            "big",
            [
                ae.NewEvent(type="t", module="m", payload={"i": i, "pad": "x" * 200})
                for i in range(seed)
            ],
        )
    # The remaining rows are copies of real rows made in SQL: this test is about reading,
    # and appending 200k events through the API would take most of the suite's time.
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        c.execute(_COPY_ROWS, (copies - 1, seed, seed))
        c.execute("UPDATE ares_streams SET version = ?", (seed * copies,))
    with ae.open_store(_url(db)) as s:
        tracemalloc.start()
        try:
            n = size = last = 0
            for e in s.read("big"):
                n += 1
                size += len(e.payload_bytes) + len(e.hash) + len(e.prev_hash) + len(e.at)
                last = e.version
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert n == last == seed * copies
    assert size > 40_000_000
    # A read that materialised the stream would hold all of it at once; a paged one holds
    # one page. Generous bound: a tenth of the data.
    assert peak < size / 10, (peak, size)


def test_a_hash_in_a_path_is_refused_and_an_escaped_one_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite:///runs#1.db is refused (urlsplit would open "runs" for every runs#N.db);
    runs%231.db opens the file runs#1.db, and the URL the store describes itself by opens
    that file again (also with '%' and '?' in the name)."""
    monkeypatch.chdir(tmp_path)
    for bad in ("sqlite:///runs#1.db", "sqlite:///runs#2.db", "postgresql://u:pa#ss@h/db"):
        with pytest.raises(ae.ConfigError, match="%23") as info:
            ae.open_store(bad)
        assert "pa#ss" not in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    for name in ("runs#1.db", "100%?.db"):
        escaped = name.replace("%", "%25").replace("#", "%23").replace("?", "%3F")
        with ae.open_store(f"sqlite:///{escaped}") as store:
            store.append("s", [ae.NewEvent(type="t", module="m", payload={"n": name})])
            again = store.recorder.describe()
        assert (tmp_path / name).exists()
        with ae.open_store(again) as store:
            assert [e.payload["n"] for e in store.read("s")] == [name]


@pytest.mark.parametrize("native", [True, False])
def test_a_locked_write_waits_busy_timeout_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """While another connection holds the write lock, an append tries BEGIN IMMEDIATE
    once (SQLite's busy handler waits busy_timeout through it) and then raises
    StoreUnavailable: a second try would wait the whole timeout again."""
    monkeypatch.setattr(writes, "NATIVE_WRITES", native and writes.NATIVE_WRITES)
    db = tmp_path / "locked.db"
    with ae.open_store(f"sqlite:///{db}?busy_timeout=0.2") as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={})])
        conn = backend_of(store.recorder)._conn()
        begins: list[str] = []
        conn.set_trace_callback(lambda sql: begins.append(sql) if "BEGIN" in sql else None)
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(ae.StoreUnavailable, match=r"locked for more than 0\.2s"):
                store.append("s", [ae.NewEvent(type="t", module="m", payload={})])
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            conn.set_trace_callback(None)
        assert len(begins) == 1, begins
        assert store.stream_version("s") == 1


def test_opening_a_current_store_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    """A store already at this schema opens (and reads) while another connection holds
    the write lock: opening takes the lock only to create or migrate the schema."""
    db = tmp_path / "busy.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={})])
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with ae.open_store(f"sqlite:///{db}?busy_timeout=0.2") as store:
            assert [e.version for e in store.read("s")] == [1]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
