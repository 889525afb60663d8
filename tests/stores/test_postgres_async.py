"""The asyncio PostgreSQL store: the same guarantees as the blocking one, natively async.

200 concurrent appenders with one subscriber (every event seen once, in order), a late
commit never skipped by subscribe(), outages reported fast with the blocking store's
messages, secrets never shown, a caller's AsyncConnectionPool left open, and polling
when notify is off.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import psycopg
import psycopg_pool
import pytest

import ares_events as ae
from ares_events.core.backend import Batch
from ares_events.core.events import prepare, utc_now_at
from ares_events.core.recorder import backend_of
from ares_events.errors import StoreUnavailable
from ares_events.stores.postgres.recorder_async import AsyncPostgresRecorder
from tests.fixtures import servers
from tests.fixtures.tcp_proxy import TcpProxy, tcp_proxy
from tests.stores.test_postgres_outage import POOL_TIMEOUT, _through

pytestmark = pytest.mark.postgres

T = TypeVar("T")


def _ev(n: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="test.happened", module="pg-async", payload={"n": n})


def go(coro: Awaitable[T], timeout: float = 120.0) -> T:
    """Run one scenario on a fresh loop, bounded (a hang becomes a failure)."""

    async def bounded() -> T:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def _with(url: str, **params: object) -> str:
    return url + "".join(f"&{k}={v}" for k, v in params.items())


def test_200_tasks_on_200_streams_and_one_subscriber_see_every_event_once_in_order(
    postgres_url: str,
) -> None:
    """200 tasks each append 5 one-event transactions to their own stream while one
    subscribe() consumer runs: it sees every event exactly once, in strictly increasing
    position order, none skipped (the same set, in the same order, as a full read_all
    afterwards), and every stream's chain verifies."""
    tasks_n, per_task = 200, 5
    total = tasks_n * per_task

    async def scenario() -> None:
        async with await ae.open_async_store(_with(postgres_url, pool_max=16)) as store:
            seen: list[ae.RecordedEvent] = []
            done = asyncio.Event()

            async def consume() -> None:
                async for e in store.subscribe(0, page=64):
                    seen.append(e)
                    if len(seen) == total:
                        done.set()
                        return

            consumer = asyncio.create_task(consume())

            async def appender(k: int) -> None:
                for i in range(per_task):
                    await store.append(f"agent-{k:03d}", [_ev(i)], expected_version=i)

            await asyncio.gather(*(appender(k) for k in range(tasks_n)))
            await asyncio.wait_for(done.wait(), 60)
            await consumer
            positions = [e.position for e in seen]
            assert all(a < b for a, b in itertools.pairwise(positions))
            keys = [(e.stream_id, e.version) for e in seen]
            assert len(set(keys)) == total
            assert set(keys) == {(f"agent-{k:03d}", v) for k in range(tasks_n) for v in range(1, 6)}
            full = [(e.stream_id, e.version, e.position) async for e in store.read_all()]
            assert full == [(e.stream_id, e.version, e.position) for e in seen]
            for k in range(0, tasks_n, 20):
                assert (await ae.integrity.averify_stream(store, f"agent-{k:03d}")).ok

    go(scenario())


def test_subscribe_never_skips_a_late_commit(postgres_url: str, postgres_db_url: str) -> None:
    """An append left uncommitted holds back a later committed one from subscribe(); once
    it commits, the subscriber gets both, once each, in position order."""

    async def scenario() -> None:
        async with await ae.open_async_store(postgres_url) as store:
            rec: Any = backend_of(store.recorder)
            got: list[tuple[str, int]] = []

            async def consume() -> None:
                async for e in store.subscribe(0):
                    got.append((e.stream_id, e.position))
                    if len(got) == 2:
                        return

            consumer = asyncio.create_task(consume())
            raw = await psycopg.AsyncConnection.connect(postgres_db_url)  # not autocommit
            try:
                batch = Batch("early", prepare("early", [_ev(1)], utc_now_at()), None)
                cur = await raw.execute(*rec._fast_statement(batch, batch.seal(None), None))
                row = await cur.fetchone()
                assert row is not None and row[0] is not None  # written, not committed
                late = await store.append("late", [_ev(2)])
                await asyncio.sleep(0.3)
                assert got == []  # the committed later append is held back
                assert await store.last_position() == 0
                await raw.commit()
            finally:
                await raw.close()
            await asyncio.wait_for(consumer, 30)
            assert got == [("early", row[0]), ("late", late.position)]

    go(scenario())


def test_dead_server_is_reported_as_unreachable_within_seconds(postgres_url: str) -> None:
    """With the server gone, the next async append fails in seconds (not after the 30 s
    pool timeout) with the blocking store's "cannot be reached", and works again once the
    server is back."""
    parts = urlsplit(postgres_url)
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        url = _through(postgres_url, proxy)

        async def scenario(proxy: TcpProxy) -> None:
            async with await ae.open_async_store(url) as store:
                await store.append("s", [_ev(0)])
                proxy.down()
                started = time.monotonic()
                with pytest.raises(StoreUnavailable) as info:
                    await store.append("s", [_ev(1)])
                assert "cannot be reached" in str(info.value)
                assert "exhausted" not in str(info.value)
                assert time.monotonic() - started < POOL_TIMEOUT / 3
                proxy.up()
                deadline = time.monotonic() + 20
                while True:
                    try:
                        assert await store.stream_version("s") == 1
                        break
                    except StoreUnavailable:
                        if time.monotonic() > deadline:
                            raise
                        await asyncio.sleep(0.2)
                res = await store.append("s", [_ev(2)])
                assert res.version == 2

        go(scenario(proxy))


