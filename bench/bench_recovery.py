"""Snapshot-first recovery against stream length, and full projection rebuilds, on SQLite
and PostgreSQL; rebuilds next to the ``eventsourcing`` library's projection machinery.

Run from the repository root::

    .venv/bin/python -m bench.bench_recovery            # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_recovery --quick    # small sizes, smoke run, writes nothing
    .venv/bin/python -m bench.bench_recovery --only sqlite   # one backend (sqlite|postgres)
    .venv/bin/python -m bench.bench_recovery --profile  # cProfile of one recovery and one rebuild

PostgreSQL comes from ``--admin-url``, else ``ARES_BENCH_POSTGRES_URL``, else
``postgresql://root@127.0.0.1:5432/postgres``; the run creates one throwaway database and
drops it at the end.

Events: realistic agent streams (``session.created``, ``agent.started``, then cycles of
``task.created``, ``model.call.requested``/``model.responded``, ``tool.call.requested``/
``tool.returned``, ``task.completed``; every 50th cycle a death, a resurrection and a
failover), each payload padded with a ``note`` field to ~300 bytes of canonical JSON.
Events are generated deterministically from (agent, index), never held all in memory.

Part 1, recovery (``RecoveryStateProjection``), one stream per length (10k/100k/1M):

* built with 1000-event appends on a store opened with ``synchronous=normal`` (SQLite;
  setup only, measurements reopen with the default FULL), with a
  ``Snapshotter(store, [RecoveryStateProjection()], every=100)`` called after each append
  up to version N-50, then 50 more events appended without it: the stored snapshot sits at
  N-50 and recovery folds a 50-event tail (the mean tail under a snapshot every 100).
* timed: ``ae.recover(store, sid, RecoveryStateProjection(), snapshots=store.snapshots)``
  (snapshot load with its checks + tail read + chain check + head check), and
  ``ae.recover(..., snapshots=None, max_replay=2**62)`` (the whole stream). Both results are
  checked: same state and version, source, replayed count, no findings.

Part 2, full rebuild of ``AgentStateProjection`` (A agents x E events, default 1000 x 1000,
written round-robin in 50-event appends so the global log interleaves agents):

* ours: ``ares_events.projections.rebuild(store, AgentStateProjection(), from_scratch=True)``:
  ``read_all`` in 1000-event batches; per batch, load the touched rows, fold (each catalog
  event validated by its pydantic schema), upsert the changed rows and the cursor in one
  transaction; then swap the generation table in. No hash-chain check (rebuild trusts the log).
* eventsourcing: the same events, in the same global order, written through an
  ``Application``'s mapper (JSON transcoder) and recorder in the same kind of database; a
  ``Projection`` whose view is a ``SQLiteTrackingRecorder``/``PostgresTrackingRecorder``
  subclass with an ``es_agent_state`` table, folding the same state per agent (no schema
  validation: the mapper rebuilds event objects from their JSON). Two variants:
  ``batched`` keeps the touched rows in memory and commits them with the tracking record of
  the last event every 1000 events (the same transaction shape as ours), and ``per-event``
  is the library's documented idiom (each ``process_event`` writes the row and the tracking
  record in its own transaction), timed on a prefix. On PostgreSQL the library's
  ``ProjectionRunner`` drives the projection (LISTEN/NOTIFY subscription, 500-row pulls in a
  thread). The library's SQLite recorder has no subscriptions (``subscribe`` raises
  ``NotImplementedError``), so on SQLite the same loop is driven by hand: the recorder's
  ``select_notifications`` in 500-row pulls, ``mapper.to_domain_event``, ``Tracking``,
  ``process_event`` (what ``ApplicationSubscription`` does, minus the thread hop).
  The two read models are compared after the run (all agents, every field but the time).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import orjson
import psycopg
from eventsourcing.application import Application
from eventsourcing.persistence import InfrastructureFactory, Tracking
from eventsourcing.postgres import PostgresTrackingRecorder
from eventsourcing.projection import Projection as ESProjection
from eventsourcing.projection import ProjectionRunner as ESProjectionRunner
from eventsourcing.sqlite import SQLiteTrackingRecorder
from eventsourcing.utils import Environment

import ares_events as ae
from ares_events.projections import AgentStateProjection, RecoveryStateProjection, rebuild
from ares_events.projections.tables import tables_for
from bench.common import (
    Stats,
    canonical_bytes,
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    machine_description,
    markdown_table,
    throwaway_db,
    timed,
    write_section,
)

DEFAULT_ADMIN_URL = "postgresql://root@127.0.0.1:5432/postgres"
MODULE = "runtime"
TAIL = 50
PAYLOAD_BYTES = 300


def log(msg: str) -> None:
    print(f"[bench_recovery] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Sizes:
    """Workload sizes and repetition counts."""

    lengths: tuple[int, ...]
    snap_reps: int
    full_reps: tuple[int, ...]
    """Repetitions of the full replay, per length."""
    agents: int
    per_agent: int
    chunk: int
    rebuild_reps: int
    per_event_n: int


FULL = Sizes((10_000, 100_000, 1_000_000), 21, (5, 5, 3), 1000, 1000, 50, 3, 2000)
QUICK = Sizes((1_000, 5_000, 20_000), 7, (3, 3, 2), 50, 200, 25, 2, 500)


# -- the events --------------------------------------------------------------------------

_T0 = datetime(2025, 1, 1, tzinfo=UTC)
_NOTE = (
    "the agent looked at the page, compared three sources, drafted an answer with citations "
    "and kept the plan short; résumé of the step follows with the context window budget, "
    "cache hits, retries and the reviewer's remarks on the patch and the state of the run "
) * 3


def _pad(p: dict[str, Any]) -> dict[str, Any]:
    n = PAYLOAD_BYTES - len(canonical_bytes(p)) - len(',"note":""')
    if n > 0:
        note = _NOTE[:n]
        while len(note.encode()) > n:
            note = note[:-1]
        p["note"] = note
    return p


def agent_event(a: int, i: int) -> tuple[str, dict[str, Any]]:
    """Event ``i`` (0-based) of agent ``a``: (type, ~300-byte payload). Deterministic."""
    if i == 0:
        return "session.created", _pad({"session_id": f"sess-{a}", "entry_id": f"entry-{a}"})
    if i == 1:
        return "agent.started", _pad({"instance_id": f"inst-{a}-0"})
    k, j = divmod(i - 2, 10)
    task = f"task-{a}-{k}"
    step = 2 * k + (1 if j >= 5 else 0)
    special = k % 50 == 49
    if j == 0:
        return "task.created", _pad({"task_id": task, "title": f"step {k} of the plan"})
    if special and j in (1, 2, 3, 4):
        if j == 1:
            return "agent.dead", _pad({"cause": "heartbeat timeout", "instance": f"inst-{a}-{k}"})
        if j == 2:
            return "agent.resurrected", _pad({"instance_id": f"inst-{a}-{k + 1}", "attempt": 1})
        if j == 3:
            return "failover.triggered", _pad({"reason": "host drained"})
        return "failover.completed", _pad({"instance_id": f"inst-{a}-{k + 1}"})
    if j in (1, 5):
        return "model.call.requested", _pad(
            {
                "step": step,
                "messages_hash": f"{(a * 1_000_003 + i) & 0xFFFFFFFFFFFF:012x}",
                "params": {"max_tokens": 1024, "top_k": 5, "model": "m-large"},
            }
        )
    if j in (2, 6):
        return "model.responded", _pad(
            {
                "step": step,
                "completion": f"answer for step {step}",
                "usage": {"prompt_tokens": 200 + i % 5000, "completion_tokens": 1 + i % 800},
            }
        )
    if j in (3, 7):
        return "tool.call.requested", _pad(
            {"name": "web.search", "args": {"q": f"query {i}"}, "idempotency_key": f"r{a}:{i}"}
        )
    if j in (4, 8):
        return "tool.returned", _pad({"idempotency_key": f"r{a}:{i - 1}", "result": {"hits": 5}})
    return "task.completed", _pad({"task_id": task})


def new_events(a: int, lo: int, hi: int) -> list[ae.NewEvent]:
    out = []
    for i in range(lo, hi):
        t, p = agent_event(a, i)
        out.append(ae.NewEvent(type=t, module=MODULE, payload=p))
    return out


def round_robin(agents: int, per_agent: int, chunk: int) -> Iterator[tuple[int, int, int]]:
    """(agent, lo, hi) appends in global order: ``chunk`` events per agent per round."""
    for lo in range(0, per_agent, chunk):
        hi = min(per_agent, lo + chunk)
        for a in range(agents):
            yield a, lo, hi


def agent_sid(a: int) -> str:
    return f"agent-{a:05d}"


# -- backends ----------------------------------------------------------------------------


@dataclass
class Backend:
    """Where one backend's databases live: URLs for ours, an env for eventsourcing."""

    kind: str  # "sqlite" | "postgres"
    root: Path | None = None
    db_url: str = ""

    def ours_url(self, name: str, *, setup: bool = False) -> str:
        if self.kind == "sqlite":
            assert self.root is not None
            sync = "?synchronous=normal" if setup else ""
            return f"sqlite:///{self.root / (name + '.db')}{sync}"
        # setup only: commits do not wait for the WAL flush (the measurements reopen with
        # the server's synchronous_commit)
        sync = "&options=-c%20synchronous_commit%3Doff" if setup else ""
        return f"{self.db_url}?schema={name}&pool_max=4{sync}"

    def es_env(self, name: str) -> dict[str, str]:
        if self.kind == "sqlite":
            assert self.root is not None
            return {
                "PERSISTENCE_MODULE": "eventsourcing.sqlite",
                "SQLITE_DBNAME": str(self.root / (name + ".db")),
            }
        p = urlsplit(self.db_url)
        with psycopg.connect(self.db_url, autocommit=True) as c:
            c.execute(f'CREATE SCHEMA IF NOT EXISTS "{name}"')
        return {
            "PERSISTENCE_MODULE": "eventsourcing.postgres",
            "POSTGRES_DBNAME": p.path.lstrip("/"),
            "POSTGRES_HOST": p.hostname or "127.0.0.1",
            "POSTGRES_PORT": str(p.port or 5432),
            "POSTGRES_USER": p.username or "postgres",
            "POSTGRES_PASSWORD": p.password or "",
            "POSTGRES_SCHEMA": name,
        }

    def facts(self) -> dict[str, str]:
        if self.kind == "sqlite":
            c = sqlite3.connect(":memory:")
            try:
                return {"sqlite": sqlite3.sqlite_version}
            finally:
                c.close()
        with psycopg.connect(self.db_url) as c:
            out = {}
            for name in ("server_version", "fsync", "synchronous_commit", "shared_buffers"):
                row = c.execute(f"SHOW {name}").fetchone()
                out[name] = str(row[0]) if row else "?"
            return out


