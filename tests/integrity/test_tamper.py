"""Tamper detection against a real SQLite file.

Each test writes a few streams through the library, closes the store, edits the file
directly with the ``sqlite3`` module (tables ``ares_events`` and ``ares_streams``), reopens
it, and checks that both ``verify_stream`` and ``audit`` report the right finding kind at
the right stream and version.

Streams ``agent-a``, ``agent-b`` and ``agent-c`` are appended round-robin (10 events each,
so their global positions interleave: ``agent-b`` version v is at position 3v - 1), then
``agent-tail`` gets 10 events at positions 31..40.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.integrity import AuditReport, VerifyReport
from tests.integrity.test_vectors import ref_canonical, ref_header, ref_link

KEY = bytes(range(32))
RR = ["agent-a", "agent-b", "agent-c"]
TAIL = "agent-tail"
N = 10
B = "agent-b"


def pos_b(version: int) -> int:
    """Global position of ``agent-b`` at ``version``."""
    return 3 * (version - 1) + 2


def url(path: Path) -> str:
    """Store URL of the SQLite file (four slashes: absolute path)."""
    return f"sqlite:///{path}"


@pytest.fixture(params=[None, KEY], ids=["unkeyed", "keyed"])
def key(request: pytest.FixtureRequest) -> bytes | None:
    """The chain key the store is written and verified with (or none)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def db(tmp_path: Path, key: bytes | None) -> Path:
    """A closed SQLite store file holding the four streams described in the module doc."""
    path = tmp_path / "t.db"
    with ae.open_store(url(path), chain_key=key) as store:
        for n in range(1, N + 1):
            for sid in RR:
                ae.emit(
                    store,
                    sid,
                    "step.done",
                    "runtime",
                    {"n": n, "text": f"step {n} of {sid}", "tags": ["x", n]},
                    metadata={"run": "r1", "n": n} if n % 2 else None,
                )
        store.append(
            TAIL,
            [ae.NewEvent(type="tail.step", module="runtime", payload={"n": n}) for n in range(N)],
            expected_version=ae.NO_STREAM,
        )
    return path


def sql(path: Path, statement: str, *params: Any) -> list[Any]:
    """Run one statement directly on the file (the tamperer's view) and commit."""
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(statement, params).fetchall()
        conn.commit()
        return rows
    finally:
        conn.close()


def row(path: Path, stream_id: str, version: int, column: str) -> Any:
    """One stored column of one event."""
    return sql(
        path,
        f"SELECT {column} FROM ares_events WHERE stream_id = ? AND version = ?",
        stream_id,
        version,
    )[0][0]


def findings_of(
    path: Path, key: bytes | None, stream_id: str, *, check_identity: bool = True
) -> tuple[VerifyReport, AuditReport]:
    """verify_stream of ``stream_id`` and a full audit, from a freshly opened store."""
    with ae.open_store(url(path), chain_key=key, check_identity=check_identity) as store:
        return ae.integrity.verify_stream(store, stream_id), ae.integrity.audit(store)


def kinds(findings: Any) -> set[tuple[str, str | None, int | None]]:
    """The (kind, stream, version) of each finding."""
    return {(f.kind, f.stream_id, f.version) for f in findings}


def assert_found(
    path: Path,
    key: bytes | None,
    stream_id: str,
    expected: set[tuple[str, int]],
    *,
    extra_audit: frozenset[str] = frozenset(),
) -> AuditReport:
    """verify_stream reports exactly ``expected`` for the stream; the audit reports the
    same for that stream, nothing for other streams, and no other global findings than
    kinds listed in ``extra_audit``."""
    want = {(k, stream_id, v) for k, v in expected}
    report, audit = findings_of(path, key, stream_id)
    assert not report.ok
    assert kinds(report.findings) == want
    assert not audit.ok
    assert kinds(audit.streams[stream_id].findings) == want
    for sid, r in audit.streams.items():
        if sid != stream_id:
            assert r.ok, (sid, r.findings)
    others = {f.kind for f in audit.findings if (f.kind, f.stream_id, f.version) not in want}
    assert others <= extra_audit
    assert want <= kinds(audit.findings)
    return audit


# -- clean ------------------------------------------------------------------------------


