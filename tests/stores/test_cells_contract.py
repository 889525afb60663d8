"""The shared conformance suites on cell stores, both faces: cells as schemas of one
PostgreSQL server, cells on three plain servers, and cells as distributed schemas of a
Citus cluster (a coordinator and two workers)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import ares_events as ae
from ares_events.testing import SnapshotContract, StoreContract
from ares_events.testing.blocking import BlockingStore, open_blocking
from tests.fixtures.fix_cells import KINDS, cells_url

# The conformance suite again on every kind of cell store: the full suite runs it.
pytestmark = pytest.mark.slow

_MARKED = [pytest.param(k, marks=[pytest.mark.postgres], id=k) for k in KINDS]


@pytest.fixture(params=_MARKED)
def cells_kind(request: pytest.FixtureRequest) -> str:
    """Each kind of cell store in turn."""
    return str(request.param)


@pytest.fixture
def store_url(cells_kind: str, request: pytest.FixtureRequest) -> str:
    """A fresh cell store's URL."""
    return cells_url(cells_kind, request)


@pytest.fixture
def store(store_url: str) -> Iterator[ae.EventStore]:
    """A fresh cell store, blocking face."""
    with ae.open_store(store_url) as s:
        yield s


class TestCellsStoreContract(StoreContract):
    """Every behaviour all stores share, on cell stores (blocking face)."""


class TestCellsSnapshotContract(SnapshotContract):
    """The snapshot store's behaviour on cell stores (blocking face)."""


class TestAsyncCellsStoreContract(StoreContract):
    """Every behaviour all stores share, on cell stores (asyncio face)."""

    @pytest.fixture
    def store(self, store_url: str) -> Iterator[BlockingStore]:
        """A fresh cell store, asyncio face behind its blocking driver."""
        with open_blocking(store_url) as s:
            yield s
