"""In-process store: ``memory://`` (private per open) or ``memory://NAME`` (shared by name).

Fast and not durable; for tests, examples and ephemeral agents. ``close()`` ends this
handle (every later call raises :class:`~ares_events.errors.StoreClosed`, and waiters in
``wait_for`` wake up with it); the data of ``memory://NAME`` stays for the other handles
of that name until the process ends, whichever face (blocking or asyncio) opened them.

What lives here: :mod:`.data` (the tables and the registry of named stores, shared by
both faces), :mod:`.recorder_async` (``AsyncMemoryRecorder``, written by hand) and
:mod:`.recorder` (``MemoryRecorder``, generated from it).

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

from ares_events.stores.memory.recorder import MemoryRecorder, MemorySnapshotRows
from ares_events.stores.memory.recorder_async import AsyncMemoryRecorder, AsyncMemorySnapshotRows

__all__ = ["AsyncMemoryRecorder", "AsyncMemorySnapshotRows", "MemoryRecorder", "MemorySnapshotRows"]
