"""The Redis read-through cache (``CachedRecorder``) against a real Redis server.

The whole StoreContract also runs on ``memory+cache`` and ``sqlite+cache`` (see
tests/fixtures/fix_backends.py); these tests cover what is specific to the cache: hits avoid the
inner store, other writers are never served stale, Redis down is slower, never failing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.errors import ConcurrencyError, ConfigError
from ares_events.stores import Capability
from ares_events.stores.cache import CachedRecorder
from tests.fixtures import servers
from tests.fixtures.fix_backends import redis_cache_url

pytestmark = pytest.mark.redis

PASSWORD = "s3cr3t-Pa55word"
CACHE_LOGGER = "ares_events.stores.cache"


class CountingRecorder:
    """A real recorder that counts the reads it serves (no mock: it forwards to the
    wrapped backend)."""

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped
        self.reads = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def read(self, *args: Any) -> Any:
        self.reads += 1
        return self._wrapped.read(*args)


def _evs(n: int, start: int = 0) -> list[ae.NewEvent]:
    return [
        ae.NewEvent(type="t.happened", module="test", payload={"n": start + i}) for i in range(n)
    ]


def _fields(events: Any) -> list[tuple[Any, ...]]:
    return [
        (
            e.stream_id,
            e.version,
            e.position,
            e.event_id,
            e.type,
            e.module,
            e.payload_bytes,
            e.metadata_json,
            e.at,
            e.prev_hash,
            e.hash,
            e.payload_ref,
        )
        for e in events
    ]


@contextlib.contextmanager
def counted_store(db: Path, cache_url: str) -> Iterator[tuple[ae.EventStore, CountingRecorder]]:
    """A SQLite store at ``db`` whose backend counts reads, behind the cache."""
    from ares_events.stores.sqlite import SQLiteRecorder

    counting = CountingRecorder(SQLiteRecorder(db))
    cached = CachedRecorder.wrap(counting, cache_url)
    store = ae.EventStore(cached)
    try:
        yield store, counting
    finally:
        store.close()


def _cache(store: ae.EventStore) -> CachedRecorder:
    rec = store.recorder
    assert isinstance(rec, CachedRecorder)
    return rec


def _redis(base: str) -> redis.Redis:
    return redis.Redis.from_url(f"{base}/0")


def _port_closed() -> int:
    port = servers.free_port()
    assert not servers.port_open("127.0.0.1", port)
    return port


# -- hits -------------------------------------------------------------------------------------


def test_hot_tail_reads_never_touch_the_inner_store(
    tmp_path: Path, request: pytest.FixtureRequest, redis_base_url: str
) -> None:
    """After appends, reads of the recent tail are served from Redis with zero inner reads
    and return exactly the stored events."""
    with redis_cache_url(request) as url, counted_store(tmp_path / "e.db", url) as (store, inner):
        store.append("s", _evs(3))
        store.append("s", _evs(4, 3))
        assert inner.reads == 0
        got = _fields(store.read("s"))
        got_range = _fields(store.read("s", from_version=3, to_version=5))
        got_limit = _fields(store.read("s", from_version=6, limit=10))
        assert inner.reads == 0
        assert _cache(store).stats.hits == 3
        truth = _fields(store.recorder.inner.read("s", 1, None, None))  # type: ignore[attr-defined]
        assert got == truth
        assert got_range == truth[2:5]
        assert got_limit == truth[5:]
        client = _redis(redis_base_url)
        try:
            key = _cache(store).key("s")
            assert client.hget(key, "v") == b"7"
            assert client.exists(key) and client.ttl(key) > 0
        finally:
            client.close()


def test_reads_outside_the_tail_fall_through_and_refill(
    tmp_path: Path, request: pytest.FixtureRequest, redis_base_url: str
) -> None:
    """With tail=5 only the last five events stay cached; older ranges are read from the
    inner store, and a read reaching the head refills an expired tail."""
    with (
        redis_cache_url(request, tail=5) as url,
        counted_store(tmp_path / "e.db", url) as (store, inner),
    ):
        for i in range(12):
            store.append("s", _evs(1, i))
        client = _redis(redis_base_url)
        try:
            key = _cache(store).key("s")
            fields = sorted(client.hkeys(key))
            assert fields == sorted([b"v", b"h", b"f"] + [b"e:%d" % v for v in range(8, 13)])
            assert [e.version for e in store.read("s", from_version=8)] == list(range(8, 13))
            assert inner.reads == 0
            assert [e.version for e in store.read("s", from_version=2, to_version=4)] == [2, 3, 4]
            assert inner.reads == 1
            client.delete(key)  # expired or evicted
            assert [e.payload["n"] for e in store.read("s")] == list(range(12))
            assert inner.reads == 2
            assert client.hget(key, "v") == b"12"
            assert [e.version for e in store.read("s", from_version=10)] == [10, 11, 12]
            assert inner.reads == 2
        finally:
            client.close()


# -- other writers ----------------------------------------------------------------------------


def test_appends_behind_the_caches_back_are_never_served_stale(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A second store instance without the cache appends; the cached store's reads,
    versions and expected_version checks see it at once, reading only the new events."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url, counted_store(db, url) as (store, inner):
        store.append("s", _evs(3))
        with ae.open_store(f"sqlite:///{db}") as other:
            other.append("s", _evs(2, 3), expected_version=3)
        assert store.stream_version("s") == 5
        with pytest.raises(ConcurrencyError):
            store.append("s", _evs(1), expected_version=3)
        assert [e.payload["n"] for e in store.read("s")] == [0, 1, 2, 3, 4]
        assert inner.reads == 1  # only versions 4..5, linked onto the cached tail
        assert _cache(store).stats.partial_hits == 1
        assert [e.payload["n"] for e in store.read("s", from_version=4)] == [3, 4]
        assert inner.reads == 1  # the catch-up was written back
        assert store.append("s", _evs(1, 5), expected_version=5).version == 6
        assert ae.integrity.verify_stream(store, "s").ok


def test_two_cached_instances_share_the_tail(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two cached instances of one SQLite file: each one's appends update the shared tail
    and the other reads them from Redis."""
    db = tmp_path / "e.db"
    with (
        redis_cache_url(request) as url,
        counted_store(db, url) as (a, a_inner),
        counted_store(db, url) as (b, b_inner),
    ):
        a.append("s", _evs(2))
        b.append("s", _evs(2, 2), expected_version=2)
        assert [e.payload["n"] for e in a.read("s")] == [0, 1, 2, 3]
        assert [e.payload["n"] for e in b.read("s")] == [0, 1, 2, 3]
        assert a_inner.reads == b_inner.reads == 0


