"""The archive (issue 25): every read API returns the same events before and after old
events move to segments on a blob store (SQLite and PostgreSQL; a folder and S3 through
a moto server), the chain and Merkle proofs verify across the boundary, and a missing or
altered segment object is a finding, never a silently shorter answer."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.archive import job as archive_mod
from ares_events.archive.job import archive, parse_before
from ares_events.archive.reader import ArchiveRecorder
from ares_events.archive.segment import Manifest, SegmentIndex, stored
from ares_events.core.recorder import backend_of, system_of_record
from ares_events.core.snapshots import make_snapshot
from ares_events.errors import ArchiveError, ConfigError
from ares_events.integrity.anchors import verify_anchors, write_checkpoint_note
from ares_events.integrity.checkpoints import verify_proof
from ares_events.integrity.notes import SigningKey
from ares_events.projections.merkle import MerkleLog
from ares_events.projections.runner import rebuild
from ares_events.testing.blocking import open_blocking
from tests.fixtures.fifo import raised_within
from tests.fixtures.fix_backends import store_url_for

SPILL = 2000
STREAMS = {"agent-a": 120, "agent-b": 75, "agent-c": 3, "tool/x": 40, "solo": 1}


def _fill(store: ae.EventStore) -> None:
    """Interleaved streams, one spilled payload, metadata, a stream of one event."""
    i = 0
    left = dict(STREAMS)
    while any(left.values()):
        for sid in STREAMS:
            if left[sid]:
                payload: dict[str, Any] = {"i": i, "text": f"step {i} of {sid}", "n": i * 1.5}
                if i == 17:
                    payload["big"] = "z" * (SPILL * 2)
                store.append(
                    sid,
                    [ae.NewEvent(type="step.done", module="runtime", payload=payload,
                                 metadata={"run": sid, "i": i})],
                )  # fmt: skip
                left[sid] -= 1
                i += 1


def _full(events: Any) -> list[tuple[Any, ...]]:
    """Every stored column of each event (``==`` on events compares their identity)."""
    return [stored(e) for e in events]


def _archive_recorder(store: ae.EventStore) -> ArchiveRecorder:
    """The store's system of record: the archive read-through wrapper (``.recorder`` is
    typed as the ``Recorder`` protocol)."""
    rec = system_of_record(store.recorder)
    assert isinstance(rec, ArchiveRecorder), type(rec)
    return rec


def _segment_index(rec: ArchiveRecorder) -> SegmentIndex:
    """The archive's segment index (the test has archived, so there is one)."""
    ix = rec.segment_index()
    assert ix is not None
    return ix


def _reads(store: ae.EventStore) -> dict[str | tuple[str, str], Any]:
    """What every read API returns (events compared whole: every stored column)."""
    out: dict[str | tuple[str, str], Any] = {
        "all": _full(store.read_all()),
        "all_after": _full(store.read_all(after_position=_at(store, 37), limit=101)),
        "all_prefix": _full(store.read_all(stream_prefix="agent-")),
        "streams": sorted(store.streams()),
    }
    for sid, n in STREAMS.items():
        out[sid] = _full(store.read(sid))
        out[sid, "mid"] = _full(store.read(sid, from_version=2, to_version=30, limit=7))
        out[sid, "tail"] = _full(store.read(sid, from_version=max(1, n - 2)))
        out[sid, "version"] = store.stream_version(sid)
        start: list[Any] = []
        rep = ae.replay(store, sid, lambda s, e: [*s, e.payload["i"]], start)
        out[sid, "replay"] = (rep.state, rep.version, rep.findings)
        rec = ae.recover(store, sid, ae.projections.RecoveryStateProjection(), snapshots=None)
        out[sid, "recover"] = (rec.state, rec.version, rec.source, rec.findings)
    return out


def _at(store: ae.EventStore, n: int) -> int:
    """The global position of the ``n``-th event (positions are not 1, 2, 3, ... on
    PostgreSQL): ``archive(before=_at(store, n))`` archives the ``n - 1`` before it."""
    events = list(store.read_all())
    return events[n - 1].position if n <= len(events) else events[-1].position + 1


def _db_rows(store: ae.EventStore) -> int:
    return sum(1 for _ in backend_of(store.recorder).read_all(0, None))


@pytest.fixture
def s3_archive(request: pytest.FixtureRequest) -> str:
    """A fresh bucket on the moto server, as an archive URL."""
    import boto3

    endpoint = request.getfixturevalue("s3_endpoint")
    name = f"archive-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return f"s3://{name}/segments?endpoint_url={endpoint}"


def _archive_url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "s3":
        return str(request.getfixturevalue("s3_archive"))
    return (tmp_path / "archive").as_uri()


SETUPS = [
    pytest.param(("sqlite", "file"), id="sqlite-file"),
    pytest.param(("sqlite", "s3"), id="sqlite-s3", marks=pytest.mark.s3),
    pytest.param(("postgres", "file"), id="postgres-file", marks=pytest.mark.postgres),
    pytest.param(
        ("postgres", "s3"), id="postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]
    ),
]


