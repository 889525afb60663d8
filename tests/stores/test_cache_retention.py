"""Retention behind the Redis cache (docs/operations.md, "Erasure and the cache"): once
``retire`` returns, no store object serves a retired event from Redis, whether it read
the stream through the cache before the retirement, or was opened after it; a read
racing the retirement does not put the retired events back. Real Redis, SQLite and
PostgreSQL.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.archive.job import archive
from ares_events.archive.retention import retire
from ares_events.core.recorder import system_of_record
from ares_events.stores.cache import CachedRecorder
from tests.fixtures.fix_backends import redis_cache_url, store_url_for

pytestmark = pytest.mark.redis

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
RANGES = [(1, None, None), (2, None, None), (1, 4, None), (1, None, 2), (5, None, None)]
AFTER = [["PII-4"], ["PII-4"], [], ["PII-4"], ["PII-4"]]
"""What :data:`RANGES` read after versions 1-4 were retired (the store skips them)."""


def _cache(store: ae.EventStore) -> CachedRecorder:
    rec = store.recorder
    assert isinstance(rec, CachedRecorder)
    return rec


def _pii(events: Any) -> list[Any]:
    return [e.payload["pii"] for e in events]


def _reads(store: ae.EventStore) -> list[list[Any]]:
    """``person-1`` read over every range of :data:`RANGES`."""
    return [_pii(store.read("person-1", lo, hi, n)) for lo, hi, n in RANGES]


def _stored(store: ae.EventStore) -> list[list[Any]]:
    """The same reads from the system of record (under the cache)."""
    rec = system_of_record(store.recorder)
    return [_pii(rec.read("person-1", lo, hi, n)) for lo, hi, n in RANGES]


@contextlib.contextmanager
def _archived(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A store whose ``person-1`` holds PII-0..PII-4, versions 1-4 archived (the last
    event of a stream stays in the database); yields its URL."""
    url = store_url_for(backend, tmp_path, request)
    with ae.open_store(url) as s:
        s.append(
            "person-1",
            [ae.NewEvent(type="t", module="m", payload={"pii": f"PII-{i}"}) for i in range(5)],
        )
        s.append("other", [ae.NewEvent(type="t", module="m", payload={"i": 0})])
        report = archive(s, (tmp_path / "arch").as_uri(), before=s.last_position() + 1)
        assert report.events_archived == 4
    yield url


def _retire(url: str, cache: str, *, read: bool) -> None:
    """Retire versions 1-4 through a store object with the cache; with ``read``, check
    that object's own reads after (they refill the tail)."""
    with ae.open_store(url, cache=cache) as retiring:
        rep = retire(retiring, before=retiring.last_position() + 1, reason="policy", by="dpo")
        assert rep.events == 4
        if read:
            assert _reads(retiring) == AFTER


@pytest.mark.parametrize("backend", BACKENDS)
def test_retired_events_are_never_served_from_the_cache(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A store object that cached the stream's tail before another one retired its oldest
    events, and one opened after, read only what the store still holds: the retirement
    dropped the tail (and the cache still serves the stream afterwards)."""
    with (
        redis_cache_url(request) as cache,
        _archived(backend, tmp_path, request) as url,
        ae.open_store(url, cache=cache) as reader,
    ):
        everything = ["PII-0", "PII-1", "PII-2", "PII-3", "PII-4"]
        assert _pii(reader.read("person-1")) == everything
        assert _pii(reader.read("person-1")) == everything
        assert _cache(reader).stats.hits == 1  # the tail holds the archived events
        _retire(url, cache, read=True)
        assert _stored(reader) == AFTER
        assert _reads(reader) == AFTER
        assert _reads(reader) == AFTER
        with ae.open_store(url, cache=cache) as fresh:
            assert _reads(fresh) == AFTER
            hits = _cache(fresh).stats.hits
            assert _pii(fresh.read("person-1", 5)) == ["PII-4"]
            assert _cache(fresh).stats.hits == hits + 1  # cached again, from the store
        assert _cache(reader).stats.forged == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_read_racing_a_retirement_does_not_put_the_retired_events_back(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A read that fetched the archived events before the retirement and refills the tail
    after it: its write is refused (the retirement replaced the erasure epoch)."""
    with (
        redis_cache_url(request) as cache,
        _archived(backend, tmp_path, request) as url,
        ae.open_store(url, cache=cache) as reader,
    ):
        it = iter(reader.read("person-1"))
        assert next(it).payload["pii"] == "PII-0"  # the archive's chunk is read
        _retire(url, cache, read=False)
        assert _pii(it) == ["PII-1", "PII-2", "PII-3", "PII-4"]  # read before: served
        assert _reads(reader) == _stored(reader) == AFTER
        with ae.open_store(url, cache=cache) as fresh:
            assert _reads(fresh) == _stored(fresh) == AFTER
