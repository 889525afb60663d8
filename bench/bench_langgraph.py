"""LangGraph checkpointers side by side: ares-events' ``AresSaver``/``AsyncAresSaver`` vs
``langgraph-checkpoint-postgres`` (``PostgresSaver``/``AsyncPostgresSaver``) and
``langgraph-checkpoint-sqlite`` (``SqliteSaver``/``AsyncSqliteSaver``), same graph, same
machine, same run.

Run from the repository root::

    .venv/bin/python -m bench.bench_langgraph            # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_langgraph --quick    # small sizes, writes nothing

The PostgreSQL server comes from ``--admin-url``, else ``ARES_BENCH_POSTGRES_URL``, else
``postgresql://root@127.0.0.1:5432/postgres``; each system gets its own throwaway database.

The graph: one chat node over ``messages: Annotated[list, add_messages]``; a turn is one
``invoke`` with a ~200-character human message, answered by a ~600-character AI message
(deterministic text), ``durability="sync"``. Measured per system:

* **bytes at 200 turns**: the database's table and index bytes of the thread (PostgreSQL:
  ``pg_total_relation_size`` of every table in the schema; SQLite: pages in use after a
  WAL checkpoint), and the logical payload bytes.
* **put**: p50 and p99 of every ``put`` during the first 200 turns.
* **get_tuple**: p50 of 50 ``get_tuple`` of the newest checkpoint at turn 10 and at turn
  500 (same saver, warm), and for ares-events also a cold one (a new saver: the thread's
  index is built and verified from the stream).
* **32 concurrent threads**: 32 asyncio tasks, each running its own thread for 10 turns
  with the async saver (``AsyncAresSaver`` on the native async store;
  ``AsyncPostgresSaver`` on an ``AsyncConnectionPool`` of 32; ``AsyncSqliteSaver``):
  turns per second, median of the repetitions (systems alternate).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from bench.bench_postgres import DEFAULT_ADMIN_URL, server_facts
from bench.common import (
    Stats,
    fmt_ms,
    fmt_ratio,
    machine_description,
    markdown_table,
    throwaway_db,
    write_section,
)

FULL = {"bytes_turns": 200, "long_turns": 500, "conc_threads": 32, "conc_turns": 10, "reps": 3}
QUICK = {"bytes_turns": 20, "long_turns": 40, "conc_threads": 8, "conc_turns": 3, "reps": 1}
GETS = 50


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def _vocabulary(n: int = 3000, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    weights = [12, 9, 8, 8, 7, 7, 6, 6, 6, 4, 4, 3, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1]
    return ["".join(rng.choices(letters, weights, k=rng.randint(2, 10))) for _ in range(n)]


_VOCAB = _vocabulary()


def _text(i: int, n: int, who: str) -> str:
    """Deterministic text of ``n`` characters drawn from a 3,000-word vocabulary with
    English-like letter and word frequencies: zlib shrinks it ~2.6x, about as much as
    English prose. (A repeated phrase would shrink ~50x under PostgreSQL's TOAST
    compression and flatter a saver that stores the same text again and again.)"""
    rng = random.Random(f"{who}-{i}")
    out = f"{who} {i}:"
    while len(out) < n:
        out += " " + _VOCAB[min(int(rng.expovariate(1 / 400)), len(_VOCAB) - 1)]
    return out[:n]


def chat_graph(saver: Any) -> Any:
    def bot(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=_text(n, 600, "ai"), id=f"ai-{n}")]}

    g = StateGraph(Chat)
    g.add_node("bot", bot)
    g.add_edge(START, "bot")
    return g.compile(checkpointer=saver)


def human(i: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(content=_text(i, 200, "human"), id=f"h-{i}")]}


class TimedPuts:
    """Wraps a saver's ``put`` to time every call."""

    def __init__(self, saver: Any) -> None:
        self.samples: list[float] = []
        self.on = True
        inner = saver.put

        def put(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kw)
            finally:
                if self.on:
                    self.samples.append(time.perf_counter() - t)

        saver.put = put


# -- sizes ------------------------------------------------------------------------------------


def pg_bytes(url: str, schema: str) -> int:
    with psycopg.connect(url) as c:
        row = c.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            (schema,),
        ).fetchone()
    return int(row[0]) if row else 0


