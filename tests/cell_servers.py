"""Throwaway PostgreSQL servers for the cell-store tests: plain servers, and a Citus
cluster (a coordinator and workers with schema-based sharding, as
``../shared/citus/cluster.sh`` starts them), each on free loopback ports, stopped after.

Citus is not in Debian's packages; ``../shared/citus/build.sh`` builds and installs it
into PostgreSQL 15 (``scripts/test`` runs it when Citus is missing). Without it the Citus
tests fail with one line saying how to install it; they are never skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import servers

PG_BIN = Path(os.environ.get("ARES_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
INSTALL_HINT = (
    "Citus is not installed in PostgreSQL 15: run ../shared/citus/build.sh "
    "(or install the citus extension), then rerun"
)


def citus_installed() -> bool:
    """True when the citus extension is installed in the PostgreSQL of :data:`PG_BIN`."""
    pg_config = PG_BIN / "pg_config"
    if not pg_config.exists():
        found = shutil.which("pg_config")
        if not found:
            return False
        pg_config = Path(found)
    try:
        lib = subprocess.run(
            [str(pg_config), "--pkglibdir"], capture_output=True, text=True, check=True
        ).stdout.strip()
        share = subprocess.run(
            [str(pg_config), "--sharedir"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return (Path(lib) / "citus.so").exists() and (Path(share) / "extension/citus.control").exists()


def require_citus() -> None:
    """Fail with :data:`INSTALL_HINT` when Citus is not installed (never skip)."""
    if not citus_installed():
        pytest.fail(INSTALL_HINT)


def _run_as() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _psql(port: int, sql: str) -> str:
    import psycopg

    with psycopg.connect(
        host="127.0.0.1", port=port, user="root", dbname="postgres", autocommit=True
    ) as conn:
        cur = conn.execute(sql)
        row = cur.fetchone() if cur.description else None
        return "" if row is None else str(row[0])


@contextlib.contextmanager
def pg_nodes(count: int, *, citus: bool = False) -> Iterator[list[int]]:
    """Start ``count`` PostgreSQL 15 servers (user root, trust auth) on free ports; yield
    the ports; stop them and remove their data afterwards."""
    initdb, pg_ctl = PG_BIN / "initdb", PG_BIN / "pg_ctl"
    if not initdb.exists():
        pytest.fail(f"no {initdb}: apt-get install postgresql-15")
    tmp = Path(tempfile.mkdtemp(prefix="ares-cells-"))
    tmp.chmod(0o755)
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres")
    started: list[Path] = []
    ports: list[int] = []
    try:
        for _ in range(count):
            port = servers.free_port()
            data = tmp / f"n{port}"
            subprocess.run(
                [
                    *_run_as(),
                    str(initdb),
                    "-D",
                    str(data),
                    "-U",
                    "root",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                ],
                check=True,
                capture_output=True,
            )
            conf = [
                "listen_addresses = '127.0.0.1'",
                f"port = {port}",
                f"unix_socket_directories = '{tmp}'",
                "max_connections = 200",
                "fsync = off",  # throwaway test servers: durability is not under test here
                "shared_buffers = 32MB",
            ]
            if citus:
                conf.insert(0, "shared_preload_libraries = 'citus'")
                conf.append("wal_level = logical")  # online moves (logical replication)
            with open(data / "postgresql.conf", "a") as f:
                f.write("\n".join(conf) + "\n")
            subprocess.run(
                [*_run_as(), str(pg_ctl), "-D", str(data), "-l", f"{data}.log", "-w", "start"],
                check=True,
                capture_output=True,
            )
            started.append(data)
            ports.append(port)
        yield ports
    finally:
        for data in started:
            subprocess.run(
                [*_run_as(), str(pg_ctl), "-D", str(data), "-m", "immediate", "-w", "stop"],
                check=False,
                capture_output=True,
            )
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def citus_cluster(workers: int = 2) -> Iterator[tuple[str, list[int]]]:
    """A coordinator and ``workers`` workers; yields the coordinator's admin URL and the
    ports (coordinator first). Skips or fails when Citus is missing (:func:`require_citus`)."""
    require_citus()
    with pg_nodes(workers + 1, citus=True) as ports:
        for p in ports:
            _psql(p, "CREATE EXTENSION IF NOT EXISTS citus")
        coord = ports[0]
        _psql(coord, f"SELECT citus_set_coordinator_host('127.0.0.1', {coord})")
        for p in ports[1:]:
            _psql(coord, f"SELECT citus_add_node('127.0.0.1', {p})")
        _psql(coord, "ALTER DATABASE postgres SET citus.enable_schema_based_sharding = on")
        yield f"postgresql://root@127.0.0.1:{coord}/postgres", ports


def add_citus_worker(coordinator_port: int, stack: contextlib.ExitStack) -> int:
    """Start one more Citus node (stopped with ``stack``) and add it as a worker."""
    (port,) = stack.enter_context(pg_nodes(1, citus=True))
    _psql(port, "CREATE EXTENSION IF NOT EXISTS citus")
    _psql(coordinator_port, f"SELECT citus_add_node('127.0.0.1', {port})")
    return port
