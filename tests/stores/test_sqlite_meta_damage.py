"""A SQLite file whose ``schema_version`` row in ``ares_meta`` is not a version number: a
damaged store (StoreError, CLI exit 3), never a ValueError or a migration from it."""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.errors import StoreError

AE = str(Path(sys.executable).with_name("ares-events"))
BAD = ["garbage", "4.0", "-1", "", "²", " 4"]


def damaged(tmp_path: Path, value: str) -> Path:
    """A store with one event whose schema_version row was rewritten to ``value``."""
    db = tmp_path / "s.db"
    with ae.open_store(f"sqlite:///{db}") as s:
        ae.emit(s, "agent-1", "agent.started", "runtime", {"instance_id": "i-1"})
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        c.execute("UPDATE ares_meta SET value = ? WHERE key = 'schema_version'", (value,))
    return db


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("read_only", [False, True])
def test_open_with_a_non_integer_schema_version_raises_store_error(
    tmp_path: Path, value: str, read_only: bool
) -> None:
    """Opening (read-write or read-only) raises StoreError naming the bad value and
    leaves the row as it was (nothing migrated)."""
    db = damaged(tmp_path, value)
    with pytest.raises(StoreError) as ei:
        ae.open_store(f"sqlite:///{db}", read_only=read_only)
    assert "schema_version" in str(ei.value) and repr(value) in str(ei.value)
    with contextlib.closing(sqlite3.connect(db)) as c:
        row = c.execute("SELECT value FROM ares_meta WHERE key = 'schema_version'").fetchone()
    assert row == (value,)


@pytest.mark.slow  # starts child processes: the whole suite runs it
@pytest.mark.parametrize("value", ["garbage", "4.0"])
@pytest.mark.parametrize("args", [("runs", "list"), ("audit",), ("recover", "agent-1")])
def test_cli_on_a_non_integer_schema_version_exits_3(
    tmp_path: Path, value: str, args: tuple[str, ...]
) -> None:
    """Every command exits 3 (store unavailable or damaged), not 4 (internal error)."""
    db = damaged(tmp_path, value)
    p = subprocess.run(
        [AE, "--store", f"sqlite:///{db}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert p.returncode == 3, p.stderr
    assert "schema_version" in p.stderr
