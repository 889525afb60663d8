"""Stream pages beyond the shared suite: the asyncio face on every backend (the SQLite one
through the worker-thread adapter), PostgreSQL's exact prefix under a collation that is
not byte order, and a listing of many streams page by page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.recorder import system_of_record
from tests.fixtures.fix_backends import open_async_backend, open_backend

IDS = ["a", "a%", "a_b", "ab", "b/1", "b/2", "é", "z"]


def _fill(store: Any) -> None:
    for sid in IDS:
        store.append(sid, [ae.NewEvent(type="t.x", module="m", payload={})])


@pytest.mark.parametrize(
    "backend", ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_async_face_pages_like_the_blocking_one(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """AsyncEventStore.streams_page returns the blocking face's pages."""
    with open_async_backend(backend, tmp_path, request) as store:
        _fill(store)
        assert [s for s, _ in store.streams_page(limit=3)] == ["a", "a%", "a_b"]
        assert [s for s, _ in store.streams_page(after="a_b", limit=3)] == ["ab", "b/1", "b/2"]
        assert [s for s, _ in store.streams_page(prefix="b/", limit=10)] == ["b/1", "b/2"]


@pytest.mark.postgres
def test_postgres_prefix_without_byte_order(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Where the database's collation is not byte order, the prefix is still exact
    (starts_with, scanned from the cursor) and paging still chains."""
    with open_backend("postgres", tmp_path, request) as store:
        _fill(store)
        rec = system_of_record(store.recorder)
        rec._byte_order = False  # type: ignore[attr-defined]
        for prefix in ("a", "a%", "a_", "b/", "é", "zz"):
            want = [s for s, _ in store.streams() if s.startswith(prefix)]
            assert [s for s, _ in store.streams_page(prefix=prefix, limit=50)] == want
            got: list[str] = []
            after = ""
            while page := store.streams_page(prefix=prefix, after=after, limit=1):
                got.append(page[0][0])
                after = page[0][0]
            assert got == want


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_many_streams_page_by_page(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """3,000 streams, pages of 100: every stream once, in order, 30 pages."""
    with open_backend(backend, tmp_path, request) as store:
        ids = [f"s-{i:05d}" for i in range(3000)]
        for lo in range(0, len(ids), 500):
            store.append_many(
                [
                    (sid, [ae.NewEvent(type="t.x", module="m", payload={})], ae.NO_STREAM)
                    for sid in ids[lo : lo + 500]
                ]
            )
        seen: list[str] = []
        after, pages = "", 0
        while page := store.streams_page(after=after, limit=100):
            pages += 1
            seen.extend(s for s, _ in page)
            after = page[-1][0]
        assert seen == ids and pages == 30
        assert [s for s, _ in store.streams_page(prefix="s-0299", limit=100)] == [
            f"s-0299{d}" for d in range(10)
        ]