@pytest.fixture(params=SETUPS)
def setup_url(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[ae.EventStore, str, str]]:
    """A filled store of each backend, an archive location of each kind, the store's URL."""
    backend, kind = request.param
    url = store_url_for(backend, tmp_path, request)
    blobs = (tmp_path / "blobs").as_uri()
    with ae.open_store(url, blobs=blobs, spill_threshold=SPILL) as store:
        _fill(store)
        yield store, _archive_url(kind, tmp_path, request), url


@pytest.fixture
def setup(setup_url: tuple[ae.EventStore, str, str]) -> tuple[ae.EventStore, str]:
    """A filled store of each backend and an archive location of each kind."""
    return setup_url[:2]


def test_every_read_is_the_same_after_archiving(setup: tuple[ae.EventStore, str]) -> None:
    """read, read_all (with after, limit and prefix), streams, versions, replay, recover,
    verify_stream and a deep audit give what they gave before, once most events are in
    the archive and their rows are gone."""
    store, to = setup
    before = _reads(store)
    total = len(before["all"])
    report = archive(store, to, before=_at(store, 200), segment_events=64)
    assert report.events_archived > 150 and len(report.segments) >= 3
    assert report.rows_deleted == report.events_archived
    assert _db_rows(store) == total - report.events_archived
    assert _reads(store) == before
    for sid in STREAMS:
        assert ae.integrity.verify_stream(store, sid).ok
    audit = ae.integrity.audit(store, deep=True)
    assert audit.ok, audit.findings
    assert audit.events_checked == total and audit.segments_checked == len(report.segments)
    assert audit.blobs_checked == 1  # the spilled payload of an archived event, fetched


def test_each_streams_last_event_and_head_stay_in_the_database(
    setup: tuple[ae.EventStore, str],
) -> None:
    """A stream whose every event is old keeps its last one in the database (tail reads
    and appends never need the archive); heads are untouched."""
    store, to = setup
    heads = {sid: store.stream_version(sid) for sid in STREAMS}
    report = archive(store, to, before=_at(store, 10_000))
    assert report.kept == len(STREAMS)
    left = list(_archive_recorder(store).inner.read_all(0, None))
    assert sorted((e.stream_id, e.version) for e in left) == sorted(heads.items())
    assert {sid: store.stream_version(sid) for sid in STREAMS} == heads


def test_tail_reads_and_appends_do_not_touch_the_archive(tmp_path: Path) -> None:
    """With the archive folder gone, appends, tail reads and read_all past the archive
    still work; a read that needs archived events raises ArchiveError (never a shorter
    stream)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        rep = archive(
            store, (tmp_path / "arch").as_uri(), before=_at(store, 150), segment_events=50
        )
        (tmp_path / "arch").rename(tmp_path / "gone")
        store.append("agent-a", [ae.NewEvent(type="t", module="m")])
        tail = list(store.read("agent-a", from_version=STREAMS["agent-a"]))
        assert [e.version for e in tail] == [STREAMS["agent-a"], STREAMS["agent-a"] + 1]
        assert [e.position for e in store.read_all(after_position=rep.through)]
        with pytest.raises(ArchiveError) as info:
            list(store.read("agent-a"))
        assert info.value.kind == "missing"
        found = ae.integrity.verify_stream(store, "agent-a")
        assert [f.kind for f in found.findings][:1] == ["archive_missing"]


@pytest.mark.parametrize("erased", [False, True])
@pytest.mark.parametrize("damage", ["segment", "manifest", "segment-missing"])
def test_a_damaged_archive_is_a_finding(tmp_path: Path, damage: str, erased: bool) -> None:
    """A flipped bit in a segment or manifest, or a deleted segment, is reported by
    verify_stream and the audit (and raised by reads), never skipped; also when an
    archived event in it was erased (the audit's erasure check re-reads that event: it
    raised ArchiveError instead of returning its report)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        rep = archive(
            store, (tmp_path / "arch").as_uri(), before=_at(store, 150), segment_events=50
        )
        if erased:
            ae.erase(store, "agent-a", 3, reason="test", by="pytest")
        ix = _segment_index(_archive_recorder(store))
        entry = ix.segments[0]
        key = entry.manifest.key if damage == "manifest" else entry.segment.key
        path = tmp_path / "arch" / key[:2] / key[2:4] / key
        if damage == "segment-missing":
            path.unlink()
        else:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0x01
            path.write_bytes(bytes(data))
        _archive_recorder(store).source.forget()
        audit = ae.integrity.audit(store, deep=True)
        kinds = {f.kind for f in audit.findings}
        assert kinds & {"archive_missing", "archive_corrupted"}, audit.findings
        assert not audit.ok and rep.segments
        with pytest.raises(ArchiveError):
            list(store.read_all())