# -- part 1: recovery against stream length ----------------------------------------------


@dataclass
class RecoveryRow:
    length: int
    snap: Stats
    full: Stats
    snap_load: Stats
    replayed_snap: int
    build_s: float


def build_long_stream(be: Backend, n: int, a: int) -> tuple[str, float]:
    """One stream of ``n`` events; a RecoveryState snapshot at n - TAIL. Returns (sid, s)."""
    sid = f"long-{n}"
    t0 = time.perf_counter()
    store = ae.open_store(be.ours_url("recovery", setup=True))
    try:
        snapper = ae.Snapshotter(store, [RecoveryStateProjection()], every=100)
        v = 0
        upto = n - TAIL
        while v < upto:
            hi = min(upto, v + 1000)
            res = store.append(sid, new_events(a, v, hi), expected_version=v)
            v = res.version
            snapper.after_append(sid, v)
        for lo in range(v, n, 1000):
            hi = min(n, lo + 1000)
            v = store.append(sid, new_events(a, lo, hi), expected_version=lo).version
        assert v == n, (v, n)
    finally:
        store.close()
    return sid, time.perf_counter() - t0


def run_recovery(be: Backend, sz: Sizes) -> list[RecoveryRow]:
    built: dict[int, tuple[str, float]] = {}
    for idx, n in enumerate(sz.lengths):
        log(f"{be.kind}: building a {n:,}-event stream (snapshot at {n - TAIL:,})")
        built[n] = build_long_stream(be, n, 100_000 + idx)
        log(f"{be.kind}:   built in {built[n][1]:.1f}s")
    rows: list[RecoveryRow] = []
    store = ae.open_store(be.ours_url("recovery"))
    try:
        proj = RecoveryStateProjection()
        for n, reps in zip(sz.lengths, sz.full_reps, strict=True):
            sid = built[n][0]

            def with_snap(sid: str = sid) -> ae.RecoveryReport:
                return ae.recover(store, sid, proj, snapshots=store.snapshots)

            def without(sid: str = sid) -> ae.RecoveryReport:
                return ae.recover(store, sid, proj, snapshots=None, max_replay=2**62)

            def load(sid: str = sid) -> Any:
                return store.snapshots.load(sid, proj.name, proj.version)

            log(f"{be.kind}: recover {n:,} with snapshot x {sz.snap_reps}, without x {reps}")
            with_snap()  # warm
            snap_s, load_s, full_s = [], [], []
            ref = None
            for r in range(max(sz.snap_reps, reps)):
                if r < sz.snap_reps:
                    s, _, rep = timed(with_snap)
                    _check(rep, n, snapshot=True)
                    snap_s.append(s)
                    load_s.append(timed(load)[0])
                    ref = rep
                if r < reps:
                    s, _, rep_full = timed(without)
                    _check(rep_full, n, snapshot=False)
                    assert ref is not None
                    if rep_full.state != ref.state:
                        raise RuntimeError(f"snapshot recovery differs from full replay at {n}")
                    full_s.append(s)
            assert ref is not None
            rows.append(
                RecoveryRow(
                    n,
                    Stats.of(snap_s),
                    Stats.of(full_s),
                    Stats.of(load_s),
                    ref.replayed,
                    built[n][1],
                )
            )
            log(
                f"{be.kind}:   {n:,}: snapshot {fmt_ms(rows[-1].snap.median)}, "
                f"full {fmt_ms(rows[-1].full.median)}"
            )
    finally:
        store.close()
    return rows


