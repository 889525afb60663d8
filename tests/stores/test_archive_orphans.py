"""Archive objects no segment index records (issue: an erased payload stayed in the
archive): what an interrupted or outraced archive run wrote is deleted by the next run that
records a segment, never what a run that can still record it is writing; and a run never
moves ``archive/through`` back to an older revision."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.archive import job
from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.segment import INDEX_KEY, MAGIC, THROUGH_KEY, SegmentIndex, parse_through
from ares_events.core.recorder import system_of_record
from tests.fixtures.fix_backends import store_url_for

ROOT = Path(__file__).resolve().parents[2]
SEGMENT = 40


def _fill(store: ae.EventStore) -> None:
    for i in range(300):
        payload = {"i": i, "secret": f"SECRET-{i}"}
        store.append(f"s{i % 4}", [ae.NewEvent(type="t", module="m", payload=payload)])


def _meta(store: ae.EventStore, key: str) -> str | None:
    rec: Any = system_of_record(store.recorder)
    inner = rec.inner if isinstance(rec, ArchiveRecorder) else rec
    got: str | None = inner.meta_get(key)
    return got


def _plain_text(data: bytes) -> bytes:
    """An archive object's bytes, a segment's blocks decompressed."""
    if not data.startswith(MAGIC):
        return data
    rest, out = data[len(MAGIC) :], b""
    while rest:
        d = zlib.decompressobj()
        out += d.decompress(rest)
        rest = d.unused_data
    return out


def _objects(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_runs_segment_with_a_payload_erased_since_is_deleted_by_the_rerun(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """kill -9 after segment 1 is written, erase an event of it (still in the database),
    run again: the rerun writes other bytes, and the interrupted run's objects, which
    held the payload, are gone; only the recorded objects are left."""
    url = store_url_for(backend, tmp_path, request)
    folder = tmp_path / "archive"
    with ae.open_store(url) as store:
        _fill(store)
        before = list(store.read_all())[250].position
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    child = subprocess.run(
        [sys.executable, "-m", "tests.children.archive_crash_child", url, folder.as_uri(),
         str(before), str(SEGMENT), "written", "1"],
        cwd=ROOT, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert child.returncode == -signal.SIGKILL
    needle = b'SECRET-4\\"'  # s0 version 2 (i = 4), as a segment row holds its payload
    assert any(needle in _plain_text(d) for d in _objects(folder).values())
    with ae.open_store(url) as store:
        ae.erase(store, "s0", 2, reason="test", by="pytest")
        job.archive(store, folder.as_uri(), before=before, segment_events=SEGMENT)
        ix = SegmentIndex.from_json(_meta(store, INDEX_KEY) or "")
        assert ae.integrity.audit(store, deep=True).ok
    left = _objects(folder)
    assert [k for k, d in left.items() if needle in _plain_text(d)] == []
    assert set(left) == set(ix.live_keys())


def test_objects_a_run_writes_after_another_runs_commit_are_kept(tmp_path: Path) -> None:
    """Run A is held right after recording its first segment (before it cleans up); run B,
    which read A's index, writes its segment and is held before recording it; A goes on
    and cleans up; B then records its segment, which must still be there."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    to = (tmp_path / "archive").as_uri()
    with ae.open_store(url) as store:
        _fill(store)
        events = list(store.read_all())
    a_recorded, a_go = threading.Event(), threading.Event()
    b_written, b_go = threading.Event(), threading.Event()
    real_step = job._step

    def step(name: str) -> None:
        who = threading.current_thread().name
        if who == "A" and name == "recorded" and not a_recorded.is_set():
            a_recorded.set()
            assert a_go.wait(60)
        if who == "B" and name == "written" and not b_written.is_set():
            b_written.set()
            assert b_go.wait(60)
        real_step(name)

    errors: list[BaseException] = []

    def run(before: int) -> None:
        try:
            with ae.open_store(url) as s:
                job.archive(s, to, before=before, segment_events=SEGMENT)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    job._step = step
    try:
        a = threading.Thread(target=run, args=(events[30].position,), name="A")
        a.start()
        assert a_recorded.wait(60)
        b = threading.Thread(target=run, args=(events[250].position,), name="B")
        b.start()
        assert b_written.wait(60)
        a_go.set()
        a.join(60)
        b_go.set()
        b.join(60)
    finally:
        job._step = real_step
        a_go.set()
        b_go.set()
    assert errors == []
    with ae.open_store(url) as store:
        assert [e.hash for e in store.read_all()] == [e.hash for e in events]
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings


def test_a_run_never_moves_archive_through_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure of an archived event records a later segment index (and its end row)
    while a run starting up holds the index it read: the run leaves the row at the later
    revision."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    to = (tmp_path / "archive").as_uri()
    with ae.open_store(url) as store:
        _fill(store)
        before = list(store.read_all())[100].position
        job.archive(store, to, before=before, segment_events=SEGMENT)
    real = job._finish_deletes

    def finish_then_erase(*args: Any) -> Any:
        got = real(*args)
        with ae.open_store(url) as other:  # another process's erasure, in between
            ae.erase(other, "s0", 2, reason="test", by="pytest")
        return got

    monkeypatch.setattr(job, "_finish_deletes", finish_then_erase)
    with ae.open_store(url) as store:
        job.archive(store, to, before=before, segment_events=SEGMENT)  # nothing new
        ix = SegmentIndex.from_json(_meta(store, INDEX_KEY) or "")
        assert parse_through(_meta(store, THROUGH_KEY) or "") == (ix.through, ix.rev)
