"""Anchors: the log's signed checkpoints kept at a location outside the store.

Tampering is done on a real SQLite file with plain SQL, the way an attacker with write
access to the database would do it, and always so that a bare chain verification passes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.chain import canonical_json, header_bytes, link_hash, payload_digest
from ares_events.cli import main
from ares_events.errors import ConfigError
from ares_events.integrity.anchors import check_anchors, verify_anchors, write_checkpoint_note
from ares_events.integrity.notes import SigningKey
from ares_events.projections.merkle import MerkleLog

KEY = SigningKey.generate("anchors.test/log")


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


def _location(tmp_path: Path) -> str:
    return (tmp_path / "anchors").as_uri() + "/"


def anchor(store: ae.EventStore, url: str) -> str:
    """Sign a checkpoint of the store's log and keep it at ``url`` (what `anchor` does)."""
    signed = MerkleLog(store).sign(KEY)
    return write_checkpoint_note(url, signed.text, signed.checkpoint.size)


def _kinds(findings: list[ae.integrity.Finding]) -> list[str]:
    return sorted(f.kind for f in findings)


def test_clean_store_has_no_findings(db: Path, tmp_path: Path) -> None:
    """A checkpoint of an untouched store, and of one that grew since, checks clean, with
    the given key and with the key the store recorded."""
    url = _location(tmp_path)
    with opened(db) as store:
        where = anchor(store, url)
        assert Path(where).name.startswith("checkpoint-00000000000000000016-")
        assert check_anchors(store, url, keys=[KEY.verifier]) == []
        store.append("a", _evs(3, 10))
        store.append("d", _evs(1))
        anchor(store, url)
        report = verify_anchors(store, url)
        assert report.ok and report.anchors_checked == 2 and report.keys_from == "store"
        assert verify_anchors(store, url, keys=[KEY.verifier]).keys_from == "given"
        assert ae.integrity.audit(store, anchors=url).ok
    files = sorted((tmp_path / "anchors").iterdir())
    assert len(files) == 2 and all(f.suffix == ".note" for f in files)
    assert files[0].read_text().startswith("anchors.test/log\n16\n")
    assert not list((tmp_path / "anchors").glob(".checkpoint-*"))  # no temporary left


def test_deleted_tail_with_consistent_head_is_found(db: Path, tmp_path: Path) -> None:
    """Rows deleted from a tail with the head row rewritten to match pass a chain audit,
    but the anchor reports anchor_truncated."""
    url = _location(tmp_path)
    with opened(db) as store:
        anchor(store, url)
        h7 = next(store.read("a", from_version=7, to_version=7)).hash
    sql(db, "DELETE FROM ares_events WHERE stream_id = 'a' AND version > 7")
    sql(db, "UPDATE ares_streams SET version = 7, head_hash = ? WHERE stream_id = 'a'", h7)
    with opened(db) as store:
        assert ae.integrity.verify_stream(store, "a").ok  # the bare chain is fooled
        findings = check_anchors(store, url, keys=[KEY.verifier])
        assert _kinds(findings) == ["anchor_truncated"]
        assert "16 events but the log holds 13" in findings[0].detail
        report = ae.integrity.audit(store, anchors=url, anchor_keys=[KEY.verifier])
        assert "anchor_truncated" in _kinds(report.findings)


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
    url = _location(tmp_path)
    with opened(db) as store:
        anchor(store, url)
    _rewrite_stream(db, "b", {"forged": True})
    with opened(db) as store:
        assert [e.payload for e in store.read("b")] == [{"forged": True}] * 4
        assert ae.integrity.audit(store).ok  # the bare chain is fooled
        findings = check_anchors(store, url, keys=[KEY.verifier])
        assert _kinds(findings) == ["anchor_rewritten"]


def test_a_deleted_stream_is_found(db: Path, tmp_path: Path) -> None:
    """An anchored stream deleted entirely (events and head) leaves fewer events than
    the checkpoint signed."""
    url = _location(tmp_path)
    with opened(db) as store:
        anchor(store, url)
    sql(db, "DELETE FROM ares_events WHERE stream_id = 'c'")
    sql(db, "DELETE FROM ares_streams WHERE stream_id = 'c'")
    with opened(db) as store:
        assert _kinds(check_anchors(store, url, keys=[KEY.verifier])) == ["anchor_truncated"]