def _check(rep: ae.RecoveryReport, n: int, *, snapshot: bool) -> None:
    want = ae.RecoverySource.SNAPSHOT if snapshot else ae.RecoverySource.EVENTS
    replayed = TAIL if snapshot else n
    if (
        rep.source is not want
        or rep.version != n
        or rep.replayed != replayed
        or not rep.ok
        or rep.truncated
        or rep.state["last_version"] != n
    ):
        raise RuntimeError(
            f"unexpected recovery of {n}: source={rep.source} version={rep.version} "
            f"replayed={rep.replayed} ok={rep.ok} ignored={rep.snapshot_ignored}"
        )


# -- part 2: the eventsourcing side --------------------------------------------------------


class AgentsApp(Application[uuid.UUID]):
    """The application whose recorder holds the events (no aggregates are used)."""

    name = "AgentsApp"


class ESEvent:
    """Base of the domain-event classes the mapper rebuilds (one per event type)."""

    TYPE: ClassVar[str] = ""
    originator_id: uuid.UUID
    originator_version: int
    timestamp: datetime


_ES_CLASSES: dict[str, type[ESEvent]] = {}
for _t in (
    "session.created",
    "agent.started",
    "task.created",
    "task.completed",
    "model.call.requested",
    "model.responded",
    "tool.call.requested",
    "tool.returned",
    "agent.dead",
    "agent.resurrected",
    "failover.triggered",
    "failover.completed",
):
    _name = "ES_" + _t.replace(".", "_")
    _cls = type(_name, (ESEvent,), {"TYPE": _t, "__module__": __name__, "__qualname__": _name})
    globals()[_name] = _cls
    _ES_CLASSES[_t] = _cls


