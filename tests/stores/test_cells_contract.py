"""The shared conformance suites on cell stores, both faces: cells as schemas of one
PostgreSQL server, cells on three plain servers, and cells as distributed schemas of a
Citus cluster (a coordinator and two workers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import pytest

import ares_events as ae
from ares_events.testing import SnapshotContract, StoreContract
from ares_events.testing.blocking import BlockingStore, open_blocking
from tests import cell_servers, servers

KINDS = ["schemas", "servers", "citus"]


@pytest.fixture(scope="session")
def plain_cell_hosts() -> Iterator[str]:
    """Three throwaway plain PostgreSQL servers, as ``hosts=`` of a pgcells URL."""
    with cell_servers.pg_nodes(3) as ports:
        yield ",".join(f"127.0.0.1:{p}" for p in ports)


@pytest.fixture(scope="session")
def citus_coordinator() -> Iterator[str]:
    """A throwaway Citus cluster (coordinator + 2 workers); its coordinator's host:port."""
    with cell_servers.citus_cluster(2) as (url, _ports):
        yield urlsplit(url).netloc.rpartition("@")[2]


def cells_url(kind: str, request: pytest.FixtureRequest, **params: object) -> str:
    """A fresh cell-store URL of ``kind`` (its own schema prefix: a new store)."""
    prefix = f"c{uuid.uuid4().hex[:10]}"
    query = "&".join(f"{k}={v}" for k, v in {"cells": 3, "partitions": 12, **params}.items())
    if kind == "schemas":
        db = urlsplit(str(request.getfixturevalue("postgres_db_url")))
        return f"pgcells://{db.netloc}{db.path}?{query}&prefix={prefix}"
    if kind == "servers":
        hosts = request.getfixturevalue("plain_cell_hosts")
        pw = quote(servers.TEST_PASSWORD, safe="")  # trust auth: shows only that it is hidden
        return f"pgcells://root:{pw}@/postgres?hosts={hosts}&{query}&prefix={prefix}"
    if kind == "citus":
        coord = request.getfixturevalue("citus_coordinator")
        return f"citus://root@{coord}/postgres?{query}&prefix={prefix}"
    raise ValueError(kind)


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
    def store(self, store_url: str) -> Iterator[BlockingStore]:  # type: ignore[override]
        """A fresh cell store, asyncio face behind its blocking driver."""
        with open_blocking(store_url) as s:
            yield s
