"""`ares-events runs` and `recover` on odd input and damaged rows, as a real process on a
real SQLite file: bad input exits 2, a damaged row exits 1 with the run's findings, and
nothing is an internal error (exit 4)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.agents.journal import InDoubtToolCall, Journal
from ares_events.errors import ChainIntegrityError
from ares_events.projections.builtin import RunStateProjection

AE = str(Path(sys.executable).with_name("ares-events"))
TIMEOUT = 120  # seconds; only to turn a hang into a failure


def _lost(a: object, k: object) -> object:
    raise KeyboardInterrupt  # the process "dies" mid call: no outcome recorded


def make_store(db: Path) -> str:
    """A store holding ``run-doubt``: one model step, then a tool call in doubt (v3)."""
    url = f"sqlite:///{db}"
    with ae.open_store(url) as store:
        j = Journal(store, "run-doubt")
        j.model_call([{"role": "user", "content": "hi"}], call=lambda m, p: ("ok", {}))
        with pytest.raises(KeyboardInterrupt):
            j.tool_call("send", {"to": "x"}, call=_lost)
        j = Journal(store, "run-doubt")
        j.model_call([{"role": "user", "content": "hi"}], call=lambda m, p: ("ok", {}))
        with pytest.raises(InDoubtToolCall):
            j.tool_call("send", {"to": "x"}, call=lambda a, k: 1)
    return url


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``ares-events --store URL ARGS`` as a child process."""
    return subprocess.run(
        [AE, "--store", url, *args], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )


def damage(db: Path, sql: str) -> None:
    """Edit the SQLite file behind the library's back."""
    with sqlite3.connect(db) as c:
        c.execute(sql)
    c.close()


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("step", ["²", "¹", "٢", "run-doubt:²"])
def test_resolve_with_a_non_ascii_digit_step_is_a_usage_error(tmp_path: Path, step: str) -> None:
    """A STEP of superscript or other Unicode digits exits 2 (not 4), appending nothing."""
    url = make_store(tmp_path / "s.db")
    with ae.open_store(url) as store:
        before = list(store.streams())
    p = cli(url, "runs", "resolve", "run-doubt", step, "--not-done")
    assert p.returncode == 2, p.stderr
    assert "is not a step number" in p.stderr
    with ae.open_store(url) as store:
        assert list(store.streams()) == before


@pytest.mark.parametrize(
    "doc", ["[" * 50_000 + "]" * 50_000, '{"a":' * 20_000 + "1" + "}" * 20_000]
)
@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_resolve_with_a_deeply_nested_result_is_a_usage_error(tmp_path: Path, doc: str) -> None:
    """--result JSON nested deeper than the decoder recurses exits 2 (not 4)."""
    url = make_store(tmp_path / "s.db")
    p = cli(url, "runs", "resolve", "run-doubt", "2", "--result", doc)
    assert p.returncode == 2, p.stderr
    assert "--result" in p.stderr and "nested too deep" in p.stderr


DAMAGES = {
    "payload-not-json": "UPDATE ares_events SET payload = X'7b7b' "
    "WHERE stream_id = 'run-doubt' AND version = 3",
    "payload-not-utf8": "UPDATE ares_events SET payload = X'22ff22' "
    "WHERE stream_id = 'run-doubt' AND version = 3",
    "metadata-not-json": "UPDATE ares_events SET metadata = X'00ff' "
    "WHERE stream_id = 'run-doubt' AND version = 2",
}


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("sql", DAMAGES.values(), ids=DAMAGES.keys())
def test_runs_commands_report_a_row_that_is_not_json_as_findings(tmp_path: Path, sql: str) -> None:
    """A row whose bytes are not JSON is a chain finding: list and show exit 1 naming it,
    the actions and recover refuse with exit 1, none exits 4."""
    db = tmp_path / "s.db"
    url = make_store(db)
    damage(db, sql)
    p = cli(url, "runs", "list", "--json")
    assert p.returncode == 1, p.stderr
    listed = json.loads(p.stdout)
    assert listed["ok"] is False
    p = cli(url, "runs", "show", "run-doubt", "--json")
    assert p.returncode == 1, p.stderr
    shown = json.loads(p.stdout)
    assert any(f["kind"] == "hash_mismatch" for f in shown["findings"]), shown["findings"]
    for action in (
        ("resolve", "run-doubt", "2", "--result", "1"),
        ("resume", "run-doubt"),
        ("cancel", "run-doubt"),
    ):
        p = cli(url, "runs", *action)
        assert p.returncode == 1, (action, p.stderr)
    p = cli(url, "recover", "run-doubt")
    assert p.returncode == 1, p.stderr


