"""ares-events on SQLite vs the ``eventsourcing`` library's SQLite recorder, same machine,
same run, same ~300-byte JSON payloads.

Run from the repository root::

    .venv/bin/python -m bench.bench_sqlite            # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_sqlite --quick    # small sizes, smoke run, writes nothing
    .venv/bin/python -m bench.bench_sqlite --profile  # cProfile of our batch append and replay

Systems:

* ``ours``: ``ae.open_store("sqlite:////tmp/.../ours.db")`` with its defaults (WAL,
  ``synchronous=FULL``, unkeyed blake3 chain). Every append validates, canonical-JSON
  encodes and chains its events and runs in one ``BEGIN IMMEDIATE`` transaction with an
  ``expected_version`` check and a head-row upsert.
* ``eventsourcing``: ``eventsourcing.sqlite.SQLiteApplicationRecorder`` over a
  ``SQLiteDatastore`` on a file in the same temp dir, with the library's defaults (it sets
  only ``PRAGMA journal_mode=WAL``, so ``synchronous`` is SQLite's compiled default,
  reported in the output). ``StoredEvent(originator_id, originator_version, topic, state)``
  objects are built directly with ``state`` = the same canonical JSON bytes, pre-encoded
  outside the timed region. This is the recorder level, the fair peer of our store: no
  aggregates, no transcoder, no mapper.

Workloads (full / ``--quick`` sizes):

a. 1-event appends, one transaction each, one stream (300 / 50).
b. 100-event batches into one stream (100 / 20 batches).
c. 10-event appends over 1000 streams, two rounds (1000x2 / 100x1).
d. full replay of a 100k-event stream (100k / 5k): ours = ``ae.replay`` (read + verify chain
   + fold); theirs = ``select_events`` + ``json.loads(state)`` + the same fold. The fold
   counts ``ok`` payloads and sums ``tokens.completion``, so it decodes every payload.
e. the last 100 events of that stream (read + the same fold), averaged over 100 calls.

Each repetition of an append workload uses a fresh database file. Systems alternate
(A B, B A, ...) and the tables give medians (p90 where useful) over the repetitions.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from eventsourcing.persistence import StoredEvent
from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

import ares_events as ae
from bench.common import (
    PAYLOAD_TARGET_BYTES,
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
    timed,
    write_section,
)

TOPIC = "bench.agent:ToolResult"
EV_TYPE = "tool.result"
EV_MODULE = "bench"


@dataclass(frozen=True)
class Sizes:
    """Workload sizes and repetition counts."""

    single_n: int
    batch_count: int
    batch_size: int
    streams: int
    stream_batch: int
    stream_rounds: int
    replay_n: int
    tail_n: int
    tail_calls: int
    append_reps: int
    read_reps: int


FULL = Sizes(
    single_n=300,
    batch_count=100,
    batch_size=100,
    streams=1000,
    stream_batch=10,
    stream_rounds=2,
    replay_n=100_000,
    tail_n=100,
    tail_calls=100,
    append_reps=9,
    read_reps=7,
)
QUICK = Sizes(
    single_n=50,
    batch_count=20,
    batch_size=100,
    streams=100,
    stream_batch=10,
    stream_rounds=1,
    replay_n=5_000,
    tail_n=100,
    tail_calls=20,
    append_reps=3,
    read_reps=3,
)


# -- the fold both systems run -------------------------------------------------------------


def fold_payload(state: tuple[int, int], p: dict[str, Any]) -> tuple[int, int]:
    """Count ``ok`` payloads and sum their completion tokens."""
    if p["ok"]:
        return state[0] + 1, state[1] + p["tokens"]["completion"]
    return state


def fold_ours(state: tuple[int, int], e: ae.RecordedEvent) -> tuple[int, int]:
    """The fold over our ``RecordedEvent`` (decodes the payload with orjson, lazily)."""
    return fold_payload(state, e.payload)


# -- the two systems -------------------------------------------------------------------------


class Ours:
    """ares-events on a SQLite file, defaults (WAL, synchronous FULL, hashing on)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.store = ae.open_store(f"sqlite:///{path}")

    def pragma(self, name: str) -> Any:
        conn: sqlite3.Connection = self.store.recorder.connection()  # type: ignore[attr-defined]
        return conn.execute(f"PRAGMA {name}").fetchone()[0]

    def close(self) -> None:
        self.store.close()


