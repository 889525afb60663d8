"""The verifiable log on SQLite: does the Merkle tree keep up with appends, and what do a
signed checkpoint and proofs cost after 10k, 100k and 1M events?

Run from the repository root::

    .venv/bin/python -m bench.bench_merkle            # 10k / 100k / 1M, writes docs/performance.md
    .venv/bin/python -m bench.bench_merkle --quick    # 2k / 20k, smoke run, writes nothing

One SQLite file (``synchronous=normal`` while it is filled; measurements reopen it with
the default FULL), filled with ~300-byte agent payloads in 1000-event appends, round-robin
over 100 streams. At each size:

* **append** (the peer the tree must keep up with): events/s of the 1000-event appends
  that grew the log to this size (FULL durability, the store's default).
* **tree, catch-up**: events/s of ``MerkleLog.catch_up()`` folding those same events
  (``read_all`` in 5000-event batches, SHA-256 leaves, tiles and cursor written per batch).
  Above the append rate means a runner keeps up with a writer appending as fast as it can.
* **sign a checkpoint**: ``MerkleLog.sign(key)`` on an up-to-date tree (catch-up check,
  the tree checked against every event it covers (``verify_rows``: ``O(n)``), root from
  ``O(log n)`` tiles, Ed25519 signature, stored row), median of 7; next to the naive way,
  recomputing the root from every event (``read_all`` + SHA-256 of every leaf and node,
  one run).
* **proofs**: an inclusion proof of a random leaf and a consistency proof from a random
  older size (median of 21 each), computed from the tiles.
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

import ares_events as ae
from ares_events.integrity.anchors import RootAccumulator
from ares_events.integrity.notes import SigningKey
from bench.common import (
    Stats,
    fmt_ms,
    fmt_rate,
    machine_description,
    make_payloads,
    markdown_table,
    write_section,
)

BATCH = 1000
STREAMS = 100


def _fill(url: str, start: int, stop: int, payloads: list[dict[str, object]]) -> float:
    """Append events ``start..stop`` in 1000-event batches; return events/s."""
    with ae.open_store(url) as store:
        t = time.perf_counter()
        for i in range(start, stop, BATCH):
            n = min(BATCH, stop - i)
            store.append(
                f"agent-{(i // BATCH) % STREAMS:03d}",
                [
                    ae.NewEvent(
                        type="tool.returned",
                        module="bench",
                        payload=payloads[(i + k) % len(payloads)],
                    )
                    for k in range(n)
                ],
            )
        return (stop - start) / (time.perf_counter() - t)


def run(sizes: list[int], workdir: Path) -> list[list[str]]:
    """Grow one log through ``sizes``; measure at each. Returns table rows."""
    db = workdir / "merkle.db"
    url = f"sqlite:///{db}"
    key = SigningKey.generate("bench.example/log")
    payloads = make_payloads(5000)
    rows: list[list[str]] = []
    done = 0
    rng = random.Random(7)
    for size in sizes:
        append_rate = _fill(url, done, size, payloads)
        done = size
        with ae.open_store(url) as store:
            log = ae.MerkleLog(store)
            t = time.perf_counter()
            folded = log.catch_up()
            tree_rate = folded / (time.perf_counter() - t)
            assert log.size() == size
            signs = []
            for _ in range(7):
                t = time.perf_counter()
                cp = log.sign(key, store=True)
                signs.append(time.perf_counter() - t)
            t = time.perf_counter()
            acc = RootAccumulator()
            for e in store.read_all():
                acc.add(e.hash)
            naive = time.perf_counter() - t
            assert acc.root() == cp.checkpoint.root
            incl, cons = [], []
            for _ in range(21):
                i = rng.randrange(size)
                t = time.perf_counter()
                log.inclusion_proof(i, size)
                incl.append(time.perf_counter() - t)
                old = rng.randrange(1, size)
                t = time.perf_counter()
                log.consistency_proof(old, size)
                cons.append(time.perf_counter() - t)
        rows.append(
            [
                f"{size:,}",
                fmt_rate(append_rate),
                fmt_rate(tree_rate),
                f"{tree_rate / append_rate:.1f}x",
                fmt_ms(Stats.of(signs).median),
                fmt_ms(naive),
                fmt_ms(Stats.of(incl).median),
                fmt_ms(Stats.of(cons).median),
            ]
        )
        print(" | ".join(rows[-1]), flush=True)
    return rows


def main() -> None:
    """Run the benchmark and (unless --quick) rewrite its section of docs/performance.md."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes; write nothing")
    ap.add_argument("--dir", type=Path, default=None, help="where the database goes")
    args = ap.parse_args()
    sizes = [2_000, 20_000] if args.quick else [10_000, 100_000, 1_000_000]
    workdir = Path(tempfile.mkdtemp(prefix="ares-bench-merkle-", dir=args.dir))
    try:
        rows = run(sizes, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.quick:
        return
    machine = machine_description()
    table = markdown_table(
        [
            "events",
            "append (1000/batch)",
            "tree catch-up",
            "tree / append",
            "sign checkpoint",
            "naive root (all events)",
            "inclusion proof",
            "consistency proof",
        ],
        rows,
    )
    body = (
        f"Machine: {machine['cpu']}, {machine['os']}, {machine['python']}, "
        f"SQLite {machine['sqlite']}, {machine['date']}. Command: "
        "`.venv/bin/python -m bench.bench_merkle`.\n\n" + table
    )
    write_section("merkle", body, title="The verifiable log (Merkle tree, checkpoints, proofs)")


if __name__ == "__main__":
    main()
