""":class:`AsyncMessageLog` (one face written, the other generated), run by
:mod:`ares_events.integrations.pydantic_ai`'s stores: one ``pai.messages`` event per
``append``, at the version last loaded (:class:`ConversationConflict`).

It may import anything in the package, and ``pydantic_ai``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import orjson
from pydantic_ai.conversation_store import ConversationConflict as _PydanticConflict
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from ares_events.core.events import NewEvent
from ares_events.core.faces import ASYNC
from ares_events.errors import ConcurrencyError
from ares_events.integrations._conversation_async import AsyncConversationStream
from ares_events.integrations._faces import Table, stream_name

if ASYNC:
    from asyncio import Lock
else:
    from threading import Lock

    # One error class for both faces.
    from ares_events.integrations._pydantic_ai_store_async import ConversationConflict  # as is

if TYPE_CHECKING:
    from ares_events.core.store_async import AsyncEventStore

__all__ = ["MODULE", "STREAM_PREFIX", "AsyncMessageLog", "ConversationConflict"]

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
            text = (
                f"conversation {conversation_id!r} was appended to by another writer since "
                f"it was loaded (version {expected}); nothing was stored: load it again "
                "and run the turn again"
            )
            ConcurrencyError.__init__(self, stream_id, expected, actual, text)
            self.conversation_id = conversation_id  # after: the base sets it to the text


def stream_of(conversation_id: str) -> str:
    """The stream of a conversation.

    Raises:
        InvalidEvent: the id is empty, too long or not printable.
    """
    return stream_name(STREAM_PREFIX, conversation_id, "conversation_id")


def encode_messages(messages: Sequence[ModelMessage]) -> list[Any]:
    """``messages`` as JSON values, by ``ModelMessagesTypeAdapter``."""
    # The standard parser keeps every integer exact (orjson would turn one beyond 64 bits
    # into a float): the store then refuses such a value (InvalidEvent) instead of
    # storing a different number.
    return list(json.loads(ModelMessagesTypeAdapter.dump_json(list(messages))))


def decode_messages(data: list[Any]) -> list[ModelMessage]:
    """Messages back from :func:`encode_messages`' values."""
    return ModelMessagesTypeAdapter.validate_json(orjson.dumps(data))


class AsyncMessageLog:
    """Conversations of Pydantic AI messages, one verified stream each."""

    def __init__(self, store: AsyncEventStore) -> None:
        self.store = store
        self._views = Table(
            lambda cid: _Conversation(AsyncConversationStream(store, stream_of(cid)))
        )

    async def load(self, conversation_id: str) -> tuple[list[ModelMessage], int]:
        """:meth:`~ares_events.integrations.pydantic_ai.AresMessageStore.load`, and the
        version read."""
        c = self._views.get(conversation_id)
        async with c.lock:
            await c.view.refresh()
            version = c.view.version
            out: list[Any] = []
            for e in c.view.events:
                if e.payload_erased:
                    continue
                if e.type == T_MESSAGES:
                    out.extend(e.payload.get("messages") or [])
                elif e.type == T_CLEARED:
                    out = []
        return decode_messages(out), version

    async def append(
        self, conversation_id: str, new_messages: Sequence[ModelMessage], expected: int | None
    ) -> int:
        """:meth:`~ares_events.integrations.pydantic_ai.AresMessageStore.append` at
        ``expected`` (None: the current version)."""
        c = self._views.get(conversation_id)
        payload = {"messages": encode_messages(new_messages)} if new_messages else None
        async with c.lock:
            if expected is None:
                await c.view.refresh()
                expected = c.view.version
            if payload is None:
                return expected
            return await self._write(conversation_id, c, expected, T_MESSAGES, payload)

    async def clear(
        self, conversation_id: str, *, expected: int | None, erase: bool, reason: str, by: str
    ) -> int:
        """:meth:`~ares_events.integrations.pydantic_ai.AresMessageStore.clear` at
        ``expected`` (None: the current version); the version after it."""
        c = self._views.get(conversation_id)
        async with c.lock:
            await c.view.refresh()
            at = c.view.version if expected is None else expected
            doomed = [e.version for e in c.view.events if e.type == T_MESSAGES]
            version = await self._write(conversation_id, c, at, T_CLEARED, {})
            await c.view.refresh()
            if erase:
                await c.view.erase(doomed, reason=reason, by=by)
            return version

    async def _write(
        self, conversation_id: str, c: _Conversation, expected: int, type_: str, payload: Any
    ) -> int:
        """Append one event at ``expected`` (``c``'s lock held), else ConversationConflict."""
        ev = NewEvent(type=type_, module=MODULE, payload=payload)
        try:
            res = await c.view.append([ev], expected)
        except ConcurrencyError as exc:
            stream = c.view.stream_id
            raise ConversationConflict(conversation_id, stream, expected, exc.actual) from None
        return res.version


@dataclass(slots=True)
class _Conversation:
    """One conversation's verified view and its lock."""

    view: AsyncConversationStream
    lock: Lock = field(default_factory=Lock)