def agent_uuid(a: int) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"ares-bench/{agent_sid(a)}")


def es_domain_event(a: int, i: int, ts: datetime) -> ESEvent:
    t, p = agent_event(a, i)
    ev = object.__new__(_ES_CLASSES[t])
    ev.__dict__.update(p)
    ev.__dict__.update(originator_id=agent_uuid(a), originator_version=i + 1, timestamp=ts)
    return ev


def es_initial() -> dict[str, Any]:
    return AgentStateProjection().initial()


def es_apply(state: dict[str, Any], ev: Any) -> dict[str, Any]:
    """The same fold as ``AgentStateProjection.apply``, on the library's event objects."""
    t = ev.TYPE
    if t == "session.created":
        state["session_id"] = ev.session_id
    elif t == "task.created":
        if ev.task_id not in state["pending_tasks"]:
            state["pending_tasks"].append(ev.task_id)
    elif t == "task.completed":
        if ev.task_id in state["pending_tasks"]:
            state["pending_tasks"].remove(ev.task_id)
        state["done_tasks"].append(ev.task_id)
    elif t == "agent.started":
        state["status"] = "running"
        state["instance_id"] = ev.instance_id
    elif t == "agent.dead":
        state["status"] = "dead"
        state["deaths"] += 1
    elif t == "agent.resurrected":
        state["status"] = "running"
        state["instance_id"] = ev.instance_id
        state["restarts"] += 1
    elif t == "failover.completed":
        state["instance_id"] = ev.instance_id
    v = ev.originator_version
    state["last_event"] = {"type": t, "version": v, "at": ev.timestamp.isoformat()}
    state["version"] = v
    return state


_SQLITE_VIEW_TABLE = (
    "CREATE TABLE IF NOT EXISTS es_agent_state (agent_id TEXT PRIMARY KEY, state BLOB NOT NULL)"
)
_SQLITE_VIEW_UPSERT = (
    "INSERT INTO es_agent_state (agent_id, state) VALUES (?, ?) "
    "ON CONFLICT (agent_id) DO UPDATE SET state = excluded.state"
)


class SQLiteAgentView(SQLiteTrackingRecorder):
    """Materialised view: agent state rows + the library's tracking table, one file."""

    def construct_create_table_statements(self) -> list[str]:
        return [*super().construct_create_table_statements(), _SQLITE_VIEW_TABLE]

    def load(self, key: str) -> dict[str, Any] | None:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT state FROM es_agent_state WHERE agent_id = ?", (key,))
            row = c.fetchone()
        return orjson.loads(row[0]) if row else None

    def save(self, rows: dict[str, dict[str, Any]], tracking: Tracking) -> None:
        with self.datastore.transaction(commit=True) as c:
            c.executemany(_SQLITE_VIEW_UPSERT, [(k, orjson.dumps(s)) for k, s in rows.items()])
            self._insert_tracking(c, tracking)

    def all_rows(self) -> dict[str, Any]:
        with self.datastore.transaction(commit=False) as c:
            c.execute("SELECT agent_id, state FROM es_agent_state")
            return {r[0]: orjson.loads(r[1]) for r in c.fetchall()}


