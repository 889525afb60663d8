"""In-process store: ``memory://`` (private per open) or ``memory://NAME`` (shared by name
in this process); not durable.

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

from ares_events.stores.memory.recorder import MemoryRecorder, MemorySnapshotRows
from ares_events.stores.memory.recorder_async import AsyncMemoryRecorder, AsyncMemorySnapshotRows

__all__ = ["AsyncMemoryRecorder", "AsyncMemorySnapshotRows", "MemoryRecorder", "MemorySnapshotRows"]