def sqlite_bytes(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        free = con.execute("PRAGMA freelist_count").fetchone()[0]
        size = con.execute("PRAGMA page_size").fetchone()[0]
    finally:
        con.close()
    return int((pages - free) * size)


def blob_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


# -- systems ------------------------------------------------------------------------------------


class System:
    """One checkpointer under test: how to open it (blocking and asyncio) and measure it."""

    def __init__(
        self,
        name: str,
        open_sync: Callable[[], Any],
        close_sync: Callable[[Any], None],
        size: Callable[[], int],
        open_async: Callable[[], Any],
        close_async: Callable[[Any], Any],
        open_cached: Callable[[], Any] | None = None,
    ) -> None:
        self.open_cached = open_cached
        self.name = name
        self.open_sync = open_sync
        self.close_sync = close_sync
        self.size = size
        self.open_async = open_async
        self.close_async = close_async


def ares_pg(url: str) -> System:
    from ares_events.integrations.langgraph import AresSaver, AsyncAresSaver

    u = f"{url}?schema=lg"

    async def aopen() -> Any:
        return await AsyncAresSaver.from_url(u + "&pool_max=32")

    async def aclose(s: Any) -> None:
        await s.aclose()

    return System(
        "ares-events (PostgreSQL)",
        lambda: AresSaver.from_url(u),
        lambda s: s.close(),
        lambda: pg_bytes(url, "lg"),
        aopen,
        aclose,
        lambda: AresSaver.from_url(u, value_cache=64),
    )


def lg_pg(url: str) -> System:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    def sopen() -> Any:
        conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        saver = PostgresSaver(conn)
        saver.setup()
        saver._bench_conn = conn  # type: ignore[attr-defined]
        return saver

    async def aopen() -> Any:
        pool = AsyncConnectionPool(
            url,
            min_size=32,
            max_size=32,
            open=False,
            kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
        )
        await pool.open(wait=True)
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        saver._bench_pool = pool  # type: ignore[attr-defined]
        return saver

    async def aclose(s: Any) -> None:
        await s._bench_pool.close()

    return System(
        "langgraph-checkpoint-postgres",
        sopen,
        lambda s: s._bench_conn.close(),
        lambda: pg_bytes(url, "public"),
        aopen,
        aclose,
    )


def ares_sqlite(folder: Path) -> System:
    from ares_events.integrations.langgraph import AresSaver, AsyncAresSaver

    path = folder / "ares.db"

    async def aopen() -> Any:
        return await AsyncAresSaver.from_url(f"sqlite:///{folder}/ares-async.db")

    async def aclose(s: Any) -> None:
        await s.aclose()

    return System(
        "ares-events (SQLite)",
        lambda: AresSaver.from_url(f"sqlite:///{path}"),
        lambda s: s.close(),
        lambda: sqlite_bytes(path) + blob_bytes(folder / "ares.db.blobs"),
        aopen,
        aclose,
        lambda: AresSaver.from_url(f"sqlite:///{path}", value_cache=64),
    )


def lg_sqlite(folder: Path) -> System:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = folder / "lg.db"

    def sopen() -> Any:
        conn = sqlite3.connect(path, check_same_thread=False)
        saver = SqliteSaver(conn)
        saver.setup()
        return saver

    async def aopen() -> Any:
        import aiosqlite

        conn = await aiosqlite.connect(folder / "lg-async.db")
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        return saver

    async def aclose(s: Any) -> None:
        await s.conn.close()

    return System(
        "langgraph-checkpoint-sqlite",
        sopen,
        lambda s: s.conn.close(),
        lambda: sqlite_bytes(path),
        aopen,
        aclose,
    )


# -- measurements ---------------------------------------------------------------------------------


def get_p50(saver: Any, tid: str) -> float:
    cfg = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
    samples = []
    for _ in range(GETS):
        t = time.perf_counter()
        saver.get_tuple(cfg)
        samples.append(time.perf_counter() - t)
    return Stats.of(samples).median


def long_thread(system: System, sz: dict[str, int]) -> dict[str, Any]:
    """One thread to ``long_turns`` turns: puts over the first ``bytes_turns``, bytes at
    ``bytes_turns``, get_tuple at turn 10 and at the end."""
    saver = system.open_sync()
    out: dict[str, Any] = {}
    try:
        timer = TimedPuts(saver)
        graph = chat_graph(saver)
        tid = f"long-{uuid.uuid4().hex[:8]}"
        cfg = {"configurable": {"thread_id": tid}}
        before = system.size()
        for i in range(sz["long_turns"]):
            graph.invoke(human(i), cfg, durability="sync")
            turn = i + 1
            if turn == 10:
                timer.on = False
                out["get10"] = get_p50(saver, tid)
                if system.open_cached is not None:
                    cached = system.open_cached()
                    out["get10_cached"] = get_p50(cached, tid)
                    system.close_sync(cached)
                timer.on = True
            if turn == sz["bytes_turns"]:
                timer.on = False
                out["bytes"] = system.size() - before
                out["put_samples"] = sorted(timer.samples)
        timer.on = False
        out["get_end"] = get_p50(saver, tid)
        if system.open_cached is not None:
            cached = system.open_cached()
            out["get_end_cached"] = get_p50(cached, tid)
            system.close_sync(cached)
        out["tid"] = tid
    finally:
        system.close_sync(saver)
    if system.name.startswith("ares"):
        # Cold: a new saver builds (and verifies) the thread's index from the stream.
        saver = system.open_sync()
        try:
            t = time.perf_counter()
            saver.get_tuple({"configurable": {"thread_id": out["tid"], "checkpoint_ns": ""}})
            out["get_cold"] = time.perf_counter() - t
        finally:
            system.close_sync(saver)
    return out


CPU_PER_TURN: dict[str, list[float]] = {}


async def concurrent(system: System, sz: dict[str, int]) -> float:
    """Turns per second of ``conc_threads`` tasks, each its own thread (and, in
    :data:`CPU_PER_TURN`, this process's CPU seconds per turn)."""
    saver = await system.open_async()
    try:
        graph = chat_graph(saver)
        run = uuid.uuid4().hex[:8]

        async def one(k: int) -> None:
            cfg = {"configurable": {"thread_id": f"c-{run}-{k}"}}
            for i in range(sz["conc_turns"]):
                await graph.ainvoke(human(i), cfg, durability="sync")

        t, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(one(k) for k in range(sz["conc_threads"])))
        wall = time.perf_counter() - t
        cpu = time.process_time() - cpu
    finally:
        await system.close_async(saver)
    turns = sz["conc_threads"] * sz["conc_turns"]
    CPU_PER_TURN.setdefault(system.name, []).append(cpu / turns)
    return turns / wall


