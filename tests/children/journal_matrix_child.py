"""The crash matrix's driver: many SIGKILLed runs of ``journal_child``'s retry flow,
executed as a real subprocess by ``tests/agents/test_journal_crash_matrix.py``.

For each mode (reconcile, idempotent, none) it first runs one clean run to count its
event appends (A) and service invocations (C). Then, for every n in 1..A, a fresh run is
SIGKILLed right after its nth append, and for every k in 1..C a fresh run is SIGKILLed
inside its kth service invocation (after the effect: a rate limit counted, a model call
paid, a side effect landed); each killed run is then resumed once by a new process.

Every run (and every resumption) is its own process, forked from this one after the
imports (so hundreds of kills take seconds, not minutes); a fork opens its own store and
dies by a real ``SIGKILL``. The store URL comes from ``ARES_STORE_URL``. One JSON line per
run on stdout: ``{"run_id", "mode", "point", "killed", "resume": {...outcome...}}``.

    python tests/children/journal_matrix_child.py --services S.db --prefix P [--modes a,b]
    python tests/children/journal_matrix_child.py --services S.db --resume RUN:MODE [RUN:MODE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

# Run as a script: make the repository root importable, so the fake services' exception
# classes have the same module path (tests.children.journal_child) in every process.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ares_events.stores import open_store
from tests.children import journal_child as child


def in_fork(fn: Any) -> tuple[int, dict[str, Any]]:
    """Run ``fn()`` in a forked process; (its wait status' signal or 0, its JSON result)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into the parent's code
        os.close(rfd)
        try:
            out = fn()
        except BaseException as exc:
            out = {"outcome": "error", "error": repr(exc), "trace": traceback.format_exc()}
        os.write(wfd, json.dumps(out).encode())
        os.close(wfd)
        os._exit(0)
    os.close(wfd)
    chunks = []
    while chunk := os.read(rfd, 65536):
        chunks.append(chunk)
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    data = json.loads(b"".join(chunks)) if chunks else {}
    return sig, data


def run(url: str, services: str, run_id: str, mode: str, **kill: Any) -> tuple[int, dict[str, Any]]:
    """One process driving the run's retry loop (killed as ``kill`` says)."""
    return in_fork(lambda: child.run_once(url, services, run_id, flow="retry", mode=mode, **kill))


def count_appends(url: str, run_id: str) -> int:
    """Events of a run, read in a fork (this process never opens the store)."""
    _, out = in_fork(lambda: {"n": _stream_version(url, run_id)})
    return int(out["n"])


def _stream_version(url: str, run_id: str) -> int:
    store = open_store(url)
    try:
        return int(store.stream_version(run_id))
    finally:
        store.close()


def count_calls(services: str, run_id: str) -> int:
    """Service invocations of a run (rate limits, paid calls, tool invocations)."""
    with child.services_db(services) as c:
        n = 0
        for table in ("model_calls", "rate_limited", "tool_invocations"):
            n += c.execute(f"SELECT count(*) FROM {table} WHERE run = ?", (run_id,)).fetchone()[0]
        return int(n)


def main(argv: list[str] | None = None) -> int:
    """See the module docstring."""
    p = argparse.ArgumentParser(prog="journal_matrix_child")
    p.add_argument("--services", required=True)
    p.add_argument("--prefix", default="m")
    p.add_argument("--modes", default="reconcile,idempotent,none")
    p.add_argument("--resume", nargs="*", default=None, metavar="RUN:MODE")
    args = p.parse_args(argv)
    url = os.environ["ARES_STORE_URL"]

    def emit(record: dict[str, Any]) -> None:
        print(json.dumps(record), flush=True)

    if args.resume is not None:
        for item in args.resume:
            run_id, _, mode = item.rpartition(":")
            sig, out = run(url, args.services, run_id, mode)
            emit({"run_id": run_id, "mode": mode, "killed": sig == signal.SIGKILL, "resume": out})
        return 0

    for mode in args.modes.split(","):
        clean = f"{args.prefix}-{mode}-clean"
        sig, out = run(url, args.services, clean, mode)
        appends = count_appends(url, clean)
        calls = count_calls(args.services, clean)
        emit(
            {
                "run_id": clean,
                "mode": mode,
                "point": "clean",
                "killed": bool(sig),
                "resume": out,
                "appends": appends,
                "calls": calls,
            }
        )
        points = [("after-append", n, {"die_after": n}) for n in range(1, appends + 1)]
        points += [("in-call", k, {"die_in_call": k}) for k in range(1, calls + 1)]
        for label, n, kill in points:
            run_id = f"{args.prefix}-{mode}-{label}-{n}"
            sig, first = run(url, args.services, run_id, mode, **kill)
            _, out = run(url, args.services, run_id, mode)
            emit(
                {
                    "run_id": run_id,
                    "mode": mode,
                    "point": f"{label} {n}",
                    "killed": sig == signal.SIGKILL,
                    "first": first,
                    "resume": out,
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
