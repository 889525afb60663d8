"""``ares-events ui ARGS`` started only when told (a line on stdin), with every import
already done: a parent's SIGTERM sweep then lands across the console's own start-up
(signal handler, store, bind, address, serve) instead of mostly in Python's imports.
Prints ``ready`` when it waits; exits with the command's exit code."""

from __future__ import annotations

import sys

import ares_events.ui  # noqa: F401  (uvicorn and Starlette imported before the go)
from ares_events.cli import main

if __name__ == "__main__":
    print("ready", flush=True)
    sys.stdin.readline()
    sys.exit(main(sys.argv[1:]))