class Theirs:
    """eventsourcing's SQLiteApplicationRecorder on a SQLite file, library defaults."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.datastore = SQLiteDatastore(db_name=str(path))
        self.rec = SQLiteApplicationRecorder(self.datastore)
        self.rec.create_table()

    def pragma(self, name: str) -> Any:
        with self.datastore.transaction(commit=False) as c:
            c.execute(f"PRAGMA {name}")
            return c.fetchone()[0]

    def close(self) -> None:
        self.datastore.close()


@contextlib.contextmanager
def opened(cls: type[Ours] | type[Theirs], root: Path) -> Iterator[Any]:
    """A fresh database of ``cls`` in its own directory under ``root``."""
    d = Path(tempfile.mkdtemp(prefix=f"{cls.__name__.lower()}-", dir=root))
    sys_ = cls(d / "events.db")
    try:
        yield sys_
    finally:
        sys_.close()
        shutil.rmtree(d, ignore_errors=True)


def dir_bytes(path: Path) -> int:
    """Total size of a database's files (main file, WAL, shm)."""
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file())


# -- workloads ---------------------------------------------------------------------------------


@dataclass
class Payloads:
    """The same payloads for both systems: dicts for ours, pre-encoded bytes for theirs."""

    dicts: list[dict[str, Any]]
    states: list[bytes]

    @classmethod
    def make(cls, n: int, target: int = PAYLOAD_TARGET_BYTES) -> Payloads:
        dicts = make_payloads(n, target=target)
        return cls(dicts, [canonical_bytes(p) for p in dicts])


def single_ours(
    root: Path, pl: Payloads, n: int, lat: list[float], system: type[Ours] = Ours
) -> tuple[float, float]:
    with opened(system, root) as o:
        store, dicts = o.store, pl.dicts

        def run() -> None:
            pc = time.perf_counter
            for v in range(1, n + 1):
                t = pc()
                store.append(
                    "agent-1",
                    [ae.NewEvent(type=EV_TYPE, module=EV_MODULE, payload=dicts[v - 1])],
                    expected_version=v - 1,
                )
                lat.append(pc() - t)

        return timed(run)[:2]


def single_theirs(root: Path, pl: Payloads, n: int, lat: list[float]) -> tuple[float, float]:
    with opened(Theirs, root) as t_:
        rec, states, oid = t_.rec, pl.states, uuid.uuid4()

        def run() -> None:
            pc = time.perf_counter
            for v in range(1, n + 1):
                t = pc()
                rec.insert_events([StoredEvent(oid, v, TOPIC, states[v - 1])])
                lat.append(pc() - t)

        return timed(run)[:2]


def batches_ours(
    root: Path, pl: Payloads, count: int, size: int, system: type[Ours] = Ours
) -> tuple[float, float]:
    with opened(system, root) as o:
        store, dicts = o.store, pl.dicts

        def run() -> None:
            for b in range(count):
                chunk = dicts[b * size : (b + 1) * size]
                store.append(
                    "agent-1",
                    [ae.NewEvent(type=EV_TYPE, module=EV_MODULE, payload=p) for p in chunk],
                    expected_version=b * size,
                )

        return timed(run)[:2]


def batches_theirs(root: Path, pl: Payloads, count: int, size: int) -> tuple[float, float]:
    with opened(Theirs, root) as t_:
        rec, states, oid = t_.rec, pl.states, uuid.uuid4()

        def run() -> None:
            for b in range(count):
                base = b * size
                rec.insert_events(
                    [StoredEvent(oid, base + i + 1, TOPIC, states[base + i]) for i in range(size)]
                )

        return timed(run)[:2]


