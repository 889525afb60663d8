"""Helpers of the store conformance suite. May import the public API."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.stores import Capability

__all__ = ["run_concurrent_appenders", "store_state"]

_MAX_I64 = 2**63 - 1


def _ev(n: int = 0, **kw: Any) -> ae.NewEvent:
    return ae.NewEvent(**{"type": "test.happened", "module": "contract", "payload": {"n": n}, **kw})


def _evs(count: int, start: int = 0) -> list[ae.NewEvent]:
    return [_ev(start + i) for i in range(count)]


def store_state(store: ae.EventStore) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]]:
    """Everything observable about a store's contents, for "unchanged" comparisons.

    Returns:
        The streams with their versions and every event's identity and hash, in order.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    # Stream by stream AND read_all: on PostgreSQL read_all stops below the oldest write
    # transaction still open in the database, so another session's transaction could move
    # that bound between two calls (the stream reads have no such bound); read_all still
    # shows a row that leaked into a stream without a head.
    streams = list(store.streams())
    rows = {
        (e.stream_id, e.version, e.position, e.event_id_str, e.hash)
        for sid, _ in streams
        for e in store.read(sid)
    }
    rows.update(
        (e.stream_id, e.version, e.position, e.event_id_str, e.hash) for e in store.read_all()
    )
    events = sorted(rows, key=lambda row: (row[2], row[0], row[1]))
    return streams, events


def _cursors(store: ae.EventStore) -> bool:
    """True for a store whose ``read_all`` positions are cell cursors
    (:attr:`Capability.CELL_CURSORS`): positions from ``read`` and appends are then a
    cell's own and are compared with ``read_all`` by stream and version instead."""
    return Capability.CELL_CURSORS in store.capabilities


def _same_cell(store: ae.EventStore, a: str, b: str) -> bool:
    """False when streams ``a`` and ``b`` live in different cells of a cell store, where
    event ids are unique per cell (a cell store's recorder names a stream's cell)."""
    from ares_events.core.recorder import backend_of

    cell_index = getattr(backend_of(store.recorder), "cell_index", None)
    return cell_index is None or cell_index(a) == cell_index(b)


def _in_threads(
    n: int,
    worker: Callable[[int], None],
    on_error: Callable[[], object] = lambda: None,
    meanwhile: Callable[[], object] = lambda: None,
) -> None:
    """Run ``worker(0..n-1)`` on ``n`` threads, and ``meanwhile()`` on this one; fail with
    what any of them raised (``on_error`` runs in the thread that failed, e.g. to break a
    barrier) or when one of them hangs."""
    errors: list[BaseException] = []

    def run(t: int) -> None:
        try:
            worker(t)
        except BaseException as exc:
            errors.append(exc)
            on_error()

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    meanwhile()
    for th in threads:
        th.join(120)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors


def _invalid(field: str, call: Callable[..., object], /, *args: Any, **kwargs: Any) -> InvalidEvent:
    """The InvalidEvent ``call(*args, **kwargs)`` must raise, naming ``field``."""
    with pytest.raises(InvalidEvent) as info:
        call(*args, **kwargs)
    assert info.value.field == field
    return info.value


def _require(store: ae.EventStore, cap: Capability) -> None:
    if cap not in store.capabilities:
        pytest.skip(f"store does not declare Capability.{cap.name}")


def _appender_main(argv: Sequence[str]) -> None:
    url, stream, proc_s, n_s, pause_s, go = argv
    proc, n, pause = int(proc_s), int(n_s), float(pause_s)
    Path(f"{go}.ready.{proc}").touch()
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("start signal never came")
        time.sleep(0.005)
    conflicts = 0
    with ae.open_store(url) as store:
        for k in range(n):
            event = ae.NewEvent(
                type="contract.appended", module="contract", payload={"proc": proc, "k": k}
            )
            while True:
                version = store.stream_version(stream)
                try:
                    store.append(stream, [event], expected_version=version)
                    break
                except ConcurrencyError:
                    conflicts += 1  # another process won this version: re-read and retry
            if pause:
                time.sleep(pause * random.random())  # "work" between steps, as agents do
    print(json.dumps({"proc": proc, "stream": stream, "appended": n, "conflicts": conflicts}))


def run_concurrent_appenders(
    url: str,
    streams: Sequence[str],
    *,
    processes: int,
    appends: int,
    workdir: str | os.PathLike[str],
    pause: float = 0.0,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Run ``processes`` real OS processes appending to ``url`` at the same time.

    Process ``i`` appends ``appends`` events (payload ``{"proc": i, "k": k}``) one at a
    time to ``streams[i % len(streams)]``, each with ``expected_version`` set to the
    version it just read, re-reading and retrying on :class:`ConcurrencyError`. All
    processes start appending together (they wait for a start signal once imported).
    With ``pause``, each process sleeps up to that many seconds between appends, which
    interleaves the processes more finely.

    Returns:
        One summary per process: ``proc``, ``stream``, ``appended``, ``conflicts``.

    Raises:
        pytest.fail.Exception: a process failed or did not finish within ``timeout``.
    """
    go = Path(workdir) / f"go-{uuid.uuid4().hex}"
    code = (
        "import sys; from ares_events.testing._contract_helpers import _appender_main as m; "
        "m(sys.argv[1:])"
    )
    procs = [
        subprocess.Popen(  # noqa: S603 - runs this Python with this module's own code
            [sys.executable, "-c", code, url, streams[i % len(streams)]]
            + [str(arg) for arg in (i, appends, pause, go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        deadline = time.monotonic() + timeout
        while not all(Path(f"{go}.ready.{i}").exists() for i in range(processes)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        go.touch()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                pytest.fail(f"appender process exited with {p.returncode}:\n{stderr[-3000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
