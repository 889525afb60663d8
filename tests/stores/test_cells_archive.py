"""The archive on cell stores (issue 25 with issue 21): cells that share one clock
(schemas of one database, Citus) archive like a single store, every read API returns
the same events after archiving, the chain, the Merkle log and the deep audit verify
across the boundary, an archived event can be erased; cells on separate servers (a
position space each) are refused with a ConfigError that says why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.archive.job import archive
from ares_events.errors import ConfigError
from ares_events.testing.blocking import open_blocking
from tests.fixtures.fix_cells import cells_url
from tests.stores.test_archive import STREAMS, _archive_recorder, _at, _db_rows, _fill, _reads

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("kind", ["schemas", "citus"])
def test_cells_on_one_clock_archive_and_read_through(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = cells_url(kind, request)
    with ae.open_store(url, blobs=(tmp_path / "blobs").as_uri()) as store:
        _fill(store)
        before = _reads(store)
        rows_before = _db_rows(store)
        rep = archive(
            store, (tmp_path / "arch").as_uri(), before=_at(store, 200), segment_events=60,
            block_events=16,
        )  # fmt: skip
        assert rep.events_archived > 150 and len(rep.segments) >= 3
        assert _db_rows(store) == rows_before - rep.events_archived
        # rows of every cell went: the streams live in more than one cell
        rec = _archive_recorder(store)
        cells = rec.inner.cells
        assert len({rec.inner.cell_index(sid) for sid in STREAMS}) > 1
        assert len(cells) == 3
        assert _reads(store) == before
        for sid in STREAMS:
            assert ae.integrity.verify_stream(store, sid).ok, sid
        assert ae.integrity.audit(store, deep=True).ok
        # an archived event is erased: its segment is rewritten, the chain still verifies
        first = next(iter(store.read("agent-b")))
        ae.erase(store, "agent-b", first.version, reason="test", by="tester")
        again = next(iter(store.read("agent-b")))
        assert again.payload_erased and again.hash == first.hash
        assert ae.integrity.verify_stream(store, "agent-b").ok
        assert ae.integrity.audit(store, deep=True).ok
    # a new process's view: the same events (one payload erased), still verified
    with ae.open_store(url, blobs=(tmp_path / "blobs").as_uri()) as store:
        got = [(e.stream_id, e.version, e.position, e.hash) for e in store.read_all()]
        erasures = [g for g in got if g[0] == "ares-events/erasures"]
        assert len(erasures) == 1  # the erasure's own record
        assert [g for g in got if g not in erasures] == [
            (e[0], e[1], e[2], e[10]) for e in before["all"]
        ]
        assert ae.integrity.audit(store, deep=True).ok
    # the native asyncio face of the cell store reads through the archive too
    with open_blocking(url, blobs=(tmp_path / "blobs").as_uri()) as astore:
        assert [(e.stream_id, e.version, e.position, e.hash) for e in astore.read_all()] == got
        assert ae.integrity.verify_stream(astore, "agent-a").ok  # type: ignore[arg-type]


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_cells_on_separate_servers_are_refused(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    with ae.open_store(cells_url("servers", request)) as store:
        store.append("agent-a", [ae.NewEvent(type="t", module="m")])
        with pytest.raises(ConfigError, match="separate servers"):
            archive(store, (tmp_path / "arch").as_uri(), before=10**18)
        assert [e.version for e in store.read("agent-a")] == [1]
        rec: Any = store.recorder  # the Recorder protocol does not name metadata
        assert rec.meta_get("archive/catalog") is None and rec.meta_get("archive/through") is None
