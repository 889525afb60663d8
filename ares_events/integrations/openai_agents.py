"""An OpenAI Agents SDK session on ares-events: :class:`AresSession` implements the SDK's
``Session`` protocol (``pip install 'ares-events[openai-agents]'``)::

    from agents import Agent, Runner
    from ares_events.integrations.openai_agents import AresSession

    session = AresSession("user-42", url="sqlite:///agents.db")
    result = await Runner.run(agent, "Hello", session=session)

One session is one hash-chained stream, ``openai-agents/<session_id>``, with three kinds
of events: ``oai.items`` (the items of one ``add_items`` call, written at once),
``oai.popped`` (``pop_item``: which item was removed) and ``oai.cleared``
(``clear_session``). History is never rewritten: a pop or a clear is an event, and the
items before it stay in the chain (``clear_session(erase=True)`` erases their payloads,
and records each erasure, where the user asks for it).

- **Two runs never interleave.** Every write names the stream version its run last saw.
  Under ``Runner.run`` the SDK hands the session its run context, and the version is
  pinned by the run's first session call and advanced only by the run's own writes; a
  direct caller's ``get_items`` pins it. When another run wrote in between, the write is
  refused with :class:`SessionConflict` (a :class:`~ares_events.errors.ConcurrencyError`)
  and nothing of it is stored: the loser re-runs its turn on the new history. Nothing is
  merged behind its back.
- **Verified before decoded.** Every read checks the chain (a MAC in keyed mode) and the
  head row of what it has not checked yet, and raises
  :class:`~ares_events.errors.ChainIntegrityError` before an item is returned.
- **Crash-safe.** An ``add_items`` is one append: after a ``kill -9`` the batch is there
  whole or not at all.

Under the session, :mod:`ares_events.integrations.openai_agents_journal` runs the agent's
model calls and tools through the run journal (a killed run resumes without re-paying
answered model calls or repeating tool side effects).

It may import anything in the package, and ``agents``.
"""

from __future__ import annotations

import asyncio
import copy
import weakref
from typing import TYPE_CHECKING, Any, Final, cast

from ares_events.core.events import NewEvent, validate_name
from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.integrations._conversation_async import AsyncConversationStream
from ares_events.stores.threaded import async_face

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory.session_settings import SessionSettings

    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["MODULE", "STREAM_PREFIX", "AresSession", "SessionConflict", "stream_of"]

STREAM_PREFIX: Final = "openai-agents/"
"""Streams of sessions: ``openai-agents/<session_id>``."""
MODULE: Final = "openai-agents"
T_ITEMS: Final = "oai.items"
T_POPPED: Final = "oai.popped"
T_CLEARED: Final = "oai.cleared"


class SessionConflict(ConcurrencyError):
    """Another run wrote to the session after this run last saw it; nothing of this
    write was stored.

    Two runs of one session would interleave their items; the second writer gets this
    error instead. Its turn was computed on a stale history: run it again (a new
    ``Runner.run``, or ``get_items`` then the write, for a direct caller).
    """

    def __init__(self, session_id: str, stream_id: str, expected: int, actual: int) -> None:
        self.session_id = session_id
        super().__init__(
            stream_id,
            expected,
            actual,
            f"session {session_id!r} was written by another run since this run read it "
            f"(version {expected}); nothing was stored: run the turn again",
        )


