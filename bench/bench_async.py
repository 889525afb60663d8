"""Concurrent appends on PostgreSQL: the asyncio store with 32 tasks on one event-loop
thread vs the blocking store with 32 threads vs the ``eventsourcing`` library, same
server, same run, same ~300-byte JSON payloads.

Run from the repository root::

    .venv/bin/python -m bench.bench_async            # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_async --quick    # small sizes, smoke run, writes nothing

The server comes from ``--admin-url``, else ``ARES_BENCH_POSTGRES_URL``, else
``postgresql://root@127.0.0.1:5432/postgres``. The run creates two throwaway databases
(one per library) and drops them at the end; every repetition uses a fresh schema.

Systems (each: 32 writers, each appending one-event transactions to its own stream,
``expected_version`` checked on every append; pools of 32 connections for all):

* ``async``: ``await ae.open_async_store(url)``, 32 ``asyncio`` tasks on one thread
  (native psycopg ``AsyncConnection`` / ``AsyncConnectionPool``).
* ``sync``: ``ae.open_store(url)``, 32 threads.
* ``eventsourcing``: eventsourcing 9.5.6 has no asyncio recorder (the ``async_postgres``
  the issue mentions is not in this release), so its ``PostgresApplicationRecorder`` runs
  with 32 threads, ``StoredEvent`` objects pre-encoded outside the timed region.
* ``async``/``sync`` with ``notify=false`` (context): PostgreSQL serializes the commits of
  transactions that ``NOTIFY``, so the default pays for wake-ups in throughput under
  concurrency (see docs/performance.md, PostgreSQL section).

The systems alternate within each repetition (ABC, CBA, ...); medians, min-max spread and
ratios are reported, with the CPU time of this process per append.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

import ares_events as ae
from bench.bench_postgres import DEFAULT_ADMIN_URL, server_facts
from bench.common import (
    Stats,
    Timing,
    canonical_bytes,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    interleave,
    machine_description,
    make_payloads,
    markdown_table,
    throwaway_db,
    write_section,
)

TOPIC = "bench.agent:ToolResult"
WRITERS = 32


@dataclass(frozen=True)
class Sizes:
    """Appends per writer and repetitions."""

    per_writer: int
    reps: int


FULL = Sizes(per_writer=40, reps=7)
QUICK = Sizes(per_writer=8, reps=3)


def log(msg: str) -> None:
    print(f"[bench_async] {msg}", file=sys.stderr, flush=True)


_counter = [0]


def fresh_schema(prefix: str) -> str:
    _counter[0] += 1
    return f"{prefix}_{os.getpid()}_{_counter[0]}"


def drop_schema(db_url: str, schema: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _new(p: dict[str, Any]) -> ae.NewEvent:
    return ae.NewEvent(type="tool.result", module="bench", payload=p)


# -- the three systems ---------------------------------------------------------------------


def run_async(
    db: str, payloads: list[dict[str, Any]], n: int, lat: list[float], query: str
) -> tuple[float, float]:
    """32 tasks on one event loop, each ``n`` one-event appends to its own stream."""
    schema = fresh_schema("async")
    url = f"{db}?schema={schema}&pool_max={WRITERS}&pool_min={WRITERS}{query}"

    async def scenario() -> tuple[float, float]:
        async with await ae.open_async_store(url) as store:
            events = [[_new(payloads[k * n + v]) for v in range(n)] for k in range(WRITERS)]

            async def writer(k: int) -> None:
                sid = f"agent-{k}"
                pc = time.perf_counter
                for v in range(n):
                    t = pc()
                    await store.append(sid, [events[k][v]], expected_version=v)
                    lat.append(pc() - t)

            gc.collect()
            gc.disable()
            try:
                c0, t0 = time.process_time(), time.perf_counter()
                await asyncio.gather(*(writer(k) for k in range(WRITERS)))
                return time.perf_counter() - t0, time.process_time() - c0
            finally:
                gc.enable()

    try:
        return asyncio.run(scenario())
    finally:
        drop_schema(db, schema)


def _threads(work: Callable[[int], None]) -> tuple[float, float]:
    errors: list[BaseException] = []
    start = threading.Barrier(WRITERS + 1)

    def wrap(k: int) -> None:
        start.wait()
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=wrap, args=(k,)) for k in range(WRITERS)]
    for t in ts:
        t.start()
    gc.collect()
    gc.disable()
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        start.wait()
        for t in ts:
            t.join()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    finally:
        gc.enable()
    if errors:
        raise errors[0]
    return wall, cpu


def run_sync(
    db: str, payloads: list[dict[str, Any]], n: int, lat: list[float], query: str
) -> tuple[float, float]:
    """32 threads on the blocking store, each ``n`` one-event appends to its own stream."""
    schema = fresh_schema("sync")
    url = f"{db}?schema={schema}&pool_max={WRITERS}&pool_min={WRITERS}{query}"
    store = ae.open_store(url)
    try:
        events = [[_new(payloads[k * n + v]) for v in range(n)] for k in range(WRITERS)]

        def work(k: int) -> None:
            sid = f"agent-{k}"
            pc = time.perf_counter
            for v in range(n):
                t = pc()
                store.append(sid, [events[k][v]], expected_version=v)
                lat.append(pc() - t)

        return _threads(work)
    finally:
        store.close()
        drop_schema(db, schema)


def run_eventsourcing(
    db: str, states: list[bytes], n: int, lat: list[float]
) -> tuple[float, float]:
    """eventsourcing's Postgres recorder, 32 threads, each ``n`` one-event inserts."""
    schema = fresh_schema("es")
    p = urlsplit(db)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
    datastore = PostgresDatastore(
        dbname=p.path.lstrip("/"),
        host=p.hostname or "127.0.0.1",
        port=p.port or 5432,
        user=p.username or "postgres",
        password=p.password or "",
        pool_size=WRITERS,
        schema=schema,
    )
    try:
        rec = PostgresApplicationRecorder(datastore)
        rec.create_table()
        oids = [uuid.uuid4() for _ in range(WRITERS)]
        stored = [
            [StoredEvent(oids[k], v + 1, TOPIC, states[k * n + v]) for v in range(n)]
            for k in range(WRITERS)
        ]

        def work(k: int) -> None:
            pc = time.perf_counter
            for v in range(n):
                t = pc()
                rec.insert_events([stored[k][v]])
                lat.append(pc() - t)

        return _threads(work)
    finally:
        datastore.close()
        drop_schema(db, schema)