class PostgresAgentView(PostgresTrackingRecorder):
    """Materialised view: agent state rows + the library's tracking table, one schema."""

    def __init__(self, datastore: Any, **kwargs: Any) -> None:
        super().__init__(datastore, **kwargs)
        from psycopg.sql import SQL, Identifier

        schema = Identifier(self.datastore.schema)
        self.sql_create_statements.append(
            SQL(
                "CREATE TABLE IF NOT EXISTS {0}.es_agent_state "
                "(agent_id text PRIMARY KEY, state bytea NOT NULL)"
            ).format(schema)
        )
        self._select = SQL("SELECT state FROM {0}.es_agent_state WHERE agent_id = %s").format(
            schema
        )
        self._upsert = SQL(
            "INSERT INTO {0}.es_agent_state (agent_id, state) VALUES (%s, %s) "
            "ON CONFLICT (agent_id) DO UPDATE SET state = excluded.state"
        ).format(schema)
        self._all = SQL("SELECT agent_id, state FROM {0}.es_agent_state").format(schema)

    def load(self, key: str) -> dict[str, Any] | None:
        with self.datastore.transaction(commit=False) as c:
            c.execute(self._select, (key,), prepare=True)
            row = c.fetchone()
        return orjson.loads(row["state"]) if row else None

    def save(self, rows: dict[str, dict[str, Any]], tracking: Tracking) -> None:
        with self.datastore.transaction(commit=True) as c:
            c.executemany(self._upsert, [(k, orjson.dumps(s)) for k, s in rows.items()])
            self._insert_tracking(c, tracking)

    def all_rows(self) -> dict[str, Any]:
        with self.datastore.transaction(commit=False) as c:
            c.execute(self._all)
            return {r["agent_id"]: orjson.loads(r["state"]) for r in c.fetchall()}


class AgentStateESProjection(ESProjection[Any]):
    """Folds the agent state into the view. ``batch`` > 1: rows kept in memory and
    committed with the last event's tracking every ``batch`` events (and at ``target``);
    ``batch`` == 1: the library idiom, one transaction per event."""

    name = "agentstateview"
    batch: ClassVar[int] = 1000
    target: ClassVar[int] = 0

    def __init__(self, view: Any) -> None:
        super().__init__(view)
        self._rows: dict[str, dict[str, Any]] = {}
        self._n = 0

    def process_event(self, domain_event: Any, tracking: Tracking) -> None:  # type: ignore[override]
        key = str(domain_event.originator_id)
        st = self._rows.get(key)
        if st is None:
            st = self.view.load(key) or es_initial()
            self._rows[key] = st
        es_apply(st, domain_event)
        self._n += 1
        if self._n >= self.batch or tracking.notification_id >= self.target:
            self.view.save(self._rows, tracking)
            self._rows = {}
            self._n = 0


# -- part 2: fixtures and runs -------------------------------------------------------------


@dataclass
class RebuildRow:
    events: int
    ours: Stats
    es_batched: Stats
    es_per_event: Stats
    per_event_n: int
    build_ours_s: float
    build_es_s: float
    es_driver: str
    compared: int = 0
    notes: list[str] = field(default_factory=list)


