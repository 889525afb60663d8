"""The archive run under ``kill -9`` (issue 25): a child process archives and kills itself
right after each step (segment and manifest written, read back and verified, recorded
in the segment index, rows deleted), at the first and at a later segment. After every crash
the store reads exactly the events it held (0 lost, 0 duplicated), the deep audit is
clean, and the next run finishes the job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.archive.job import STEPS, archive
from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.segment import stored
from ares_events.core.recorder import system_of_record
from tests.fixtures.fix_backends import store_url_for
from tests.fixtures.fix_cells import cells_url

# A kill -9 matrix: the full suite runs it, the quick tier does not.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SEGMENT = 40


def _fill(store: ae.EventStore) -> None:
    for i in range(300):
        store.append(f"s{i % 4}", [ae.NewEvent(type="t", module="m", payload={"i": i})])


def _check(store: ae.EventStore, events: list[ae.RecordedEvent]) -> None:
    got = list(store.read_all())
    positions = [e.position for e in got]
    assert len(positions) == len(set(positions)), "an event was served twice"
    assert [stored(e) for e in got] == [stored(e) for e in events], f"{len(got)} events read"
    for sid in {e.stream_id for e in events}:
        assert list(store.read(sid)) == [e for e in events if e.stream_id == sid]
    audit = ae.integrity.audit(store, deep=True)
    assert audit.ok, audit.findings


CASES = [
    *[(b, step, nth) for b in ("sqlite", "postgres", "cells") for step in STEPS for nth in (1, 3)],
    # a cell store deletes a segment's rows cell by cell: killed between two cells
    *[("cells", "cell-deleted", nth) for nth in (1, 4)],
]


@pytest.mark.parametrize(
    ("backend", "step", "nth"),
    [pytest.param(*c, marks=[pytest.mark.postgres] if c[0] != "sqlite" else []) for c in CASES],
)
def test_kill_9_after_each_step_loses_and_repeats_nothing(
    backend: str, step: str, nth: int, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Kill -9 after STEP of the NTH segment, reopen: every event is there once and the
    audit is clean; run again: the archive completes, still exact and clean."""
    url = (
        cells_url("schemas", request)
        if backend == "cells"
        else store_url_for(backend, tmp_path, request)
    )
    to = (tmp_path / "archive").as_uri()
    with ae.open_store(url) as store:
        _fill(store)
        events = list(store.read_all())
    before = events[250].position
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.run(
        [sys.executable, "-m", "tests.children.archive_crash_child", url, to, str(before),
         str(SEGMENT), step, str(nth)],
        cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL
    with ae.open_store(url) as store:
        _check(store, events)
        report = archive(store, to, before=before, segment_events=SEGMENT)
        _check(store, events)
        rec = system_of_record(store.recorder)
        assert isinstance(rec, ArchiveRecorder), type(rec)
        ix = rec.segment_index()
        assert ix is not None and ix.through == events[249].position
        archived = sum(s.events for s in ix.segments)
        left = sum(1 for _ in rec.inner.read_all(0, None))
        # every event is in exactly one place: the 250 before the horizon in the archive
        assert (archived, left) == (250, len(events) - 250)
        assert report.rows_deleted + report.events_archived >= 250 - SEGMENT * nth
        assert ae.integrity.audit(store, deep=True).segments_checked == len(ix.segments)