# -- the run --------------------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    label: str
    timing: Timing
    lat: Stats


def spread(t: Timing, total: int) -> str:
    rates = sorted(total / w for w in t.wall.samples)
    return f"{fmt_rate(rates[0])} .. {fmt_rate(rates[-1])}"


def run_all(sz: Sizes, ours_db: str, theirs_db: str) -> list[Result]:
    n = sz.per_writer
    total = WRITERS * n
    dicts = make_payloads(total)
    states = [canonical_bytes(p) for p in dicts]
    lats: dict[str, list[float]] = {k: [] for k in ("async", "sync", "es", "async_nn", "sync_nn")}
    log(f"{WRITERS} writers x {n} one-event appends, {sz.reps} reps")
    st = interleave(
        {
            "async": lambda: run_async(ours_db, dicts, n, lats["async"], ""),
            "sync": lambda: run_sync(ours_db, dicts, n, lats["sync"], ""),
            "es": lambda: run_eventsourcing(theirs_db, states, n, lats["es"]),
            "async_nn": lambda: run_async(ours_db, dicts, n, lats["async_nn"], "&notify=false"),
            "sync_nn": lambda: run_sync(ours_db, dicts, n, lats["sync_nn"], "&notify=false"),
        },
        sz.reps,
        progress=log,
    )
    labels = {
        "async": "ares-events async, 32 tasks on 1 event-loop thread",
        "sync": "ares-events sync, 32 threads",
        "es": "eventsourcing 9.5.6 Postgres recorder, 32 threads (it has no async recorder)",
        "async_nn": "ares-events async, 32 tasks, `notify=false`",
        "sync_nn": "ares-events sync, 32 threads, `notify=false`",
    }
    return [Result(k, labels[k], st[k], Stats.of(lats[k])) for k in labels]


