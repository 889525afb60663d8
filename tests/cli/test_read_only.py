"""Inspection never writes (issue 29): every command docs/cli.md calls read-only, and every
page of the read-only console, leaves the store exactly as it was, on SQLite and on
PostgreSQL.

Two stores per backend: ``full`` (tests/fixtures/inspection_store.py: runs paused and in
doubt, snapshots, spilled and erased payloads, a built read model, a Merkle log with
signed checkpoints, an anchor, a witness, archived segments, and events after all that)
and ``bare`` (a few events: no read model, Merkle log or checkpoint table was ever made,
which is where a reader that creates what it reads shows). Each command is its own test:
it checks the exit code (the command did its work, or refused as documented) and that
nothing changed: on SQLite every file under the store's folder byte for byte, and no new
file (no ``-wal``/``-shm`` left behind); on PostgreSQL every row of every table of the
store's schema and the schema itself (relations, columns, indexes, constraints, sequences'
values, functions, triggers, the database's schemas), and the blob, archive, anchor and
witness folders byte for byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import psycopg
import pytest

import ares_events as ae
from tests.fixtures import inspection_store
from tests.fixtures.cli_helpers import run
from tests.fixtures.inspection_store import Built

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
KINDS = ["full", "bare"]


# -- the stores ---------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_ares_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ARES_* setting of the machine reaches the commands (a log key would sign)."""
    for name in list(os.environ):
        if name.startswith("ARES_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")


def _bare(url: str, root: Path, blobs: str | None) -> Built:
    """A store with a few events and nothing else; a key, and a witness, anchors and
    proofs that exist nowhere (the commands that need them refuse, writing nothing)."""
    with ae.open_store(url, blobs=blobs) as store:
        for i in range(4):
            ae.emit(store, "agent-1", "note.added", "runtime", {"step": i})
    key = root / "keys" / "log.key"
    key.parent.mkdir()
    vkey = inspection_store.cli(url, "keygen", "inspection.test/log", "--out", str(key)).strip()
    return Built(
        url=url,
        root=root,
        key=key,
        vkey=vkey,
        witness_state=root / "witness.db",
        anchors=(root / "anchors").as_uri() + "/",
        proof=root / "proof.json",
        consistency_proof=root / "consistency.json",
        covered_size=0,
    )


class Stores:
    """The full and the bare store of one backend, each in a folder of its own, built on
    first use and shared by the tests (they only look). A test that saw a write spoils
    its store, so the tests after it get a fresh one and fail, or pass, on their own."""

    def __init__(
        self, backend: str, factory: pytest.TempPathFactory, pg_db: str | None = None
    ) -> None:
        self.backend = backend
        self.factory = factory
        self.pg_db = pg_db
        self.built: dict[str, Built] = {}

    def get(self, kind: str) -> Built:
        """The ``kind`` store, built now unless it was already."""
        if kind not in self.built:
            self.built[kind] = self._build(kind)
        return self.built[kind]

    def spoil(self, kind: str) -> None:
        """Something wrote to the ``kind`` store: the next test gets a new one."""
        self.built.pop(kind, None)

    def _build(self, kind: str) -> Built:
        root = self.factory.mktemp(f"{self.backend}-{kind}")
        blobs = None
        if self.pg_db is None:
            (root / "store").mkdir()
            url = f"sqlite:///{root / 'store' / 'events.db'}"
        else:
            sep = "&" if "?" in self.pg_db else "?"
            url = f"{self.pg_db}{sep}schema=ro_{uuid.uuid4().hex[:12]}"
            blobs = (root / "blobs").as_uri()
        with pytest.MonkeyPatch.context() as mp:
            for name in [n for n in os.environ if n.startswith("ARES_")]:
                mp.delenv(name)
            b = (inspection_store.build if kind == "full" else _bare)(url, root, blobs=blobs)
        assert not [p for p in root.rglob("*") if p.name.endswith(("-wal", "-shm"))]
        return b


@pytest.fixture(scope="module")
def sqlite_stores(tmp_path_factory: pytest.TempPathFactory) -> Stores:
    """SQLite stores."""
    return Stores("sqlite", tmp_path_factory)


@pytest.fixture(scope="module")
def postgres_stores(tmp_path_factory: pytest.TempPathFactory, postgres_db_url: str) -> Stores:
    """PostgreSQL stores (a schema each in the session's database, blobs in a folder)."""
    return Stores("postgres", tmp_path_factory, postgres_db_url)


def stores_of(request: pytest.FixtureRequest, backend: str) -> Stores:
    """The stores of ``backend``."""
    stores: Stores = request.getfixturevalue(f"{backend}_stores")
    return stores