def test_a_snapshot_or_anchor_over_a_damaged_segment_is_a_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A snapshot sealing an event of a damaged segment, and a signed checkpoint over it:
    audit --deep --anchors, snapshot verify (both faces) and anchor --check give their whole
    report with the findings, exit 1, human and --json (they stopped with the ArchiveError,
    and no report at all)."""
    from tests.fixtures.cli_helpers import run, run_json

    url = f"sqlite:///{tmp_path / 'e.db'}"
    anchors = (tmp_path / "anchors").as_uri() + "/"
    with ae.open_store(url) as store:
        _fill(store)
        store.snapshots.save(make_snapshot(store, "agent-a", "p", 1, {}, 3))
        signed = MerkleLog(store).sign(SigningKey.generate("archive.test/log"))
        write_checkpoint_note(anchors, signed.text, signed.checkpoint.size)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 150), segment_events=50)
        key = _segment_index(_archive_recorder(store)).segments[0].segment.key
        path = tmp_path / "arch" / key[:2] / key[2:4] / key
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # its one block: the one holding agent-a's version 3
        path.write_bytes(bytes(data))
        _archive_recorder(store).source.forget()
        with open_blocking(url) as astore:
            for face in (store, astore):
                [(info, reason)] = list(face.snapshots.verify_all())
                assert info.at_version == 3 and "in a damaged archive segment" in str(reason)
        report = ae.integrity.audit(store, deep=True, anchors=anchors)
        kinds = _kinds(report.findings)
        assert {"snapshot_mismatch", "archive_corrupted"} <= kinds, report.findings
        assert report.snapshots_checked == 1 and report.anchors_checked == 1
        assert any("checkpoint(s) not checked" in f.detail for f in report.findings)
        assert _kinds(verify_anchors(store, anchors).findings) == {"archive_corrupted"}
    for args, want in (
        (("audit", "--deep", "--anchors", anchors), "archive_corrupted"),
        (("snapshot", "verify"), "damaged archive segment"),
        (("anchor", "--to", anchors, "--check"), "archive_corrupted"),
    ):
        code, out = run_json(capsys, "--store", url, *args)
        assert code == 1 and "error" not in out and want in str(out), out
        code, text, _ = run(capsys, "--store", url, *args)
        assert code == 1 and want in " ".join(text.split()), text


def test_merkle_proofs_and_checkpoints_across_the_boundary(tmp_path: Path) -> None:
    """Inclusion proofs of archived events verify offline; each manifest records the
    tree size and root at its end and, with a key, a checkpoint signed over them."""
    key = SigningKey.generate("archive.test/log")
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        log = ae.MerkleLog(store)
        rep = archive(
            store, (tmp_path / "arch").as_uri(), before=_at(store, 120), segment_events=40, key=key
        )
        log.sign(key)
        for e in list(store.read_all())[:130:7]:
            doc = log.prove_event(e.stream_id, e.version)
            assert verify_proof(doc, [key.verifier]).ok
        rec = _archive_recorder(store)
        ix = _segment_index(rec)
        for entry in ix.segments:
            m = rec.source.manifest(ix, entry)
            assert (m.tree_size, m.root) == (entry.tree_size, log.root(entry.tree_size))
            assert m.checkpoint is not None and f"\n{entry.tree_size}\n" in m.checkpoint
        assert rep.segments[-1]["checkpoint"] is True


def test_rebuild_and_the_async_face_read_through(tmp_path: Path) -> None:
    """A projection rebuilt after archiving folds the same events; the asyncio face of
    the same store reads the same events."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        _fill(store)
        first = rebuild(store, ae.projections.AgentStateProjection())
        events = list(store.read_all())
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200), segment_events=64)
        again = rebuild(store, ae.projections.AgentStateProjection(), from_scratch=True)
        assert again.events == first.events
    with open_blocking(url) as astore:
        assert list(astore.read_all()) == events
        assert list(astore.read("agent-b")) == [e for e in events if e.stream_id == "agent-b"]


@pytest.mark.postgres
def test_postgres_async_face_reads_through(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The native asyncio PostgreSQL recorder reads through the archive too."""
    url = store_url_for("postgres", tmp_path, request)
    with ae.open_store(url) as store:
        _fill(store)
        events = list(store.read_all())
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200), segment_events=64)
    with open_blocking(url) as astore:
        assert list(astore.read_all()) == events
        assert (
            list(astore.read("agent-a", from_version=3, limit=5))
            == [e for e in events if e.stream_id == "agent-a"][2:7]
        )
        assert ae.integrity.verify_stream(astore, "agent-a").ok  # type: ignore[arg-type]


def test_later_runs_extend_the_archive(tmp_path: Path) -> None:
    """A second run with the same horizon does nothing; a later one adds segments; the
    identity records the location, and another location is refused."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        events = list(store.read_all())
        to = (tmp_path / "arch").as_uri()
        one = archive(store, to, before=_at(store, 100), segment_events=30)
        assert archive(store, to, before=_at(store, 100)).events_archived == 0
        two = archive(store, to, before=_at(store, 200), segment_events=30)
        assert two.segments[0]["seq"] == len(one.segments) + 1
        assert list(store.read_all()) == events
        assert store.identity is not None
        assert ae.integrity.audit(store, deep=True).ok
        with pytest.raises(ConfigError, match="archives to"):
            archive(store, (tmp_path / "elsewhere").as_uri(), before=_at(store, 300))
        with pytest.raises(ConfigError, match="blob location"):
            archive(store, (tmp_path / "e.db.blobs").as_uri(), before=_at(store, 300))


def test_archive_by_age_and_bad_horizons(tmp_path: Path) -> None:
    """--before takes an age; nothing recent is archived by an age; bad values are usage
    errors that name the option."""
    assert parse_before("90d").total_seconds() == 90 * 86400  # type: ignore[union-attr]
    assert parse_before("1200") == 1200
    assert parse_before("7y").days == 7 * 365  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="--before"):
        parse_before("soon")
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        assert (
            archive(store, (tmp_path / "a").as_uri(), before=parse_before("1h")).events_archived
            == 0
        )
        assert (
            archive(store, (tmp_path / "a").as_uri(), before=parse_before("0s")).events_archived > 0
        )


