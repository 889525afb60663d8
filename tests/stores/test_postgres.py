"""PostgreSQL-only behaviour against the real server: URL options, schema management,
late-commit ordering of read_all, wake-ups, and failures (killed connection, exhausted
pool, restarted server, statement timeout, secrets never shown)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import psycopg_pool
import pytest
from psycopg import sql

import ares_events as ae
from ares_events.cli import main
from ares_events.core.backend import Batch, Head, SealedEvent
from ares_events.core.events import prepare, utc_now_at
from ares_events.core.recorder import backend_of
from ares_events.core.store import EventStore
from ares_events.errors import (
    ConcurrencyError,
    ConfigError,
    InvalidEvent,
    SchemaVersionError,
    StoreUnavailable,
)
from ares_events.stores.postgres import SCHEMA_VERSION, PostgresRecorder
from tests.fixtures import servers

pytestmark = pytest.mark.postgres

DEADLINE = 60.0  # liveness bound for waits that must end (never a performance threshold)


def _ev(n: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"n": n})


def _with(url: str, **params: object) -> str:
    return url + "".join(f"&{k}={v}" for k, v in params.items())


def _schema_of(url: str) -> str:
    return url.rsplit("schema=", 1)[1].split("&", maxsplit=1)[0]


def _rec(store: EventStore) -> PostgresRecorder:
    rec = store.recorder
    rec = backend_of(rec)  # the backend under the archive reader
    assert isinstance(rec, PostgresRecorder)
    return rec


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[EventStore]:
    """A fresh PostgreSQL store in its own schema."""
    with ae.open_store(postgres_url) as s:
        yield s


@pytest.fixture
def admin(postgres_db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A raw autocommit connection to the session database (locks, termination)."""
    with psycopg.connect(postgres_db_url, autocommit=True) as conn:
        yield conn


def _hold_stream_lock(conn: psycopg.Connection[Any], stream_id: str) -> None:
    conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (stream_id,))


def _release_stream_lock(conn: psycopg.Connection[Any], stream_id: str) -> None:
    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (stream_id,))


def _listening(store: EventStore) -> bool:
    listener = _rec(store)._listener
    return listener is not None and listener.listening


def _wait_until(pred: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not pred():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.01)


def _lock_waiters(admin: psycopg.Connection[Any]) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchall()
    return [r[0] for r in rows]


# -- URL, options and secrets --------------------------------------------------------------


def test_url_options_reach_the_pool_and_libpq(postgres_url: str) -> None:
    """schema, pool sizes and a libpq option (application_name) from the URL are honoured."""
    app = f"ares-test-{uuid.uuid4().hex[:8]}"
    url = _with(postgres_url, pool_min=2, pool_max=3, application_name=app)
    with ae.open_store(url) as store:
        rec = _rec(store)
        assert rec.schema == _schema_of(postgres_url)
        assert (rec.pool.min_size, rec.pool.max_size) == (2, 3)
        with rec.connection() as conn:
            assert conn.execute("SHOW application_name").fetchone() == (app,)
            found = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = %s "
                "AND tablename IN ('ares_events', 'ares_streams', 'ares_snapshots', 'ares_meta')",
                (rec.schema,),
            ).fetchone()
            assert found == (4,)
        assert {c.value for c in store.capabilities} == {
            "persistent",
            "multi_process",
            "wakeups",
            "snapshots",
            "multi_stream_append",
            "erase",
            "metadata",
            "duplicate_scan",
            "position_scan",
            "stream_pages",
            "archive",
            "read_models",
        }


def test_unknown_parameter_lists_the_valid_ones(postgres_url: str) -> None:
    """A parameter that is neither ours nor a libpq option raises ConfigError naming both."""
    with pytest.raises(ConfigError) as info:
        ae.open_store(_with(postgres_url, pool_sise=3))
    msg = str(info.value)
    assert "pool_sise" in msg
    assert "pool_max" in msg
    assert "sslmode" in msg


@pytest.mark.parametrize(
    "params",
    [
        {"pool_max": "many"},
        {"pool_min": 5, "pool_max": 2},
        {"migrate": "maybe"},
        {"pool_timeout": 0},
        {"statement_timeout": "soon"},
    ],
)
def test_bad_parameter_values_raise_config_error(postgres_url: str, params: dict[str, Any]) -> None:
    """Invalid values of our own parameters raise ConfigError naming the parameter."""
    with pytest.raises(ConfigError) as info:
        ae.open_store(_with(postgres_url, **params))
    assert any(k in str(info.value) for k in params)