def test_two_private_memory_stores_get_their_own_keys(request: pytest.FixtureRequest) -> None:
    """Two private memory stores: two namespaces (each records a cache secret of its own),
    so each reads only its own events and both tails stay cached. (Keys shared by a store
    and a restored copy of it: tests/stores/test_cache_trust.py.)"""
    with (
        redis_cache_url(request) as url,
        ae.open_store("memory://", cache=url) as x,
        ae.open_store("memory://", cache=url) as y,
    ):
        assert _cache(x).key("s") != _cache(y).key("s")
        x.append("s", _evs(3))
        y.append("s", _evs(3, 100))
        assert [e.payload["n"] for e in y.read("s")] == [100, 101, 102]
        assert [e.payload["n"] for e in x.read("s")] == [0, 1, 2]
        assert [e.payload["n"] for e in y.read("s", from_version=2)] == [101, 102]
        assert (_cache(x).stats.hits, _cache(y).stats.hits) == (1, 2)


def test_verification_reads_the_system_of_record(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A row edited in SQLite behind a warm cache: reads may serve the cached original,
    but verify_stream reads the database and reports the edit."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url, ae.open_store(f"sqlite:///{db}", cache=url) as store:
        store.append("s", _evs(3))
        with contextlib.closing(sqlite3.connect(db)) as conn, conn:
            conn.execute(
                "UPDATE ares_events SET payload = ? WHERE stream_id = 's' AND version = 2",
                (b'{"n":99}',),
            )
        rep = ae.integrity.verify_stream(store, "s")
        assert [f.kind for f in rep.findings] == ["hash_mismatch"]
        assert not ae.integrity.audit(store).ok


# -- entries edited in Redis -----------------------------------------------------------------


def _edit_entry(store: ae.EventStore, stream: str, version: int, payload: dict[str, Any]) -> None:
    """Rewrite one cached entry's payload in Redis, stamp and seal untouched; with an
    unkeyed chain also its hash, recomputed as a forger would (so only the seal and the
    link to the store's head can tell)."""
    from ares_events.chain import link_hash
    from ares_events.stores.cache.entries import decode as _decode
    from ares_events.stores.cache.keys import TAG_SIZE

    cache = _cache(store)
    client = cache._redis
    field = b"e:%d" % version
    raw = client.hget(cache.key(stream), field)
    assert isinstance(raw, bytes)
    seal, entry = raw[:TAG_SIZE], orjson.loads(raw[TAG_SIZE:])
    entry[4] = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS).decode()
    if store.chain_key is None:
        forged = _decode(stream, version, orjson.dumps(entry))
        entry[8] = link_hash(forged.prev_hash, forged.header()).hex()
    client.hset(cache.key(stream), field, seal + orjson.dumps(entry))


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("keyed", [False, True])
def test_an_event_edited_in_redis_is_never_served(
    tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture,
    version: int, keyed: bool,
) -> None:  # fmt: skip
    """A cached entry edited in Redis (the stamp left as it was; an unkeyed one with its
    hash recomputed) is not served: its hashes are recomputed up to the store's head, the
    read goes to the store, the tail is replaced (one WARNING), and the next read is a hit
    again, of the stored events."""
    key = os.urandom(32) if keyed else None
    db = tmp_path / "e.db"
    with (
        redis_cache_url(request) as url,
        ae.open_store(f"sqlite:///{db}", cache=url, chain_key=key) as store,
    ):
        store.append("s", _evs(3))
        stored = _fields(store.read("s"))
        stats = _cache(store).stats
        assert (stats.hits, stats.forged) == (1, 0)  # a keyed tail checks out too
        _edit_entry(store, "s", version, {"n": 99})
        with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
            for lo in (1, version):
                assert _fields(store.read("s", from_version=lo)) == stored[lo - 1 :]
        assert stats.forged == 1
        assert [r.levelname for r in caplog.records if r.name == CACHE_LOGGER] == ["WARNING"]
        assert _fields(store.read("s", from_version=version, limit=1)) == [stored[version - 1]]
        assert (stats.hits, stats.forged) == (3, 1)


