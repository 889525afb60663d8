"""``python -m ares_events``: the ``ares-events`` command line."""

from __future__ import annotations

from ares_events.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
