"""Anchors: checkpoints of every stream head in a witness outside the store.

Tampering is done on a real SQLite file with plain SQL, the way an attacker with write
access to the database would do it, and always so that a bare chain verification passes.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.chain import canonical_json, header_bytes, link_hash, payload_digest
from ares_events.cli import main
from ares_events.errors import ConfigError
from ares_events.integrity.anchors import (
    check_anchors,
    load_anchors,
    verify_anchors,
    write_anchor,
)


def _evs(n: int, start: int = 0) -> list[ae.NewEvent]:
    return [
        ae.NewEvent(type="t.happened", module="test", payload={"n": start + i}) for i in range(n)
    ]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A SQLite store file with streams a (10 events), b (4) and c (2)."""
    path = tmp_path / "events.db"
    with ae.open_store(f"sqlite:///{path}") as store:
        store.append("a", _evs(6))
        store.append("b", _evs(4))
        store.append("a", _evs(4, 6))
        store.append("c", _evs(2))
    return path


@contextlib.contextmanager
def opened(db: Path) -> Iterator[ae.EventStore]:
    """The store at ``db``."""
    with ae.open_store(f"sqlite:///{db}") as store:
        yield store


def sql(db: Path, query: str, *args: Any) -> None:
    """Run one statement on the raw file (the attacker's access)."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(query, args)


def _witness(tmp_path: Path) -> str:
    return (tmp_path / "witness").as_uri() + "/"


def _kinds(findings: list[ae.integrity.Finding]) -> set[tuple[str, str | None]]:
    return {(f.kind, f.stream_id) for f in findings}


def test_clean_store_has_no_findings(db: Path, tmp_path: Path) -> None:
    """An anchor of an untouched store, and of one that grew since, checks clean."""
    url = _witness(tmp_path)
    with opened(db) as store:
        anchor = write_anchor(store, url)
        assert [(h.stream_id, h.version) for h in anchor.heads] == [("a", 10), ("b", 4), ("c", 2)]
        assert anchor.last_position == 16
        assert check_anchors(store, url) == []
        store.append("a", _evs(3, 10))
        store.append("d", _evs(1))
        write_anchor(store, url)
        report = verify_anchors(store, url)
        assert report.ok and report.anchors_checked == 2 and report.streams_checked == 4
        assert ae.integrity.audit(store, anchors=url).ok
    files = sorted((tmp_path / "witness").iterdir())
    assert len(files) == 2 and all(f.name.startswith("anchor-") for f in files)
    doc = json.loads(files[0].read_text())
    assert doc["format"] == "ares-events/anchor/v1"
    assert doc["streams"][0] == {
        "stream_id": "a",
        "version": 10,
        "hash": anchor.heads[0].hash.hex(),
    }
    assert not list((tmp_path / "witness").glob(".anchor-*"))  # no temporary left behind


def test_deleted_tail_with_consistent_head_is_found(db: Path, tmp_path: Path) -> None:
    """Rows deleted from a tail with the head row rewritten to match pass a chain audit,
    but the anchor reports anchor_truncated."""
    url = _witness(tmp_path)
    with opened(db) as store:
        write_anchor(store, url)
        h7 = next(store.read("a", from_version=7, to_version=7)).hash
    sql(db, "DELETE FROM ares_events WHERE stream_id = 'a' AND version > 7")
    sql(db, "UPDATE ares_streams SET version = 7, head_hash = ? WHERE stream_id = 'a'", h7)
    with opened(db) as store:
        assert ae.integrity.verify_stream(store, "a").ok  # the bare chain is fooled
        findings = check_anchors(store, url)
        assert ("anchor_truncated", "a") in _kinds(findings)
        assert {f.version for f in findings if f.stream_id == "a"} == {10}
        assert not {k for k, s in _kinds(findings) if s in ("b", "c")}
        report = ae.integrity.audit(store, anchors=url)
        assert ("anchor_truncated", "a") in _kinds(report.findings)


def _rewrite_stream(db: Path, stream: str, payload: dict[str, Any]) -> None:
    """Replace every payload of ``stream`` and recompute the whole (unkeyed) chain."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        rows = conn.execute(
            "SELECT version, event_id, type, module, metadata, recorded_at FROM ares_events "
            "WHERE stream_id = ? ORDER BY version",
            (stream,),
        ).fetchall()
        prev = ae.integrity.genesis(stream)
        for version, eid, typ, mod, meta, at in rows:
            raw = canonical_json(payload)
            header = header_bytes(
                stream, version, eid, typ, mod, meta, at, payload_digest(raw).hex(), len(raw)
            )
            h = link_hash(prev, header, None)
            conn.execute(
                "UPDATE ares_events SET payload = ?, prev_hash = ?, hash = ? "
                "WHERE stream_id = ? AND version = ?",
                (raw, prev, h, stream, version),
            )
            prev = h
        conn.execute("UPDATE ares_streams SET head_hash = ? WHERE stream_id = ?", (prev, stream))


