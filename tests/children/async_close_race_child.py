"""Child process of tests/core/test_close_race.py for the asyncio store: close it while tasks
use it.

Run as ``python -m tests.children.async_close_race_child BACKEND URL ITERATIONS``. Each iteration
opens the store with ``ae.open_async_store``, starts tasks that append, read, page through
``read_all``, load snapshots, subscribe and wait, lets them run a few milliseconds, awaits
``close()``, then checks:

- every task ended, with success or ``StoreClosed`` only (a task still running 30 s after
  close() is a hang);
- no connection of the store is open once ``close()`` returned (SQLite: no file
  descriptor on the database files; PostgreSQL: no session with the store's
  application_name), and nothing was written after it returned;
- a call after close() raises ``StoreClosed``.

Prints one JSON summary line; exits 1 on a violation. A crash kills only this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import ares_events as ae
from tests.children.close_race_child import Probe

HANG = 30.0


def _ev(i: int) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"i": i})


async def one_iteration(
    backend: str, url: str, probe: Probe, i: int, tally: Counter[str]
) -> list[str]:
    problems: list[str] = []
    store = await ae.open_async_store(url)
    if i == 0:
        await store.append("s", [_ev(-1)])
        await ae.asnapshot(store, "s", ae.projections.RecoveryStateProjection())
    errors: list[str] = []
    # Every fifth iteration closes only after an append and a read have succeeded, so
    # the test's "calls succeeded" precondition holds on a loaded machine too; the
    # others close at a random moment, from before the first call to mid-flight.
    succeeded = {"append": asyncio.Event(), "read": asyncio.Event()}

    async def guard(name: str, body: Callable[[], Awaitable[Any]]) -> None:
        try:
            while True:
                await body()
                tally[f"{name}.ok"] += 1
                if name in succeeded:
                    succeeded[name].set()
        except ae.StoreClosed:
            tally[f"{name}.closed"] += 1
        except BaseException as exc:  # anything but StoreClosed breaks the contract
            errors.append(f"{name}: {type(exc).__name__}: {exc}")

    async def append() -> None:
        await store.append("s", [_ev(i)])

    async def read() -> None:
        async for _ in store.read("s", limit=200):
            pass
        await store.head("s")

    async def read_all() -> None:
        async for _ in store.read_all(limit=300):
            pass

    async def snapshots() -> None:
        await store.snapshots.load("s", "recovery_state")

    async def subscribe() -> None:
        async for _ in store.subscribe(0, page=50):
            tally["subscribe.event"] += 1

    async def wait() -> None:
        await store.wait_for(2**62, 60)

    bodies = {
        "append": append,
        "append2": append,
        "read": read,
        "read_all": read_all,
        "snapshots": snapshots,
        "subscribe": subscribe,
        "wait": wait,
    }
    tasks = [asyncio.create_task(guard(name, fn)) for name, fn in bodies.items()]
    if i % 5 == 0:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(HANG):
                await asyncio.gather(*(e.wait() for e in succeeded.values()))
    await asyncio.sleep(random.uniform(0.0, 0.015))
    try:
        await asyncio.wait_for(store.close(), HANG)
    except TimeoutError:
        problems.append(f"iteration {i}: close() hung")
    closed_at_rows = await asyncio.to_thread(probe.rows) if backend != "memory" else 0
    open_conns = await asyncio.to_thread(probe.connections) if backend != "memory" else 0
    if open_conns:
        problems.append(f"iteration {i}: {open_conns} connection(s) open after close()")
    try:
        await store.append("s", [_ev(i)])
        problems.append(f"iteration {i}: append after close() succeeded")
    except ae.StoreClosed:
        pass
    _done, pending = await asyncio.wait(tasks, timeout=HANG)
    if pending:
        problems.append(f"iteration {i}: {len(pending)} task(s) hung after close()")
        for t in pending:
            t.cancel()
    if backend != "memory" and await asyncio.to_thread(probe.rows) != closed_at_rows:
        problems.append(f"iteration {i}: rows were written after close() returned")
    problems.extend(f"iteration {i}: {e}" for e in errors)
    return problems


async def amain(backend: str, url: str, iterations: int) -> int:
    app = f"async-close-race-{os.getpid()}"
    if backend == "postgres":
        url += f"&application_name={app}"
    probe = Probe(backend, url, app) if backend != "memory" else None
    tally: Counter[str] = Counter()
    problems: list[str] = []
    for i in range(iterations):
        problems.extend(await one_iteration(backend, url, probe, i, tally))  # type: ignore[arg-type]
        if len(problems) > 20:
            break
    print(json.dumps({"iterations": iterations, "tally": tally, "problems": problems[:20]}))
    return 1 if problems else 0


def main(argv: list[str]) -> int:
    backend, url, iterations = argv[0], argv[1], int(argv[2])
    return asyncio.run(amain(backend, url, iterations))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    raise SystemExit(main(sys.argv[1:]))
