"""The ``ares-events`` CLI, the demo and the README quick start, against real SQLite files."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click
import pytest

import ares_events as ae
from ares_events.agents.demo import run_demo
from ares_events.cli import cli
from tests.fixtures.cli_helpers import run, run_json

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "hunter2-S3cret"
KEY_HEX = "0f" * 32


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/cli/conftest.py


@pytest.fixture
def db(tmp_path: Path) -> str:
    """URL of a fresh SQLite file."""
    return f"sqlite:///{tmp_path / 'cli.db'}"


@pytest.fixture
def demo_db(db: str, capsys: pytest.CaptureFixture[str]) -> Iterator[tuple[str, list[str]]]:
    """A SQLite store filled by the demo (3 agents x 40 events); yields (url, streams)."""
    code, data = run_json(
        capsys, "--store", db, "demo", "--simple", "--agents", "3", "--events", "40"
    )
    assert code == 0
    yield db, [str(s["stream_id"]) for s in data["streams"]]


def _path(url: str) -> str:
    return url.removeprefix("sqlite:///")


# -- demo ------------------------------------------------------------------------------------


def test_demo_reports_every_stream_verified(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """demo appends N agents x M events, verifies each chain and says so as JSON."""
    code, data = run_json(
        capsys, "--store", db, "demo", "--simple", "--agents", "4", "--events", "50"
    )
    assert code == 0
    assert data["agents"] == 4 and data["events"] == 200 and data["all_ok"] is True
    streams = data["streams"]
    assert isinstance(streams, list) and len(streams) == 4
    assert all(s["ok"] and s["version"] == 50 and s["events"] == 50 for s in streams)
    with ae.open_store(db) as store:
        assert sorted(store.streams()) == sorted((s["stream_id"], 50) for s in streams)
        types = {e.type for e in store.read_all()}
    assert {"session.created", "agent.started", "model.call.requested", "tool.returned"} <= types
    assert {"state.patched", "task.completed", "agent.stopped"} <= types


def test_demo_table_and_rerun_adds_streams(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The human demo output is a table with timing; a second run adds new streams."""
    code, out, err = run(
        capsys, "--store", db, "demo", "--simple", "--agents", "2", "--events", "20"
    )
    assert code == 0
    assert "all chains verified" in out and "events/s" in out
    assert re.search(r"demo-[0-9a-f]{6}-agent-01", out)
    assert f"store: {db}" in err
    code, _, _ = run(capsys, "--store", db, "demo", "--simple", "--agents", "2", "--events", "20")
    assert code == 0
    with ae.open_store(db) as store:
        assert len(list(store.streams())) == 4
        assert ae.integrity.audit(store).ok


def test_run_demo_is_reproducible_with_a_seed() -> None:
    """run_demo with the same seed writes the same event types and payloads."""
    runs = []
    for run_id in ("aaaaaa", "bbbbbb"):
        with ae.open_store("memory://") as store:
            res = run_demo(store, agents=2, events=30, seed=11, run_id=run_id)
            assert res.all_ok and res.events == 60
            runs.append([(e.type, e.payload) for e in store.read_all()])
    strip = re.compile(r"aaaaaa|bbbbbb")
    a, b = ([(t, strip.sub("", json.dumps(p))) for t, p in r] for r in runs)
    assert a == b


def test_run_demo_rejects_too_few_events() -> None:
    """run_demo refuses fewer events than its lifecycle needs."""
    with ae.open_store("memory://") as store, pytest.raises(ValueError, match="events"):
        run_demo(store, agents=1, events=3)


# -- streams / tail / verify / audit ------------------------------------------------------------