def test_erasing_an_archived_event_rewrites_its_segment(tmp_path: Path) -> None:
    """ae.erase on an archived event rewrites its segment: the payload's bytes are in no
    archive object, the chain, the Merkle root and the audit still verify, and reads say
    payload_erased."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        log = ae.MerkleLog(store)
        log.catch_up()
        size, root = log.size(), log.root()
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200), segment_events=64)
        target = next(iter(store.read("agent-b", from_version=5, limit=1)))
        secret = target.payload["text"].encode()
        report = ae.erase(store, "agent-b", 5, reason="test", by="pytest")
        assert not report.already_erased
        after = next(iter(store.read("agent-b", from_version=5, limit=1)))
        assert after.payload_erased and after.hash == target.hash
        assert ae.integrity.verify_stream(store, "agent-b").ok
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings
        assert [(e["stream_id"], e["version"]) for e in audit.erased] == [("agent-b", 5)]
        assert log.root(size) == root  # every leaf unchanged
        # no archived copy keeps the payload: decode every block of every segment
        rec = _archive_recorder(store)
        ix = _segment_index(rec)
        for entry in ix.segments:
            m = rec.source.manifest(ix, entry)
            for i in range(len(m.blocks)):
                for e in rec.source.block(ix, entry, i):
                    if (e.stream_id, e.version) == ("agent-b", 5):
                        assert e.payload_erased
                    elif e._payload_bytes is not None:
                        assert secret not in e._payload_bytes


def test_an_erasure_between_write_and_delete_is_carried_into_the_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event erased in the database after its segment was written (before its rows
    are deleted) is erased in the segment too: the delete never undoes an erasure."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        done: list[str] = []

        def step(name: str) -> None:
            if name == "recorded" and not done:
                done.append(name)
                inner = _archive_recorder(store).inner
                e = next(iter(inner.read("agent-a", 2, 2, 1)))
                ref = ae.core.events.ErasedPayloadRef("", e.payload_size, e.payload_digest)
                assert inner.erase("agent-a", 2, e.position, e.hash, ref).erased

        monkeypatch.setattr(archive_mod, "_step", step)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 60), segment_events=100)
        assert done
        e = next(iter(store.read("agent-a", from_version=2, limit=1)))
        assert e.payload_erased
        assert ae.integrity.verify_stream(store, "agent-a").ok


def test_reads_during_an_archive_run_never_miss_or_repeat(tmp_path: Path) -> None:
    """Readers racing an archive run of many small segments (rows deleted between their
    pages) always get exactly the stored events, in order. (They open the store once it
    has an archive: one opened before its first run does not read through.)"""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        for i in range(1500):
            store.append(f"s{i % 5}", [ae.NewEvent(type="t", module="m", payload={"i": i})])
        events = list(store.read_all())
        by_stream = {
            s: [e for e in events if e.stream_id == s] for s in {e.stream_id for e in events}
        }
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 30), segment_events=25)
    stop = threading.Event()
    bad: list[str] = []
    reads = [0]

    def reader() -> None:
        with ae.open_store(url) as r:
            while not stop.is_set():
                got = list(r.read_all())
                if got != events:
                    bad.append(f"read_all: {len(got)} events")
                sid = f"s{reads[0] % 5}"
                if list(r.read(sid)) != by_stream[sid]:
                    bad.append(f"read {sid}")
                reads[0] += 1

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        with ae.open_store(url) as store:
            archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 1400), segment_events=25)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:5]
    assert reads[0] > 0


def test_manifest_format_round_trips(tmp_path: Path) -> None:
    """A manifest parses back to itself; a manifest of another kind is ArchiveError."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 80))
        rec = _archive_recorder(store)
        ix = _segment_index(rec)
        m = rec.source.manifest(ix, ix.segments[0])
        assert Manifest.from_bytes(m.to_bytes()) == m
        assert set(m.streams) == set(STREAMS) - {"solo"}
    with pytest.raises(ArchiveError, match="unreadable"):
        Manifest.from_bytes(b'{"kind": "other"}')


