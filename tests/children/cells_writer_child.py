"""A writer process for the cell-store race and move tests.

``python -m tests.children.cells_writer_child URL INDEX COUNT OUT SEED [RAW_URL...]`` appends
``COUNT`` events to a few streams of its own, and at random: appends with a wrong
expected version (a transaction that took its xid and rolls back), and raw transactions
on a cell's server that take an xid, wait a moment and roll back (RAW_URL, holding the
visibility bound back meanwhile). Each committed append is written to OUT as one JSON line
``[stream, version, event_id]``; appends that fail with ``StoreUnavailable`` (a cell
moving) are retried with the same event ids, which is safe: appends are idempotent.
"""

from __future__ import annotations

import json
import random
import sys
import time

import psycopg

import ares_events as ae
from ares_events.errors import ConcurrencyError, StoreUnavailable


def main(argv: list[str]) -> None:
    url, index, count, out, seed, *raw = argv
    rnd = random.Random(int(seed))
    streams = [f"w{index}-s{k}" for k in range(5)]
    raws = [psycopg.connect(u, autocommit=True) for u in raw]
    with ae.open_store(url) as store, open(out, "w") as f:
        for n in range(int(count)):
            sid = rnd.choice(streams)
            roll = rnd.random()
            if roll < 0.15:
                try:  # the locked path rolls back after taking its xid
                    store.append(
                        sid,
                        [ae.NewEvent(type="t.bad", module="test", payload={"n": n})],
                        expected_version=10**9,
                    )
                except ConcurrencyError:
                    pass
            elif roll < 0.25 and raws:
                conn = rnd.choice(raws)
                with conn.transaction(force_rollback=True):
                    conn.execute("SELECT pg_current_xact_id()")
                    time.sleep(rnd.random() / 100)
            ev = ae.NewEvent(type="t.ok", module="test", payload={"n": n, "w": int(index)})
            for attempt in range(200):
                try:
                    res = store.append(sid, [ev])
                    break
                except StoreUnavailable:
                    time.sleep(0.05 * min(attempt + 1, 10))  # a moving cell: retry
            else:
                raise SystemExit(f"writer {index}: append kept failing")
            f.write(json.dumps([sid, res.version, str(ev.event_id)]) + "\n")
            f.flush()
    for c in raws:
        c.close()


if __name__ == "__main__":
    main(sys.argv[1:])
