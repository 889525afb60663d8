"""Malformed rows and duplicates become findings, never exceptions.

A tampered SQLite file can hold any value in any column (SQLite stores a BLOB in a TEXT
column without complaint), a ``payload_ref`` that is not a reference, or, with its unique
indexes dropped, two rows with one version. ``verify_stream`` and ``audit`` report each
as a finding (``malformed_row``, ``duplicate_version``, ...) naming the stream and the
version or position, and go on: every other finding of the audit is still reported.
The CLI exits 1 with its JSON, never "internal error".
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from tests.fixtures.cli_helpers import run_json


def sql(path: Path, statement: str, *params: Any) -> list[Any]:
    """Run one statement directly on the file and commit."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A closed store file: streams ``a`` (5 events) and ``b`` (5 events)."""
    path = tmp_path / "m.db"
    with ae.open_store(f"sqlite:///{path}") as store:
        for sid in ("a", "b"):
            store.append(
                sid, [ae.NewEvent(type="t", module="m", payload={"n": n}) for n in range(5)]
            )
    return path


def position(path: Path, sid: str, version: int) -> int:
    return int(
        sql(
            path,
            "SELECT position FROM ares_events WHERE stream_id = ? AND version = ?",
            sid,
            version,
        )[0][0]
    )


def audit_of(path: Path) -> ae.integrity.AuditReport:
    with ae.open_store(f"sqlite:///{path}") as store:
        return ae.integrity.audit(store, deep=True)


def verify_of(path: Path, sid: str) -> ae.integrity.VerifyReport:
    with ae.open_store(f"sqlite:///{path}") as store:
        return ae.integrity.verify_stream(store, sid)


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("payload_ref", "not json at all", "payload_ref"),
        ("payload_ref", '{"key": 5, "size": "big", "digest": []}', "payload_ref"),
        ("payload_ref", "[1, 2, 3]", "payload_ref"),
        ("type", b"\x00blob", "type is BLOB"),
        ("recorded_at", b"2026", "recorded_at is BLOB"),
        ("event_id", b"\x01\x02", "event_id is BLOB"),
        ("module", b"\x01", "module is BLOB"),
        ("metadata", "{}", "metadata is TEXT"),
        ("hash", b"short", "hash is 5 bytes"),
        ("prev_hash", 3.5, "prev_hash is REAL"),
    ],
)
def test_a_malformed_row_is_a_finding_and_the_audit_goes_on(
    db: Path, column: str, value: object, reason: str
) -> None:
    """A column of the wrong type or a payload_ref that is not a reference is a
    malformed_row finding (stream, version, position, reason); verify and audit do not
    raise, and a second problem elsewhere is still reported."""
    pos = position(db, "a", 3)
    sql(db, f"UPDATE ares_events SET {column} = ? WHERE position = ?", value, pos)
    sql(db, "DELETE FROM ares_events WHERE position = ?", position(db, "b", 2))
    report = verify_of(db, "a")
    kinds = {(f.kind, f.version) for f in report.findings}
    assert ("malformed_row", 3) in kinds
    (bad,) = [f for f in report.findings if f.kind == "malformed_row"]
    assert reason in bad.detail and str(pos) in bad.detail
    audit = audit_of(db)
    assert ("malformed_row", "a", 3) in {(f.kind, f.stream_id, f.version) for f in audit.findings}
    assert ("gap", "b", 3) in {(f.kind, f.stream_id, f.version) for f in audit.findings}


def test_a_version_stored_as_blob_is_a_finding(db: Path) -> None:
    """A version rewritten as a BLOB takes the row out of its stream's version order:
    verify reports the gap it leaves, the audit also names the malformed row."""
    sql(db, "UPDATE ares_events SET version = ? WHERE position = ?", b"3", position(db, "a", 3))
    assert ("gap", 4) in {(f.kind, f.version) for f in verify_of(db, "a").findings}
    audit = audit_of(db)
    bad = [f for f in audit.findings if f.kind == "malformed_row"]
    assert len(bad) == 1 and bad[0].stream_id == "a" and "version is BLOB" in bad[0].detail


