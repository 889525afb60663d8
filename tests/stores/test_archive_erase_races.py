"""Erasures of archived events racing each other and archive runs: two erasures of one
event, an erasure paused between its segment index swap and its ``archive/through`` write
while a run completes, and a run that meets an erasure's swap. Each race is forced at the
exact point by a hook (the paused side waits on an event), never by timing."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.archive import job as archive_mod
from ares_events.archive.erase import erase_archived as real_erase_archived
from ares_events.archive.job import archive
from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.segment import INDEX_KEY, THROUGH_KEY, SegmentIndex
from ares_events.core.recorder import system_of_record
from ares_events.errors import ArchiveError
from tests.fixtures.fix_backends import store_url_for

STREAMS = ("agent-0", "agent-1", "agent-2")
PER_STREAM = 100
WAIT = 60  # seconds a paused side waits for its go: only a hang ever reaches it


def _fill(store: ae.EventStore, n: int = PER_STREAM) -> None:
    for i in range(n):
        for sid in STREAMS:
            store.append(sid, [ae.NewEvent(type="t", module="m", payload={"i": i, "s": sid})])


def _rec(store: ae.EventStore) -> ArchiveRecorder:
    rec = system_of_record(store.recorder)
    assert isinstance(rec, ArchiveRecorder), type(rec)
    return rec


def _index(store: ae.EventStore) -> SegmentIndex:
    ix = _rec(store).segment_index()
    assert ix is not None
    return ix


def _position_at(store: ae.EventStore, n: int) -> int:
    """The position of the ``n``-th event (positions are not 1, 2, 3, ... on PostgreSQL)."""
    return [e.position for e in store.read_all()][n - 1]


def _every_object_is_there(store: ae.EventStore) -> None:
    """Every manifest and segment the index references exists in the archive."""
    rec = _rec(store)
    ix = _index(store)
    blobs = rec.source.blobs(ix)
    for entry in ix.segments:
        if entry.retired is None:
            for ref in (entry.manifest, entry.segment):
                assert blobs.exists(ref.key), f"segment {entry.seq}: {ref.key} is gone"


@pytest.fixture(
    params=[
        pytest.param(("sqlite", "file"), id="sqlite-file"),
        pytest.param(
            ("postgres", "s3"), id="postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]
        ),
    ]
)
def urls(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A filled store's URL (each backend) and an archive location (a folder, or S3)."""
    backend, kind = request.param
    url = store_url_for(backend, tmp_path, request)
    if kind == "s3":
        import boto3

        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"archive-{uuid.uuid4().hex[:12]}"
        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        to = f"s3://{bucket}/segments?endpoint_url={endpoint}"
    else:
        to = (tmp_path / "arch").as_uri()
    with ae.open_store(url) as store:
        _fill(store)
    yield url, to


class _Pause:
    """Pauses the thread that reaches a hooked point until the test says go."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self.errors: list[BaseException] = []

    def wait_here(self) -> None:
        self.reached.set()
        if not self.go.wait(WAIT):
            raise TimeoutError("the test never let the paused side go on")

    def run(self, fn: Callable[[], Any], name: str = "paused") -> threading.Thread:
        """``fn`` on a thread of its own (named ``name``); an exception it raises is kept
        in ``errors``."""

        def body() -> None:
            try:
                fn()
            except BaseException as exc:  # re-raised by the test on the main thread
                self.errors.append(exc)
            finally:
                self.reached.set()  # a side that failed before the point never hangs the test

        t = threading.Thread(target=body, name=name)
        t.start()
        return t


def test_two_erasures_of_one_archived_event_lose_no_segment(
    urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two erasures of one archived event at once: the one that loses the segment index
    swap finds the event erased and reports it already erased; no object the index
    references is deleted, every event still reads, and the deep audit is clean."""
    url, to = urls
    with ae.open_store(url) as store:
        archive(store, to, before=_position_at(store, 250), segment_events=100)
        expected = list(store.read_all())
    pause = _Pause()

    def erase_archived(*args: Any) -> Any:
        done = real_erase_archived(*args)
        if threading.current_thread().name == "slow-eraser":
            pause.wait_here()  # the rewrite is made from the index as it was; not swapped yet
        return done

    # the recorder's own name for it (the blocking face's module imports it by name)
    monkeypatch.setattr("ares_events.archive.reader.erase_archived", erase_archived)
    reports: list[ae.ErasureReport] = []

    def slow() -> None:
        with ae.open_store(url) as s:
            reports.append(ae.erase(s, "agent-0", 5, reason="GDPR #1", by="dpo"))

    t = pause.run(slow, "slow-eraser")
    assert pause.reached.wait(WAIT)
    with ae.open_store(url) as fast:
        first = ae.erase(fast, "agent-0", 5, reason="GDPR #1", by="dpo")
    pause.go.set()
    t.join(WAIT)
    if pause.errors:
        raise pause.errors[0]
    with ae.open_store(url) as store:
        _every_object_is_there(store)
        got = list(store.read_all())
        assert [(e.stream_id, e.version) for e in got] == [
            (e.stream_id, e.version) for e in expected
        ] + [(ae.ERASURE_STREAM, 1)]
        assert next(iter(store.read("agent-0", from_version=5, limit=1))).payload_erased
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings
    assert not first.already_erased
    assert [r.already_erased for r in reports] == [True]


