# Generated from _pydantic_ai_store_async.py by tools/async_to_sync.py: do not edit.
"""Pydantic AI message history on ares-events: :class:`MessageLog` (one face written,
the other generated). The public ``AresMessageStore`` and ``AsyncAresMessageStore``
(:mod:`ares_events.integrations.pydantic_ai`) run one of them: the blocking one (in a
worker thread, for the asyncio store) over a blocking store, the asyncio one on the loop
of an asyncio store.

One conversation is one hash-chained stream, ``pydantic-ai/<conversation_id>``; each
``append`` is one ``pai.messages`` event holding the new messages, serialised with
Pydantic AI's own ``ModelMessagesTypeAdapter`` (JSON, bytes as base64) and validated
back with it on ``load``. An append is written at the version this log last loaded the
conversation at: another writer in between is a :class:`ConversationConflict` and nothing
is stored, so two runs of one conversation never interleave their messages. Each
conversation's operations are serialised by a lock of the face (a thread lock on the
blocking one), so threads may share a log.

It may import anything in the package, and ``pydantic_ai``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from threading import Lock
from typing import TYPE_CHECKING, Any, Final

import orjson
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter

from ares_events.core.events import NewEvent, validate_name
from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.integrations._conversation import ConversationStream

# One error class for both faces.
from ares_events.integrations._pydantic_ai_store_async import ConversationConflict  # as is

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

__all__ = ["MODULE", "STREAM_PREFIX", "ConversationConflict", "MessageLog"]

STREAM_PREFIX: Final = "pydantic-ai/"
"""Streams of conversations: ``pydantic-ai/<conversation_id>``."""
MODULE: Final = "pydantic-ai"
T_MESSAGES: Final = "pai.messages"
T_CLEARED: Final = "pai.cleared"


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
    # The standard parser keeps every integer exact (orjson would turn one beyond 64 bits
    # into a float): the store then refuses such a value (InvalidEvent) instead of
    # storing a different number.
    return list(json.loads(ModelMessagesTypeAdapter.dump_json(list(messages))))


def decode_messages(data: list[Any]) -> list[ModelMessage]:
    """Messages back from :func:`encode_messages`' values."""
    return ModelMessagesTypeAdapter.validate_json(orjson.dumps(data))


class MessageLog:
    """Conversations of Pydantic AI messages, one verified stream each.

    Args:
        store: the store.
    """

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self._views: dict[str, _Conversation] = {}
        self._guard = threading.Lock()  # the table of conversations (never held over I/O)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.store!r})"

    def load(self, conversation_id: str) -> list[ModelMessage]:
        """The conversation's messages, oldest first (``[]`` for a new one); later
        appends of this log are written at the version read now.

        Raises:
            ChainIntegrityError: the stream does not verify (nothing is decoded).
            StoreUnavailable: the store cannot be reached.
        """
        c = self._conversation(conversation_id)
        with c.lock:
            view = c.view
            view.refresh()
            c.seen = view.version
            out: list[Any] = []
            for e in view.events:
                if e.payload_erased:
                    continue
                if e.type == T_MESSAGES:
                    out.extend(e.payload.get("messages") or [])
                elif e.type == T_CLEARED:
                    out = []
        return decode_messages(out)

    def append(self, conversation_id: str, new_messages: Sequence[ModelMessage]) -> int:
        """Append ``new_messages`` (e.g. ``result.new_messages()``) as one event, at the
        version this log last loaded (or wrote) the conversation at; return the
        conversation's version after it.

        Raises:
            ConversationConflict: another writer appended since (nothing was stored).
            StoreUnavailable: the store cannot be reached.
        """
        c = self._conversation(conversation_id)
        payload = {"messages": encode_messages(new_messages)} if new_messages else None
        with c.lock:
            view = c.view
            if c.seen is None:
                view.refresh()
                c.seen = view.version
            expected = c.seen
            if payload is None:
                return expected
            try:
                res = view.append(
                    [NewEvent(type=T_MESSAGES, module=MODULE, payload=payload)], expected
                )
            except ConcurrencyError as exc:
                raise ConversationConflict(
                    conversation_id, view.stream_id, expected, exc.actual
                ) from None
            c.seen = res.version
            return res.version

    def clear(
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
            ConversationConflict: another writer appended since this log loaded it.
        """
        c = self._conversation(conversation_id)
        with c.lock:
            view = c.view
            view.refresh()
            expected = c.seen if c.seen is not None else view.version
            doomed = [e.version for e in view.events if e.type == T_MESSAGES]
            try:
                res = view.append([NewEvent(type=T_CLEARED, module=MODULE, payload={})], expected)
            except ConcurrencyError as exc:
                raise ConversationConflict(
                    conversation_id, view.stream_id, expected, exc.actual
                ) from None
            c.seen = res.version
            view.refresh()
            if erase:
                view.erase(doomed, reason=reason, by=by)

    def _conversation(self, conversation_id: str) -> _Conversation:
        with self._guard:
            got = self._views.get(conversation_id)
            if got is None:
                stream = ConversationStream(self.store, stream_of(conversation_id))
                got = self._views[conversation_id] = _Conversation(stream)
            return got


class _Conversation:
    """One conversation's verified view, its lock, and the version its log last saw."""

    __slots__ = ("lock", "seen", "view")

    def __init__(self, view: ConversationStream) -> None:
        self.view = view
        self.lock = Lock()
        self.seen: int | None = None
