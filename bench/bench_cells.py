"""Cell stores vs a single-node PostgreSQL store, same server, same run.

Run from the repository root::

    .venv/bin/python -m bench.bench_cells --quick     # small sizes, writes nothing
    .venv/bin/python -m bench.bench_cells             # routing rows, writes docs/performance.md
    .venv/bin/python -m bench.bench_cells --scale     # and the scale run (100k streams, 10M events)
    .venv/bin/python -m bench.bench_cells --citus-url postgresql://root@127.0.0.1:9700/postgres

The server comes from ``--admin-url`` (default ``postgresql://root@127.0.0.1:5432/postgres``);
the run creates a throwaway database and drops it at the end.

Systems: ``single`` is ``postgresql://...?schema=...`` (one schema); ``cells`` is
``pgcells://...?cells=3&partitions=64`` on the same server and database (three cell
schemas, one transaction-id clock); with ``--citus-url``, ``citus`` is the same through a
Citus coordinator (three distributed schemas on its workers, same machine).

Workloads (full / ``--quick``):

a. 1-event appends, one transaction each, round robin over 300 existing streams
   (1000 / 100 per rep, 5 / 3 reps): the routing overhead of an append (goal: 1.15x).
b. The last 100 events of a 1000-event stream: median latency of ``store.read`` over
   300 / 50 reads (goal: 1.2x).
c. ``read_all`` of every event of the store (about 100k / 10k events): the merged read
   over 3 cells vs one schema, best of 3.

The systems are interleaved within each workload (A B C, C B A, ...), so the load of a
shared machine falls on all of them alike.
e. ``--fix-cost`` (with ``--citus-url``): what issue 30's fix costs on Citus, before and
   after in one run, on two stores of the same cluster, interleaved: ``before`` writes as
   the plain server does (``INSERT ... SELECT``, which Citus commits in two phases),
   ``after`` with the one-phase router statements of ``cells/citus_clock.py``. The 1-event
   and 100-event append (median per append), the live tail (``read_all(after_position=...,
   limit=500)`` of the newest 100 events, p50) and a full merged ``read_all`` (best of 3).
d. ``--scale``: 100,000 streams x 100 events (10,000,000 events, 100-event appends, two
   writer processes) into 3 cells: time, rate, disk (``pg_total_relation_size`` of the cell
   schemas) and the time of a full ``audit``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import psycopg

import ares_events as ae
from bench.common import (
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    machine_description,
    make_payloads,
    markdown_table,
    throwaway_db,
    write_section,
)

ADMIN = "postgresql://root@127.0.0.1:5432/postgres"


def _ev(p: dict[str, Any]) -> ae.NewEvent:
    return ae.NewEvent(type="tool.called", module="bench", payload=p)


def _cells_url(db_url: str, prefix: str, scheme: str = "pgcells") -> str:
    parts = urlsplit(db_url)
    return f"{scheme}://{parts.netloc}{parts.path}?cells=3&partitions=64&prefix={prefix}"


def _systems(db_url: str, citus: str | None) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    out = {
        "single": f"{db_url}?schema=single_{tag}",
        "cells": _cells_url(db_url, f"cells_{tag}"),
    }
    if citus:
        out["citus"] = _cells_url(citus, f"bench_{tag}", "citus")
    return out


def _prepare(store: ae.EventStore, payloads: list[dict[str, Any]], total: int) -> str:
    """300 streams with one event, a 1000-event stream (its id returned), and ``total``
    events in 100-event appends over 300 more streams (for read_all)."""
    for i in range(300):
        store.append(f"agent-{i}", [_ev(payloads[0])])
    sid = "long"
    for i in range(0, 1000, 100):
        store.append(sid, [_ev(p) for p in payloads[i : i + 100]])
    for i in range(total // 100):
        store.append(f"r-{i % 300}", [_ev(p) for p in payloads[:100]])
    return sid


def _appends(store: ae.EventStore, n: int, payloads: list[dict[str, Any]]) -> float:
    """Seconds per 1-event append, round robin over the 300 streams."""
    t0 = time.perf_counter()
    for i in range(n):
        store.append(f"agent-{i % 300}", [_ev(payloads[i % len(payloads)])])
    return (time.perf_counter() - t0) / n


def _tail(store: ae.EventStore, sid: str) -> float:
    """Seconds to read the last 100 events of the 1000-event stream."""
    t0 = time.perf_counter()
    got = list(store.read(sid, from_version=901))
    took = time.perf_counter() - t0
    assert len(got) == 100
    return took


def _read_all(store: ae.EventStore) -> tuple[float, int]:
    """(events per second, events) of one full read_all."""
    t0 = time.perf_counter()
    n = sum(1 for _ in store.read_all())
    return n / (time.perf_counter() - t0), n


def _routing(
    systems: dict[str, str], n: int, reps: int, tails: int, total: int, say: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """Every workload on every system, the systems interleaved (A B C, C B A, ...) so a
    busy machine's ups and downs fall on all of them alike."""
    payloads = make_payloads(1000)
    stores = {name: ae.open_store(url) for name, url in systems.items()}
    try:
        sids = {}
        for name, store in stores.items():
            say(f"{name}: preparing")
            sids[name] = _prepare(store, payloads, total)
        names = list(stores)
        appends: dict[str, list[float]] = {k: [] for k in names}
        tail: dict[str, list[float]] = {k: [] for k in names}
        rates: dict[str, list[float]] = {k: [] for k in names}
        counts: dict[str, int] = {}
        for r in range(reps):
            say(f"rep {r + 1}/{reps}")
            for name in names if r % 2 == 0 else names[::-1]:
                appends[name].append(_appends(stores[name], n, payloads))
        for r in range(tails):
            for name in names if r % 2 == 0 else names[::-1]:
                tail[name].append(_tail(stores[name], sids[name]))
        for r in range(3):
            for name in names if r % 2 == 0 else names[::-1]:
                rate, counts[name] = _read_all(stores[name])
                rates[name].append(rate)
    finally:
        for store in stores.values():
            store.close()
    return {
        k: {
            "append_s": statistics.median(appends[k]),
            "tail_s": statistics.median(tail[k]),
            "read_all_rate": max(rates[k]),
            "read_all_events": counts[k],
        }
        for k in names
    }