def test_objects_an_index_references_are_never_dropped(tmp_path: Path) -> None:
    """Dropping replaced objects (after a rewrite, or the pending ones a run settles)
    never deletes a manifest or segment the segment index given references: a rewrite
    that wrote the same bytes under the same key keeps them."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        to = (tmp_path / "arch").as_uri()
        archive(store, to, before=_position_at(store, 250), segment_events=100)
        rec = _rec(store)
        ix = _index(store)
        live = ix.segments[0]
        rec.source.drop_objects(ix, [live.segment.key, live.manifest.key])
        _every_object_is_there(store)
        # the index names them as pending too (as a rewrite to equal bytes would)
        text = rec.inner.meta_get(INDEX_KEY)
        named = dataclasses.replace(ix, pending=(live.segment.key, live.manifest.key))
        assert rec.inner.meta_swap(INDEX_KEY, text, named.to_json())
        archive(store, to, before=_position_at(store, 250), segment_events=100)  # settles it
        assert _index(store).pending == ()
        _every_object_is_there(store)
        assert ae.integrity.audit(store, deep=True).ok


def test_a_stale_through_write_never_hides_archived_events(
    urls: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure paused between its segment index swap and its ``archive/through`` write
    while an archive run completes: afterwards ``archive/through`` names the index's
    revision, read_all (a reader from before and a new one) returns every event, and the
    audit's position scan sees them all."""
    url, to = urls
    with ae.open_store(url) as store:
        archive(store, to, before=_position_at(store, 100), segment_events=50)
        expected = [(e.stream_id, e.version) for e in store.read_all()]
    pause = _Pause()

    def erase() -> None:
        with ae.open_store(url) as s:
            inner = _rec(s).inner
            real = inner.meta_swap

            def meta_swap(key: str, old: str | None, new: str) -> bool:
                won = bool(real(key, old, new))
                if key == INDEX_KEY and won and not pause.reached.is_set():
                    pause.wait_here()  # swapped; its end row not written yet
                return won

            inner.meta_swap = meta_swap
            ae.erase(s, "agent-0", 5, reason="GDPR", by="dpo")

    with ae.open_store(url) as early:
        assert len(list(early.read_all())) == len(expected)  # its index cached now
        t = pause.run(erase)
        assert pause.reached.wait(WAIT)
        with ae.open_store(url) as store:
            archive(store, to, before=_position_at(store, 280), segment_events=50)
        pause.go.set()
        t.join(WAIT)
        if pause.errors:
            raise pause.errors[0]
        want = [*expected, (ae.ERASURE_STREAM, 1)]
        assert [(e.stream_id, e.version) for e in early.read_all()] == want
        with ae.open_store(url) as store:
            assert [(e.stream_id, e.version) for e in store.read_all()] == want
            audit = ae.integrity.audit(store)
            assert audit.ok and audit.events_checked == len(want), audit.findings
            ix = _index(store)
            assert _rec(store).inner.meta_get(THROUGH_KEY) == f"{ix.through} {ix.rev}"


def test_a_through_row_set_lower_by_hand_skips_nothing(tmp_path: Path) -> None:
    """``archive/through`` moved back by hand (its revision kept): read_all still
    returns every event, from the archive's end as the segment index records it, and the
    deep audit reports the row (``archive_through``), not "ok"."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_position_at(store, 250),
                segment_events=100)  # fmt: skip
        expected = list(store.read_all())
        ix = _index(store)
        inner = _rec(store).inner
        inner.meta_set(THROUGH_KEY, f"{ix.segments[0].last_position} {ix.rev}")
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        assert list(store.read_all()) == expected
        assert ae.integrity.audit(store).events_checked == len(expected)
        deep = ae.integrity.audit(store, deep=True)
        assert not deep.ok
        assert [f.kind for f in deep.findings] == ["archive_through"]


def test_a_run_that_meets_an_erasure_says_the_index_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An archive run whose segment index swap loses to an erasure of an archived event
    (no other run) does not blame another archive run."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    to = (tmp_path / "arch").as_uri()
    with ae.open_store(url) as store:
        _fill(store)
        archive(store, to, before=_position_at(store, 100), segment_events=50)
        done: list[str] = []

        def step(name: str) -> None:
            if name == "verified" and not done:  # sealed, its index swap next
                done.append(name)
                with ae.open_store(url) as other:
                    ae.erase(other, "agent-0", 3, reason="GDPR #2", by="dpo")

        monkeypatch.setattr(archive_mod, "_step", step)
        try:
            archive(store, to, before=_position_at(store, 250), segment_events=50)
        except ArchiveError as exc:  # (a run that re-read the index and went on is right too)
            assert exc.kind == "busy"
            assert exc.detail == (
                "the segment index changed meanwhile: an erasure rewrote segment 1; run again"
            )
        assert done
        monkeypatch.undo()
        archive(store, to, before=_position_at(store, 250), segment_events=50)
        assert ae.integrity.audit(store, deep=True).ok
