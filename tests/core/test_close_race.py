"""Closing a store while other threads use it, as a race: many iterations in a child
process (tests/children/close_race_child.py), so a crash fails the test instead of the run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# Many iterations in child processes: the full suite runs them, the quick tier does not.
pytestmark = pytest.mark.slow

ITERATIONS = 150
ROOT = Path(__file__).resolve().parents[2]


def _race(
    backend: str, url: str, child: str = "tests.children.close_race_child"
) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-m", child, backend, url, str(ITERATIONS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode in (0, 1), (
        f"the child died with {proc.returncode} (a crash, e.g. SIGSEGV is -11):\n"
        f"{proc.stderr[-3000:]}"
    )
    summary: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["problems"] == [], summary
    assert proc.returncode == 0
    return summary


def test_sqlite_close_while_threads_append_and_read(tmp_path: Path) -> None:
    """SQLite: 150 closes under concurrent appends, reads, read_all and snapshot loads:
    no crash, only StoreClosed, no connection left, nothing written after close()."""
    summary = _race("sqlite", f"sqlite:///{tmp_path / 'race.db'}")
    tally = summary["tally"]
    assert isinstance(tally, dict)
    # The race really raced: calls succeeded and calls were cut off by close().
    assert tally.get("append.ok", 0) > 0 and tally.get("read.ok", 0) > 0
    assert sum(v for k, v in tally.items() if k.endswith(".closed")) >= ITERATIONS


@pytest.mark.postgres
def test_postgres_close_while_threads_append_and_read(postgres_url: str) -> None:
    """PostgreSQL: the same race; no session of the store's pool outlives close()."""
    summary = _race("postgres", postgres_url)
    tally = summary["tally"]
    assert isinstance(tally, dict)
    assert tally.get("append.ok", 0) > 0 and tally.get("read.ok", 0) > 0
    assert sum(v for k, v in tally.items() if k.endswith(".closed")) >= ITERATIONS


# -- the asyncio store: close() while tasks append, read, subscribe and wait -----------------

ASYNC_CHILD = "tests.children.async_close_race_child"


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_async_close_while_tasks_append_read_and_subscribe(backend: str, tmp_path: Path) -> None:
    """The async store (memory, SQLite): 150 closes under concurrent tasks appending,
    reading, paging read_all, loading snapshots, subscribing and waiting: every task ends
    with success or StoreClosed, none hangs, no connection is left, nothing is written
    after close()."""
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path / 'race.db'}"
    summary = _race(backend, url, ASYNC_CHILD)
    tally = summary["tally"]
    assert isinstance(tally, dict)
    assert tally.get("append.ok", 0) > 0 and tally.get("read.ok", 0) > 0
    assert sum(v for k, v in tally.items() if k.endswith(".closed")) >= ITERATIONS


@pytest.mark.postgres
def test_async_postgres_close_while_tasks_append_read_and_subscribe(postgres_url: str) -> None:
    """The async PostgreSQL store: the same race; no session of its pool or its LISTEN
    connection outlives close()."""
    summary = _race("postgres", postgres_url, ASYNC_CHILD)
    tally = summary["tally"]
    assert isinstance(tally, dict)
    assert tally.get("append.ok", 0) > 0 and tally.get("read.ok", 0) > 0
    assert sum(v for k, v in tally.items() if k.endswith(".closed")) >= ITERATIONS
