"""Pydantic AI on ares-events (``pip install 'ares-events[pydantic-ai]'``): message
history in a store, and durable runs without Temporal or DBOS::

    history = AresMessageStore(url="sqlite:///agents.db")
    result = agent.run_sync("Hello", message_history=history.load("c-1"))
    history.append("c-1", result.new_messages())

    result = await run_durably(agent, "Refund order 42", store=store, run_id="refund-42")

docs/guide-pydantic-ai.md says the rest.

It may import anything in the package, and ``pydantic_ai``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Collection, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

from ares_events.agents.journal import AsyncJournal, ModelReply
from ares_events.core.faces import blocking
from ares_events.core.store import EventStore
from ares_events.errors import ConfigError
from ares_events.integrations._faces import Adapter, AsyncAdapter, Faces
from ares_events.integrations._journaled import idempotency_key, tool_call
from ares_events.integrations._pydantic_ai_store import MessageLog
from ares_events.integrations._pydantic_ai_store_async import (
    MODULE,
    STREAM_PREFIX,
    AsyncMessageLog,
    ConversationConflict,
    decode_messages,
    encode_messages,
    stream_of,
)

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.models import Model, ModelRequestParameters
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext
    from pydantic_ai.toolsets.abstract import ToolsetTool

    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "MODULE",
    "STREAM_PREFIX",
    "VOLATILE_KEYS",
    "AresMessageStore",
    "AsyncAresMessageStore",
    "ConversationConflict",
    "JournaledModel",
    "JournaledToolset",
    "decode_messages",
    "encode_messages",
    "idempotency_key",
    "run_durably",
    "stable_request",
    "stream_of",
]

VOLATILE_KEYS: frozenset[str] = frozenset({"timestamp", "run_id", "conversation_id"})
"""Keys of a serialised message that change on every run (left out of a model call's
request identity)."""


def stable_request(value: Any) -> Any:
    """``value`` (serialised messages) without :data:`VOLATILE_KEYS`, at any depth."""
    if isinstance(value, dict):
        return {k: stable_request(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [stable_request(v) for v in value]
    return value


class AresMessageStore(Adapter):
    """Conversations of Pydantic AI messages, one verified stream each (blocking; any
    thread).

    Args:
        url: a store URL; opened on first use, closed by :meth:`close`.
        store: an open blocking store instead (left open by :meth:`close`).

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
    """

    def __init__(self, *, url: str | None = None, store: EventStore | None = None) -> None:
        if store is not None:
            blocking(store, "AresMessageStore", "AsyncAresMessageStore")
        self._faces: Faces[MessageLog, Any] = Faces(url, store, MessageLog)
        self._versions = _Versions()

    def load(self, conversation_id: str) -> list[ModelMessage]:
        """The conversation's messages, oldest first; this caller's later appends (this
        thread's, or this asyncio task's) are written at the version read now.

        Raises:
            ChainIntegrityError: the stream does not verify (nothing is decoded).
            StoreUnavailable: the store cannot be reached.
        """
        messages, version = self._faces.blocking().load(conversation_id)
        self._versions.set(conversation_id, version)
        return messages

    def append(self, conversation_id: str, new_messages: Sequence[ModelMessage]) -> int:
        """Append ``new_messages`` (e.g. ``result.new_messages()``) as one event, at the
        version this caller last loaded (or wrote) the conversation at through this store
        (the current version when it never did); return the conversation's version after it.

        Raises:
            ConversationConflict: another writer appended since (nothing was stored).
            StoreUnavailable: the store cannot be reached.
        """
        expected = self._versions.get(conversation_id)
        version = self._faces.blocking().append(conversation_id, new_messages, expected)
        self._versions.set(conversation_id, version)
        return version

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
            ConversationConflict: another writer appended since this store loaded it.
        """
        expected = self._versions.get(conversation_id)
        version = self._faces.blocking().clear(
            conversation_id, expected=expected, erase=erase, reason=reason, by=by
        )
        self._versions.set(conversation_id, version)

    def close(self) -> None:
        """Close the store when this object opened it (from ``url=``)."""
        self._faces.close()

    def __enter__(self) -> AresMessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SEEN: ContextVar[dict[tuple[int, str], int]] = ContextVar("ares_events_pai_seen")
"""Per caller (a thread, or an asyncio task and the tasks it starts): the version each
store object last loaded or wrote each conversation at. A store object shared by
concurrent requests thus writes each request's append at the version that request read,
and the later of two is refused, as with two store objects."""
_tokens = itertools.count()


class _Versions:
    """The caller's versions of one store object's conversations (:data:`_SEEN`)."""

    __slots__ = ("_token",)

    def __init__(self) -> None:
        self._token = next(_tokens)

    def get(self, conversation_id: str) -> int | None:
        return _SEEN.get({}).get((self._token, conversation_id))

    def set(self, conversation_id: str, version: int) -> None:
        # A new dict each time: a task's copy of the context must not see another's writes.
        _SEEN.set({**_SEEN.get({}), (self._token, conversation_id): version})


