"""SQLite's page size: what the 2 KiB pages of a new ares-events file give and cost against
the 4 KiB pages SQLite would choose, with eventsourcing (its own defaults) as the yardstick.

Run from the repository root::

    .venv/bin/python -m bench.bench_sqlite_pages          # full sizes, writes docs/performance.md
    .venv/bin/python -m bench.bench_sqlite_pages --quick  # small sizes, writes nothing

Systems, interleaved (A B C, C B A, ...), a fresh file per repetition of a write workload:

* ``2 KiB pages``: ``ae.open_store`` on a new file (the default since this choice).
* ``4 KiB pages``: the same store on a file made first with ``PRAGMA page_size = 4096``,
  as an earlier build made them (a file with content keeps its page size).
* ``eventsourcing``: its SQLite recorder, as in ``bench.bench_sqlite``.

Workloads: the ~300-byte payloads of ``bench.bench_sqlite`` (1-event appends, 10-event
appends over 1,000 streams, 100-event batches, the verified replay of a 100k-event stream,
its last 100 events), and 1-event appends and a verified replay of 4 KB payloads (a model
reply with its context), where a row no longer fits a 2 KiB page.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench import bench_sqlite as bs
from bench.common import (
    fmt_ms,
    fmt_rate,
    fmt_ratio,
    interleave,
    machine_description,
    markdown_table,
    timed,
    write_section,
)


class Ours4k(bs.Ours):
    """ares-events on a file whose page size was set to 4 KiB before the store made it."""

    def __init__(self, path: Path) -> None:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA page_size = 4096")
            conn.execute("PRAGMA journal_mode = WAL")  # writes the header: the size sticks
        finally:
            conn.close()
        super().__init__(path)
        if self.pragma("page_size") != 4096:
            raise RuntimeError("the 4 KiB file did not keep its page size")


SYSTEMS: dict[str, type[bs.Ours]] = {"2 KiB pages": bs.Ours, "4 KiB pages": Ours4k}
Run = Callable[[], tuple[float, float]]


def _rate_rows(label: str, runs: dict[str, Run], events: int, reps: int) -> list[list[str]]:
    t = interleave(runs, reps)
    es = events / t["eventsourcing"].median
    rows = []
    for name in runs:
        rate = events / t[name].median
        rows.append([label, name, f"**{fmt_rate(rate)}**", fmt_ratio(rate / es)])
        label = ""
    return rows


def _read_rows(label: str, runs: dict[str, Run], reps: int) -> list[list[str]]:
    t = interleave(runs, reps)
    es = t["eventsourcing"].median
    rows = []
    for name in runs:
        rows.append([label, name, f"**{fmt_ms(t[name].median)}**", fmt_ratio(es / t[name].median)])
        label = ""
    return rows


def _tails(tail: Callable[[int], object]) -> None:
    for _ in range(100):
        tail(100)


def _timed_call(fn: Callable[[], object]) -> Run:
    return lambda: timed(fn)[:2]


def run(root: Path, quick: bool) -> list[list[str]]:
    """Every workload, in the order of the table."""
    single, streams, batches, replay, reps = (
        (50, 100, 10, 5_000, 3) if quick else (300, 1_000, 100, 100_000, 9)
    )
    small, big = (
        bs.Payloads.make(max(replay, streams * 10 + 10)),
        bs.Payloads.make(max(single, 10_000), 4_000),
    )
    rows: list[list[str]] = []

    def writes(
        label: str, ours: Callable[[type[bs.Ours]], tuple[float, float]], es: Run, n: int
    ) -> None:
        runs: dict[str, Run] = {name: functools.partial(ours, s) for name, s in SYSTEMS.items()}
        runs["eventsourcing"] = es
        rows.extend(_rate_rows(label, runs, n, reps))
        print(rows[-3:], flush=True)

    writes(
        f"1-event appends ({single}/rep), 300 B",
        lambda s: bs.single_ours(root, small, single, [], s),
        lambda: bs.single_theirs(root, small, single, []),
        single,
    )
    writes(
        f"10-event appends over {streams:,} streams, 300 B",
        lambda s: bs.streams_ours(root, small, streams, 10, 1, s),
        lambda: bs.streams_theirs(root, small, streams, 10, 1),
        streams * 10,
    )
    writes(
        f"100-event batches ({batches}/rep), 300 B",
        lambda s: bs.batches_ours(root, small, batches, 100, s),
        lambda: bs.batches_theirs(root, small, batches, 100),
        batches * 100,
    )
    writes(
        f"1-event appends ({single}/rep), 4 KB",
        lambda s: bs.single_ours(root, big, single, [], s),
        lambda: bs.single_theirs(root, big, single, []),
        single,
    )
    for label, pl, n in (("300 B", small, replay), ("4 KB", big, len(big.dicts))):
        fx = {
            name: bs.ReadFixtures(Path(tempfile.mkdtemp(dir=root)), pl, n, s)
            for name, s in SYSTEMS.items()
        }
        first = next(iter(fx.values()))
        reads: dict[str, Run] = {name: _timed_call(f.replay_ours) for name, f in fx.items()}
        reads["eventsourcing"] = _timed_call(first.replay_theirs)
        rows.extend(_read_rows(f"verified replay of {n:,} events, {label}", reads, reps))
        if label == "300 B":
            tails: dict[str, Run] = {
                name: _timed_call(functools.partial(_tails, f.tail_ours)) for name, f in fx.items()
            }
            tails["eventsourcing"] = _timed_call(functools.partial(_tails, first.tail_theirs))
            rows.extend(_read_rows("last 100 events, 100 calls, 300 B", tails, reps))
        for f in fx.values():
            f.close()
        print(rows[-3:], flush=True)
    return rows


def main() -> None:
    """Run the benchmark and (unless --quick) rewrite its section of docs/performance.md."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; write nothing")
    ap.add_argument("--dir", type=Path, default=None, help="where the databases go")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ares-bench-pages-", dir=args.dir))
    try:
        rows = run(root, args.quick)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.quick:
        return
    m = machine_description()
    body = (
        f"Machine: {m['cpu']}, {m['os']}, {m['python']}, SQLite {m['sqlite']}, {m['date']}. "
        "Command: `.venv/bin/python -m bench.bench_sqlite_pages`. Medians of 9 interleaved "
        "repeats; the last column is how many times eventsourcing's rate (writes) or speed "
        "(reads) each system reaches.\n\n"
        + markdown_table(["workload", "system", "median", "vs eventsourcing"], rows)
    )
    write_section("sqlite_pages", body, title="SQLite page size")


if __name__ == "__main__":
    main()