def test_password_never_shown(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """The percent-encoded password works and appears in no repr, error or log record of
    the async store, including the error of an unreachable server."""
    pw = servers.TEST_PASSWORD
    assert quote(pw, safe="") in postgres_url
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []

    async def scenario() -> None:
        async with await ae.open_async_store(postgres_url) as store:
            await store.append("s", [_ev()])
            texts.extend([repr(store), store.url, repr(store.recorder)])
            with pytest.raises(ae.ConcurrencyError) as cinfo:
                await store.append("s", [_ev()], expected_version=ae.NO_STREAM)
            texts.append(str(cinfo.value))
        host = postgres_url.split("@")[1].split("/", maxsplit=1)[0]
        dead = postgres_url.replace(f"@{host}", f"@127.0.0.1:{servers.free_port()}")
        with pytest.raises(StoreUnavailable) as uinfo:
            await ae.open_async_store(dead)
        texts.extend([str(uinfo.value), repr(uinfo.value)])

    go(scenario())
    texts += [r.getMessage() for r in caplog.records]
    for text in texts:
        assert pw not in text and quote(pw, safe="") not in text and quote(pw) not in text


def test_accepts_a_caller_async_pool_and_leaves_it_open(postgres_db_url: str) -> None:
    """An AsyncConnectionPool of the caller's works (schema created on open), and closing
    the store does not close it."""
    schema = f"t_{uuid.uuid4().hex[:12]}"

    async def scenario() -> None:
        pool = psycopg_pool.AsyncConnectionPool(
            postgres_db_url, min_size=1, max_size=3, kwargs={"autocommit": True}, open=False
        )
        await pool.open()
        try:
            rec = await AsyncPostgresRecorder.open(pool, schema=schema)
            async with await ae.AsyncEventStore.open(rec) as store:
                await store.append("s", [_ev(1), _ev(2)])
                assert [e.payload["n"] async for e in store.read("s")] == [1, 2]
                assert await store.wait_for(0, 5)
            assert not pool.closed
            async with pool.connection() as conn:
                cur = await conn.execute(f'SELECT count(*) FROM "{schema}".ares_events')
                assert await cur.fetchone() == (2,)
        finally:
            await pool.close()

    go(scenario())


def test_notify_false_waits_by_polling(postgres_url: str) -> None:
    """With notify=false nothing LISTENs; wait_for still wakes (by polling) when another
    store appends."""

    async def scenario() -> None:
        url = _with(postgres_url, notify="false")
        async with await ae.open_async_store(url) as a, await ae.open_async_store(url) as b:
            waiter = asyncio.create_task(a.wait_for(0, 30))
            await asyncio.sleep(0.1)
            await b.append("s", [_ev()])
            assert await asyncio.wait_for(waiter, 30) is True
            assert backend_of(a.recorder)._listener is None

    go(scenario())


@pytest.fixture
def admin(postgres_db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test database, outside every store."""
    with psycopg.connect(postgres_db_url, autocommit=True) as conn:
        yield conn


def test_no_session_outlives_close_even_with_statements_in_flight(
    postgres_url: str, admin: psycopg.Connection[Any]
) -> None:
    """A store whose tasks are stuck behind a held stream lock: close() cancels their
    statements after the grace, the tasks get StoreClosed, and no session of the store's
    pool or listener is left on the server."""
    app = f"ares-async-{uuid.uuid4().hex[:8]}"
    url = _with(postgres_url, application_name=app)

    async def scenario() -> list[str]:
        store = await ae.open_async_store(url)
        await store.append("s", [_ev()])
        rec: Any = store.recorder
        rec.predict_heads = False  # every append takes the stream lock
        admin.execute("BEGIN")
        admin.execute("SELECT pg_advisory_xact_lock(hashtextextended('s', 0))")
        try:
            stuck = [asyncio.create_task(store.append("s", [_ev(k)])) for k in range(3)]
            waiter = asyncio.create_task(store.wait_for(2**62, 60))
            await asyncio.sleep(0.5)
            await asyncio.wait_for(store.close(), 30)
            results = await asyncio.gather(*stuck, waiter, return_exceptions=True)
        finally:
            admin.execute("ROLLBACK")
        return [type(r).__name__ for r in results]

    assert go(scenario()) == ["StoreClosed"] * 4
    # A backend leaves pg_stat_activity a moment after its client hung up (the server
    # notices the closed socket, then the process exits): poll briefly. A session the
    # store kept open would still be listed at the deadline.
    deadline = time.monotonic() + 3.0
    while True:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (app,)
        ).fetchone()
        if row == (0,) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert row == (0,)


def test_create_false_and_migrate_false_are_checked_as_in_the_blocking_store(
    postgres_url: str,
) -> None:
    """create=False on an empty schema raises StoreNotFound and creates nothing;
    migrate=false on it raises SchemaVersionError; after a blocking open created the store,
    both open it."""

    async def scenario() -> None:
        with pytest.raises(ae.StoreNotFound):
            await ae.open_async_store(postgres_url, create=False)
        with pytest.raises(ae.SchemaVersionError):
            await ae.open_async_store(_with(postgres_url, migrate="false"))
        ae.open_store(postgres_url).close()
        async with await ae.open_async_store(postgres_url, create=False) as store:
            assert await store.last_position() == 0
        async with await ae.open_async_store(_with(postgres_url, migrate="false")) as store:
            assert [s async for s in store.streams()] == []

    go(scenario())
