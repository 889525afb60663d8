"""The archive on SQLite: how fast old events move out, what they cost there against in
the database, what a replay costs when most of the log is archived, and whether cold
readers scanning the archive slow a hot tail reader down.

Run from the repository root::

    .venv/bin/python -m bench.bench_archive           # quick: 100k events, writes nothing
    .venv/bin/python -m bench.bench_archive --full    # 1M events, rewrites docs/archive.md

One SQLite file filled with ~300-byte agent payloads (``bench.common.make_payloads``) in
appends of n/1000 events (1000 for a million), ten per stream, round-robin over 100 streams
(``synchronous=normal`` while filling),
copied, and the copy archived to a folder (``file://``: the cost of the format and the
read path, without a network) up to 90% of its positions:

* **archive rate**: events/s of ``archive(store, to, before=...)`` with its Merkle
  catch-up done beforehand (chain checks, leaf checks, compress, write, read back,
  verify, record, delete);
* **bytes per event**: the archive's objects (segments and manifests) per archived event,
  against the SQLite file per event (``page_count * page_size``, indexes included);
* **replay**: a fold of every event in global order (``read_all``, payload decoded) on
  the all-in-database copy and on the 90%-archived one (a fresh process-level cache:
  every block fetched and checked), and ``ae.replay`` of one stream;
* **hot tail under cold scans**: latency of a 10-event tail read of a stream
  (``read(stream, from_version=head - 9)``, 4,000 samples) on the idle store, then for
  10 s while 4 processes scan the whole archived log with ``read_all`` in a loop, then
  for 10 s while 4 processes run a busy loop at niceness 19 (the reference: the least
  any reader that runs at all can cost); three such rounds, the median of each p50 and
  p99, and the p99 ratio (the goal is within 1.1x).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import ares_events as ae
from ares_events.archive.job import archive
from bench.common import (
    Stats,
    fmt_ms,
    fmt_rate,
    machine_description,
    make_payloads,
    markdown_table,
    write_section,
)

STREAMS = 100
DOC = Path(__file__).resolve().parent.parent / "docs" / "archive.md"


def _fill(url: str, n: int) -> None:
    # Ten appends per stream whatever n (1000 events each for a million), so every stream's
    # last append is in the newest 10% of the log: its tail is in the database.
    batch = max(10, n // (STREAMS * 10))
    payloads = make_payloads(5000)
    with ae.open_store(url + "?synchronous=normal") as store:
        for i in range(0, n, batch):
            store.append(
                f"agent-{(i // batch) % STREAMS:03d}",
                [ae.NewEvent(type="tool.returned", module="bench",
                             payload=payloads[(i + k) % len(payloads)]) for k in range(batch)],
            )  # fmt: skip


def _db_bytes(path: Path) -> int:
    c = sqlite3.connect(path)
    try:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return int(c.execute("PRAGMA page_count").fetchone()[0]) * int(
            c.execute("PRAGMA page_size").fetchone()[0]
        )
    finally:
        c.close()


def _fold_all(url: str) -> tuple[float, int]:
    with ae.open_store(url) as store:
        t = time.perf_counter()
        n = tokens = 0
        for e in store.read_all():
            tokens += e.payload["tokens"]["completion"]
            n += 1
        return time.perf_counter() - t, n


def _replay_one(url: str) -> float:
    with ae.open_store(url) as store:
        t = time.perf_counter()
        r = ae.replay(store, "agent-007", lambda s, e: s + 1, 0, max_replay=10**9)
        assert not r.findings
        return time.perf_counter() - t


def _tail_latency(url: str, samples: int) -> Stats:
    out = []
    with ae.open_store(url) as store:
        heads = {f"agent-{i:03d}": store.stream_version(f"agent-{i:03d}") for i in range(STREAMS)}
        names = sorted(s for s, v in heads.items() if v >= 10)
        for i in range(samples):
            sid = names[i % len(names)]
            t = time.perf_counter()
            got = list(store.read(sid, from_version=heads[sid] - 9))
            out.append(time.perf_counter() - t)
            assert len(got) == 10
    return Stats.of(out)


def _cold_scanner(url: str, stop: Any, started: Any, counter: Any) -> None:
    with ae.open_store(url) as store:
        first = True
        while not stop.is_set():
            for i, _ in enumerate(store.read_all(), 1):
                if first:
                    first = False
                    with started.get_lock():
                        started.value += 1
                if stop.is_set():
                    break
                if i % 1000 == 0:
                    with counter.get_lock():
                        counter.value += 1000


def _burner(url: str, stop: Any, started: Any) -> None:
    """The reference load: a busy loop at niceness 19 (what any reader that takes only
    the CPU others leave costs a hot reader)."""
    os.nice(19)
    with started.get_lock():
        started.value += 1
    while not stop.is_set():
        for _ in range(100_000):
            pass


def _under(
    url: str, target: Any, args: tuple[Any, ...], counter: Any | None
) -> tuple[Stats, float]:
    """Tail-read latencies for at least 10 s while 4 processes run ``target``, and the
    events/s the counter saw."""
    ctx = mp.get_context("spawn")
    stop, started = ctx.Event(), ctx.Value("q", 0)
    procs = [ctx.Process(target=target, args=(url, stop, started, *args)) for _ in range(4)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 300
    while started.value < len(procs) and time.monotonic() < deadline:
        time.sleep(0.05)  # every process is at work before the clock starts
    c0 = counter.value if counter is not None else 0
    t = time.perf_counter()
    busy = _tail_latency(url, 2000)
    while time.perf_counter() - t < 10:
        busy = Stats.of([*busy.samples, *_tail_latency(url, 500).samples])
    busy_s = time.perf_counter() - t
    scanned = (counter.value - c0) if counter is not None else 0
    stop.set()
    for p in procs:
        p.join(60)
    return busy, scanned / busy_s


def _hot_tail_rounds(url: str, rounds: int) -> dict[str, float]:
    """Rounds of: idle, 4 cold scanners, 4 nice-19 busy loops; the median of each
    percentile over the rounds (other load on the machine moves single rounds)."""
    _tail_latency(url, 200)  # warm
    got: dict[str, list[float]] = {}
    counter = mp.get_context("spawn").Value("q", 0)
    for _ in range(rounds):
        idle = _tail_latency(url, 4000)
        busy, rate = _under(url, _cold_scanner, (counter,), counter)
        burn, _ = _under(url, _burner, (), None)
        for name, st in (("idle", idle), ("busy", busy), ("burn", burn)):
            got.setdefault(f"tail_{name}_p50", []).append(_p(st, 0.5))
            got.setdefault(f"tail_{name}_p99", []).append(_p(st, 0.99))
        got.setdefault("cold_scan_rate", []).append(rate)
    return {k: statistics.median(v) for k, v in got.items()}


def _p(stats: Stats, q: float) -> float:
    s = sorted(stats.samples)
    return s[max(0, int(q * len(s) + 0.5) - 1)]


def run(n: int, workdir: Path) -> dict[str, Any]:
    """Measure everything on ``n`` events; return the numbers."""
    base = workdir / "all.db"
    _fill(f"sqlite:///{base}", n)
    with ae.open_store(f"sqlite:///{base}") as store:
        ae.MerkleLog(store).catch_up()
    db_bytes = _db_bytes(base)
    arch_db = workdir / "archived.db"
    shutil.copy(base, arch_db)
    url_all, url_arch = f"sqlite:///{base}", f"sqlite:///{arch_db}"
    to = (workdir / "archive").as_uri()
    with ae.open_store(url_arch) as store:
        events = list(store.read_all(after_position=int(n * 0.9) - 1, limit=1))
        before = events[0].position
        t = time.perf_counter()
        rep = archive(store, to, before=before)
        archive_s = time.perf_counter() - t
    archived_db_bytes = _db_bytes(arch_db)
    res: dict[str, Any] = {
        "events": n,
        "archived": rep.events_archived,
        "segments": len(rep.segments),
        "archive_rate": rep.events_archived / archive_s,
        "archive_bytes_per_event": rep.archive_bytes / rep.events_archived,
        "db_bytes_per_event": db_bytes / n,
        "db_after_bytes": archived_db_bytes,
        "db_before_bytes": db_bytes,
    }
    res["fold_all_db"], count = _fold_all(url_all)
    res["fold_archived"], count2 = _fold_all(url_arch)
    assert count == count2 == n
    res["replay_stream_db"] = _replay_one(url_all)
    res["replay_stream_archived"] = _replay_one(url_arch)
    tails = _hot_tail_rounds(url_arch, rounds=3)
    res.update(tails)
    return res


def render(r: dict[str, Any]) -> str:
    """The results as markdown."""
    m = machine_description()
    rows = [
        ["archive rate", fmt_rate(r["archive_rate"]),
         f"{r['archived']:,} events in {r['segments']} segments"],
        ["bytes per event, archive", f"{r['archive_bytes_per_event']:.0f} B",
         f"database: {r['db_bytes_per_event']:.0f} B per event "
         f"({r['db_bytes_per_event'] / r['archive_bytes_per_event']:.1f}x the archive)"],
        ["database file after archiving", f"{r['db_after_bytes'] / 2**20:.1f} MiB",
         f"before: {r['db_before_bytes'] / 2**20:.1f} MiB (freed pages reused; VACUUM shrinks)"],
        [f"fold of all {r['events']:,} events, all in the database",
         fmt_ms(r["fold_all_db"]), fmt_rate(r["events"] / r["fold_all_db"])],
        ["same, 90% archived (every block fetched, checked)", fmt_ms(r["fold_archived"]),
         f"{fmt_rate(r['events'] / r['fold_archived'])} "
         f"({r['fold_archived'] / r['fold_all_db']:.2f}x)"],
        [f"replay of one stream ({r['events'] // STREAMS:,} events), database",
         fmt_ms(r["replay_stream_db"]), ""],
        ["same, 90% archived", fmt_ms(r["replay_stream_archived"]),
         f"{r['replay_stream_archived'] / r['replay_stream_db']:.2f}x"],
        ["tail read (10 events), idle: p50 / p99",
         f"{fmt_ms(r['tail_idle_p50'])} / {fmt_ms(r['tail_idle_p99'])}", ""],
        ["same, 4 cold scanners: p50 / p99",
         f"{fmt_ms(r['tail_busy_p50'])} / {fmt_ms(r['tail_busy_p99'])}",
         f"p99 {r['tail_busy_p99'] / r['tail_idle_p99']:.2f}x idle; scanners read "
         f"{fmt_rate(r['cold_scan_rate'])} together"],
        ["reference: 4 busy loops at nice 19: p50 / p99",
         f"{fmt_ms(r['tail_burn_p50'])} / {fmt_ms(r['tail_burn_p99'])}",
         f"p99 {r['tail_burn_p99'] / r['tail_idle_p99']:.2f}x idle (the floor for a cold "
         "reader that uses only spare CPU)"],
    ]  # fmt: skip
    machine = "; ".join(f"{k} {v}" for k, v in m.items())
    return f"Measured {m['date']} ({machine}).\n\n" + markdown_table(
        ["what", "result", "detail"], rows
    )


def main() -> None:
    """Run the benchmark; with --full, rewrite its section of docs/archive.md."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", action="store_true", help="1M events; write docs/archive.md")
    ap.add_argument("--events", type=int, default=None, help="override the event count")
    ap.add_argument("--dir", type=Path, default=None, help="where the files go")
    args = ap.parse_args()
    n = args.events or (1_000_000 if args.full else 100_000)
    workdir = Path(tempfile.mkdtemp(prefix="ares-bench-archive-", dir=args.dir))
    try:
        res = run(n, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    body = render(res)
    print(body)
    if args.full:
        write_section("archive", body, path=DOC, title="Measured")


if __name__ == "__main__":
    main()
