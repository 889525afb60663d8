"""Pydantic AI message history on ares-events: the asyncio ``AsyncAresMessageStore`` is
written here, the blocking ``AresMessageStore`` (``_pydantic_ai_store.py``) is generated
from it; both are imported from :mod:`ares_events.integrations.pydantic_ai`.

One conversation is one hash-chained stream, ``pydantic-ai/<conversation_id>``; each
``append`` is one ``pai.messages`` event holding the new messages, serialised with
Pydantic AI's own ``ModelMessagesTypeAdapter`` (JSON, bytes as base64) and validated
back with it on ``load``. An append is written at the version this store last loaded the
conversation at: another writer in between is a :class:`ConversationConflict` and nothing
is stored, so two runs of one conversation never interleave their messages.

It may import anything in the package, and ``pydantic_ai``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson
from pydantic_ai.conversation_store import ConversationConflict as _PydanticConflict
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from ares_events.core.events import NewEvent, validate_name
from ares_events.core.faces import ASYNC
from ares_events.errors import ConcurrencyError, ConfigError, InvalidEvent
from ares_events.integrations._conversation_async import AsyncConversationStream

if ASYNC:
    from ares_events.stores.threaded import async_face
else:
    # One error class for both faces.
    from ares_events.integrations._pydantic_ai_store_async import ConversationConflict  # as is

if TYPE_CHECKING:
    from ares_events.core.store import EventStore  # as is
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["MODULE", "STREAM_PREFIX", "AsyncAresMessageStore", "ConversationConflict"]

STREAM_PREFIX: Final = "pydantic-ai/"
"""Streams of conversations: ``pydantic-ai/<conversation_id>``."""
MODULE: Final = "pydantic-ai"
T_MESSAGES: Final = "pai.messages"
T_CLEARED: Final = "pai.cleared"


if ASYNC:

    class ConversationConflict(ConcurrencyError, _PydanticConflict):
        """Another writer appended to the conversation after this store loaded it;
        nothing of this append was stored. Load the conversation again and run the turn
        again. Also Pydantic AI's own ``ConversationConflict`` (a ``UserError``)."""

        def __init__(self, conversation_id: str, stream_id: str, expected: int, actual: int):
            ConcurrencyError.__init__(
                self,
                stream_id,
                expected,
                actual,
                f"conversation {conversation_id!r} was appended to by another writer since "
                f"it was loaded (version {expected}); nothing was stored: load it again "
                "and run the turn again",
            )
            self.conversation_id = conversation_id  # after: the base sets it to the text


def stream_of(conversation_id: str) -> str:
    """The stream of a conversation.

    Raises:
        InvalidEvent: the id is empty, too long or not printable.
    """
    if not isinstance(conversation_id, str):
        raise InvalidEvent(
            "conversation_id", f"must be a str, got {type(conversation_id).__name__}"
        )
    if not conversation_id:
        raise InvalidEvent("conversation_id", "must not be empty")
    return validate_name(STREAM_PREFIX + conversation_id, "conversation_id")


def encode_messages(messages: Sequence[ModelMessage]) -> list[Any]:
    """``messages`` as JSON values, by ``ModelMessagesTypeAdapter``."""
    return list(orjson.loads(ModelMessagesTypeAdapter.dump_json(list(messages))))


def decode_messages(data: list[Any]) -> list[ModelMessage]:
    """Messages back from :func:`encode_messages`' values."""
    return ModelMessagesTypeAdapter.validate_json(orjson.dumps(data))


class AsyncAresMessageStore:
    """Conversations of Pydantic AI messages, one verified stream each.

    Args:
        url: a store URL; opened on first use, closed by :meth:`close`.
        store: an open store instead (left open by :meth:`close`).

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
    """

    def __init__(
        self, *, url: str | None = None, store: AsyncEventStore | EventStore | None = None
    ) -> None:
        if (url is None) == (store is None):
            raise ConfigError("give exactly one of url= or store=")
        self._url = url
        if ASYNC:
            self._store: Any = async_face(store) if store is not None else None
        else:
            self._store = store
        self._owns = store is None
        self._views: dict[str, AsyncConversationStream] = {}
        self._seen: dict[str, int] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._store!r})"

    async def load(self, conversation_id: str) -> list[ModelMessage]:
        """The conversation's messages, oldest first (``[]`` for a new one); later
        appends of this store are written at the version read now.

        Raises:
            ChainIntegrityError: the stream does not verify (nothing is decoded).
            StoreUnavailable: the store cannot be reached.
        """
        view = await self._view(conversation_id)
        await view.refresh()
        self._seen[conversation_id] = view.version
        out: list[Any] = []
        for e in view.events:
            if e.payload_erased:
                continue
            if e.type == T_MESSAGES:
                out.extend(e.payload.get("messages") or [])
            elif e.type == T_CLEARED:
                out = []
        return decode_messages(out)

    async def append(self, conversation_id: str, new_messages: Sequence[ModelMessage]) -> int:
        """Append ``new_messages`` (e.g. ``result.new_messages()``) as one event, at the
        version this store last loaded (or wrote) the conversation at; return the
        conversation's version after it.

        Raises:
            ConversationConflict: another writer appended since (nothing was stored).
            StoreUnavailable: the store cannot be reached.
        """
        view = await self._view(conversation_id)
        if conversation_id not in self._seen:
            await view.refresh()
            self._seen[conversation_id] = view.version
        expected = self._seen[conversation_id]
        if not new_messages:
            return expected
        payload = {"messages": encode_messages(new_messages)}
        try:
            res = await view.append(
                [NewEvent(type=T_MESSAGES, module=MODULE, payload=payload)], expected
            )
        except ConcurrencyError as exc:
            raise ConversationConflict(
                conversation_id, view.stream_id, expected, exc.actual
            ) from None
        self._seen[conversation_id] = res.version
        return res.version

    async def clear(
        self,
        conversation_id: str,
        *,
        erase: bool = False,
        reason: str = "clear",
        by: str = "pydantic-ai",
    ) -> None:
        """Start the conversation over (a ``pai.cleared`` event; the messages stay in the
        chain). ``erase=True`` also erases the payloads of the messages before it (blobs
        too) and records each erasure in ``ares-events/erasures``.

        Raises:
            ConversationConflict: another writer appended since this store loaded it.
        """
        view = await self._view(conversation_id)
        await view.refresh()
        expected = self._seen.get(conversation_id, view.version)
        doomed = [e.version for e in view.events if e.type == T_MESSAGES]
        try:
            res = await view.append([NewEvent(type=T_CLEARED, module=MODULE, payload={})], expected)
        except ConcurrencyError as exc:
            raise ConversationConflict(
                conversation_id, view.stream_id, expected, exc.actual
            ) from None
        self._seen[conversation_id] = res.version
        await view.refresh()
        if erase:
            await view.erase(doomed, reason=reason, by=by)

    async def close(self) -> None:
        """Close the store when this object opened it (from ``url=``)."""
        if self._owns and self._store is not None:
            await self._store.close()
            self._store = None
        self._views.clear()

    async def __aenter__(self) -> AsyncAresMessageStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _view(self, conversation_id: str) -> AsyncConversationStream:
        view = self._views.get(conversation_id)
        if view is None:
            if self._store is None:
                from ares_events.stores import open_async_store

                assert self._url is not None
                self._store = await open_async_store(self._url)
            view = AsyncConversationStream(self._store, stream_of(conversation_id))
            self._views[conversation_id] = view
        return view