# -- fingerprints -------------------------------------------------------------------------------


def files(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every file and folder under ``root``: its SHA-256 (or "dir")."""
    return {
        str(p.relative_to(root)): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if not p.name.endswith(skip)
    }


_CATALOG = {
    "relations": "SELECT relname, relkind::text FROM pg_class "
    "WHERE relnamespace = %(s)s::regnamespace ORDER BY 1",
    "columns": "SELECT table_name, column_name, ordinal_position, data_type, is_nullable, "
    "column_default FROM information_schema.columns WHERE table_schema = %(s)s ORDER BY 1, 3",
    "indexes": "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %(s)s ORDER BY 1",
    "constraints": "SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) "
    "FROM pg_constraint WHERE connamespace = %(s)s::regnamespace ORDER BY 1, 2",
    "sequences": "SELECT sequencename, last_value FROM pg_sequences "
    "WHERE schemaname = %(s)s ORDER BY 1",
    "functions": "SELECT proname, pg_get_function_identity_arguments(oid), prosrc "
    "FROM pg_proc WHERE pronamespace = %(s)s::regnamespace ORDER BY 1, 2",
    "triggers": "SELECT tgrelid::regclass::text, tgname FROM pg_trigger t "
    "JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = %(s)s::regnamespace "
    "ORDER BY 1, 2",
    "schemas": "SELECT nspname FROM pg_namespace ORDER BY 1",
    "tables": "SELECT tablename FROM pg_tables WHERE schemaname = %(s)s ORDER BY 1",
}


def pg_dump(url: str) -> dict[str, Any]:
    """The store's schema from the catalogs, and every row of every table of it (as
    text, sorted), read in one repeatable-read transaction."""
    found = re.search(r"schema=([^&]+)", urlsplit(url).query)
    assert found is not None
    schema = found.group(1)
    out: dict[str, Any] = {}
    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for name, sql in _CATALOG.items():
            out[name] = [tuple(r) for r in conn.execute(sql, {"s": schema}).fetchall()]
        for (table,) in out["tables"]:
            rows = conn.execute(f'SELECT r::text FROM "{schema}"."{table}" r ORDER BY 1')
            out[f"rows of {table}"] = [r[0] for r in rows.fetchall()]
        conn.execute("ROLLBACK")
    return out


def fingerprint(backend: str, b: Built, *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Everything a command could have changed: the folder (store file, blobs, anchors,
    archive, witness, keys, proofs) and, on PostgreSQL, the store's schema and rows."""
    return {
        "files": files(b.root, skip=skip),
        "database": pg_dump(b.url) if backend == "postgres" else None,
    }


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs, one line per file, catalog or table."""
    out = []
    for part in ("files", "database"):
        a, b = before[part] or {}, after[part] or {}
        for k in sorted(set(a) | set(b)):
            old, new = a.get(k), b.get(k)
            if old == new:
                continue
            if isinstance(old, list) and isinstance(new, list):  # rows: say which
                gone = [r for r in old if r not in new]
                added = [r for r in new if r not in old]
                out.append(f"{part}: {k}: removed {_short(gone)}, added {_short(added)}")
            else:
                out.append(f"{part}: {k}: {_short(old)} -> {_short(new)}")
    return out


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) < 300 else text[:300] + "..."


# -- the commands -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Cmd:
    """One read-only command line: ``{name}`` placeholders are fields of :class:`Built`.
    ``codes`` maps ``kind-backend``, ``kind``, ``backend`` or ``*`` (the first that is
    there counts) to the exit code it must give; ``says`` maps the same keys to a text its
    output must hold."""

    id: str
    args: tuple[str, ...]
    codes: dict[str, int] = field(default_factory=lambda: {"*": 0})
    says: dict[str, str] = field(default_factory=dict)

    def expect(self, table: dict[str, Any], kind: str, backend: str) -> Any:
        for k in (f"{kind}-{backend}", kind, backend, "*"):
            if k in table:
                return table[k]
        return None


def C(cid: str, *args: str, code: int = 0, says: dict[str, str] | None = None, **codes: int) -> Cmd:
    """A :class:`Cmd` that gives ``code`` unless ``codes`` says otherwise for a kind or a
    backend (``full_postgres=2`` is ``full-postgres``)."""
    table = {k.replace("_", "-"): v for k, v in codes.items()}
    table["*"] = code
    return Cmd(cid, args, table, says or {})


NEEDS_WRITE = "writes to the store"
NEVER_BUILT = "was never built"

COMMANDS = [
    C("streams", "streams"),
    C("streams-json", "streams", "--json"),
    C("tail", "tail", "agent-1", "-n", "3"),
    C("tail-spilled-erased", "tail", "agent-2", "--json", bare=2),
    C("tail-unknown", "tail", "nobody", code=2),
    C("verify", "verify", "agent-1", "--json"),
    C("verify-archived-erased", "verify", "agent-2", bare=2),
    C("audit", "audit"),
    C("audit-deep", "audit", "--deep", "--json"),
    C("audit-anchors", "audit", "--anchors", "{anchors}", "--vkey", "{vkey}", bare=1),
    C("anchor-check", "anchor", "--check", "--witness", "{anchors}", "--vkey", "{vkey}", bare=1),
    # The default witness is the folder anchors/ beside a SQLite file: there is none here,
    # so nothing is proven (exit 1), and the folder must not be created.
    C("anchor-check-default", "anchor", "--check", "--json", code=1, postgres=2),
    C("checkpoint-list", "checkpoint", "--list"),
    C("checkpoint-list-json", "checkpoint", "--list", "--json"),
    C("prove", "prove", "agent-1", "2", "--json", bare=2, says={"bare": NEEDS_WRITE}),
    C(
        "prove-after-checkpoint",
        "prove",
        "agent-3",
        "4",
        code=2,
        says={"full": NEEDS_WRITE, "bare": "no event"},
    ),
    C("prove-unknown-event", "prove", "agent-1", "99", code=2),
    C(
        "prove-consistency",
        "prove",
        "--consistency",
        "3",
        "--json",
        bare=2,
        says={"bare": NEEDS_WRITE},
    ),
    C(
        "prove-consistency-sizes",
        "prove",
        "--consistency",
        "3",
        "{covered_size}",
        bare=2,
        says={"bare": NEEDS_WRITE},
    ),
    C("verify-proof", "verify-proof", "{proof}", "--vkey", "{vkey}", bare=2),
    C(
        "verify-proof-consistency",
        "verify-proof",
        "{consistency_proof}",
        "--vkey",
        "{vkey}",
        bare=2,
    ),
    C("runs-list", "runs", "list"),
    C("runs-list-in-doubt", "runs", "list", "--status", "in_doubt", "--json"),
    C("runs-show-in-doubt", "runs", "show", "run-doubt", bare=2),
    C("runs-show-paused", "runs", "show", "run-paused", "--json", bare=2),
    C("runs-show-failed", "runs", "show", "run-failed", bare=2),
    C("snapshot-list", "snapshot", "list"),
    C("snapshot-list-stream", "snapshot", "list", "agent-1", "--json"),
    C("snapshot-verify", "snapshot", "verify"),
    C("recover", "recover", "agent-1"),
    C("recover-no-snapshots", "recover", "agent-1", "--no-snapshots", "--json"),
    C("recover-run", "recover", "run-doubt", "--projection", "run_state", bare=2),
    C(
        "recover-tolerant",
        "recover",
        "agent-2",
        "--projection",
        "agent_state",
        "--tolerant",
        full=1,  # the erased payload is skipped and listed
        bare=2,
    ),
    C("rebuild-verify", "rebuild", "agent_state", "--verify", bare=2, says={"bare": NEVER_BUILT}),
    C(
        "rebuild-verify-never-built",
        "rebuild",
        "genealogy",
        "--verify",
        code=2,
        says={"*": NEVER_BUILT},
    ),
    C(
        "rebuild-verify-merkle",
        "rebuild",
        "merkle_log",
        "--verify",
        bare=2,
        says={"bare": NEVER_BUILT},
    ),
    C("archive-status", "archive", "--status"),
    C("archive-status-json", "archive", "--status", "--json"),
    C("gc-blobs-dry-run", "gc-blobs", "--dry-run", "--json"),
    C("witness-list", "witness", "list", "--state", "{witness_state}", bare=2),
    C("cells", "cells", code=2),  # not a cell store: refused, and nothing written
]


def _argv(cmd: Cmd, b: Built) -> list[str]:
    fields = {k: str(v) for k, v in vars(b).items()}
    return [a.format(**fields) for a in cmd.args]


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c.id for c in COMMANDS])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_command_writes_nothing(
    backend: str,
    kind: str,
    cmd: Cmd,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command gives its documented exit code, and the store (and everything beside
    it) is exactly as it was."""
    stores = stores_of(request, backend)
    b = stores.get(kind)
    before = fingerprint(backend, b)
    code, out, err = run(capsys, "--store", b.url, *_argv(cmd, b))
    wrote = changes(before, fingerprint(backend, b))
    if wrote:
        stores.spoil(kind)
    assert wrote == [], f"{cmd.id} wrote to the {kind} {backend} store"
    assert code == cmd.expect(cmd.codes, kind, backend), (code, out[-2000:], err[-2000:])
    text = cmd.expect(cmd.says, kind, backend)
    if text is not None:
        assert text in out + err, (out[-2000:], err[-2000:])


