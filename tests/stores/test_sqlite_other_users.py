"""SQLite stores read by a user who may not write them (an auditor with read access only, a
read-only folder or mount, the owner of a file made read-only): a reading command leaves
no file beside the store, the owner writes on afterwards, and what it reports is right.

Real files and real users: the suite runs as root, and each user is a child process
under ``setpriv`` (util-linux), the owner ``OWNER`` and the reader ``READER`` (nobody).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae

# Each test starts Pythons as other users (child processes): the whole suite's, not the
# quick tier's.
pytestmark = pytest.mark.slow

OWNER = 4242
READER = 65534
REPO = Path(ae.__file__).resolve().parents[1]
SETPRIV = shutil.which("setpriv") or ""

# The owner's appends: N events to stream agent-1.
APPEND = """
import sys, ares_events as ae
with ae.open_store(sys.argv[1]) as s:
    for i in range(int(sys.argv[2])):
        ae.emit(s, "agent-1", "note.added", "runtime", {"i": i})
"""
# The owner keeps the store open with an event in its WAL, appends again on a line of
# stdin, then closes.
HOLD = """
import sys, ares_events as ae
s = ae.open_store(sys.argv[1])
ae.emit(s, "agent-2", "note.added", "runtime", {})
print("ready", flush=True)
sys.stdin.readline()
ae.emit(s, "agent-2", "note.added", "runtime", {})
s.close()
print("done", flush=True)
"""
# A reader that reads, waits for a line of stdin, and reads again.
READ_TWICE = """
import sys, ares_events as ae
from ares_events.errors import StoreUnavailable
with ae.open_store(sys.argv[1], create=False, read_only=True) as s:
    print(len(list(s.read_all())), flush=True)
    sys.stdin.readline()
    try:
        print(len(list(s.read_all())), flush=True)
    except StoreUnavailable as exc:
        print("unavailable:", exc, flush=True)
"""


def _runs_as_others(python: str) -> bool:
    probe = [SETPRIV, f"--reuid={READER}", f"--regid={READER}", "--clear-groups", python]
    done = subprocess.run([*probe, "-c", "import sqlite3"], capture_output=True, check=False)
    return done.returncode == 0


@functools.cache
def _python() -> str:
    """An interpreter other users can start: this one, else the repository's 3.11 venv (a
    Python whose shared library lies where only root may read, as pyenv's 3.13 under a
    0700 /root, loads for no one else; the children only need the package, any version)."""
    for python in (sys.executable, str(REPO / ".venv" / "bin" / "python")):
        if Path(python).exists() and _runs_as_others(python):
            return python
    pytest.fail(f"no Python here runs as another user (tried {sys.executable})", pytrace=False)


def _command(uid: int, *args: str) -> list[str]:
    return [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", _python(), *args]


def _env(home: Path) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("ARES_")}
    return {**keep, "HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONDONTWRITEBYTECODE": "1"}


def _as(uid: int, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python ARGS`` as ``uid``."""
    command = _command(uid, *args)
    return subprocess.run(
        command, env=_env(home), capture_output=True, text=True, timeout=120, check=False
    )