@pytest.mark.parametrize("version", [0, -1, -(2**63)])
def test_a_version_below_one_is_a_finding_not_a_crash(
    db: Path, version: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first event whose version was rewritten to 0 or below: the audit reports the gap
    it leaves (it raised KeyError, exit 4), from the API and the CLI."""
    sql(db, "UPDATE ares_events SET version = ? WHERE position = ?", version, position(db, "a", 1))
    assert ("gap", "a") in {(f.kind, f.stream_id) for f in audit_of(db).findings}
    code, data = run_json(capsys, "--store", f"sqlite:///{db}", "audit")
    assert code == 1 and ("gap", "a") in {(f["kind"], f["stream_id"]) for f in data["findings"]}


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE ares_events SET payload = CAST('{not json' AS BLOB) WHERE position = {pos}",
        "UPDATE ares_events SET metadata = CAST('[' AS BLOB) WHERE position = {pos}",
        "UPDATE ares_events SET payload = CAST(x'ff00' AS BLOB) WHERE position = {pos}",
        "UPDATE ares_events SET hash = 'abc' WHERE position = {pos}",
        "UPDATE ares_events SET payload = 7 WHERE position = {pos}",
        "UPDATE ares_streams SET version = 'x' WHERE stream_id = 'a'",
    ],
)
def test_tail_shows_a_damaged_stream_and_proofs_report_it(
    db: Path, damage: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`tail` (both outputs) shows a stream with a damaged row or head as stored, never
    decoding what is not JSON; `prove` and `rebuild merkle_log --verify` over a hash
    that is not 32 bytes report a malformed_row (exit 1). All used to exit 4."""
    from tests.fixtures.cli_helpers import run

    url = f"sqlite:///{db}"
    key = tmp_path / "log.key"
    assert run(capsys, "keygen", "example.com/log", "--out", str(key))[0] == 0
    assert run(capsys, "--store", url, "checkpoint", "--key", str(key))[0] == 0
    sql(db, damage.replace("{pos}", str(position(db, "a", 2))))
    code, data = run_json(capsys, "--store", url, "tail", "a")
    assert code == 0 and [e["version"] for e in data["events"]] == [1, 2, 3, 4, 5]
    json.dumps(data)
    code, out, _ = run(capsys, "--store", url, "tail", "a")
    assert code == 0 and "internal error" not in out
    assert run(capsys, "--store", url, "verify", "a")[0] == 1
    if "hash = 'abc'" in damage:
        for args in (("prove", "a", "2"), ("rebuild", "merkle_log", "--verify")):
            code, _, err = run(capsys, "--store", url, *args)
            assert code == 1 and "malformed_row" in err, (args, err)


def test_a_stream_id_stored_as_blob_is_a_finding(db: Path) -> None:
    """A stream id rewritten as a BLOB (an event no longer in its stream, a head row
    with a BLOB key) is reported; the audit does not raise."""
    sql(db, "UPDATE ares_events SET stream_id = ? WHERE position = ?", b"a", position(db, "a", 5))
    sql(db, "UPDATE ares_streams SET stream_id = ? WHERE stream_id = 'b'", b"b")
    audit = audit_of(db)
    found = {(f.kind, f.stream_id) for f in audit.findings}
    assert ("truncated", "a") in found  # its last event left the stream
    assert any(k == "malformed_row" for k, _ in found)


def test_a_malformed_head_row_is_a_finding(db: Path) -> None:
    """A head row whose version is TEXT or whose hash has the wrong length is a
    malformed_row finding, not a crash."""
    sql(db, "UPDATE ares_streams SET version = 'five' WHERE stream_id = 'a'")
    sql(db, "UPDATE ares_streams SET head_hash = x'00' WHERE stream_id = 'b'")
    audit = audit_of(db)
    found = {(f.kind, f.stream_id) for f in audit.findings}
    assert {("malformed_row", "a"), ("malformed_row", "b")} <= found
    assert not verify_of(db, "a").ok


def test_cli_audit_of_malformed_rows_exits_1_with_json(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ares-events audit --json` on a file with malformed rows exits 1 (findings) and
    prints its JSON with every finding; nothing says "internal error"."""
    sql(db, "UPDATE ares_events SET payload_ref = 'garbage' WHERE position = 1")
    sql(db, "UPDATE ares_events SET type = ? WHERE position = 2", b"\xff")
    code, data = run_json(capsys, "--store", f"sqlite:///{db}", "audit", "--deep")
    assert code == 1
    assert data["ok"] is False
    assert [f["kind"] for f in data["findings"]].count("malformed_row") == 2
    json.dumps(data)  # JSON all the way down


def test_duplicate_at_a_page_boundary_is_read_and_reported(tmp_path: Path) -> None:
    """With the unique indexes dropped, an exact copy of version 2000 in a 2001-event
    stream (default page size 2000) is read (not skipped) and reported by verify and audit."""
    path = tmp_path / "p.db"
    with ae.open_store(f"sqlite:///{path}") as store:
        store.append(
            "s", [ae.NewEvent(type="t", module="m", payload={"n": n}) for n in range(2001)]
        )
    sql(path, "DROP INDEX ares_events_stream_version")
    sql(path, "DROP INDEX ares_events_event_id")
    sql(
        path,
        "INSERT INTO ares_events SELECT 2002, stream_id, version, event_id, type, module, "
        "payload, payload_ref, metadata, recorded_at, prev_hash, hash FROM ares_events "
        "WHERE stream_id = 's' AND version = 2000",
    )
    with ae.open_store(f"sqlite:///{path}") as store:
        versions = [e.version for e in store.read("s")]
        assert len(versions) == 2002 and versions.count(2000) == 2
        report = ae.integrity.verify_stream(store, "s")
        assert ("duplicate_version", 2000) in {(f.kind, f.version) for f in report.findings}
        audit = ae.integrity.audit(store)
        kinds = {(f.kind, f.version) for f in audit.findings}
        assert ("duplicate_version", 2000) in kinds
        assert any(f.kind == "duplicate_event_id" for f in audit.findings)


def test_keyset_paging_returns_each_row_once(tmp_path: Path) -> None:
    """Reads page on (version, position): with a small page size and rows sharing
    versions across page boundaries, every row comes back exactly once, in order."""
    path = tmp_path / "k.db"
    with ae.open_store(f"sqlite:///{path}") as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"n": n}) for n in range(9)])
    sql(path, "DROP INDEX ares_events_stream_version")
    sql(path, "DROP INDEX ares_events_event_id")
    for v in (3, 3, 4, 9):
        sql(
            path,
            "INSERT INTO ares_events SELECT (SELECT max(position) + 1 FROM ares_events), "
            "stream_id, version, event_id, type, module, payload, payload_ref, metadata, "
            "recorded_at, prev_hash, hash FROM ares_events WHERE stream_id = 's' AND "
            "version = ? ORDER BY position LIMIT 1",
            v,
        )
    rows = sql(path, "SELECT version, position FROM ares_events ORDER BY version, position")
    with ae.open_store(f"sqlite:///{path}?page_size=2") as store:
        got = [(e.version, e.position) for e in store.read("s")]
        assert got == [tuple(r) for r in rows]
        tail = [(e.version, e.position) for e in store.read("s", from_version=4, limit=3)]
        assert tail == [tuple(r) for r in rows if r[0] >= 4][:3]


def test_recover_reports_a_malformed_row_and_does_not_fold_it(db: Path) -> None:
    """recover() over a stream holding a malformed row reports it (ok is False) and
    folds the well-formed events around it instead of raising."""
    sql(db, "UPDATE ares_events SET payload_ref = 'x' WHERE position = ?", position(db, "a", 2))
    with ae.open_store(f"sqlite:///{db}") as store:
        seen: list[int] = []

        def fold(state: int, e: ae.RecordedEvent) -> int:
            seen.append(e.version)
            return state + int(e.payload["n"])

        res = ae.replay(store, "a", fold, 0)
        assert not res.ok and seen == [1, 3, 4, 5]
        assert "malformed_row" in {f.kind for f in res.findings}
        with pytest.raises(ae.ChainIntegrityError):
            ae.replay(store, "a", fold, 0, strict=True)


@pytest.mark.parametrize(
    ("column", "value", "reason"),
    [
        ("stream_id", b"\xff\x00", "stream_id is BLOB"),
        ("payload", None, "payload is NULL"),
        ("type", b"\x00", "type is BLOB"),
    ],
)
def test_rebuild_over_a_malformed_row_names_it(
    db: Path, column: str, value: object, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rebuild` of each built-in projection over a malformed row stops with the
    malformed_row finding naming its position (exit 1, as the audit), from the CLI and the
    library; it neither crashes (exit 4) nor folds the row into the read model."""
    from ares_events.projections import BUILTIN, ProjectionRunner, rebuild
    from tests.fixtures.cli_helpers import run

    pos = position(db, "a", 3)
    sql(db, f"UPDATE ares_events SET {column} = ? WHERE position = ?", value, pos)
    url = f"sqlite:///{db}"
    assert sorted(BUILTIN) == ["agent_state", "genealogy", "recovery_state", "run_state"]
    for name in BUILTIN:
        code, _, err = run(capsys, "--store", url, "rebuild", name)
        assert code == 1 and "malformed_row" in err and f"position {pos}" in err, (name, err)
        assert reason in err and "ares-events audit" in err, err
        code, data = run_json(capsys, "--store", url, "rebuild", name, "--json")
        assert code == 1 and data["error"]["kind"] == "findings", data
    with ae.open_store(url) as store:
        for cls in BUILTIN.values():
            with pytest.raises(ae.ChainIntegrityError) as caught:
                rebuild(store, cls(), from_scratch=True)
            (finding,) = caught.value.findings
            assert finding.kind == "malformed_row" and reason in finding.detail
            with pytest.raises(ae.ChainIntegrityError):
                ProjectionRunner(store, [cls()], strict=False).run_until_idle()


@pytest.mark.parametrize(
    ("change", "reason"),
    [("payload = NULL", "payload is NULL"), ("payload_ref = 'x'", "payload_ref")],
)
def test_rebuild_over_a_malformed_postgres_row_names_it(
    postgres_url: str, change: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On PostgreSQL (typed columns: what a hand edit can still break is the payload and its
    reference) `rebuild` stops with the malformed_row finding too, never folding the row."""
    import psycopg

    from ares_events.projections import BUILTIN, rebuild
    from tests.fixtures.cli_helpers import run

    with ae.open_store(postgres_url) as store:
        store.append("a", [ae.NewEvent(type="t", module="m", payload={"n": n}) for n in range(3)])
        pos = [e.position for e in store.read("a")][1]
    schema = postgres_url.rsplit("schema=", 1)[1].split("&", maxsplit=1)[0]
    damage = f"UPDATE {schema}.ares_events SET {change} WHERE position = {pos}"
    with psycopg.connect(postgres_url.rsplit("?", 1)[0], autocommit=True) as conn:
        conn.execute(damage)
    code, _, err = run(capsys, "--store", postgres_url, "rebuild", "agent_state")
    assert code == 1 and f"position {pos}: {reason}" in err, err
    with ae.open_store(postgres_url) as store:
        for cls in BUILTIN.values():
            with pytest.raises(ae.ChainIntegrityError, match=f"position {pos}: {reason}"):
                rebuild(store, cls(), from_scratch=True)
