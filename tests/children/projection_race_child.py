"""Child process for the read-model race tests (tests/projections/test_runner_races.py).

Usage: ``python -m tests.children.projection_race_child STORE_URL ROLE VERSION BATCH`` where ROLE is
``runner`` (a :class:`ProjectionRunner` catches up), ``rebuild`` or ``rebuild-scratch``
(:func:`rebuild`, the second with ``from_scratch``). The child opens the store, prints
``ready`` and waits for one line on stdin, so the parent starts every child's work at once.
Its INFO log lines go to stderr.

Exit codes: 0 done, 3 a rebuild refused with the documented "another rebuild of the same
projection is running" StoreError, 1 anything else (the error on stderr).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import ares_events as ae
from ares_events.core.events import RecordedEvent
from ares_events.errors import StoreError
from ares_events.projections import ProjectionRunner, rebuild

ANOTHER = "another rebuild of the same projection is running"


class VersionedCounter:
    """Events per stream, stamped with the version that applied them (a row folded by
    two versions, or by nobody, shows)."""

    name = "race"

    def __init__(self, version: int) -> None:
        self.version = version

    def initial(self) -> dict[str, int]:
        """Nothing counted."""
        return {"n": 0, "v": self.version}

    def apply(self, state: Any, event: RecordedEvent) -> dict[str, int]:
        """Count one event."""
        return {"n": int(state["n"]) + 1, "v": self.version}


def main(argv: list[str]) -> int:
    """Wait for the go line, then run the role."""
    url, role, version, batch = argv[0], argv[1], int(argv[2]), int(argv[3])
    p = VersionedCounter(version)
    # The runner's lifecycle lines on stderr: the parent sees which child waited.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with ae.open_store(url) as store:
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            if role == "runner":
                ProjectionRunner(store, [p], batch_size=batch).run_until_idle()
            else:
                rebuild(store, p, from_scratch=role == "rebuild-scratch", batch_size=batch)
        except StoreError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 3 if role != "runner" and ANOTHER in str(exc) else 1
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
