"""The conformance suite's lifecycle part: a store's identity and how it closes (the
close races live in the project's own tests). May import the public API.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import time
from collections.abc import Callable

import pytest

import ares_events as ae
from ares_events.stores import Capability
from ares_events.testing._contract_helpers import _evs, _in_threads, _require, store_state

KEY_A = bytes(range(32))
KEY_B = bytes(range(1, 33))


def _fp(key: bytes) -> str:
    return ae.integrity.ChainKey(key).fingerprint()


def _another(store: ae.EventStore, recorder: object, **kwargs: object) -> ae.EventStore:
    """Another store object of the same kind over ``recorder`` (``ae.EventStore(recorder,
    ...)`` for a blocking store; the blocking face of another async store for the async
    face's suite)."""
    return type(store)(recorder, **kwargs)  # type: ignore[arg-type]


class LifecycleContract:
    """Identity and close: every store behaves the same."""

    def test_declared_capabilities_are_implemented(self, store: ae.EventStore) -> None:
        """Each capability the backend declares is backed by its protocol's methods
        (checked when the store opens, and here against the recorder itself)."""
        from ares_events.core import recorder, recorder_async

        rec = store.recorder
        target = getattr(rec, "target", rec)  # the asyncio face's recorder, under a proxy
        is_async = inspect.iscoroutinefunction(getattr(target, "head", None))
        face = recorder_async if is_async else recorder
        for cap in store.capabilities:
            proto = face.REQUIRES.get(cap)
            if proto is not None:
                assert isinstance(target, proto), (cap, proto.__name__)
        assert face.check_capabilities(target, store.url) == store.capabilities

    def test_identity_is_recorded_at_the_first_write_not_by_readers(
        self, store: ae.EventStore
    ) -> None:
        """Reading a new store records nothing; the first append records its identity."""
        assert list(store.streams()) == []
        assert list(store.read_all()) == []
        assert store.identity is None
        store.append("s", _evs(1))
        ident = store.identity
        assert ident is not None
        assert (ident.keyed, ident.key_id, ident.format) == (False, None, 1)

    def test_keyed_store_refuses_a_writer_without_its_key(self, store: ae.EventStore) -> None:
        """A keyed store refuses to open without a key or with another key (ConfigError
        naming the key ids, never a key) and nothing is written."""
        keyed = _another(store, store.recorder, chain_key=KEY_A)
        keyed.append("s", _evs(2))
        before = store_state(keyed)
        with pytest.raises(ae.ConfigError, match="keyed") as info:
            _another(store, store.recorder)
        assert _fp(KEY_A) in str(info.value)
        with pytest.raises(ae.ConfigError) as info:
            _another(store, store.recorder, chain_key=KEY_B)
        assert _fp(KEY_A) in str(info.value) and _fp(KEY_B) in str(info.value)
        for key in (KEY_A, KEY_B):
            assert key.hex() not in str(info.value)
        # The fixture's own store object was opened before the identity existed: its
        # first write finds the keyed identity and is refused before writing anything.
        with pytest.raises(ae.ConfigError, match="keyed"):
            store.append("s", _evs(1))
        assert store_state(keyed) == before
        assert ae.integrity.verify_stream(keyed, "s").ok

    def test_unkeyed_store_refuses_a_keyed_writer(self, store: ae.EventStore) -> None:
        """A key configured for an unkeyed store is a ConfigError; nothing is written."""
        store.append("s", _evs(2))
        before = store_state(store)
        with pytest.raises(ae.ConfigError, match="unkeyed") as info:
            _another(store, store.recorder, chain_key=KEY_A)
        assert KEY_A.hex() not in str(info.value)
        assert store_state(store) == before

    def test_keyed_chain(self, store: ae.EventStore) -> None:
        """A keyed chain verifies with its key; read deliberately without it (a forensic
        reader, check_identity=False) every link is a hash_mismatch, and such a reader
        refuses to write."""
        keyed = _another(store, store.recorder, chain_key=KEY_A)
        keyed.append("s", _evs(3))
        assert ae.integrity.verify_stream(keyed, "s").ok
        for e in keyed.read("s"):
            assert e.hash == ae.integrity.link_hash(
                e.prev_hash, e.header(), ae.integrity.ChainKey(KEY_A)
            )
        assert next(keyed.read("s")).prev_hash == ae.integrity.genesis("s")
        unkeyed = _another(store, store.recorder, check_identity=False)
        rep = ae.integrity.verify_stream(unkeyed, "s")
        assert {f.kind for f in rep.findings} == {"hash_mismatch"}
        assert [f.version for f in rep.findings] == [1, 2, 3]
        wrong = _another(store, store.recorder, chain_key=KEY_B, check_identity=False)
        assert not ae.integrity.verify_stream(wrong, "s").ok
        assert not ae.integrity.audit(unkeyed).ok
        with pytest.raises(ae.ConfigError, match="check_identity"):
            unkeyed.append("s", _evs(1))

    def test_store_remembers_its_key_across_opens(
        self, store: ae.EventStore, store_url: str
    ) -> None:
        """Under PERSISTENT, a store written with a key refuses to be reopened without it
        or with another one, and opens with it."""
        _require(store, Capability.PERSISTENT)
        store.close()
        with ae.open_store(store_url, chain_key=KEY_A) as keyed:
            keyed.append("s", _evs(2))
        with pytest.raises(ae.ConfigError, match="no chain key is configured"):
            ae.open_store(store_url)
        with pytest.raises(ae.ConfigError, match=_fp(KEY_B)):
            ae.open_store(store_url, chain_key=KEY_B)
        with ae.open_store(store_url, chain_key=KEY_A) as keyed:
            assert ae.integrity.verify_stream(keyed, "s").ok
            assert keyed.stream_version("s") == 2
            assert keyed.identity is not None and keyed.identity.key_id == _fp(KEY_A)

    def test_every_call_after_close_raises_store_closed(self, store: ae.EventStore) -> None:
        """After close() every call raises StoreClosed (an AresError), close is idempotent,
        and the error names the store."""
        store.append("s", _evs(2))
        store.close()
        store.close()
        assert store.closed
        calls: list[Callable[[], object]] = [
            lambda: store.append("s", _evs(1)),
            lambda: store.append_many([("t", _evs(1), ae.ANY)]),
            lambda: list(store.read("s")),
            lambda: list(store.read_all()),
            lambda: store.head("s"),
            lambda: store.stream_version("s"),
            lambda: list(store.streams()),
            store.last_position,
            lambda: store.wait_for(0, 0.01),
        ]
        for call in calls:
            with pytest.raises(ae.StoreClosed) as info:
                call()
            assert isinstance(info.value, ae.AresError)
            assert "closed" in str(info.value)

    def test_an_iterator_outliving_close_fails_cleanly(self, store: ae.EventStore) -> None:
        """A read iterator taken before close() either yields what it already holds or
        raises StoreClosed; it never crashes or yields wrong events."""
        store.append("s", _evs(10))
        it = store.read("s")
        first = next(it)
        store.close()
        got = [first]
        with pytest.raises(ae.StoreClosed):
            for e in it:
                got.append(e)
            raise ae.StoreClosed(store.url)  # held everything already: same outcome
        assert [e.version for e in got] == list(range(1, len(got) + 1))

    def test_a_long_read_stops_at_its_next_page_after_close(self, store: ae.EventStore) -> None:
        """A read of more events than any backend's page, taken before close(), raises
        StoreClosed before its end: the page after close() is never read (the memory
        store's reads ran on to their end)."""
        store.append("s", _evs(3000))
        reads = [store.read("s"), store.read_all()]
        for it in reads:
            next(it)
        store.close()
        for it in reads:
            n = 1
            with pytest.raises(ae.StoreClosed):
                for _ in it:
                    n += 1
            assert n < 3000

    def test_close_while_other_threads_work(self, store: ae.EventStore) -> None:
        """close() from one thread while others append and read: every call either
        succeeds or raises StoreClosed, nothing is written after close() returns, and
        the threads end."""
        store.append("s", _evs(1))
        go = threading.Event()

        def work(t: int) -> None:
            go.wait()
            with contextlib.suppress(ae.StoreClosed):  # anything else is a failure of close
                while True:
                    if t % 2:
                        list(store.read("s"))
                        store.head("s")
                    else:
                        store.append("s", _evs(1))

        def close() -> None:
            go.set()
            time.sleep(0.05)
            store.close()

        _in_threads(4, work, meanwhile=close)
