"""An OpenAI Agents SDK session on ares-events (``pip install 'ares-events[openai-agents]'``)::

    session = AresSession("user-42", url="sqlite:///agents.db")
    result = await Runner.run(agent, "Hello", session=session)

One session is one stream; a run's write after another writer's gets
:class:`SessionConflict`. docs/guide-openai-agents.md says the rest.

It may import anything in the package, and ``agents``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, cast

from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ares_events.errors import ConfigError
from ares_events.integrations._faces import AsyncAdapter, Faces, stream_name
from ares_events.integrations._openai_session import SessionLog
from ares_events.integrations._openai_session_async import MODULE, AsyncSessionLog, SessionConflict

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from ares_events.core.store import EventStore
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
    return stream_name(STREAM_PREFIX, session_id, "session_id")


class AresSession(AsyncAdapter):
    """The SDK's ``Session`` protocol on the stream ``openai-agents/<session_id>``.

    Args:
        session_id: the session.
        url: a store URL, opened (blocking) on first use and closed by :meth:`close`.
        store: an open store instead (left open): a blocking one is used from any thread
            and event loop; an asyncio one only on its own loop.
        session_settings: the SDK's settings, or a dict of their fields; None: defaults.

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
        self.session_id = session_id
        self.stream_id = stream_of(session_id)
        self._faces = Faces(
            url,
            store,
            lambda s: SessionLog(s, session_id, self.stream_id),
            lambda s: AsyncSessionLog(s, session_id, self.stream_id),
        )
        # The SDK's own normalisation (None: the defaults; a dict is checked), typed as the
        # SDK types it (its protocol lets a session have none).
        self.session_settings: SessionSettings | None = SessionSettings()
        if session_settings is not None:
            try:
                self.session_settings = coerce_session_settings(session_settings)
            except TypeError as exc:
                raise SessionSettingsError(str(exc)) from None

    def __repr__(self) -> str:
        return f"AresSession({self.session_id!r})"

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
        return cast("list[TResponseInputItem]", await self._faces.call("get", wrapper, limit))

    async def add_items(self, items: list[TResponseInputItem], *, wrapper: Any = None) -> None:
        """Append ``items`` as one event (under a run: at the version the run last saw).

        Raises:
            SessionConflict: under a run, another writer wrote since (nothing stored).
            InvalidEvent: an item is not JSON (nothing was stored).
            StoreUnavailable: the store cannot be reached.
        """
        if items:
            batch = [dict(it) if isinstance(it, dict) else it for it in items]
            await self._faces.call("add", wrapper, batch)

    async def pop_item(self, *, wrapper: Any = None) -> TResponseInputItem | None:
        """Remove the most recent item (an ``oai.popped`` event) and return it; None when
        the session is empty.

        Raises:
            SessionConflict: under a run, another writer wrote since this run last saw
                the session.
        """
        return cast("TResponseInputItem | None", await self._faces.call("pop", wrapper))

    async def clear_session(
        self,
        *,
        wrapper: Any = None,
        erase: bool = False,
        reason: str = "clear_session",
        by: str = "openai-agents",
    ) -> None:
        """Clear the session (an ``oai.cleared`` event: the items stay in the chain);
        ``erase=True`` also erases their payloads, each erasure recorded (``reason``,
        ``by``) in ``ares-events/erasures``.

        Raises:
            SessionConflict: under a run, another writer wrote since this run last saw
                the session.
        """
        await self._faces.call("clear", wrapper, erase, reason, by)