def stream_of(session_id: str) -> str:
    """The stream of a session.

    Raises:
        InvalidEvent: the session id is empty, too long or not printable.
    """
    if not isinstance(session_id, str):
        raise InvalidEvent("session_id", f"must be a str, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidEvent("session_id", "must not be empty")
    return validate_name(STREAM_PREFIX + session_id, "session_id")


class AresSession:
    """The SDK's ``Session`` protocol on one ares-events stream (see the module docstring).

    Args:
        session_id: the session (the stream is ``openai-agents/<session_id>``).
        url: a store URL (``sqlite:///agents.db``, ``postgresql://...``); the session
            opens it on first use and closes it in :meth:`close`.
        store: an open store instead (blocking or asyncio; left open by :meth:`close`).
        session_settings: the SDK's settings (``limit``: the default of ``get_items``).

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
        InvalidEvent: a bad session id.
    """

    def __init__(
        self,
        session_id: str,
        *,
        url: str | None = None,
        store: EventStore | AsyncEventStore | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        from ares_events.errors import ConfigError

        if (url is None) == (store is None):
            raise ConfigError("give exactly one of url= or store=")
        self.session_id = session_id
        self.session_settings = session_settings
        self.stream_id = stream_of(session_id)
        self._url = url
        self._store: AsyncEventStore | None = async_face(store) if store is not None else None
        self._owns = store is None
        self._view: AsyncConversationStream | None = None
        self._lock = asyncio.Lock()
        self._seen: int | None = None  # the version a direct caller last saw
        self._runs: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self._items: list[tuple[int, int, Any]] = []  # the live items, folded so far
        self._folded = 0  # how many of the view's events are folded into _items

    def __repr__(self) -> str:
        return f"AresSession({self.session_id!r})"

    # -- the Session protocol ------------------------------------------------------------

    async def get_items(
        self, limit: int | None = None, *, wrapper: Any = None
    ) -> list[TResponseInputItem]:
        """The session's items, oldest first; ``limit``: the latest ``limit`` of them
        (default ``session_settings.limit``; 0: none; negative: all).

        Raises:
            ChainIntegrityError: the stream does not verify (nothing is returned).
            StoreUnavailable: the store cannot be reached.
        """
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        async with self._lock:
            view = await self._fresh()
            self._observe(wrapper, view.version, read=True)
            items = list(self._live(view))
        if limit is not None and limit >= 0:
            items = items[-limit:] if limit else []
        # Copies: a caller that edits a returned item must not edit the session's fold.
        return [copy.deepcopy(it) for _, _, it in items]

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Append ``items`` as one event, at the version this run last saw.

        Raises:
            SessionConflict: another run wrote since (nothing was stored).
            InvalidEvent: an item is not JSON (nothing was stored).
            StoreUnavailable: the store cannot be reached.
        """
        if not items:
            return
        payload = {"items": [dict(it) if isinstance(it, dict) else it for it in items]}
        async with self._lock:
            await self._write(wrapper, [NewEvent(type=T_ITEMS, module=MODULE, payload=payload)])

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Remove the most recent item (an ``oai.popped`` event) and return it; None when
        the session is empty.

        Raises:
            SessionConflict: another run wrote since this run last saw the session.
        """
        async with self._lock:
            view = await self._fresh()
            self._observe(wrapper, view.version, read=False)
            live = self._live(view)
            if not live:
                return None
            version, index, item = live[-1]
            ev = NewEvent(
                type=T_POPPED, module=MODULE, payload={"version": version, "index": index}
            )
            await self._write(wrapper, [ev])
            return cast("TResponseInputItem", item)

    async def clear_session(
        self,
        *,
        wrapper: Any = None,
        erase: bool = False,
        reason: str = "clear_session",
        by: str = "openai-agents",
    ) -> None:
        """Clear the session (an ``oai.cleared`` event: the items stay in the chain).

        ``erase=True`` also erases the payloads of every item event before the clear
        (blobs too) and records each erasure (``reason``, ``by``) in
        ``ares-events/erasures``; the chain stays verifiable.

        Raises:
            SessionConflict: another run wrote since this run last saw the session.
        """
        async with self._lock:
            view = await self._fresh()
            self._observe(wrapper, view.version, read=False)
            if view.version:
                await self._write(wrapper, [NewEvent(type=T_CLEARED, module=MODULE, payload={})])
            if erase:
                doomed = [e.version for e in view.events if e.type == T_ITEMS]
                await view.erase(doomed, reason=reason, by=by)

    def _live(self, view: AsyncConversationStream) -> list[tuple[int, int, Any]]:
        """The items in the session now, as ``(version, index, item)``, oldest first
        (the events read since the last call folded onto the ones before)."""
        if self._folded > len(view.events):  # the view was dropped and read again
            self._items, self._folded = [], 0
        items = self._items
        for e in view.events[self._folded :]:
            p = e.payload if not e.payload_erased else {}
            if e.type == T_ITEMS:
                items.extend((e.version, i, it) for i, it in enumerate(p.get("items") or []))
            elif e.type == T_POPPED:
                at = (p.get("version"), p.get("index"))
                for k in range(len(items) - 1, -1, -1):
                    if (items[k][0], items[k][1]) == at:
                        del items[k]
                        break
            elif e.type == T_CLEARED:
                items.clear()
        self._folded = len(view.events)
        return items

    # -- plumbing ------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the store when the session opened it (from ``url=``)."""
        if self._owns and self._store is not None:
            await self._store.close()
            self._store = None
            self._view = None

    async def __aenter__(self) -> AresSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _fresh(self) -> AsyncConversationStream:
        if self._view is None:
            if self._store is None:
                from ares_events.stores import open_async_store

                assert self._url is not None
                self._store = await open_async_store(self._url)
            self._view = AsyncConversationStream(self._store, self.stream_id)
            self._items, self._folded = [], 0
        await self._view.refresh()
        return self._view

    def _observe(self, wrapper: Any, version: int, *, read: bool) -> None:
        """Pin the version a run (or a direct caller's read) saw."""
        if wrapper is not None:
            if wrapper not in self._runs:
                self._runs[wrapper] = version
        elif read:
            self._seen = version

    async def _write(self, wrapper: Any, events: list[NewEvent]) -> None:
        view = self._view if self._view is not None else await self._fresh()
        if wrapper is not None:
            if wrapper not in self._runs:  # a run's first call: it sees the stream now
                await view.refresh()
                self._runs[wrapper] = view.version
            expected = self._runs[wrapper]
        else:
            if self._seen is None:  # a caller that never read: it sees the stream now
                await view.refresh()
                self._seen = view.version
            expected = self._seen
        try:
            res = await view.append(events, expected)
        except ConcurrencyError as exc:
            raise SessionConflict(self.session_id, self.stream_id, expected, exc.actual) from None
        if wrapper is not None:
            self._runs[wrapper] = res.version
        else:
            self._seen = res.version
        await view.refresh()
