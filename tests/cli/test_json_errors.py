"""With ``--json``, an error is one JSON object on stdout (``{"error": {"kind", "type",
"message", "exit_code"}}``) and the human line on stderr, for every exit-code class, with
the exit code unchanged and no secret of the configuration in either (issue 29)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

import ares_events as ae
from ares_events.agents.journal import Journal
from ares_events.chain import ChainKey
from ares_events.cli import main
from ares_events.cli.common import App, cli, json_option, pass_app

PASSWORD = "pw-Zq7!secret"
KEY_HEX = "5e" * 32
PG = f"postgresql://alice:{PASSWORD}@127.0.0.1:9/agents?connect_timeout=2"
"""Nothing listens on port 9: unavailable, and a password to keep out of every output."""


pytestmark = pytest.mark.usefixtures("clean_env")  # tests/cli/conftest.py


@pytest.fixture
def damaged(tmp_path: Path) -> str:
    """A keyed SQLite store with a run whose first event was edited behind its back."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    key = ChainKey.from_hex(KEY_HEX)
    with ae.open_store(url, create=True, chain_key=key) as store:
        j = Journal(store, "run-1", code_revision="r", prompt_hash="p")
        j.patch("k", 1)
        j.interrupt("approval")
    conn = sqlite3.connect(tmp_path / "runs.db")
    with conn:
        conn.execute("UPDATE ares_events SET metadata = '{\"x\":1}' WHERE version = 2")
    conn.close()
    return url


@pytest.fixture
def failing_commands() -> Iterator[None]:
    """Two commands added through the CLI's own extension point (a function on the group):
    one with a bug (an exception that is not a library error, naming the password), one
    that aborts."""

    @cli.command(name="test-bug")
    @json_option
    def bug(as_json: bool) -> None:
        raise RuntimeError(f"bug while holding {PASSWORD}")

    @cli.command(name="test-abort")
    @json_option
    def abort(as_json: bool) -> None:
        raise click.Abort

    @cli.command(name="test-conflict")
    @json_option
    @pass_app
    def conflict(app: App, as_json: bool) -> None:
        with app.open(create=True, write=True) as store:  # a real store refuses a stale write
            if not store.stream_version("s"):
                store.append("s", [ae.NewEvent(type="t.x", module="m")])
            store.append("s", [ae.NewEvent(type="t.x", module="m")], expected_version=0)

    try:
        yield
    finally:
        del cli.commands["test-bug"], cli.commands["test-abort"], cli.commands["test-conflict"]


def _check(
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    kind: str,
    code: int,
    *,
    json_first: bool = False,
) -> dict[str, Any]:
    """Run ``argv`` without and with --json: same exit code; without, stdout is empty;
    with, stdout is exactly one error object; stderr is the human line both times; the
    password and the chain key appear nowhere."""
    assert main(argv) == code
    plain_out, plain_err = capsys.readouterr()
    assert plain_out == ""
    assert "ares-events: error:" in plain_err or "Error:" in plain_err
    with_json = ["--json", *argv] if json_first else [*argv, "--json"]
    assert main(with_json) == code
    out, err = capsys.readouterr()
    assert err == plain_err
    for text in (plain_err, out, err):
        assert PASSWORD not in text and KEY_HEX not in text
    assert out.endswith("\n") and out.count("\n") == 1, out
    data = json.loads(out)
    assert set(data) == {"error"}
    error = data["error"]
    assert set(error) == {"kind", "type", "message", "exit_code"}
    assert (error["kind"], error["exit_code"]) == (kind, code), error
    assert error["message"] and "\n" not in error["message"]
    return dict(error)


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command, an unknown option, a missing argument, a bad value and a
    command refusing its arguments: kind usage, exit 2 (--json before or after)."""
    store = ["--store", PG]
    e = _check(capsys, [*store, "no-such-command"], "usage", 2, json_first=True)
    assert e["type"] == "NoSuchCommand" and "no-such-command" in e["message"]
    e = _check(capsys, [*store, "streams", "--bogus"], "usage", 2)
    assert "--bogus" in e["message"]
    _check(capsys, [*store, "tail"], "usage", 2)
    _check(capsys, [*store, "tail", "s", "-n", "0"], "usage", 2)
    e = _check(capsys, [*store, "runs", "resolve", "r", "1"], "usage", 2)
    assert "--result" in e["message"]
    e = _check(capsys, [*store], "usage", 2, json_first=True)  # no command at all
    assert e["message"] == "Missing command."


@pytest.mark.parametrize(
    "args",
    [
        ["erase", "s", str(2**63), "--reason", "x"],
        ["gc-blobs", "--older-than", "99999999999999999999d", "--dry-run"],
        ["gc-blobs", "--older-than", "999999999d", "--dry-run"],
        ["archive", "--to", "file:///nowhere", "--before", "999999999d", "config"],
        ["archive", "--to", "file:///nowhere", "--before", str(2**64), "config"],
        ["runs", "resume", "r", "--expires-in", str(10**15)],
    ],
)
def test_numbers_out_of_range_are_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """A version past 2**63-1, an age or expiry no date can hold: exit 2 naming the
    option (they were internal errors, exit 4: OverflowError, date value out of range)."""
    kind = args.pop() if args[-1] == "config" else "usage"  # a ConfigError: exit 2 too
    db = tmp_path / "s.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        ae.emit(store, "s", "t.x", "m", {})
    _check(capsys, ["--store", f"sqlite:///{db}", *args], kind, 2)


def test_config_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown scheme, an unknown URL parameter, a malformed environment value (a key
    is never echoed): kind config, exit 2."""
    e = _check(capsys, ["--store", "nope://x", "streams"], "config", 2)
    assert e["type"] == "UnknownSchemeError"
    bad_param = PG.replace("connect_timeout=2", "bogus=1")
    _check(capsys, ["--store", bad_param, "streams"], "config", 2)
    monkeypatch.setenv("ARES_EVENTS_CHAIN_KEY", KEY_HEX[:-2] + "zz")
    e = _check(capsys, ["--store", PG, "streams"], "config", 2, json_first=True)
    assert "ARES_EVENTS_CHAIN_KEY" in e["message"] and KEY_HEX[:-2] not in e["message"]