def streams_ours(
    root: Path,
    pl: Payloads,
    streams: int,
    size: int,
    rounds: int,
    system: type[Ours] = Ours,
) -> tuple[float, float]:
    with opened(system, root) as o:
        store, dicts = o.store, pl.dicts
        sids = [f"agent-{i:05d}" for i in range(streams)]

        def run() -> None:
            k = 0
            for r in range(rounds):
                for sid in sids:
                    store.append(
                        sid,
                        [
                            ae.NewEvent(type=EV_TYPE, module=EV_MODULE, payload=dicts[k + i])
                            for i in range(size)
                        ],
                        expected_version=r * size,
                    )
                    k = (k + size) % (len(dicts) - size)

        return timed(run)[:2]


def streams_theirs(
    root: Path, pl: Payloads, streams: int, size: int, rounds: int
) -> tuple[float, float]:
    with opened(Theirs, root) as t_:
        rec, states = t_.rec, pl.states
        oids = [uuid.uuid4() for _ in range(streams)]

        def run() -> None:
            k = 0
            for r in range(rounds):
                for oid in oids:
                    rec.insert_events(
                        [
                            StoredEvent(oid, r * size + i + 1, TOPIC, states[k + i])
                            for i in range(size)
                        ]
                    )
                    k = (k + size) % (len(states) - size)

        return timed(run)[:2]


def writers_ours(
    root: Path, pl: Payloads, n: int, n_threads: int, one_stream: bool
) -> tuple[float, float]:
    """``n_threads`` threads, ``n`` 1-event appends each: to their own streams, or all to
    one stream (each append expects the version it read; a ``ConcurrencyError`` is read
    again and retried, so every thread lands ``n`` events)."""
    from bench.bench_postgres import _threads

    with opened(Ours, root) as o:
        store, dicts = o.store, pl.dicts

        def work(k: int) -> None:
            sid = "agent-1" if one_stream else f"agent-{k}"
            base, done = k * n, 0
            while done < n:
                ev = [ae.NewEvent(type=EV_TYPE, module=EV_MODULE, payload=dicts[base + done])]
                try:
                    store.append(sid, ev, expected_version=store.stream_version(sid))
                except ae.ConcurrencyError:
                    continue
                done += 1

        return timed(lambda: _threads(work, n_threads))[:2]


def writers_theirs(
    root: Path, pl: Payloads, n: int, n_threads: int, one_stream: bool
) -> tuple[float, float]:
    """As :func:`writers_ours` on eventsourcing's recorder (its IntegrityError is the
    version conflict)."""
    from eventsourcing.persistence import IntegrityError

    from bench.bench_postgres import _threads

    with opened(Theirs, root) as t_:
        rec, states = t_.rec, pl.states
        oids = [uuid.uuid4() for _ in range(n_threads)]

        def work(k: int) -> None:
            oid = oids[0] if one_stream else oids[k]
            base, done = k * n, 0
            while done < n:
                last = rec.select_events(oid, desc=True, limit=1)
                v = last[0].originator_version + 1 if last else 1
                try:
                    rec.insert_events([StoredEvent(oid, v, TOPIC, states[base + done])])
                except IntegrityError:
                    continue
                done += 1

        return timed(lambda: _threads(work, n_threads))[:2]


