# Generated from _openai_session_async.py by tools/async_to_sync.py: do not edit.
""":class:`SessionLog` (one face written, the other generated), run by
:class:`~ares_events.integrations.openai_agents.AresSession`: the live items folded from
the stream, written under a run at the version it saw (:class:`SessionConflict`) or
directly as one atomic step (docs/guide-openai-agents.md).

It may import anything in the package (an integration is top layer), and no framework.
"""

from __future__ import annotations

import copy
import weakref
from threading import Lock
from typing import TYPE_CHECKING, Any, Final

from ares_events.core.events import ANY, NewEvent
from ares_events.errors import ConcurrencyError, SessionConflict
from ares_events.integrations._conversation import ConversationStream

if TYPE_CHECKING:
    from ares_events.core.events import ExpectedVersion
    from ares_events.core.store import EventStore

__all__ = ["MODULE", "T_CLEARED", "T_ITEMS", "T_POPPED", "SessionConflict", "SessionLog"]

MODULE: Final = "openai-agents"
T_ITEMS: Final = "oai.items"
T_POPPED: Final = "oai.popped"
T_CLEARED: Final = "oai.cleared"
POP_ATTEMPTS: Final = 100
"""A direct pop reads the newest item again this many times when other writers keep
landing first, then gives up with :class:`SessionConflict`."""


class SessionLog:
    """One session's stream: the live items and the writes (see the module docstring);
    its lock serialises its operations."""

    def __init__(self, store: EventStore, session_id: str, stream_id: str) -> None:
        self.store = store
        self.session_id = session_id
        self.view = ConversationStream(store, stream_id)
        self.lock = Lock()
        # The version each run last saw, by its run context (dropped with the run).
        self._runs: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._items: list[tuple[int, int, Any]] = []  # the live items, folded so far
        self._folded = 0  # how many of the view's events are folded into _items

    def get(self, wrapper: Any, limit: int | None) -> list[Any]:
        """Copies of the live items, oldest first (the latest ``limit``)."""
        with self.lock:
            self._refresh(wrapper)
            items = self._live()
            if limit is not None and limit >= 0:
                items = items[-limit:] if limit else []
            # Copies: a caller that edits an item must not edit the fold.
            return [copy.deepcopy(it) for _, _, it in items]

    def add(self, wrapper: Any, items: list[Any]) -> None:
        """Append ``items`` as one ``oai.items`` event."""
        ev = NewEvent(type=T_ITEMS, module=MODULE, payload={"items": items})
        with self.lock:
            if wrapper is not None and wrapper not in self._runs:
                self._refresh(wrapper)  # a run's first call: it sees the stream now
            self._write(wrapper, ev, ANY)

    def pop(self, wrapper: Any) -> Any:
        """Remove the newest live item (an ``oai.popped`` event) and return it."""
        with self.lock:
            for _ in range(POP_ATTEMPTS):
                self._refresh(wrapper)
                live = self._live()
                if not live:
                    return None
                version, index, item = live[-1]
                payload = {"version": version, "index": index}
                ev = NewEvent(type=T_POPPED, module=MODULE, payload=payload)
                try:
                    # Directly: at the version the newest item was read at, so a writer
                    # that lands first makes this pop read the newest item again.
                    self._write(wrapper, ev, self.view.version)
                except ConcurrencyError:
                    if wrapper is not None:
                        raise  # the run's SessionConflict
                    continue
                return copy.deepcopy(item)  # the fold's item is the stored event's payload
            v = self.view.version
            raise SessionConflict(self.session_id, self.view.stream_id, v, v)

    def clear(self, wrapper: Any, erase: bool, reason: str, by: str) -> None:
        """Append ``oai.cleared`` (when there is anything to clear); with ``erase``, also
        erase the payloads of the item events before it."""
        with self.lock:
            self._refresh(wrapper)
            until = self.view.version
            if until:
                ev = NewEvent(type=T_CLEARED, module=MODULE, payload={})
                until = self._write(wrapper, ev, ANY)
            if erase:
                doomed = [e.version for e in self.view.events if e.type == T_ITEMS]
                self.view.erase([v for v in doomed if v < until], reason=reason, by=by)

    def _refresh(self, wrapper: Any) -> None:
        self.view.refresh()
        # A run's first call pins the version it saw (the view's, just refreshed).
        if wrapper is not None and wrapper not in self._runs:
            self._runs[wrapper] = self.view.version

    def _write(self, wrapper: Any, ev: NewEvent, direct: ExpectedVersion) -> int:
        """Append ``ev`` (under a run: at its version, else a SessionConflict; directly:
        at ``direct``, else ConcurrencyError) and return its version."""
        expected = self._runs[wrapper] if wrapper is not None else direct
        try:
            res = self.view.append([ev], expected)
        except ConcurrencyError as exc:
            if wrapper is None:
                raise
            raise SessionConflict(
                self.session_id, self.view.stream_id, self._runs[wrapper], exc.actual
            ) from None
        if wrapper is not None:
            self._runs[wrapper] = res.version
        self.view.refresh()
        return res.version

    def _live(self) -> list[tuple[int, int, Any]]:
        """The items now, as ``(version, index, item)``, oldest first (the events read
        since the last call folded onto the ones before)."""
        events = self.view.events
        if self._folded > len(events):  # the view was dropped and read again
            self._items, self._folded = [], 0
        items = self._items
        for e in events[self._folded :]:
            p = e.payload if not e.payload_erased else {}
            if e.type == T_ITEMS:
                items.extend((e.version, i, it) for i, it in enumerate(p.get("items") or []))
            elif e.type == T_POPPED:
                at = (p.get("version"), p.get("index"))
                k = next((k for k in reversed(range(len(items))) if items[k][:2] == at), None)
                if k is not None:
                    del items[k]
            elif e.type == T_CLEARED:
                items.clear()
        self._folded = len(events)
        return items