def test_an_edited_entry_behind_newer_appends_is_not_served(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The cache behind the head (events appended by a writer without the cache): the
    cached part is checked up to the first newer event's link before it is served."""
    db = tmp_path / "e.db"
    with (
        redis_cache_url(request) as url,
        ae.open_store(f"sqlite:///{db}", cache=url) as store,
        ae.open_store(f"sqlite:///{db}") as plain,
    ):
        store.append("s", _evs(3))
        plain.append("s", _evs(2, 3))
        _edit_entry(store, "s", 2, {"n": 99})
        want = _fields(plain.read("s"))
        assert _fields(store.read("s")) == want
        assert _cache(store).stats.forged == 1
        assert _fields(store.read("s", from_version=2)) == want[1:]


def test_spilled_payloads_are_checked_and_served_from_the_cache(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A cached event whose payload went to the blob store is checked by its reference's
    digest (the chain commits to it) and served: no false alarm, no miss."""
    db = tmp_path / "e.db"
    with (
        redis_cache_url(request) as url,
        ae.open_store(f"sqlite:///{db}", cache=url, spill_threshold=64) as store,
    ):
        store.append("s", [*_evs(1), ae.NewEvent(type="t.big", module="test", payload="x" * 500)])
        store.append("s", _evs(1, 1))
        stats = _cache(store).stats
        assert store.read("s", from_version=2).__next__().payload == "x" * 500
        assert [e.version for e in store.read("s")] == [1, 2, 3]
        assert (stats.hits, stats.forged, stats.misses) == (2, 0, 0)


# -- wake-ups ---------------------------------------------------------------------------------


def test_wait_for_wakes_on_an_append_from_another_instance(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On SQLite (no native wake-ups), wait_for in one instance returns True when another
    cached instance appends (through the Redis wake-up channel)."""
    db = tmp_path / "e.db"
    with (
        redis_cache_url(request) as url,
        ae.open_store(f"sqlite:///{db}", cache=url) as waiter_store,
        ae.open_store(f"sqlite:///{db}", cache=url) as writer,
    ):
        assert Capability.WAKEUPS not in waiter_store.capabilities
        got: list[bool] = []
        started = threading.Event()

        def waiter() -> None:
            started.set()
            got.append(waiter_store.wait_for(0, timeout=60))

        t = threading.Thread(target=waiter)
        t.start()
        started.wait()
        writer.append("s", _evs(1))
        t.join(60)
        assert got == [True]
        assert waiter_store.wait_for(1, timeout=0.05) is False


def test_wait_for_sees_writers_that_bypass_the_cache(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A writer without the cache publishes nothing; wait_for still notices its append."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url, ae.open_store(f"sqlite:///{db}", cache=url) as store:
        got: list[bool] = []
        t = threading.Thread(target=lambda: got.append(store.wait_for(0, timeout=60)))
        t.start()
        with ae.open_store(f"sqlite:///{db}") as plain:
            plain.append("s", _evs(1))
        t.join(60)
        assert got == [True]


# -- Redis down -------------------------------------------------------------------------------


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == CACHE_LOGGER and r.levelno == logging.WARNING]


def test_redis_down_appends_and_reads_still_work(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """With nothing listening on the cache's port, opening, appending, reading and
    waiting all work; one WARNING is logged for the outage and no password anywhere."""
    caplog.set_level(logging.DEBUG, logger="ares_events")
    port = _port_closed()
    url = f"redis://agent:{PASSWORD}@127.0.0.1:{port}/0?retry_after=0.01"
    db = tmp_path / "e.db"
    with ae.open_store(f"sqlite:///{db}", cache=url) as store:
        for i in range(5):
            store.append("s", _evs(2, 2 * i), expected_version=2 * i)
            time.sleep(0.02)  # let the back-off lapse, so Redis is tried again
            assert [e.payload["n"] for e in store.read("s")] == list(range(2 * i + 2))
        assert store.wait_for(0, timeout=1) is True
        assert store.wait_for(10, timeout=0.05) is False
        assert ae.integrity.verify_stream(store, "s").ok
        rec = _cache(store)
        assert rec.stats.errors > 1  # retried after each back-off
        text = repr(store) + repr(rec) + rec.cache_url
    assert len(_warnings(caplog)) == 1
    assert "bypassing" in _warnings(caplog)[0].getMessage()
    assert PASSWORD not in caplog.text
    assert PASSWORD not in text
    assert ":***@" in text


def test_redis_going_down_and_coming_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Redis that dies mid-run is bypassed (one WARNING), and used again once it is
    back (one INFO), without a failed append or a wrong read."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.fail("redis-server is needed for this test: apt-get install redis-server")
    caplog.set_level(logging.DEBUG, logger="ares_events")
    port = servers.free_port()
    args = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]

    def start() -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not servers.port_open("127.0.0.1", port):
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
        return proc

    proc = start()
    try:
        url = f"redis://127.0.0.1:{port}/0?retry_after=0.01"
        with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", cache=url) as store:
            rec = _cache(store)
            store.append("s", _evs(2))
            assert len(list(store.read("s"))) == 2
            assert rec.stats.hits == 1
            proc.terminate()
            proc.wait(10)
            for i in range(3):
                store.append("s", _evs(1, 2 + i))
                time.sleep(0.02)
                assert [e.payload["n"] for e in store.read("s")] == list(range(3 + i))
            assert len(_warnings(caplog)) == 1
            proc = start()
            deadline = time.monotonic() + 30
            while rec._outage:  # the next operation after the back-off tries Redis again
                assert time.monotonic() < deadline, "the cache never came back"
                time.sleep(0.02)
                assert [e.payload["n"] for e in store.read("s")] == list(range(5))
            # The restarted Redis lost the erasure epoch: the first refill after it is
            # refused (an erasure may have happened meanwhile) and learns the new one.
            assert [e.payload["n"] for e in store.read("s")] == list(range(5))
            hits = rec.stats.hits
            store.append("s", _evs(1, 5))
            assert [e.payload["n"] for e in store.read("s", from_version=5)] == [4, 5]
            assert rec.stats.hits + rec.stats.partial_hits > hits
        assert any("reachable again" in r.getMessage() for r in caplog.records)
        assert len(_warnings(caplog)) == 1
    finally:
        proc.terminate()
        proc.wait(10)


# -- configuration ----------------------------------------------------------------------------


def test_unknown_parameter_lists_valid_ones_without_the_password() -> None:
    """An unknown cache URL parameter is a ConfigError naming the valid ones; the
    password never appears."""
    with pytest.raises(ConfigError) as ei:
        ae.open_store("memory://", cache=f"redis://u:{PASSWORD}@127.0.0.1:1/0?tll=5")
    msg = str(ei.value)
    assert "tll" in msg and "ttl" in msg and "prefix" in msg and "socket_timeout" in msg
    assert PASSWORD not in msg
    with pytest.raises(ConfigError):
        ae.open_store("memory://", cache="memcached://127.0.0.1:11211")
    with pytest.raises(ConfigError):
        ae.open_store("memory://", cache="redis://127.0.0.1/0?ttl=soon")
    with pytest.raises(ConfigError):
        ae.open_store("memory://", cache="redis://127.0.0.1/0?ssl_cert_reqs=none")


def test_wrapper_forwards_backend_attributes(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The wrapper exposes .inner and forwards describe and capabilities; the backend
    under it is reached by ``backend_of`` (never by attribute forwarding), so snapshots
    keep working behind the cache."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url, ae.open_store(f"sqlite:///{db}", cache=url) as store:
        rec = _cache(store)
        assert rec.describe() == rec.inner.describe()
        assert rec.capabilities == rec.inner.capabilities
        backend = backend_of(rec)
        assert backend.scheme == ("sqlite",)
        assert backend.path == db
        assert not hasattr(rec, "path")
        res = store.append("s", _evs(3))
        assert res.version == 3
        assert store.snapshots.load("s", "nothing") is None