def test_streams_lists_versions_and_heads(
    demo_db: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """streams lists every stream with version and head hash, as a table and as JSON."""
    url, names = demo_db
    code, data = run_json(capsys, "--store", url, "streams")
    assert code == 0 and data["count"] == 3
    with ae.open_store(url) as store:
        expected = [
            {"stream_id": n, "version": 40, "head_hash": store.head(n).hash.hex()}  # type: ignore[union-attr]
            for n in sorted(names)
        ]
    assert data["streams"] == expected
    code, out, _ = run(capsys, "--store", url, "streams")
    assert code == 0
    for n in names:
        assert n in out
    assert expected[0]["head_hash"][:16] in out  # type: ignore[index]


def test_tail_shows_last_events(
    demo_db: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """tail -n N shows the last N events; --json carries full payloads and hashes."""
    url, names = demo_db
    code, data = run_json(capsys, "--store", url, "tail", names[0], "-n", "5")
    assert code == 0
    events = data["events"]
    assert isinstance(events, list)
    assert [e["version"] for e in events] == [36, 37, 38, 39, 40]
    assert events[-1]["type"] == "agent.stopped" and events[-1]["module"] == "runtime"
    with ae.open_store(url) as store:
        last = next(iter(store.read(names[0], from_version=40)))
    assert events[-1]["payload"] == last.payload and events[-1]["hash"] == last.hash.hex()
    code, out, _ = run(capsys, "--store", url, "tail", names[0], "-n", "3")
    assert code == 0
    assert "agent.stopped" in out and "task.completed" in out and " 37 " not in out


def test_verify_and_audit_clean_store(
    demo_db: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """verify and audit exit 0 on an untouched store, in both output modes."""
    url, names = demo_db
    code, data = run_json(capsys, "--store", url, "verify", names[1])
    assert code == 0 and data["ok"] is True and data["events_checked"] == 40
    code, out, _ = run(capsys, "--store", url, "verify", names[1])
    assert code == 0 and "chain intact" in out
    code, data = run_json(capsys, "--store", url, "audit", "--deep")
    assert code == 0 and data["ok"] is True
    assert data["streams_checked"] == 3 and data["events_checked"] == 120
    code, out, _ = run(capsys, "--store", url, "audit")
    assert code == 0 and "120" in out and "ok" in out


def test_tampered_row_gives_exit_1(
    demo_db: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Editing a payload byte through sqlite3 makes verify and audit exit 1 with findings."""
    url, names = demo_db
    con = sqlite3.connect(_path(url))
    with con:
        con.execute(
            "UPDATE ares_events SET payload = CAST(replace(CAST(payload AS TEXT), '\"', '''')"
            " AS BLOB) WHERE stream_id = ? AND version = 7",
            (names[2],),
        )
    con.close()
    code, data = run_json(capsys, "--store", url, "verify", names[2])
    assert code == 1 and data["ok"] is False
    assert [(f["kind"], f["version"]) for f in data["findings"]] == [("hash_mismatch", 7)]
    code, out, _ = run(capsys, "--store", url, "verify", names[2])
    assert code == 1 and "hash_mismatch" in out
    code, data = run_json(capsys, "--store", url, "audit")
    assert code == 1 and data["streams_with_findings"] == [names[2]]
    code, out, _ = run(capsys, "--store", url, "audit")
    assert code == 1 and "hash_mismatch" in out and names[2] in out


def test_deleted_tail_rows_are_reported_truncated(
    demo_db: tuple[str, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting the last rows of a stream is a truncated finding, not a shorter stream."""
    url, names = demo_db
    con = sqlite3.connect(_path(url))
    with con:
        con.execute("DELETE FROM ares_events WHERE stream_id = ? AND version > 37", (names[0],))
    con.close()
    code, data = run_json(capsys, "--store", url, "verify", names[0])
    assert code == 1
    assert "truncated" in {f["kind"] for f in data["findings"]}


def test_chain_key_from_env_is_used_and_never_shown(
    db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ARES_EVENTS_CHAIN_KEY keys the chain; without it the store refuses to open (exit 2,
    one line naming the key id); the key never shows."""
    monkeypatch.setenv("ARES_EVENTS_CHAIN_KEY", KEY_HEX)
    code, data = run_json(
        capsys, "--store", db, "demo", "--simple", "--agents", "1", "--events", "10"
    )
    assert code == 0 and data["all_ok"] is True
    code, out, err = run(capsys, "--store", db, "audit")
    assert code == 0 and "keyed" in err
    assert KEY_HEX not in out + err
    monkeypatch.delenv("ARES_EVENTS_CHAIN_KEY")
    code, out, err = run(capsys, "--store", db, "audit")
    assert code == 2
    assert "keyed" in err and ae.integrity.ChainKey.from_hex(KEY_HEX).fingerprint() in err
    assert KEY_HEX not in out + err
    assert len([line for line in err.splitlines() if "error" in line]) == 1


# -- exit codes 2 and 3, secrets ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("not-a-url", "scheme://"),
        (f"nosuch://user:{PASSWORD}@host/db", "unknown store scheme 'nosuch'"),
        ("sqlite:///x.db?bogus=1", "unknown parameter(s) bogus"),
        (f"postgresql://root:{PASSWORD}@[::1/x", "does not parse as a URL"),
        (f"postgresql://root:{PASSWORD}\uff03@h/x", "does not parse as a URL"),
    ],
)
def test_bad_store_url_exits_2(
    url: str,
    needle: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A malformed URL, an unknown scheme or an unknown parameter exits 2 with one line."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "--store", url, "streams")
    assert code == 2 and out == ""
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert PASSWORD not in err


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("ARES_SPILL_THRESHOLD_BYTES", "ten"),
        ("ARES_SNAPSHOT_EVERY", "-3"),
        ("ARES_EVENTS_CHAIN_KEY", "not-hex-but-secret-ish"),
    ],
)
def test_bad_env_value_exits_2(
    var: str,
    value: str,
    db: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad ARES_* value exits 2 naming the variable (a bad key is never echoed)."""
    monkeypatch.setenv(var, value)
    code, out, err = run(capsys, "--store", db, "streams")
    assert code == 2 and out == "" and var in err
    if var == "ARES_EVENTS_CHAIN_KEY":
        assert value not in err


def test_usage_errors_exit_2(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing argument, a bad option value or an unknown stream exits 2."""
    assert run(capsys, "--store", db, "init")[0] == 0
    assert run(capsys, "--store", db, "tail")[0] == 2
    assert run(capsys, "--store", db, "tail", "s", "-n", "0")[0] == 2
    assert run(capsys, "no-such-command")[0] == 2
    code, _, err = run(capsys, "--store", db, "verify", "ghost")
    assert code == 2 and "no stream 'ghost'" in err
    code, _, err = run(capsys, "--store", db, "tail", "bad\x01id")
    assert code == 2 and "control character" in err


def test_locked_database_exits_3(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A database held locked by another connection is 'store unavailable' for a command
    that writes: exit 3. One that only looks reads beside the writer (WAL), unblocked, and
    so does `init` of a store already at this schema (it has nothing to write)."""
    assert run(capsys, "--store", db, "init")[0] == 0
    holder = sqlite3.connect(_path(db), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        code, out, err = run(capsys, "--store", f"{db}?busy_timeout=0.2", "rebuild", "agent_state")
        looked = run(capsys, "--store", f"{db}?busy_timeout=0.2", "streams")
        again = run(capsys, "--store", f"{db}?busy_timeout=0.2", "init")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 3 and out == "" and "locked" in err and "Traceback" not in err
    assert looked[0] == 0, looked
    assert again[0] == 0, again


def test_unwritable_location_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    """A SQLite path whose folder cannot be created exits 3."""
    code, _, err = run(capsys, "--store", "sqlite:////proc/ares-events-nope/x.db", "init")
    assert code == 3 and "cannot create" in err


def test_unreachable_postgres_exits_3_without_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An unreachable PostgreSQL server exits 3 and the URL password appears nowhere."""
    url = f"postgresql://root:{PASSWORD}@127.0.0.1:1/x?connect_timeout=1"
    code, out, err = run(capsys, "--store", url, "streams")
    assert code == 3 and out == "" and err.count("\n") == 1
    assert PASSWORD not in err and "root:***@" in err


@pytest.mark.postgres
def test_demo_and_audit_on_postgres(postgres_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo and the audit run unchanged against PostgreSQL; its password never shows."""
    code, data = run_json(
        capsys, "--store", postgres_url, "demo", "--simple", "--agents", "2", "--events", "20"
    )
    assert code == 0 and data["all_ok"] is True
    code, out, err = run(capsys, "--store", postgres_url, "audit")
    assert code == 0 and "40" in out
    encoded = urlsplit(postgres_url).password
    assert encoded and encoded not in out + err and unquote(encoded) not in out + err


def test_password_is_redacted_in_store_line_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """The store line on stderr and the JSON output show the URL with the password redacted."""
    url = f"memory://reader:{PASSWORD}@cli-redaction"
    code, out, err = run(capsys, "--store", url, "-v", "init")
    assert code == 0
    assert "reader:***@" in err and PASSWORD not in out + err
    code, data = run_json(capsys, "--store", url, "streams")
    assert code == 0 and data["store"] == "memory://reader:***@cli-redaction"


def test_store_from_env_and_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--store beats ARES_STORE_URL, which beats sqlite:///ares-events.db in the cwd."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run(capsys, "init")
    assert code == 0 and "store: sqlite:///ares-events.db" in err
    assert (tmp_path / "ares-events.db").exists()
    monkeypatch.setenv("ARES_STORE_URL", "memory://from-env")
    assert "store: memory://from-env" in run(capsys, "init")[2]
    assert "store: memory://flag" in run(capsys, "--store", "memory://flag", "init")[2]


def test_init_reports_schema_version(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """init creates the schema and reports its version; running it again is harmless."""
    code, data = run_json(capsys, "--store", db, "init")
    assert code == 0 and isinstance(data["schema_version"], int) and data["schema_version"] >= 1
    assert run_json(capsys, "--store", db, "init") == (0, data)


def test_quiet_silences_the_store_line(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """-q leaves stderr empty on success."""
    code, _, err = run(capsys, "-q", "--store", db, "init")
    assert code == 0 and err == ""


# -- help and docs ------------------------------------------------------------------------------


def _commands() -> list[str]:
    assert isinstance(cli, click.Group)
    return sorted(cli.commands)


def test_every_command_has_help_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    """--help works for the group and every command, explains it and shows an example."""
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "Exit codes" in out
    for name in _commands():
        code, out, _ = run(capsys, name, "--help")
        assert code == 0, name
        assert f"Usage: ares-events {name}" in out and "Example" in out, name


def test_every_command_is_documented() -> None:
    """Every CLI command has a section in docs/cli.md and is named in the README."""
    doc = (ROOT / "docs" / "cli.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in _commands():
        assert f"## `ares-events {name}" in doc, name
        assert f"ares-events {name}" in readme or f"`{name}`" in readme, name


def test_readme_links_exist() -> None:
    """Every relative link in the README points at a file in the repository."""
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)#:]+)\)", readme)
    assert links
    for link in links:
        assert (ROOT / link).exists(), link


def test_readme_quick_start_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's python block runs as written (in an empty folder)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1
    assert 10 <= len(blocks[0].strip().splitlines()) <= 30
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0], "README.md", "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "2 2" in out and "capped=False" in out


# -- real processes -----------------------------------------------------------------------------


def _exe() -> list[str]:
    script = Path(sys.executable).with_name("ares-events")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ares_events"]


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_console_script_subprocess(tmp_path: Path) -> None:
    """The installed command runs the demo, then tail and audit read the same file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARES_")}
    env["ARES_STORE_URL"] = f"sqlite:///{tmp_path / 'sub.db'}"

    def sub(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*_exe(), *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )

    demo = sub("demo", "--simple", "--agents", "2", "--events", "30", "--json")
    assert demo.returncode == 0, demo.stderr
    data = json.loads(demo.stdout)
    assert data["all_ok"] is True and len(data["streams"]) == 2
    first = data["streams"][0]["stream_id"]
    tail = sub("tail", first, "-n", "2", "--json")
    assert tail.returncode == 0 and [e["version"] for e in json.loads(tail.stdout)["events"]] == [
        29,
        30,
    ]
    audit = sub("audit")
    assert audit.returncode == 0 and "60" in audit.stdout
    assert "Traceback" not in demo.stderr + tail.stderr + audit.stderr


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_python_dash_m_entry_point(tmp_path: Path) -> None:
    """python -m ares_events runs the same CLI and maps errors to exit codes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARES_")}
    ok = subprocess.run(
        [sys.executable, "-m", "ares_events", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0 and ae.__version__ in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "ares_events", "--store", "bogus", "streams"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr


def test_bench_measures_the_store_without_touching_agent_streams(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`bench --json` reports every workload, verifies its replay, and writes only to
    bench-* streams."""
    assert run(capsys, "--store", db, "demo", "--simple", "--agents", "1", "--events", "10")[0] == 0
    code, data = run_json(capsys, "--store", db, "bench", "--events", "200")
    assert code == 0
    rows = data["workloads"]
    assert isinstance(rows, list) and len(rows) == 4
    assert all(r["events"] > 0 and r["events_per_s"] for r in rows)
    assert next(r for r in rows if r["workload"].startswith("replay"))["ok"] is True
    code, streams = run_json(capsys, "--store", db, "streams")
    listed: Any = streams["streams"]
    names = [s["stream_id"] for s in listed]
    assert sum(not n.startswith("bench-") for n in names) == 1
    assert sum(n.startswith("bench-") for n in names) == 2


def test_findings_at_consecutive_versions_print_as_one_row(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream whose every hash fails (here: every event's time rewritten) is one
    findings row with a version range, not one row per event; --json still lists all."""
    with ae.open_store(db) as store:
        for i in range(5):
            ae.emit(store, "keyed", "t", "m", {"i": i})
    path = unquote(urlsplit(db).path)[1:]
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE ares_events SET recorded_at = '2020-01-01T00:00:00.000000Z'")
    conn.close()
    code, out, _ = run(capsys, "--store", db, "audit")
    assert code == 1
    assert "1..5 (5)" in out and out.count("hash_mismatch") == 1
    code, data = run_json(capsys, "--store", db, "audit")
    assert code == 1 and len(data["findings"]) == 5


def test_ui_without_its_extra_is_exit_2_naming_the_extra(tmp_path: Path) -> None:
    """`ares-events ui` where starlette is not installed (hidden from a child process) is
    a missing optional dependency: exit 2 and the pip extra, not an internal error."""
    code = (
        "import sys; sys.modules['starlette'] = None\n"
        "from ares_events.cli import main\n"
        f"sys.exit(main(['--store', 'sqlite:///{tmp_path / 'e.db'}', 'ui']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "ares-events[ui]" in done.stderr and "Traceback" not in done.stderr
