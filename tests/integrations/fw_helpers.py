"""Shared pieces of the framework adapter tests: the store URL of each backend, the
async store opened on it, and a death inside a tool (:class:`Killed`, :func:`dies`)."""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest


class Killed(BaseException):
    """What a kill -9 inside a tool leaves: nothing recorded after the request (the real
    kill runs in a child process: test_framework_kills.py)."""


def dies(coro: Any) -> None:
    """Run ``coro`` until the Killed it raises, then close its loop cleanly."""
    loop = asyncio.new_event_loop()
    task = loop.create_task(coro)
    try:
        with pytest.raises(Killed):
            loop.run_until_complete(task)
    finally:
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


FW_BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SHARED_BACKENDS = FW_BACKENDS[1:]
"""The backends several processes can open at once."""
ADAPTERS = ["openai-agents", "pydantic-ai", "google-adk"]
FRAMEWORKS = [f"ares_events.integrations.{a.replace('-', '_')}" for a in ADAPTERS]
"""The adapters' modules, preloaded by a fork server."""


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
