"""The whole side-by-side table in ONE run: ares-events (blocking and asyncio faces),
eventsourcing 9.x and the bare drivers (psycopg 3, sqlite3) on the same machine, the same
~300-byte payloads, the systems of each workload interleaved (A B C, C B A, ...).

Run from the repository root::

    .venv/bin/python -m bench.run_all              # 7 repeats, rewrites docs/performance.md
    .venv/bin/python -m bench.run_all --quick      # small sizes, 3 repeats, writes nothing
    .venv/bin/python -m bench.run_all --reps 9 --admin-url postgresql://...

``scripts/bench`` runs the first line. The server comes from ``--admin-url``, else
``ARES_BENCH_POSTGRES_URL``, else ``postgresql://root@127.0.0.1:5432/postgres``; the run
creates throwaway databases and drops them. SQLite files go to the system temp dir.

Every figure is the median over the repeats with its spread (min-max) and a ratio
column; the goals of issue 14 are checked against the same run (met / short). The
floors are the bare drivers writing or reading the same rows (the same 12 columns and
the same three unique indexes as ``ares_events``) with no validation, no chain, no
head row: what the database itself costs on this machine.

The workload functions are those of ``bench_postgres``, ``bench_sqlite`` and
``bench_async``; this module adds the floors, the asyncio face and the one table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psycopg

import ares_events as ae
from ares_events.core.events import uuid7
from bench import bench_postgres as bp
from bench import bench_sqlite as bs
from bench.common import (
    Timing,
    interleave,
    machine_description,
    markdown_table,
    throwaway_db,
    timed,
    write_section,
)

DEFAULT_ADMIN_URL = "postgresql://root@127.0.0.1:5432/postgres"
SECTION = "summary"


def log(msg: str) -> None:
    print(f"[run_all] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sizes:
    single: int  # 1-event appends per rep
    batches: int  # 100-event batches per rep
    streams: int  # 10-event appends, one per stream, per rep
    writers: int  # 1-event appends per writer thread per rep
    replay: int  # events in the read fixture
    tail_calls: int
    reps: int
    audit: int = 1_000_000  # events in the audit fixture (1,000 streams)


FULL = Sizes(
    single=300, batches=100, streams=1000, writers=200, replay=100_000, tail_calls=100, reps=7
)
QUICK = Sizes(
    single=50, batches=10, streams=100, writers=40, replay=5_000, tail_calls=20, reps=3,
    audit=20_000,
)  # fmt: skip
AUDIT_STREAMS = 1000
AUDIT_REPS = 3  # an audit of a million events is long enough to need fewer repeats

# The same table as ares_events (schema step 0), for the floors.
BARE_TABLE = """CREATE TABLE {t} (
    position bigint PRIMARY KEY, stream_id text NOT NULL, version bigint NOT NULL,
    event_id uuid NOT NULL UNIQUE, type text NOT NULL, module text NOT NULL, payload bytea,
    payload_ref text, metadata bytea NOT NULL, recorded_at text NOT NULL,
    prev_hash bytea NOT NULL, hash bytea NOT NULL, UNIQUE (stream_id, version))"""
BARE_INSERT = (
    "INSERT INTO {t} (position, stream_id, version, event_id, type, module, payload, "
    "payload_ref, metadata, recorded_at, prev_hash, hash) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
)
BARE_COPY = (
    "COPY {t} (position, stream_id, version, event_id, type, module, payload, payload_ref, "
    "metadata, recorded_at, prev_hash, hash) FROM STDIN (FORMAT BINARY)"
)
SQLITE_TABLE = """CREATE TABLE ares_events (position INTEGER PRIMARY KEY,
    stream_id TEXT NOT NULL, version INTEGER NOT NULL, event_id TEXT NOT NULL UNIQUE,
    type TEXT NOT NULL, module TEXT NOT NULL, payload BLOB, payload_ref TEXT,
    metadata BLOB NOT NULL, recorded_at TEXT NOT NULL, prev_hash BLOB NOT NULL,
    hash BLOB NOT NULL, UNIQUE (stream_id, version))"""
SQLITE_INSERT = "INSERT INTO ares_events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_AT = "2026-01-01T00:00:00.000000Z"
_H = b"\x01" * 32


def _ordered_id() -> uuid.UUID:
    """A time-ordered UUIDv7, as ares-events gives every event by default (a random
    UUIDv4 would make the floor's event-id index inserts scattered, and slower)."""
    return uuid7()


def _row(pos: int, sid: str, version: int, payload: bytes) -> tuple[Any, ...]:
    return (
        pos,
        sid,
        version,
        _ordered_id(),
        bp.EV_TYPE,
        bp.EV_MODULE,
        payload,
        None,
        b"{}",
        _AT,
        _H,
        _H,
    )


# -- PostgreSQL floors ----------------------------------------------------------------------


@contextlib.contextmanager
def bare_table(db: str) -> Iterator[tuple[psycopg.Connection[Any], str]]:
    t = f"bare_{uuid.uuid4().hex[:8]}"
    conn = psycopg.connect(db, autocommit=True)
    try:
        conn.execute(BARE_TABLE.format(t=t))
        yield conn, t
    finally:
        conn.execute(f"DROP TABLE IF EXISTS {t}")
        conn.close()


def pg_bare_single(db: str, pl: bp.Payloads, n: int) -> tuple[float, float]:
    """One prepared binary INSERT per transaction (autocommit), the same row."""
    with bare_table(db) as (conn, t):
        q, states = BARE_INSERT.format(t=t), pl.states
        rows = [_row(v, "agent-1", v + 1, states[v]) for v in range(n)]

        def run() -> None:
            for r in rows:
                conn.execute(q, r, prepare=True, binary=True)

        return timed(run)[:2]


def pg_bare_copy(
    db: str, pl: bp.Payloads, count: int, size: int, streams: bool
) -> tuple[float, float]:
    """One binary COPY per transaction: ``count`` batches of ``size`` rows (to one stream,
    or each batch to its own stream)."""
    with bare_table(db) as (conn, t):
        q, states = BARE_COPY.format(t=t), pl.states
        batches = [
            [
                _row(
                    b * size + i,
                    f"agent-{b}" if streams else "agent-1",
                    (i if streams else b * size + i) + 1,
                    states[b * size + i],
                )
                for i in range(size)
            ]
            for b in range(count)
        ]

        def run() -> None:
            for batch in batches:
                with conn.transaction(), conn.cursor().copy(q) as cp:
                    cp.set_types(
                        [
                            "int8",
                            "text",
                            "int8",
                            "uuid",
                            "text",
                            "text",
                            "bytea",
                            "text",
                            "bytea",
                            "text",
                            "bytea",
                            "bytea",
                        ]
                    )
                    for r in batch:
                        cp.write_row(r)

        return timed(run)[:2]


def pg_bare_replay(fx: bp.ReadFixtures) -> tuple[int, int]:
    """The same columns ours reads, fetched with psycopg, decoded with orjson, folded."""
    state = (0, 0)
    cur = fx.bare.cursor(binary=True)
    cur.execute(
        "SELECT stream_id, version, position, event_id::text, type, module, payload, metadata, "
        "recorded_at, prev_hash, hash, payload_ref FROM read_ours.ares_events "
        "WHERE stream_id = %s ORDER BY version",
        (fx.sid,),
    )
    for row in cur:
        state = bp.fold_payload(state, orjson.loads(row[6]))
    return state


# -- the asyncio face -----------------------------------------------------------------------


def async_appends(db: str, pl: bp.Payloads, count: int, size: int) -> tuple[float, float]:
    """The asyncio store, one task: ``count`` appends of ``size`` events to one stream."""
    schema = bp.fresh_schema("async")
    url = f"{db}?schema={schema}&pool_max=4"

    async def scenario() -> tuple[float, float]:
        async with await ae.open_async_store(url) as store:
            dicts = pl.dicts

            async def run() -> None:
                for b in range(count):
                    evs = [bp._new(p) for p in dicts[b * size : (b + 1) * size]]
                    await store.append("agent-1", evs, expected_version=b * size)

            c0, t0 = time.process_time(), time.perf_counter()
            await run()
            return time.perf_counter() - t0, time.process_time() - c0

    try:
        return asyncio.run(scenario())
    finally:
        with psycopg.connect(db, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# -- SQLite floors --------------------------------------------------------------------------


def sqlite_bare_batches(
    root: Path, pl: bp.Payloads, count: int, size: int, streams: bool = False
) -> tuple[float, float]:
    """sqlite3, WAL, synchronous FULL, the same table in a file of the same 2 KiB pages:
    one executemany per BEGIN IMMEDIATE (``streams``: each batch to a stream of its own)."""
    d = Path(tempfile.mkdtemp(prefix="bare-", dir=root))
    conn = sqlite3.connect(d / "events.db", isolation_level=None)
    try:
        conn.execute("PRAGMA page_size=2048")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(SQLITE_TABLE)
        batches = [
            [
                (
                    b * size + i + 1,
                    f"agent-{b}" if streams else "agent-1",
                    i + 1 if streams else b * size + i + 1,
                    str(_ordered_id()),
                    bp.EV_TYPE,
                    bp.EV_MODULE,
                    pl.states[b * size + i],
                    None,
                    b"{}",
                    _AT,
                    _H,
                    _H,
                )
                for i in range(size)
            ]
            for b in range(count)
        ]

        def run() -> None:
            for batch in batches:
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(SQLITE_INSERT, batch)
                conn.execute("COMMIT")

        return timed(run)[:2]
    finally:
        conn.close()
        shutil.rmtree(d, ignore_errors=True)


_BARE_READS: dict[str, sqlite3.Connection] = {}


def _bare_conn(fx: bs.ReadFixtures) -> sqlite3.Connection:
    """A plain sqlite3 connection to the fixture's file (one per file, kept open)."""
    path = str(fx.ours.path)
    conn = _BARE_READS.get(path)
    if conn is None:
        conn = _BARE_READS[path] = sqlite3.connect(path, check_same_thread=False)
    return conn


def sqlite_bare_replay(fx: bs.ReadFixtures) -> tuple[int, int]:
    """The floor of issue 33: the payload column only, orjson.loads and the fold."""
    state = (0, 0)
    fold, loads = bs.fold_payload, orjson.loads
    for (payload,) in _bare_conn(fx).execute(
        "SELECT payload FROM ares_events WHERE stream_id = ? ORDER BY version", (fx.sid,)
    ):
        state = fold(state, loads(payload))
    return state


def sqlite_bare_replay_all(fx: bs.ReadFixtures) -> tuple[int, int]:
    """The same, reading every column ours reads."""
    state = (0, 0)
    fold, loads = bs.fold_payload, orjson.loads
    for row in _bare_conn(fx).execute(
        "SELECT stream_id, version, position, event_id, type, module, payload, metadata, "
        "recorded_at, prev_hash, hash, payload_ref FROM ares_events WHERE stream_id = ? "
        "ORDER BY version",
        (fx.sid,),
    ):
        state = fold(state, loads(row[6]))
    return state


# -- the verifier with and without its native half ------------------------------------------


def native_verifier() -> bool:
    """True when the optional native verifier (``ares_events._native``) loaded."""
    from ares_events import chain

    return chain._native is not None


def pure_python(fn: Callable[[], tuple[float, float]]) -> Callable[[], tuple[float, float]]:
    """``fn`` run with the native verifier switched off (the pure-Python reference)."""
    from ares_events import chain

    def run() -> tuple[float, float]:
        saved, chain._native = chain._native, None
        try:
            return fn()
        finally:
            chain._native = saved

    return run


# -- the audit -------------------------------------------------------------------------------


def build_audit_store(url: str, pl: bp.Payloads, events: int) -> ae.EventStore:
    """A store of ``events`` events over AUDIT_STREAMS streams (1,000-event appends,
    untimed), opened for the audit."""
    store = ae.open_store(url)
    per = max(1, events // AUDIT_STREAMS)
    chunk = min(per, 1000)
    n = len(pl.dicts)
    i = 0
    for s in range(AUDIT_STREAMS):
        for b in range(0, per, chunk):
            evs = [
                ae.NewEvent(type="step", module="agent", payload=pl.dicts[(i + k) % n])
                for k in range(min(chunk, per - b))
            ]
            store.append(f"agent-{s:04d}", evs, expected_version=b)
            i += len(evs)
    return store


def audit_run(store: ae.EventStore, events: int) -> Callable[[], tuple[float, float]]:
    """One full audit (every chain, the global order, the uniqueness scan)."""

    def run() -> tuple[float, float]:
        secs, cpu, report = timed(lambda: ae.integrity.audit(store))
        if not report.ok or report.events_checked != events:
            raise RuntimeError(f"bad audit: {report.findings[:3]} {report.events_checked}")
        return secs, cpu

    return run


def sqlite_bare_tail(fx: bs.ReadFixtures, k: int) -> int:
    """The last ``k`` rows, the columns ours reads, on the store's own connection."""
    rows = (
        _bare_conn(fx)
        .execute(
            "SELECT stream_id, version, position, event_id, type, module, payload, metadata, "
            "recorded_at, prev_hash, hash, payload_ref FROM ares_events WHERE stream_id = ? "
            "AND version >= ? AND version <= ? ORDER BY version LIMIT ?",
            (fx.sid, fx.n - k + 1, 2**62, k),
        )
        .fetchall()
    )
    return len(rows)


# -- the table ------------------------------------------------------------------------------


@dataclass
class Workload:
    """One workload: its systems' timings, how many events one repetition handles, and
    whether figures are rates (appends) or times (reads)."""

    key: str
    title: str
    timings: dict[str, Timing]
    events: int
    rate: bool = True
    notes: dict[str, str] = field(default_factory=dict)

    def value(self, system: str) -> float:
        """Median rate (events/s) or median time (s)."""
        m = self.timings[system].median
        return self.events / m if self.rate else m

    def spread(self, system: str) -> tuple[float, float]:
        s = self.timings[system].wall.samples
        lo, hi = min(s), max(s)
        return (self.events / hi, self.events / lo) if self.rate else (lo, hi)

    def ratio(self, system: str, peer: str) -> float:
        """> 1: ``system`` is faster than ``peer``."""
        a, b = self.value(system), self.value(peer)
        return a / b if self.rate else b / a


def _fmt(w: Workload, x: float) -> str:
    if w.rate:
        return f"{x:,.0f} ev/s"
    ms = x * 1e3
    return f"{ms:,.3f} ms" if ms < 10 else f"{ms:,.1f} ms"


LABELS = {
    "ours": "ares-events",
    "ours_async": "ares-events, asyncio face",
    "ours_1": "ares-events, 1 writer (same total)",
    "ours_nn": "ares-events, `notify=false`",
    "ours_nn_1": "ares-events, `notify=false`, 1 writer (same total)",
    "ours_noverify": "ares-events, `verify=False`",
    "ours_py": "ares-events, pure-Python verifier",
    "es": "eventsourcing",
    "bare": "bare driver (floor)",
    "bare_all": "bare driver",
}


def table(workloads: list[Workload]) -> str:
    rows = []
    for w in workloads:
        for sysname in w.timings:
            lo, hi = w.spread(sysname)
            vs_es = (
                f"{w.ratio(sysname, 'es'):.2f}x" if "es" in w.timings and sysname != "es" else ""
            )
            vs_floor = (
                f"{w.ratio(sysname, 'bare'):.2f}x"
                if "bare" in w.timings and sysname != "bare"
                else ""
            )
            cpu = w.timings[sysname].cpu.median / w.events * 1e6
            rows.append(
                [
                    w.title if sysname == next(iter(w.timings)) else "",
                    LABELS[sysname] + (f" ({w.notes[sysname]})" if sysname in w.notes else ""),
                    f"**{_fmt(w, w.value(sysname))}**",
                    f"{_fmt(w, lo)} – {_fmt(w, hi)}",
                    f"{cpu:,.1f}",
                    vs_es,
                    vs_floor,
                ]
            )
    return markdown_table(
        [
            "Workload",
            "System",
            "Median",
            "Spread (min – max)",
            "CPU µs/event",
            "vs eventsourcing",
            "vs floor",
        ],
        rows,
    )


@dataclass
class Goal:
    text: str
    measured: float
    target: float
    higher_is_better: bool
    reason: str

    @property
    def met(self) -> bool:
        return (
            self.measured >= self.target if self.higher_is_better else self.measured <= self.target
        )


# Why a goal is short: from the profiles behind docs/performance.md ("Where the time goes").
REASONS = {
    "pg_single": (
        "not the server any more: our one statement costs the server what the bare INSERT "
        "does (within noise, measured without the client library); the gap is client CPU "
        "on 2 shared cores: the unit of work (~13 µs), validation, canonical JSON and the "
        "chain (~10 µs), the protocol steps (~10 µs) and psycopg sending 17 parameters"
    ),
    "pg_batch": (
        "client CPU ~11 µs/event (event and id creation 2.6, validation + canonical JSON "
        "1.6, blake3 digest + link 1.4, sealing 1.4, arrays ~3) on top of the server's "
        "~14 µs/event for rows with three unique indexes (what the COPY floor pays)"
    ),
    "pg_streams": (
        "as for 100-event batches, and each 10-event append pays its own head row and "
        "fsync'd commit"
    ),
    "pg_writers": (
        "2 cores shared by the server, both writer threads (which also contend for the "
        "GIL) and other jobs; NOTIFY serializes commits on the server's notification lock "
        "(compare the notify=false rows)"
    ),
    "replay_vs_es": (
        "eventsourcing's json.loads replay is itself only ~2x the floor on this machine "
        "(its row is a plain SELECT and a decode), so 2x eventsourcing would need a "
        "verified replay faster than the unverified bare read; the verified replay "
        "carries the chain check (two blake3 hashes and a header per event) on top"
    ),
    "replay_verified": (
        "with the native verifier (ares_events._native: canonical header and both "
        "BLAKE3 hashes in C, portable code without SIMD) the chain check costs about what "
        "hashing ~700 bytes an event costs; the rest is a RecordedEvent per row, the "
        "payload decode and the page loop (compare the pure-Python verifier's row, which "
        "pays ~6 blake3 binding calls an event)"
    ),
    "replay_unverified": (
        "a RecordedEvent per row (a tuple and its lazy-decode cell) and the page loop"
    ),
    "sqlite_batch": (
        "SQLite's insert of our 12-column row and its two secondary indexes (a batch whose "
        "events share type, module and metadata binds four values a row, other batches ten); "
        "the client's part is ~1.5 µs an event (canonical JSON, two BLAKE3 hashes, the event "
        "and its id; one C pass each)"
    ),
    "pg_tail": (
        "turning 100 rows into RecordedEvent objects, the unit of work and the argument checks"
    ),
    "sqlite_single": (
        "an fsync'd commit on both sides decides it; the append's five statements (BEGIN "
        "IMMEDIATE, the head read, the insert into four B-trees, the head upsert, COMMIT) "
        "run in one native call, their SQLite work is the format's, and 2 KiB pages halve "
        "the bytes its commit writes (see SQLite page size)"
    ),
    "sqlite_streams": (
        "the pages each commit writes: 30 interleaved repeats measured apart put us at "
        "0.96x (single repeats 0.82-1.13x); the same CPU to within ~3% (~150 µs an append, "
        "half of it the kernel's), but a commit of ours changes more pages (the rows, "
        "their stream and event-id index entries, the stream's head) than one into "
        "eventsourcing's one clustered table: 21 writes an append against 15 (strace), "
        "and ~40% more checkpoint syncs; 2 KiB pages (see SQLite page size) make it ~4% "
        "less, cache_size, mmap_size and wal_autocheckpoint nothing measurable"
    ),
    "sqlite_replay": (
        "per event: reading the 12 columns a verifiable event needs instead of one ~0.9 µs "
        "more than the floor's read, the chain check ~0.3 (a page's hashes lanes-wide in C), "
        "the RecordedEvent (built in C), its lazy decode and the loop ~0.3"
    ),
    "sqlite_replay_es": (
        "eventsourcing's json.loads replay reads one column; ours reads the twelve a "
        "verifiable event needs (~0.9 µs an event more) before any check, from 2 KiB "
        "pages (~4% more to read than 4 KiB, see SQLite page size): our unverified "
        "replay is within a few percent of the verified one"
    ),
}


# (workload, goal, system, peer, target, higher is better, reason key)
GOALS: list[tuple[str, str, str, str, float, bool, str]] = [
    ("pg_single", "PostgreSQL 1-event appends >= 0.8x the bare psycopg insert",
     "ours", "bare", 0.8, True, "pg_single"),
    ("pg_batch", "PostgreSQL 100-event batches >= 2.3x eventsourcing", "ours", "es", 2.3, True,
     "pg_batch"),
    ("pg_streams", "PostgreSQL 10-event appends over many streams >= 2x eventsourcing",
     "ours", "es", 2.0, True, "pg_streams"),
    ("pg_writers", "Two writers on different streams >= 1.5x our single writer",
     "ours", "ours_1", 1.5, True, "pg_writers"),
    # Issue 20: reads at the driver's speed.
    ("pg_replay", "PostgreSQL verified replay >= 2x eventsourcing (json.loads)",
     "ours", "es", 2.0, True, "replay_vs_es"),
    ("pg_replay", "PostgreSQL verified replay within 2x the bare driver + orjson (ours / bare)",
     "ours", "bare", 2.0, False, "replay_verified"),
    ("pg_replay", "PostgreSQL replay, verification off, within 1.5x the floor (ours / bare)",
     "ours_noverify", "bare", 1.5, False, "replay_unverified"),
    ("pg_tail", "PostgreSQL last 100 of the long stream within 1.5x a bare read (ours / bare)",
     "ours", "bare", 1.5, False, "pg_tail"),
    ("sqlite_tail", "SQLite last 100 of the long stream within 1.5x a bare read (ours / bare)",
     "ours", "bare", 1.5, False, "pg_tail"),
    # Issue 33: the embedded default at the peer's speed (synchronous=FULL).
    ("sqlite_single", "SQLite 1-event appends >= 1.0x eventsourcing", "ours", "es", 1.0, True,
     "sqlite_single"),
    ("sqlite_batch", "SQLite 100-event batches >= 0.8x eventsourcing", "ours", "es", 0.8, True,
     "sqlite_batch"),
    ("sqlite_streams", "SQLite 10-event appends over 1,000 streams >= 1.0x eventsourcing",
     "ours", "es", 1.0, True, "sqlite_streams"),
    ("sqlite_replay", "SQLite verified replay within 2.5x the bare payload read + orjson + fold "
     "(ours / bare)", "ours", "bare", 2.5, False, "sqlite_replay"),
    ("sqlite_replay", "SQLite verified replay >= 2x eventsourcing (json.loads)",
     "ours", "es", 2.0, True, "sqlite_replay_es"),
]  # fmt: skip


def goals(w: dict[str, Workload]) -> list[Goal]:
    """The goals (issues 14 and 20) whose workloads ran. "Within" goals are time ratios
    (ours / peer, lower is better)."""
    out = []
    for key, text, a, b, target, higher, why in GOALS:
        if key in w and a in w[key].timings and b in w[key].timings:
            r = w[key].ratio(a, b)
            out.append(Goal(text, r if higher else 1 / r, target, higher, REASONS[why]))
    return out


def goals_table(gs: list[Goal]) -> str:
    rows = []
    for g in gs:
        rows.append(
            [
                g.text,
                f"{g.measured:.2f}x",
                "**met**" if g.met else "**short**",
                "" if g.met else g.reason,
            ]
        )
    return markdown_table(["Goal", "Measured", "", "Where the time goes (when short)"], rows)


# -- the run --------------------------------------------------------------------------------


def run(sz: Sizes, admin_url: str, only: set[str] | None = None) -> list[Workload]:
    """Every workload (or those whose key is in ``only``), in a fixed order."""
    need = max(sz.single, sz.batches * 100, sz.streams * 10, 2 * sz.writers, sz.replay)
    pl = bp.Payloads.make(need)
    spl = bs.Payloads(pl.dicts, pl.states)
    out: list[Workload] = []

    def want(*keys: str) -> bool:
        return only is None or any(k in only for k in keys)

    def py(run: Callable[[], tuple[float, float]]) -> dict[str, Any]:
        """The same run on the pure-Python verifier, when the native one is what ran."""
        return {"ours_py": pure_python(run)} if native_verifier() else {}

    def add(key: str, title: str, systems: dict[str, Any], events: int, **kw: Any) -> None:
        if want(key):
            log(f"{title} x {sz.reps}")
            out.append(Workload(key, title, interleave(systems, sz.reps), events, **kw))

    def add_audit(key: str, title: str, store: ae.EventStore) -> None:
        reps = min(sz.reps, AUDIT_REPS)
        log(f"{title} x {reps}")
        run_one = audit_run(store, sz.audit)
        systems = {"ours": run_one, **py(run_one)}
        out.append(Workload(key, title, interleave(systems, reps), sz.audit))

    copy_note = {"bare": "binary COPY"}
    nn = "&notify=false"
    read_notes = {"es": "json.loads", "bare": "no verification, orjson"}
    with throwaway_db(admin_url, "ours") as ours_db, throwaway_db(admin_url, "theirs") as es_db:
        lat: list[float] = []
        add(
            "pg_single",
            f"PostgreSQL: 1-event appends ({sz.single}/rep)",
            {
                "ours": lambda: bp.single_ours(ours_db, pl, sz.single, lat),
                "ours_async": lambda: async_appends(ours_db, pl, sz.single, 1),
                "es": lambda: bp.single_theirs(es_db, pl, sz.single, lat),
                "bare": lambda: pg_bare_single(ours_db, pl, sz.single),
            },
            sz.single,
        )
        add(
            "pg_batch",
            f"PostgreSQL: 100-event batches ({sz.batches}/rep)",
            {
                "ours": lambda: bp.batches_ours(ours_db, pl, sz.batches, 100),
                "ours_async": lambda: async_appends(ours_db, pl, sz.batches, 100),
                "es": lambda: bp.batches_theirs(es_db, pl, sz.batches, 100),
                "bare": lambda: pg_bare_copy(ours_db, pl, sz.batches, 100, False),
            },
            sz.batches * 100,
            notes=copy_note,
        )
        add(
            "pg_streams",
            f"PostgreSQL: 10-event appends over {sz.streams} streams",
            {
                "ours": lambda: bp.streams_ours(ours_db, pl, sz.streams, 10),
                "es": lambda: bp.streams_theirs(es_db, pl, sz.streams, 10),
                "bare": lambda: pg_bare_copy(ours_db, pl, sz.streams, 10, True),
            },
            sz.streams * 10,
            notes=copy_note,
        )
        add(
            "pg_writers",
            "PostgreSQL: 2 writer threads, 1-event appends to own streams",
            {
                "ours": lambda: bp.writers_ours(ours_db, pl, sz.writers, 2),
                "ours_1": lambda: bp.writers_ours(ours_db, pl, 2 * sz.writers, 1),
                "es": lambda: bp.writers_theirs(es_db, pl, sz.writers, 2),
                "ours_nn": lambda: bp.writers_ours(ours_db, pl, sz.writers, 2, nn),
                "ours_nn_1": lambda: bp.writers_ours(ours_db, pl, 2 * sz.writers, 1, nn),
            },
            2 * sz.writers,
        )
        if want("pg_replay", "pg_tail"):
            log(f"PostgreSQL read fixture: {sz.replay:,} events")
            fx = bp.ReadFixtures(ours_db, es_db, pl, sz.replay)
            try:
                add(
                    "pg_replay",
                    f"PostgreSQL: replay of {sz.replay:,} events (read + verify + decode + fold)",
                    {
                        "ours": bp._checked(fx.replay_ours, fx.expected),
                        **py(bp._checked(fx.replay_ours, fx.expected)),
                        "ours_noverify": bp._checked(fx.replay_ours_noverify, fx.expected),
                        "es": bp._checked(fx.replay_theirs, fx.expected),
                        "bare": bp._checked(lambda: pg_bare_replay(fx), fx.expected),
                    },
                    sz.replay,
                    rate=False,
                    notes=read_notes,
                )
                tl: list[float] = []
                calls = sz.tail_calls
                add(
                    "pg_tail",
                    f"PostgreSQL: last 100 of {sz.replay:,}, per call",
                    {
                        "ours": bp._latencies(lambda: fx.tail_ours(100), calls, 100, tl),
                        "es": bp._latencies(lambda: fx.tail_theirs(100), calls, 100, tl),
                        "bare": bp._latencies(lambda: fx.tail_bare(100), calls, 100, tl),
                    },
                    100,
                    rate=False,
                    notes={"bare": "same columns, one connection"},
                )

            finally:
                fx.close()
        if want("pg_audit"):
            log(f"PostgreSQL audit fixture: {sz.audit:,} events")
            astore = build_audit_store(f"{ours_db}?schema=audit", pl, sz.audit)
            try:
                add_audit(
                    "pg_audit",
                    f"PostgreSQL: audit of {sz.audit:,} events ({AUDIT_STREAMS:,} streams)",
                    astore,
                )
            finally:
                astore.close()

    root = Path(tempfile.mkdtemp(prefix="ares-bench-"))
    try:
        add(
            "sqlite_batch",
            f"SQLite: 100-event batches ({sz.batches}/rep)",
            {
                "ours": lambda: bs.batches_ours(root, spl, sz.batches, 100),
                "es": lambda: bs.batches_theirs(root, spl, sz.batches, 100),
                "bare": lambda: sqlite_bare_batches(root, pl, sz.batches, 100),
            },
            sz.batches * 100,
            notes={"bare": "executemany"},
        )
        lat2: list[float] = []
        add(
            "sqlite_single",
            f"SQLite: 1-event appends ({sz.single}/rep)",
            {
                "ours": lambda: bs.single_ours(root, spl, sz.single, lat2),
                "es": lambda: bs.single_theirs(root, spl, sz.single, lat2),
                "bare": lambda: sqlite_bare_batches(root, pl, sz.single, 1),
            },
            sz.single,
        )
        add(
            "sqlite_streams",
            f"SQLite: 10-event appends over {sz.streams} streams",
            {
                "ours": lambda: bs.streams_ours(root, spl, sz.streams, 10, 1),
                "es": lambda: bs.streams_theirs(root, spl, sz.streams, 10, 1),
                "bare": lambda: sqlite_bare_batches(root, pl, sz.streams, 10, streams=True),
            },
            sz.streams * 10,
            notes={"bare": "executemany"},
        )
        add(
            "sqlite_writers_one",
            "SQLite: 2 writer threads, 1-event appends to ONE stream (expected version, "
            "retried on conflict)",
            {
                "ours": lambda: bs.writers_ours(root, spl, sz.writers, 2, True),
                "es": lambda: bs.writers_theirs(root, spl, sz.writers, 2, True),
            },
            2 * sz.writers,
        )
        add(
            "sqlite_writers_own",
            "SQLite: 2 writer threads, 1-event appends to own streams",
            {
                "ours": lambda: bs.writers_ours(root, spl, sz.writers, 2, False),
                "es": lambda: bs.writers_theirs(root, spl, sz.writers, 2, False),
            },
            2 * sz.writers,
        )
        if want("sqlite_replay"):
            log(f"SQLite read fixture: {sz.replay:,} events")
            sfx = bs.ReadFixtures(root, spl, sz.replay)
            try:
                add(
                    "sqlite_replay",
                    f"SQLite: replay of {sz.replay:,} events (read + verify + decode + fold)",
                    {
                        "ours": bs._checked(sfx.replay_ours, sfx.expected),
                        **py(bs._checked(sfx.replay_ours, sfx.expected)),
                        "ours_noverify": bs._checked(sfx.replay_ours_noverify, sfx.expected),
                        "es": bs._checked(sfx.replay_theirs, sfx.expected),
                        "bare": bs._checked(lambda: sqlite_bare_replay(sfx), sfx.expected),
                        "bare_all": bs._checked(lambda: sqlite_bare_replay_all(sfx), sfx.expected),
                    },
                    sz.replay,
                    rate=False,
                    notes={
                        **read_notes,
                        "bare": "payload column only, orjson",
                        "bare_all": "every column ours reads, orjson",
                    },
                )
                stl: list[float] = []
                calls = sz.tail_calls
                add(
                    "sqlite_tail",
                    f"SQLite: last 100 of {sz.replay:,}, per call",
                    {
                        "ours": bp._latencies(lambda: sfx.tail_count(100), calls, 100, stl),
                        "es": bp._latencies(lambda: sfx.tail_theirs_count(100), calls, 100, stl),
                        "bare": bp._latencies(lambda: sqlite_bare_tail(sfx, 100), calls, 100, stl),
                    },
                    100,
                    rate=False,
                    notes={"bare": "same columns, its own connection"},
                )
            finally:
                sfx.close()
        if want("sqlite_audit"):
            log(f"SQLite audit fixture: {sz.audit:,} events")
            astore = build_audit_store(f"sqlite:///{root / 'audit.db'}", pl, sz.audit)
            try:
                add_audit(
                    "sqlite_audit",
                    f"SQLite: audit of {sz.audit:,} events ({AUDIT_STREAMS:,} streams)",
                    astore,
                )
            finally:
                astore.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def render(sz: Sizes, ws: list[Workload], load: tuple[str, str]) -> str:
    m = machine_description(("psycopg",))
    by_key = {w.key: w for w in ws}
    gs = goals(by_key)
    facts = markdown_table(
        ["", ""],
        [
            ["Command", "`.venv/bin/python -m bench.run_all` (or `scripts/bench`)"],
            ["Date", m["date"]],
            ["Machine", f"{m['cpu']}, {m['os']}"],
            [
                "Load average (1 min) before / after",
                f"{load[0]} / {load[1]} (2 cores, shared with other jobs)",
            ],
            ["Software", f"{m['python']}, SQLite {m['sqlite']}, {m['libraries']}"],
            [
                "Repeats",
                f"{sz.reps} per system, systems interleaved; median shown, spread = min – max",
            ],
            [
                "Durability",
                "PostgreSQL fsync and synchronous_commit on; SQLite WAL + synchronous FULL "
                "(ours, bare); eventsourcing with its defaults",
            ],
        ],
    )
    return "\n\n".join(
        [
            facts,
            "Rates in events/s (higher is better), reads in milliseconds (lower is better). "
            'The ratio columns are always "how many times faster than" (> 1: faster).',
            table(ws),
            "#### Goals (issues 14, 20 and 33), measured in this run",
            goals_table(gs),
        ]
    )


def _load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="small sizes, 3 repeats; print only")
    ap.add_argument("--reps", type=int, default=None, help="repeats per system (default 7)")
    ap.add_argument("--admin-url", default=None, help="PostgreSQL server (database postgres)")
    ap.add_argument("--no-write", action="store_true", help="print the tables only")
    ap.add_argument(
        "--only", default=None, help="comma-separated workload keys (implies --no-write)"
    )
    args = ap.parse_args(argv)
    sz = QUICK if args.quick else FULL
    if args.reps:
        sz = Sizes(**{**sz.__dict__, "reps": args.reps})
    admin = args.admin_url or os.environ.get("ARES_BENCH_POSTGRES_URL") or DEFAULT_ADMIN_URL
    before = _load()
    log(f"load average before: {before}")
    ws = run(sz, admin, set(args.only.split(",")) if args.only else None)
    body = render(sz, ws, (before, _load()))
    print(body)
    if not (args.quick or args.no_write or args.only):
        write_section(SECTION, body, title="Summary: everything side by side")
        log("docs/performance.md updated (section 'summary')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
