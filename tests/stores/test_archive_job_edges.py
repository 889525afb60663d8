"""Edges of the archive run found by an outside tester: the blob location against the
archive (gc-blobs deleted every segment), a first run that failed or archived nothing
binding the store for good, and the retention workflow losing the records the audit
checks tombstones and erasures against."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.archive import job as archive_mod
from ares_events.archive.job import archive
from ares_events.archive.retention import retire
from ares_events.core.events import ERASURE_STREAM, RETENTION_STREAM
from ares_events.core.identity import IDENTITY_KEY, BlobsIdentity, StoreIdentity
from ares_events.core.recorder import backend_of
from ares_events.errors import ArchiveError, ConfigError
from ares_events.stores.blobs.gc import gc_blobs
from tests.fixtures.cli_helpers import run, run_json
from tests.fixtures.fix_backends import store_url_for


def _fill(store: ae.EventStore, streams: int = 3, events: int = 20) -> None:
    """``streams`` interleaved streams of ``events`` events each."""
    for i in range(events):
        for k in range(streams):
            payload = {"i": i, "k": k, "text": f"step {i} of agent-{k}"}
            store.append(f"agent-{k}", [ae.NewEvent(type="step", module="rt", payload=payload)])


def _end(store: ae.EventStore) -> int:
    """A horizon past every event (positions are not 1, 2, 3, ... on PostgreSQL)."""
    return store.last_position() + 1


def _identity_archive(store: ae.EventStore) -> str | None:
    """The archive location the identity records in the database now."""
    raw = backend_of(store.recorder).meta_get(IDENTITY_KEY)
    assert raw is not None
    ident = StoreIdentity.from_json(raw, store.url)
    return None if ident.archive is None else ident.archive.location


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh SQLite or PostgreSQL store URL."""
    return store_url_for(request.param, tmp_path, request)


@pytest.fixture
def s3_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The moto endpoint as an ``endpoint_url=...`` query (no bucket made)."""
    yield f"endpoint_url={request.getfixturevalue('s3_endpoint')}"


# -- 4: the blob location may not be, contain or be inside the archive ----------------


def _overlaps(tmp_path: Path) -> list[str]:
    """The archive folder spelled otherwise, a folder inside it, and one that holds it."""
    arch = tmp_path / "arch"
    return [f"{(tmp_path / 'x').as_uri()}/../arch/", (arch / "sub").as_uri(), tmp_path.as_uri()]


def test_gc_blobs_refuses_a_blob_location_overlapping_the_archive(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gc-blobs with --blobs at the archive (another spelling of it, inside it, or around
    it) is refused (exit 2, ConfigError) and deletes nothing: it deleted every segment."""
    with ae.open_store(store_url, blobs=False) as store:
        _fill(store)
        rep = archive(store, (tmp_path / "arch").as_uri(), before=_end(store), segment_events=20)
        assert len(rep.segments) == 3
    objects = sorted(p for p in (tmp_path / "arch").rglob("*") if p.is_file())
    for blobs in _overlaps(tmp_path):
        with ae.open_store(store_url, blobs=blobs) as store, pytest.raises(ConfigError) as info:
            gc_blobs(store, timedelta(0), now=datetime.now(UTC) + timedelta(seconds=5))
        assert "overlaps the archive" in str(info.value)
        code, _, err = run(capsys, "--store", store_url, "--blobs", blobs, "gc-blobs",
                           "--older-than", "0s")  # fmt: skip
        assert code == 2 and "overlaps the archive" in err, err
    assert sorted(p for p in (tmp_path / "arch").rglob("*") if p.is_file()) == objects
    with ae.open_store(store_url) as store:
        assert ae.integrity.audit(store, deep=True).ok
    # a blob location beside the archive is fine
    code, _, err = run(capsys, "--store", store_url, "--blobs", (tmp_path / "arch2").as_uri(),
                       "gc-blobs", "--older-than", "0s")  # fmt: skip
    assert code == 0, err


def test_init_relocate_blobs_refuses_the_archive_location(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """init --relocate-blobs --blobs <the archive, inside or around it> is refused (exit 2)
    and the identity keeps its blob location; a location apart is recorded."""
    db = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(db) as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_end(store), segment_events=20)
        before = store.identity
    for blobs in _overlaps(tmp_path):
        code, _, err = run(capsys, "--store", db, "--blobs", blobs, "init", "--relocate-blobs")
        assert code == 2 and "overlaps the archive" in err, err
        with ae.open_store(db) as store:
            assert store.identity == before
    moved = (tmp_path / "moved").as_uri()
    code, data = run_json(capsys, "--store", db, "--blobs", moved, "init", "--relocate-blobs")
    assert code == 0 and data["identity"]["blobs"]["location"] == moved