def _cli(uid: int, url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ares-events --store URL ARGS`` as ``uid``."""
    return _as(uid, home, "-m", "ares_events", "-q", "--store", url, *args)


@contextlib.contextmanager
def _running(uid: int, script: str, url: str, home: Path) -> Iterator[subprocess.Popen[str]]:
    """``python -c SCRIPT URL`` as ``uid``, talking on stdin and stdout; killed at exit."""
    with subprocess.Popen(
        _command(uid, "-c", script, url),
        env=_env(home),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            yield proc
        finally:
            proc.kill()


def _say(proc: subprocess.Popen[str], line: str) -> str:
    """Write ``line`` to the process and read its answer's line."""
    assert proc.stdin is not None and proc.stdout is not None
    if line:
        proc.stdin.write(f"{line}\n")
        proc.stdin.flush()
    return proc.stdout.readline()


def _append(url: str, home: Path, n: int = 3) -> None:
    """The owner appends ``n`` events, which must work."""
    done = _as(OWNER, home, "-c", APPEND, url, str(n))
    assert done.returncode == 0, done.stderr


def _beside(folder: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every entry of the store's folder: its owner and, for a file, its bytes."""
    return {
        p.name: (p.lstat().st_uid, p.read_bytes() if p.is_file() else None)
        for p in folder.iterdir()
    }


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user can reach (pytest's own tmp_path is root's alone)."""
    if not SETPRIV:
        msg = "setpriv not found: install util-linux (apt-get install util-linux)"
        pytest.fail(msg, pytrace=False)
    if os.geteuid() != 0:
        pytest.fail("these tests run as root, to become other users with setpriv", pytrace=False)
    top = Path(tempfile.mkdtemp(prefix="ares-users-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top)


def _store(shared: Path, folder_mode: int, n: int = 3) -> tuple[Path, str]:
    """A store of the owner's with ``n`` events in a folder of the owner's with
    ``folder_mode`` (0o1777: anyone may create files there; 0o755: only the owner)."""
    folder = shared / "store"
    folder.mkdir()
    os.chown(folder, OWNER, OWNER)
    folder.chmod(folder_mode)
    url = f"sqlite:///{folder / 'events.db'}"
    _append(url, shared, n)
    return folder, url


def _audit(uid: int, url: str, home: Path) -> tuple[int, dict[str, Any]]:
    done = _cli(uid, url, home, "audit", "--json")
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


READING = [["audit"], ["streams"], ["verify", "agent-1"], ["tail", "agent-1"]]


@pytest.mark.parametrize("args", READING, ids=[a[0] for a in READING])
def test_a_reader_who_may_not_write_leaves_no_file(shared: Path, args: list[str]) -> None:
    """In a folder anyone may write: nothing appears beside the store, the owner appends."""
    folder, url = _store(shared, 0o1777)
    before = _beside(folder)
    done = _cli(READER, url, shared, *args)
    assert done.returncode == 0, done.stderr
    assert _beside(folder) == before
    _append(url, shared)
    assert _audit(OWNER, url, shared)[1]["events_checked"] == 6


def test_the_owner_reads_a_file_made_read_only(shared: Path) -> None:
    """Its owner audits a chmod 444 store: no 0444 -wal/-shm stay to lock it out later."""
    folder, url = _store(shared, 0o755)
    (folder / "events.db").chmod(0o444)
    before = _beside(folder)
    assert _audit(OWNER, url, shared)[0] == 0
    assert _beside(folder) == before
    (folder / "events.db").chmod(0o644)
    _append(url, shared)


def test_a_read_only_folder_is_audited_and_tampering_found(shared: Path) -> None:
    """A reader who may not write the folder audits and verifies (once it was "not a
    SQLite database"); an edited payload is a finding there too, and nothing is written."""
    folder, url = _store(shared, 0o755)
    before = _beside(folder)
    code, report = _audit(READER, url, shared)
    assert (code, report["events_checked"], report["findings"]) == (0, 3, [])
    where = "WHERE stream_id = 'agent-1' AND version = 2"
    with contextlib.closing(sqlite3.connect(folder / "events.db")) as conn, conn:  # as root
        payload = bytearray(conn.execute(f"SELECT payload FROM ares_events {where}").fetchone()[0])
        payload[3] ^= 0x01
        conn.execute(f"UPDATE ares_events SET payload = ? {where}", (bytes(payload),))
    tampered = _beside(folder)
    assert tampered != before and set(tampered) == set(before)
    code, report = _audit(READER, url, shared)
    assert code == 1
    assert {(f["kind"], f["stream_id"], f["version"]) for f in report["findings"]} == {
        ("hash_mismatch", "agent-1", 2)
    }
    assert _cli(READER, url, shared, "verify", "agent-1").returncode == 1
    assert _beside(folder) == tampered


def test_a_file_the_reader_may_not_read_says_permission_denied(shared: Path) -> None:
    """Exit 3 naming the permission, not "not a SQLite database"."""
    folder, url = _store(shared, 0o755)
    (folder / "events.db").chmod(0o600)
    done = _cli(READER, url, shared, "audit")
    assert done.returncode == 3
    assert "permission denied" in done.stderr
    assert "not a SQLite database" not in done.stderr


@pytest.mark.parametrize("folder_mode", [0o1777, 0o755], ids=["sticky", "owner's"])
def test_a_reader_reads_through_a_running_writer(shared: Path, folder_mode: int) -> None:
    """While the owner has the store open (its -wal and -shm there), a reader sees the
    WAL's events and creates nothing; the owner writes on and its close removes them; a
    reader after it leaves nothing either, and the owner appends again."""
    folder, url = _store(shared, folder_mode)
    with _running(OWNER, HOLD, url, shared) as writer:
        assert _say(writer, "") == "ready\n"
        owners = {name: uid for name, (uid, _) in _beside(folder).items()}
        assert {"events.db-wal", "events.db-shm"} <= set(owners)
        code, report = _audit(READER, url, shared)
        assert (code, report["events_checked"], report["streams_checked"]) == (0, 4, 2)
        assert {name: uid for name, (uid, _) in _beside(folder).items()} == owners
        assert _say(writer, "go") == "done\n"
        assert writer.wait(timeout=60) == 0
    assert sorted(p.name for p in folder.iterdir()) == ["events.db", "events.db.blobs"]
    assert _audit(READER, url, shared)[1]["events_checked"] == 5
    assert sorted(p.name for p in folder.iterdir()) == ["events.db", "events.db.blobs"]
    _append(url, shared)


@pytest.mark.parametrize("writer", ["holds it open", "appends and closes"])
def test_a_writer_starting_during_an_unlocked_read_is_refused(shared: Path, writer: str) -> None:
    """A reader without locks (no -wal when it opened) never reports rows from a file a
    writer changed meanwhile: its next read is StoreUnavailable, not the old rows."""
    folder, url = _store(shared, 0o755)
    with contextlib.ExitStack() as stack:
        reader = stack.enter_context(_running(READER, READ_TWICE, url, shared))
        assert _say(reader, "") == "3\n"
        if writer == "holds it open":
            holder = stack.enter_context(_running(OWNER, HOLD, url, shared))
            assert _say(holder, "") == "ready\n"
        else:
            _append(url, shared)
        assert _say(reader, "go").startswith("unavailable: sqlite store")
    assert all(uid == OWNER for uid, _ in _beside(folder).values())


def test_a_wal_without_its_shm_is_not_completed_by_a_reader(shared: Path) -> None:
    """A -wal with no -shm (a writer starting, or one in exclusive mode that stopped): the
    reader says so rather than create a -shm the owner could not use (exit 3)."""
    folder, url = _store(shared, 0o1777)
    wal = folder / "events.db-wal"
    wal.touch()
    os.chown(wal, OWNER, OWNER)
    before = _beside(folder)
    done = _cli(READER, url, shared, "audit")
    assert done.returncode == 3
    assert "-shm" in done.stderr and "permission denied" in done.stderr
    assert _beside(folder) == before
