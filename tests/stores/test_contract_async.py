"""The shared conformance suite on the asyncio face: one suite, both faces.

``StoreContract`` runs unchanged against ``ae.open_async_store`` for every backend of the
blocking suite (memory, SQLite, PostgreSQL, and behind the Redis cache), through the
blocking face of :mod:`ares_events.testing.blocking`: each call is a coroutine on a private
event loop, each thread of a concurrency test a task on that loop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ares_events.testing import StoreContract
from ares_events.testing.blocking import BlockingStore
from tests.fixtures.fix_backends import open_async_backend


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[BlockingStore]:
    """A fresh, empty async store of each backend in turn, behind its blocking face."""
    with open_async_backend(backend, tmp_path, request) as s:
        yield s


class TestAsyncStoreContract(StoreContract):
    """Every behaviour all stores share, on the asyncio face."""
