"""Child process for the runner crash test: catch a counting projection up, slowly.

Usage: ``python -m tests.children.runner_child STORE_URL BATCH_SIZE``. The parent SIGKILLs it at
arbitrary points; each run resumes from the saved cursor. Exits 0 once caught up.
"""

from __future__ import annotations

import sys
import time
from typing import Any, ClassVar

import ares_events as ae
from ares_events.core.events import RecordedEvent
from ares_events.projections import ProjectionRunner


class CountingProjection:
    """State per stream = number of events applied to it (a double apply shows up)."""

    name: ClassVar[str] = "counter"
    version: ClassVar[int] = 1

    def initial(self) -> int:
        """Nothing counted."""
        return 0

    def apply(self, state: Any, event: RecordedEvent) -> int:
        """Count one event; pause briefly so the parent can kill mid-batch."""
        time.sleep(0.0005)
        return int(state) + 1


def main(argv: list[str]) -> int:
    """Run the runner until idle."""
    url, batch = argv[0], int(argv[1])
    with ae.open_store(url) as store:
        ProjectionRunner(store, [CountingProjection()], batch_size=batch).run_until_idle()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
