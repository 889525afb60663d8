"""The backend contract, at the path plugin authors import it from.

The contract itself lives in :mod:`ares_events.core.recorder`: the core calls every
backend through it, so it belongs to the core. This module re-exports it unchanged, so a
third-party store keeps writing ``from ares_events.stores.base import Recorder, Batch``.

It may import only :mod:`ares_events.core`.
"""

from __future__ import annotations

from ares_events.core.backend import (
    AppendOutcome,
    Batch,
    Capability,
    Head,
    SealedEvent,
    TrackingRecord,
    check_tracking,
)
from ares_events.core.events import ExpectedVersion, RecordedEvent
from ares_events.core.recorder import Recorder
from ares_events.core.url import StoreURL, parse_bool

__all__ = [
    "AppendOutcome",
    "Batch",
    "Capability",
    "ExpectedVersion",
    "Head",
    "RecordedEvent",
    "Recorder",
    "SealedEvent",
    "StoreURL",
    "TrackingRecord",
    "check_tracking",
    "parse_bool",
]