def render(sz: Sizes, results: list[Result], server: dict[str, str]) -> str:
    """The markdown of the ``async`` section of docs/performance.md."""
    m = machine_description(("psycopg", "psycopg-pool"))
    n = sz.per_writer
    total = WRITERS * n
    by = {r.name: r for r in results}
    rate = {k: total / r.timing.median for k, r in by.items()}
    rows = []
    for r in results:
        rows.append(
            (
                r.label,
                f"**{fmt_rate(rate[r.name])}**",
                spread(r.timing, total),
                f"{fmt_ms(r.lat.median)} / {fmt_ms(r.lat.p90)}",
                f"{r.timing.cpu.median / total * 1e6:.0f} µs",
            )
        )
    ratios = [
        ("async / sync (the goal: >= 1.00x)", rate["async"] / rate["sync"]),
        ("async / eventsourcing", rate["async"] / rate["es"]),
        ("sync / eventsourcing", rate["sync"] / rate["es"]),
        ("async / sync, both `notify=false`", rate["async_nn"] / rate["sync_nn"]),
        (
            "CPU per append, sync / async (client side)",
            by["sync"].timing.cpu.median / by["async"].timing.cpu.median,
        ),
    ]
    lines = [
        f"Measured {m['date']} by `python -m bench.bench_async`"
        f"{' --quick' if sz is QUICK else ''}.",
        "",
        markdown_table(
            ("", ""),
            [
                ("Machine", m["cpu"]),
                ("OS", m["os"]),
                ("Python", m["python"]),
                ("Libraries", m["libraries"]),
                (
                    "Server",
                    f"PostgreSQL {server['server_version']} on the same machine (TCP "
                    f"loopback); fsync={server['fsync']}, "
                    f"synchronous_commit={server['synchronous_commit']}",
                ),
                (
                    "Workload",
                    f"{WRITERS} writers, each {n} one-event transactions to its own stream "
                    f"({total:,} appends per repetition), ~300-byte payloads, pools of "
                    f"{WRITERS} connections, a fresh schema per repetition",
                ),
                ("Repetitions", f"{sz.reps}, systems alternating; medians shown"),
            ],
        ),
        "",
        markdown_table(
            (
                "System",
                "Appends/s (median)",
                "Spread (min .. max)",
                "Latency p50 / p90",
                "CPU/append",
            ),
            rows,
        ),
        "",
        markdown_table(("Ratio (medians)", ""), [(k, f"**{fmt_ratio(v)}**") for k, v in ratios]),
        "",
        *NOTES,
    ]
    return "\n".join(lines)


NOTES = [
    "Notes:",
    "",
    "- **Where the async face loses to blocking threads** (the ratio above: below 1.00x "
    "the goal is not met on this machine; the five runs before the plain-statement "
    "append of schema 6 gave 0.88-0.96x with NOTIFY on and 0.81-0.89x with "
    "`notify=false`). Both run the same SQL, "
    "the same one-round-trip append (one plain statement) and the same pool sizes; the "
    "difference is client CPU. psycopg's asyncio path waits on the socket through the "
    "event loop (a future and two `epoll_ctl` calls per wait, in Python), its blocking "
    "path through a C `poll` loop: a bare `SELECT 1` costs about 60-90 µs of client CPU "
    "async against 25-45 µs blocking here, and a whole append about 350 µs against 300 µs "
    "(the rest is mostly the kernel's loopback send, the same for both). The server runs "
    "on the same 2 cores and is the bottleneck (its per-append work is the same for both "
    "faces), so every client microsecond is taken from it.",
    "- **What one thread buys**: 32 concurrent appenders without 32 OS threads (and without "
    "a thread per call, which the earlier `AsyncJournal` needed), faster than "
    "eventsourcing's recorder with 32 threads (1.40-1.64x over five runs). With more "
    "concurrent writers than a thread pool would hold, tasks cost far less than threads; "
    "this benchmark keeps the comparison at the issue's 32.",
    "- **`notify=false`** lets concurrent commits share a WAL flush (no NOTIFY queue lock), "
    "which raises both faces; waiters then poll (see the PostgreSQL section).",
    "- **eventsourcing 9.5.6 has no asyncio recorder** (no `async_postgres` module in this "
    "release), so its row is its `PostgresApplicationRecorder` on 32 threads.",
    "- The machine is shared with other engineers' test runs; the load average before and "
    "after the run is printed below. The systems alternate within each repetition, so "
    "drift hits all of them; spreads are wide. A first run, disturbed by a runaway "
    "process of this session at 94% CPU, was discarded.",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes; print, write nothing")
    ap.add_argument("--admin-url", default=None, help="server URL (database postgres)")
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    args = ap.parse_args(argv)
    admin = args.admin_url or os.environ.get("ARES_BENCH_POSTGRES_URL") or DEFAULT_ADMIN_URL
    sz = QUICK if args.quick else FULL
    server = server_facts(admin)
    load = os.getloadavg()
    with throwaway_db(admin, "async") as ours_db, throwaway_db(admin, "es") as theirs_db:
        results = run_all(sz, ours_db, theirs_db)
    after = os.getloadavg()
    body = render(sz, results, server)
    body += (
        f"\n\nLoad average (1 min) {load[0]:.1f} before the run, {after[0]:.1f} after, "
        f"on {os.cpu_count()} cores."
    )
    print(body)
    if not args.quick and not args.no_write:
        write_section("async", body, title="asyncio: concurrent appends on PostgreSQL")
        log("wrote the async section of docs/performance.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