def test_corrupt_and_unsigned_anchors_are_found(db: Path, tmp_path: Path) -> None:
    """A checkpoint edited at the location (its signature no longer verifies), one signed
    by an untrusted key, or unreadable is anchor_corrupt; with no trusted key at all it is
    anchor_unverified; a location with no checkpoint is no_anchor, never clean."""
    url = _location(tmp_path)
    with opened(db) as store:
        assert _kinds(check_anchors(store, url, keys=[KEY.verifier])) == ["no_anchor"]
        where = Path(anchor(store, url))
        text = where.read_text()
        where.write_text(text.replace("\n16\n", "\n17\n", 1))
        (where.parent / "checkpoint-zzz.note").write_text("not a note")
        other = SigningKey.generate("anchors.test/log")
        signed = MerkleLog(store).sign(other)
        write_checkpoint_note(url, signed.text, signed.checkpoint.size)
        findings = check_anchors(store, url, keys=[KEY.verifier])
        assert _kinds(findings) == ["anchor_corrupt"] * 3
        unverified = check_anchors(store, url, keys=[])
        assert set(_kinds(unverified)) == {"anchor_unverified"}


def test_a_folder_or_fifo_among_the_anchors_is_a_finding(db: Path, tmp_path: Path) -> None:
    """A folder or a FIFO named as a checkpoint at the location is an anchor_corrupt
    finding of its own: the good anchor is still checked, and nothing blocks on the FIFO
    (a read of it would wait forever for a writer)."""
    url = _location(tmp_path)
    with opened(db) as store:
        folder = Path(anchor(store, url)).parent
        (folder / "checkpoint-0-dir.note").mkdir()
        fifo = folder / "checkpoint-0-fifo.note"
        os.mkfifo(fifo)
        got: list[list[ae.integrity.Finding]] = []
        t = threading.Thread(
            target=lambda: got.append(check_anchors(store, url, keys=[KEY.verifier])), daemon=True
        )
        t.start()
        t.join(30)
        if t.is_alive():
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # let it go, then fail
            pytest.fail("check_anchors blocked on a FIFO")
        assert _kinds(got[0]) == ["anchor_corrupt", "anchor_corrupt"]
        assert all("not a regular file" in f.detail for f in got[0])


def test_bad_location_urls_are_config_errors(db: Path) -> None:
    """Unsupported schemes, unknown parameters and credentials in an s3 URL are refused,
    and the error never holds the secret."""
    for bad in (
        "ftp://host/anchors",
        "s3://bucket/p?bogus=1",
        "s3://key:secret@bucket/p",
        "file:///tmp/x?y=1",
    ):
        with pytest.raises(ConfigError) as ei:
            write_checkpoint_note(bad, "note", 1)
        assert "secret" not in str(ei.value)


@pytest.mark.s3
def test_s3_location(db: Path, s3_endpoint: str) -> None:
    """Checkpoints kept in S3 (moto server): written, listed and checked; a deleted tail
    with a consistent head is found."""
    import boto3

    bucket = f"anchors-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    try:
        client.create_bucket(Bucket=bucket)
        url = f"s3://{bucket}/audit/ares?endpoint_url={s3_endpoint}"
        with opened(db) as store:
            where = anchor(store, url)
            assert where.startswith(f"s3://{bucket}/audit/ares/checkpoint-")
            assert check_anchors(store, url, keys=[KEY.verifier]) == []
            h5 = next(store.read("a", from_version=5, to_version=5)).hash
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
        assert len(keys) == 1 and keys[0].startswith("audit/ares/checkpoint-")
        sql(db, "DELETE FROM ares_events WHERE stream_id = 'a' AND version > 5")
        sql(db, "UPDATE ares_streams SET version = 5, head_hash = ? WHERE stream_id = 'a'", h5)
        with opened(db) as store:
            assert _kinds(check_anchors(store, url, keys=[KEY.verifier])) == ["anchor_truncated"]
    finally:
        for o in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])
        client.delete_bucket(Bucket=bucket)
        client.close()


# -- CLI --------------------------------------------------------------------------------------