def test_every_read_only_command_of_the_docs_is_tested() -> None:
    """docs/cli.md's list of commands that only look names no command this file skips."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    section = docs.split("## Which commands write", 1)[1].split("\n## ", 1)[0]
    listed = section.split("Only look", 1)[1].split("\n\n", 1)[0]
    tested = {" ".join(c.args[:2]) for c in COMMANDS} | {c.args[0] for c in COMMANDS}
    named = re.findall(r"`([a-z][a-z-]*(?: [a-z][a-z-]*)?)[^`]*`", listed)
    assert named and [n for n in named if n not in tested and n != "ui"] == []


def test_a_read_only_sqlite_store_refuses_writes_and_leaves_no_file(tmp_path: Path) -> None:
    """Under the CLI's read-only open: the store refuses a write before SQLite is asked,
    SQLite refuses a raw one itself (query_only), and closing leaves no -wal/-shm."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    with ae.open_store(url) as store:
        ae.emit(store, "agent-1", "note.added", "runtime", {})
    before = files(tmp_path)
    with ae.open_store(url, create=False, read_only=True) as store:
        assert [e.version for e in store.read("agent-1")] == [1]
        assert {p.name for p in tmp_path.iterdir()} >= {"events.db-wal", "events.db-shm"}
        with pytest.raises(ae.errors.StoreError, match="read-only"):
            ae.emit(store, "agent-1", "note.added", "runtime", {})
        sqlite: Any = store.recorder  # no archive: the SQLite recorder itself
        with pytest.raises(sqlite3.OperationalError, match="readonly database"):
            sqlite.fetch("INSERT INTO ares_meta (key, value) VALUES ('x', 'y')")
    assert files(tmp_path) == before


