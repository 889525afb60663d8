"""A Google ADK session service on ares-events: :class:`AresSessionService` implements
``BaseSessionService`` (``pip install 'ares-events[google-adk]'``)::

    from google.adk.runners import Runner
    from ares_events.integrations.google_adk import AresSessionService

    service = AresSessionService(url="sqlite:///agents.db")
    runner = Runner(agent=agent, app_name="app", session_service=service)

One session is one hash-chained stream, ``google-adk/<app>/<user>/<session>`` (each part
percent-encoded), holding ``adk.session.created`` (with the session-scoped initial
state), one ``adk.event`` per event (the ADK event and its session-scoped state delta) and
``adk.session.deleted``. App-scoped (``app:``) and user-scoped (``user:``) state live in
``google-adk-app/<app>`` and ``google-adk-user/<app>/<user>``, written in the same
transaction as the event that changed them; ``temp:`` state is never stored. State is
folded as ADK folds it: the session's own keys, then ``app:`` and ``user:`` keys merged in.

- **Versions, not timestamps.** A session object carries the stream version it was read
  at (ADK's ``_storage_update_marker``); ``append_event`` writes at that version. Two
  ``run_async`` on one session: the first append wins, the other gets
  :class:`StaleSessionConflict` (a :class:`~ares_events.errors.SessionConflict`, and
  ADK's ``StaleSessionError``), and the stream never interleaves the
  two runs' events. Reload the session (``get_session``) and run again.
- **The tail only.** ``get_session(config=GetSessionConfig(num_recent_events=N))`` reads
  the last events of the stream (verified from the first one's link to the head row) and
  the state from the latest snapshot plus the events after it: O(N + snapshot interval),
  not O(session).
- **Verified before decoded.** Every read checks the chain (a MAC in keyed mode) and the
  head row before an event is decoded, and raises
  :class:`~ares_events.errors.ChainIntegrityError` on findings.
- **History is kept.** ``delete_session`` appends ``adk.session.deleted``; with
  ``erase_on_delete=True`` it also erases the payloads of the session's events (blobs
  too) and records each erasure in ``ares-events/erasures``.
- **Re-delivery is stored once.** Appending an event the session already holds (the
  same id and fields: a retried call) stores nothing and applies nothing again, as ADK's
  in-memory service does; distinct events that share an id are both kept.
- **Any thread, any event loop.** ADK's ``Runner.run`` runs each invocation on a new
  thread with its own event loop. Opened from ``url=`` or given a blocking store, the
  service does its storage work in worker threads on a blocking store (one lock per
  session stream, a thread lock), so nothing belongs to the loop that first used it.
  Given an asyncio store, it works on that store's loop (an asyncio store belongs to the
  loop that opened it).

The stream layout and the fold are :mod:`~ares_events.integrations._google_adk_core`,
the storage work :mod:`~ares_events.integrations._google_adk_sessions_async`. Under the
session, :mod:`ares_events.integrations.google_adk_journal` runs an agent's
model calls and tools through the run journal (a killed run resumes without re-paying
answered model calls or repeating tool side effects).

It may import anything in the package, and ``google.adk``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session

from ares_events.core.store import EventStore
from ares_events.errors import ConfigError
from ares_events.integrations._google_adk_core import (
    APP_PREFIX,
    MARKER,
    MODULE,
    SESSION_PREFIX,
    USER_PREFIX,
    SessionConflict,
    SessionStateProjection,
    StaleSessionConflict,
    session_stream,
)
from ares_events.integrations._google_adk_sessions import AdkSessions
from ares_events.integrations._google_adk_sessions_async import AsyncAdkSessions

if TYPE_CHECKING:
    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "APP_PREFIX",
    "MODULE",
    "SESSION_PREFIX",
    "USER_PREFIX",
    "AresSessionService",
    "SessionConflict",
    "SessionStateProjection",
    "StaleSessionConflict",
    "session_stream",
]

T = TypeVar("T")


class AresSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` on ares-events (see the module docstring).

    Args:
        url: a store URL; the service opens a blocking store on it on first use and
            closes it in :meth:`close`.
        store: an open store instead (left open by :meth:`close`): a blocking one is used
            from any thread and event loop; an asyncio one only on its own loop.
        snapshot_every: snapshot each session's state every this many events (0: never;
            then a tail read replays the session's state from its start).
        erase_on_delete: ``delete_session`` also erases the session's payloads.
        by: the name written in erasure records.

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
    """

    def __init__(
        self,
        *,
        url: str | None = None,
        store: EventStore | AsyncEventStore | None = None,
        snapshot_every: int = 50,
        erase_on_delete: bool = False,
        by: str = "google-adk",
    ) -> None:
        if (url is None) == (store is None):
            raise ConfigError("give exactly one of url= or store=")
        self._url = url
        self._owns = store is None
        self._opts: dict[str, Any] = {
            "snapshot_every": snapshot_every,
            "erase_on_delete": erase_on_delete,
            "by": by,
        }
        self._sessions: AdkSessions | None = None  # the blocking work, in worker threads
        self._asessions: AsyncAdkSessions | None = None  # on its asyncio store's loop
        if isinstance(store, EventStore):
            self._sessions = AdkSessions(store, **self._opts)
        elif store is not None:
            self._asessions = AsyncAdkSessions(store, **self._opts)
        self._opening = threading.Lock()  # one store opened from url=, by one thread

    def __repr__(self) -> str:
        got = self._sessions or self._asessions
        where = got.store if got is not None else "not open"
        return f"AresSessionService({where!r})"

    # -- BaseSessionService ------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (``AlreadyExistsError`` when a live one has this id)."""
        if self._asessions is not None:
            return await self._asessions.create_session(app_name, user_id, state, session_id)
        return await self._in_thread(
            lambda s: s.create_session(app_name, user_id, state, session_id)
        )

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (all, or the ``num_recent_events`` newest and
        those at or after ``after_timestamp``), or None.

        Raises:
            ChainIntegrityError: the session's stream does not verify.
        """
        if self._asessions is not None:
            return await self._asessions.get_session(app_name, user_id, session_id, config)
        return await self._in_thread(lambda s: s.get_session(app_name, user_id, session_id, config))

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The live sessions of an app (of one user, when given), without events,
        oldest update first."""
        if self._asessions is not None:
            got = await self._asessions.list_sessions(app_name, user_id)
        else:
            got = await self._in_thread(lambda s: s.list_sessions(app_name, user_id))
        return ListSessionsResponse(sessions=got)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session (an ``adk.session.deleted`` event; its payloads erased too
        with ``erase_on_delete``). Deleting a missing session does nothing."""
        if self._asessions is not None:
            await self._asessions.delete_session(app_name, user_id, session_id)
        else:
            await self._in_thread(lambda s: s.delete_session(app_name, user_id, session_id))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user-scoped state (keys without the ``user:`` prefix)."""
        if self._asessions is not None:
            return await self._asessions.get_user_state(app_name, user_id)
        return await self._in_thread(lambda s: s.get_user_state(app_name, user_id))

    async def append_event(self, session: Session, event: Event) -> Event:
        """Append ``event`` at the version ``session`` was read at; apply its state
        delta as ADK does (``temp:`` keys only in memory). An equal event the session
        already holds (same id and fields) is not stored or applied again.

        Raises:
            StaleSessionConflict: another run wrote to the session since (nothing stored;
                a SessionConflict and ADK's StaleSessionError).
            SessionNotFoundError: the session does not exist (or was deleted).
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        if self._asessions is not None:
            version = await self._asessions.store_event(session, event)
        else:
            version = await self._in_thread(lambda s: s.store_event(session, event))
        if version is None:  # a re-delivery: already stored and applied
            return event
        session.last_update_time = event.timestamp
        session._storage_update_marker = f"{MARKER}{version}"
        return self._commit_event_to_session(session, event)

    # -- plumbing ----------------------------------------------------------------------

    async def close(self) -> None:
        """Close the store when the service opened it (from ``url=``); a later call opens
        it again."""
        if self._owns and self._sessions is not None:
            sessions, self._sessions = self._sessions, None
            await asyncio.to_thread(sessions.store.close)

    async def _in_thread(self, work: Callable[[AdkSessions], T]) -> T:
        """``work`` on the blocking sessions, in a worker thread."""
        return await asyncio.to_thread(lambda: work(self._blocking()))

    def _blocking(self) -> AdkSessions:
        got = self._sessions
        if got is None:
            with self._opening:
                got = self._sessions
                if got is None:
                    from ares_events.stores import open_store

                    assert self._url is not None
                    got = AdkSessions(open_store(self._url), **self._opts)
                    self._sessions = got
        return got