def test_secret_in_query_string_is_refused_without_echoing_it(postgres_url: str) -> None:
    """password= in the query is refused, and the error does not contain its value."""
    with pytest.raises(ConfigError) as info:
        ae.open_store(_with(postgres_url, password="hunter2hunter2"))
    assert "password" in str(info.value)
    assert "hunter2hunter2" not in str(info.value)


def test_password_with_reserved_characters_is_never_shown(
    postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The percent-encoded password works and appears in no repr, error or log record."""
    pw = servers.TEST_PASSWORD
    assert quote(pw, safe="") in postgres_url
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    with ae.open_store(postgres_url) as store:
        store.append("s", [_ev()])
        texts += [repr(store), store.url, repr(store.recorder), _rec(store).describe()]
        with pytest.raises(ConcurrencyError) as cinfo:
            store.append("s", [_ev()], expected_version=ae.NO_STREAM)
        texts.append(str(cinfo.value))
    for bad in (_with(postgres_url, bogus=1), _with(postgres_url, pool_max="x")):
        with pytest.raises(ConfigError) as info:
            ae.open_store(bad)
        texts.append(str(info.value))
    host = postgres_url.split("@")[1].split("/", maxsplit=1)[0]
    unreachable = postgres_url.replace(f"@{host}", f"@127.0.0.1:{servers.free_port()}")
    with pytest.raises(StoreUnavailable) as uinfo:
        ae.open_store(unreachable)
    texts += [str(uinfo.value), repr(uinfo.value)]
    texts += [r.getMessage() for r in caplog.records]
    for text in texts:
        assert pw not in text
        assert quote(pw, safe="") not in text
        assert quote(pw) not in text
    assert "***" in store.url


NUL_SECRET = "Nul7-secret"


def _control_in(postgres_url: str, field: str) -> str:
    """``postgres_url`` with the password NUL_SECRET and a control character (percent-
    encoded) in ``field``."""
    parts = urlsplit(postgres_url)
    user, host, db = parts.username, parts.netloc.rpartition("@")[2], parts.path
    pw, query = NUL_SECRET, parts.query
    if field == "password":
        pw += "%00tail"
    elif field == "password (tab)":
        pw += "%09tail"
    elif field == "user":
        user = f"{user}%00x"
    elif field == "dbname":
        db += "%00x"
    else:
        query += f"&{field}=a%00b"
    return urlunsplit((parts.scheme, f"{user}:{pw}@{host}", db, query, ""))


@pytest.mark.parametrize(
    "field", ["password", "password (tab)", "user", "dbname", "application_name"]
)
def test_a_control_character_in_a_connection_value_is_refused_unshown(
    postgres_url: str, capsys: pytest.CaptureFixture[str], field: str
) -> None:
    """libpq cuts a value at a NUL, and every option after it (dbname, connect_timeout,
    the read-only option) with it: the store would open in libpq's default database. A
    control character in the user, password, database or a libpq option is a ConfigError
    naming the field (exit 2 in the CLI), the password shown in neither. (create=False: the
    store libpq's default database would otherwise get.)"""
    url = _control_in(postgres_url, field)
    name = field.split(maxsplit=1)[0]
    with pytest.raises(ConfigError, match=f"postgresql {name} holds a control character"):
        ae.open_store(url, create=False)
    assert main(["--store", url, "streams"]) == 2
    out, err = capsys.readouterr()
    assert f"postgresql {name} holds a control character" in err
    with pytest.raises(ConfigError) as info:
        ae.open_store(url, create=False)
    for text in (str(info.value), repr(info.value), out, err):
        assert NUL_SECRET not in text and "tail" not in text


def test_unreachable_server_raises_store_unavailable(postgres_url: str) -> None:
    """Nothing listening on the port: StoreUnavailable naming the redacted URL."""
    port = servers.free_port()
    host = postgres_url.split("@")[1].split("/", maxsplit=1)[0]
    with pytest.raises(StoreUnavailable) as info:
        ae.open_store(postgres_url.replace(f"@{host}", f"@127.0.0.1:{port}"))
    assert f"127.0.0.1:{port}" in str(info.value)


def test_accepts_a_caller_pool_and_leaves_it_open(postgres_db_url: str) -> None:
    """A caller-owned ConnectionPool works, and closing the store does not close it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg_pool.ConnectionPool(
        postgres_db_url, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True
    ) as pool:
        rec = PostgresRecorder(pool, schema=schema)
        with EventStore(rec) as store:
            store.append("s", [_ev(1), _ev(2)])
            assert [e.payload["n"] for e in store.read("s")] == [1, 2]
            assert servers.TEST_PASSWORD not in rec.describe()
        assert not pool.closed
        with pool.connection() as conn:
            assert conn.execute(f'SELECT count(*) FROM "{schema}".ares_events').fetchone() == (2,)


def test_accepts_a_caller_connection(postgres_db_url: str) -> None:
    """A single caller-owned psycopg connection works, including wait_for."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_db_url) as conn:
        rec = PostgresRecorder(conn, schema=schema)
        with EventStore(rec) as store:
            res = store.append("s", [_ev(1)])
            assert store.wait_for(0, timeout=5)
            assert not store.wait_for(res.position, timeout=0.05)
            assert store.stream_version("s") == 1
        assert not conn.closed


def test_schema_name_keeps_its_case(postgres_db_url: str) -> None:
    """A schema name with capitals, digits and '_' is used exactly (quoted, case kept)."""
    schema = f"Ares_{uuid.uuid4().hex[:6].upper()}"
    url = f"{postgres_db_url}?schema={quote(schema)}"
    with ae.open_store(url) as store:
        store.append("s", [_ev()])
        assert store.stream_version("s") == 1
        assert _rec(store).schema == schema
    with ae.open_store(url, migrate=False) as again:
        assert again.stream_version("s") == 1


@pytest.mark.parametrize("schema", ["p%q", "p%%q", "a?b", "we ird", 'q"uote', "x.y", "1abc", ""])
def test_schema_names_that_could_reach_a_placeholder_are_refused(
    postgres_db_url: str, schema: str
) -> None:
    """A schema name that is not a plain identifier ('%', '?', quotes, dots, spaces) is a
    ConfigError naming the rule, before anything is created; 'p%%q' never reads 'p%q'."""
    url = f"{postgres_db_url}?schema={quote(schema)}"
    with pytest.raises(ConfigError, match="letters, digits or '_'"):
        ae.open_store(url)
    with psycopg.connect(postgres_db_url) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)
        ).fetchone()
    assert found is not None and found[0] == 0