class RebuildFixture:
    """The same agents' events in our store and in an eventsourcing recorder."""

    def __init__(self, be: Backend, sz: Sizes) -> None:
        self.be, self.sz = be, sz
        self.total = sz.agents * sz.per_agent
        t0 = time.perf_counter()
        store = ae.open_store(be.ours_url("rebuild", setup=True))
        try:
            for a, lo, hi in round_robin(sz.agents, sz.per_agent, sz.chunk):
                store.append(agent_sid(a), new_events(a, lo, hi), expected_version=lo)
        finally:
            store.close()
        self.build_ours_s = time.perf_counter() - t0
        log(f"{be.kind}: ours {self.total:,} events written in {self.build_ours_s:.1f}s")

        t0 = time.perf_counter()
        self.env = be.es_env("es_rebuild")
        app = AgentsApp(env=self.env)
        try:
            buf = []
            g = 0
            for a, lo, hi in round_robin(sz.agents, sz.per_agent, sz.chunk):
                for i in range(lo, hi):
                    ts = _T0 + timedelta(milliseconds=g)
                    g += 1
                    buf.append(app.mapper.to_stored_event(es_domain_event(a, i, ts)))
                if len(buf) >= 1000:
                    app.recorder.insert_events(buf)
                    buf = []
            if buf:
                app.recorder.insert_events(buf)
            self.target = app.recorder.max_notification_id() or 0
        finally:
            app.close()
        self.build_es_s = time.perf_counter() - t0
        log(f"{be.kind}: eventsourcing {self.total:,} events written in {self.build_es_s:.1f}s")

    # ours
    def rebuild_ours(self) -> tuple[float, float]:
        store = ae.open_store(self.be.ours_url("rebuild"))
        try:
            wall, cpu, rep = timed(
                lambda: rebuild(store, AgentStateProjection(), from_scratch=True)
            )
            if rep.events != self.total or rep.rows != self.sz.agents or rep.skipped:
                raise RuntimeError(f"bad rebuild: {rep.to_dict()}")
            return wall, cpu
        finally:
            store.close()

    def ours_rows(self) -> dict[str, Any]:
        store = ae.open_store(self.be.ours_url("rebuild"))
        try:
            tables = tables_for(store)
            meta = tables.meta(AgentStateProjection.name)
            assert meta is not None and meta.active_table
            return dict(tables.scan(meta.active_table))
        finally:
            store.close()

    # eventsourcing
    def _reset_view(self) -> None:
        if self.be.kind == "sqlite":
            c = sqlite3.connect(self.env["SQLITE_DBNAME"])
            try:
                c.execute("DROP TABLE IF EXISTS es_agent_state")
                c.execute("DROP TABLE IF EXISTS tracking")
                c.commit()
            finally:
                c.close()
        else:
            with psycopg.connect(self.be.db_url, autocommit=True) as c:
                s = self.env["POSTGRES_SCHEMA"]
                c.execute(f'DROP TABLE IF EXISTS "{s}".es_agent_state')
                c.execute(f'DROP TABLE IF EXISTS "{s}"."{AgentStateESProjection.name}_tracking"')

    def rebuild_es(self, batch: int, upto: int | None = None) -> tuple[float, float]:
        """Fold the first ``upto`` events (all by default) into a fresh view."""
        self._reset_view()
        target = self.target if upto is None else upto
        AgentStateESProjection.batch = batch
        AgentStateESProjection.target = target
        if self.be.kind == "sqlite":
            return self._drive_sqlite(target)
        return self._drive_runner(target)

    def _drive_sqlite(self, target: int) -> tuple[float, float]:
        def run() -> None:
            app = AgentsApp(env=self.env)
            factory = InfrastructureFactory.construct(
                env=Environment(AgentStateESProjection.name, self.env)
            )
            view = factory.tracking_recorder(SQLiteAgentView)
            proj = AgentStateESProjection(view)
            try:
                start = view.max_tracking_id(app.name) or 0
                rec, mapper = app.recorder, app.mapper
                while start < target:
                    ns = rec.select_notifications(
                        start=start, limit=500, stop=target, inclusive_of_start=False
                    )
                    for n in ns:
                        proj.process_event(mapper.to_domain_event(n), Tracking(app.name, n.id))
                    if len(ns) < 500:
                        break
                    start = ns[-1].id
                if (view.max_tracking_id(app.name) or 0) < target:
                    raise RuntimeError("eventsourcing projection did not reach the target")
            finally:
                view.datastore.close()
                app.close()

        return timed(run)[:2]

    def _drive_runner(self, target: int) -> tuple[float, float]:
        def run() -> None:
            with ESProjectionRunner(
                application_class=AgentsApp,
                projection_class=AgentStateESProjection,
                view_class=PostgresAgentView,
                env=self.env,
            ) as runner:
                runner.wait(target, timeout=3600)
                if (runner.view.max_tracking_id(runner.app_name) or 0) < target:
                    raise RuntimeError("eventsourcing projection did not reach the target")

        return timed(run)[:2]

    def es_rows(self) -> dict[str, Any]:
        factory = InfrastructureFactory.construct(
            env=Environment(AgentStateESProjection.name, self.env)
        )
        view_cls = SQLiteAgentView if self.be.kind == "sqlite" else PostgresAgentView
        view = factory.tracking_recorder(view_cls)  # type: ignore[type-var]
        try:
            return view.all_rows()  # type: ignore[no-any-return]
        finally:
            view.datastore.close()


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    s = dict(state)
    s["last_event"] = {k: v for k, v in (s["last_event"] or {}).items() if k != "at"}
    return s


