"""The edges a user reaches in the first week (issue 10): inspection never creates, forged
snapshots and anchors lose in keyed mode, exit codes say what happened, global options go
anywhere, blob locations are remembered."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import blake3
import psycopg
import pytest
from psycopg import sql

import ares_events as ae
from ares_events.core.recorder import backend_of
from tests.fixtures.cli_helpers import run, run_json

KEY = bytes(range(32))
KEY_HEX = KEY.hex()

# -- inspection never creates ----------------------------------------------------------------

REPORTING = [
    ["streams"],
    ["tail", "s"],
    ["verify", "s"],
    ["audit"],
    ["audit", "--deep"],
    ["recover", "s"],
    ["snapshot", "list"],
    ["snapshot", "verify"],
    ["gc-blobs", "--dry-run"],
    ["anchor", "--check"],
]


@pytest.mark.parametrize("command", REPORTING, ids=" ".join)
def test_reporting_commands_on_a_missing_sqlite_store_create_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    """A reporting command on a typo'd path exits 3 with "no store at ..." and creates
    neither the file, its folder, nor a blob folder."""
    url = f"sqlite:///{tmp_path / 'typo' / 'agentz.db'}"
    code, out, err = run(capsys, "--store", url, *command)
    assert code == 3, (out, err)
    assert "no store at" in err
    assert list(tmp_path.iterdir()) == []


def test_reporting_command_on_an_empty_sqlite_file_says_no_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing file that is not an ares-events store is "no store" (exit 3), and is
    left exactly as it was."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE unrelated (x)")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    code, _, err = run(capsys, "--store", f"sqlite:///{path}", "audit")
    assert code == 3 and "no ares-events tables" in err
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


@pytest.mark.postgres
def test_reporting_command_on_a_missing_postgres_schema_creates_nothing(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """audit on a PostgreSQL schema that does not exist exits 3 and does not create it;
    init creates it, and then audit is clean."""
    schema = postgres_url.rsplit("schema=", 1)[1]
    code, _, err = run(capsys, "--store", postgres_url, "audit")
    assert code == 3 and "does not exist" in err
    base = postgres_url.split("?", 1)[0]
    with psycopg.connect(base) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,))
        assert row.fetchone() == (0,)
    assert run(capsys, "--store", postgres_url, "init")[0] == 0
    assert run(capsys, "--store", postgres_url, "audit")[0] == 0


def test_empty_store_option_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--store "" exits 2 (it never falls back to the default store), before or after the
    subcommand."""
    monkeypatch.chdir(tmp_path)
    for args in (["--store", "", "streams"], ["streams", "--store", ""]):
        code, _, err = run(capsys, *args)
        assert code == 2 and "--store" in err
    assert list(tmp_path.iterdir()) == []


def test_library_open_store_can_refuse_to_create(tmp_path: Path) -> None:
    """open_store(url, create=False) raises StoreNotFound (a StoreUnavailable) for a
    missing file and creates nothing; the default still creates."""
    url = f"sqlite:///{tmp_path / 'x' / 'new.db'}"
    with pytest.raises(ae.StoreNotFound):
        ae.open_store(url, create=False)
    assert not (tmp_path / "x").exists()
    with ae.open_store(url) as store:
        store.append("s", [ae.NewEvent(type="t", module="m")])
    with ae.open_store(url, create=False) as store:
        assert store.stream_version("s") == 1


# -- exit codes and options ------------------------------------------------------------------


@pytest.fixture
def db(tmp_path: Path) -> str:
    """A store with one stream of three events."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with ae.open_store(url) as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"n": n}) for n in range(3)])
    return url


def test_global_options_before_or_after_the_subcommand(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--store, --json, -v and -q are accepted before and after the subcommand."""
    for args in (
        ["--store", db, "--json", "audit"],
        ["audit", "--store", db, "--json"],
        ["--json", "audit", "--store", db],
        ["-q", "audit", "--json", "--store", db],
        ["audit", "-v", "--json", "--store", db],
    ):
        code, out, _ = run(capsys, *args)
        assert code == 0, args
        assert json.loads(out)["ok"] is True
    code, out, err = run(capsys, "verify", "s", "--store", db, "-q")
    assert code == 0 and err == ""