# -- schema management -----------------------------------------------------------------


def test_migrate_false_on_a_fresh_schema_says_to_run_init(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    """migrate=False never creates anything and raises SchemaVersionError naming the fix."""
    with pytest.raises(SchemaVersionError) as info:
        ae.open_store(_with(postgres_url, migrate="false"))
    assert "ares-events init" in str(info.value)
    assert info.value.found == 0
    exists = admin.execute(
        "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (_schema_of(postgres_url),)
    ).fetchone()
    assert exists == (0,)


def test_migrations_are_recorded_and_idempotent(postgres_url: str) -> None:
    """Opening twice applies nothing new; ares_meta holds the current version."""
    with ae.open_store(postgres_url) as first:
        first.append("s", [_ev()])
    with ae.open_store(postgres_url) as second, ae.open_store(postgres_url, migrate=False) as v:
        assert second.stream_version("s") == 1
        with _rec(v).connection() as conn:
            row = conn.execute(
                f"SELECT value FROM \"{_rec(v).schema}\".ares_meta WHERE key = 'schema_version'"
            ).fetchone()
        assert row == (str(SCHEMA_VERSION),)
        assert _rec(v).schema_version() == SCHEMA_VERSION


def test_schema_ahead_of_this_build_is_refused(postgres_url: str) -> None:
    """A schema version newer than this build raises SchemaVersionError saying to upgrade."""
    with ae.open_store(postgres_url) as store, _rec(store).connection() as conn:
        conn.execute(
            f'UPDATE "{_rec(store).schema}".ares_meta SET value = %s '
            "WHERE key = 'schema_version'",
            (str(SCHEMA_VERSION + 5),),
        )
    for migrate in ("true", "false"):
        with pytest.raises(SchemaVersionError) as info:
            ae.open_store(_with(postgres_url, migrate=migrate))
        assert "upgrade" in str(info.value)


_OPEN_SCRIPT = """
import os, sys
import ares_events as ae
with ae.open_store(os.environ["ARES_URL"]) as s:
    s.append("from-" + sys.argv[1], [ae.NewEvent(type="t", module="m")])
print("ok")
"""


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_two_processes_opening_a_fresh_schema_race_safely(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    """Two processes opening the same fresh schema at once: one migrates, the other waits
    on the advisory lock and finds it current; both then append."""
    schema = _schema_of(postgres_url)
    admin.execute(
        "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"ares-events:migrate:{schema}",)
    )
    env = {**os.environ, "ARES_URL": postgres_url}
    root = str(Path(__file__).resolve().parents[2])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _OPEN_SCRIPT, str(i)],
            env=env,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    try:
        # Both are blocked on the migration lock: they really race for it.
        _wait_until(lambda: len(_lock_waiters(admin)) >= 2, "both processes to wait")
    finally:
        admin.execute(
            "SELECT pg_advisory_unlock(hashtextextended(%s, 0))",
            (f"ares-events:migrate:{schema}",),
        )
    outs = [p.communicate(timeout=DEADLINE) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    with ae.open_store(postgres_url, migrate=False) as store:
        assert sorted(store.streams()) == [("from-0", 1), ("from-1", 1)]


# -- concurrency and ordering ----------------------------------------------------------------


def test_appends_to_other_streams_do_not_wait_for_a_locked_stream(
    pg_store: EventStore, admin: psycopg.Connection[Any]
) -> None:
    """With stream A's lock held elsewhere, an append to stream B completes (no global lock)."""
    _hold_stream_lock(admin, "A")
    try:
        res = pg_store.append("B", [_ev()])
        assert res.version == 1
    finally:
        _release_stream_lock(admin, "A")
    assert pg_store.append("A", [_ev()]).version == 1


def test_concurrent_appends_to_one_stream_never_fork(postgres_url: str) -> None:
    """Threads appending to the same stream through two stores produce one valid chain."""
    with ae.open_store(postgres_url) as a, ae.open_store(postgres_url) as b:

        def work(store: EventStore, k: int) -> None:
            for i in range(25):
                store.append("shared", [_ev(k * 100 + i)])

        threads = [threading.Thread(target=work, args=(s, k)) for k, s in enumerate((a, b, a))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(DEADLINE)
        assert a.stream_version("shared") == 75
        assert ae.integrity.verify_stream(b, "shared").ok
        positions = [e.position for e in a.read_all()]
        assert positions == sorted(positions)
        assert len(set(positions)) == 75


class _PausedBatch(Batch):
    """A batch that pauses inside the append transaction, after the xid is assigned."""

    def __init__(self, batch: Batch, paused: threading.Event, resume: threading.Event) -> None:
        super().__init__(batch.stream_id, batch.events, None)
        self.paused = paused
        self.resume = resume

    def seal(self, head: Head | None) -> list[SealedEvent]:
        self.paused.set()
        if not self.resume.wait(DEADLINE):
            raise RuntimeError("test never resumed the paused append")
        return super().seal(head)


def _batch(stream_id: str, n: int = 1) -> Batch:
    return Batch(stream_id, prepare(stream_id, [_ev(i) for i in range(n)], utc_now_at()), None)


def test_read_all_never_skips_a_late_commit(postgres_url: str) -> None:
    """An append whose transaction started first but commits last is not skipped: while it
    is in flight, the later committed append is held back; afterwards both are returned, in
    a stable order, exactly once, to a reader polling with its cursor."""
    with ae.open_store(postgres_url) as early_store, ae.open_store(postgres_url) as late_store:
        reader = late_store
        seen: list[ae.RecordedEvent] = list(reader.read_all())
        cursor = seen[-1].position if seen else 0
        paused, resume = threading.Event(), threading.Event()
        result: dict[str, Any] = {}

        _rec(early_store).predict_heads = False  # the locked path, paused inside its txn

        def slow_append() -> None:
            try:
                result["outcome"] = _rec(early_store).append(
                    _PausedBatch(_batch("early", 2), paused, resume), ae.ANY
                )
            except BaseException as exc:  # reported by the main thread
                result["error"] = exc

        t = threading.Thread(target=slow_append)
        t.start()
        try:
            assert paused.wait(DEADLINE)
            late = late_store.append("late", [_ev(9)])
            # The late append is committed and readable by stream...
            assert [e.position for e in reader.read("late")] == [late.position]
            # ...but read_all holds it back while the earlier transaction is in flight.
            for _ in range(3):
                new = list(reader.read_all(after_position=cursor))
                assert all(e.stream_id != "late" for e in new), new
                seen += new
                if new:
                    cursor = new[-1].position
            assert reader.last_position() < late.position
        finally:
            resume.set()
            t.join(DEADLINE)
        assert "error" not in result, result.get("error")
        # The recorder reports the last position (events of one append are consecutive).
        last = result["outcome"].position
        early_positions = [last - 1, last]
        assert early_positions[-1] < late.position

        def caught_up() -> bool:
            nonlocal cursor
            new = list(reader.read_all(after_position=cursor))
            seen.extend(new)
            if new:
                cursor = new[-1].position
            return any(e.stream_id == "late" for e in seen)

        _wait_until(caught_up, "read_all to show both appends")
        mine = [(e.stream_id, e.version, e.position) for e in seen]
        assert mine == [
            ("early", 1, early_positions[0]),
            ("early", 2, early_positions[1]),
            ("late", 1, late.position),
        ]
        # Stable: a fresh full read returns the same order.
        again = [(e.stream_id, e.version, e.position) for e in reader.read_all()]
        assert again == mine


def test_read_all_never_skips_a_late_commit_of_the_fast_path(
    postgres_url: str, postgres_db_url: str
) -> None:
    """The one-statement append, run by hand inside a transaction left open, holds back a
    later committed append from read_all; after its commit both come back once, in order."""
    with ae.open_store(postgres_url) as store, psycopg.connect(postgres_db_url) as raw:
        rec = _rec(store)
        batch = _batch("early", 1)
        row = raw.execute(
            *rec._fast_statement(batch, batch.seal(None), None)
        ).fetchone()  # raw is not autocommit: this transaction stays open
        assert row is not None and row[0] is not None
        late = store.append("late", [_ev(9)])
        assert [e.stream_id for e in store.read_all()] == []
        assert store.last_position() == 0
        raw.commit()
        _wait_until(lambda: store.last_position() >= late.position, "both to be visible")
        got = [(e.stream_id, e.position) for e in store.read_all()]
        assert got == [("early", row[0]), ("late", late.position)]
        assert ae.integrity.verify_stream(store, "early").ok


def test_mispredicted_head_falls_back_to_the_locked_path(postgres_url: str) -> None:
    """Two stores appending to one stream in turn: each sees the other's appends (its
    predicted head is stale), falls back, and the chain stays whole."""
    with ae.open_store(postgres_url) as a, ae.open_store(postgres_url) as b:
        for i in range(6):
            (a if i % 2 == 0 else b).append("s", [_ev(i)], expected_version=i)
        with pytest.raises(ConcurrencyError):
            a.append("s", [_ev(99)], expected_version=3)
        assert a.stream_version("s") == 6
        assert ae.integrity.verify_stream(b, "s").ok
        assert [e.payload["n"] for e in a.read("s")] == list(range(6))


def test_oversized_batch_is_refused(pg_store: EventStore) -> None:
    """More than 65,535 events in one append raise InvalidEvent and write nothing."""
    big = _batch("big", 1)
    big.events = big.events * 65536
    with pytest.raises(InvalidEvent) as info:
        _rec(pg_store).append(big, ae.ANY)
    assert "65535" in str(info.value)
    assert pg_store.stream_version("big") == 0


# -- wake-ups -------------------------------------------------------------------------------


def test_wait_for_wakes_when_another_connection_appends(postgres_url: str) -> None:
    """A waiter blocked in wait_for returns True once another store appends."""
    with ae.open_store(postgres_url) as waiter_store, ae.open_store(postgres_url) as writer:
        writer.append("s", [_ev(0)])
        start = waiter_store.last_position()
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(waiter_store.wait_for(start, 2 * DEADLINE)))
        t.start()
        # The waiter is listening before the append (else the test proves nothing new).
        _wait_until(lambda: _listening(waiter_store), "the listener")
        writer.append("s", [_ev(1)])
        t.join(DEADLINE)
        assert not t.is_alive(), "wait_for was not woken by the append"
        assert got == [True]


def test_wait_for_sees_a_commit_that_became_visible_without_a_notification(
    postgres_url: str, postgres_db_url: str
) -> None:
    """Another writer's commit (its NOTIFY taken well before the wait) hidden behind an
    older transaction that sends no notification: it becomes visible when that one ends,
    which nothing announces. The waiter still returns True long before its timeout (it
    looks at least every IDLE_POLL seconds), on the blocking and the asyncio face."""

    def hide_then_show(raw: psycopg.Connection[Any], other: EventStore) -> threading.Timer:
        raw.execute("INSERT INTO hold VALUES (1)")  # holds an xid, notifies nothing
        other.append("s", [_ev(1)])  # commits and notifies, hidden behind it
        time.sleep(1.5)  # older than IDLE_POLL (1 s) when the wait begins: old news
        timer = threading.Timer(0.2, raw.commit)
        timer.start()
        return timer

    async def wait_async(start: int, raw: psycopg.Connection[Any], other: EventStore) -> bool:
        async with await ae.open_async_store(postgres_url) as astore:
            await astore.wait_for(start, 0.01)  # its listener starts
            rec: Any = backend_of(astore.recorder)
            while rec._listener is None or not rec._listener.listening:
                await asyncio.sleep(0.01)
            timer = hide_then_show(raw, other)
            try:
                return await astore.wait_for(start, DEADLINE)
            finally:
                timer.join()

    with ae.open_store(postgres_url) as waiter, ae.open_store(postgres_url) as other:
        other.append("s", [_ev(0)])
        waiter.wait_for(waiter.last_position(), 0.01)  # its listener starts
        _wait_until(lambda: _listening(waiter), "the listener")
        with psycopg.connect(postgres_db_url) as raw:
            raw.execute("CREATE TEMP TABLE hold (x int)")
            raw.commit()
            for face in ("blocking", "asyncio"):
                start = waiter.last_position()
                began = time.monotonic()
                if face == "blocking":
                    timer = hide_then_show(raw, other)
                    assert waiter.wait_for(start, DEADLINE) is True
                    timer.join()
                else:
                    assert asyncio.run(wait_async(start, raw, other)) is True
                # Liveness, not speed: with no fallback it returned only at its timeout.
                assert time.monotonic() - began < DEADLINE / 2, face


def test_wait_for_times_out_without_appends(pg_store: EventStore) -> None:
    """With nothing appended, wait_for returns False after its timeout."""
    res = pg_store.append("s", [_ev()])
    assert pg_store.wait_for(res.position - 1, timeout=0.1) is True
    assert pg_store.wait_for(res.position, timeout=0.2) is False


def test_notify_false_still_waits_by_polling(postgres_url: str) -> None:
    """With notify=false no NOTIFY is sent, and wait_for still sees new events (polling)."""
    with ae.open_store(_with(postgres_url, notify="false")) as store:
        rec = _rec(store)
        with rec.connection() as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(rec.channel)))
            rec.predict_heads = False
            store.append("s", [_ev(0)])
            rec.predict_heads = True
            res = store.append("s", [_ev(1)])
            assert list(conn.notifies(timeout=0.2)) == []
            conn.execute("UNLISTEN *")
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(store.wait_for(res.position, DEADLINE)))
        t.start()
        with ae.open_store(postgres_url) as other:
            other.append("s", [_ev(2)])
        t.join(DEADLINE)
        assert got == [True]
        assert store.wait_for(store.last_position(), timeout=0.05) is False


