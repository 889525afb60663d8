"""The snapshot contract on the asyncio face (``async_store.snapshots``), through the
blocking face of :mod:`ares_events.testing.blocking`: one suite, both faces."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ares_events.testing import SnapshotContract
from ares_events.testing.blocking import BlockingStore
from tests.fixtures.fix_backends import _params, open_async_backend


@pytest.fixture(params=_params(["memory", "sqlite", "postgres"]))
def backend(request: pytest.FixtureRequest) -> str:
    """The three systems of record (snapshots are never cached)."""
    return str(request.param)


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BlockingStore]:
    """A fresh async store of each backend, behind its blocking face."""
    with open_async_backend(backend, tmp_path, request) as s:
        yield s


class TestAsyncSnapshotContract(SnapshotContract):
    """The snapshot contract on memory, SQLite and PostgreSQL, asyncio face."""
