"""Tables stay readable at 80 columns (a pipe) and never cut an id (issue 29): ten runs
whose ids share a long prefix are ten different, whole, copy-pasteable ids in every table
that shows them; a table that cannot fit is printed wider rather than cut."""

from __future__ import annotations

import io
import os
import re
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich import box
from rich.console import Console
from rich.table import Table

import ares_events as ae
from ares_events.agents.journal import Journal
from ares_events.cli import main
from ares_events.cli.terminal import fitted, text
from tests.fixtures.tier import examples

PREFIX = "run-2026-12-05-customer-support-escalations-batch-"
RUNS = [f"{PREFIX}{i:04d}" for i in range(10)]
STREAM = "agent-" + "x" * 44 + "-end"


@pytest.fixture(autouse=True)
def pipe_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output goes to a pipe: rich's 80 columns, whatever the caller's terminal says."""
    for name in ("COLUMNS", "LINES", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("ARES_"):
            monkeypatch.delenv(name)


@pytest.fixture
def long_ids(tmp_path: Path) -> str:
    """Ten runs (ids 54 characters, the first 50 shared), a long-named stream with a
    snapshot, and a damaged one (findings)."""
    url = f"sqlite:///{tmp_path / 'long.db'}"
    with ae.open_store(url, create=True) as store:
        for i, run in enumerate(RUNS):
            j = Journal(store, run, code_revision="r", prompt_hash="p")
            j.patch("k", i)
            j.interrupt("awaiting approval from the on-call engineer of the support team")
        for sid in (STREAM, STREAM + "-damaged"):
            store.append(sid, [ae.NewEvent(type="task.note", module="runtime", payload={})])
            store.append(sid, [ae.NewEvent(type="note", module="runtime", payload={"a": 1})])
        ae.snapshot(store, STREAM, ae.projections.RecoveryStateProjection())
    conn = sqlite3.connect(tmp_path / "long.db")
    with conn:
        conn.execute(
            "UPDATE ares_events SET payload = CAST('{\"a\":2}' AS BLOB) WHERE stream_id = ?",
            (STREAM + "-damaged",),
        )
    conn.close()
    return url


BOX = re.compile("[\u2500-\u257f]")
"""Box-drawing characters: a table's border or header rule spans its whole width."""


def _whole(out: str, ids: list[str]) -> None:
    """Every id whole on a line; every table at most 80 columns wide."""
    lines = out.splitlines()
    for i in ids:
        assert any(i in ln for ln in lines), (i, out)
    assert all(len(ln) <= 80 for ln in lines if BOX.search(ln)), out


@pytest.mark.parametrize(
    ("argv", "ids"),
    [
        (["runs", "list"], RUNS),
        (["runs", "list", "--status", "paused"], RUNS),
        (["streams"], [*RUNS, STREAM]),
        (["snapshot", "list"], [STREAM]),
        (["snapshot", "verify"], [STREAM]),
        (["verify", STREAM + "-damaged"], [STREAM + "-damaged"]),
        (["audit"], [STREAM + "-damaged"]),
        (["tail", STREAM], [STREAM]),
        (["recover", STREAM], [STREAM]),
        (["runs", "show", RUNS[3]], [RUNS[3]]),
    ],
)
def test_every_table_keeps_ids_whole_at_80_columns(
    long_ids: str, argv: list[str], ids: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each id appears whole on one line, and no line is wider than 80 columns."""
    code = main(["--store", long_ids, *argv])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    _whole(out, ids)


def test_runs_list_drops_columns_not_ids(long_ids: str, capsys: pytest.CaptureFixture[str]) -> None:
    """At 80 columns the run ids and statuses stay; ten rows are ten different ids. (The
    damaged stream, whose first event fails its chain check, may be a run: a plain
    `runs list` shows it with its findings, exit 1, and its long id stacks the table.)"""
    assert main(["--store", long_ids, "runs", "list"]) == 1
    assert f"{STREAM}-damaged" in capsys.readouterr().out
    assert main(["--store", long_ids, "runs", "list", "--status", "paused"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if PREFIX in ln]
    assert len(rows) == 10
    assert len({ln.split()[0] for ln in rows}) == 10
    assert all("paused" in ln for ln in rows)


def test_a_table_that_cannot_fit_is_one_block_per_row(
    long_ids: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The findings of a stream whose id leaves no room for a table at 60 columns: one
    `column: value` line each, the id whole, the detail wrapped within 60 columns."""
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["--store", long_ids, "verify", STREAM + "-damaged"]) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert f" stream: {STREAM}-damaged" in lines
    assert "   kind: hash_mismatch" in lines
    # Only the summary line and the id's own line (the id alone is 62) are wider.
    assert all(len(ln) <= 60 for ln in lines if STREAM not in ln), out
    assert not BOX.search(out)


def _render(table: Table, width: int, optional: tuple[str, ...] = ()) -> str:
    buf = io.StringIO()
    console = Console(file=buf, width=width, soft_wrap=True, highlight=False)
    console.print(fitted(console, table, optional))
    return buf.getvalue()


names = st.text(st.sampled_from("abcdef-0123456789"), min_size=1, max_size=90)


@settings(max_examples=examples(150), deadline=None)
@given(
    ids=st.lists(names, min_size=1, max_size=6),
    notes=st.lists(st.text(st.sampled_from("ab cd-"), max_size=120), min_size=6, max_size=6),
    width=st.integers(20, 160),
    edge=st.booleans(),
)
def test_fitted_never_cuts_a_no_wrap_column(
    ids: list[str], notes: list[str], width: int, edge: bool
) -> None:
    """Any ids, any text, any width: every id is printed whole on one line, and no line is
    wider than the width unless it holds an id that is itself too long for it."""
    table = Table(box=box.SQUARE if edge else box.SIMPLE_HEAD, show_edge=edge)
    table.add_column("id", no_wrap=True)
    table.add_column("n", justify="right", no_wrap=True)
    table.add_column("note", overflow="fold", min_width=6)
    table.add_column("more", overflow="fold")
    for i, sid in enumerate(ids):
        table.add_row(text(sid), str(i), text(notes[i]), text(notes[-1 - i]))
    out = _render(table, width, optional=("more",))
    lines = out.splitlines()
    for sid in ids:
        assert any(sid in ln for ln in lines), (sid, out)
    # Only a line holding an id too long for the width may be wider (stacked: "  id: ").
    for ln in lines:
        if len(ln) > width:
            assert any(sid in ln and len(sid) + 6 > width for sid in ids), out