class ReadFixtures:
    """One 100k-event stream per system, built once (untimed) and read repeatedly."""

    def __init__(self, root: Path, pl: Payloads, n: int, system: type[Ours] = Ours) -> None:
        self.n = n
        for sub in ("read-ours", "read-theirs"):
            (root / sub).mkdir()
        self.ours = system(root / "read-ours" / "events.db")
        self.theirs = Theirs(root / "read-theirs" / "events.db")
        self.sid = "agent-long"
        self.oid = uuid.uuid4()
        chunk = 1000
        store = self.ours.store
        for b in range(0, n, chunk):
            store.append(
                self.sid,
                [
                    ae.NewEvent(type=EV_TYPE, module=EV_MODULE, payload=pl.dicts[i])
                    for i in range(b, min(n, b + chunk))
                ],
                expected_version=b,
            )
            self.theirs.rec.insert_events(
                [
                    StoredEvent(self.oid, i + 1, TOPIC, pl.states[i])
                    for i in range(b, min(n, b + chunk))
                ]
            )
        expected = (0, 0)
        for p in pl.dicts[:n]:
            expected = fold_payload(expected, p)
        self.expected = expected

    # (d) full replay
    def replay_ours(self) -> tuple[int, int]:
        res = ae.replay(self.ours.store, self.sid, fold_ours, (0, 0), max_replay=10**6)
        if not res.ok or res.capped or res.replayed != self.n:
            raise RuntimeError(f"bad replay: {res.findings[:3]} capped={res.capped}")
        return res.state

    def replay_ours_noverify(self) -> tuple[int, int]:
        res = ae.replay(
            self.ours.store, self.sid, fold_ours, (0, 0), max_replay=10**6, verify=False
        )
        return res.state

    def replay_theirs(self, loads: Callable[[bytes], Any] = json.loads) -> tuple[int, int]:
        state = (0, 0)
        for se in self.theirs.rec.select_events(self.oid):
            state = fold_payload(state, loads(se.state))
        return state

    # (e) the last 100 events
    def tail_ours(self, k: int) -> tuple[int, int]:
        state = (0, 0)
        for e in self.ours.store.read(self.sid, from_version=self.n - k + 1):
            state = fold_ours(state, e)
        return state

    def tail_count(self, k: int) -> int:
        """The last ``k`` events read (not decoded), as the PostgreSQL tail workload."""
        return len(list(self.ours.store.read(self.sid, from_version=self.n - k + 1)))

    def tail_theirs_count(self, k: int) -> int:
        return len(self.theirs.rec.select_events(self.oid, gt=self.n - k))

    def tail_ours_with_head(self, k: int) -> tuple[int, int]:
        v = self.ours.store.stream_version(self.sid)
        state = (0, 0)
        for e in self.ours.store.read(self.sid, from_version=v - k + 1):
            state = fold_ours(state, e)
        return state

    def tail_theirs(self, k: int) -> tuple[int, int]:
        state = (0, 0)
        for se in self.theirs.rec.select_events(self.oid, gt=self.n - k):
            state = fold_payload(state, json.loads(se.state))
        return state

    def close(self) -> None:
        self.ours.close()
        self.theirs.close()


def _checked(fn: Callable[[], Any], expected: Any) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        secs, cpu, got = timed(fn)
        if got != expected:
            raise RuntimeError(f"fold result {got} != expected {expected}")
        return secs, cpu

    return run


def _per_call(
    fn: Callable[[], Any], calls: int, expected: Any
) -> Callable[[], tuple[float, float]]:
    def run() -> tuple[float, float]:
        def many() -> Any:
            got = None
            for _ in range(calls):
                got = fn()
            return got

        secs, cpu, got = timed(many)
        if got != expected:
            raise RuntimeError(f"fold result {got} != expected {expected}")
        return secs / calls, cpu / calls

    return run


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    ours: str
    theirs: str
    ratio: float
    note: str = ""
    cpu_ratio: float | None = None
    """Same ratio on process CPU time (leaves out fsync waits and other processes)."""


def _cpu_us(t: Timing, events: int) -> str:
    return f"CPU {t.cpu.median / events * 1e6:.1f} µs/event"


def log(msg: str) -> None:
    print(f"[bench_sqlite] {msg}", file=sys.stderr, flush=True)