_DIES_HOLDING_IT = """
import os, sys, ares_events as ae
store = ae.open_store(sys.argv[1])
for i in range(5):
    ae.emit(store, "agent-9", "note.added", "runtime", {"i": i})
os._exit(0)  # as a kill -9: SQLite closes nothing, its WAL is left to the next opener
"""


@pytest.mark.parametrize(
    "args", [("streams",), ("verify", "agent-9"), ("audit",), ("tail", "agent-9")]
)
@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_a_read_only_command_after_a_writer_died_leaves_its_wal_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...]
) -> None:
    """A writer died holding the store (its -wal and -shm left, events in the -wal only):
    a read-only command sees those events and leaves the file and its -wal byte for byte
    as they were (the last connection to close would checkpoint the WAL into the file and
    remove it). The -shm stays; as SQLite's shared-memory index it takes any reader's
    marks."""
    url = f"sqlite:///{tmp_path / 'events.db'}"
    subprocess.run([sys.executable, "-c", _DIES_HOLDING_IT, url], check=True, timeout=120)
    assert (tmp_path / "events.db-wal").stat().st_size > 0  # the precondition
    before = files(tmp_path, skip=("-shm",))
    code, out, err = run(capsys, "--store", url, *args)
    assert code == 0, (out, err)
    assert "agent-9" in out or "ok" in out.lower(), out
    assert files(tmp_path, skip=("-shm",)) == before
    with ae.open_store(url, create=False, read_only=True) as store:
        assert [e.version for e in store.read("agent-9")] == [1, 2, 3, 4, 5]
    assert files(tmp_path, skip=("-shm",)) == before
    assert (tmp_path / "events.db-shm").exists()


# -- the console --------------------------------------------------------------------------------


@dataclass
class Console:
    """A running ``ares-events ui`` process and its session cookie."""

    proc: subprocess.Popen[str]
    port: int
    prefix: str  # the per-start secret path every console URL is under
    token: str
    cookie: str = ""
    stderr: list[str] = field(default_factory=list)

    def get(self, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
        """One request; the response status, headers (lowercase names) and body."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request("GET", self.prefix + path, headers={"Cookie": self.cookie, **headers})
            resp = conn.getresponse()
            if resp.getheader("Content-Type", "").startswith("text/event-stream"):
                body = resp.readline() + resp.readline()  # the first line of a live feed
            else:
                body = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
        finally:
            conn.close()

    def post(self, path: str, form: dict[str, str]) -> int:
        """A form POST (same origin, with the session); its status."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(
                "POST",
                self.prefix + path,
                body=urlencode(form),
                headers={
                    "Cookie": self.cookie,
                    "Content-Type": "application/x-www-form-urlencoded",
                    "Origin": f"http://127.0.0.1:{self.port}",
                },
            )
            resp = conn.getresponse()
            resp.read()
            return resp.status
        finally:
            conn.close()


