"""Fixtures that open every backend for the shared conformance suite.

``store`` is parametrized over every backend; a test written once against it runs on all.
Server-backed parameters get the matching marker (``postgres``, ``redis``, ``s3``).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.recorder import backend_of
from ares_events.testing.blocking import BlockingStore, open_blocking
from tests import servers

BACKENDS = ["memory", "sqlite", "postgres", "memory+cache", "sqlite+cache"]
_MARKS = {
    "postgres": "postgres",
    "redis": "redis",
    "s3": "s3",
    "memory+cache": "redis",
    "sqlite+cache": "redis",
}


@pytest.fixture(scope="session")
def postgres_admin_url() -> Iterator[str]:
    """Admin URL of a reachable PostgreSQL server (started if needed)."""
    with servers.postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def postgres_db_url(postgres_admin_url: str) -> Iterator[str]:
    """One throwaway database per test session (dropped at the end)."""
    with servers.postgres_database(postgres_admin_url) as url:
        yield url


@pytest.fixture
def postgres_url(postgres_db_url: str) -> str:
    """A fresh schema in the session database, per test (isolation)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in postgres_db_url else "?"
    return f"{postgres_db_url}{sep}schema={schema}"


@pytest.fixture(scope="session")
def redis_base_url() -> Iterator[str]:
    """URL of a reachable Redis (started if needed), without a database number."""
    with servers.redis_server() as url:
        yield url


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """Endpoint of an S3-compatible HTTP server on loopback (moto, started per session)."""
    saved = {k: os.environ.get(k) for k in servers.s3_env()}
    os.environ.update(servers.s3_env())
    try:
        with servers.s3_server() as url:
            yield url
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def store_url_for(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store URL for ``backend`` (``X+cache``: the URL of ``X``)."""
    backend = backend.removesuffix("+cache")
    if backend == "memory":
        return "memory://"
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'events.db'}"
    if backend == "postgres":
        return str(request.getfixturevalue("postgres_url"))
    raise ValueError(backend)


@contextlib.contextmanager
def open_backend(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, **kw: object
) -> Iterator[ae.EventStore]:
    """Open a fresh store of ``backend`` and close it afterwards (``X+cache``: behind a
    Redis cache with a per-test key prefix, deleted afterwards)."""
    with contextlib.ExitStack() as stack:
        if backend.endswith("+cache") and "cache" not in kw:
            kw["cache"] = stack.enter_context(redis_cache_url(request))
        store = ae.open_store(store_url_for(backend, tmp_path, request), **kw)  # type: ignore[arg-type]
        try:
            yield store
        finally:
            store.close()


@contextlib.contextmanager
def open_async_backend(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, **kw: object
) -> Iterator[BlockingStore]:
    """Open a fresh store of ``backend`` with ``ae.open_async_store`` and yield its
    blocking face (a private event loop in a thread), so the blocking suites run on the
    async store; closed afterwards (``X+cache``: behind a Redis cache, as above)."""
    with contextlib.ExitStack() as stack:
        if backend.endswith("+cache") and "cache" not in kw:
            kw["cache"] = stack.enter_context(redis_cache_url(request))
        with open_blocking(store_url_for(backend, tmp_path, request), **kw) as store:
            yield store


@contextlib.contextmanager
def redis_cache_url(request: pytest.FixtureRequest, **params: object) -> Iterator[str]:
    """A cache URL on the test Redis with a fresh key prefix; its keys are deleted after."""
    import redis

    base = str(request.getfixturevalue("redis_base_url"))
    prefix = f"ares-test-{uuid.uuid4().hex}:"
    query = "".join(f"&{k}={v}" for k, v in params.items())
    try:
        yield f"{base}/0?prefix={prefix}{query}"
    finally:
        client = redis.Redis.from_url(f"{base}/0")
        try:
            keys = list(client.scan_iter(match=f"{prefix}*"))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def _params(names: list[str]) -> list[object]:
    return [
        pytest.param(n, marks=[getattr(pytest.mark, _MARKS[n])] if n in _MARKS else [], id=n)
        for n in names
    ]


@pytest.fixture(params=_params(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    """Name of each backend in turn."""
    return str(request.param)


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh URL of each backend in turn (memory URLs are private per open)."""
    return store_url_for(backend, tmp_path, request)


@pytest.fixture
def store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ae.EventStore]:
    """A fresh, empty store of each backend in turn."""
    with open_backend(backend, tmp_path, request) as s:
        yield s


def run_behind_store(
    store: ae.EventStore, backend: str, sqlite_sql: str, pg_sql: str, args: tuple[object, ...]
) -> None:
    """Run one statement directly against the backend's database, bypassing the store (to
    tamper with rows in tests). ``pg_sql`` may name ``{schema}``."""
    rec: Any = backend_of(store.recorder)
    name = backend.removesuffix("+cache")
    if name == "sqlite":
        conn = sqlite3.connect(str(rec.path))
        try:
            with conn:
                conn.execute(sqlite_sql, args)
        finally:
            conn.close()
    elif name == "postgres":
        from psycopg import sql

        with rec.connection() as conn, conn.transaction():
            # Tampering is what the append-only guards exist to stop: lift them for it.
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(sql.SQL(pg_sql).format(schema=sql.Identifier(rec.schema)), args)
    else:
        raise AssertionError(f"no database behind {backend}")
