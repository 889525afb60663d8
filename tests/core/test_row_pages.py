"""Reads that come a page of rows at a time (``ares_events.core.row_pages``, issue 33):
iterated they are the events of their rows; taken a page at a time they are sequences of
events built when taken; a verified replay over a SQLite store reads through them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import ares_events as ae
from ares_events import chain
from ares_events.core.events import RecordedEvent
from ares_events.core.iterators import pages
from ares_events.core.row_pages import EventPage, PagedRead, event_maker


def _rows(n: int, start: int = 1) -> list[tuple[Any, ...]]:
    store = ae.open_store("memory://")
    try:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"i": i}) for i in range(n)])
        return [tuple(e[:12]) for e in store.read("s")][start - 1 :]
    finally:
        store.close()


def _source(rows: list[tuple[Any, ...]], size: int, closed: list[bool]) -> Iterator[list[Any]]:
    try:
        for i in range(0, len(rows), size):
            yield rows[i : i + size]
    finally:
        closed.append(True)


def test_iterated_a_read_is_its_events() -> None:
    rows = _rows(7)
    read = PagedRead.over(_source(rows, 3, []))
    got = list(read)
    assert got == [RecordedEvent._from_row(r) for r in rows]
    assert all(type(e) is RecordedEvent for e in got)
    assert [e.payload["i"] for e in got] == list(range(7))


def test_its_pages_are_sequences_of_events() -> None:
    rows = _rows(7)
    got = list(pages(PagedRead.over(_source(rows, 3, [])), 64))
    assert [len(p) for p in got] == [3, 3, 1]
    assert all(isinstance(p, EventPage) for p in got)
    p = got[0]
    assert p[0] == RecordedEvent._from_row(rows[0])
    assert p[-1].version == 3
    assert list(p[1:]) == [RecordedEvent._from_row(r) for r in rows[1:3]]
    assert isinstance(p[1:], EventPage)
    assert [e.version for pg in got for e in pg] == list(range(1, 8))


def test_a_read_is_iterated_or_paged_not_both() -> None:
    read = PagedRead.over(_source(_rows(4), 2, []))
    next(read)
    with pytest.raises(RuntimeError, match="started"):
        list(read.event_pages())
    paged = PagedRead.over(_source(_rows(4), 2, []))
    list(paged.event_pages())
    with pytest.raises(RuntimeError, match="started"):
        next(paged)


def test_closing_a_read_closes_its_source() -> None:
    closed: list[bool] = []
    read = PagedRead.over(_source(_rows(6), 2, closed))
    next(read)
    read.close()
    assert closed == [True]


def test_rows_with_a_reference_go_to_the_slow_builder() -> None:
    rows = _rows(3)
    ref = '{"key":"k","size":3,"digest":"' + "0" * 64 + '"}'
    rows[1] = (*rows[1][:6], None, *rows[1][7:11], ref)
    seen: list[Any] = []

    def wrap(slow: Any) -> Any:
        def attach(row: Any) -> RecordedEvent:
            seen.append(row[1])
            e: RecordedEvent = slow(row)
            return e

        return attach

    got = list(PagedRead.over(_source(rows, 2, [])).with_slow(wrap))
    # Natively only that row; without the native builder every row goes through it.
    native = getattr(chain._native, "row_to_event", None) is not None
    assert seen == ([2] if native else [1, 2, 3])
    assert got[1].payload_ref is not None
    assert got[1].payload_ref.size == 3
    assert event_maker()(rows[0]) == RecordedEvent._from_row(rows[0])


def test_a_sqlite_replay_reads_pages_of_rows(tmp_path: Any) -> None:
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}?page_size=5") as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"i": i}) for i in range(12)])
        read = store.read("s")
        assert type(read) is PagedRead
        res = ae.replay(store, "s", lambda n, e: n + e.payload["i"], 0)
        assert res.ok and res.replayed == 12 and res.state == sum(range(12))
        assert [e.version for e in store.read("s", 4, 6)] == [4, 5, 6]
        assert store.read("s", limit=3).__next__().version == 1