def test_clean_store_verifies_and_audits_ok(db: Path, key: bytes | None) -> None:
    """An untouched store verifies clean stream by stream and audits clean."""
    with ae.open_store(url(db), chain_key=key) as store:
        for sid in [*RR, TAIL]:
            r = ae.integrity.verify_stream(store, sid)
            assert r.ok and r.events_checked == N and r.version == N == r.head_version
        audit = ae.integrity.audit(store)
    assert audit.ok
    assert audit.streams_checked == 4
    assert audit.events_checked == 4 * N
    d = audit.to_dict()
    assert d["ok"] is True and d["findings"] == [] and d["events_checked"] == 4 * N


def test_wrong_key_is_refused_and_flags_every_event(db: Path, key: bytes | None) -> None:
    """Opening the file with another key (or keyed vs unkeyed) is a ConfigError (the store
    remembers its chain mode); read anyway (check_identity=False), every event is flagged."""
    other = None if key is not None else KEY
    with pytest.raises(ae.ConfigError, match="keyed" if key is not None else "unkeyed"):
        findings_of(db, other, B)
    report, audit = findings_of(db, other, B, check_identity=False)
    assert kinds(report.findings) == {("hash_mismatch", B, v) for v in range(1, N + 1)}
    assert len(audit.findings) == 4 * N


# -- edited content ---------------------------------------------------------------------


def test_flipped_payload_byte(db: Path, key: bytes | None) -> None:
    """Flipping one byte of a stored payload is a hash_mismatch at that version."""
    payload = bytearray(row(db, B, 5, "payload"))
    payload[3] ^= 0x01
    sql(db, "UPDATE ares_events SET payload = ? WHERE position = ?", bytes(payload), pos_b(5))
    assert_found(db, key, B, {("hash_mismatch", 5)})


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("type", "step.skipped"),
        ("module", "evil"),
        ("recorded_at", "2020-01-01T00:00:00.000000Z"),
        ("metadata", b'{"run":"r2"}'),
        ("metadata", b"{}"),
        ("event_id", "00000000-0000-4000-8000-000000000001"),
    ],
)
def test_edited_header_field(db: Path, key: bytes | None, column: str, value: object) -> None:
    """Editing the type, module, recorded_at, metadata or event id of a stored event is a
    hash_mismatch at that version."""
    assert row(db, B, 5, column) != value
    sql(db, f"UPDATE ares_events SET {column} = ? WHERE position = ?", value, pos_b(5))
    assert_found(db, key, B, {("hash_mismatch", 5)})


def test_edited_payload_stored_as_text(db: Path, key: bytes | None) -> None:
    """A payload rewritten as a TEXT value (as a sqlite3 shell user would) is a
    malformed_row finding naming the column and its storage class."""
    sql(db, "UPDATE ares_events SET payload = ? WHERE position = ?", '{"n":99}', pos_b(4))
    audit = assert_found(db, key, B, {("malformed_row", 4)})
    (f,) = audit.streams[B].findings
    assert "payload is TEXT" in f.detail and str(pos_b(4)) in f.detail


# -- deleted rows -----------------------------------------------------------------------


def test_deleted_middle_row(db: Path, key: bytes | None) -> None:
    """Deleting a middle row is a gap at the next version, and a position_gap in the audit."""
    sql(db, "DELETE FROM ares_events WHERE position = ?", pos_b(5))
    audit = assert_found(db, key, B, {("gap", 6)}, extra_audit=frozenset({"position_gap"}))
    gaps = [f for f in audit.findings if f.kind == "position_gap"]
    assert len(gaps) == 1
    assert str(pos_b(5)) in gaps[0].detail


def test_deleted_tail_rows(db: Path, key: bytes | None) -> None:
    """Deleting the last rows of a stream is `truncated` (head says 10), even though the
    remaining chain is internally consistent and the global log has no hole."""
    sql(db, "DELETE FROM ares_events WHERE stream_id = ? AND version > 7", TAIL)
    audit = assert_found(db, key, TAIL, {("truncated", N)})
    assert kinds(audit.findings) == {("truncated", TAIL, N)}
    assert audit.streams[TAIL].version == 7
    assert audit.streams[TAIL].head_version == N


def test_deleted_tail_rows_interleaved(db: Path, key: bytes | None) -> None:
    """Deleting the tail of an interleaved stream is `truncated` (and position gaps)."""
    sql(db, "DELETE FROM ares_events WHERE stream_id = ? AND version > 8", B)
    assert_found(db, key, B, {("truncated", N)}, extra_audit=frozenset({"position_gap"}))


