"""A writer process of the Citus merged-log race (tests/stores/test_cells_citus_race.py).

``python -m tests.children.citus_race_writer URL TAG COUNT STREAMS OUT SEED`` appends
``COUNT`` single events to streams ``agent-000 .. agent-<STREAMS-1>`` shared with the other
writers: it reads the head and appends at that version, 1 in 10 on purpose at a stale
version, and retries on ``ConcurrencyError``. An append that fails with
``StoreUnavailable`` (a worker restarting, a cell moving) is retried with the same event
id until it is acknowledged (appends are idempotent, so a retry of an append that did
commit returns it). Each acknowledged append is one JSON line ``[stream, version,
event_id]`` in OUT, written after the acknowledgement; the exit code is 0 when every
event was acknowledged. ``ARES_CITUS_FIX=off`` writes with issue 30's fix switched off.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

import ares_events as ae
from ares_events.errors import ConcurrencyError, StoreUnavailable


def _retrying(what: str, call):  # type: ignore[no-untyped-def]
    for attempt in range(600):
        try:
            return call()
        except StoreUnavailable:
            time.sleep(0.05 * min(attempt + 1, 10))
    raise SystemExit(f"{what}: StoreUnavailable for too long")


def main(argv: list[str]) -> None:
    url, tag, count, streams, out, seed = argv
    if os.environ.get("ARES_CITUS_FIX") == "off":  # show the race of issue 30
        from ares_events.stores.cells import citus_clock

        citus_clock._ONE_PHASE = False
    rnd = random.Random(int(seed))
    names = [f"agent-{k:03d}" for k in range(int(streams))]
    store = _retrying("open", lambda: ae.open_store(url))
    with store, open(out, "w") as f:
        for n in range(int(count)):
            sid = rnd.choice(names)
            ev = ae.NewEvent(type="t.ok", module="test", payload={"n": n, "w": tag})
            while True:
                version = _retrying("head", lambda sid=sid: store.stream_version(sid))
                if rnd.random() < 0.1 and version > 0:
                    version -= 1  # stale on purpose: a transaction that rolls back
                try:
                    res = _retrying(
                        "append",
                        lambda sid=sid, version=version, ev=ev: store.append(
                            sid, [ev], expected_version=version
                        ),
                    )
                    break
                except ConcurrencyError:
                    continue
            f.write(json.dumps([sid, res.version, str(ev.event_id)]) + "\n")
            f.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