@pytest.fixture
def key_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A log signing key made with `keygen`."""
    path = tmp_path / "log.key"
    assert main(["keygen", "anchors.test/log", "--out", str(path)]) == 0
    capsys.readouterr()
    return str(path)


def test_cli_anchor_default_location_and_check(
    db: Path,
    key_file: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`anchor --key` writes to anchors/ next to the SQLite file; `anchor --check --json`
    is clean (exit 0) and reports findings with exit 1 after tampering; without a key,
    `anchor` is a usage error that says how to make one (exit 2)."""
    monkeypatch.delenv("ARES_ANCHOR_URL", raising=False)
    monkeypatch.delenv("ARES_LOG_KEY_FILE", raising=False)
    store_url = f"sqlite:///{db}"
    assert main(["--store", store_url, "anchor"]) == 2
    assert "keygen" in capsys.readouterr().err
    assert not (db.parent / "anchors").exists()
    assert main(["--store", store_url, "anchor", "--key", key_file]) == 0
    assert "at size 16" in capsys.readouterr().out
    assert len(list((db.parent / "anchors").glob("checkpoint-*.note"))) == 1
    assert main(["--store", store_url, "anchor", "--check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is True and data["anchors_checked"] == 1
    _rewrite_stream(db, "c", {"forged": 1})
    assert main(["--store", store_url, "anchor", "--check", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [f["kind"] for f in data["findings"]] == ["anchor_rewritten"]
    assert main(["--store", store_url, "anchor", "--check"]) == 1
    assert "anchor_rewritten" in capsys.readouterr().out


def test_cli_anchor_location_from_env_and_option(
    db: Path,
    tmp_path: Path,
    key_file: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ARES_ANCHOR_URL sets the location, --to overrides it (--witness, its first name,
    still works); a memory store without a location is a usage error (exit 2)."""
    env_dir, opt_dir, old_dir = tmp_path / "env-w", tmp_path / "opt-w", tmp_path / "old-w"
    monkeypatch.setenv("ARES_ANCHOR_URL", env_dir.as_uri())
    store_url = f"sqlite:///{db}"
    assert main(["--store", store_url, "anchor", "--key", key_file, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tree_size"] == 16 and out["location"].startswith(str(env_dir))
    assert main(["--store", store_url, "anchor", "--key", key_file, "--to", str(opt_dir)]) == 0
    assert main(["--store", store_url, "anchor", "--key", key_file, "--witness", str(old_dir)]) == 0
    assert [len(list(d.iterdir())) for d in (env_dir, opt_dir, old_dir)] == [1, 1, 1]
    monkeypatch.delenv("ARES_ANCHOR_URL")
    capsys.readouterr()
    assert main(["--store", "memory://anchor-cli", "init"]) == 0
    capsys.readouterr()
    assert main(["--store", "memory://anchor-cli", "anchor", "--key", key_file]) == 2
    assert "--to URL" in capsys.readouterr().err


def test_cli_audit_checks_anchors_when_asked(
    tmp_path: Path, key_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ares-events audit --anchors URL` reports a tail deleted after the anchor even when
    the chain itself still verifies."""
    db = tmp_path / "a.db"
    location = (tmp_path / "w").as_uri() + "/"
    with ae.open_store(f"sqlite:///{db}") as store:
        for i in range(5):
            ae.emit(store, "s", "t", "m", {"i": i})
    args = ["--store", f"sqlite:///{db}", "anchor", "--key", key_file, "--to", location]
    assert main(args) == 0
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
    code = main(["--store", f"sqlite:///{db}", "audit", "--anchors", location, "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert {f["kind"] for f in data["findings"]} == {"anchor_truncated"}


@pytest.mark.parametrize("recorded", ["null", "5", '{"k": 1}', "true"])
def test_recorded_keys_that_are_no_list_check_as_no_keys(
    db: Path, tmp_path: Path, recorded: str
) -> None:
    """A store whose recorded log keys were overwritten with JSON that is no list checks as
    one with no recorded key (the anchor's signature is unverified), never a crash."""
    url = _location(tmp_path)
    with opened(db) as store:
        anchor(store, url)
    sql(db, "UPDATE ares_meta SET value = ? WHERE key = 'log_keys'", recorded)
    with opened(db) as store:
        report = verify_anchors(store, url)
        assert not report.ok and report.keys_from == "store"
        assert verify_anchors(store, url, keys=[KEY.verifier]).ok
    assert main(["--store", f"sqlite:///{db}", "anchor", "--check", "--to", url]) == 1
