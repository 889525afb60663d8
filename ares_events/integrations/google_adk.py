"""A Google ADK session service on ares-events (``pip install 'ares-events[google-adk]'``)::

    service = AresSessionService(url="sqlite:///agents.db")
    runner = Runner(agent=agent, app_name="app", session_service=service)

One session is one stream; a stale session's ``append_event`` gets
:class:`StaleSessionConflict`. docs/guide-google-adk.md says the rest.

It may import anything in the package, and ``google.adk``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from google.adk.events.event import Event
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session

from ares_events.errors import SessionConflict
from ares_events.integrations._faces import AsyncAdapter, Faces
from ares_events.integrations._google_adk_core import (
    APP_PREFIX,
    MARKER,
    MODULE,
    SESSION_PREFIX,
    USER_PREFIX,
    SessionStateProjection,
    StaleSessionConflict,
    session_stream,
)
from ares_events.integrations._google_adk_sessions import AdkSessions
from ares_events.integrations._google_adk_sessions_async import AsyncAdkSessions

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
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


class AresSessionService(BaseSessionService, AsyncAdapter):
    """ADK's ``BaseSessionService`` on ares-events (see the module docstring).

    Args:
        url: a store URL, opened (blocking) on first use and closed by :meth:`close`.
        store: an open store instead (left open): a blocking one is used from any thread
            and event loop; an asyncio one only on its own loop.
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
        opts: dict[str, Any] = {"snapshot_every": snapshot_every, "by": by}
        opts["erase_on_delete"] = erase_on_delete
        self._faces = Faces(
            url, store, lambda s: AdkSessions(s, **opts), lambda s: AsyncAdkSessions(s, **opts)
        )

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """Create a session (``AlreadyExistsError`` when a live one has this id)."""
        args = (app_name, user_id, state, session_id)
        return cast("Session", await self._faces.call("create_session", *args))

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
        args = (app_name, user_id, session_id, config)
        return cast("Session | None", await self._faces.call("get_session", *args))

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The live sessions of an app (of one user, when given), without events,
        oldest update first."""
        got = await self._faces.call("list_sessions", app_name, user_id)
        return ListSessionsResponse(sessions=got)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session (an ``adk.session.deleted`` event; its payloads erased too
        with ``erase_on_delete``). Deleting a missing session does nothing."""
        await self._faces.call("delete_session", app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user-scoped state (keys without the ``user:`` prefix)."""
        return cast("dict[str, Any]", await self._faces.call("get_user_state", app_name, user_id))

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
        version = await self._faces.call("store_event", session, event)
        if version is None:  # a re-delivery: already stored and applied
            return event
        session.last_update_time = event.timestamp
        session._storage_update_marker = f"{MARKER}{version}"
        return self._commit_event_to_session(session, event)