def test_deleted_whole_stream_events(db: Path, key: bytes | None) -> None:
    """Deleting every event of a stream but not its head is `truncated`."""
    sql(db, "DELETE FROM ares_events WHERE stream_id = ?", TAIL)
    report, audit = findings_of(db, key, TAIL)
    assert kinds(report.findings) == {("truncated", TAIL, N)}
    assert kinds(audit.findings) == {("truncated", TAIL, N)}


# -- swapped rows -----------------------------------------------------------------------


def test_swapped_payloads(db: Path, key: bytes | None) -> None:
    """Swapping two rows' payloads is a hash_mismatch at both versions."""
    p3, p6 = row(db, B, 3, "payload"), row(db, B, 6, "payload")
    sql(db, "UPDATE ares_events SET payload = ? WHERE position = ?", p6, pos_b(3))
    sql(db, "UPDATE ares_events SET payload = ? WHERE position = ?", p3, pos_b(6))
    assert_found(db, key, B, {("hash_mismatch", 3), ("hash_mismatch", 6)})


SWAP_COLS = [
    "event_id",
    "type",
    "module",
    "payload",
    "metadata",
    "recorded_at",
    "prev_hash",
    "hash",
]


def test_swapped_rows(db: Path, key: bytes | None) -> None:
    """Swapping the whole contents of two rows (keeping versions and positions) is a
    hash_mismatch and broken_link at both, and a broken_link after each."""
    cols = ", ".join(SWAP_COLS)
    r3 = sql(db, f"SELECT {cols} FROM ares_events WHERE position = ?", pos_b(3))[0]
    r6 = sql(db, f"SELECT {cols} FROM ares_events WHERE position = ?", pos_b(6))[0]
    sets = ", ".join(f"{c} = ?" for c in SWAP_COLS)
    # event_id is unique: park one row's id first.
    sql(db, "UPDATE ares_events SET event_id = 'parked' WHERE position = ?", pos_b(3))
    sql(db, f"UPDATE ares_events SET {sets} WHERE position = ?", *r3, pos_b(6))
    sql(db, f"UPDATE ares_events SET {sets} WHERE position = ?", *r6, pos_b(3))
    assert_found(
        db,
        key,
        B,
        {
            ("broken_link", 3),
            ("hash_mismatch", 3),
            ("broken_link", 4),
            ("broken_link", 6),
            ("hash_mismatch", 6),
            ("broken_link", 7),
        },
    )


# -- edited hashes and heads ------------------------------------------------------------


def test_edited_hash(db: Path, key: bytes | None) -> None:
    """Editing a middle event's hash is a hash_mismatch there and a broken_link next."""
    h = bytearray(row(db, B, 5, "hash"))
    h[0] ^= 0xFF
    sql(db, "UPDATE ares_events SET hash = ? WHERE position = ?", bytes(h), pos_b(5))
    assert_found(db, key, B, {("hash_mismatch", 5), ("broken_link", 6)})


def test_edited_prev_hash(db: Path, key: bytes | None) -> None:
    """Editing an event's prev_hash is a broken_link and a hash_mismatch there."""
    sql(db, "UPDATE ares_events SET prev_hash = ? WHERE position = ?", bytes(32), pos_b(1))
    assert_found(db, key, B, {("broken_link", 1), ("hash_mismatch", 1)})


def test_edited_last_hash(db: Path, key: bytes | None) -> None:
    """Editing the last event's hash is a hash_mismatch and a head_mismatch."""
    sql(db, "UPDATE ares_events SET hash = ? WHERE position = ?", bytes(32), pos_b(N))
    assert_found(db, key, B, {("hash_mismatch", N), ("head_mismatch", N)})


def test_edited_head_hash(db: Path, key: bytes | None) -> None:
    """Editing the head row's hash is a head_mismatch."""
    sql(db, "UPDATE ares_streams SET head_hash = ? WHERE stream_id = ?", bytes(32), B)
    assert_found(db, key, B, {("head_mismatch", N)})


def test_head_version_lowered(db: Path, key: bytes | None) -> None:
    """A head behind the events is a head_mismatch (at the version the head claims)."""
    sql(db, "UPDATE ares_streams SET version = 7 WHERE stream_id = ?", B)
    assert_found(db, key, B, {("head_mismatch", 7)})


def test_head_version_raised(db: Path, key: bytes | None) -> None:
    """A head ahead of the events means events are missing: truncated."""
    sql(db, "UPDATE ares_streams SET version = 12 WHERE stream_id = ?", B)
    assert_found(db, key, B, {("truncated", 12)})


