"""The witness from the command line, as docs/cli.md says: `witness list` only looks (it
never writes the file --state names, whatever that file is), add-log and cosign never
turn another database into a witness's, a request that does not parse is "REFUSED 400"
(exit 1), and no error prints a piece of a private key given in a note's place."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import Checkpoint, sign_checkpoint
from ares_events.integrity.notes import ALG_COSIGNATURE_V1, SigningKey


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the CLI; return (exit code, stdout, stderr)."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _beside(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


@pytest.fixture
def w(tmp_path: Path, clean_env: None) -> dict[str, str]:
    """A log key, a witness key file, a witness state trusting the log (by the CLI), and
    a signed checkpoint of the empty tree."""
    lk = SigningKey.generate("example.com/log")
    wk = SigningKey.generate("witness.example/w1", alg=ALG_COSIGNATURE_V1)
    (tmp_path / "w.key").write_text(wk.private_text() + "\n")
    (tmp_path / "log.vkey").write_text(lk.verifier.text + "\n")
    state = tmp_path / "w.db"
    assert main(["witness", "add-log", str(tmp_path / "log.vkey"), "--state", str(state)]) == 0
    return {
        "state": str(state),
        "key": str(tmp_path / "w.key"),
        "log_key": lk.private_text(),
        "vkey": lk.verifier.text,
        "note": sign_checkpoint(Checkpoint(lk.name, 0, merkle.EMPTY_ROOT), lk),
    }


def _store(tmp_path: Path) -> Path:
    db = tmp_path / "store" / "agents.db"
    db.parent.mkdir()
    with ae.open_store(f"sqlite:///{db}") as store:
        ae.emit(store, "agent-1", "note.added", "runtime", {"step": 1})
    return db


# -- witness list only looks (F3) ----------------------------------------------------------


def test_witness_list_on_an_event_store_refuses_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    """It created the witness tables inside the store and switched the file to WAL."""
    db = _store(tmp_path)
    before, files = _digest(db), _beside(db)
    code, _out, err = run(capsys, "witness", "list", "--state", str(db), "--json")
    assert code == 2 and "not a witness state" in err, err
    assert _digest(db) == before and _beside(db) == files
    with contextlib.closing(sqlite3.connect(db)) as conn:  # 3.13 warns of an unclosed one
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert not {t for t in tables if t.startswith("witness_")}


def test_witness_list_on_an_empty_file_refuses_and_leaves_it_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    """A 0-byte file became a 20 KiB witness database."""
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    code, _out, err = run(capsys, "witness", "list", "--state", str(empty))
    assert code == 2 and "not a witness state" in err, err
    assert empty.read_bytes() == b"" and _beside(empty) == []


def test_witness_list_of_a_missing_state_is_a_usage_error_creating_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    """A missing file is an error, not an empty listing: a mistyped --state must not look
    like a witness that trusts nothing."""
    code, _out, err = run(capsys, "witness", "list", "--state", str(tmp_path / "nope.db"))
    assert code == 2 and "no witness state" in err
    assert list(tmp_path.iterdir()) == []


def test_witness_list_of_a_witness_state_changes_nothing(
    tmp_path: Path, w: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The real state file lists, byte for byte unchanged, with nothing left beside it."""
    state = Path(w["state"])
    before, files = _digest(state), _beside(state)
    code, out, _err = run(capsys, "witness", "list", "--state", str(state), "--json")
    assert code == 0 and json.loads(out)["logs"][0]["origin"] == "example.com/log"
    assert _digest(state) == before and _beside(state) == files


