"""Cell stores under concurrent writers: 8 writer processes with random rollbacks over 3
cells and a live ``read_all`` tailer; every committed event is seen exactly once, none
skipped, and a projection runner kept live meanwhile matches a fold of every stream."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

import ares_events as ae
from ares_events.projections import ProjectionRunner, read_model
from tests.fixtures.fix_cells import KINDS, cells_url

# Racing writer processes on cell stores: the full suite runs them, the quick tier does not.
pytestmark = pytest.mark.slow

WRITERS = 8
PER_WRITER = 150


class CountSum:
    """Per stream: how many ``t.ok`` events and the sum of their ``n``."""

    name = "cells_race_count"
    version = 1

    def initial(self) -> Any:
        return {"count": 0, "sum": 0, "last": 0}

    def apply(self, state: Any, event: ae.RecordedEvent) -> Any:
        if event.type != "t.ok":
            return state
        assert event.version > state["last"]  # each stream's events in version order
        return {
            "count": state["count"] + 1,
            "sum": state["sum"] + event.payload["n"],
            "last": event.version,
        }


def _raw_urls(store: ae.EventStore, url: str) -> list[str]:
    """One plain connection URL per server of the cell store (for raw rollbacks)."""
    parts = urlsplit(url)
    params = dict(parse_qsl(parts.query))
    user = parts.netloc.rpartition("@")[0]
    hosts = params.get("hosts", parts.netloc.rpartition("@")[2]).split(",")
    return [f"postgresql://{user}@{h}{parts.path}" for h in hosts]


@pytest.mark.postgres
@pytest.mark.parametrize("kind", KINDS)
def test_tailer_sees_every_committed_event_once(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """8 writers with rollbacks over 3 cells, a live tailer and a live projection runner:
    the tail holds every committed event exactly once, in version order per stream, and
    the read model equals a fold of every stream read on its own."""
    url = cells_url(kind, request)
    with ae.open_store(url) as store:
        shared = ae.stores.Capability.CELL_CURSORS not in store.capabilities
        raws = _raw_urls(store, url)
        procs = [
            subprocess.Popen(
                [
                    sys.executable, "-m", "tests.children.cells_writer_child", url, str(i),
                    str(PER_WRITER), str(tmp_path / f"w{i}.jsonl"), str(1000 + i), *raws,
                ],
                cwd=Path(__file__).parents[2],
            )
            for i in range(WRITERS)
        ]  # fmt: skip
        runner = ProjectionRunner(store, [CountSum()]) if shared else None
        seen: list[tuple[str, int, str]] = []
        cursor = 0

        def drain() -> int:
            nonlocal cursor
            got = 0
            for e in store.read_all(after_position=cursor, limit=200):
                assert e.position > cursor
                cursor = e.position
                if e.type == "t.ok":
                    seen.append((e.stream_id, e.version, e.event_id_str))
                got += 1
            if runner is not None:
                runner.run_once()
            return got

        while any(p.poll() is None for p in procs):
            drain()
        assert [p.wait() for p in procs] == [0] * WRITERS
        while drain():
            pass
        committed = []
        for i in range(WRITERS):
            for line in (tmp_path / f"w{i}.jsonl").read_text().splitlines():
                sid, version, eid = json.loads(line)
                committed.append((sid, version, eid))
        assert len(committed) == WRITERS * PER_WRITER
        assert len(seen) == len(set(seen)), "an event was seen twice"
        assert sorted(seen) == sorted(committed), "the tail differs from what was committed"
        by_stream: dict[str, list[int]] = {}
        for sid, version, _ in seen:
            by_stream.setdefault(sid, []).append(version)
        assert all(v == sorted(v) for v in by_stream.values())
        assert ae.integrity.audit(store).ok
        if runner is not None:
            runner.run_until_idle()
            proj = CountSum()
            for sid, _ in store.streams():
                state = proj.initial()
                for e in store.read(sid):
                    state = proj.apply(state, e)
                assert read_model(store, proj, sid) == state