def test_rewritten_chain_with_recomputed_hashes_is_found(db: Path, tmp_path: Path) -> None:
    """A whole stream rewritten with recomputed unkeyed hashes audits clean, but the
    anchor reports anchor_rewritten."""
    url = _witness(tmp_path)
    with opened(db) as store:
        write_anchor(store, url)
    _rewrite_stream(db, "b", {"forged": True})
    with opened(db) as store:
        assert [e.payload for e in store.read("b")] == [{"forged": True}] * 4
        assert ae.integrity.audit(store).ok  # the bare chain is fooled
        findings = check_anchors(store, url)
        assert _kinds(findings) == {("anchor_rewritten", "b")}
        assert [f.version for f in findings] == [4]


def test_missing_stream_is_found(db: Path, tmp_path: Path) -> None:
    """An anchored stream deleted entirely (events and head) is anchor_missing_stream."""
    url = _witness(tmp_path)
    with opened(db) as store:
        write_anchor(store, url)
    sql(db, "DELETE FROM ares_events WHERE stream_id = 'c'")
    sql(db, "DELETE FROM ares_streams WHERE stream_id = 'c'")
    with opened(db) as store:
        assert ("anchor_missing_stream", "c") in _kinds(check_anchors(store, url))


def test_corrupt_anchor_is_found(db: Path, tmp_path: Path) -> None:
    """An anchor edited in the witness (its digest no longer matches) or unreadable is
    anchor_corrupt, and is not trusted for anything else."""
    url = _witness(tmp_path)
    with opened(db) as store:
        write_anchor(store, url)
    (path,) = (tmp_path / "witness").iterdir()
    doc = json.loads(path.read_text())
    doc["streams"][0]["version"] = 99  # would otherwise be "truncated"
    path.write_text(json.dumps(doc))
    (tmp_path / "witness" / "anchor-zzz.json").write_text("{not json")
    with opened(db) as store:
        findings = check_anchors(store, url)
    assert [f.kind for f in findings] == ["anchor_corrupt", "anchor_corrupt"]
    assert all(f.stream_id is None for f in findings)
    assert len([a for a in load_anchors(url) if isinstance(a, ae.integrity.Finding)]) == 2


def test_bad_witness_urls_are_config_errors(db: Path) -> None:
    """Unsupported schemes, unknown parameters and credentials in an s3 URL are refused."""
    with opened(db) as store:
        for bad in (
            "ftp://host/anchors",
            "s3://bucket/p?bogus=1",
            "s3://key:secret@bucket/p",
            "file:///tmp/x?y=1",
        ):
            with pytest.raises(ConfigError) as ei:
                write_anchor(store, bad)
            assert "secret" not in str(ei.value)


@pytest.mark.s3
def test_s3_witness(db: Path, s3_endpoint: str) -> None:
    """Anchors kept in S3 (moto server): written, listed and checked; a deleted tail with
    a consistent head is found."""
    import boto3

    bucket = f"anchors-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    try:
        client.create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/audit/ares?endpoint_url={s3_endpoint}"
        with opened(db) as store:
            anchor = write_anchor(store, url)
            assert anchor.name.startswith(f"s3://{bucket}/audit/ares/anchor-")
            assert check_anchors(store, url) == []
            h5 = next(store.read("a", from_version=5, to_version=5)).hash
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
        assert len(keys) == 1 and keys[0].startswith("audit/ares/anchor-")
        sql(db, "DELETE FROM ares_events WHERE stream_id = 'a' AND version > 5")
        sql(db, "UPDATE ares_streams SET version = 5, head_hash = ? WHERE stream_id = 'a'", h5)
        with opened(db) as store:
            assert ("anchor_truncated", "a") in _kinds(check_anchors(store, url))
    finally:
        for o in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])
        client.delete_bucket(Bucket=bucket)
        client.close()