def test_internal_error_exits_4_with_the_traceback_only_under_verbose(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (an exception that is not a library error) exits 4, not the findings code;
    one line without -v, the traceback with -v."""
    import ares_events.cli.inspect as inspect_cmds

    def boom(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(inspect_cmds, "audit", boom)
    code, _, err = run(capsys, "--store", db, "audit")
    assert code == 4 and "internal error: RuntimeError: a bug" in err
    assert "Traceback" not in err
    code, _, err = run(capsys, "--store", db, "audit", "-v")
    assert code == 4 and "Traceback" in err and "RuntimeError" in err


def test_audit_with_an_empty_anchor_location_is_a_no_anchor_finding(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """audit --anchors URL with no anchor there is a no_anchor finding (exit 1), and the
    JSON says how many anchors were checked; after `anchor`, the audit is clean."""
    witness = (tmp_path / "witness").as_uri() + "/"
    code, data = run_json(capsys, "--store", db, "audit", "--anchors", witness)
    assert code == 1
    assert data["anchors_checked"] == 0
    assert [f["kind"] for f in data["findings"]] == ["no_anchor"]
    key = str(tmp_path / "log.key")
    assert run(capsys, "keygen", "trust.test/log", "--out", key)[0] == 0
    assert run(capsys, "--store", db, "anchor", "--key", key, "--to", witness)[0] == 0
    code, data = run_json(capsys, "--store", db, "audit", "--anchors", witness)
    assert code == 0 and data["anchors_checked"] == 1
    code, data = run_json(capsys, "--store", db, "audit")
    assert code == 0 and data["anchors_checked"] is None


# -- identity from the command line ----------------------------------------------------------


def test_cli_refuses_a_keyed_store_without_or_with_another_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keyed store opened without its key, or with another, exits 2 with one line naming
    the key ids (never a key); nothing is appended."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    monkeypatch.setenv("ARES_EVENTS_CHAIN_KEY", KEY_HEX)
    assert run(capsys, "--store", url, "init")[0] == 0
    with ae.open_store(url, chain_key=KEY) as store:
        store.append("s", [ae.NewEvent(type="t", module="m")])
    other = bytes(range(1, 33)).hex()
    for env in (None, other):
        if env is None:
            monkeypatch.delenv("ARES_EVENTS_CHAIN_KEY")
        else:
            monkeypatch.setenv("ARES_EVENTS_CHAIN_KEY", env)
        code, out, err = run(capsys, "--store", url, "audit")
        assert code == 2
        assert len(err.strip().splitlines()) == 1
        assert ae.integrity.ChainKey(KEY).fingerprint() in err
        assert KEY_HEX not in out + err and other not in out + err


def test_relocated_blobs_are_recorded_by_init(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Blobs moved to another folder: opening with --blobs NEW is refused until
    `init --relocate-blobs` records it; then the store reads its payloads from there
    without --blobs."""
    url = f"sqlite:///{tmp_path / 'b.db'}"
    old, new = tmp_path / "old-blobs", tmp_path / "new-blobs"
    big = {"blob": "x" * 5000}
    with ae.open_store(url, blobs=old.as_uri(), spill_threshold=100) as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload=big)])
    old.rename(new)
    code, _, err = run(capsys, "--store", url, "--blobs", new.as_uri(), "audit", "--deep")
    assert code == 2 and "--relocate-blobs" in err
    code, data = run_json(
        capsys, "--store", url, "--blobs", new.as_uri(), "init", "--relocate-blobs"
    )
    assert code == 0 and data["identity"]["blobs"]["location"] == new.resolve().as_uri()
    code, data = run_json(capsys, "--store", url, "audit", "--deep")
    assert code == 0 and data["blobs_checked"] == 1
    with ae.open_store(url) as store:
        assert next(iter(store.read("s"))).payload == big