def test_head_row_deleted(db: Path, key: bytes | None) -> None:
    """Events without a head row are a head_mismatch."""
    sql(db, "DELETE FROM ares_streams WHERE stream_id = ?", B)
    assert_found(db, key, B, {("head_mismatch", N)})


# -- forged and duplicated events -------------------------------------------------------


def forge_next(path: Path, stream_id: str, forge_key: bytes | None, *, version: int) -> bytes:
    """Append a forged event after ``version`` directly in the file, computing its hash
    from the public spec with ``forge_key``, and move the head to it. Returns the hash."""
    prev = row(path, stream_id, version, "hash")
    at = row(path, stream_id, version, "recorded_at")
    payload = ref_canonical({"forged": True})
    eid = "ffffffff-ffff-4fff-8fff-ffffffffffff"
    header = ref_header(stream_id, version + 1, eid, "step.done", "runtime", {}, at, payload)
    h = ref_link(prev, header, forge_key)
    last = sql(path, "SELECT max(position) FROM ares_events")[0][0]
    sql(
        path,
        "INSERT INTO ares_events (position, stream_id, version, event_id, type, module, "
        "payload, payload_ref, metadata, recorded_at, prev_hash, hash) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?, ?)",
        last + 1, stream_id, version + 1, eid, "step.done", "runtime", payload, b"{}", at,
        prev, h,
    )  # fmt: skip
    sql(path, "UPDATE ares_streams SET version = ?, head_hash = ? WHERE stream_id = ?",
        version + 1, h, stream_id)  # fmt: skip
    return h


@pytest.mark.parametrize("key", [KEY], ids=["keyed"])
@pytest.mark.parametrize(
    "forge_key", [None, bytes(32)], ids=["unkeyed-forgery", "wrong-key-forgery"]
)
def test_forged_event_in_keyed_store(db: Path, key: bytes, forge_key: bytes | None) -> None:
    """In a keyed store, an event appended with a hash recomputed from the public spec
    without the key (head moved along) is a hash_mismatch."""
    forge_next(db, B, forge_key, version=N)
    assert_found(db, key, B, {("hash_mismatch", N + 1)})


@pytest.mark.parametrize("key", [None], ids=["unkeyed"])
def test_forged_event_in_unkeyed_store_is_undetectable(db: Path, key: None) -> None:
    """Without a chain key, a forger who follows the spec extends the chain undetected:
    this is why production stores configure a key (or anchors)."""
    forge_next(db, B, None, version=N)
    report, audit = findings_of(db, key, B)
    assert report.ok and report.version == N + 1
    assert audit.ok


def _drop_unique_indexes(path: Path) -> None:
    sql(path, "DROP INDEX ares_events_stream_version")
    sql(path, "DROP INDEX ares_events_event_id")


def test_duplicate_version_copy(db: Path, key: bytes | None) -> None:
    """An exact copy of a row inserted at the end of the log is a duplicate_version."""
    _drop_unique_indexes(db)
    last = sql(db, "SELECT max(position) FROM ares_events")[0][0]
    sql(
        db,
        "INSERT INTO ares_events SELECT ?, stream_id, version, event_id, type, module, "
        "payload, payload_ref, metadata, recorded_at, prev_hash, hash "
        "FROM ares_events WHERE position = ?",
        last + 1,
        pos_b(5),
    )
    # At the end of the log, version 5 also comes after version 10: position_order too.
    extra = frozenset({"duplicate_event_id", "position_order"})
    audit = assert_found(db, key, B, {("duplicate_version", 5)}, extra_audit=extra)
    (dup,) = [f for f in audit.findings if f.kind == "duplicate_event_id"]
    assert "2 rows" in dup.detail


def test_duplicate_version_alternative(db: Path, key: bytes | None) -> None:
    """A second, different event under an existing version is a duplicate_version."""
    _drop_unique_indexes(db)
    last = sql(db, "SELECT max(position) FROM ares_events")[0][0]
    sql(
        db,
        "INSERT INTO ares_events SELECT ?, stream_id, version, event_id, type, module, "
        "?, payload_ref, metadata, recorded_at, prev_hash, hash "
        "FROM ares_events WHERE position = ?",
        last + 1,
        b'{"n":5,"alt":true}',
        pos_b(5),
    )
    report, audit = findings_of(db, key, B)
    assert ("duplicate_version", B, 5) in kinds(report.findings)
    assert ("duplicate_version", B, 5) in kinds(audit.findings)
    assert {f.stream_id for f in audit.findings} == {B, None}
    assert {f.kind for f in audit.findings if f.stream_id is None} == {"duplicate_event_id"}