def test_the_archive_may_not_overlap_the_blob_location(tmp_path: Path) -> None:
    """The archive run refuses an archive inside, around or equal to the blob location
    (the same check gc-blobs makes), before writing or recording anything."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", blobs=(tmp_path / "arch").as_uri()) as s:
        _fill(s)
        for to in _overlaps(tmp_path):
            with pytest.raises(ConfigError, match="overlaps the archive"):
                archive(s, to, before=_end(s))
        assert _identity_archive(s) is None


# -- 5: the location is recorded only when the first segment commits ------------------


@pytest.mark.s3
def test_a_failed_first_run_does_not_bind_the_store(
    store_url: str, tmp_path: Path, s3_url: str
) -> None:
    """A first run to a bucket that does not exist fails (StoreUnavailable) and records
    nothing: the run to the right location then archives."""
    import boto3

    endpoint = s3_url.removeprefix("endpoint_url=")
    bucket = f"good-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    with ae.open_store(store_url) as store:
        _fill(store)
        with pytest.raises(ae.StoreUnavailable):
            archive(store, f"s3://no-such-{bucket}/arch?{s3_url}", before=_end(store))
        assert _identity_archive(store) is None
        good = f"s3://{bucket}/arch?{s3_url}"
        rep = archive(store, good, before=_end(store), segment_events=20)
        assert rep.events_archived > 0 and _identity_archive(store) == f"s3://{bucket}/arch"
    with ae.open_store(store_url) as store:
        assert ae.integrity.audit(store, deep=True).ok


def test_a_run_that_archives_nothing_does_not_bind_the_store(
    store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """archive --before 90d on a young store says nothing to archive and records no
    location: a run to another location then archives, and it is recorded."""
    with ae.open_store(store_url) as store:
        _fill(store)
        horizon = _end(store)
    code, out, err = run(capsys, "--store", store_url, "archive", "--to",
                         (tmp_path / "try").as_uri(), "--before", "90d")  # fmt: skip
    assert code == 0 and "nothing to archive" in out, err
    code, data = run_json(capsys, "--store", store_url, "archive", "--status")
    assert code == 0 and data["archive"] is None
    prod = (tmp_path / "prod").as_uri()
    code, data = run_json(capsys, "--store", store_url, "archive", "--to", prod,
                          "--before", str(horizon), "--segment-events", "20")  # fmt: skip
    assert code == 0 and data["events_archived"] > 0, data
    with ae.open_store(store_url) as store:
        assert _identity_archive(store) == prod
        assert ae.integrity.audit(store, deep=True).ok


def test_a_store_bound_with_nothing_archived_can_archive_elsewhere(tmp_path: Path) -> None:
    """A store whose identity names an archive but which never committed a segment (what
    a failed first run left before this fix) archives to another location, which is then
    the one recorded."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        rec = backend_of(store.recorder)
        ident = store.identity
        assert ident is not None
        stale = BlobsIdentity((tmp_path / "typo").as_uri(), (tmp_path / "typo").as_uri())
        bound = dataclasses.replace(ident, archive=stale)
        rec.meta_set(IDENTITY_KEY, bound.to_json())
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        good = (tmp_path / "good").as_uri()
        assert archive(store, good, before=_end(store), segment_events=20).events_archived
        assert _identity_archive(store) == good
        assert ae.integrity.audit(store, deep=True).ok
        with pytest.raises(ConfigError, match="archives to"):
            archive(store, (tmp_path / "typo").as_uri(), before=_end(store))


def test_two_first_runs_to_different_locations_cannot_both_commit(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A is held after verifying its first segment while run B, to another location,
    archives: A's commit is refused (busy), B's location is the one recorded, and a later
    run to A's location is refused."""
    with ae.open_store(store_url) as store:
        _fill(store)
        horizon = _end(store)
    held, go = threading.Event(), threading.Event()
    main = threading.get_ident()
    real = archive_mod._step

    def hold(name: str) -> None:
        real(name)
        if name == "verified" and threading.get_ident() != main and not held.is_set():
            held.set()
            go.wait(30)

    monkeypatch.setattr(archive_mod, "_step", hold)
    errors: list[BaseException] = []

    def run_a() -> None:
        with ae.open_store(store_url) as s:
            try:
                archive(s, (tmp_path / "a").as_uri(), before=horizon, segment_events=20)
            except BaseException as exc:  # the test reads it below
                errors.append(exc)

    t = threading.Thread(target=run_a)
    t.start()
    assert held.wait(30)
    with ae.open_store(store_url) as store:
        rep = archive(store, (tmp_path / "b").as_uri(), before=horizon, segment_events=20)
        assert rep.events_archived > 0
    go.set()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], ArchiveError), errors
    assert errors[0].kind == "busy"
    with ae.open_store(store_url) as store:
        assert _identity_archive(store) == (tmp_path / "b").as_uri()
        with pytest.raises(ConfigError, match="archives to"):
            archive(store, (tmp_path / "a").as_uri(), before=horizon)
        assert ae.integrity.audit(store, deep=True).ok