# -- failures ---------------------------------------------------------------------------------


def test_connection_killed_mid_append_leaves_nothing(
    pg_store: EventStore, admin: psycopg.Connection[Any]
) -> None:
    """An append whose backend is terminated while it waits for the stream lock raises
    StoreUnavailable, writes nothing, and the next append works."""
    pg_store.append("s", [_ev(0)])
    _hold_stream_lock(admin, "s")
    errors: list[BaseException] = []

    def blocked_append() -> None:
        try:
            pg_store.append("s", [_ev(1), _ev(2)])
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=blocked_append)
    t.start()
    try:
        _wait_until(lambda: bool(_lock_waiters(admin)), "the append to block on the lock")
        (pid,) = _lock_waiters(admin)
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,))
        t.join(DEADLINE)
    finally:
        _release_stream_lock(admin, "s")
    assert len(errors) == 1
    assert isinstance(errors[0], StoreUnavailable), errors
    assert isinstance(errors[0].__cause__, psycopg.OperationalError)
    assert pg_store.stream_version("s") == 1
    assert [e.version for e in pg_store.read("s")] == [1]
    assert pg_store.append("s", [_ev(3)]).version == 2
    assert ae.integrity.verify_stream(pg_store, "s").ok


def test_exhausted_pool_raises_after_pool_timeout(postgres_url: str) -> None:
    """With every connection taken, an append raises StoreUnavailable (pool exhausted)
    after pool_timeout instead of hanging; it works again once one is free."""
    with ae.open_store(_with(postgres_url, pool_min=1, pool_max=1, pool_timeout=0.3)) as store:
        rec = _rec(store)
        with rec.connection():
            with pytest.raises(StoreUnavailable) as info:
                store.append("s", [_ev()])
            assert "exhausted" in str(info.value)
            with pytest.raises(StoreUnavailable):
                store.stream_version("s")
        assert store.append("s", [_ev()]).version == 1