@pytest.mark.parametrize("sql", DAMAGES.values(), ids=DAMAGES.keys())
def test_journal_on_a_row_that_is_not_json_raises_chain_integrity_error(
    tmp_path: Path, sql: str
) -> None:
    """Opening a Journal on a run with such a row raises ChainIntegrityError, not a
    decoder error: the row is never folded."""
    db = tmp_path / "s.db"
    url = make_store(db)
    damage(db, sql)
    with ae.open_store(url) as store:
        with pytest.raises(ChainIntegrityError) as info:
            Journal(store, "run-doubt")
        assert any(f.kind == "hash_mismatch" for f in info.value.findings)
        rep = ae.recover(store, "run-doubt", RunStateProjection())
        assert not rep.ok
        bad = {f.version for f in rep.findings if f.kind == "hash_mismatch"}
        start: list[int] = []
        folded = ae.replay(store, "run-doubt", lambda s, e: [*s, e.version], start)
        assert folded.state and bad.isdisjoint(folded.state)  # reported, never folded


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_a_run_whose_opening_type_was_edited_is_listed_with_its_findings(tmp_path: Path) -> None:
    """A run's run.started edited into another type (one column, behind the library's
    back) is not hidden: runs list shows it with findings (exit 1, was 'no runs', exit 0),
    show names the mismatch, and a Journal refuses it without writing."""
    db = tmp_path / "s.db"
    url = make_store(db)
    damage(db, "UPDATE ares_events SET type = 'note.added' WHERE version = 1")
    p = cli(url, "runs", "list", "--json")
    assert p.returncode == 1, p.stderr
    listed = json.loads(p.stdout)
    assert [r["run_id"] for r in listed["runs"]] == ["run-doubt"] and listed["ok"] is False
    p = cli(url, "runs", "show", "run-doubt", "--json")
    assert p.returncode == 1, p.stderr
    assert any(f["kind"] == "hash_mismatch" for f in json.loads(p.stdout)["findings"])
    with ae.open_store(url) as store:
        before = store.head("run-doubt")
        with pytest.raises(ChainIntegrityError):
            Journal(store, "run-doubt")
        assert store.head("run-doubt") == before


def test_a_sound_stream_that_is_not_a_run_stays_out_of_the_list(tmp_path: Path) -> None:
    """Only an opening that fails its chain check is inspected as a possible run: another
    kind of stream, intact, is neither listed nor a finding."""
    url = make_store(tmp_path / "s.db")
    with ae.open_store(url) as store:
        store.append("agent-7", [ae.NewEvent(type="agent.started", module="sup", payload={})])
    p = cli(url, "runs", "list", "--json")
    assert p.returncode == 0, p.stderr
    assert [r["run_id"] for r in json.loads(p.stdout)["runs"]] == ["run-doubt"]


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_a_cancelled_run_takes_no_verdict(tmp_path: Path) -> None:
    """`runs resolve` (a result or --not-done) on a run cancelled while a call was in doubt
    is a usage error (exit 2) appending nothing, as `runs cancel` of it is: it appended a
    verdict to the finished run."""
    url = make_store(tmp_path / "s.db")
    assert cli(url, "runs", "cancel", "run-doubt").returncode == 0
    with ae.open_store(url) as store:
        before = store.head("run-doubt")
    for verdict in (["--result", '{"ticket": 1}'], ["--not-done"]):
        p = cli(url, "runs", "resolve", "run-doubt", "2", *verdict, "--json")
        assert p.returncode == 2, p.stderr
        assert "finished run" in json.loads(p.stdout)["error"]["message"]
    with ae.open_store(url) as store:
        assert store.head("run-doubt") == before