@pytest.mark.parametrize("command", ["add-log", "cosign"])
def test_add_log_and_cosign_never_write_into_another_database(
    tmp_path: Path, w: dict[str, str], capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """docs/cli.md: they write "the witness's state file (never a store)"."""
    db = _store(tmp_path)
    before = _digest(db)
    req = tmp_path / "req.txt"
    req.write_text("old 0\n\n" + w["note"])
    args = {
        "add-log": ["witness", "add-log", w["vkey"]],
        "cosign": ["witness", "cosign", str(req), "--key", w["key"]],
    }[command]
    code, _out, err = run(capsys, *args, "--state", str(db))
    assert code == 2 and "not a witness state" in err, err
    assert _digest(db) == before


# -- requests that do not parse are 400 (F4, F5, F6) ---------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        "old \u00b2",  # an internal error (exit 4)
        "old \uff10",  # was cosigned as size 0
        "old x",  # a usage error (exit 2)
        "old 01",
        "new 0",
    ],
)
def test_a_malformed_request_is_refused_400(
    tmp_path: Path, w: dict[str, str], capsys: pytest.CaptureFixture[str], head: str
) -> None:
    """docs/cli.md: a refusal exits 1 with its tlog-witness status, 400 malformed."""
    req = tmp_path / "req.txt"
    req.write_text(f"{head}\n\n" + w["note"])
    cosign = ["witness", "cosign", str(req), "--state", w["state"], "--key", w["key"]]
    code, out, err = run(capsys, *cosign, "--json")
    assert code == 1 and json.loads(out)["status"] == 400, (out, err)
    code, out, err = run(capsys, *cosign)
    assert code == 1 and "REFUSED" in out and "400" in out and "internal" not in err


@pytest.mark.parametrize(
    "doc",
    [
        {"old_size": "0", "consistency": []},
        {"old_size": -1, "consistency": []},
        {"old_size": 0, "consistency": ["nope"]},
        {"old_size": 0},
        {"old_size": 0, "consistency": [], "checkpoint": 5},
    ],
)
def test_a_malformed_json_request_is_refused_400(
    tmp_path: Path, w: dict[str, str], capsys: pytest.CaptureFixture[str], doc: dict[str, object]
) -> None:
    """The JSON form of a request is a request too: a bad field is a 400, not exit 2."""
    req = tmp_path / "req.json"
    req.write_text(json.dumps({"checkpoint": w["note"], **doc}))
    code, out, _err = run(
        capsys, "witness", "cosign", str(req), "--state", w["state"], "--key", w["key"], "--json"
    )
    assert code == 1 and json.loads(out)["status"] == 400, out


def test_an_unreadable_request_is_still_a_usage_error(
    tmp_path: Path, w: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """No request was made: a missing file is exit 2, as for any file argument."""
    code, _out, err = run(
        capsys,
        "witness",
        "cosign",
        str(tmp_path / "nope"),
        "--state",
        w["state"],
        "--key",
        w["key"],
    )
    assert code == 2 and "cannot read" in err


def test_add_log_names_its_own_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    """It said "--vkey is neither a verifier key nor a readable file": add-log has no
    --vkey option, its VKEY is an argument."""
    bad = tmp_path / "bin.vkey"
    bad.write_bytes(bytes(range(256)))
    code, _out, err = run(capsys, "witness", "add-log", str(bad), "--state", str(tmp_path / "w.db"))
    assert code == 2 and "--vkey" not in err and "VKEY" in err, err


# -- no piece of a private key in any output (F2) ------------------------------------------


def test_a_key_given_as_a_note_is_never_printed(
    tmp_path: Path, w: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify-proof --old notes.txt` where notes.txt ends in the log's key file: the error
    and the --json reason printed the first 60 characters of the key's line."""
    db = tmp_path / "ev.db"
    lk = SigningKey.from_text(w["log_key"])
    with ae.open_store(f"sqlite:///{db}") as store:
        for i in range(4):
            ae.emit(store, "agent-1", "note.added", "runtime", {"step": i})
        doc = ae.MerkleLog(store).prove_consistency(2, key=lk)
    (tmp_path / "growth.json").write_text(json.dumps(doc))
    notes = tmp_path / "notes.txt"
    notes.write_text("keys\n\n" + w["log_key"] + "\n")
    secret = w["log_key"].rsplit("+", 1)[1]
    verify = ["verify-proof", str(tmp_path / "growth.json"), "--old", str(notes)]
    for extra in ([], ["--json"]):
        code, out, err = run(capsys, *verify, "--vkey", w["vkey"], *extra)
        assert code in (1, 2)
        shown = out + err
        assert not [secret[i : i + 6] for i in range(len(secret) - 5) if secret[i : i + 6] in shown]
        assert "PRIVATE+KEY+" not in shown
