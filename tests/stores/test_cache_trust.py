"""What the Redis cache may serve, against a real Redis server: every field a reader gets
is vouched for (the chain covers some, the entry's seal the rest), an erased payload never
comes back from the cache, gc-blobs never counts references through it, and two stores
never share its keys.

The entries are edited in Redis as someone with write access to it would: the seal in
front of an entry is kept as it was (recomputing it needs the store's cache secret).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

import ares_events as ae
from ares_events.chain import canonical_json
from ares_events.core.recorder import backend_of, system_of_record
from ares_events.stores.blobs import gc_blobs
from ares_events.stores.cache import CachedRecorder
from ares_events.stores.cache import entries as cache_entries
from ares_events.stores.cache.keys import CACHE_ROW, TAG_SIZE
from tests.fixtures import servers
from tests.fixtures.fix_backends import redis_cache_url

pytestmark = pytest.mark.redis

CACHE_LOGGER = "ares_events.stores.cache"
SSN = "123-45-6789"
SEAL = TAG_SIZE  # bytes in front of an entry's fields


def _cache(store: ae.EventStore) -> CachedRecorder:
    rec = store.recorder
    assert isinstance(rec, CachedRecorder)
    return rec


def _stored(events: Any) -> list[tuple[Any, ...]]:
    """Every stored field of each event, as served (the payload bytes as held, unfetched)."""
    return [tuple(e[:12]) for e in events]


def _truth(store: ae.EventStore, stream: str) -> list[tuple[Any, ...]]:
    return _stored(system_of_record(store.recorder).read(stream, 1, None, None))


def _path(store: ae.EventStore) -> Path:
    path = backend_of(store.recorder).path
    assert isinstance(path, Path)
    return path


def _forge(
    store: ae.EventStore, stream: str, version: int, edit: Callable[[list[Any]], None]
) -> None:
    """Edit the fields of one cached entry in Redis, its seal kept as it was."""
    cache = _cache(store)
    client = cache._redis
    field = b"e:%d" % version
    raw = client.hget(cache.key(stream), field)
    assert isinstance(raw, bytes), "the entry is not cached"
    fields = orjson.loads(raw[SEAL:])
    edit(fields)
    client.hset(cache.key(stream), field, raw[:SEAL] + orjson.dumps(fields))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == CACHE_LOGGER and r.levelno == logging.WARNING]


def _ref(fields: list[Any]) -> dict[str, Any]:
    return orjson.loads(fields[9])  # type: ignore[no-any-return]


def _erased_ref(size: int, digest: str) -> str:
    return orjson.dumps({"erased": True, "size": size, "digest": digest}).decode()


def _inline_beside_ref(f: list[Any]) -> None:
    f[4] = '{"report":"FORGED"}'


def _position(f: list[Any]) -> None:
    f[0] = 999999


def _inline_to_erased(f: list[Any]) -> None:
    import blake3

    raw = f[4].encode()
    f[9], f[4] = _erased_ref(len(raw), blake3.blake3(raw).hexdigest()), None


def _spilled_to_erased(f: list[Any]) -> None:
    ref = _ref(f)
    f[9] = _erased_ref(ref["size"], ref["digest"])


def _other_blob_key(f: list[Any]) -> None:
    ref = _ref(f)
    ref["key"] = "0" * 64
    f[9] = orjson.dumps(ref).decode()


def _erased_to_inline(f: list[Any]) -> None:
    f[4], f[9] = canonical_json({"ssn": SSN}).decode(), None


FORGERIES = {
    # name: (version edited, edit); v1 and v3 inline, v2 spilled, v4 erased
    "inline_payload_beside_a_ref": (2, _inline_beside_ref),
    "position": (1, _position),
    "inline_payload_turned_erased": (3, _inline_to_erased),
    "spilled_payload_turned_erased": (2, _spilled_to_erased),
    "ref_to_another_key": (2, _other_blob_key),
    "erased_payload_put_back": (4, _erased_to_inline),
}


@contextlib.contextmanager
def _four_events(tmp_path: Path, url: str, **kw: Any) -> Iterator[ae.EventStore]:
    """A cached SQLite store with stream ``s``: v1 inline, v2 spilled, v3 inline, v4 erased."""
    db = tmp_path / "e.db"
    with ae.open_store(f"sqlite:///{db}", cache=url, spill_threshold=64, **kw) as store:
        store.append(
            "s",
            [
                ae.NewEvent(type="t.small", module="test", payload={"n": 1}),
                ae.NewEvent(type="t.big", module="test", payload={"report": "GENUINE " * 50}),
                ae.NewEvent(type="t.small", module="test", payload={"n": 3}),
                ae.NewEvent(type="t.pii", module="test", payload={"ssn": SSN}),
            ],
        )
        ae.erase(store, "s", 4, reason="test", by="tests")
        yield store


@pytest.mark.parametrize("forgery", list(FORGERIES))
@pytest.mark.parametrize("keyed", [False, True])
def test_a_field_the_chain_does_not_cover_is_never_served_forged(
    tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture,
    forgery: str, keyed: bool,
) -> None:  # fmt: skip
    """A cached entry whose position, blob reference, erased flag or inline payload beside
    a reference was edited in Redis (the chain's header hash still matching) is not
    served: the read goes to the store (stats.forged, one WARNING without payload content),
    and a fresh store on the same cache reads the stored events too."""
    version, edit = FORGERIES[forgery]
    key = os.urandom(32) if keyed else None
    with redis_cache_url(request) as url, _four_events(tmp_path, url, chain_key=key) as store:
        truth = _truth(store, "s")
        assert _stored(store.read("s")) == truth  # fills the tail if needed
        stats = _cache(store).stats
        hits = stats.hits
        assert _stored(store.read("s")) == truth
        assert (stats.hits, stats.forged) == (hits + 1, 0)
        _forge(store, "s", version, edit)
        with caplog.at_level(logging.DEBUG, logger=CACHE_LOGGER):
            assert _stored(store.read("s")) == truth
        assert stats.forged == 1
        assert len(_warnings(caplog)) == 1
        assert "GENUINE" not in caplog.text and "FORGED" not in caplog.text
        assert SSN not in caplog.text
        _forge(store, "s", version, edit)
        db = _path(store)
        with ae.open_store(f"sqlite:///{db}", cache=url, chain_key=key) as fresh:
            assert _stored(fresh.read("s")) == truth
            assert _cache(fresh).stats.forged == 1
            assert fresh.read("s", from_version=4).__next__().payload_erased
            rep = ae.recover(fresh, "s", ae.projections.RecoveryStateProjection())
            assert [s.version for s in rep.skipped] == [4]


def test_an_entry_with_an_inline_payload_and_a_ref_is_malformed_even_when_sealed(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The decoder itself refuses an entry holding both an inline payload and a blob
    reference, and one holding neither: no writer makes them."""
    decode = cache_entries.decode
    with redis_cache_url(request) as url, _four_events(tmp_path, url) as store:
        list(store.read("s"))
        cache = _cache(store)
        raw = cache._redis.hget(cache.key("s"), b"e:2")
        assert raw is not None
        fields = orjson.loads(raw[SEAL:])
        decode("s", 2, orjson.dumps(fields))  # as written: fine
        fields[4] = '{"report":"FORGED"}'
        with pytest.raises(ValueError):
            decode("s", 2, orjson.dumps(fields))
        fields[4] = fields[9] = None
        with pytest.raises(ValueError):
            decode("s", 2, orjson.dumps(fields))


def test_gc_blobs_counts_references_in_the_store_not_in_the_cache(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """gc-blobs on a cached store whose cached entry hides a blob reference (rewritten to
    the erased form in Redis) still keeps the referenced blob: it reads the system of
    record, never the cache."""
    db = tmp_path / "e.db"
    with (
        redis_cache_url(request) as url,
        ae.open_store(f"sqlite:///{db}", cache=url, spill_threshold=64) as store,
    ):
        store.append("s", [ae.NewEvent(type="t.big", module="test", payload="x" * 500)])
        list(store.read("s"))
        _forge(store, "s", 1, _spilled_to_erased)
        with ae.open_store(f"sqlite:///{db}", cache=url) as later:
            stats = _cache(later).stats
            tomorrow = datetime.now(UTC) + timedelta(days=1)  # every blob is old enough
            rep = gc_blobs(later, timedelta(0), now=tomorrow)
            assert (rep.referenced_keys, rep.kept_referenced, rep.deleted) == (1, 1, [])
            assert stats.hits + stats.partial_hits + stats.misses + stats.forged == 0
        with ae.open_store(f"sqlite:///{db}") as plain:
            assert plain.read("s").__next__().payload == "x" * 500
            assert ae.integrity.audit(plain, deep=True).ok


# -- erasure ----------------------------------------------------------------------------------


def _pii(store: ae.EventStore, stream: str = "user-1") -> None:
    store.append(
        stream,
        [
            ae.NewEvent(type="profile", module="test", payload={"ssn": SSN}),
            ae.NewEvent(type="note", module="test", payload={"x": 1}),
        ],
    )


def _erased_for_a_fresh_reader(db: Path, url: str, stream: str = "user-1") -> bool:
    with ae.open_store(f"sqlite:///{db}", cache=url) as fresh:
        first = fresh.read(stream).__next__()
        if first.payload_erased:
            return True
        assert first.payload == {"ssn": SSN}
        return False


@pytest.mark.parametrize("epoch_lost", [False, True])
def test_a_read_racing_an_erasure_does_not_put_the_payload_back(
    tmp_path: Path, request: pytest.FixtureRequest, epoch_lost: bool
) -> None:
    """A read that fetched an event from the store before another process erased it
    finishes after the erasure dropped the cached tail: its refill is refused (also when
    Redis lost the erasure epoch meanwhile: evicted, flushed), so no reader, in any
    process, is served the erased payload afterwards (not after more appends either)."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url:
        with ae.open_store(f"sqlite:///{db}") as plain:  # nothing cached yet
            _pii(plain)
        with (
            ae.open_store(f"sqlite:///{db}", cache=url) as reader,
            ae.open_store(f"sqlite:///{db}", cache=url) as eraser,
        ):
            it = reader.read("user-1")
            assert next(it).payload == {"ssn": SSN}  # a miss: read from the store
            ae.erase(eraser, "user-1", 1, reason="GDPR", by="dpo")
            if epoch_lost:
                _cache(eraser)._redis.delete(_cache(eraser)._space().epoch)
            assert [e.version for e in it] == [2]  # the read ends: it would refill
            assert _erased_for_a_fresh_reader(db, url)
            assert reader.read("user-1").__next__().payload_erased
            for i in range(3):
                eraser.append("user-1", [ae.NewEvent(type="note", module="test", payload={"i": i})])
            assert _erased_for_a_fresh_reader(db, url)


class EraseAfterCommit:
    """A real recorder whose append, once committed, lets ``then`` run before it returns
    (another process erasing the event just written, between the commit and the cache
    update): no mock, it forwards to the wrapped backend."""

    def __init__(self, wrapped: Any, then: Callable[[], None]) -> None:
        self._wrapped = wrapped
        self._then = then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)

    def append(self, *args: Any) -> Any:
        outcome = self._wrapped.append(*args)
        self._then()
        return outcome


def test_an_append_racing_an_erasure_does_not_cache_the_payload(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Another process erases an event between its append's commit and the cache update:
    the update is refused, so the erased payload is never served from the cache."""
    from ares_events.stores.sqlite import SQLiteRecorder

    db = tmp_path / "e.db"
    with redis_cache_url(request) as url:
        with ae.open_store(f"sqlite:///{db}") as plain:
            plain.append("other", [ae.NewEvent(type="t", module="test", payload={})])
        with ae.open_store(f"sqlite:///{db}", cache=url) as eraser:

            def erase_it() -> None:
                ae.erase(eraser, "user-1", 1, reason="GDPR", by="dpo")

            racing = EraseAfterCommit(SQLiteRecorder(db), erase_it)
            with ae.EventStore(CachedRecorder.wrap(racing, url)) as writer:
                writer.append(
                    "user-1", [ae.NewEvent(type="p", module="test", payload={"ssn": SSN})]
                )
                assert writer.read("user-1").__next__().payload_erased
            assert _erased_for_a_fresh_reader(db, url)


def _closed_port() -> int:
    port = servers.free_port()
    assert not servers.port_open("127.0.0.1", port)
    return port


def test_an_erasure_that_cannot_reach_redis_is_served_at_most_ttl_seconds(
    tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """An erasure by a process that cannot reach Redis (e.g. the CLI) cannot drop the
    cached tail; other processes stop serving the erased payload once ``ttl`` seconds have
    passed since it was read from the store, even while appends keep the tail alive."""
    db = tmp_path / "e.db"
    with redis_cache_url(request, ttl=1) as url:
        down = f"redis://127.0.0.1:{_closed_port()}/0?{url.partition('?')[2]}"
        with ae.open_store(f"sqlite:///{db}", cache=url) as app:
            _pii(app)
            assert app.read("user-1").__next__().payload == {"ssn": SSN}
            with (
                caplog.at_level(logging.WARNING, logger=CACHE_LOGGER),
                ae.open_store(f"sqlite:///{db}", cache=down) as eraser,
            ):
                ae.erase(eraser, "user-1", 1, reason="GDPR", by="dpo")
            assert any("unavailable" in r.getMessage() for r in _warnings(caplog))
            erased_at = time.time()
            while time.time() < erased_at + 1.5:  # the agent keeps writing to the stream
                app.append("user-1", [ae.NewEvent(type="note", module="test", payload={})])
                time.sleep(0.1)
            app.append("user-1", [ae.NewEvent(type="note", module="test", payload={})])
            client = _cache(app)._redis
            assert client.exists(_cache(app).key("user-1"))  # kept alive by the appends
            assert _erased_for_a_fresh_reader(db, url)
            assert app.read("user-1").__next__().payload_erased


# -- one namespace per store ------------------------------------------------------------------


def test_stores_at_one_relative_path_from_two_folders_get_their_own_keys(
    tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sqlite:///agent.db`` opened from two working folders is two stores: two
    namespaces. One file spelled two ways is one store: one namespace."""
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    with redis_cache_url(request) as url:
        monkeypatch.chdir(tmp_path / "x")
        with contextlib.ExitStack() as stack:
            x = stack.enter_context(ae.open_store("sqlite:///agent.db", cache=url))
            monkeypatch.chdir(tmp_path / "y")
            y = stack.enter_context(ae.open_store("sqlite:///agent.db", cache=url))
            same_as_x = stack.enter_context(
                ae.open_store(f"sqlite:///{tmp_path / 'x' / 'agent.db'}", cache=url)
            )
            assert _cache(x).key("s") != _cache(y).key("s")
            assert _cache(x).key("s") == _cache(same_as_x).key("s")
            x.append("s", [ae.NewEvent(type="t", module="test", payload={"who": "x"})])
            y.append("s", [ae.NewEvent(type="t", module="test", payload={"who": "y"})])
            for _ in range(3):
                assert [e.payload["who"] for e in x.read("s")] == ["x"]
                assert [e.payload["who"] for e in y.read("s")] == ["y"]
                assert [e.payload["who"] for e in same_as_x.read("s")] == ["x"]
            assert (_cache(x).stats.hits, _cache(y).stats.hits) == (3, 3)
            assert _cache(same_as_x).stats.hits == 3


def test_postgres_schemas_given_as_a_keyword_get_their_own_keys(
    postgres_db_url: str, request: pytest.FixtureRequest
) -> None:
    """Two PostgreSQL schemas of one database, the schema given as ``schema=``: two
    namespaces, so each tenant's tail stays cached."""
    import uuid

    a_schema, b_schema = (f"t_{uuid.uuid4().hex[:12]}" for _ in range(2))
    with (
        redis_cache_url(request) as url,
        ae.open_store(postgres_db_url, schema=a_schema, cache=url) as a,
        ae.open_store(postgres_db_url, schema=b_schema, cache=url) as b,
    ):
        assert _cache(a).key("s") != _cache(b).key("s")
        a.append("s", [ae.NewEvent(type="t", module="test", payload={"tenant": "A"})])
        b.append("s", [ae.NewEvent(type="t", module="test", payload={"tenant": "B"})])
        for _ in range(3):
            assert [e.payload["tenant"] for e in a.read("s")] == ["A"]
            assert [e.payload["tenant"] for e in b.read("s")] == ["B"]
        assert (_cache(a).stats.hits, _cache(b).stats.hits) == (3, 3)


def test_a_read_only_store_never_records_the_cache_secret(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A store opened read-only writes nothing, not even the cache's secret: without one
    recorded its cache is private to it; once a writer recorded one, it shares the
    writer's cached tails."""
    db = tmp_path / "e.db"
    with ae.open_store(f"sqlite:///{db}") as plain:
        plain.append("s", [ae.NewEvent(type="t", module="test", payload={"n": 1})])
    before = db.read_bytes()
    with redis_cache_url(request) as url:
        with ae.open_store(f"sqlite:///{db}", cache=url, read_only=True) as ro:
            assert [e.payload["n"] for e in ro.read("s")] == [1]
            assert [e.payload["n"] for e in ro.read("s")] == [1]
            assert _cache(ro).stats.hits == 1
            private = _cache(ro).key("s")
        assert db.read_bytes() == before
        with ae.open_store(f"sqlite:///{db}", cache=url) as writer:
            assert _cache(writer).key("s") != private
            assert [e.payload["n"] for e in writer.read("s")] == [1]
        with ae.open_store(f"sqlite:///{db}", cache=url, read_only=True) as ro:
            assert _cache(ro).key("s") == _cache(writer).key("s")
            assert [e.payload["n"] for e in ro.read("s")] == [1]
            assert _cache(ro).stats.hits == 1


def test_a_restored_backup_shares_its_keys_but_never_serves_the_lost_history(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A store restored from a backup in place is the same store to the cache (same keys),
    and its history then differs from the cached one: reads serve the restored history."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url:
        with ae.open_store(f"sqlite:///{db}", cache=url) as store:
            store.append(
                "s", [ae.NewEvent(type="t", module="test", payload={"n": i}) for i in range(3)]
            )
        shutil.copyfile(db, tmp_path / "backup.db")
        with ae.open_store(f"sqlite:///{db}", cache=url) as store:
            store.append(
                "s", [ae.NewEvent(type="t", module="test", payload={"n": 10 + i}) for i in range(2)]
            )
            key = _cache(store).key("s")
            assert [e.payload["n"] for e in store.read("s")] == [0, 1, 2, 10, 11]
        shutil.copyfile(tmp_path / "backup.db", db)
        with ae.open_store(f"sqlite:///{db}", cache=url) as store:
            assert _cache(store).key("s") == key
            store.append(
                "s", [ae.NewEvent(type="t", module="test", payload={"n": 20 + i}) for i in range(2)]
            )
            assert [e.payload["n"] for e in store.read("s")] == [0, 1, 2, 20, 21]
            assert [e.payload["n"] for e in store.read("s", from_version=4)] == [20, 21]


# -- a value of another Redis type ------------------------------------------------------------


def _streams_a_and_b(store: ae.EventStore) -> None:
    for sid in ("a", "b"):
        store.append(
            sid, [ae.NewEvent(type="t", module="test", payload={"n": i}) for i in range(3)]
        )


@pytest.mark.parametrize("found_by", ["read", "append"])
def test_a_stream_key_of_another_type_is_a_forged_tail_of_that_stream_only(
    tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture, found_by: str
) -> None:
    """A value of another Redis type where a stream's cached tail belongs (WRONGTYPE) is a
    forged tail of that stream, not an outage: one WARNING naming the stream, counted in
    ``forged``, replaced; every other stream is still served from the cache meanwhile."""
    with (
        redis_cache_url(request) as url,
        ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", cache=url) as store,
    ):
        _streams_a_and_b(store)
        cache = _cache(store)
        client, key = cache._redis, cache.key("a")
        client.delete(key)
        client.set(key, b"hello")
        with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
            if found_by == "append":
                store.append("a", [ae.NewEvent(type="t", module="test", payload={"n": 3})])
            for _ in range(3):
                assert _stored(store.read("a")) == _truth(store, "a")
                assert _stored(store.read("b")) == _truth(store, "b")
        assert client.type(key) == b"hash"
        stats = cache.stats
        assert (stats.forged, stats.errors, stats.bypassed, stats.hits) == (1, 0, 0, 5)
        [warning] = _warnings(caplog)
        assert "'a'" in warning.getMessage() and "unavailable" not in warning.getMessage()


def test_an_erasure_epoch_of_another_type_is_replaced_once(
    tmp_path: Path, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """A value of another Redis type under the erasure epoch's key: the first cache write
    (or open) that meets it counts it as forged, logs one WARNING and replaces it; appends
    then refresh the cached tails again, with no WARNING each."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url, ae.open_store(f"sqlite:///{db}", cache=url) as store:
        _streams_a_and_b(store)
        cache = _cache(store)
        client, epoch = cache._redis, cache._space().epoch
        with caplog.at_level(logging.WARNING, logger=CACHE_LOGGER):
            for opened_after in (False, True):
                client.delete(epoch)
                client.hset(epoch, "x", "y")
                if opened_after:
                    with ae.open_store(f"sqlite:///{db}", cache=url) as other:
                        assert _cache(other).stats.forged == 1
                for i in range(4):
                    store.append("b", [ae.NewEvent(type="t", module="test", payload={"i": i})])
                    assert _stored(store.read("b")) == _truth(store, "b")
                assert client.type(epoch) == b"string"
        assert client.hget(cache.key("b"), "v") == b"11"  # the tail follows the appends
        assert (cache.stats.forged, cache.stats.errors, cache.stats.bypassed) == (1, 0, 0)
        assert len(_warnings(caplog)) == 2  # one per forged epoch
        assert not any("unavailable" in r.getMessage() for r in _warnings(caplog))


# -- forensic readers -------------------------------------------------------------------------

KEY_A, KEY_B = os.urandom(32), os.urandom(32)


def _namespace(store: ae.EventStore) -> dict[bytes, Any]:
    """Every key of the store's cache namespace and its value (hashes as dicts)."""
    cache = _cache(store)
    client = cache._redis
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(match=f"{cache._space().ns}*"):
        out[key] = client.hgetall(key) if client.type(key) == b"hash" else client.get(key)
    return out


@pytest.mark.parametrize(
    ("store_key", "reader_key"),
    [(KEY_A, KEY_B), (None, KEY_B), (KEY_A, None)],
    ids=["a-b", "none-b", "a-none"],  # the keys are random: ids every process agrees on
)
def test_a_reader_under_another_chain_key_writes_nothing_to_the_cache(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
    store_key: bytes | None,
    reader_key: bytes | None,
) -> None:
    """A store object opened with ``check_identity=False`` under another chain key (a
    forensic reader: it never writes) reads around the cache: it writes nothing to Redis
    (nor the cache secret to the store), so neither it nor the store's own processes see
    a tail sealed under another key (no false "forged" WARNINGs); a reader under the
    store's own key shares the cache."""
    db = tmp_path / "e.db"
    with redis_cache_url(request) as url:
        with ae.open_store(f"sqlite:///{db}", chain_key=store_key) as plain:  # no cache yet
            plain.append("z", [ae.NewEvent(type="t", module="test", payload={"i": 1})])
        with ae.open_store(
            f"sqlite:///{db}", chain_key=reader_key, check_identity=False, cache=url
        ) as forensic:
            assert len(list(forensic.read("z"))) == 1
            assert backend_of(forensic.recorder).meta_get(CACHE_ROW) is None  # not recorded
        with (
            caplog.at_level(logging.WARNING, logger=CACHE_LOGGER),
            ae.open_store(f"sqlite:///{db}", chain_key=store_key, cache=url) as own,
            ae.open_store(
                f"sqlite:///{db}", chain_key=reader_key, check_identity=False, cache=url
            ) as forensic,
            ae.open_store(
                f"sqlite:///{db}", chain_key=store_key, check_identity=False, cache=url
            ) as same_key,
        ):
            own.append(
                "a", [ae.NewEvent(type="t", module="test", payload={"i": i}) for i in range(4)]
            )
            for _ in range(3):
                cached = _namespace(own)
                assert _stored(forensic.read("a")) == _truth(own, "a")
                assert _namespace(own) == cached
                assert _stored(own.read("a")) == _truth(own, "a")
                assert _stored(same_key.read("a")) == _truth(own, "a")
            assert (_cache(own).stats.hits, _cache(same_key).stats.hits) == (3, 3)
            assert _cache(own).stats.forged == _cache(forensic).stats.forged == 0
            assert _cache(forensic).stats.hits == 0
        assert _warnings(caplog) == []