def test_row_moved_to_another_stream(db: Path, key: bytes | None) -> None:
    """A row relabelled into another stream leaves a gap in its own stream and is a
    broken, mismatched or duplicate event in the other."""
    sql(db, "UPDATE ares_events SET stream_id = ?, version = 11 WHERE position = ?",
        "agent-c", pos_b(5))  # fmt: skip
    report, audit = findings_of(db, key, B)
    assert kinds(report.findings) == {("gap", B, 6)}
    c = kinds(audit.streams["agent-c"].findings)
    assert ("hash_mismatch", "agent-c", 11) in c
    assert ("head_mismatch", "agent-c", N) in c


# -- global positions -------------------------------------------------------------------


def test_global_position_gap(db: Path, key: bytes | None) -> None:
    """A hole in the global log (last event moved to a later position) is a position_gap
    in the audit, even when every chain is intact."""
    last = sql(db, "SELECT max(position) FROM ares_events")[0][0]
    sql(db, "UPDATE ares_events SET position = ? WHERE position = ?", last + 5, last)
    with ae.open_store(url(db), chain_key=key) as store:
        assert ae.integrity.verify_stream(store, TAIL).ok
        audit = ae.integrity.audit(store)
    assert kinds(audit.findings) == {("position_gap", TAIL, N)}
    assert f"{last}..{last + 4}" in audit.findings[0].detail


def test_versions_swapped_in_the_global_log(db: Path, key: bytes | None) -> None:
    """Two events of one stream that swap positions: every chain and the position
    sequence are intact, but read_all would give the stream out of order (a fold of it,
    a rebuild, would apply version 6 before 5): a position_order in the audit."""
    a, b = pos_b(5), pos_b(6)
    sql(db, "UPDATE ares_events SET position = -1 WHERE position = ?", a)
    sql(db, "UPDATE ares_events SET position = ? WHERE position = ?", a, b)
    sql(db, "UPDATE ares_events SET position = ? WHERE position = -1", b)
    with ae.open_store(url(db), chain_key=key) as store:
        assert ae.integrity.verify_stream(store, B).ok
        audit = ae.integrity.audit(store)
    assert kinds(audit.findings) == {("position_order", B, 5)}


def test_global_position_gap_from_deleted_row(db: Path, key: bytes | None) -> None:
    """Deleting a row in the middle of the global log is a position_gap in the audit,
    reported at the event after the hole."""
    sql(db, "DELETE FROM ares_events WHERE position = 20")  # agent-b version 7 is 20
    audit = findings_of(db, key, B)[1]
    gaps = [f for f in audit.findings if f.kind == "position_gap"]
    assert [(f.stream_id, f.version) for f in gaps] == [("agent-c", 7)]
    assert "20..20" in gaps[0].detail


# -- the report -------------------------------------------------------------------------


def test_audit_report_to_dict_lists_findings(db: Path, key: bytes | None) -> None:
    """AuditReport.to_dict() is JSON-ready and lists every finding with kind, stream,
    version and detail."""
    import json

    sql(db, "DELETE FROM ares_events WHERE position = ?", pos_b(5))
    sql(db, "UPDATE ares_streams SET head_hash = ? WHERE stream_id = ?", bytes(32), "agent-a")
    audit = findings_of(db, key, B)[1]
    d = json.loads(json.dumps(audit.to_dict()))
    assert d["ok"] is False
    assert d["streams_checked"] == 4
    assert d["events_checked"] == 4 * N - 1
    got = {(f["kind"], f["stream_id"], f["version"]) for f in d["findings"]}
    assert got == {
        ("gap", B, 6),
        ("head_mismatch", "agent-a", N),
        ("position_gap", "agent-c", 5),
    }
    assert all(isinstance(f["detail"], str) and f["detail"] for f in d["findings"])
    assert len(d["findings"]) == len(audit.findings)


def test_findings_never_contain_the_key(db: Path, key: bytes | None) -> None:
    """No finding, report or repr shows the chain key."""
    sql(db, "UPDATE ares_events SET type = 'x' WHERE position = ?", pos_b(2))
    with ae.open_store(url(db), chain_key=key) as store:
        text = repr(store) + repr(store.chain_key)
        report = ae.integrity.verify_stream(store, B)
        audit = ae.integrity.audit(store)
    text += repr(report) + repr(audit) + str(audit.to_dict())
    text += " ".join(str(f) for f in audit.findings)
    assert KEY.hex() not in text
    assert repr(KEY) not in text