def _fix_cost(citus: str, n: int, reps: int, tails: int, say: Callable[[str], None]) -> Any:
    """Issue 30's fix on and off, on two stores of one Citus cluster (docstring, e)."""
    from ares_events.stores.cells import citus_clock

    payloads = make_payloads(1000)
    tag = uuid.uuid4().hex[:6]
    modes = {"before": False, "after": True}
    stores = {m: ae.open_store(_cells_url(citus, f"fix{m}_{tag}", "citus")) for m in modes}
    out: dict[str, dict[str, float]] = {}
    try:
        for m, store in stores.items():
            say(f"fix cost: preparing {m}")
            citus_clock._ONE_PHASE = modes[m]
            _prepare(store, payloads, 20_000)
        ones: dict[str, list[float]] = {m: [] for m in modes}
        batches: dict[str, list[float]] = {m: [] for m in modes}
        tail: dict[str, list[float]] = {m: [] for m in modes}
        rates: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(reps):
            say(f"fix cost: rep {r + 1}/{reps}")
            for m in list(modes) if r % 2 == 0 else list(modes)[::-1]:
                citus_clock._ONE_PHASE = modes[m]
                ones[m].append(_appends(stores[m], n, payloads))
                t0 = time.perf_counter()
                for i in range(n // 10):
                    stores[m].append(f"b-{i % 50}", [_ev(p) for p in payloads[:100]])
                batches[m].append((time.perf_counter() - t0) / (n // 10))
        starts = {m: [e.position for e in store.read_all()][-101] for m, store in stores.items()}
        for r in range(tails):
            for m in list(modes) if r % 2 == 0 else list(modes)[::-1]:
                t0 = time.perf_counter()
                got = sum(1 for _ in stores[m].read_all(after_position=starts[m], limit=500))
                tail[m].append(time.perf_counter() - t0)
                assert got == 100, got
        for r in range(3):
            for m in list(modes) if r % 2 == 0 else list(modes)[::-1]:
                rates[m].append(_read_all(stores[m])[0])
        for m in modes:
            out[m] = {
                "append_s": statistics.median(ones[m]),
                "append100_s": statistics.median(batches[m]),
                "tail_s": statistics.median(tail[m]),
                "read_all_rate": max(rates[m]),
            }
    finally:
        citus_clock._ONE_PHASE = True
        for store in stores.values():
            store.close()
    return out


def _fix_rows(fix: dict[str, dict[str, float]], load: str) -> list[str]:
    b, a = fix["before"], fix["after"]

    def row(what: str, key: str, fmt: Callable[[float], str], inverse: bool = False) -> list[str]:
        ratio = b[key] / a[key] if inverse else a[key] / b[key]
        return [what, fmt(b[key]), fmt(a[key]), fmt_ratio(ratio)]

    return [
        "One run, `bench/bench_cells.py --fix-cost --citus-url ...`: a Citus 13.2 coordinator "
        "and two workers on this machine (`fsync = on`), two stores of 3 cells each, the "
        f"modes interleaved; {load}. `before`: an append's rows written by `INSERT ... SELECT` "
        "(Citus runs it as a COPY and commits in two phases); `after`: router "
        "`INSERT ... VALUES` committed in one phase (`cells/citus_clock.py`).",
        "",
        markdown_table(
            ["", "before", "after", "after / before"],
            [
                row("1-event append (median)", "append_s", fmt_ms),
                row("100-event append (median)", "append100_s", fmt_ms),
                row("live tail: read_all of the newest 100 (p50)", "tail_s", fmt_ms),
                row("merged read_all (best of 3)", "read_all_rate", fmt_rate, inverse=True),
            ],
        ),
        "",
        "(For the read_all rate, `after / before` is the time ratio: below 1 is faster.)",
    ]


def _scale_writer(url: str, first: int, count: int, events: int) -> None:
    payloads = make_payloads(events, seed=first + 1)
    with ae.open_store(url) as store:
        for s in range(first, first + count):
            store.append(f"agent-{s:06d}", [_ev(p) for p in payloads])


def _schema_bytes(db_url: str, prefix: str) -> int:
    with psycopg.connect(db_url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname LIKE %s AND c.relkind IN ('r', 'm')",
            (prefix + "%",),
        ).fetchone()
    return int(row[0]) if row else 0


def _scale(db_url: str, streams: int, events: int, writers: int) -> dict[str, Any]:
    prefix = f"scale_{uuid.uuid4().hex[:6]}"
    url = _cells_url(db_url, prefix)
    with ae.open_store(url):
        pass
    per = streams // writers
    ctx = multiprocessing.get_context("spawn")
    t0 = time.perf_counter()
    procs = [
        ctx.Process(target=_scale_writer, args=(url, w * per, per, events)) for w in range(writers)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a scale writer failed ({p.exitcode})")
    write_s = time.perf_counter() - t0
    total = per * writers * events
    size = _schema_bytes(db_url, prefix)
    with ae.open_store(url, create=False) as store:
        t1 = time.perf_counter()
        report = ae.integrity.audit(store)
        audit_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        merged = sum(1 for _ in store.read_all())
        read_s = time.perf_counter() - t2
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    return {
        "load": f"load average at the end {' / '.join(load)} on {os.cpu_count()} cores",
        "streams": per * writers,
        "events": total,
        "write_s": write_s,
        "write_rate": total / write_s,
        "bytes": size,
        "audit_s": audit_s,
        "audit_ok": report.ok,
        "audit_events": report.events_checked,
        "read_all_rate": merged / read_s,
    }


def _scale_rows(scale: dict[str, Any], events: int, writers: int) -> list[str]:
    return [
        f"3 cells of one server, {scale['streams']:,} streams x {events} events, 100-event "
        f"appends, {writers} writer processes (`bench/bench_cells.py --scale-only`; "
        f"{scale['load']}):",
        "",
        markdown_table(
            [
                "events",
                "write time",
                "write rate",
                "disk (3 cells)",
                "audit",
                "audit rate",
                "read_all rate",
            ],
            [
                [
                    f"{scale['events']:,}",
                    f"{scale['write_s']:,.0f} s",
                    fmt_rate(scale["write_rate"]),
                    f"{scale['bytes'] / 2**30:.2f} GiB",
                    f"{scale['audit_s']:,.0f} s ({'clean' if scale['audit_ok'] else 'findings'})",
                    fmt_rate(scale["audit_events"] / scale["audit_s"]),
                    fmt_rate(scale["read_all_rate"]),
                ]
            ],
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes; writes nothing")
    ap.add_argument("--admin-url", default=ADMIN)
    ap.add_argument("--citus-url", default=None, help="a Citus coordinator's admin URL")
    ap.add_argument("--scale", action="store_true", help="also the 10M-event scale run")
    ap.add_argument("--scale-only", action="store_true", help="only the scale run")
    ap.add_argument("--scale-streams", type=int, default=100_000)
    ap.add_argument("--scale-events", type=int, default=100)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--fix-cost", action="store_true", help="only issue 30's fix, on Citus")
    opts = ap.parse_args(argv)
    n, reps, total = (100, 3, 10_000) if opts.quick else (1000, 5, 100_000)
    results: dict[str, Any] = {"machine": machine_description()}

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    if opts.fix_cost:
        if not opts.citus_url:
            raise SystemExit("--fix-cost needs --citus-url")
        fix = _fix_cost(opts.citus_url, n, reps, 50 if opts.quick else 300, say)
        print(json.dumps({**results, "fix_cost": fix}, indent=2, default=str))
        if not opts.quick:
            with open("/proc/loadavg") as f:
                load = "load average at the end " + " / ".join(f.read().split()[:3])
            write_section(
                "cells-citus-fix",
                "\n".join(_fix_rows(fix, load)) + "\n",
                title="Cell stores on Citus: what the one-phase commit costs (issue 30)",
            )
        return 0
    per: dict[str, dict[str, float]] = {}
    scale = None
    with throwaway_db(opts.admin_url, "bench_cells") as db_url:
        systems = {} if opts.scale_only else _systems(db_url, opts.citus_url)
        if systems:
            per = _routing(systems, n, reps, 50 if opts.quick else 300, total, say)
        results["systems"] = per
        if opts.scale or opts.scale_only:
            streams = 2_000 if opts.quick else opts.scale_streams
            say(f"scale run: {streams} streams x {opts.scale_events} events")
            scale = _scale(db_url, streams, opts.scale_events, opts.writers)
            results["scale"] = scale
    print(json.dumps(results, indent=2, default=str))
    if opts.quick:
        return 0
    if scale is not None:
        write_section(
            "cells-scale",
            "\n".join(_scale_rows(scale, opts.scale_events, opts.writers)) + "\n",
            title="Cell stores: a scale run",
        )
    if not per:
        return 0
    base = per["single"]
    rows_a, rows_b, rows_c = [], [], []
    for name, m in per.items():
        rows_a.append([name, fmt_ms(m["append_s"]), fmt_ratio(m["append_s"] / base["append_s"])])
        rows_b.append([name, fmt_ms(m["tail_s"]), fmt_ratio(m["tail_s"] / base["tail_s"])])
        rows_c.append(
            [
                name,
                fmt_rate(m["read_all_rate"]),
                fmt_ratio(base["read_all_rate"] / m["read_all_rate"]),
            ]
        )
    with open("/proc/loadavg") as f:
        load = " / ".join(f.read().split()[:3])
    body = [
        "Method: `bench/bench_cells.py` (its docstring). One run, the same PostgreSQL 15 server "
        "for `single` and `cells` (three schemas of the same database, `pgcells://`)"
        + (
            "; `citus` is three distributed schemas behind a Citus 13.2 coordinator with two "
            "workers, all on this machine"
            if opts.citus_url
            else ""
        )
        + f". Machine: {results['machine'].get('cpu')}; load average at the end {load} "
        "(a shared machine: the ratios of one run are the result, not the rates).",
        "",
        "**1-event append** (median per append, round robin over 300 streams; goal 1.15x):",
        "",
        markdown_table(["system", "per append", "vs single"], rows_a),
        "",
        "**Tail read** (last 100 events of a 1000-event stream, p50; goal 1.2x):",
        "",
        markdown_table(["system", "p50", "vs single"], rows_b),
        "",
        f"**read_all** (every event, {base['read_all_events']:,.0f} in 601 streams, best of 3):",
        "",
        markdown_table(["system", "rate", "single / system"], rows_c),
    ]
    write_section("cells", "\n".join(body) + "\n", title="Cell stores: routing and merged reads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