def run_all(sz: Sizes, root: Path) -> tuple[list[Row], list[Row], dict[str, Any]]:
    """Run every workload; return (main rows, extra rows, facts)."""
    need = max(
        sz.single_n,
        sz.batch_count * sz.batch_size,
        sz.streams * sz.stream_batch + sz.stream_batch,
        sz.replay_n,
    )
    pl = Payloads.make(need)
    rows: list[Row] = []
    extra: list[Row] = []
    facts: dict[str, Any] = {"payload_bytes": len(pl.states[0])}

    with opened(Ours, root) as o, opened(Theirs, root) as t:
        facts["pragmas"] = {
            name: {
                "ours": o.pragma(n_),
                "eventsourcing": t.pragma(n_),
            }
            for name, n_ in (("journal_mode", "journal_mode"), ("synchronous", "synchronous"))
        }

    # (a) 1-event appends
    log(f"(a) {sz.single_n} single-event appends x {sz.append_reps} reps")
    lat_o: list[float] = []
    lat_t: list[float] = []
    st = interleave(
        {
            "ours": lambda: single_ours(root, pl, sz.single_n, lat_o),
            "theirs": lambda: single_theirs(root, pl, sz.single_n, lat_t),
        },
        sz.append_reps,
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
            cpu_ratio=st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )

    # (b) 100-event batches
    nb = sz.batch_count * sz.batch_size
    log(f"(b) {sz.batch_count} batches of {sz.batch_size} x {sz.append_reps} reps")
    st = interleave(
        {
            "ours": lambda: batches_ours(root, pl, sz.batch_count, sz.batch_size),
            "theirs": lambda: batches_theirs(root, pl, sz.batch_count, sz.batch_size),
        },
        sz.append_reps,
    )
    ro, rt = nb / st["ours"].median, nb / st["theirs"].median
    per_o, per_t = st["ours"].median / sz.batch_count, st["theirs"].median / sz.batch_count
    rows.append(
        Row(
            f"(b) {sz.batch_size}-event batches ({sz.batch_count}/rep)",
            f"{fmt_rate(ro)}<br>{fmt_ms(per_o)} per batch "
            f"(p90 {fmt_ms(st['ours'].p90 / sz.batch_count)})<br>{_cpu_us(st['ours'], nb)}",
            f"{fmt_rate(rt)}<br>{fmt_ms(per_t)} per batch "
            f"(p90 {fmt_ms(st['theirs'].p90 / sz.batch_count)})<br>{_cpu_us(st['theirs'], nb)}",
            ro / rt,
            "target >= 1.0x",
            cpu_ratio=st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )
    facts["batch_ratio"] = ro / rt

    # (c) many streams
    ns = sz.streams * sz.stream_batch * sz.stream_rounds
    log(f"(c) {sz.stream_batch}-event appends over {sz.streams} streams x {sz.stream_rounds}")
    st = interleave(
        {
            "ours": lambda: streams_ours(root, pl, sz.streams, sz.stream_batch, sz.stream_rounds),
            "theirs": lambda: streams_theirs(
                root, pl, sz.streams, sz.stream_batch, sz.stream_rounds
            ),
        },
        sz.append_reps,
    )
    ro, rt = ns / st["ours"].median, ns / st["theirs"].median
    rows.append(
        Row(
            f"(c) {sz.stream_batch}-event appends over {sz.streams:,} streams "
            f"({sz.stream_rounds} round{'s' if sz.stream_rounds > 1 else ''}, {ns:,} events/rep)",
            f"{fmt_rate(ro)}<br>{_cpu_us(st['ours'], ns)}",
            f"{fmt_rate(rt)}<br>{_cpu_us(st['theirs'], ns)}",
            ro / rt,
            cpu_ratio=st["theirs"].cpu.median / st["ours"].cpu.median,
        )
    )

    # (d) and (e) on one long stream per system
    log(f"building a {sz.replay_n:,}-event stream in each system")
    fx = ReadFixtures(root, pl, sz.replay_n)
    try:
        facts["bytes_per_event"] = {
            "ours": dir_bytes(fx.ours.path) / sz.replay_n,
            "eventsourcing": dir_bytes(fx.theirs.path) / sz.replay_n,
        }
        log(f"(d) full replay of {sz.replay_n:,} events x {sz.read_reps} reps")
        exp = fx.expected
        st = interleave(
            {
                "ours": _checked(fx.replay_ours, exp),
                "theirs": _checked(fx.replay_theirs, exp),
                "ours_noverify": _checked(fx.replay_ours_noverify, exp),
                "theirs_orjson": _checked(lambda: fx.replay_theirs(orjson.loads), exp),
            },
            sz.read_reps,
        )
        to, tt = st["ours"], st["theirs"]
        rows.append(
            Row(
                f"(d) full replay of a {sz.replay_n:,}-event stream: "
                "ours read+verify+fold, theirs read+`json.loads`+fold",
                f"{fmt_ms(to.median)} (p90 {fmt_ms(to.p90)})<br>"
                f"{fmt_rate(sz.replay_n / to.median)}",
                f"{fmt_ms(tt.median)} (p90 {fmt_ms(tt.p90)})<br>"
                f"{fmt_rate(sz.replay_n / tt.median)}",
                tt.median / to.median,
                "target >= 1.5x",
            )
        )
        facts["replay_ratio"] = tt.median / to.median
        extra.append(
            Row(
                "(d') ours without chain verification (`verify=False`) vs theirs with `json.loads`",
                fmt_ms(st["ours_noverify"].median),
                fmt_ms(tt.median),
                tt.median / st["ours_noverify"].median,
                "cost of verification: "
                f"{fmt_ms(to.median - st['ours_noverify'].median)} per {sz.replay_n:,} events",
            )
        )
        extra.append(
            Row(
                "(d'') ours read+verify+fold vs theirs with `orjson.loads` instead of `json.loads`",
                fmt_ms(to.median),
                fmt_ms(st["theirs_orjson"].median),
                st["theirs_orjson"].median / to.median,
                "same JSON decoder on both sides",
            )
        )

        k = sz.tail_n
        exp_tail = (0, 0)
        for p in pl.dicts[sz.replay_n - k : sz.replay_n]:
            exp_tail = fold_payload(exp_tail, p)
        log(f"(e) last {k} events, {sz.tail_calls} calls x {sz.read_reps} reps")
        st = interleave(
            {
                "ours": _per_call(lambda: fx.tail_ours(k), sz.tail_calls, exp_tail),
                "theirs": _per_call(lambda: fx.tail_theirs(k), sz.tail_calls, exp_tail),
                "ours_head": _per_call(lambda: fx.tail_ours_with_head(k), sz.tail_calls, exp_tail),
            },
            sz.read_reps,
        )
        to, tt = st["ours"], st["theirs"]
        rows.append(
            Row(
                f"(e) last {k} events of the {sz.replay_n:,}-event stream (read + fold)",
                f"{fmt_ms(to.median)} (p90 {fmt_ms(to.p90)})",
                f"{fmt_ms(tt.median)} (p90 {fmt_ms(tt.p90)})",
                tt.median / to.median,
            )
        )
        extra.append(
            Row(
                f"(e') ours last {k} including the `stream_version()` head lookup",
                fmt_ms(st["ours_head"].median),
                fmt_ms(tt.median),
                tt.median / st["ours_head"].median,
                "theirs is given the version",
            )
        )
    finally:
        fx.close()
    return rows, extra, facts


def render(sz: Sizes, rows: list[Row], extra: list[Row], facts: dict[str, Any]) -> str:
    """The markdown of the ``sqlite`` section of docs/performance.md."""
    m = machine_description()
    pr = facts["pragmas"]
    bpe = facts["bytes_per_event"]
    lines = [
        f"Measured {m['date']} by `python -m bench.bench_sqlite`"
        f"{' --quick' if sz is QUICK else ''}.",
        "",
        markdown_table(
            ("", ""),
            [
                ("Machine", m["cpu"]),
                ("OS", m["os"]),
                ("Python", m["python"]),
                ("SQLite", m["sqlite"]),
                ("Libraries", m["libraries"]),
                ("Payload", f"{facts['payload_bytes']} bytes of canonical JSON per event"),
                (
                    "journal_mode / synchronous",
                    f"ours: {pr['journal_mode']['ours']} / {pr['synchronous']['ours']}; "
                    f"eventsourcing: {pr['journal_mode']['eventsourcing']} / "
                    f"{pr['synchronous']['eventsourcing']} (2 = FULL, 1 = NORMAL)",
                ),
                (
                    "Repetitions",
                    f"appends: {sz.append_reps} (fresh file each), reads: {sz.read_reps}; "
                    "systems alternate, medians shown",
                ),
            ],
        ),
        "",
        "Ratio = ours / eventsourcing for rates, eventsourcing / ours for times: "
        "**> 1 means ares-events is faster**. The wall ratio is the headline; the CPU ratio "
        "(process CPU time, for the append workloads) leaves out fsync waits and other "
        "processes, so it is steadier on a shared machine and shows our own overhead.",
        "",
        markdown_table(
            (
                "Workload",
                "ares-events (SQLite)",
                "eventsourcing SQLite",
                "Ratio (wall)",
                "Ratio (CPU)",
                "Note",
            ),
            [
                (
                    r.workload,
                    r.ours,
                    r.theirs,
                    f"**{fmt_ratio(r.ratio)}**",
                    fmt_ratio(r.cpu_ratio) if r.cpu_ratio is not None else "",
                    r.note,
                )
                for r in rows
            ],
        ),
        "",
        "Breakdown rows (same run):",
        "",
        markdown_table(
            ("Variant", "ares-events", "eventsourcing", "Ratio", "Note"),
            [(r.workload, r.ours, r.theirs, fmt_ratio(r.ratio), r.note) for r in extra],
        ),
        "",
        f"On disk after the {sz.replay_n:,}-event stream (database + WAL): ours "
        f"{bpe['ours']:.0f} bytes/event, eventsourcing {bpe['eventsourcing']:.0f} bytes/event "
        "(ours also stores event id, type, module, metadata, time, prev hash and hash).",
        "",
        "Targets (issue 2):",
        "",
    ]
    br, rr = facts["batch_ratio"], facts["replay_ratio"]
    lines.append(
        f"- 100-event batches >= 1.0x eventsourcing: **{fmt_ratio(br)}, "
        f"{'met' if br >= 1.0 else 'NOT met'}**."
    )
    lines.append(
        f"- full read + verify + fold of {sz.replay_n:,} >= 1.5x eventsourcing read + "
        f"json decode + fold: **{fmt_ratio(rr)}, {'met' if rr >= 1.5 else 'NOT met'}**."
    )
    return "\n".join(lines)


def profile(root: Path, sz: Sizes, top: int) -> None:
    """cProfile our 100-event batch append and our full replay; print the hotspots."""
    pl = Payloads.make(max(sz.batch_count * sz.batch_size, sz.replay_n))
    for title, fn in (
        (
            f"ours: {sz.batch_count} x {sz.batch_size}-event batches",
            lambda: batches_ours(root, pl, sz.batch_count, sz.batch_size),
        ),
    ):
        _profiled(title, fn, top)
    fx = ReadFixtures(root, pl, sz.replay_n)
    try:
        _profiled(f"ours: replay of {sz.replay_n:,} events", fx.replay_ours, top)
    finally:
        fx.close()


def _profiled(title: str, fn: Callable[[], Any], top: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    ps = pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime")
    ps.print_stats(top)
    print(f"\n===== {title} (sorted by tottime) =====")
    print(buf.getvalue())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_sqlite", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    ap.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the table to docs/performance.md (default: yes for full runs, no for --quick)",
    )
    ap.add_argument("--dir", type=Path, default=None, help="where to put the temp databases")
    ap.add_argument("--profile", action="store_true", help="cProfile ours instead of comparing")
    ap.add_argument("--top", type=int, default=25, help="rows per profile")
    args = ap.parse_args(argv)
    sz = QUICK if args.quick else FULL
    root = Path(tempfile.mkdtemp(prefix="ares-bench-", dir=args.dir))
    try:
        if args.profile:
            profile(root, sz, args.top)
            return 0
        t0 = time.perf_counter()
        rows, extra, facts = run_all(sz, root)
        body = render(sz, rows, extra, facts)
        print(body)
        log(f"done in {time.perf_counter() - t0:.0f}s")
        if args.write if args.write is not None else not args.quick:
            write_section("sqlite", body, title="SQLite: ares-events vs eventsourcing")
            log("wrote section 'sqlite' of docs/performance.md")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