def test_retention_retires_old_segments_with_a_verifiable_tombstone(tmp_path: Path) -> None:
    """Retiring segments past a horizon deletes their objects, records a tombstone in the
    segment index and an archive.segment.retired event in the log; the streams' chains verify
    from the tombstone on, the audit is clean, and a forged tombstone is a finding."""
    from ares_events.archive.retention import RETENTION_STREAM, retire

    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        events = list(store.read_all())
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200), segment_events=50)
        objects = sum(1 for p in (tmp_path / "arch").rglob("*") if p.is_file())
        ix = _segment_index(_archive_recorder(store))
        horizon = ix.segments[1].last_position + 1
        retired = {(e.stream_id, e.version) for e in events if e.position < horizon}
        rep = retire(store, before=horizon, reason="policy R-1", by="pytest")
        assert [s["seq"] for s in rep.segments] == [1, 2] and rep.events == 100
        assert sum(1 for p in (tmp_path / "arch").rglob("*") if p.is_file()) == objects - 4
        assert retire(store, before=horizon, reason="again", by="pytest").events == 0
        records = list(store.read(RETENTION_STREAM))
        assert [r.payload["seq"] for r in records] == [1, 2]
        kept = {(e.stream_id, e.version) for e in _archive_recorder(store).inner.read_all(0, None)}
        gone = retired - kept
        assert (
            list(store.read_all())
            == [e for e in events if (e.stream_id, e.version) not in gone] + records
        )
        for sid in STREAMS:
            assert ae.integrity.verify_stream(store, sid).ok
            left = [e for e in events if e.stream_id == sid and (sid, e.version) not in gone]
            assert list(store.read(sid)) == left
            assert ae.replay(store, sid, lambda n, e: n + 1, 0).findings == []
        audit = ae.integrity.audit(store, deep=True)
        assert audit.ok, audit.findings
        # a tombstone that no longer matches its record is a finding
        rec = _archive_recorder(store)
        text = rec.inner.meta_get("archive/catalog")
        forged = text.replace('"events":50', '"events":49', 1)
        rec.inner.meta_set("archive/catalog", forged)
        kinds = {f.kind for f in ae.integrity.audit(store, deep=True).findings}
        assert "retention_unrecorded" in kinds


def test_cli_archive_status_and_retire(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ares-events archive --to --before archives (JSON report), --status lists the
    segments, --retire-before needs --reason, and audit --deep stays clean."""
    from tests.fixtures.cli_helpers import run, run_json

    db = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(db) as store:
        _fill(store)
        horizon = _at(store, 150)
    to = (tmp_path / "arch").as_uri()
    code, data = run_json(capsys, "--store", db, "archive", "--to", to, "--before", str(horizon),
                          "--segment-events", "40")  # fmt: skip
    assert code == 0 and data["events_archived"] + data["kept"] == 149
    assert len(data["segments"]) == 4 and data["kept"] == 3  # short streams keep their last event
    code, data = run_json(capsys, "--store", db, "archive", "--status")
    assert code == 0 and [s["seq"] for s in data["segments"]] == [1, 2, 3, 4]
    code, _, err = run(capsys, "--store", db, "archive", "--retire-before", "1")
    assert code == 2 and "--reason" in err
    code, _, err = run(capsys, "--store", db, "archive", "--to", to)
    assert code == 2 and "--before" in err
    # Each form on its own, and each option named in its own error.
    code, _, err = run(capsys, "--store", db, "archive", "--retire-before", "5x", "--reason", "r")
    assert code == 2 and "--retire-before must be" in err
    for extra in (["--status", "--to", to], ["--status", "--before", "5"],
                  ["--retire-before", "5", "--reason", "r", "--before", "5"]):  # fmt: skip
        code, _, err = run(capsys, "--store", db, "archive", *extra)
        assert code == 2 and ("--status only reads" in err or "a run of its own" in err)
    code, data = run_json(capsys, "--store", db, "archive", "--retire-before", str(horizon),
                          "--reason", "R-2", "--by", "ops")  # fmt: skip
    assert code == 0 and data["events"] == 146
    code, data = run_json(capsys, "--store", db, "audit", "--deep")
    assert code == 0 and data["ok"], data["findings"]
    code, out, _ = run(capsys, "archive", "--help")
    assert "--before" in out and "--retire-before" in out


def test_gc_blobs_keeps_the_blobs_of_archived_events(tmp_path: Path) -> None:
    """gc-blobs reads archived events too: the spilled payload of an archived event is
    referenced and kept, and still reads back."""
    from datetime import UTC, datetime, timedelta

    from ares_events.stores.blobs.gc import gc_blobs

    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", spill_threshold=SPILL) as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200))
        gc_blobs(store, timedelta(0), now=datetime.now(UTC) + timedelta(seconds=5))
        big = [e for e in store.read_all() if e.payload_ref is not None]
        assert len(big) == 1 and big[0].position < _at(store, 200)
        assert big[0].payload["big"] == "z" * (SPILL * 2)


@pytest.mark.redis
def test_reads_through_behind_a_redis_cache(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Behind a Redis cache the archive reader sits under the cache: cached tails, reads of
    archived events and the audit all agree with what was stored."""
    from tests.fixtures.fix_backends import redis_cache_url

    with redis_cache_url(request) as cache:
        url = f"sqlite:///{tmp_path / 'e.db'}"
        with ae.open_store(url, cache=cache) as store:
            _fill(store)
            before = _reads(store)
            archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200))
            assert _reads(store) == before
            assert ae.integrity.audit(store, deep=True).ok
            ae.erase(store, "agent-a", 3, reason="test", by="pytest")
            assert next(iter(store.read("agent-a", from_version=3, limit=1))).payload_erased