def test_reconnects_after_every_backend_is_terminated(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    """A server restart (simulated: every backend of the store terminated) is survived:
    the next calls reconnect, and wake-ups resume."""
    app = f"ares-restart-{uuid.uuid4().hex[:8]}"
    with ae.open_store(_with(postgres_url, pool_min=2, application_name=app)) as store:
        store.append("s", [_ev(0)])
        assert store.wait_for(0, timeout=5)
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (app,),
        ).fetchone()
        assert killed is not None and killed[0] >= 2
        assert store.stream_version("s") == 1
        res = store.append("s", [_ev(1)])
        assert res.version == 2
        assert [e.version for e in store.read("s")] == [1, 2]
        with ae.open_store(postgres_url) as other:
            got: list[bool] = []
            t = threading.Thread(target=lambda: got.append(store.wait_for(res.position, DEADLINE)))
            t.start()
            _wait_until(
                lambda: _listening(store),
                "the listener to reconnect",
            )
            other.append("s", [_ev(2)])
            t.join(DEADLINE)
            assert got == [True]


def test_statement_timeout_is_honoured(postgres_url: str, admin: psycopg.Connection[Any]) -> None:
    """A blocked append with statement_timeout=200 raises StoreUnavailable naming the
    timeout and writes nothing (the lock is held far longer than the timeout)."""
    with ae.open_store(_with(postgres_url, statement_timeout=200)) as store:
        store.append("s", [_ev(0)])
        _hold_stream_lock(admin, "s")
        release = threading.Timer(DEADLINE / 2, _release_stream_lock, (admin, "s"))
        try:
            release.start()
            with pytest.raises(StoreUnavailable) as info:
                store.append("s", [_ev(1)])
        finally:
            release.cancel()
            _release_stream_lock(admin, "s")
        assert "statement_timeout of 200 ms" in str(info.value)
        assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
        assert store.stream_version("s") == 1
        assert store.append("s", [_ev(2)]).version == 2