def run_rebuild(be: Backend, sz: Sizes) -> RebuildRow:
    fx = RebuildFixture(be, sz)
    ours, es_b, es_p = [], [], []
    n_per = min(sz.per_event_n, fx.total)
    for r in range(sz.rebuild_reps):
        order = ("ours", "es") if r % 2 == 0 else ("es", "ours")
        for who in order:
            if who == "ours":
                ours.append(fx.rebuild_ours()[0])
                log(f"{be.kind}: rebuild ours rep {r + 1}: {fx.total / ours[-1]:,.0f} ev/s")
            else:
                es_b.append(fx.rebuild_es(1000)[0])
                log(
                    f"{be.kind}: eventsourcing batched rep {r + 1}: {fx.total / es_b[-1]:,.0f} ev/s"
                )
    # the read models must agree (compared after the last batched run)
    mine = {k: _comparable(v) for k, v in fx.ours_rows().items()}
    theirs = {k: _comparable(v) for k, v in fx.es_rows().items()}
    by_uuid = {str(agent_uuid(a)): agent_sid(a) for a in range(sz.agents)}
    theirs = {by_uuid[k]: v for k, v in theirs.items()}
    if mine != theirs:
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise RuntimeError(f"read models differ for {len(diff)} agents, e.g. {diff[:3]}")
    for r in range(max(1, sz.rebuild_reps - 1)):
        es_p.append(fx.rebuild_es(1, upto=n_per)[0])
        log(f"{be.kind}: eventsourcing per-event rep {r + 1}: {n_per / es_p[-1]:,.0f} ev/s")
    return RebuildRow(
        fx.total,
        Stats.of(ours),
        Stats.of(es_b),
        Stats.of(es_p),
        n_per,
        fx.build_ours_s,
        fx.build_es_s,
        "hand-driven pull loop (no SQLite subscriptions in the library)"
        if be.kind == "sqlite"
        else "`eventsourcing.projection.ProjectionRunner`",
        compared=len(mine),
    )


# -- rendering ---------------------------------------------------------------------------


def render(
    sz: Sizes,
    quick: bool,
    rec: dict[str, list[RecoveryRow]],
    reb: dict[str, RebuildRow],
    facts: dict[str, dict[str, str]],
    seconds: float,
) -> str:
    m = machine_description(("psycopg", "pydantic"))
    env_rows = [
        ("Machine", m["cpu"]),
        ("OS", m["os"]),
        ("Python", m["python"]),
        ("SQLite", m["sqlite"]),
        ("Libraries", m["libraries"]),
    ]
    if "postgres" in facts:
        f = facts["postgres"]
        env_rows.append(
            (
                "PostgreSQL",
                f"{f['server_version']} on the same VM (fsync={f['fsync']}, "
                f"synchronous_commit={f['synchronous_commit']}, "
                f"shared_buffers={f['shared_buffers']})",
            )
        )
    env_rows.append(("Payload", f"~{PAYLOAD_BYTES} bytes of canonical JSON per event"))
    lines = [
        f"Measured {m['date']} by `python -m bench.bench_recovery{' --quick' if quick else ''}`"
        f" (whole run {seconds / 60:.1f} min).",
        "",
        markdown_table(("", ""), env_rows),
        "",
        "### Recovery time against stream length (`RecoveryStateProjection`)",
        "",
        f"Snapshot at N-{TAIL}, so recovery with a snapshot folds a {TAIL}-event tail; "
        f"medians of {sz.snap_reps} runs with a snapshot and "
        f"{'/'.join(str(r) for r in sz.full_reps)} runs without (per length).",
        "",
    ]
    header = (
        "Backend",
        "Events",
        "With snapshot (p90)",
        "snapshot load alone",
        "Without snapshot",
        "Without, per event",
        "Speed-up",
    )
    body = []
    ratios: dict[str, tuple[float, float]] = {}
    for kind, rows in rec.items():
        for r in rows:
            body.append(
                (
                    kind,
                    f"{r.length:,}",
                    f"{fmt_ms(r.snap.median)} ({fmt_ms(r.snap.p90)})",
                    fmt_ms(r.snap_load.median),
                    fmt_ms(r.full.median),
                    f"{r.full.median / r.length * 1e6:.1f} µs",
                    f"{r.full.median / r.snap.median:,.0f}x",
                )
            )
        lo, hi = rows[0], rows[-1]
        ratios[kind] = (hi.snap.median / lo.snap.median, hi.full.median / lo.full.median)
    lines.append(markdown_table(header, body))
    lines.append("")
    lo_n, hi_n = sz.lengths[0], sz.lengths[-1]
    span = hi_n / lo_n
    lines.append(
        f"Ratios {hi_n:,} / {lo_n:,} events (target: with snapshots within 1.5x; "
        f"without, linear = {span:.0f}x):"
    )
    lines.append("")
    tr = []
    for kind, (rs, rf) in ratios.items():
        tr.append(
            (
                kind,
                f"**{fmt_ratio(rs)}** ({'met' if rs <= 1.5 else 'NOT met'})",
                f"{fmt_ratio(rf)} ({rf / span:.2f} of linear)",
            )
        )
    lines.append(markdown_table(("Backend", "With snapshot", "Without snapshot"), tr))
    lines.append("")
    if reb:
        lines += [
            "### Full rebuild of `AgentStateProjection`",
            "",
            f"{sz.agents:,} agents x {sz.per_agent:,} events, written round-robin in "
            f"{sz.chunk}-event appends; medians of {sz.rebuild_reps} runs (ours and "
            "eventsourcing batched alternate); the per-event idiom on the first "
            f"{min(sz.per_event_n, sz.agents * sz.per_agent):,} events. "
            "Both read models are compared field by field after the run "
            "(all agents equal, event times aside).",
            "",
        ]
        body = []
        for kind, r in reb.items():
            body.append(
                (
                    kind,
                    f"{r.events:,}",
                    f"**{fmt_rate(r.events / r.ours.median)}**<br>{r.ours.median:.1f} s",
                    f"{fmt_rate(r.events / r.es_batched.median)}<br>{r.es_batched.median:.1f} s",
                    fmt_ratio(r.es_batched.median / r.ours.median),
                    f"{fmt_rate(r.per_event_n / r.es_per_event.median)}",
                    r.es_driver,
                )
            )
        lines.append(
            markdown_table(
                (
                    "Backend",
                    "Events",
                    "ares-events `rebuild`",
                    "eventsourcing, 1000-event txns",
                    "Ratio (ours faster when > 1)",
                    "eventsourcing, txn per event (library idiom)",
                    "eventsourcing driver",
                ),
                body,
            )
        )
        lines.append("")
        lines.append(
            "Setup (untimed): "
            + "; ".join(
                f"{k}: ours written in {r.build_ours_s:.0f} s, eventsourcing in "
                f"{r.build_es_s:.0f} s"
                for k, r in reb.items()
            )
            + "."
        )
    return "\n".join(lines)