def test_an_erasure_interrupted_before_deleting_old_objects_is_finished_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old segment (which still holds the erased payload) is named as pending in the
    same segment index swap that replaces it; if the process dies before deleting it, the next
    archive run deletes it."""
    from ares_events.archive.source import ArchiveSource

    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        to = (tmp_path / "arch").as_uri()
        archive(store, to, before=_at(store, 200), segment_events=64)
        rec = _archive_recorder(store)
        old = _segment_index(rec).segments[0]

        def crash(self: ArchiveSource, ix: Any, keys: list[str]) -> None:
            raise RuntimeError("killed before the delete")

        monkeypatch.setattr(ArchiveSource, "drop_objects", crash)
        with pytest.raises(RuntimeError):
            ae.erase(store, "agent-a", 2, reason="test", by="pytest")
        monkeypatch.undo()
        ix = _segment_index(rec)
        assert set(ix.pending) == {old.segment.key, old.manifest.key}
        path = tmp_path / "arch" / old.segment.key[:2] / old.segment.key[2:4] / old.segment.key
        assert path.exists()
        archive(store, to, before=_at(store, 200))
        assert not path.exists() and _segment_index(rec).pending == ()
        assert next(iter(store.read("agent-a", from_version=2, limit=1))).payload_erased


def test_a_reader_whose_segment_index_an_erasure_replaced_reads_the_new_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read that started with a segment index from before an erasure elsewhere (whose old
    segment object is deleted now) reads the segment index again instead of failing."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200))
        expected = _full(store.read("agent-c"))
    with ae.open_store(url) as reader, ae.open_store(url) as eraser:
        rec = _archive_recorder(reader)
        stale = rec.segment_index()
        ae.erase(eraser, "agent-a", 2, reason="test", by="pytest")
        real = type(rec).segment_index
        calls = [0]

        def first_stale(self: Any) -> Any:
            calls[0] += 1
            return stale if calls[0] == 1 else real(self)

        monkeypatch.setattr(type(rec), "segment_index", first_stale)
        assert _full(reader.read("agent-c")) == expected
        assert calls[0] == 2


def _archive_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("ares-archive")]


def test_cold_reads_run_on_a_low_priority_thread_that_reads_ahead(tmp_path: Path) -> None:
    """Archived blocks are fetched and decoded on one thread per store at niceness 19 (cold
    reads take the CPU hot ones leave), a scan fetches its next block ahead, every read
    is the same as before archiving, and closing the store stops the thread."""
    assert not _archive_threads()
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        before = _reads(store)
        archive(
            store, (tmp_path / "arch").as_uri(), before=_at(store, 200), segment_events=100,
            block_events=8,
        )  # fmt: skip
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        rec = _archive_recorder(store)
        first = list(store.read_all(limit=1))
        assert len(first) == 1
        for _ in range(3000):  # the read-ahead of block 2 finishes (no clock involved)
            if rec.source.fetches >= 2:
                break
            threading.Event().wait(0.01)
        assert rec.source.fetches == 2  # block 1 for the read, block 2 ahead of the scan
        (thread,) = _archive_threads()
        assert thread.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == 19
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == 0
        assert _reads(store) == before
        assert ae.integrity.audit(store, deep=True).ok
    assert not _archive_threads()


def test_the_archive_read_niceness_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ARES_ARCHIVE_READ_NICE=0 runs archive reads at the caller's priority; a value that
    is not 0-19 is a ConfigError naming the variable when the store opens."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 100))
    monkeypatch.setenv("ARES_ARCHIVE_READ_NICE", "0")
    with ae.open_store(url) as store:
        assert len(list(store.read("agent-a"))) == STREAMS["agent-a"]
        (thread,) = _archive_threads()
        assert thread.native_id is not None
        assert os.getpriority(os.PRIO_PROCESS, thread.native_id) == 0
    for bad in ("20", "-1", "low"):
        monkeypatch.setenv("ARES_ARCHIVE_READ_NICE", bad)
        with pytest.raises(ConfigError, match="ARES_ARCHIVE_READ_NICE") as info:
            ae.open_store(url)
        assert repr(bad) in str(info.value)
    monkeypatch.setenv("ARES_ARCHIVE_READ_NICE", "3")
    with pytest.raises(ConfigError, match="block_events"), ae.open_store(url) as store:
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 200), block_events=0)


def _delete_meta(store: ae.EventStore, key: str) -> None:
    """Delete one ``ares_meta`` row with the backend's own SQL (tampering, not an API)."""
    import sqlite3

    rec = backend_of(store.recorder)
    if getattr(rec, "path", None) is not None:
        with contextlib.closing(sqlite3.connect(rec.path)) as c, c:
            c.execute("DELETE FROM ares_meta WHERE key = ?", (key,))
        return
    with rec.connection() as conn:
        conn.execute(f'DELETE FROM "{rec.schema}".ares_meta WHERE key = %s', (key,))


