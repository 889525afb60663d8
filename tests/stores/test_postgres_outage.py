"""PostgreSQL outages say what they are, fast, and the store recovers promptly.

The store reaches the server through a TCP proxy on loopback (tests/fixtures/tcp_proxy.py), so a
test can take the "server" down, make it a black hole, and bring it back on the same
port. Time bounds here are liveness bounds that tell two behaviours apart (a few seconds
versus the 30 s pool timeout), not performance thresholds.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import StoreUnavailable
from tests.fixtures.tcp_proxy import TcpProxy, tcp_proxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]  # outages wait out timeouts

POOL_TIMEOUT = 30.0  # the default: a dead server must be reported well before it
GROWN = 10  # connections a busy moment left in the pool (pool_max's default)


def _ev(n: int = 0) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"n": n})


def _through(url: str, proxy: TcpProxy) -> str:
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@127.0.0.1:{proxy.port}" if userinfo else f"127.0.0.1:{proxy.port}"
    return urlunsplit(parts._replace(netloc=netloc))


@pytest.fixture
def proxied(postgres_url: str) -> Iterator[tuple[str, TcpProxy]]:
    """A store URL whose connections go through a controllable proxy."""
    parts = urlsplit(postgres_url)
    with tcp_proxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        yield _through(postgres_url, proxy), proxy


def test_dead_server_is_reported_as_unreachable_within_seconds(
    proxied: tuple[str, TcpProxy],
) -> None:
    """With the server gone and no call in flight, the next append fails in a few seconds
    (not after the 30 s pool timeout) with StoreUnavailable saying the server cannot be
    reached, never "pool exhausted"; nothing is written."""
    url, proxy = proxied
    with ae.open_store(url) as store:
        store.append("s", [_ev(0)])
        proxy.down()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.append("s", [_ev(1)])
        elapsed = time.monotonic() - started
        assert "cannot be reached" in str(info.value)
        assert "exhausted" not in str(info.value)
        assert elapsed < POOL_TIMEOUT / 3, elapsed
        with pytest.raises(StoreUnavailable, match="cannot be reached"):
            store.stream_version("s")
        proxy.up()
        assert store.stream_version("s") == 1


def test_black_hole_server_is_reported_within_the_connect_timeout(
    proxied: tuple[str, TcpProxy],
) -> None:
    """A server that accepts connections and never answers (an unreachable host) is
    reported as unreachable within the documented connect timeout, not the pool's."""
    url, proxy = proxied
    with ae.open_store(url) as store:
        store.append("s", [_ev(0)])
        proxy.hang()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as info:
            store.append("s", [_ev(1)])
        assert "cannot be reached" in str(info.value) or "failed" in str(info.value)
        assert time.monotonic() - started < POOL_TIMEOUT / 3
        proxy.up()


def test_store_recovers_promptly_when_the_server_is_back(
    proxied: tuple[str, TcpProxy],
) -> None:
    """After an outage of several seconds, the first append once the server is back
    succeeds at once (the pool retries a lost server at least every second), and every
    event is there exactly once."""
    url, proxy = proxied
    with ae.open_store(url) as store:
        store.append("s", [_ev(0)])
        proxy.down()
        deadline = time.monotonic() + 6.0  # long enough for psycopg_pool's backoff to grow
        while time.monotonic() < deadline:
            with pytest.raises(StoreUnavailable):
                store.append("s", [_ev(1)])
            time.sleep(0.5)
        proxy.up()
        started = time.monotonic()
        res = store.append("s", [_ev(2)])
        assert time.monotonic() - started < 5.0
        assert res.version == 2
        assert [e.payload["n"] for e in store.read("s")] == [0, 2]
        assert ae.integrity.verify_stream(store, "s").ok


def _restart_url(postgres_url: str) -> tuple[str, str]:
    """A store URL whose backends can be told apart (application_name), with a short
    pool_timeout: a call that waits it out fails instead of passing slowly."""
    app = f"ares-failover-{uuid.uuid4().hex[:8]}"
    return f"{postgres_url}&pool_max={GROWN}&pool_timeout=5&application_name={app}", app


def _terminate(postgres_db_url: str, app: str) -> int:
    """What a server restart or failover does to every pooled connection: each backend of
    ``app`` terminated (waiting until it has exited); the server stays up."""
    with psycopg.connect(postgres_db_url, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(pg_terminate_backend(pid, 10000)) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (app,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_grown_pool_serves_the_first_call_after_a_restart(
    postgres_url: str, postgres_db_url: str
) -> None:
    """A pool grown to 10 connections, all dropped by the server (a restart or failover):
    the next append and read succeed, rather than waiting out pool_timeout with
    "pool exhausted" while psycopg_pool backs off 1, 2, 4... s between dead connections."""
    url, app = _restart_url(postgres_url)
    with ae.open_store(url) as store:
        rec = backend_of(store.recorder)
        all_in = threading.Barrier(GROWN)

        def hold() -> None:
            with rec.connection():
                all_in.wait(60)

        threads = [threading.Thread(target=hold) for _ in range(GROWN)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert rec.pool.get_stats()["pool_available"] == GROWN
        assert _terminate(postgres_db_url, app) >= GROWN
        assert store.append("s", [_ev(1)]).version == 1
        assert [e.payload["n"] for e in store.read("s")] == [1]


def test_a_grown_async_pool_serves_the_first_call_after_a_restart(
    postgres_url: str, postgres_db_url: str
) -> None:
    """The asyncio face of the test above."""
    url, app = _restart_url(postgres_url)

    async def scenario() -> None:
        async with await ae.open_async_store(url) as store:
            rec = backend_of(store.recorder)
            all_in = asyncio.Barrier(GROWN)

            async def hold() -> None:
                async with rec.connection():
                    await asyncio.wait_for(all_in.wait(), 60)

            await asyncio.gather(*(hold() for _ in range(GROWN)))
            assert rec.pool.get_stats()["pool_available"] == GROWN
            assert await asyncio.to_thread(_terminate, postgres_db_url, app) >= GROWN
            assert (await store.append("s", [_ev(1)])).version == 1
            assert [e.payload["n"] async for e in store.read("s")] == [1]

    asyncio.run(asyncio.wait_for(scenario(), 120))