async def ceiling(sz: dict[str, int]) -> float:
    """The same concurrent run with LangGraph's ``InMemorySaver`` (no I/O): what the
    graph itself allows on this machine."""
    from langgraph.checkpoint.memory import InMemorySaver

    graph = chat_graph(InMemorySaver())

    async def one(k: int) -> None:
        cfg = {"configurable": {"thread_id": f"m-{k}"}}
        for i in range(sz["conc_turns"]):
            await graph.ainvoke(human(i), cfg, durability="sync")

    t = time.perf_counter()
    await asyncio.gather(*(one(k) for k in range(sz["conc_threads"])))
    return sz["conc_threads"] * sz["conc_turns"] / (time.perf_counter() - t)


def pct(samples: list[float], q: float) -> float:
    return samples[min(len(samples) - 1, int(q * len(samples)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--admin-url", default=None)
    args = ap.parse_args(argv)
    sz = QUICK if args.quick else FULL
    admin = args.admin_url or os.environ.get("ARES_BENCH_POSTGRES_URL") or DEFAULT_ADMIN_URL
    server = server_facts(admin)
    results: dict[str, dict[str, Any]] = {}
    conc: dict[str, list[float]] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        throwaway_db(admin, "lg_ares") as ares_db,
        throwaway_db(admin, "lg_peer") as peer_db,
    ):
        folder = Path(tmp)
        systems = [ares_pg(ares_db), lg_pg(peer_db), ares_sqlite(folder), lg_sqlite(folder)]
        for s in systems:
            print(f"long thread: {s.name} ...", file=sys.stderr, flush=True)
            results[s.name] = long_thread(s, sz)
        for rep in range(sz["reps"]):
            order = systems if rep % 2 == 0 else list(reversed(systems))
            for s in order:
                print(f"32 threads: {s.name} rep {rep} ...", file=sys.stderr, flush=True)
                conc.setdefault(s.name, []).append(asyncio.run(concurrent(s, sz)))
    top = asyncio.run(ceiling(sz))
    body = report(results, conc, sz, server, top)
    print(body)
    if not args.quick:
        write_section("langgraph", body, title="LangGraph checkpointer")
    return 0


def report(
    results: dict[str, dict[str, Any]],
    conc: dict[str, list[float]],
    sz: dict[str, int],
    server: dict[str, str],
    top: float,
) -> str:
    m = machine_description(
        [
            "langgraph",
            "langgraph-checkpoint",
            "langgraph-checkpoint-postgres",
            "langgraph-checkpoint-sqlite",
        ]
    )
    lines = [
        f"Measured {m['date']} by `bench/bench_langgraph.py`: {m['cpu']}, {m['os']},"
        f" {m['python']}, SQLite {m['sqlite']}, PostgreSQL {server.get('server_version', '?')}"
        f" (same machine); {m['libraries']}.",
        "",
        f"Chat graph with `add_messages`, ~200-character human and ~600-character AI"
        f' messages, `durability="sync"`. Bytes and put latency over the first'
        f" {sz['bytes_turns']} turns; get_tuple of the newest checkpoint (p50 of {GETS});"
        f" {sz['conc_threads']} asyncio tasks x {sz['conc_turns']} turns each, median of"
        f" {sz['reps']} repetitions.",
        "",
    ]
    names = list(results)
    rows = []
    for n in names:
        r = results[n]
        ps = r["put_samples"]
        rows.append(
            [
                n,
                f"{r['bytes'] / 1e6:.2f} MB",
                fmt_ms(pct(ps, 0.5)),
                fmt_ms(pct(ps, 0.99)),
                fmt_ms(r["get10"]),
                fmt_ms(r["get_end"]),
                fmt_ratio(r["get_end"] / r["get10"]),
                fmt_ms(r["get_cold"]) if "get_cold" in r else "",
                f"{Stats.of(conc[n]).median:.1f}"
                + (f" ({min(conc[n]):.1f}-{max(conc[n]):.1f})" if len(conc[n]) > 1 else ""),
            ]
        )
    lines.append(
        markdown_table(
            [
                "saver",
                f"bytes @ {sz['bytes_turns']} turns",
                "put p50",
                "put p99",
                "get_tuple @ 10",
                f"get_tuple @ {sz['long_turns']}",
                "ratio",
                "cold get_tuple",
                f"turns/s, {sz['conc_threads']} threads",
            ],
            rows,
        )
    )
    ap, lp = results["ares-events (PostgreSQL)"], results["langgraph-checkpoint-postgres"]
    asq, lsq = results["ares-events (SQLite)"], results["langgraph-checkpoint-sqlite"]
    cp = (
        Stats.of(conc["ares-events (PostgreSQL)"]).median
        / Stats.of(conc["langgraph-checkpoint-postgres"]).median
    )
    cs = (
        Stats.of(conc["ares-events (SQLite)"]).median
        / Stats.of(conc["langgraph-checkpoint-sqlite"]).median
    )

    def growth(r: dict[str, Any]) -> str:
        return fmt_ratio(r["get_end"] / r["get10"])

    lines += [
        "",
        "Ratios (ares-events vs the peer on the same backend):",
        "",
        f"- bytes: PostgreSQL saver / ares-events = {fmt_ratio(lp['bytes'] / ap['bytes'])}"
        f" (goal >= 10x); SQLite saver / ares-events = {fmt_ratio(lsq['bytes'] / asq['bytes'])}",
        f"- get_tuple at turn {sz['long_turns']} / at turn 10, ares-events: PostgreSQL"
        f" {growth(ap)}, SQLite {growth(asq)} (goal <= 1.5x); peers: PostgreSQL {growth(lp)},"
        f" SQLite {growth(lsq)}",
        f"- with the opt-in `value_cache=64`, ares-events get_tuple at turn 10 / at turn"
        f" {sz['long_turns']}: PostgreSQL {fmt_ms(ap['get10_cached'])} /"
        f" {fmt_ms(ap['get_end_cached'])} ({fmt_ratio(ap['get_end_cached'] / ap['get10_cached'])}),"
        f" SQLite {fmt_ms(asq['get10_cached'])} / {fmt_ms(asq['get_end_cached'])}"
        f" ({fmt_ratio(asq['get_end_cached'] / asq['get10_cached'])})",
        f"- {sz['conc_threads']} concurrent threads, ares-events / peer: PostgreSQL"
        f" {fmt_ratio(cp)} (goal >= 2x), SQLite {fmt_ratio(cs)}; CPU of this process per"
        " turn (median): "
        + ", ".join(f"{n} {fmt_ms(Stats.of(CPU_PER_TURN[n]).median)}" for n in names)
        + f"; the same run with `InMemorySaver` (no I/O): {top:.0f} turns/s",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
