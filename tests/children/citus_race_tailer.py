"""A tailer process of the Citus merged-log race (tests/stores/test_cells_citus_race.py).

``python -m tests.children.citus_race_tailer URL AFTER STOP OUT`` follows
``read_all(after_position=last.position, limit=500)`` from position AFTER in a tight loop
until the file STOP exists, then drains twice (until a read returns nothing, twice) and
writes the event ids it saw, in order, one per line, to OUT. A read that fails with
``StoreUnavailable`` (a worker restarting) is tried again.
"""

from __future__ import annotations

import os
import sys
import time

import ares_events as ae
from ares_events.errors import StoreUnavailable


def main(argv: list[str]) -> None:
    url, after, stop, out = argv
    cursor = int(after)
    seen: list[str] = []

    def drain() -> int:
        nonlocal cursor
        got = 0
        try:
            for e in store.read_all(after_position=cursor, limit=500):
                cursor = e.position
                seen.append(e.event_id_str)
                got += 1
        except StoreUnavailable:
            time.sleep(0.05)
            return -1
        return got

    while True:
        try:
            store = ae.open_store(url)
            break
        except StoreUnavailable:
            time.sleep(0.1)
    with store:
        while not os.path.exists(stop):
            drain()
        for _ in range(2):
            while drain() != 0:
                pass
    with open(out, "w") as f:
        f.write("".join(f"{eid}\n" for eid in seen))


if __name__ == "__main__":
    main(sys.argv[1:])