def _cli(url: str, *args: str) -> tuple[int, dict[str, Any]]:
    """``ares-events --store URL ARGS --json`` in a child process, bounded: a hang is a
    failure here (the issue's bound), not a stuck suite."""
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "ares_events", "--store", url, *args, "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    return done.returncode, json.loads(done.stdout)


def _kinds(findings: Any) -> set[str]:
    return {f["kind"] if isinstance(f, dict) else f.kind for f in findings}


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_audit_reports_a_deleted_index_row(setup_url: tuple[ae.EventStore, str, str]) -> None:
    """With the archive's index row deleted, audit (with and without --deep) and verify
    end with an archive_missing finding and exit 1 (they used to spin forever); reads
    that need the archive raise, never return a shorter log."""
    store, to, url = setup_url
    archive(store, to, before=_at(store, 200), segment_events=64)
    _delete_meta(store, "archive/catalog")
    for deep in ((), ("--deep",)):
        code, data = _cli(url, "audit", *deep)
        assert code == 1 and "archive_missing" in _kinds(data["findings"]), data
    code, data = _cli(url, "verify", "agent-a")
    assert code == 1, data
    assert "archive_missing" in _kinds(ae.integrity.audit(store).findings)
    with pytest.raises(ArchiveError) as info:
        list(store.read_all())
    assert info.value.kind == "missing"


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_stream_reads_that_need_a_lost_index_raise(
    setup_url: tuple[ae.EventStore, str, str],
) -> None:
    """With the archive's index row deleted, a stream read that needs the archive (from
    the start, a mid range, replay; both faces) raises ArchiveError ``missing`` instead of
    returning the stream from its first version still in the database; verify_stream
    reports archive_missing, not a gap; archive --status and a new run refuse rather
    than take the archive for none; a tail read still works."""
    store, to, url = setup_url
    archive(store, to, before=_at(store, 200), segment_events=64)
    _delete_meta(store, "archive/catalog")
    n = STREAMS["agent-a"]
    tail = [e.version for e in store.read("agent-a", from_version=n - 2)]
    assert tail == [n - 2, n - 1, n]  # in the database: no archive needed
    reads: list[Callable[[], object]] = [
        lambda: list(store.read("agent-a")),
        lambda: list(store.read("agent-a", from_version=2, to_version=30, limit=7)),
        lambda: ae.replay(store, "agent-a", lambda s, e: s, None),
    ]
    with open_blocking(url) as astore:
        reads.append(lambda: list(astore.read("agent-a")))
        reads.append(lambda: list(astore.read("agent-b", from_version=3, limit=5)))
        for read in reads:
            with pytest.raises(ArchiveError) as info:
                read()
            assert info.value.kind == "missing"
    kinds = _kinds(ae.integrity.verify_stream(store, "agent-a").findings)
    assert "archive_missing" in kinds and "gap" not in kinds, kinds
    code, out = _cli(url, "archive", "--status")
    assert code == 1 and out["error"]["type"] == "ArchiveError", out
    with pytest.raises(ArchiveError) as info:
        archive(store, to, before=10**9)
    assert info.value.kind == "missing"


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("kind", ["fifo", "symlink-to-fifo"])
def test_a_fifo_in_place_of_a_segment_is_missing_not_a_hang(tmp_path: Path, kind: str) -> None:
    """A FIFO (or a symlink to one) where a segment object belongs: audit, audit --deep
    and verify end at once with archive_missing and exit 1, and a stream read raises
    ArchiveError ``missing`` (each used to wait for a writer forever)."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        _fill(store)
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 150), segment_events=50)
        rec = _archive_recorder(store)
        ix = _segment_index(rec)
        path = rec.source.blobs(ix).path_for(ix.segments[0].segment.key)
        path.unlink()
        fifo = path if kind == "fifo" else tmp_path / "fifo"
        os.mkfifo(fifo)
        if fifo != path:
            path.symlink_to(fifo)
        rec.source.forget()
        for args in (("audit",), ("audit", "--deep"), ("verify", "agent-a")):
            code, out = _cli(url, *args)  # a child process, bounded
            assert code == 1 and "archive_missing" in _kinds(out["findings"]), out
        err = raised_within(lambda: list(store.read("agent-a")), fifo)
        assert isinstance(err, ArchiveError) and err.kind == "missing", err


@pytest.mark.parametrize(
    "damage", ["header", "trailing", "index-digest", "manifest-missing", "index-garbled"]
)
@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_bytes_outside_the_blocks_are_checked_by_a_deep_audit(
    setup_url: tuple[ae.EventStore, str, str], damage: str
) -> None:
    """A flipped byte in a segment's ARESSEG1 header, 100 bytes appended to a segment, an
    index whose recorded segment digest differs (every block still checks), a deleted
    manifest or an index that does not parse is a finding of audit --deep (CLI exit 1,
    and the API); the last two of a plain audit too."""
    store, to, url = setup_url
    archive(store, to, before=_at(store, 200), segment_events=64)
    rec = _archive_recorder(store)
    ix = _segment_index(rec)
    entry = ix.segments[1]
    blobs = rec.source.blobs(ix)
    data = blobs.get(entry.segment.as_payload_ref())
    if damage == "manifest-missing":
        blobs.delete(entry.manifest.key)
    elif damage == "index-garbled":
        rec.inner.meta_set("archive/catalog", ix.to_json()[:-7])
    elif damage == "index-digest":
        bad = dataclasses.replace(entry.segment, digest=bytes(32))
        new = dataclasses.replace(ix, segments=tuple(
            dataclasses.replace(s, segment=bad) if s is entry else s for s in ix.segments
        ))  # fmt: skip
        rec.inner.meta_set("archive/catalog", new.to_json())
    else:
        if damage == "header":
            changed = bytes([data[0] ^ 0x01]) + data[1:]
        else:
            changed = data + b"\x00" * 100
        _overwrite(blobs, entry.segment.key, changed)
    rec.source.forget()
    want = {
        "manifest-missing": "archive_missing", "index-garbled": "archive_unreadable"
    }.get(damage, "archive_corrupted")  # fmt: skip
    plain_too = damage in ("manifest-missing", "index-garbled")
    for args in [("--deep",), ()] if plain_too else [("--deep",)]:
        code, out = _cli(url, "audit", *args)
        assert code == 1 and want in _kinds(out["findings"]), out
    report = ae.integrity.audit(store, deep=True)
    assert want in _kinds(report.findings) and not report.ok


def _overwrite(blobs: Any, key: str, data: bytes) -> None:
    """Replace the object under ``key`` with ``data`` (a folder file or an S3 object)."""
    if getattr(blobs, "root", None) is not None:
        path = blobs.path_for(key)
        path.chmod(0o644)
        path.write_bytes(data)
        return
    blobs.client.put_object(Bucket=blobs.bucket, Key=blobs.object_key(key), Body=data)


def test_a_store_without_an_archive_never_constructs_the_reader_nor_reads_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real SQLite store that never archived: opening it (both faces) and every read
    (streams from the start, read_all, replay, recover, verify, audit, deep audit) neither
    constructs the archive reader nor reads the index or archive/through rows. After an
    archive run, a new open does both."""
    from ares_events.stores.sqlite import SQLiteRecorder

    made: list[object] = []
    keys: list[str] = []
    init, meta_get = ArchiveRecorder.__init__, SQLiteRecorder.meta_get

    def counted(self: ArchiveRecorder, *args: Any) -> None:
        made.append(self)
        init(self, *args)

    def observed(self: SQLiteRecorder, key: str) -> str | None:
        keys.append(key)
        return meta_get(self, key)

    monkeypatch.setattr(ArchiveRecorder, "__init__", counted)
    monkeypatch.setattr(SQLiteRecorder, "meta_get", observed)
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        _fill(store)
    for opened in (ae.open_store(url), open_blocking(url)):
        with opened as s:
            reads: Any = s
            list(reads.read_all())
            for sid in STREAMS:
                list(reads.read(sid))
            ae.replay(s, "agent-a", lambda st, e: st, None)  # type: ignore[arg-type]
            ae.recover(s, "agent-b", ae.projections.RecoveryStateProjection(), snapshots=None)  # type: ignore[arg-type]
            assert ae.integrity.verify_stream(s, "agent-c").ok  # type: ignore[arg-type]
    with ae.open_store(url) as store:
        assert ae.integrity.audit(store, deep=True).ok
    archive_keys = {"archive/catalog", "archive/through"}
    assert made == [] and archive_keys.isdisjoint(keys) and keys
    with ae.open_store(url) as store:
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 100))
        assert len(made) == 1  # plugged into the store the run was given
    with ae.open_store(url) as store:
        assert len(list(store.read("agent-a"))) == STREAMS["agent-a"]
    assert len(made) == 2 and archive_keys <= set(keys)


def test_without_the_through_row_reads_go_by_the_index(tmp_path: Path) -> None:
    """With ``archive/through`` deleted (or a run stopped before writing it), read_all and
    the audit's position scan take the archive's end from the segment index: the same
    events, and a clean audit."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _fill(store)
        before = list(store.read_all())
        archive(store, (tmp_path / "arch").as_uri(), before=_at(store, 150), segment_events=50)
        _delete_meta(store, "archive/through")
        assert list(store.read_all()) == before
        assert ae.integrity.audit(store, deep=True).ok
