"""How fast the web console renders on big stores (issue 23's goals).

Builds a SQLite store with STREAMS streams (one event each), one stream of EVENTS events
and one run of STEPS model steps, opens it read-only as ``ares-events ui`` does, serves it
with :class:`ares_events.ui.ConsoleServer` on a free loopback port and times real HTTP
requests (the median of REPEAT):

* the first page of the streams list, and a prefix search;
* a 100-event page in the middle of the long stream (chain status of the page included);
* the last page of the run's timeline (folded once, then from the cache), and the first
  load of it (the fold).

    .venv/bin/python bench/bench_ui.py            # 1,000,000 streams, 100,000 events, 10,000 steps
    .venv/bin/python bench/bench_ui.py --quick    # 50,000 / 20,000 / 1,000
"""

from __future__ import annotations

import argparse
import http.client
import statistics
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import ares_events as ae
from ares_events.agents.journal import Journal, ModelReply
from ares_events.ui import ConsoleServer

REPEAT = 7


def build(url: str, streams: int, events: int, steps: int) -> None:
    """Fill the store (synchronous=normal: building is not what is measured)."""
    t0 = time.perf_counter()
    with ae.open_store(url + "?synchronous=normal") as store:
        batch = 2000
        for lo in range(0, streams, batch):
            store.append_many(
                [
                    (
                        f"agent-{i:07d}",
                        [ae.NewEvent(type="note.added", module="runtime", payload={"i": i})],
                        ae.NO_STREAM,
                    )
                    for i in range(lo, min(lo + batch, streams))
                ]
            )
        for lo in range(0, events, 1000):
            store.append(
                "long-stream",
                [
                    ae.NewEvent(
                        type="note.added", module="runtime", payload={"n": n, "text": "x" * 80}
                    )
                    for n in range(lo, min(lo + 1000, events))
                ],
            )
        j = Journal(store, "run-long", snapshot_every=1000)
        for n in range(steps):
            j.model_call(
                [{"role": "user", "content": f"step {n}"}],
                {},
                call=lambda m, p: ModelReply({"text": "ok"}, {"total_tokens": 3}),
            )
    print(f"built in {time.perf_counter() - t0:.1f}s", file=sys.stderr)


def timed(conn_base: str, cookie: str, path: str, repeat: int = REPEAT) -> tuple[float, float]:
    """(first, median of the rest) seconds of GET ``path``."""
    parts = urlsplit(conn_base)
    times = []
    for _ in range(repeat):
        c = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
        t0 = time.perf_counter()
        c.request("GET", parts.path + path, headers={"Cookie": cookie})  # under the prefix
        r = c.getresponse()
        body = r.read()
        times.append(time.perf_counter() - t0)
        c.close()
        assert r.status == 200, (path, r.status, body[:300])
    return times[0], statistics.median(times[1:])


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--db", help="reuse (or create) this SQLite file")
    opts = ap.parse_args()
    streams, events, steps = (50_000, 20_000, 1_000) if opts.quick else (1_000_000, 100_000, 10_000)
    tmp = tempfile.TemporaryDirectory()
    path = Path(opts.db) if opts.db else Path(tmp.name) / "ui.db"
    url = f"sqlite:///{path.resolve()}"
    if not path.exists():
        build(url, streams, events, steps)
    with ae.open_store(url, create=False, read_only=True) as store:
        server = ConsoleServer(store, port=0).start()
        try:
            token = server.login_url.split("token=")[1]
            cookie = f"ares_console_{server.port}={token}"
            rows = [
                ("streams: first page", "/streams"),
                ("streams: prefix 'agent-05'", "/streams?prefix=agent-05"),
                ("stream: 100 events at the middle", f"/stream?id=long-stream&from={events // 2}"),
                ("run timeline: last page", "/run?id=run-long"),
                ("run timeline: first page", "/run?id=run-long&page=1"),
            ]
            title = f"{streams:,} streams, a {events:,}-event stream, a {steps:,}-step run"
            print(f"| {title} | first | median of {REPEAT - 1} |")
            print("| --- | ---: | ---: |")
            for name, p in rows:
                first, med = timed(server.base_url, cookie, p)
                print(f"| {name} | {first * 1000:.0f} ms | {med * 1000:.0f} ms |")
        finally:
            server.close()
    tmp.cleanup()


if __name__ == "__main__":
    main()