@contextlib.contextmanager
def console(url: str) -> Iterator[Console]:
    """``ares-events --store URL ui --port 0`` (read-only), logged in; killed at the end
    if the test did not stop it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ares_events", "--store", url, "ui", "--port", "0"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("ARES_")},
    )
    lines: list[str] = []
    ready = threading.Event()
    found: dict[str, str] = {}

    def pump() -> None:  # read stderr to its end, so the console never blocks on it
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"open http://127\.0\.0\.1:(\d+)(/[^/?]+)/\?token=(\S+)", line)
            if m:
                found["port"], found["prefix"], found["token"] = m.groups()
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        ready.wait(120)
        assert "port" in found, f"the console did not start: {''.join(lines)}"
        c = Console(proc, int(found["port"]), found["prefix"], found["token"], stderr=lines)
        status, headers, _ = c.get(f"/?token={c.token}")
        assert status == 303, status
        c.cookie = headers["set-cookie"].split(";", 1)[0]
        yield c
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()


# (path, status, a text the answer holds): every GET view, on the full store.
PAGES = [
    ("/", 303, ""),
    ("/streams", 200, "agent-1"),
    ("/streams?prefix=run-", 200, "run-doubt"),
    ("/stream?id=agent-2", 200, "file.observed"),
    ("/stream?id=agent-1&from=2", 200, "note.added"),
    ("/payload?id=agent-2&v=2", 200, "xxxx"),  # spilled to a blob
    ("/payload?id=agent-2&v=3", 200, "erased"),
    ("/verify?id=agent-2", 200, "agent-2"),
    ("/runs", 200, "run-paused"),
    ("/runs?status=in_doubt", 200, "run-doubt"),
    ("/run?id=run-doubt", 200, "create_ticket"),
    ("/run?id=run-done", 200, "completed"),
    ("/diff?id=run-done&step=1", 200, "Summarise A."),
    ("/integrity", 200, "inspection.test/log"),
    ("/proof?stream=agent-1&version=2", 200, '"inclusion"'),
    ("/proof?stream=agent-3&version=4", 400, NEEDS_WRITE),  # after the checkpoint
    ("/projections", 200, "agent_state"),
    ("/live?after=0", 200, "retry"),
    ("/static/console.css", 200, ""),
    ("/static/console.js", 200, ""),
]


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("backend", BACKENDS)
def test_read_only_console_writes_nothing(backend: str, request: pytest.FixtureRequest) -> None:
    """Every GET view of the read-only console (and an audit started from its Integrity
    page) changes nothing while it runs, and after a clean Ctrl-C the store is byte for
    byte what it was, with no -wal/-shm beside a SQLite file."""
    stores = stores_of(request, backend)
    b = stores.get("full")
    stores.spoil("full")  # whatever happens here, later tests get a store of their own
    before = fingerprint(backend, b)
    # While it runs, SQLite's -shm (the WAL index, where readers keep their read marks)
    # and an empty -wal are there, as beside any open reader; neither may hold a write.
    running_skip = ("-shm",)
    with console(b.url) as c:
        base = fingerprint(backend, b, skip=running_skip)
        for path, status, text in PAGES:
            got, _, body = c.get(path)
            assert (got, text in body.decode("utf-8", "replace")) == (status, True), (
                path,
                body[:500],
            )
            assert changes(base, fingerprint(backend, b, skip=running_skip)) == [], path
        csrf = re.search(rb'name="csrf" value="([^"]+)"', c.get("/integrity")[2])
        assert csrf is not None
        assert c.post("/audit", {"csrf": csrf.group(1).decode(), "deep": "1"}) == 303
        while b'id="audit-progress"' in (page := c.get("/integrity")[2]):
            time.sleep(0.05)  # polls the page until the audit has its report
        assert b"clean" in page and b"audit failed" not in page, page[:3000]
        assert changes(base, fingerprint(backend, b, skip=running_skip)) == [], "/audit"
        c.proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert c.proc.wait(timeout=60) == 0, "".join(c.stderr)
    assert changes(before, fingerprint(backend, b)) == []