# -- profiling -----------------------------------------------------------------------------


def _profiled(title: str, fn: Callable[[], Any], top: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).strip_dirs().sort_stats("tottime").print_stats(top)
    print(f"\n===== {title} (sorted by tottime) =====\n{buf.getvalue()}")


def profile(be: Backend, sz: Sizes, top: int) -> None:
    n = sz.lengths[-1]
    sid, _ = build_long_stream(be, n, 7)
    store = ae.open_store(be.ours_url("recovery"))
    try:
        proj = RecoveryStateProjection()
        ae.recover(store, sid, proj, snapshots=store.snapshots)

        def many() -> None:
            for _ in range(200):
                ae.recover(store, sid, proj, snapshots=store.snapshots)

        _profiled(f"{be.kind}: 200 x recover with snapshot ({n:,} events)", many, top)
        _profiled(
            f"{be.kind}: recover without snapshot ({n:,} events)",
            lambda: ae.recover(store, sid, proj, snapshots=None, max_replay=2**62),
            top,
        )
    finally:
        store.close()
    fx = RebuildFixture(be, sz)
    _profiled(f"{be.kind}: ours rebuild ({fx.total:,} events)", fx.rebuild_ours, top)
    _profiled(
        f"{be.kind}: eventsourcing batched ({fx.total:,} events)", lambda: fx.rebuild_es(1000), top
    )


# -- main ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_recovery", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small sizes (smoke run, seconds)")
    ap.add_argument("--only", choices=("sqlite", "postgres"), default=None)
    ap.add_argument("--skip-rebuild", action="store_true", help="recovery table only")
    ap.add_argument("--admin-url", default=None, help="PostgreSQL server (database postgres)")
    ap.add_argument(
        "--write",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write docs/performance.md (default: yes for full runs of both backends)",
    )
    ap.add_argument("--dir", type=Path, default=None, help="where to put the SQLite files")
    ap.add_argument("--profile", action="store_true", help="cProfile instead of comparing")
    ap.add_argument("--top", type=int, default=25, help="rows per profile")
    args = ap.parse_args(argv)
    sz = QUICK if args.quick else FULL
    admin = args.admin_url or os.environ.get("ARES_BENCH_POSTGRES_URL") or DEFAULT_ADMIN_URL
    kinds = [args.only] if args.only else ["sqlite", "postgres"]
    t0 = time.perf_counter()
    rec: dict[str, list[RecoveryRow]] = {}
    reb: dict[str, RebuildRow] = {}
    facts: dict[str, dict[str, str]] = {}
    for kind in kinds:
        with contextlib.ExitStack() as stack:
            if kind == "sqlite":
                root = Path(tempfile.mkdtemp(prefix="ares-bench-recovery-", dir=args.dir))
                stack.callback(shutil.rmtree, root, True)
                be = Backend("sqlite", root=root)
            else:
                be = Backend(
                    "postgres", db_url=stack.enter_context(throwaway_db(admin, "recovery"))
                )
            facts[kind] = be.facts()
            if args.profile:
                profile(be, sz, args.top)
                continue
            rec[kind] = run_recovery(be, sz)
            if not args.skip_rebuild:
                reb[kind] = run_rebuild(be, sz)
    if args.profile:
        return 0
    body = render(sz, args.quick, rec, reb, facts, time.perf_counter() - t0)
    print(body)
    write = args.write if args.write is not None else (not args.quick and args.only is None)
    if write:
        write_section("recovery", body, title="Recovery and projection rebuilds")
        log("wrote section 'recovery' of docs/performance.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