# -- CLI --------------------------------------------------------------------------------------


def test_cli_anchor_default_witness_and_check(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`anchor` writes to anchors/ next to the SQLite file; `anchor --check --json` is
    clean (exit 0) and reports findings with exit 1 after tampering."""
    monkeypatch.delenv("ARES_ANCHOR_URL", raising=False)
    store_url = f"sqlite:///{db}"
    assert main(["--store", store_url, "anchor"]) == 0
    assert "anchored 3 stream(s) at position 16" in capsys.readouterr().out
    assert len(list((db.parent / "anchors").glob("anchor-*.json"))) == 1
    assert main(["--store", store_url, "anchor", "--check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["anchors_checked"] == 1 and data["streams_checked"] == 3
    _rewrite_stream(db, "c", {"forged": 1})
    assert main(["--store", store_url, "anchor", "--check", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [(f["kind"], f["stream_id"]) for f in data["findings"]] == [("anchor_rewritten", "c")]
    assert main(["--store", store_url, "anchor", "--check"]) == 1
    assert "anchor_rewritten" in capsys.readouterr().out


def test_cli_anchor_witness_from_env_and_option(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ARES_ANCHOR_URL sets the witness, --witness overrides it; a memory store without a
    witness is a usage error (exit 2)."""
    env_dir, opt_dir = tmp_path / "env-w", tmp_path / "opt-w"
    monkeypatch.setenv("ARES_ANCHOR_URL", env_dir.as_uri())
    store_url = f"sqlite:///{db}"
    assert main(["--store", store_url, "anchor", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["anchor"]["last_position"] == 16 and out["location"].startswith(str(env_dir))
    assert main(["--store", store_url, "anchor", "--witness", str(opt_dir)]) == 0
    assert len(list(env_dir.iterdir())) == 1 and len(list(opt_dir.iterdir())) == 1
    monkeypatch.delenv("ARES_ANCHOR_URL")
    capsys.readouterr()
    assert main(["--store", "memory://anchor-cli", "init"]) == 0
    capsys.readouterr()
    assert main(["--store", "memory://anchor-cli", "anchor"]) == 2
    assert "--witness" in capsys.readouterr().err


def test_cli_audit_checks_anchors_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ares-events audit --anchors URL` reports a tail deleted after the anchor even when
    the chain itself still verifies."""
    import json as _json
    import sqlite3

    from ares_events.cli import main

    db = tmp_path / "a.db"
    witness = (tmp_path / "w").as_uri() + "/"
    with ae.open_store(f"sqlite:///{db}") as store:
        for i in range(5):
            ae.emit(store, "s", "t", "m", {"i": i})
    assert main(["--store", f"sqlite:///{db}", "anchor", "--witness", witness]) == 0
    capsys.readouterr()
    conn = sqlite3.connect(db)
    with conn:  # cut the tail and rewrite the head to match: a bare chain check passes
        conn.execute("DELETE FROM ares_events WHERE stream_id = 's' AND version > 3")
        (h,) = conn.execute(
            "SELECT hash FROM ares_events WHERE stream_id = 's' AND version = 3"
        ).fetchone()
        conn.execute(
            "UPDATE ares_streams SET version = 3, head_hash = ? WHERE stream_id = 's'", (h,)
        )
    conn.close()
    assert main(["--store", f"sqlite:///{db}", "audit", "--json"]) == 0
    capsys.readouterr()
    code = main(["--store", f"sqlite:///{db}", "audit", "--anchors", witness, "--json"])
    data = _json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["findings"]
    assert {f["kind"] for f in data["findings"]} == {"anchor_truncated"}
    assert "s" in {f["stream_id"] for f in data["findings"]}