def test_the_default_blob_folder_named_explicitly_is_the_recorded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SQLite store recorded with its default blob folder ``<file>.blobs`` opens with
    that folder named (blobs=, --blobs, ARES_BLOBS_URL; a spilling append lands there and
    the identity still says "default"); another folder is still refused."""
    path = tmp_path / "x.db"
    url, big = f"sqlite:///{path}", {"blob": "x" * 5000}
    folder = Path(f"{path}.blobs")
    with ae.open_store(url, spill_threshold=100) as store:
        store.append("s", [ae.NewEvent(type="t", module="m", payload=big)])
    for named in (folder.as_uri(), (tmp_path / "d" / ".." / "x.db.blobs").as_uri()):
        with ae.open_store(url, blobs=named, spill_threshold=100) as store:
            store.append("s", [ae.NewEvent(type="t", module="m", payload=big | {"n": named})])
            assert {e.payload["blob"] for e in store.read("s")} == {big["blob"]}
            assert store.identity is not None and store.identity.blobs == "default"
    assert len([p for p in folder.rglob("*") if p.is_file() and len(p.name) == 64]) == 3
    code, _, err = run(capsys, "--store", url, "--blobs", folder.as_uri(), "streams")
    assert code == 0, err
    monkeypatch.setenv("ARES_BLOBS_URL", folder.as_uri())
    code, data = run_json(capsys, "--store", url, "gc-blobs", "--dry-run")
    assert code == 0, data
    code, data = run_json(capsys, "--store", url, "audit", "--deep")
    assert code == 0 and data["blobs_checked"] == 3, data
    other = (tmp_path / "other").as_uri()
    monkeypatch.setenv("ARES_BLOBS_URL", other)
    code, _, err = run(capsys, "--store", url, "gc-blobs", "--dry-run")
    assert code == 2 and "the folder next to the SQLite file" in err and other in err, err
    with pytest.raises(ae.ConfigError, match="--relocate-blobs"):
        ae.open_store(url, blobs=other)


# -- keyed mode: forged snapshots and anchors lose -------------------------------------------


def _forge_snapshot_state(path: Path, stream: str, projection: str, state: Any) -> None:
    """What an attacker with write access but no key does: new state, digest recomputed."""
    state_json = json.dumps(state, sort_keys=True, separators=(",", ":")).encode()
    conn = sqlite3.connect(path)
    conn.execute(
        "UPDATE ares_snapshots SET state = ?, state_digest = ? "
        "WHERE stream_id = ? AND projection = ?",
        (state_json, blake3.blake3(state_json).digest(), stream, projection),
    )
    conn.commit()
    conn.close()


@pytest.mark.parametrize("forgery", ["state", "at_version"])
def test_forged_snapshot_loses_in_keyed_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], forgery: str
) -> None:
    """With a chain key, a snapshot whose state was rewritten (digest recomputed) or
    whose at_version/at_hash were moved to an earlier event is ignored by recover()
    (the stream is replayed, the report says why), and audit --deep and snapshot verify
    report it."""
    path = tmp_path / "keyed.db"
    url = f"sqlite:///{path}"
    proj = ae.projections.RecoveryStateProjection()
    with ae.open_store(url, chain_key=KEY) as store:
        for n in range(6):
            ae.emit(store, "agent", "state.patched", "runtime", {"key": f"k{n}", "value": n})
        ae.snapshot(store, "agent", proj)
        honest = ae.recover(store, "agent", proj, snapshots=store.snapshots)
        assert honest.source == "snapshot"
        third = next(iter(store.read("agent", from_version=3, limit=1)))
    if forgery == "state":
        forged = json.loads(json.dumps(honest.state))
        forged["patched"] = {"owned": True}
        _forge_snapshot_state(path, "agent", proj.name, forged)
    else:
        conn = sqlite3.connect(path)
        conn.execute(
            "UPDATE ares_snapshots SET at_version = 3, at_hash = ? WHERE stream_id = 'agent'",
            (third.hash,),
        )
        conn.commit()
        conn.close()
    with ae.open_store(url, chain_key=KEY) as store:
        rec = ae.recover(store, "agent", proj, snapshots=store.snapshots)
        assert rec.source == "events" and rec.ok
        assert rec.snapshot_ignored is not None and "seal" in rec.snapshot_ignored
        assert rec.state == honest.state
    env = {"ARES_EVENTS_CHAIN_KEY": KEY_HEX}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        code, data = run_json(capsys, "--store", url, "audit", "--deep")
        assert code == 1
        assert [f["kind"] for f in data["findings"]] == ["snapshot_mismatch"]
        code, _, _ = run(capsys, "--store", url, "snapshot", "verify")
        assert code == 1


@pytest.mark.parametrize("seal", ["kept", "removed"])
def test_unkeyed_seal_still_catches_a_moved_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seal: str
) -> None:
    """Without a key the seal is a plain digest: a snapshot moved to an earlier version
    (its tail would be folded twice), with its seal kept or set to NULL, is still caught by
    recovery, `snapshot verify` and `audit --deep`; a full forgery is not (documented)."""
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    proj = ae.projections.RecoveryStateProjection()
    with ae.open_store(url) as store:
        for n in range(4):
            ae.emit(store, "agent", "state.patched", "runtime", {"key": f"k{n}", "value": n})
        ae.snapshot(store, "agent", proj)
        second = next(iter(store.read("agent", from_version=2, limit=1)))
    conn = sqlite3.connect(tmp_path / "plain.db")
    conn.execute("UPDATE ares_snapshots SET at_version = 2, at_hash = ?", (second.hash,))
    if seal == "removed":
        conn.execute("UPDATE ares_snapshots SET seal = NULL")
    conn.commit()
    conn.close()
    with ae.open_store(url) as store:
        rec = ae.recover(store, "agent", proj, snapshots=store.snapshots)
        assert rec.source == "events" and "seal" in (rec.snapshot_ignored or "")
        assert rec.state == ae.recover(store, "agent", proj).state  # no snapshot
    code, data = run_json(capsys, "--store", url, "audit", "--deep")
    assert code == 1 and [f["kind"] for f in data["findings"]] == ["snapshot_mismatch"]
    assert run(capsys, "--store", url, "snapshot", "verify")[0] == 1


@pytest.mark.postgres
def test_postgres_keyed_snapshot_forgery_is_ignored(postgres_url: str) -> None:
    """The same seal protects PostgreSQL snapshots."""
    proj = ae.projections.RecoveryStateProjection()
    with ae.open_store(postgres_url, chain_key=KEY) as store:
        for n in range(4):
            ae.emit(store, "agent", "state.patched", "runtime", {"key": f"k{n}", "value": n})
        ae.snapshot(store, "agent", proj)
        schema = backend_of(store.recorder).schema
        new = b'{"owned":true}'
        with backend_of(store.recorder).connection() as conn:
            conn.execute(
                sql.SQL("UPDATE {}.ares_snapshots SET state = %s, state_digest = %s").format(
                    sql.Identifier(schema)
                ),
                (new, blake3.blake3(new).digest()),
            )
        rec = ae.recover(store, "agent", proj, snapshots=store.snapshots)
        assert rec.source == "events" and "seal" in (rec.snapshot_ignored or "")


# -- verifying a live stream -----------------------------------------------------------------


def test_verifying_a_stream_while_it_is_written_reports_nothing(tmp_path: Path) -> None:
    """verify_stream and audit on a stream another thread keeps appending to (pages of
    one event, so the head moves between pages) never report truncated or head_mismatch."""
    import threading

    url = f"sqlite:///{tmp_path / 'live.db'}?page_size=1"
    stop = threading.Event()

    with ae.open_store(url) as writer, ae.open_store(url) as reader:
        writer.append("s", [ae.NewEvent(type="t", module="m") for _ in range(20)])

        def append() -> None:
            while not stop.is_set():
                writer.append("s", [ae.NewEvent(type="t", module="m")])

        t = threading.Thread(target=append)
        t.start()
        try:
            for _ in range(30):
                rep = ae.integrity.verify_stream(reader, "s")
                assert rep.ok, rep.findings
                audit = ae.integrity.audit(reader)
                assert audit.ok, audit.findings
        finally:
            stop.set()
            t.join()
