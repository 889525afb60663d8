"""Real servers for the test suite: PostgreSQL, Redis and an S3-compatible HTTP server.

Each finder uses a running server when there is one (URL from the environment or the
machine's default port), else starts a throwaway one from local binaries, else fails with
one line saying what to install. Nothing is ever skipped silently.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import pytest

# A password full of URL-reserved characters. The local server uses trust auth, so it is
# accepted and ignored; it still travels through every URL parser and redaction path.
TEST_PASSWORD = "p@ss:w/rd?#[]%&=+ $!"


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _wait_port(host: str, port: int, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        time.sleep(0.1)
    pytest.fail(f"{what} did not start listening on {host}:{port} within {seconds:g}s")


# -- PostgreSQL ---------------------------------------------------------------------------


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    cands = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return cands[-1] if cands else None


@contextlib.contextmanager
def postgres_server() -> Iterator[str]:
    """Yield an admin URL (database ``postgres``) of a reachable PostgreSQL server."""
    env_url = os.environ.get("ARES_TEST_POSTGRES_URL")
    if env_url:
        yield env_url
        return
    if port_open("127.0.0.1", 5432):
        yield "postgresql://root@127.0.0.1:5432/postgres"
        return
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if not (initdb and pg_ctl):
        pytest.fail(
            "no PostgreSQL at 127.0.0.1:5432 and no initdb/pg_ctl to start one: "
            "apt-get install postgresql (or set ARES_TEST_POSTGRES_URL)"
        )
    tmp = Path(tempfile.mkdtemp(prefix="ares-pg-"))
    port = free_port()
    user = "root"
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses to run as root: use the postgres account
        shutil.chown(tmp, "postgres")
        run_as = ["runuser", "-u", "postgres", "--"]
        user = "postgres"
    subprocess.run(
        [*run_as, initdb, "-D", str(tmp / "data"), "-A", "trust", "-U", user],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *run_as,
            pg_ctl,
            "-D",
            str(tmp / "data"),
            "-l",
            str(tmp / "log"),
            "-o",
            f"-p {port} -k {tmp} -c listen_addresses=127.0.0.1",
            "-w",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://{user}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(tmp / "data"), "-m", "immediate", "stop"],
            check=False,
            capture_output=True,
        )
        shutil.rmtree(tmp, ignore_errors=True)


def with_database(admin_url: str, dbname: str, password: str | None = TEST_PASSWORD) -> str:
    """``admin_url`` pointed at ``dbname``, with a (percent-encoded) password added."""
    parts = urlsplit(admin_url)
    netloc = parts.netloc
    if password is not None and "@" in netloc and ":" not in netloc.split("@")[0]:
        user, host = netloc.split("@", 1)
        netloc = f"{user}:{quote(password, safe='')}@{host}"
    return urlunsplit((parts.scheme, netloc, "/" + dbname, parts.query, ""))


@contextlib.contextmanager
def postgres_database(admin_url: str) -> Iterator[str]:
    """Create a uniquely named database, yield its URL (with a reserved-char password),
    drop it afterwards."""
    import psycopg

    name = f"ares_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(admin_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# -- Redis --------------------------------------------------------------------------------


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """Yield a Redis URL (no database number) of a reachable server."""
    env_url = os.environ.get("ARES_TEST_REDIS_URL")
    if env_url:
        yield env_url.rstrip("/")
        return
    if port_open("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379"
        return
    exe = shutil.which("redis-server")
    if not exe:
        pytest.fail(
            "no Redis at 127.0.0.1:6379 and no redis-server to start one: "
            "apt-get install redis-server (or set ARES_TEST_REDIS_URL)"
        )
    port = free_port()
    proc = subprocess.Popen(
        [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port("127.0.0.1", port, 10, "redis-server")
        yield f"redis://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


# -- S3 (moto server) ---------------------------------------------------------------------


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """Yield the endpoint URL of an S3-compatible HTTP server on loopback.

    Uses ``ARES_TEST_S3_ENDPOINT`` when set, else starts ``moto`` in server mode on a
    free port (a real HTTP server in its own process; boto3 is never patched).
    """
    env_url = os.environ.get("ARES_TEST_S3_ENDPOINT")
    if env_url:
        yield env_url
        return
    try:
        import moto.server  # noqa: F401
    except ImportError:
        pytest.fail(
            "no S3-compatible server: pip install 'moto[server]' (or set ARES_TEST_S3_ENDPOINT)"
        )
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port("127.0.0.1", port, 30, "moto server")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def s3_env() -> dict[str, str]:
    """Dummy credentials for the local S3 server, given to boto3 via its normal chain."""
    return {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
