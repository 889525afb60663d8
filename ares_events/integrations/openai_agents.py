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

- **Two runs never interleave.** Under ``Runner.run`` the SDK hands the session its run
  context; a run's writes name the stream version the run last saw (pinned by its first
  session call, moved only by its own writes). When another writer wrote in between, the
  write is refused with :class:`SessionConflict` (a
  :class:`~ares_events.errors.ConcurrencyError`) and nothing of it is stored: the loser
  re-runs its turn on the new history. Nothing is merged behind its back.
- **Direct calls are atomic, as in the SDK's own sessions.** Without a run context,
  ``add_items`` appends, ``clear_session`` clears what is there when it lands and
  ``pop_item`` removes the newest item at that moment: threads, event loops and processes
  adding to one session never lose an item. (A direct caller that wants a run's guard
  for its own read-then-write passes one object as ``wrapper=`` to its calls.)
- **Any thread, any event loop.** Opened from ``url=`` or given a blocking store, the
  session does its work in a worker thread on a blocking store, serialised by a thread
  lock: nothing belongs to the loop that first used it, so threads that each run their
  own loop, and one ``asyncio.run`` per request, share one session. Given an asyncio
  store, it works on that store's loop (an asyncio store belongs to the loop that opened
  it).
- **Verified before decoded.** Every read checks the chain (a MAC in keyed mode) and the
  head row of what it has not checked yet, and raises
  :class:`~ares_events.errors.ChainIntegrityError` before an item is returned.
- **Crash-safe.** An ``add_items`` is one append: after a ``kill -9`` the batch is there
  whole or not at all.

The work itself (the fold of the items, the writes) is
:mod:`~ares_events.integrations._openai_session_async`. Under the session,
:mod:`ares_events.integrations.openai_agents_journal` runs the agent's model calls and
tools through the run journal (a killed run resumes without re-paying answered model
calls or repeating tool side effects).

It may import anything in the package, and ``agents``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING, Any, Final, cast

from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ares_events.core.events import validate_name
from ares_events.core.store import EventStore
from ares_events.errors import ConfigError, InvalidEvent
from ares_events.integrations._openai_session import SessionLog
from ares_events.integrations._openai_session_async import (
    MODULE,
    AsyncSessionLog,
    SessionConflict,
)

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "MODULE",
    "STREAM_PREFIX",
    "AresSession",
    "SessionConflict",
    "SessionSettingsError",
    "stream_of",
]

STREAM_PREFIX: Final = "openai-agents/"
"""Streams of sessions: ``openai-agents/<session_id>``."""


class SessionSettingsError(ConfigError, TypeError):
    """``session_settings`` is neither a ``SessionSettings`` nor a dict of its fields.

    Also a ``TypeError``, the error the SDK's own sessions raise for it.
    """


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


def _settings(value: SessionSettings | dict[str, Any] | None) -> SessionSettings:
    """The SDK's own normalisation: None is the defaults, a dict is checked and turned
    into ``SessionSettings``, a ``SessionSettings`` is kept as it is."""
    if value is None:
        return SessionSettings()
    try:
        return coerce_session_settings(value)
    except TypeError as exc:
        raise SessionSettingsError(str(exc)) from None


class AresSession:
    """The SDK's ``Session`` protocol on one ares-events stream (see the module docstring).

    Args:
        session_id: the session (the stream is ``openai-agents/<session_id>``).
        url: a store URL (``sqlite:///agents.db``, ``postgresql://...``); the session
            opens a blocking store on it on first use and closes it in :meth:`close`.
        store: an open store instead (left open by :meth:`close`): a blocking one is
            used from any thread and event loop; an asyncio one only on its own loop.
        session_settings: the SDK's settings, or a dict of their fields (``limit``: the
            default of ``get_items``); None: the defaults.

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
        SessionSettingsError: ``session_settings`` names a field the SDK does not have.
        InvalidEvent: a bad session id.
    """

    def __init__(
        self,
        session_id: str,
        *,
        url: str | None = None,
        store: EventStore | AsyncEventStore | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        if (url is None) == (store is None):
            raise ConfigError("give exactly one of url= or store=")
        self.session_id = session_id
        self.stream_id = stream_of(session_id)
        # Typed as the SDK types it (its protocol lets a session have none).
        self.session_settings: SessionSettings | None = _settings(session_settings)
        self._url = url
        self._owns = store is None
        self._log: SessionLog | None = None  # the blocking work, in worker threads
        self._alog: AsyncSessionLog | None = None  # the asyncio work, on its store's loop
        if isinstance(store, EventStore):
            self._log = SessionLog(store, session_id, self.stream_id)
        elif store is not None:
            self._alog = AsyncSessionLog(store, session_id, self.stream_id)
        self._opening = threading.Lock()  # one store opened from url=, by one thread

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
        limit = resolve_session_limit(limit, self.session_settings)
        if self._alog is not None:
            return await self._alog.get(wrapper, limit)
        return cast("list[TResponseInputItem]", await self._in_thread("get", wrapper, limit))

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Append ``items`` as one event (under a run: at the version the run last saw).

        Raises:
            SessionConflict: under a run, another writer wrote since (nothing stored).
            InvalidEvent: an item is not JSON (nothing was stored).
            StoreUnavailable: the store cannot be reached.
        """
        if not items:
            return
        batch = [dict(it) if isinstance(it, dict) else it for it in items]
        if self._alog is not None:
            await self._alog.add(wrapper, batch)
        else:
            await self._in_thread("add", wrapper, batch)

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Remove the most recent item (an ``oai.popped`` event) and return it; None when
        the session is empty.

        Raises:
            SessionConflict: under a run, another writer wrote since this run last saw
                the session.
        """
        if self._alog is not None:
            return cast("TResponseInputItem | None", await self._alog.pop(wrapper))
        return cast("TResponseInputItem | None", await self._in_thread("pop", wrapper))

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
            SessionConflict: under a run, another writer wrote since this run last saw
                the session.
        """
        if self._alog is not None:
            await self._alog.clear(wrapper, erase, reason, by)
        else:
            await self._in_thread("clear", wrapper, erase, reason, by)

    # -- plumbing ------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the store when the session opened it (from ``url=``); a later call opens
        it again."""
        if self._owns and self._log is not None:
            log, self._log = self._log, None
            await asyncio.to_thread(log.store.close)

    async def __aenter__(self) -> AresSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _in_thread(self, op: str, *args: Any) -> Any:
        """The blocking log's ``op`` in a worker thread (its lock serialises the threads
        of every event loop)."""

        def work() -> Any:
            return getattr(self._blocking(), op)(*args)

        return await asyncio.to_thread(work)

    def _blocking(self) -> SessionLog:
        log = self._log
        if log is None:
            with self._opening:
                log = self._log
                if log is None:
                    from ares_events.stores import open_store

                    assert self._url is not None
                    log = SessionLog(open_store(self._url), self.session_id, self.stream_id)
                    self._log = log
        return log