# -- 6: retention never retires the records it and erasure keep -----------------------


def test_the_retention_workflow_keeps_the_audit_green(store_url: str, tmp_path: Path) -> None:
    """Three rounds of archive then retire (docs/archive.md), with an erased stream head
    and an erased old event: the deep audit stays clean, and every retention and erasure
    record stays readable (they were archived, then retired: retention_unrecorded and
    erasure_unrecorded)."""
    to = (tmp_path / "arch").as_uri()
    with ae.open_store(store_url) as store:
        _fill(store, 3, 40)
        ae.erase(store, "agent-2", 40, reason="head erased", by="pytest")
        ae.erase(store, "agent-1", 2, reason="r2", by="pytest")
    for rnd in range(3):
        with ae.open_store(store_url) as store:
            _fill(store, 2, 20)
            archive(store, to, before=_end(store), segment_events=25)
            ix = archive_mod._archive_reader(store).segment_index()
            assert ix is not None
            retire(store, before=ix.through + 1, reason=f"R-12 round {rnd}", by="dpo")
    with ae.open_store(store_url) as store:
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, sorted({(f.kind, f.stream_id) for f in audit.findings})
        ix = archive_mod._archive_reader(store).segment_index()
        assert ix is not None
        retired = [s for s in ix.segments if s.retired is not None]
        records = [e.payload["seq"] for e in store.read(RETENTION_STREAM)]
        assert retired and records == [s.seq for s in retired]
        assert [e.payload["stream_id"] for e in store.read(ERASURE_STREAM)] == [
            "agent-2", "agent-1",
        ]  # fmt: skip
        assert ae.integrity.verify_stream(store, RETENTION_STREAM).ok


def test_retention_refuses_a_segment_holding_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment that holds erasure records (archived by a run before records were kept in
    the database) is not retired: ArchiveError kind records, the segments before it are,
    and the audit stays clean."""
    to = (tmp_path / "arch").as_uri()
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store, 3, 20)
        monkeypatch.setattr(archive_mod, "RECORD_STREAMS", frozenset())  # as runs before
        archive(store, to, before=_end(store), segment_events=20)
        ae.erase(store, "agent-0", 2, reason="a", by="pytest")
        ae.erase(store, "agent-1", 2, reason="b", by="pytest")
        _fill(store, 3, 20)
        rep = archive(store, to, before=_end(store), segment_events=20)
        source = archive_mod._archive_reader(store).source
        ix = archive_mod._archive_reader(store).segment_index()
        assert ix is not None
        assert any(ERASURE_STREAM in source.manifest(ix, s).streams for s in ix.segments[3:])
        with pytest.raises(ArchiveError) as info:
            retire(store, before=rep.through + 1, reason="R-1", by="dpo")
        assert info.value.kind == "records" and ERASURE_STREAM in str(info.value)
        ix = archive_mod._archive_reader(store).segment_index()
        assert ix is not None and ix.segments[0].retired and not ix.segments[-1].retired
        assert [e.payload["stream_id"] for e in store.read(ERASURE_STREAM)] == [
            "agent-0", "agent-1",
        ]  # fmt: skip
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings


def test_relocating_blobs_while_a_first_archive_commits_keeps_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`init --relocate-blobs` reads the identity, the first archive run then records its
    location, then the relocation writes: the identity keeps both (the relocation is a
    compare-and-set that reads again), not the relocation's copy without the archive, which
    would leave every later open not reading through."""
    url = f"sqlite:///{tmp_path / 'r.db'}"
    old, new, to = (tmp_path / "old").as_uri(), (tmp_path / "new").as_uri(), tmp_path / "a"
    with ae.open_store(url, blobs=old) as store:
        _fill(store)
    with ae.open_store(url, blobs=new, check_identity=False) as mover:
        inner = backend_of(mover.recorder)
        real_get = inner.meta_get
        raced: list[str] = []

        def meta_get(key: str) -> str | None:
            raw: str | None = real_get(key)
            if key == IDENTITY_KEY and not raced:  # read; the archive commits before the write
                raced.append(key)
                with ae.open_store(url, blobs=old) as archiver:
                    archive(archiver, to.as_uri(), before=_end(archiver))
            return raw

        monkeypatch.setattr(inner, "meta_get", meta_get)
        mover.record_identity(relocate_blobs=True)
        assert raced
        monkeypatch.undo()
        assert _identity_archive(mover) == to.resolve().as_uri()
    with ae.open_store(url) as store:
        raw = backend_of(store.recorder).meta_get(IDENTITY_KEY)
        assert raw is not None
        ident = StoreIdentity.from_json(raw, url)
        assert isinstance(ident.blobs, BlobsIdentity)
        assert ident.blobs.location == (tmp_path / "new").resolve().as_uri()
        assert len(list(store.read_all())) == 60  # read through the archive