def test_unavailable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No server (the URL's password replaced by ***) and no store at a path: kind
    unavailable, exit 3."""
    e = _check(capsys, ["--store", PG, "streams"], "unavailable", 3)
    assert e["type"] == "StoreUnavailable" and "alice:***@" in e["message"]
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    e = _check(capsys, ["--store", missing, "runs", "list"], "unavailable", 3)
    assert "no store at" in e["message"]


def test_findings(
    damaged: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acting on a run whose chain has findings refuses: kind findings, exit 1 (and the
    chain key, configured, appears nowhere)."""
    monkeypatch.setenv("ARES_EVENTS_CHAIN_KEY", KEY_HEX)
    e = _check(capsys, ["--store", damaged, "runs", "resume", "run-1"], "findings", 1)
    assert e["type"] == "ChainIntegrityError" and "run-1" in e["message"]


def test_internal_error_and_abort(
    failing_commands: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug is kind internal, exit 4, the password scrubbed from its message (and from
    the traceback with -v); an abort is kind aborted, exit 130."""
    e = _check(capsys, ["--store", PG, "test-bug"], "internal", 4)
    assert e["type"] == "RuntimeError" and "bug while holding ***" in e["message"]
    assert main(["--store", PG, "-v", "test-bug", "--json"]) == 4
    out, err = capsys.readouterr()
    assert "Traceback" in err and PASSWORD not in err + out
    assert json.loads(out)["error"]["kind"] == "internal"
    _check(capsys, ["--store", PG, "test-abort"], "aborted", 130)


def test_a_conflict_is_its_own_exit_code(
    failing_commands: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another writer changing the store first is not a usage error: kind conflict, exit 5
    (the same command can succeed when run again)."""
    e = _check(
        capsys, ["--store", f"sqlite:///{tmp_path / 'c.db'}", "test-conflict"], "conflict", 5
    )
    assert e["type"] == "ConcurrencyError"


def test_a_report_with_findings_is_its_own_json_not_an_error(
    damaged: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A report that finds damage exits 1 with its report as the one object (no error
    object added)."""
    monkeypatch.setenv("ARES_EVENTS_CHAIN_KEY", KEY_HEX)
    assert main(["--store", damaged, "verify", "run-1", "--json"]) == 1
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "error" not in json.loads(out)


@pytest.mark.postgres
def test_gc_blobs_without_a_blob_store_names_the_cli_option(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the command line the way to give a blob store is --blobs or ARES_BLOBS_URL, which
    the error names (not only the Python argument); a usage error, exit 2."""
    ae.open_store(postgres_url, create=True).close()
    assert main(["--store", postgres_url, "gc-blobs", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--blobs URL" in err and "ARES_BLOBS_URL" in err
