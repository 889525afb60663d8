"""Shared pieces of the framework adapter tests: the store URL of each backend and the
async store opened on it."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

FW_BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def fw_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store URL of ``backend`` (memory URLs are named, so a second open shares)."""
    if backend == "memory":
        return f"memory://fw-{uuid.uuid4().hex}"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/fw.db"
    return str(request.getfixturevalue("postgres_url"))


def tamper_sqlite(db: Path, old: str, new: str) -> None:
    """Replace ``old`` by ``new`` in the first stored payload holding it (a rewrite behind
    the store's back, as an attacker with the file would)."""
    con = sqlite3.connect(db)
    try:
        for pos, payload in con.execute(
            "SELECT position, payload FROM ares_events ORDER BY position"
        ).fetchall():
            text = bytes(payload).decode()
            if old in text:
                con.execute(
                    "UPDATE ares_events SET payload = ? WHERE position = ?",
                    (text.replace(old, new).encode(), pos),
                )
                con.commit()
                return
        raise AssertionError(f"no payload holds {old!r}")
    finally:
        con.close()
