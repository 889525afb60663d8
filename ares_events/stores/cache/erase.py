"""Erasure through the Redis cache: :class:`CacheErasure`, a mixin of
:class:`~ares_events.stores.cache.CachedRecorder`.

It may import the core and :mod:`ares_events.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["CacheErasure"]


class CacheErasure:
    """``erase`` and the dropping of cached tails (a mixin: the recorder provides the
    attributes below)."""

    inner: Any
    _lock: threading.Lock
    _dirty: set[str]
    _redis: Any
    _redis_errors: tuple[type[BaseException], ...]
    _usable: Callable[[], bool]
    _call: Callable[..., Any]
    _failed: Callable[[BaseException], None]
    _ok: Callable[[], None]
    key: Callable[[str], bytes]

    def erase(self, stream_id: str, *args: Any) -> Any:
        """Erase in the inner store, then drop the stream's cached tail.

        Raises:
            StoreUnavailable: the inner store cannot be reached.
        """
        outcome = self.inner.erase(stream_id, *args)
        with self._lock:
            self._dirty.add(stream_id)
        self._drop_cached(stream_id)
        return outcome

    def _drop_cached(self, stream_id: str) -> bool:
        """True when the stream's cached tail is gone (or was never there)."""
        try:
            gone = self._usable() and self._call(self._redis.delete, self.key(stream_id))
        except self._redis_errors as exc:
            self._failed(exc)  # logs the outage; reads of the stream bypass the cache
            return False
        if type(gone) is not int:  # Redis bypassed (False), or skipped while closing
            return False
        self._ok()
        with self._lock:
            self._dirty.discard(stream_id)
        return True
