"""ares-events on PostgreSQL vs the ``eventsourcing`` library's Postgres recorder, same
server, same run, same ~300-byte JSON payloads.

Run from the repository root::

    .venv/bin/python -m bench.bench_postgres            # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_postgres --quick    # small sizes, smoke run, writes nothing
    .venv/bin/python -m bench.bench_postgres --admin-url postgresql://root@127.0.0.1:5432/postgres

The server comes from ``--admin-url``, else ``ARES_BENCH_POSTGRES_URL``, else
``postgresql://root@127.0.0.1:5432/postgres``. The run creates two throwaway databases (one
per system) and drops them at the end; each repetition of an append workload uses a fresh
schema. ``fsync`` and ``synchronous_commit`` are the server's (reported; both on here).

Systems:

* ``ours``: ``ae.open_store("postgresql://...?schema=...")`` with its defaults (unkeyed
  blake3 chain on, per-stream advisory lock, xid-ordered positions, NOTIFY on commit).
  Every append validates, canonical-JSON encodes and chains its events, checks
  ``expected_version`` and upserts the stream head, in one transaction.
* ``eventsourcing``: ``eventsourcing.postgres.PostgresApplicationRecorder`` over a
  ``PostgresDatastore`` with its defaults (``LOCK TABLE ... IN EXCLUSIVE MODE`` and NOTIFY on
  every insert). ``StoredEvent`` objects are built directly with ``state`` = the same
  canonical JSON bytes, pre-encoded outside the timed region: the recorder level, no
  aggregates, no transcoder.

Workloads (full / ``--quick``):

a. 1-event appends, one transaction each, one stream (300 / 50 per rep).
b. 100-event batches into one stream (100 / 20 batches per rep).
c. 10-event appends over 1000 streams (1000 / 100 appends per rep).
d. 2 writer threads, each appending 1-event transactions to its own stream (2x200 / 2x40),
   vs theirs with 2 threads, and vs our single writer doing the same total.
e. full replay of a 100k-event stream (100k / 5k): ours ``ae.replay`` (read + verify + fold);
   theirs ``select_events`` + ``json.loads`` + the same fold.
f. the last 100 events of that stream: p50 latency of ``store.read`` (materialized
   ``RecordedEvent`` objects) vs a bare psycopg query returning the same rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import psycopg
from eventsourcing.persistence import StoredEvent
from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

import ares_events as ae
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
    timed,
    write_section,
)

TOPIC = "bench.agent:ToolResult"
EV_TYPE = "tool.result"
EV_MODULE = "bench"
DEFAULT_ADMIN_URL = "postgresql://root@127.0.0.1:5432/postgres"


@dataclass(frozen=True)
class Sizes:
    """Workload sizes and repetition counts."""

    single_n: int
    batch_count: int
    batch_size: int
    streams: int
    stream_batch: int
    thread_n: int
    replay_n: int
    tail_n: int
    tail_calls: int
    append_reps: int
    read_reps: int


FULL = Sizes(300, 100, 100, 1000, 10, 200, 100_000, 100, 100, 7, 5)
QUICK = Sizes(50, 20, 100, 100, 10, 40, 5_000, 100, 20, 3, 3)


def log(msg: str) -> None:
    print(f"[bench_postgres] {msg}", file=sys.stderr, flush=True)


# -- the fold both systems run -------------------------------------------------------------


def fold_payload(state: tuple[int, int], p: dict[str, Any]) -> tuple[int, int]:
    """Count ``ok`` payloads and sum their completion tokens."""
    if p["ok"]:
        return state[0] + 1, state[1] + p["tokens"]["completion"]
    return state


def fold_ours(state: tuple[int, int], e: ae.RecordedEvent) -> tuple[int, int]:
    """The fold over our ``RecordedEvent`` (decodes the payload, lazily, with orjson)."""
    return fold_payload(state, e.payload)


@dataclass
class Payloads:
    """The same payloads for both systems: dicts for ours, pre-encoded bytes for theirs."""

    dicts: list[dict[str, Any]]
    states: list[bytes]

    @classmethod
    def make(cls, n: int) -> Payloads:
        dicts = make_payloads(n)
        return cls(dicts, [canonical_bytes(p) for p in dicts])


# -- databases and the two systems ---------------------------------------------------------


class Ours:
    """ares-events on PostgreSQL, defaults, in a fresh schema."""

    def __init__(self, db_url: str, schema: str, pool_max: int = 4, query: str = "") -> None:
        self.db_url, self.schema = db_url, schema
        self.store = ae.open_store(f"{db_url}?schema={schema}&pool_max={pool_max}{query}")

    def close(self) -> None:
        self.store.close()
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


class Theirs:
    """eventsourcing's PostgresApplicationRecorder, library defaults, in a fresh schema."""

    def __init__(self, db_url: str, schema: str, pool_size: int = 2) -> None:
        p = urlsplit(db_url)
        self.db_url, self.schema = db_url, schema
        with psycopg.connect(db_url, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        self.datastore = PostgresDatastore(
            dbname=p.path.lstrip("/"),
            host=p.hostname or "127.0.0.1",
            port=p.port or 5432,
            user=p.username or "postgres",
            password=p.password or "",
            pool_size=pool_size,
            schema=schema,
        )
        self.rec = PostgresApplicationRecorder(self.datastore)
        self.rec.create_table()

    def close(self) -> None:
        self.datastore.close()
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


_counter = [0]


def fresh_schema(prefix: str) -> str:
    _counter[0] += 1
    return f"{prefix}_{_counter[0]}"


@contextlib.contextmanager
def opened(kind: str, db_url: str, **kw: Any) -> Iterator[Any]:
    sys_: Ours | Theirs = (Ours if kind == "ours" else Theirs)(db_url, fresh_schema(kind), **kw)
    try:
        yield sys_
    finally:
        sys_.close()


def _new(p: dict[str, Any]) -> ae.NewEvent:
    return ae.NewEvent(type=EV_TYPE, module=EV_MODULE, payload=p)


# -- append workloads ------------------------------------------------------------------------


def single_ours(db: str, pl: Payloads, n: int, lat: list[float]) -> tuple[float, float]:
    with opened("ours", db) as o:
        store, dicts = o.store, pl.dicts

        def run() -> None:
            pc = time.perf_counter
            for v in range(n):
                t = pc()
                store.append("agent-1", [_new(dicts[v])], expected_version=v)
                lat.append(pc() - t)

        return timed(run)[:2]


def single_theirs(db: str, pl: Payloads, n: int, lat: list[float]) -> tuple[float, float]:
    with opened("theirs", db) as t_:
        rec, states, oid = t_.rec, pl.states, uuid.uuid4()

        def run() -> None:
            pc = time.perf_counter
            for v in range(n):
                t = pc()
                rec.insert_events([StoredEvent(oid, v + 1, TOPIC, states[v])])
                lat.append(pc() - t)

        return timed(run)[:2]


def batches_ours(db: str, pl: Payloads, count: int, size: int) -> tuple[float, float]:
    with opened("ours", db) as o:
        store, dicts = o.store, pl.dicts

        def run() -> None:
            for b in range(count):
                chunk = dicts[b * size : (b + 1) * size]
                store.append("agent-1", [_new(p) for p in chunk], expected_version=b * size)

        return timed(run)[:2]


def batches_theirs(db: str, pl: Payloads, count: int, size: int) -> tuple[float, float]:
    with opened("theirs", db) as t_:
        rec, states, oid = t_.rec, pl.states, uuid.uuid4()

        def run() -> None:
            for b in range(count):
                base = b * size
                rec.insert_events(
                    [StoredEvent(oid, base + i + 1, TOPIC, states[base + i]) for i in range(size)]
                )

        return timed(run)[:2]


def streams_ours(db: str, pl: Payloads, streams: int, size: int) -> tuple[float, float]:
    with opened("ours", db) as o:
        store, dicts = o.store, pl.dicts
        sids = [f"agent-{i:05d}" for i in range(streams)]

        def run() -> None:
            for k, sid in enumerate(sids):
                base = k * size
                store.append(sid, [_new(dicts[base + i]) for i in range(size)], expected_version=0)

        return timed(run)[:2]


def streams_theirs(db: str, pl: Payloads, streams: int, size: int) -> tuple[float, float]:
    with opened("theirs", db) as t_:
        rec, states = t_.rec, pl.states
        oids = [uuid.uuid4() for _ in range(streams)]

        def run() -> None:
            for k, oid in enumerate(oids):
                base = k * size
                rec.insert_events(
                    [StoredEvent(oid, i + 1, TOPIC, states[base + i]) for i in range(size)]
                )

        return timed(run)[:2]


def _threads(work: Callable[[int], None], n_threads: int) -> None:
    errors: list[BaseException] = []

    def wrap(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=wrap, args=(k,)) for k in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


def writers_ours(
    db: str, pl: Payloads, n: int, n_threads: int, query: str = ""
) -> tuple[float, float]:
    """``n_threads`` threads, each ``n`` 1-event appends to its own stream."""
    with opened("ours", db, query=query) as o:
        store, dicts = o.store, pl.dicts

        def work(k: int) -> None:
            sid = f"agent-{k}"
            base = k * n
            for v in range(n):
                store.append(sid, [_new(dicts[base + v])], expected_version=v)

        return timed(lambda: _threads(work, n_threads))[:2]


def writers_theirs(db: str, pl: Payloads, n: int, n_threads: int) -> tuple[float, float]:
    with opened("theirs", db, pool_size=n_threads) as t_:
        rec, states = t_.rec, pl.states
        oids = [uuid.uuid4() for _ in range(n_threads)]

        def work(k: int) -> None:
            oid = oids[k]
            base = k * n
            for v in range(n):
                rec.insert_events([StoredEvent(oid, v + 1, TOPIC, states[base + v])])

        return timed(lambda: _threads(work, n_threads))[:2]


# -- read workloads ----------------------------------------------------------------------------


class ReadFixtures:
    """One long stream per system, built once (untimed) and read repeatedly."""

    def __init__(self, ours_db: str, theirs_db: str, pl: Payloads, n: int) -> None:
        self.n = n
        self.ours = Ours(ours_db, "read_ours")
        self.theirs = Theirs(theirs_db, "read_theirs")
        self.sid, self.oid = "agent-long", uuid.uuid4()
        store = self.ours.store
        chunk = 1000
        for b in range(0, n, chunk):
            hi = min(n, b + chunk)
            store.append(self.sid, [_new(pl.dicts[i]) for i in range(b, hi)], expected_version=b)
            self.theirs.rec.insert_events(
                [StoredEvent(self.oid, i + 1, TOPIC, pl.states[i]) for i in range(b, hi)]
            )
        for db in (ours_db, theirs_db):
            with psycopg.connect(db, autocommit=True) as c:
                c.execute("VACUUM ANALYZE")
        expected = (0, 0)
        for p in pl.dicts[:n]:
            expected = fold_payload(expected, p)
        self.expected = expected
        # The bare-psycopg peer of (f): one connection, the same columns ours selects.
        self.bare = psycopg.connect(ours_db, autocommit=True)
        self.bare_sql = (
            "SELECT stream_id, version, position, event_id::text, type, module, payload, "
            "metadata, recorded_at, prev_hash, hash, payload_ref FROM read_ours.ares_events "
            "WHERE stream_id = %s AND version >= %s AND version <= %s ORDER BY version LIMIT %s"
        )

    def replay_ours(self) -> tuple[int, int]:
        res = ae.replay(self.ours.store, self.sid, fold_ours, (0, 0), max_replay=10**7)
        if not res.ok or res.capped or res.replayed != self.n:
            raise RuntimeError(f"bad replay: {res.findings[:3]} capped={res.capped}")
        return res.state

    def replay_ours_noverify(self) -> tuple[int, int]:
        res = ae.replay(
            self.ours.store, self.sid, fold_ours, (0, 0), max_replay=10**7, verify=False
        )
        return res.state

    def replay_theirs(self) -> tuple[int, int]:
        state = (0, 0)
        for se in self.theirs.rec.select_events(self.oid):
            state = fold_payload(state, json.loads(se.state))
        return state

    def tail_ours(self, k: int) -> int:
        return len(list(self.ours.store.read(self.sid, from_version=self.n - k + 1)))

    def tail_bare(self, k: int) -> int:
        rows = self.bare.execute(
            self.bare_sql, (self.sid, self.n - k + 1, 2**62, k), binary=True
        ).fetchall()
        return len(rows)

    def tail_theirs(self, k: int) -> int:
        return len(self.theirs.rec.select_events(self.oid, gt=self.n - k))

    def close(self) -> None:
        self.bare.close()
        self.ours.close()
        self.theirs.close()


def _checked(fn: Callable[[], Any], expected: Any) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        secs, cpu, got = timed(fn)
        if got != expected:
            raise RuntimeError(f"fold result {got} != expected {expected}")
        return secs, cpu

    return run


def _latencies(
    fn: Callable[[], Any], calls: int, expected: Any, lat: list[float]
) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        def many() -> None:
            pc = time.perf_counter
            for _ in range(calls):
                t = pc()
                got = fn()
                lat.append(pc() - t)
                if got != expected:
                    raise RuntimeError(f"{got} rows != expected {expected}")

        secs, cpu, _ = timed(many)
        return secs / calls, cpu / calls

    return run


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    ours: str
    theirs: str
    ratio: float
    target: str
    met: bool
    cpu_ratio: float | None = None


def _cpu_us(t: Timing, events: int) -> str:
    return f"CPU {t.cpu.median / events * 1e6:.1f} µs/event"


def server_facts(admin_url: str) -> dict[str, str]:
    with psycopg.connect(admin_url) as c:
        version = c.execute("SHOW server_version").fetchone()
        out = {"server_version": str(version[0]) if version else "?"}
        for name in ("fsync", "synchronous_commit", "wal_sync_method", "shared_buffers"):
            row = c.execute(f"SHOW {name}").fetchone()
            out[name] = str(row[0]) if row else "?"
    return out


def run_all(sz: Sizes, ours_db: str, theirs_db: str) -> tuple[list[Row], list[Row]]:
    need = max(
        sz.single_n,
        sz.batch_count * sz.batch_size,
        sz.streams * sz.stream_batch,
        2 * sz.thread_n,
        sz.replay_n,
    )
    pl = Payloads.make(need)
    rows: list[Row] = []
    extra: list[Row] = []
    reps = sz.append_reps

    # (a) 1-event appends
    log(f"(a) {sz.single_n} single-event appends x {reps} reps")
    lat_o: list[float] = []
    lat_t: list[float] = []
    st = interleave(
        {
            "ours": lambda: single_ours(ours_db, pl, sz.single_n, lat_o),
            "theirs": lambda: single_theirs(theirs_db, pl, sz.single_n, lat_t),
        },
        reps,
    )
    ro, rt = sz.single_n / st["ours"].median, sz.single_n / st["theirs"].median
    lo, lt = Stats.of(lat_o), Stats.of(lat_t)
    rows.append(
        Row(
            f"(a) 1-event appends, 1 txn each ({sz.single_n}/rep)",
            f"{fmt_rate(ro)}<br>p50 {fmt_ms(lo.median)}, p90 {fmt_ms(lo.p90)}<br>"
            f"{_cpu_us(st['ours'], sz.single_n)}",
            f"{fmt_rate(rt)}<br>p50 {fmt_ms(lt.median)}, p90 {fmt_ms(lt.p90)}<br>"
            f"{_cpu_us(st['theirs'], sz.single_n)}",
            ro / rt,
            ">= 2.5x",
            ro / rt >= 2.5,
            st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )
    single_rate = ro

    # (b) 100-event batches
    nb = sz.batch_count * sz.batch_size
    log(f"(b) {sz.batch_count} batches of {sz.batch_size} x {reps} reps")
    st = interleave(
        {
            "ours": lambda: batches_ours(ours_db, pl, sz.batch_count, sz.batch_size),
            "theirs": lambda: batches_theirs(theirs_db, pl, sz.batch_count, sz.batch_size),
        },
        reps,
    )
    ro, rt = nb / st["ours"].median, nb / st["theirs"].median
    rows.append(
        Row(
            f"(b) {sz.batch_size}-event batches ({sz.batch_count}/rep)",
            f"{fmt_rate(ro)}<br>{fmt_ms(st['ours'].median / sz.batch_count)} per batch<br>"
            f"{_cpu_us(st['ours'], nb)}",
            f"{fmt_rate(rt)}<br>{fmt_ms(st['theirs'].median / sz.batch_count)} per batch<br>"
            f"{_cpu_us(st['theirs'], nb)}",
            ro / rt,
            ">= 2.5x",
            ro / rt >= 2.5,
            st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )

    # (c) many streams
    ns = sz.streams * sz.stream_batch
    log(f"(c) {sz.stream_batch}-event appends over {sz.streams} streams x {reps} reps")
    st = interleave(
        {
            "ours": lambda: streams_ours(ours_db, pl, sz.streams, sz.stream_batch),
            "theirs": lambda: streams_theirs(theirs_db, pl, sz.streams, sz.stream_batch),
        },
        reps,
    )
    ro, rt = ns / st["ours"].median, ns / st["theirs"].median
    rows.append(
        Row(
            f"(c) {sz.stream_batch}-event appends over {sz.streams:,} streams ({ns:,} events/rep)",
            f"{fmt_rate(ro)}<br>{_cpu_us(st['ours'], ns)}",
            f"{fmt_rate(rt)}<br>{_cpu_us(st['theirs'], ns)}",
            ro / rt,
            ">= 2x",
            ro / rt >= 2.0,
            st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )

    # (d) 2 writer threads on different streams
    nt = 2 * sz.thread_n
    log(f"(d) 2 writer threads x {sz.thread_n} 1-event appends x {reps} reps")
    st = interleave(
        {
            "ours": lambda: writers_ours(ours_db, pl, sz.thread_n, 2),
            "theirs": lambda: writers_theirs(theirs_db, pl, sz.thread_n, 2),
            "ours_1": lambda: writers_ours(ours_db, pl, nt, 1),
            "ours_nn": lambda: writers_ours(ours_db, pl, sz.thread_n, 2, "&notify=false"),
            "ours_nn1": lambda: writers_ours(ours_db, pl, nt, 1, "&notify=false"),
        },
        reps,
    )
    ro, rt, r1 = (nt / st[k].median for k in ("ours", "theirs", "ours_1"))
    rows.append(
        Row(
            f"(d) 2 writer threads, 1-event appends to their own stream ({nt}/rep)",
            f"{fmt_rate(ro)}<br>{_cpu_us(st['ours'], nt)}",
            f"{fmt_rate(rt)}<br>{_cpu_us(st['theirs'], nt)}",
            ro / rt,
            ">= 2x",
            ro / rt >= 2.0,
            st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )
    rows.append(
        Row(
            "(d') ours 2 writer threads vs ours 1 writer (same total)",
            f"{fmt_rate(ro)} (2 threads)",
            f"{fmt_rate(r1)} (1 thread; (a) gave {fmt_rate(single_rate)})",
            ro / r1,
            ">= 1.5x",
            ro / r1 >= 1.5,
        )
    )

    rn, rn1 = nt / st["ours_nn"].median, nt / st["ours_nn1"].median
    extra.append(
        Row(
            "(d'') ours with `notify=false`: 2 writer threads vs eventsourcing 2 threads; "
            "and vs ours 1 writer with `notify=false`",
            f"{fmt_rate(rn)} (2 threads)",
            f"{fmt_rate(rt)} (eventsourcing 2 threads); ours 1 thread {fmt_rate(rn1)}",
            rn / rt,
            f"2 threads / 1 thread: {fmt_ratio(rn / rn1)}",
            True,
        )
    )

    # (e) and (f) on one long stream per system
    log(f"building a {sz.replay_n:,}-event stream in each system")
    fx = ReadFixtures(ours_db, theirs_db, pl, sz.replay_n)
    try:
        log(f"(e) full replay of {sz.replay_n:,} events x {sz.read_reps} reps")
        exp = fx.expected
        st = interleave(
            {"ours": _checked(fx.replay_ours, exp), "theirs": _checked(fx.replay_theirs, exp)},
            sz.read_reps,
        )
        to, tt = st["ours"], st["theirs"]
        rows.append(
            Row(
                f"(e) full replay of a {sz.replay_n:,}-event stream: ours read+verify+fold, "
                "theirs read+`json.loads`+fold",
                f"{fmt_ms(to.median)}<br>{fmt_rate(sz.replay_n / to.median)}",
                f"{fmt_ms(tt.median)}<br>{fmt_rate(sz.replay_n / tt.median)}",
                tt.median / to.median,
                ">= 3x",
                tt.median / to.median >= 3.0,
            )
        )
        k = sz.tail_n
        log(f"(f) last {k} events, {sz.tail_calls} calls x {sz.read_reps} reps")
        lo_, lb_, lt_ = [], [], []  # type: ignore[var-annotated]
        interleave(
            {
                "ours": _latencies(lambda: fx.tail_ours(k), sz.tail_calls, k, lo_),
                "bare": _latencies(lambda: fx.tail_bare(k), sz.tail_calls, k, lb_),
                "theirs": _latencies(lambda: fx.tail_theirs(k), sz.tail_calls, k, lt_),
            },
            sz.read_reps,
        )
        so, sb, stt = Stats.of(lo_), Stats.of(lb_), Stats.of(lt_)
        rows.append(
            Row(
                f"(f) last {k} events of the {sz.replay_n:,}-event stream, p50 "
                "(theirs column: a bare psycopg query for the same rows)",
                f"p50 {fmt_ms(so.median)} (p90 {fmt_ms(so.p90)})",
                f"p50 {fmt_ms(sb.median)} (p90 {fmt_ms(sb.p90)})",
                so.median / sb.median,
                "<= 1.5x (ours / bare)",
                so.median / sb.median <= 1.5,
            )
        )
        extra.append(
            Row(
                f"(f') last {k} events: ours vs eventsourcing `select_events(gt=...)`",
                f"p50 {fmt_ms(so.median)}",
                f"p50 {fmt_ms(stt.median)}",
                stt.median / so.median,
                "",
                True,
            )
        )
    finally:
        fx.close()
    return rows, extra


def render(sz: Sizes, rows: list[Row], extra: list[Row], server: dict[str, str]) -> str:
    """The markdown of the ``postgres`` section of docs/performance.md."""
    m = machine_description(("psycopg", "psycopg-pool"))
    short = [r.workload.split(" ", 1)[0] for r in rows if not r.met]
    lines = [
        f"Measured {m['date']} by `python -m bench.bench_postgres`"
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
                    f"synchronous_commit={server['synchronous_commit']}, "
                    f"wal_sync_method={server['wal_sync_method']}",
                ),
                ("Payload", "~300 bytes of canonical JSON per event, same bytes both sides"),
                (
                    "Repetitions",
                    f"appends: {sz.append_reps} (fresh schema each), reads: {sz.read_reps}; "
                    "systems alternate, medians shown",
                ),
            ],
        ),
        "",
        "Ratio = ours / eventsourcing for rates, eventsourcing / ours for times (**> 1 means "
        "ares-events is faster**), except (d') (ours 2 threads / ours 1 thread) and (f) "
        "(ours / bare psycopg latency, lower is better).",
        "",
        markdown_table(
            ("Workload", "ares-events", "eventsourcing", "Ratio (wall)", "Ratio (CPU)", "Target"),
            [
                (
                    r.workload,
                    r.ours,
                    r.theirs,
                    f"**{fmt_ratio(r.ratio)}**",
                    fmt_ratio(r.cpu_ratio) if r.cpu_ratio is not None else "",
                    f"{r.target} {'met' if r.met else '**short**'}",
                )
                for r in rows
            ],
        ),
        "",
        markdown_table(
            ("Context", "ares-events", "eventsourcing", "Ratio", ""),
            [(r.workload, r.ours, r.theirs, fmt_ratio(r.ratio), r.target) for r in extra],
        ),
        "",
        f"Targets short in this run: {', '.join(short) if short else 'none'}.",
        "",
        *NOTES,
    ]
    return "\n".join(lines)


NOTES = [
    "Notes (why the short targets are short; read with the CPU column):",
    "",
    "- **Appends are bound by the fsync'd commit, which both systems pay.** Every append "
    "in (a), (c) and (d) is one transaction, so each waits for one WAL flush "
    "(`fsync=on`, `synchronous_commit=on`). ares-events needs one statement and one round "
    "trip per append (until schema version 5 the `ares_append()` function, since 6 one "
    "plain statement, see docs/architecture.md); "
    "eventsourcing needs two round trips and six statements, but the flush dominates "
    "both, so the wall ratio cannot approach 2.5x here: 2.5x would need our whole append "
    "to take less than a bare fsync'd `INSERT` on this machine. The CPU ratio shows our "
    "client-side cost per append (validation, canonical JSON, blake3 chain, head "
    "prediction) against theirs (no validation, no chain).",
    "- **(b) 100-event batches** are bound by server-side row and index work: each of our "
    "rows carries more (event id, type, module, metadata, time, two 32-byte hashes) and "
    "three unique indexes (position, (stream, version), event id for idempotency) against "
    "their two. Both sides insert with one `unnest` statement; COPY measured no faster "
    "than the binary `unnest` here.",
    "- **(d) several writers**: appends to different streams never wait for each other "
    "(per-stream advisory locks), but PostgreSQL serializes the commits of transactions "
    "that `NOTIFY` on one cluster-wide lock held through the WAL flush, so concurrent "
    "notifying commits cannot share a flush. eventsourcing takes the same lock plus an "
    "exclusive table lock. Row (d'') shows ours with `notify=false` (waiters poll), which "
    "lets commits overlap; on a 2-core machine that also runs the server (and, during "
    "this run, other test suites) the gain is small either way.",
    "- **(e) replay**: our read path alone is about twice as fast as theirs (binary "
    "protocol, events built from rows in one C call, no dict rows), but ours also verifies "
    "the chain (a blake3 of every payload, the header rebuilt and a blake3 link per event) "
    "while theirs only decodes JSON. 3x would mean read + verify + fold in under ~3 µs per "
    "event, and fetching the same rows with a bare psycopg query already takes ~2.5 µs per "
    "event on this machine (measured separately, 20k-event stream).",
    "- **(f) last 100 events**: one keyset query, the same one the bare peer runs; the "
    "difference is turning 100 rows into `RecordedEvent` objects, the pool checkout and "
    "the core's argument checks.",
    "- The machine is shared: other test suites ran during the measurement (load average "
    "2-7 on 2 cores). Systems alternate within each workload, so drift hits both, but "
    "p90s are noisy, and (d)/(d') move the most between runs.",
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
    with throwaway_db(admin, "ours") as ours_db, throwaway_db(admin, "theirs") as theirs_db:
        rows, extra = run_all(sz, ours_db, theirs_db)
    body = render(sz, rows, extra, server)
    print(body)
    if not args.quick and not args.no_write:
        write_section("postgres", body, title="PostgreSQL: ares-events vs eventsourcing")
        log("wrote the postgres section of docs/performance.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
