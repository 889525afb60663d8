"""Pydantic AI on ares-events (``pip install 'ares-events[pydantic-ai]'``): message
history in a store, and durable runs without Temporal or DBOS.

**History.** :class:`AresMessageStore` (blocking) and :class:`AsyncAresMessageStore`
(asyncio) keep each conversation on one hash-chained stream,
``pydantic-ai/<conversation_id>``, round-tripped with Pydantic AI's own
``ModelMessagesTypeAdapter``::

    from ares_events.integrations.pydantic_ai import AresMessageStore

    history = AresMessageStore(url="sqlite:///agents.db")
    result = agent.run_sync("Hello", message_history=history.load("c-1"))
    history.append("c-1", result.new_messages())

An append is written at the version the store last loaded the conversation at; a second
writer gets :class:`ConversationConflict` (also Pydantic AI's ``ConversationConflict``)
and nothing of its append is stored. Reads verify the chain before anything is decoded.

**Durable runs.** :func:`run_durably` runs an agent with its model wrapped by
:class:`JournaledModel` and its toolsets by :class:`JournaledToolset` (Pydantic AI's own
``WrapperModel`` and ``WrapperToolset`` extension points), both writing through the run
journal (:class:`~ares_events.agents.journal.AsyncJournal`) on the stream ``run_id``::

    result = await run_durably(agent, "Refund order 42", store=store, run_id="refund-42")

Killed at any point (``kill -9``) and called again with the same ``run_id``, the run
replays: every model call answered before the kill is returned from the log (not paid
again), every tool call that returned is returned from the log (not run again), and the
run continues live from the first step that was not done. A tool call that was requested
but never answered is *in doubt*: it is reconciled (``reconcile=``), retried with the
same idempotency key (a tool named in ``idempotent=``), or the run stops with
:class:`~ares_events.agents.journal.InDoubtToolCall` for a human to settle. A tool gets
its idempotency key from :func:`idempotency_key`.

The loop must be deterministic given the journal's answers (it is: Pydantic AI decides
from the model's responses); the request of a model call is compared without its
timestamps and run ids (they change on every run). Tool calls of one model response run
one at a time, in the order the model asked for them, so their steps are numbered the same
way on every replay. A tool's result is recorded as JSON (``pydantic_core``'s
``to_jsonable_python``), and a replayed tool returns that JSON form.

It may import anything in the package, and ``pydantic_ai``.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.tool_manager import ToolManager
from pydantic_ai.toolsets.wrapper import WrapperToolset
from pydantic_core import to_jsonable_python

from ares_events.agents.journal import AsyncJournal, ModelReply
from ares_events.integrations._pydantic_ai_store import AresMessageStore
from ares_events.integrations._pydantic_ai_store_async import (
    MODULE,
    STREAM_PREFIX,
    AsyncAresMessageStore,
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

    from ares_events.core.store import EventStore
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

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ares_pai_key", default=None)


def idempotency_key() -> str | None:
    """The idempotency key of the tool call running now (``run_id:step``), to pass to
    the downstream system; None outside a journaled tool call."""
    return _KEY.get()


def stable_request(value: Any) -> Any:
    """``value`` (serialised messages) without :data:`VOLATILE_KEYS`, at any depth."""
    if isinstance(value, dict):
        return {k: stable_request(v) for k, v in value.items() if k not in VOLATILE_KEYS}
    if isinstance(value, list):
        return [stable_request(v) for v in value]
    return value


def _usage(response: ModelResponse) -> dict[str, Any]:
    u = response.usage
    out = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
    out["total_tokens"] = out["input_tokens"] + out["output_tokens"]
    return out


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
            return ModelReply(encode_messages([response])[0], _usage(response))

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
        self,
        name: str,
        tool_args: dict[str, Any],
        ctx: RunContext[Any],
        tool: ToolsetTool[Any],
    ) -> Any:
        journal = self.journal
        assert journal is not None, "JournaledToolset needs a journal"

        async def call(args: Any, key: str) -> Any:
            token = _KEY.set(key)
            try:
                result = await self.wrapped.call_tool(name, tool_args, ctx, tool)
            finally:
                _KEY.reset(token)
            return to_jsonable_python(result)

        reconcile = self.reconcile
        rec = (lambda key: reconcile(name, key)) if reconcile is not None else None
        async with self._lock:
            return await journal.tool_call(
                name,
                to_jsonable_python(tool_args),
                call=call,
                reconcile=rec,
                idempotent=name in self.idempotent,
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
    """Run ``agent`` on ``user_prompt`` as the durable run ``run_id`` (see the module
    docstring); the same call after a crash resumes it. Returns Pydantic AI's run result.

    Args:
        agent: the agent (its model and toolsets are wrapped for the run).
        user_prompt: the prompt, as for ``agent.run``.
        store: the event store holding the run's journal.
        run_id: the run's stable id (its stream; the idempotency-key prefix).
        message_history: earlier messages, as for ``agent.run``.
        idempotent: names of tools safe to call again with the same key when in doubt.
        reconcile: ``reconcile(tool_name, key) -> (landed, result)`` asks the downstream
            system whether an in-doubt (or timed-out) tool call landed.
        code_revision: recorded by the journal; a resume under another revision is
            refused (the journal's version gate).
        **run_kwargs: passed to ``agent.run`` (``deps``, ``model_settings``, ...).

    Raises:
        InDoubtToolCall: a tool call was cut off, has no reconciler and is not idempotent.
        ReplayDivergence: the run asked for something other than what the log recorded.
        RunRefused: the journal's gate refused to resume.
    """
    journal = await AsyncJournal.open(store, run_id, code_revision=code_revision)
    model = agent.model if run_kwargs.get("model") is None else run_kwargs.pop("model")
    if model is None:
        from ares_events.errors import ConfigError

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