def test_a_duplicated_version_larger_than_a_page_is_read_whole(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    """Pages are keyed on the version alone; a version held by more rows than a page (only
    possible once the unique constraint is dropped: tampering) is read in one extra
    statement, so every row comes back exactly once and the verifier sees them all."""
    url = _with(postgres_url, page_size=3)
    schema = _schema_of(postgres_url)
    with ae.open_store(url) as store:
        store.append("s", [_ev(i) for i in range(6)])
        admin.execute(
            f'ALTER TABLE "{schema}".ares_events '
            "DROP CONSTRAINT ares_events_stream_id_version_key, "
            "DROP CONSTRAINT ares_events_event_id_key"
        )
        for k in range(4):
            admin.execute(
                f'INSERT INTO "{schema}".ares_events SELECT position + 1000 * %s, stream_id, '
                "version, event_id, type, module, payload, payload_ref, metadata, "
                f'recorded_at, prev_hash, hash FROM "{schema}".ares_events '
                "WHERE stream_id = 's' AND version = 2 ORDER BY position LIMIT 1",
                (k + 1,),
            )
        got = [(e.version, e.position) for e in store.read("s")]
        assert [v for v, _ in got] == [1, 2, 2, 2, 2, 2, 3, 4, 5, 6]
        assert len(set(got)) == len(got)
        assert [e.version for e in store.read("s", 2, 3)] == [2, 2, 2, 2, 2, 3]
        report = ae.integrity.verify_stream(store, "s")
        assert ("duplicate_version", 2) in {(f.kind, f.version) for f in report.findings}


def test_reads_never_go_back_below_a_position_already_returned(postgres_url: str) -> None:
    """The server's visibility bound is conservative and can come out lower in a later
    statement than in an earlier one (another database's transaction ending between a
    statement's snapshot and its activity check); a position a read returned is final for
    good, so later reads of the same store never return less than it did. Here the
    server's own bound is made to say 0 after a first read."""
    from ares_events.stores.postgres.sql import ORDER_BY_POSITION, SELECT_ALL_BELOW, render_for

    with ae.open_store(postgres_url) as store:
        for i in range(5):
            ae.emit(store, "s", "t.x", "m", {"i": i})
        first = [e.position for e in store.read_all()]
        assert len(first) == 5
        rec: Any = backend_of(store.recorder)
        schema = sql.Identifier(rec.schema)
        rec.clock.all = render_for(
            schema,
            SELECT_ALL_BELOW.replace("position < %s", "position < GREATEST(0, %s)")
            + ORDER_BY_POSITION,
        )
        rec.clock.last = render_for(
            schema,
            "SELECT coalesce(max(position), 0) FROM {s}.ares_events "
            "WHERE position < GREATEST(0, %s)",
        )
        assert [e.position for e in store.read_all()] == first
        assert store.last_position() == first[-1]
        rec._final = rec._own = 0  # a recorder that never read nor wrote: the low bound is all
        assert list(store.read_all()) == []


def _hold_an_xid(postgres_url: str) -> psycopg.Connection[Any]:
    """A transaction of the store's database holding an xid (so a lower position than any
    later append's) while it stays open."""
    blocker = psycopg.connect(postgres_url.split("?", maxsplit=1)[0])
    blocker.execute("SELECT pg_current_xact_id()")
    return blocker


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_a_read_after_an_append_waits_for_it_to_be_final(
    postgres_url: str, face: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read your own writes in global order: a transaction with a lower position is in
    flight when the append commits, so the server's bound is below the append's position;
    ``read_all`` and ``last_position`` wait until it is final instead of stopping short,
    and then see the append (the old code returned nothing here). The wait has no timing
    precondition: it is lengthened far past the moment the other transaction ends."""
    from ares_events.stores.postgres import recorder, recorder_async

    monkeypatch.setattr(recorder, "_CATCH_UP", 60.0)
    monkeypatch.setattr(recorder_async, "_CATCH_UP", 60.0)
    blocker = _hold_an_xid(postgres_url)
    ended = threading.Event()

    def end_later() -> None:
        time.sleep(0.2)
        blocker.commit()
        ended.set()

    ender = threading.Thread(target=end_later)
    try:
        if face == "blocking":
            with ae.open_store(postgres_url) as store:
                res = store.append("s", [ae.NewEvent(type="t.x", module="m")])
                ender.start()
                got = [e.position for e in store.read_all()]
                last = store.last_position()
        else:
            import asyncio

            async def run() -> tuple[int, list[int], int]:
                async with await ae.open_async_store(postgres_url) as store:
                    res = await store.append("s", [ae.NewEvent(type="t.x", module="m")])
                    ender.start()
                    got = [e.position async for e in store.read_all()]
                    return res.position, got, await store.last_position()

            pos, got, last = asyncio.run(run())
            res = ae.AppendResult("s", 1, pos, ())
        assert ended.is_set()  # the read could not have returned before the commit
        assert got == [res.position]
        assert last == res.position
    finally:
        if ender.is_alive():
            ender.join()
        blocker.close()


def test_a_read_gives_up_waiting_and_never_skips(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction with a lower position stays open past the wait: the read returns
    what is final (not the append, which could be followed by the open transaction's
    rows at lower positions), and once the transaction ends the append is read."""
    from ares_events.stores.postgres import recorder

    monkeypatch.setattr(recorder, "_CATCH_UP", 0.05)
    blocker = _hold_an_xid(postgres_url)
    try:
        with ae.open_store(postgres_url) as store:
            res = store.append("s", [ae.NewEvent(type="t.x", module="m")])
            assert list(store.read_all()) == []
            assert list(store.read_all()) == []  # gave up once: no second wait
            blocker.commit()
            assert [e.position for e in store.read_all()] == [res.position]
    finally:
        blocker.close()


def test_a_store_never_closed_lets_its_program_end(postgres_url: str) -> None:
    """A program that opens a PostgreSQL store (or a framework session over one) and ends
    without close(): its pool is closed at exit while its worker threads still run. Left
    to the pool's finalizer, Python 3.13 waited 5 s for each of them ("couldn't stop
    thread"), ~20 s before the program ended."""
    code = (
        "import sys, ares_events as ae\n"
        "store = ae.open_store(sys.argv[1])\n"
        "store.append('s', [ae.NewEvent(type='t.x', module='m')])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, postgres_url],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "couldn't stop thread" not in done.stderr, done.stderr
