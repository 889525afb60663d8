"""Child process for the archive crash matrix: run an archive and ``kill -9`` itself
right after the ``NTH`` time it finishes ``STEP`` (one of
``ares_events.archive.job.STEPS``, or ``cell-deleted``: one cell's rows of a
segment deleted, the other cells' not yet, on a cell store).

Usage: ``python -m tests.children.archive_crash_child STORE_URL ARCHIVE_URL BEFORE SEGMENT
STEP NTH``.
Exits 0 when the run ends before that point.
"""

from __future__ import annotations

import os
import signal
import sys

import ares_events as ae
from ares_events.archive import job as archive_mod


def main() -> None:
    """Run the archive with a crash point."""
    url, to, before, segment, step, nth = sys.argv[1:7]
    seen = [0]

    def crash_after(name: str) -> None:
        if name == step:
            seen[0] += 1
            if seen[0] == int(nth):
                os.kill(os.getpid(), signal.SIGKILL)

    archive_mod._step = crash_after
    if step == "cell-deleted":
        from ares_events.stores.postgres.recorder import PostgresRecorder

        real = PostgresRecorder.delete_archived

        def delete_then_crash(self: PostgresRecorder, *args: object) -> int:
            n = real(self, *args)  # type: ignore[arg-type]
            crash_after(step)
            return n

        PostgresRecorder.delete_archived = delete_then_crash  # type: ignore[method-assign,assignment]
    with ae.open_store(url) as store:
        archive_mod.archive(store, to, before=int(before), segment_events=int(segment))


if __name__ == "__main__":
    main()
