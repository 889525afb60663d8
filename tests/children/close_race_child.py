"""Child process of tests/core/test_close_race.py: close a store while other threads use it.

Run as ``python -m tests.children.close_race_child BACKEND URL ITERATIONS``. Each iteration opens
the store, starts threads that append, read, page through ``read_all`` and load
snapshots, lets them run a few milliseconds, calls ``close()`` from the main thread, then
checks:

- every call in every thread either succeeded or raised ``StoreClosed``;
- no connection of the store is open once ``close()`` returned (SQLite: no file
  descriptor on the database files; PostgreSQL: no session with the store's
  application_name);
- nothing was written after ``close()`` returned (the row count, read with a connection
  of our own, does not change while the threads wind down);
- every thread ends.

A crash (the SIGSEGV this guards against) kills this process, which fails the test
without taking the test run down. Prints one JSON summary line; exits 1 on a violation.
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import ares_events as ae


def _sqlite_path(url: str) -> str:
    return unquote(urlsplit(url).path)[1:]


def _open_fds(path: str) -> int:
    names = {path, path + "-wal", path + "-shm", path + "-journal"}
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in names:
                n += 1
        except OSError:
            continue
    return n


class Probe:
    """Counts rows and connections from outside the store under test."""

    def __init__(self, backend: str, url: str, app: str) -> None:
        self.backend, self.url, self.app = backend, url, app
        self.admin: Any = None
        if backend == "postgres":
            import psycopg

            base = url.split("?", 1)[0]
            self.admin = psycopg.connect(base, autocommit=True)
            self.schema = dict(p.split("=", 1) for p in url.split("?", 1)[1].split("&"))["schema"]

    def rows(self) -> int:
        if self.backend == "sqlite":
            conn = sqlite3.connect(_sqlite_path(self.url))
            try:
                return int(conn.execute("SELECT count(*) FROM ares_events").fetchone()[0])
            finally:
                conn.close()
        from psycopg import sql

        q = sql.SQL("SELECT count(*) FROM {}.ares_events").format(sql.Identifier(self.schema))
        return int(self.admin.execute(q).fetchone()[0])

    def connections(self) -> int:
        if self.backend == "sqlite":
            return _open_fds(os.path.abspath(_sqlite_path(self.url)))
        if self.backend == "postgres":
            deadline = time.monotonic() + 3.0
            while True:  # a backend leaves pg_stat_activity a moment after its client
                row = self.admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (self.app,),
                ).fetchone()
                n = int(row[0])
                if n == 0 or time.monotonic() > deadline:
                    return n
                time.sleep(0.02)
        return 0


def one_iteration(backend: str, url: str, probe: Probe, i: int, tally: Counter[str]) -> list[str]:
    problems: list[str] = []
    store = ae.open_store(url)
    if i == 0:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"i": -1})])
        snap = ae.projections.RecoveryStateProjection()
        ae.snapshot(store, "s", snap)
    errors: list[str] = []
    stop = threading.Event()
    go = threading.Barrier(6)
    # Every fifth iteration closes only after an append and a read have succeeded, so
    # the test's "calls succeeded" precondition holds on a loaded machine too.
    succeeded = {"append": threading.Event(), "read": threading.Event()}

    def guard(name: str, body: Any) -> None:
        go.wait()
        try:
            while not stop.is_set():
                body()
                tally[f"{name}.ok"] += 1
                if name in succeeded:
                    succeeded[name].set()
        except ae.StoreClosed:
            tally[f"{name}.closed"] += 1
        except BaseException as exc:  # anything but StoreClosed breaks the contract
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def append() -> None:
        store.append("s", [ae.NewEvent(type="t", module="m", payload={"i": i})])

    def read() -> None:
        for _ in store.read("s", limit=200):
            pass
        store.head("s")

    def read_all() -> None:
        for _ in store.read_all(limit=300):
            pass

    def snapshots() -> None:
        store.snapshots.load("s", "recovery_state")

    threads = [
        threading.Thread(target=guard, args=(name, fn), daemon=True)
        for name, fn in (
            ("append", append),
            ("append2", append),
            ("read", read),
            ("read_all", read_all),
            ("snapshots", snapshots),
        )
    ]
    for t in threads:
        t.start()
    go.wait()
    if i % 5 == 0:
        for event in succeeded.values():
            event.wait(30.0)
    time.sleep(random.uniform(0.0, 0.015))
    store.close()
    closed_at_rows = probe.rows()
    open_conns = probe.connections()
    if open_conns:
        problems.append(f"iteration {i}: {open_conns} connection(s) open after close()")
    try:
        store.append("s", [ae.NewEvent(type="t", module="m")])
        problems.append(f"iteration {i}: append after close() succeeded")
    except ae.StoreClosed:
        pass
    stop.set()
    for t in threads:
        t.join(20)
        if t.is_alive():
            problems.append(f"iteration {i}: a thread hung after close()")
    if probe.rows() != closed_at_rows:
        problems.append(f"iteration {i}: rows were written after close() returned")
    problems.extend(f"iteration {i}: {e}" for e in errors)
    return problems


def main(argv: list[str]) -> int:
    backend, url, iterations = argv[0], argv[1], int(argv[2])
    app = f"close-race-{os.getpid()}"
    if backend == "postgres":
        url += f"&application_name={app}"
    probe = Probe(backend, url, app)
    tally: Counter[str] = Counter()
    problems: list[str] = []
    for i in range(iterations):
        problems.extend(one_iteration(backend, url, probe, i, tally))
        if len(problems) > 20:
            break
    print(json.dumps({"iterations": iterations, "tally": tally, "problems": problems[:20]}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main(sys.argv[1:]))