class AsyncAresMessageStore(AsyncAdapter):
    """:class:`AresMessageStore` for asyncio code: the same conversations, awaited.

    Args:
        url: a store URL, opened (blocking, used in worker threads) on first use.
        store: an open store instead (left open): a blocking one is used from any thread
            and event loop, an asyncio one only on its own loop.

    Raises:
        ConfigError: neither or both of ``url`` and ``store``.
    """

    def __init__(
        self, *, url: str | None = None, store: AsyncEventStore | EventStore | None = None
    ) -> None:
        self._faces = Faces(url, store, MessageLog, AsyncMessageLog)
        self._versions = _Versions()

    async def load(self, conversation_id: str) -> list[ModelMessage]:
        """:meth:`AresMessageStore.load`."""
        messages, version = await self._faces.call("load", conversation_id)
        self._versions.set(conversation_id, version)
        return cast("list[ModelMessage]", messages)

    async def append(self, conversation_id: str, new_messages: Sequence[ModelMessage]) -> int:
        """:meth:`AresMessageStore.append`."""
        expected = self._versions.get(conversation_id)
        version: int = await self._faces.call("append", conversation_id, new_messages, expected)
        self._versions.set(conversation_id, version)
        return version

    async def clear(
        self,
        conversation_id: str,
        *,
        erase: bool = False,
        reason: str = "clear",
        by: str = "pydantic-ai",
    ) -> None:
        """:meth:`AresMessageStore.clear`."""
        expected = self._versions.get(conversation_id)
        version = await self._faces.call(
            "clear", conversation_id, expected=expected, erase=erase, reason=reason, by=by
        )
        self._versions.set(conversation_id, version)


class JournaledModel(WrapperModel):
    """A model whose requests go through the run journal: answered from the log on
    replay, else requested (write-ahead), made, and recorded."""

    def __init__(self, wrapped: Model | str, journal: AsyncJournal) -> None:
        super().__init__(wrapped)
        self.journal = journal

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        request = stable_request(encode_messages(messages))
        params = {"model": self.wrapped.model_name}

        async def call(_messages: Any, _params: Any) -> ModelReply:
            response = await self.wrapped.request(
                messages, model_settings, model_request_parameters
            )
            u = response.usage
            usage = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
            usage["total_tokens"] = u.input_tokens + u.output_tokens
            return ModelReply(encode_messages([response])[0], usage)

        completion = await self.journal.model_call(request, params, call=call)
        got = decode_messages([completion])[0]
        assert isinstance(got, ModelResponse)
        return got


@dataclass
class JournaledToolset(WrapperToolset[Any]):
    """A toolset whose calls go through the run journal: a tool call that returned is
    answered from the log and never run again. Calls run one at a time (in the order the
    model asked for them), so a replay numbers them the same way."""

    journal: AsyncJournal | None = None
    idempotent: Collection[str] = ()
    reconcile: Callable[[str, str], Any] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)

    async def call_tool(
        self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]
    ) -> Any:
        journal = self.journal
        if journal is None:  # an if, not an assert: python -O drops asserts
            raise ConfigError("JournaledToolset needs a journal (journal=...)")
        async with self._lock:
            return await tool_call(
                journal,
                name,
                to_jsonable_python(tool_args),
                lambda: self.wrapped.call_tool(name, tool_args, ctx, tool),
                idempotent=name in self.idempotent,
                reconcile=self.reconcile,
            )


async def run_durably(
    agent: Agent[Any, Any],
    user_prompt: str | Sequence[Any] | None = None,
    *,
    store: AsyncEventStore | EventStore,
    run_id: str,
    message_history: Sequence[ModelMessage] | None = None,
    idempotent: Collection[str] = (),
    reconcile: Callable[[str, str], Any] | None = None,
    code_revision: str = "unversioned",
    **run_kwargs: Any,
) -> Any:
    """Run ``agent`` (its model and toolsets wrapped) on ``user_prompt`` as the durable run
    ``run_id``; the same call after a crash resumes it. Returns Pydantic AI's run result.
    ``message_history`` and ``run_kwargs`` go to ``agent.run``; ``idempotent``,
    ``reconcile`` and ``code_revision`` are the journal's (docs/guide-journal.md).

    Raises:
        InDoubtToolCall: a tool call was cut off, has no reconciler and is not idempotent.
        ReplayDivergence: the run asked for something other than what the log recorded.
        RunRefused: the journal's gate refused to resume.
    """
    journal = await AsyncJournal.open(store, run_id, code_revision=code_revision)
    model = agent.model if run_kwargs.get("model") is None else run_kwargs.pop("model")
    if model is None:
        raise ConfigError("run_durably needs an agent with a model (or model=)")
    wrapped = JournaledModel(model, journal)
    toolsets = [
        JournaledToolset(ts, journal=journal, idempotent=idempotent, reconcile=reconcile)
        for ts in agent.toolsets
    ]
    # Sequential tool calls: a replay numbers the journal's steps the same way.
    with (
        agent.override(model=wrapped, toolsets=toolsets, tools=[]),
        ToolManager.parallel_execution_mode("sequential"),
    ):
        result = await agent.run(user_prompt, message_history=message_history, **run_kwargs)
    await journal.complete(to_jsonable_python(result.output))
    return result
