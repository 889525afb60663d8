"""Erasure: the payload is gone from the database files, rows and blob stores, while every
chain, Merkle proof and checkpoint stays valid; snapshots and read models that folded it are
dropped; reads, folds, the journal and the audit say what happened.

The generic behaviour (tombstone reads, records, idempotency) is in the conformance suite
(``ares_events/testing/_contract_erase.py``); this file looks at the raw storage of each
backend and at what sits above the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.core.events import SNAPSHOT_COVERS, SNAPSHOT_STREAM_PREFIX, ErasedPayloadRef
from ares_events.core.recorder import backend_of
from ares_events.integrity.checkpoints import verify_proof
from ares_events.integrity.notes import SigningKey
from ares_events.projections.base import ERASED_REASON
from ares_events.projections.erasure import SALT_FIELD
from ares_events.projections.runner import ProjectionRunner, read_model
from ares_events.stores.blobs import gc_blobs
from tests.fixtures.fix_backends import open_backend

SECRET = "SSN-078-05-1120-MARKER"
BIG = "BIGSECRET-" * 200  # spilled with a 256-byte threshold


def _ev(payload: Any, type_: str = "task.created") -> ae.NewEvent:
    return ae.NewEvent(type=type_, module="test", payload=payload)


def _raw_files(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


@pytest.fixture
def key() -> SigningKey:
    """A log key."""
    return SigningKey.generate("example.com/erasure-test")


def test_sqlite_files_and_blob_folder_no_longer_hold_the_payload(
    tmp_path: Path, key: SigningKey
) -> None:
    """After erasing an inline and a spilled payload of a SQLite store, neither the
    database, its WAL nor the blob folder holds their bytes; the audit is clean and the
    proofs made before and after verify."""
    db = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{db}", spill_threshold=256) as store:
        store.append("p", [_ev({"ssn": SECRET}), _ev({"doc": BIG}), _ev({"n": 3})])
        log = ae.MerkleLog(store)
        log.sign(key)
        before = [log.prove_event("p", v) for v in (1, 2, 3)]
        assert SECRET.encode() in _raw_files(tmp_path) and BIG.encode() in _raw_files(tmp_path)
        r1 = ae.erase(store, "p", 1, reason="subject request", by="dpo")
        r2 = ae.erase(store, "p", 2, reason="subject request", by="dpo")
        assert r1.blob_key is None and r2.blob_key is not None and r2.blob_deleted
        report = ae.integrity.audit(store, deep=True)
        assert report.ok, report.findings
        assert {(e["stream_id"], e["version"]) for e in report.erased} == {("p", 1), ("p", 2)}
        after = [log.prove_event("p", v) for v in (1, 2, 3)]
        for doc in [*before, *after]:
            assert verify_proof(doc, [key.verifier]).ok
        assert [d["leaf_data"] for d in before] == [d["leaf_data"] for d in after]
        assert verify_proof(log.prove_consistency(3, key=key), [key.verifier]).ok
    raw = _raw_files(tmp_path)
    assert SECRET.encode() not in raw
    assert BIG.encode() not in raw
    assert not list((tmp_path / "events.db.blobs").rglob(r2.blob_key or "x"))
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT version, payload, payload_ref FROM ares_events WHERE stream_id = 'p' "
            "ORDER BY version"
        ).fetchall()
    assert [r[1] is None for r in rows] == [True, True, False]
    assert all('"erased":true' in r[2] for r in rows[:2])


@pytest.mark.postgres
def test_postgres_row_no_longer_holds_the_payload(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """On PostgreSQL the erased row's payload column is NULL and its reference holds only
    the digest and size (what a query can see of the table)."""
    import psycopg

    with open_backend("postgres", tmp_path, request) as store:
        store.append("p", [_ev({"ssn": SECRET})])
        ae.erase(store, "p", 1, reason="r", by="b")
        rec: Any = backend_of(store.recorder)
        with rec.pool.connection() as conn:
            rows = conn.execute(
                psycopg.sql.SQL("SELECT payload, payload_ref FROM {}.ares_events").format(
                    psycopg.sql.Identifier(rec.schema)
                )
            ).fetchall()
        text = repr(rows)
        assert SECRET not in text
        assert rows[0][0] is None and '"erased":true' in rows[0][1]
        assert ae.integrity.audit(store).ok


@pytest.mark.s3
def test_s3_blob_is_deleted(tmp_path: Path, s3_endpoint: str) -> None:
    """A spilled payload on S3 is deleted by the erasure; the audit (deep) stays clean."""
    import boto3

    client = boto3.session.Session().client("s3", endpoint_url=s3_endpoint)
    bucket = f"ares-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    url = f"s3://{bucket}/blobs?endpoint_url={s3_endpoint}"
    try:
        with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", blobs=url, spill_threshold=256) as s:
            s.append("p", [_ev({"doc": BIG})])
            keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
            assert len(keys - {"blobs/.ares-owner"}) == 1  # the marker is the store's claim
            rep = ae.erase(s, "p", 1, reason="r", by="b")
            assert rep.blob_deleted
            objects = client.list_objects_v2(Bucket=bucket).get("Contents", [])
            assert [o["Key"] for o in objects] == ["blobs/.ares-owner"]
            assert ae.integrity.audit(s, deep=True).ok
    finally:
        client.close()


def test_a_blob_shared_by_an_equal_payload_is_kept(tmp_path: Path) -> None:
    """Equal payloads share one blob: erasing one event keeps the blob for the other,
    which still reads; the report says so."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", spill_threshold=256) as store:
        store.append("a", [_ev({"doc": BIG})])
        store.append("b", [_ev({"doc": BIG})])
        rep = ae.erase(store, "a", 1, reason="r", by="b")
        assert rep.blob_key is not None and not rep.blob_deleted and rep.blob_shared_by == 1
        (b,) = store.read("b")
        assert b.payload == {"doc": BIG}
        assert ae.integrity.audit(store, deep=True).ok


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "memory"]
)
def test_snapshots_and_read_models_that_folded_it_are_dropped(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Snapshots taken at or after the erased version are deleted (older ones kept); read
    models whose cursor passed it are rewound and refold without the payload (and on
    SQLite no copy stays in the files)."""
    with open_backend(backend, tmp_path, request) as store:
        store.append("agent", [_ev({"task_id": "t1"}), _ev({"task_id": SECRET})])
        proj = ae.projections.AgentStateProjection()
        ae.snapshot(store, "agent", proj)  # at version 2: folded the secret
        runner = ProjectionRunner(store, [proj])
        runner.run_until_idle()
        assert SECRET in str(read_model(store, proj, "agent"))
        rep = ae.erase(store, "agent", 2, reason="r", by="b")
        assert rep.snapshots_deleted == 1 and rep.read_models_reset == ["agent_state"]
        assert store.snapshots.load("agent", "agent_state") is None
        assert read_model(store, proj, "agent") is None  # emptied until the runner refolds
        runner.run_until_idle()
        state = read_model(store, proj, "agent")
        assert state is not None and SECRET not in str(state)
        assert state["pending_tasks"] == ["t1"]
        assert [s.reason for s in runner.skipped] == [ERASED_REASON]
        store.append("agent", [_ev({"task_id": "t3"})])
        runner.run_until_idle()
        assert read_model(store, proj, "agent")["pending_tasks"] == ["t1", "t3"]
    if backend == "sqlite":
        assert SECRET.encode() not in _raw_files(tmp_path)


def test_recovery_and_replay_skip_the_erased_event(tmp_path: Path) -> None:
    """Recovery and replay of a stream with an erased event finish, list it as skipped
    (reason 'payload erased') and fold the rest; a projection that accepts erased events
    sees it without its payload."""
    with ae.open_store("memory://") as store:
        store.append(
            "agent", [_ev({"task_id": "t1"}), _ev({"task_id": "t2"}), _ev({"task_id": "t3"})]
        )
        ae.erase(store, "agent", 2, reason="r", by="b")
        rec = ae.recover(store, "agent", ae.projections.RecoveryStateProjection())
        assert rec.state["pending_tasks"] == ["t1", "t3"] and rec.version == 3
        assert [(s.version, s.reason) for s in rec.skipped] == [(2, ERASED_REASON)]
        assert not rec.findings

        class Counter:
            name, version, accepts_erased = "count", 1, True

            def initial(self) -> dict[str, int]:
                return {"n": 0, "erased": 0}

            def apply(self, state: dict[str, int], e: ae.RecordedEvent) -> dict[str, int]:
                state["n"] += 1
                state["erased"] += int(e.payload_erased)
                return state

        res = ae.projections.fold(Counter(), store.read("agent"))
        assert res.state == {"n": 3, "erased": 1} and not res.skipped


def test_journal_refuses_to_replay_an_erased_run(tmp_path: Path) -> None:
    """A run with an erased event cannot be reopened (PayloadErased) - its recorded answer
    is gone and replaying could re-pay or repeat a side effect - but it can be inspected."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        j = ae.Journal(store, "run-1")
        j.model_call([{"role": "user", "content": SECRET}], call=lambda m, p: {"text": "ok"})
        answered = [e.version for e in store.read("run-1") if e.type == "model.responded"]
        ae.erase(store, "run-1", answered[0], reason="r", by="b")
        with pytest.raises(ae.PayloadErased) as info:
            ae.Journal(store, "run-1")
        assert info.value.stream_id == "run-1"
        assert ae.Journal.inspect(store, "run-1").run_id == "run-1"


def test_no_snapshot_steps_over_an_erased_payload(tmp_path: Path) -> None:
    """After an erasure no snapshot of a fold that skipped it is saved: ``snapshot``
    raises PayloadErased and saves nothing, and a journal still running (its own
    snapshots every 2 events) goes on without one, so the next incarnation refuses the run
    instead of opening from a snapshot past the hole and paying the model again."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    paid: list[int] = []

    def model(messages: Any, params: Any) -> dict[str, str]:
        paid.append(1)
        return {"text": "ok"}

    with ae.open_store(url) as store:
        live = ae.Journal(store, "run-1", snapshot_every=2)
        ask = [{"role": "user", "content": SECRET}]
        live.model_call(ask, call=model)
        answered = [e.version for e in store.read("run-1") if e.type == "model.responded"]
        ae.erase(store, "run-1", answered[0], reason="r", by="b")
        proj = ae.projections.RunStateProjection()
        with pytest.raises(ae.PayloadErased):
            ae.snapshot(store, "run-1", proj)
        live.patch("k", 1)  # the live journal appends on (its snapshots come due)
        live.patch("k", 2)
        snap = store.snapshots.load("run-1", proj.name, proj.version)
        assert snap is None or snap.at_version < answered[0]  # none folded the hole
        with pytest.raises(ae.PayloadErased):
            ae.Journal(store, "run-1").model_call(ask, call=model)
        assert paid == [1]


def test_salted_payloads_leave_a_digest_that_reveals_nothing() -> None:
    """ae.salted adds a fresh 128-bit salt: equal payloads get different digests, and after
    erasure the stored digest is not the digest of any unsalted guess."""
    a, b = ae.salted({"ssn": SECRET}), ae.salted({"ssn": SECRET})
    assert a[SALT_FIELD] != b[SALT_FIELD] and len(a[SALT_FIELD]) == 32
    with pytest.raises(ae.InvalidEvent):
        ae.salted(a)
    with pytest.raises(ae.InvalidEvent):
        ae.salted(["not", "an", "object"])  # type: ignore[arg-type]
    with ae.open_store("memory://") as store:
        store.append("p", [_ev(a), _ev(b)])
        ae.erase(store, "p", 1, reason="r", by="b")
        e1, e2 = store.read("p")
        guess = ae.integrity.canonical_json({"ssn": SECRET})
        assert e1.payload_digest not in (
            ae.chain.payload_digest(guess),
            e2.payload_digest,
        )
        assert ae.integrity.audit(store).ok


def test_interrupted_and_undone_erasures_are_findings(tmp_path: Path) -> None:
    """A payload erased with no record (an interrupted erasure) is erasure_unrecorded until
    the erasure is run again; a recorded erasure whose payload is put back is
    erasure_undone."""
    db = tmp_path / "e.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        store.append("p", [_ev({"n": 1}), _ev({"n": 2})])
        store.erase_payload("p", 1)  # the storage half only: no record
        kinds = [f.kind for f in ae.integrity.audit(store).findings]
        assert kinds == ["erasure_unrecorded"]
        rep = ae.erase(store, "p", 1, reason="r", by="b")
        assert rep.already_erased and rep.record_position is not None
        assert ae.integrity.audit(store).ok
        ae.erase(store, "p", 2, reason="r", by="b")
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "UPDATE ares_events SET payload = ?, payload_ref = NULL WHERE stream_id = 'p' "
            "AND version = 2",
            (ae.integrity.canonical_json({"n": 2}),),
        )
    with ae.open_store(f"sqlite:///{db}") as store:
        report = ae.integrity.audit(store)
        assert [(f.kind, f.stream_id, f.version) for f in report.findings] == [
            ("erasure_undone", "p", 2)
        ]


def test_erased_reference_round_trips() -> None:
    """The erased reference is stored as digest and size only and parses back as erased."""
    ref = ErasedPayloadRef(key="", size=12, digest=bytes(range(32)))
    back = ae.PayloadRef.from_json(ref.to_json())
    assert isinstance(back, ErasedPayloadRef) and back.erased and back == ref
    assert b"key" not in ref.to_json()


def test_cli_erase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`ares-events erase` erases, reports in JSON, is idempotent, and refuses an unknown
    event (exit 2) or a missing --reason (exit 2)."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        store.append("p", [_ev({"ssn": SECRET})])
    assert (
        main(["--store", url, "erase", "p", "1", "--reason", "gdpr", "--by", "dpo", "--json"]) == 0
    )
    out = capsys.readouterr().out
    assert '"already_erased": false' in out and '"record_stream": "ares-events/erasures"' in out
    assert main(["--store", url, "erase", "p", "1", "--reason", "gdpr"]) == 0
    assert "already erased" in capsys.readouterr().out
    assert main(["--store", url, "erase", "p", "9", "--reason", "gdpr"]) == 2
    assert main(["--store", url, "erase", "p", "1"]) == 2
    assert main(["--store", url, "audit", "--json"]) == 0
    assert '"erased": [{"stream_id": "p"' in capsys.readouterr().out
    with ae.open_store(url) as store:
        (rec,) = store.read(ae.ERASURE_STREAM)
        assert rec.payload["by"] == "dpo" and rec.payload["reason"] == "gdpr"


@contextlib.contextmanager
def _two_cached(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[ae.EventStore, ae.EventStore]]:
    from tests.fixtures.fix_backends import redis_cache_url

    with redis_cache_url(request) as cache:
        url = f"sqlite:///{tmp_path / 'e.db'}"
        with ae.open_store(url, cache=cache) as a, ae.open_store(url, cache=cache) as b:
            yield a, b


@pytest.mark.redis
def test_another_process_cache_user_sees_the_erasure(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two stores sharing a Redis cache: after one erases, the other's next read of the
    stream (which it had cached) returns the tombstone, not the cached payload."""
    with _two_cached(tmp_path, request) as (a, b):
        a.append("p", [_ev({"ssn": SECRET}), _ev({"n": 2})])
        assert next(iter(b.read("p"))).payload == {"ssn": SECRET}
        stats: Any = b.recorder.stats  # type: ignore[attr-defined]
        assert stats.hits >= 1  # served from Redis: the copy an erasure must drop
        ae.erase(a, "p", 1, reason="r", by="b")
        assert [e.payload_erased for e in b.read("p")] == [True, False]


def test_tail_and_runs_show_an_erased_event(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tail` shows an erased payload as erased (table and JSON), and `runs show` of a run
    whose recorded request was erased still works."""
    url = f"sqlite:///{tmp_path / 'e.db'}"
    with ae.open_store(url) as store:
        j = ae.Journal(store, "run-1")
        j.model_call([{"role": "user", "content": SECRET}], call=lambda m, p: {"text": "ok"})
        (req,) = [e.version for e in store.read("run-1") if e.type == "model.call.requested"]
        ae.erase(store, "run-1", req, reason="r", by="b")
    assert main(["--store", url, "tail", "run-1"]) == 0
    assert "<erased:" in capsys.readouterr().out
    assert main(["--store", url, "tail", "run-1", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"payload_erased": true' in out and SECRET not in out
    assert main(["--store", url, "runs", "show", "run-1"]) == 1  # a skipped event is reported
    out = capsys.readouterr().out
    assert "payload erased" in out and SECRET not in out


def _set_mtimes(folder: Path, seconds_from_now: float) -> None:
    """Every blob file's mtime ``seconds_from_now`` away (later: as an append refreshing
    it after the erasure began would leave it; earlier: aged)."""
    at = time.time() + seconds_from_now
    for p in folder.rglob("*"):
        if p.is_file():
            os.utime(p, (at, at))


def test_a_blob_refreshed_after_the_erasure_began_is_left_for_gc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A blob no other event uses yet, but refreshed after the erasure began (an append of
    the same payload, not committed yet), is kept: the report and the CLI say gc-blobs
    deletes it later (never that it was deleted), and gc-blobs does once it is old and
    unreferenced."""
    db = tmp_path / "e.db"
    url = f"sqlite:///{db}"
    with ae.open_store(url, spill_threshold=256) as store:
        store.append("a", [_ev({"doc": BIG})])
        store.append("c", [_ev({"doc": BIG + "c"})])
        _set_mtimes(tmp_path / "e.db.blobs", 60)
        rep = ae.erase(store, "a", 1, reason="r", by="b")
        assert rep.blob_key is not None and not rep.blob_deleted and rep.blob_left_for_gc
        assert store.blobs is not None and store.blobs.exists(rep.blob_key)
        assert rep.to_dict()["blob_left_for_gc"] is True
        assert ae.integrity.audit(store).ok
        _set_mtimes(tmp_path / "e.db.blobs", -7200)  # two hours on
        gc = gc_blobs(store, timedelta(hours=1))
        assert gc.deleted == [rep.blob_key]
    _set_mtimes(tmp_path / "e.db.blobs", 60)
    capsys.readouterr()
    assert main(["--store", url, "erase", "c", "1", "--reason", "r"]) == 0
    out = capsys.readouterr().out
    assert "gc-blobs deletes it later" in out and "was deleted" not in out


class _Paused:
    """Wraps ``obj.<name>``: its first call waits until released, after its work (or
    before it, ``before=True``); later calls pass. A fixed interleaving of an append with
    an erasure or a gc, in which no step depends on timing."""

    def __init__(self, obj: Any, name: str, *, before: bool = False) -> None:
        self.real, self.before, self.first = getattr(obj, name), before, True
        self.reached, self.go = threading.Event(), threading.Event()
        setattr(obj, name, self)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        first, self.first = self.first, False
        if first and self.before:
            self._wait()
        out = self.real(*args, **kw)
        if first and not self.before:
            self._wait()
        return out

    def _wait(self) -> None:
        self.reached.set()
        assert self.go.wait(60)


@contextlib.contextmanager
def _paused_append(
    tmp_path: Path, first: bool = True
) -> Iterator[tuple[ae.EventStore, Any, _Paused]]:
    """A store whose stream "a" holds BIG in a blob (unless not ``first``), and an append
    of BIG to "b" on a thread, paused after it wrote or refreshed that blob and before its
    commit; the write is then aged a minute (as if long before what comes next)."""
    with (
        ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", spill_threshold=256) as store,
        ThreadPoolExecutor(2) as pool,
    ):
        if first:
            store.append("a", [_ev({"doc": BIG})])
        spill = _Paused(store.blobs, "spill")
        appended = pool.submit(store.append, "b", [_ev({"doc": BIG})])
        try:
            assert spill.reached.wait(60)
            _set_mtimes(tmp_path / "e.db.blobs", -60)
            yield store, appended, spill
        finally:
            spill.go.set()


def _reads_b(store: ae.EventStore) -> None:
    (b,) = store.read("b")
    assert b.payload == {"doc": BIG}
    assert ae.integrity.audit(store, deep=True).ok


def test_an_append_committed_after_the_erasure_deleted_its_blob_writes_it_again(
    tmp_path: Path,
) -> None:
    """An append of the same payload refreshed the blob before the erasure began and
    commits after the erasure counted its users (none yet) and deleted it: once
    committed, the append writes the blob again, and its event reads."""
    with _paused_append(tmp_path) as (store, appended, spill):
        rep = ae.erase(store, "a", 1, reason="r", by="b")
        assert rep.blob_deleted  # the precondition: no user was committed yet
        spill.go.set()
        appended.result()
        _reads_b(store)


def test_an_append_committed_before_the_erasure_deletes_makes_it_keep_the_blob(
    tmp_path: Path,
) -> None:
    """The erasure counted no user, then the append committed, then the erasure came to
    delete: the append refreshed the blob after its commit, so the erasure keeps it."""
    with _paused_append(tmp_path) as (store, appended, spill), ThreadPoolExecutor(1) as pool:
        assert store.blobs is not None
        delete = _Paused(store.blobs, "delete", before=True)
        erased = pool.submit(ae.erase, store, "a", 1, reason="r", by="b")
        try:
            assert delete.reached.wait(60)  # erased and counted: none, "b" is not in yet
            spill.go.set()
            appended.result()
        finally:
            delete.go.set()
        rep = erased.result()
        assert rep.blob_key is not None and not rep.blob_deleted and rep.blob_left_for_gc
        _reads_b(store)


def test_gc_that_deleted_the_blob_of_a_slow_append_gets_it_written_again(
    tmp_path: Path,
) -> None:
    """An append slower than gc-blobs' grace period: gc found its blob unreferenced and
    old and deleted it before the commit; the append writes it again once committed."""
    with _paused_append(tmp_path, first=False) as (store, appended, spill):
        _set_mtimes(tmp_path / "e.db.blobs", -7200)
        gc = gc_blobs(store, timedelta(hours=1))
        assert len(gc.deleted) == 1  # the precondition: gc took it
        spill.go.set()
        appended.result()
        _reads_b(store)


def test_the_asyncio_face_writes_the_blob_again_after_its_commit(tmp_path: Path) -> None:
    """The same on the asyncio face: a blob deleted (as by a gc or an erasure that counted
    no user) between an append's spill and its commit is written again."""

    async def run() -> None:
        url = f"sqlite:///{tmp_path / 'e.db'}"
        async with await ae.open_async_store(url, spill_threshold=256) as store:
            blobs = store.blobs
            assert blobs is not None
            spill = _Paused(blobs, "spill")
            task = asyncio.create_task(store.append("b", [_ev({"doc": BIG})]))
            assert await asyncio.to_thread(spill.reached.wait, 60)
            (key,) = (b.key for b in blobs.list_blobs())
            assert blobs.delete(key)
            spill.go.set()
            await task
            assert [e.payload async for e in store.read("b")] == [{"doc": BIG}]

    asyncio.run(run())


def test_a_refresh_that_fails_after_the_commit_does_not_fail_the_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The blob store failing on the refresh after the commit: the events are in, so the
    append returns its result, and a warning says what was not done."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}", spill_threshold=256) as store:
        blobs: Any = store.blobs
        real, calls = blobs.put, []

        def put(data: bytes, **kw: Any) -> Any:
            calls.append(1)
            if len(calls) == 2:
                raise ae.StoreUnavailable("blob store down")
            return real(data, **kw)

        blobs.put = put
        with caplog.at_level("WARNING", logger="ares_events"):
            res = store.append("b", [_ev({"doc": BIG})])
        assert res.version == 1 and len(calls) == 2
        assert "could not refresh 1 spilled blob" in caplog.text
        (b,) = store.read("b")
        assert b.payload == {"doc": BIG}


def _run_all(fns: list[Any]) -> None:
    """Run ``fns`` on threads at once; re-raise the first error."""
    errors: list[BaseException] = []

    def run(fn: Any) -> None:
        try:
            fn()
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=run, args=(fn,)) for fn in fns]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "memory"]
)
def test_concurrent_erasures_of_one_event_record_it_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Four erasers race on one event, many times (separate stores on one SQLite file,
    one shared store elsewhere): one erases it, the others see it erased, and one
    erasure record names it."""
    with open_backend(backend, tmp_path, request) as store:
        url = f"sqlite:///{tmp_path / 'sq.db'}"
        others = [ae.open_store(url) for _ in range(4)] if backend == "sqlite" else []
        erasers = others or [store] * 4
        main_store = others[0] if others else store
        try:
            for i in range(25):
                main_store.append(f"s{i}", [_ev({"ssn": SECRET})])
                go = threading.Barrier(4)
                reports: list[ae.ErasureReport] = []

                def run(
                    s: ae.EventStore,
                    n: int,
                    i: int = i,
                    go: threading.Barrier = go,
                    reports: list[ae.ErasureReport] = reports,
                ) -> None:
                    go.wait()
                    reports.append(ae.erase(s, f"s{i}", 1, reason=f"request {n}", by="dpo"))

                _run_all([lambda s=s, n=n: run(s, n) for n, s in enumerate(erasers)])
                assert sorted(r.already_erased for r in reports) == [False, True, True, True]
                recs = [
                    e
                    for e in main_store.read(ae.ERASURE_STREAM)
                    if e.payload["stream_id"] == f"s{i}"
                ]
                assert len(recs) == 1, f"iteration {i}"
            assert ae.integrity.audit(main_store).ok
        finally:
            for o in others:
                o.close()


def test_erasure_records_with_random_ids_are_still_recognised(tmp_path: Path) -> None:
    """A record written before ids were derived (a random id) still counts: erasing again
    appends nothing, and the audit finds the erasure recorded."""
    from ares_events.projections.erasure import erasure_record

    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        store.append("p", [_ev({"n": 1})])
        before, _refs = store.erase_payload("p", 1)
        old = erasure_record(before, "r", "b")
        legacy = ae.NewEvent(type=old.type, module=old.module, payload=old.payload)
        store.append(ae.ERASURE_STREAM, [legacy])
        rep = ae.erase(store, "p", 1, reason="again", by="b")
        assert rep.already_erased and rep.record_position is None
        assert len(list(store.read(ae.ERASURE_STREAM))) == 1
        assert ae.integrity.audit(store).ok
        assert erasure_record(before, "x", "y").event_id == old.event_id  # derived id


def test_snapshot_events_covering_the_erased_version_are_erased(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Snapshot events (stream ``snapshots/<S>``, metadata ``covers``: the highest version
    of S they fold) at or after the erased version are erased and recorded like the event;
    those below it, and those without an int ``covers``, are kept. Idempotent: a second
    erasure erases nothing more and records nothing twice; a snapshot event erased without
    a record (an interrupted erasure) gets its record."""
    snaps = f"{SNAPSHOT_STREAM_PREFIX}S"

    def snap(covers: Any) -> ae.NewEvent:
        meta = {} if covers is None else {SNAPSHOT_COVERS: covers}
        return ae.NewEvent(type="snap", module="test", payload={"state": SECRET}, metadata=meta)

    with open_backend(backend, tmp_path, request) as store:
        store.append("S", [_ev({"n": 1}), _ev({"ssn": SECRET}), _ev({"n": 3})])
        # versions 1..7 of snapshots/S: covers 3, 2, 1, none, "3", True, 3 (erased, no record)
        store.append(snaps, [snap(c) for c in (3, 2, 1, None, "3", True, 3)])
        store.erase_payload(snaps, 7)  # an erasure interrupted before its record
        rep = ae.erase(store, "S", 2, reason="gdpr", by="dpo")
        assert rep.snapshot_events_erased == 2
        assert rep.to_dict()["snapshot_events_erased"] == 2
        erased = [e.version for e in store.read(snaps) if e.payload_erased]
        assert erased == [1, 2, 7]
        recs = [
            (e.payload["stream_id"], e.payload["version"]) for e in store.read(ae.ERASURE_STREAM)
        ]
        assert sorted(recs) == [("S", 2), (snaps, 1), (snaps, 2), (snaps, 7)]
        again = ae.erase(store, "S", 2, reason="gdpr", by="dpo")
        assert again.already_erased and again.snapshot_events_erased == 0
        assert len(list(store.read(ae.ERASURE_STREAM))) == 4
        assert ae.integrity.audit(store).ok
        # A stream without snapshot events, and one whose id leaves no room for the prefix.
        for sid in ("T", "L" * 256):
            store.append(sid, [_ev({"n": 1})])
            assert ae.erase(store, sid, 1, reason="gdpr", by="dpo").snapshot_events_erased == 0
