"""Growing a Citus cell store: a worker added and cells moved onto it (and back) online
while 4 writer processes append; nothing lost, duplicated or forked, the audit clean."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.stores.cells.citus import cell_placements, move_cell, rebalance
from tests.fixtures import cell_servers

WRITERS = 4
PER_WRITER = 250


@pytest.fixture
def own_cluster() -> Iterator[tuple[list[int], contextlib.ExitStack]]:
    """A Citus cluster of this test's own (it adds a worker): ports, and a stack that
    stops the workers it adds."""
    with contextlib.ExitStack() as stack, cell_servers.citus_cluster(2) as (_url, ports):
        yield ports, stack


def _committed(tmp_path: Path) -> list[tuple[str, int, str]]:
    out = []
    for i in range(WRITERS):
        for line in (tmp_path / f"w{i}.jsonl").read_text().splitlines():
            sid, version, eid = json.loads(line)
            out.append((sid, version, eid))
    return out


@pytest.mark.postgres
def test_cells_move_between_workers_under_writers(
    own_cluster: tuple[list[int], contextlib.ExitStack], tmp_path: Path
) -> None:
    """A worker is added, the rebalancer spreads the cells onto it and every cell then
    moves to another worker while 4 writers append: every committed append is stored
    once, streams have versions 1..n, chains verify, the audit is clean, and a tailer that
    followed read_all through the moves saw each event once."""
    ports, stack = own_cluster
    url = f"citus://root@127.0.0.1:{ports[0]}/postgres?cells=3&partitions=12&prefix=m{uuid.uuid4().hex[:8]}"
    with ae.open_store(url) as store:
        before = {p.cell: p.port for p in cell_placements(store)}
        assert sorted(set(before.values())) == sorted(ports[1:])  # Citus used both workers
        procs = [
            subprocess.Popen(
                [
                    sys.executable, "-m", "tests.children.cells_writer_child", url, str(i),
                    str(PER_WRITER), str(tmp_path / f"w{i}.jsonl"), str(7 + i),
                ],
                cwd=Path(__file__).parents[2],
            )
            for i in range(WRITERS)
        ]  # fmt: skip
        seen: list[str] = []
        cursor = 0

        def drain() -> None:
            nonlocal cursor
            for e in store.read_all(after_position=cursor):
                cursor = e.position
                if e.type == "t.ok":
                    seen.append(e.event_id_str)

        new = cell_servers.add_citus_worker(ports[0], stack)
        rebalance(store)  # Citus's rebalancer spreads the three cells over three workers
        drain()
        spread = {p.cell: p.port for p in cell_placements(store)}
        assert sorted(spread.values()) == sorted([*ports[1:], new])
        workers = sorted(spread.values())
        for n, (cell, port) in enumerate(sorted(spread.items())):
            target = workers[(workers.index(port) + 1) % len(workers)]
            # One move blocks writes to its cell while it copies; the others are logical.
            move_cell(store, cell, "127.0.0.1", target, mode="block_writes" if n == 0 else "auto")
            drain()
        moved = {p.cell: p.port for p in cell_placements(store)}
        assert all(moved[c] != spread[c] for c in spread)
        assert [p.wait() for p in procs] == [0] * WRITERS
        drain()
        committed = _committed(tmp_path)
        assert len(committed) == WRITERS * PER_WRITER
        stored = [
            (e.stream_id, e.version, e.event_id_str) for e in store.read_all() if e.type == "t.ok"
        ]
        assert len(stored) == len(set(stored)), "duplicated"
        assert sorted(stored) == sorted(committed), "lost or extra events"
        assert sorted(seen) == sorted(eid for _, _, eid in committed), (
            "the tailer missed or repeated"
        )
        for sid, version in store.streams():
            assert [e.version for e in store.read(sid)] == list(range(1, version + 1))
            assert ae.integrity.verify_stream(store, sid).ok
        report = ae.integrity.audit(store, deep=True)
        assert report.ok, report.findings
