"""Fixtures of the cell-store tests: three plain PostgreSQL servers and a Citus cluster
(a coordinator and two workers), each started once per session on free loopback ports,
and fresh cell-store URLs of each kind on them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote, urlsplit

import pytest

from tests import cell_servers, servers

KINDS = ["schemas", "servers", "citus"]
"""Cells as schemas of one server, on three plain servers, and on Citus."""


@pytest.fixture(scope="session")
def plain_cell_hosts() -> Iterator[str]:
    """Three throwaway plain PostgreSQL servers, as ``hosts=`` of a pgcells URL."""
    with cell_servers.pg_nodes(3) as ports:
        yield ",".join(f"127.0.0.1:{p}" for p in ports)


@pytest.fixture(scope="session")
def citus_ports() -> Iterator[list[int]]:
    """A throwaway Citus cluster (coordinator + 2 workers): its ports, coordinator first."""
    with cell_servers.citus_cluster(2) as (_url, ports):
        yield ports


@pytest.fixture(scope="session")
def citus_coordinator(citus_ports: list[int]) -> str:
    """The host:port of the Citus cluster's coordinator."""
    return f"127.0.0.1:{citus_ports[0]}"


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
        pw = quote(servers.TEST_PASSWORD, safe="")
        if not params:  # the usual shape: a reused store, emptied (DDL on Citus is slow)
            prefix = request.getfixturevalue("citus_reused_prefix")
            _empty_cells(coord, prefix)
        return f"citus://root:{pw}@{coord}/postgres?{query}&prefix={prefix}"
    raise ValueError(kind)


_BASE_TABLES = ("ares_events", "ares_streams", "ares_snapshots", "ares_tracking", "ares_meta")


@pytest.fixture(scope="session")
def citus_reused_prefix(citus_coordinator: str) -> str:
    """The schema prefix of the one Citus cell store the tests reuse, emptied before each
    (creating three distributed schemas costs about 3 s; emptying them, milliseconds)."""
    import ares_events as ae

    prefix = f"r{uuid.uuid4().hex[:10]}"
    with ae.open_store(
        f"citus://root@{citus_coordinator}/postgres?cells=3&partitions=12&prefix={prefix}"
    ):
        pass
    return prefix


def _empty_cells(coordinator: str, prefix: str) -> None:
    """Make the reused store as new: no events, heads, snapshots, tracking, identity or
    read-model tables (the schema version and the cell map stay)."""
    import psycopg
    from psycopg import sql

    host, _, port = coordinator.rpartition(":")
    with psycopg.connect(
        host=host, port=port, user="root", dbname="postgres", autocommit=True
    ) as c:
        for i in range(3):
            s = sql.Identifier(f"{prefix}_{i + 1}")
            c.execute(
                sql.SQL(
                    "TRUNCATE {s}.ares_events, {s}.ares_streams, {s}.ares_snapshots, "
                    "{s}.ares_tracking"
                ).format(s=s)
            )
            c.execute(
                sql.SQL(
                    "DELETE FROM {s}.ares_meta WHERE key NOT IN ('schema_version', 'ares.cells')"
                ).format(s=s)
            )
            rows = c.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s AND NOT tablename = ANY(%s)",
                (f"{prefix}_{i + 1}", list(_BASE_TABLES)),
            ).fetchall()
            for (name,) in rows:
                c.execute(sql.SQL("DROP TABLE {s}.{t}").format(s=s, t=sql.Identifier(name)))
