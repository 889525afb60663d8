"""Durable Google ADK runs: model calls and function tools go through the run journal, so a
run started again replays what was answered and done::

    result = await run_durably(agent, "Refund order 42", store=store, run_id="refund-42")

docs/guide-google-adk.md says what is journaled and what runs live on a replay.

It may import anything in the package, and ``google.adk``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from google.adk.agents import LlmAgent
from google.adk.flows.llm_flows.functions import AF_FUNCTION_CALL_ID_PREFIX
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.tools.base_tool import BaseTool
from google.adk.tools.function_tool import FunctionTool
from google.adk.utils._callback_pipeline import _invoke_callback
from google.genai import types
from pydantic import ConfigDict, Field
from pydantic_core import to_jsonable_python

from ares_events.agents.journal import AsyncJournal, ModelReply
from ares_events.core.iterators_async import maybe_await
from ares_events.errors import ConfigError
from ares_events.integrations._journaled import idempotency_key, journal_errors, tool_call

if TYPE_CHECKING:
    from google.adk.agents.run_config import RunConfig
    from google.adk.events.event import Event
    from google.adk.models.llm_request import LlmRequest
    from google.adk.sessions.base_session_service import BaseSessionService
    from google.adk.sessions.session import Session
    from google.adk.tools.tool_context import ToolContext

    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

__all__ = [
    "SESSION_APPEND",
    "SESSION_BASE",
    "DurableRun",
    "JournaledLlm",
    "JournaledTool",
    "ToolCallOrder",
    "idempotency_key",
    "run_durably",
    "stable_request",
]

SESSION_BASE = "google-adk.session.base"
"""The journal step (first of a run on a caller's session service) recording how many
events the session held when the run began."""
SESSION_APPEND = "google-adk.session.append"
"""The journal step (last) appending the run's events to the caller's session."""
_RUN_MARK = "ares_run"


def _args_hash(name: str, args: Any) -> str:
    return name + "\x00" + json.dumps(to_jsonable_python(args), sort_keys=True)


def _scrub(value: Any, call: bool = False) -> Any:
    """``value`` (serialised contents) without the function-call ids ADK generates
    (``call``: ``value`` is a function call or response)."""
    if isinstance(value, dict):
        return {
            k: _scrub(v, k in ("function_call", "function_response"))
            for k, v in value.items()
            if not (call and k == "id" and str(v).startswith(AF_FUNCTION_CALL_ID_PREFIX))
        }
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def stable_request(llm_request: LlmRequest) -> dict[str, Any]:
    """A model call's identity in the journal: the system instruction and the contents
    (what the model sees), as JSON, without ADK's generated ``adk-`` function-call ids."""
    config = llm_request.config
    system = config.system_instruction if config is not None else None
    contents = [c.model_dump(mode="json", exclude_none=True) for c in llm_request.contents]
    return {"system": to_jsonable_python(system), "contents": _scrub(contents)}


class ToolCallOrder:
    """Numbers the journaled tool calls (of the tools ``names``) of one model response in
    the order the model emitted them, though ADK runs them concurrently: each call waits
    until the calls before it in the response are done. A call that matches no slot (a
    callback changed the response) runs when it gets the lock, in arrival order."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = frozenset(names)
        self.lock = asyncio.Lock()
        self._slots: list[str | None] = []  # a claimed slot is None
        self._done: list[asyncio.Event] = []

    def expect(self, responses: list[LlmResponse]) -> None:
        """Start a batch: the journaled function calls of a model's final response."""
        calls = []
        for r in responses:
            if r.partial or r.content is None:
                continue
            calls = [
                _args_hash(p.function_call.name or "", p.function_call.args or {})
                for p in r.content.parts or []
                if p.function_call is not None and p.function_call.name in self.names
            ]
        self._slots = list(calls)
        self._done = [asyncio.Event() for _ in calls]

    def claim(self, name: str, args: Any) -> int | None:
        """The first unclaimed slot with this name and these arguments, or None (two
        identical calls are interchangeable: the journal compares name and arguments)."""
        h = _args_hash(name, args)
        i = next((i for i, s in enumerate(self._slots) if s == h), None)
        if i is not None:
            self._slots[i] = None
        return i

    async def turn(self, slot: int | None) -> None:
        """Wait until every slot before ``slot`` is released."""
        for ev in self._done[:slot] if slot is not None else ():
            await ev.wait()

    def release(self, slot: int | None) -> None:
        """Mark ``slot`` finished (idempotent)."""
        if slot is not None and slot < len(self._done):
            self._done[slot].set()


class JournaledLlm(BaseLlm):
    """A ``BaseLlm`` whose calls go through the run journal: every response the wrapped
    model yields (partial ones too) is recorded, and replayed in order."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    wrapped: BaseLlm
    journal: Any = Field(exclude=True)
    order: Any = Field(default=None, exclude=True)

    @property
    def capabilities(self) -> Any:
        """The wrapped model's capabilities."""
        return self.wrapped.capabilities

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        """The wrapped model's responses, from the log when this call was answered."""
        journal: AsyncJournal = self.journal

        async def call(_messages: Any, _params: Any) -> ModelReply:
            got = [r async for r in self.wrapped.generate_content_async(llm_request, stream)]
            usage: dict[str, Any] = {}
            if (meta := got[-1].usage_metadata if got else None) is not None:
                usage["input_tokens"] = meta.prompt_token_count or 0
                usage["output_tokens"] = meta.candidates_token_count or 0
                usage["total_tokens"] = meta.total_token_count or 0
            dumped = [r.model_dump(mode="json", exclude_none=True) for r in got]
            return ModelReply({"responses": dumped}, usage)

        params = {"model": self.wrapped.model, "stream": stream}
        completion = await journal.model_call(stable_request(llm_request), params, call=call)
        responses = [LlmResponse.model_validate(r) for r in completion["responses"]]
        if self.order is not None:
            self.order.expect(responses)
        for r in responses:
            yield r


class JournaledTool(BaseTool):
    """A ``FunctionTool`` whose calls go through the run journal, numbered by the run's
    ``order`` (shared with its :class:`JournaledLlm`)."""

    def __init__(
        self,
        wrapped: BaseTool,
        journal: AsyncJournal,
        order: ToolCallOrder,
        *,
        idempotent: bool = False,
        reconcile: Callable[[str, str], Any] | None = None,
    ) -> None:
        declared = ("name", "description", "is_long_running", "custom_metadata")
        super().__init__(**{k: getattr(wrapped, k) for k in declared})
        self.wrapped, self.journal, self.order = wrapped, journal, order
        self.idempotent, self.reconcile = idempotent, reconcile

    def _get_declaration(self) -> types.FunctionDeclaration | None:
        return self.wrapped._get_declaration()

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        """The tool's result: from the log when this call returned before, else run."""
        # The slot is found by name and arguments, not by arrival: the tasks of one
        # response reach this line in whatever order their callbacks let them.
        slot = self.order.claim(self.name, args)
        try:
            await self.order.turn(slot)
            # The lock orders the calls no slot names; the journal takes one step at a time.
            async with self.order.lock:
                return await tool_call(
                    self.journal,
                    self.name,
                    to_jsonable_python(args),
                    lambda: self.wrapped.run_async(args=args, tool_context=tool_context),
                    idempotent=self.idempotent,
                    reconcile=self.reconcile,
                )
        finally:
            self.order.release(slot)


@dataclass(frozen=True)
class DurableRun:
    """What :func:`run_durably` returns: the text of the run's last final response (its
    text parts joined, thoughts left out; None without one), that event, every event of
    the run as this call produced them (a replay makes them again, with new ids), and the
    in-memory session the run ran in."""

    final_output: str | None
    final_response: Event | None
    events: list[Event] = field(repr=False)
    session: Session = field(repr=False)


def _text(event: Event | None) -> str | None:
    if event is None or event.content is None:
        return None
    texts = [p.text for p in event.content.parts or [] if p.text and not p.thought]
    return "".join(texts) if texts else None


def _durable_agent(
    agent: LlmAgent,
    journal: AsyncJournal,
    idempotent: Collection[str],
    reconcile: Callable[[str, str], Any] | None,
) -> LlmAgent:
    if not isinstance(agent, LlmAgent):
        raise ConfigError(
            f"run_durably runs an LlmAgent, got {type(agent).__name__} (run its LlmAgent "
            "sub-agents durably one by one)"
        )
    resolved = [
        FunctionTool(t) if callable(t) and not isinstance(t, BaseTool) else t for t in agent.tools
    ]
    journaled = [t for t in resolved if isinstance(t, FunctionTool) and not t.is_long_running]
    wrap = {id(t) for t in journaled}
    for t in journaled:
        if getattr(t, "_require_confirmation", False):
            raise ConfigError(
                f"tool {t.name!r} requires confirmation: a durable run cannot journal a "
                "call that pauses for a human (settle it before the run)"
            )
    order = ToolCallOrder([t.name for t in journaled])
    tools: list[Any] = [
        JournaledTool(t, journal, order, idempotent=t.name in idempotent, reconcile=reconcile)
        if isinstance(t, FunctionTool) and id(t) in wrap
        else orig
        for t, orig in zip(resolved, agent.tools, strict=True)
    ]
    llm = agent.canonical_model
    model = JournaledLlm(model=llm.model, wrapped=llm, journal=journal, order=order)
    update: dict[str, Any] = {"model": model, "tools": tools}
    # The agent's own callbacks may answer a tool call (it never reaches the journal) or
    # put another response in the model's place: the order must follow what ADK runs.
    for name, watch in (
        ("before_tool_callback", _watching_tool),
        ("before_model_callback", _watching_model),
        ("after_model_callback", _watching_model),
    ):
        if getattr(agent, name) is not None:
            update[name] = [watch(cb, order) for cb in getattr(agent, f"canonical_{name}s")]
    return agent.clone(update=update)


def _watching_tool(cb: Callable[..., Any], order: ToolCallOrder) -> Callable[..., Any]:
    """``cb`` (a before-tool callback), releasing the slot of a journaled call it answers:
    that tool never runs, and the calls after it must not wait for it."""

    async def before_tool(tool: BaseTool, args: dict[str, Any], tool_context: Any) -> Any:
        got = await maybe_await(
            _invoke_callback(cb, tool=tool, args=args, tool_context=tool_context)
        )
        if got is not None and isinstance(tool, JournaledTool):
            order.release(order.claim(tool.name, args))
        return got

    return before_tool


def _watching_model(cb: Callable[..., Any], order: ToolCallOrder) -> Callable[..., Any]:
    """``cb`` (a before- or after-model callback): a response it returns in the model's
    place is the batch of calls ADK runs next. ADK passes the value by its name
    (``llm_request`` or ``llm_response``), which the wrapper hands on as it came."""

    async def model_callback(callback_context: Any, **value: Any) -> Any:
        got = await maybe_await(_invoke_callback(cb, callback_context=callback_context, **value))
        if isinstance(got, LlmResponse):
            order.expect([got])
        return got

    return model_callback


async def run_durably(
    agent: LlmAgent,
    new_message: str | types.Content,
    *,
    store: AsyncEventStore | EventStore,
    run_id: str,
    session_service: BaseSessionService | None = None,
    app_name: str = "ares-events",
    user_id: str = "user",
    session_id: str | None = None,
    idempotent: Collection[str] = (),
    reconcile: Callable[[str, str], Any] | None = None,
    code_revision: str = "unversioned",
    run_config: RunConfig | None = None,
) -> DurableRun:
    """Run ``agent`` (cloned, its model and function tools wrapped) on ``new_message`` as
    the durable run ``run_id``; the same call after a crash resumes it.

    The run works in an in-memory ADK session (``session_id``, default ``run_id``) that
    each call rebuilds by replay. With ``session_service`` it starts as a copy of that
    service's session (``app_name``, ``user_id``) as it was when the run began
    (:data:`SESSION_BASE`), and gets the run's events once, when the run completes
    (:data:`SESSION_APPEND`). ``idempotent``, ``reconcile`` and ``code_revision`` are the
    journal's (docs/guide-journal.md).

    Raises:
        ConfigError: ``agent`` is not an ``LlmAgent``, or a tool requires confirmation (a
            pause the journal does not own).
        InDoubtToolCall: a tool call was cut off, has no reconciler and is not idempotent.
        ReplayDivergence: the run asked for something other than what the log recorded.
        RunRefused: the journal's gate refused to resume (another ``code_revision``).
    """
    sid = session_id or run_id
    journal = await AsyncJournal.open(store, run_id, code_revision=code_revision)
    durable = _durable_agent(agent, journal, idempotent, reconcile)
    local = InMemorySessionService()

    async def local_session() -> Session:
        got = await local.get_session(app_name=app_name, user_id=user_id, session_id=sid)
        assert got is not None  # created below, in this call's own in-memory service
        return got

    outer: Session | None = None
    if session_service is not None:
        outer = await _seed(journal, session_service, local, app_name, user_id, sid)
    else:
        await local.create_session(app_name=app_name, user_id=user_id, session_id=sid)
    base = len((await local_session()).events)
    message = new_message
    if not isinstance(message, types.Content):
        message = types.Content(role="user", parts=[types.Part(text=message)])
    runner = Runner(agent=durable, app_name=app_name, session_service=local)
    final: Event | None = None
    with journal_errors():  # ADK re-raises what a tool raised, perhaps wrapped
        async for event in runner.run_async(
            user_id=user_id, session_id=sid, new_message=message, run_config=run_config
        ):
            # The last final response, whichever agent gave it (a transfer hands the
            # answer to a sub-agent).
            if event.is_final_response() and not event.partial:
                final = event
    session = await local_session()
    events = list(session.events[base:])
    if outer is not None and session_service is not None:
        await _write_back(journal, session_service, outer, events, run_id)
    output = _text(final)
    await journal.complete(output)
    return DurableRun(final_output=output, final_response=final, events=events, session=session)


async def _seed(
    journal: AsyncJournal,
    service: BaseSessionService,
    local: InMemorySessionService,
    app_name: str,
    user_id: str,
    sid: str,
) -> Session:
    """Copy the caller's session into ``local`` as it was when the run began."""
    outer = await service.get_session(app_name=app_name, user_id=user_id, session_id=sid)
    if outer is None:
        outer = await service.create_session(app_name=app_name, user_id=user_id, session_id=sid)
    held = len(outer.events)

    async def count(_args: Any, _key: str) -> int:
        return held

    base = int(await journal.tool_call(SESSION_BASE, {"session": sid}, call=count, idempotent=True))
    if base > held:
        raise ConfigError(
            f"session {sid!r} holds {held} events, fewer than the {base} it held when run "
            f"{journal.run_id!r} began"
        )
    # The state as the service folds it now (app: and user: keys included); the copied
    # events' deltas are applied again on top, in order, as ADK applied them.
    copy = await local.create_session(
        app_name=app_name, user_id=user_id, session_id=sid, state=dict(outer.state)
    )
    for ev in outer.events[:base]:
        await local.append_event(copy, ev.model_copy(deep=True))
    return outer


async def _write_back(
    journal: AsyncJournal,
    service: BaseSessionService,
    outer: Session,
    events: list[Event],
    run_id: str,
) -> None:
    """Append the run's events to the caller's session, once (a journal step; a retry
    after a cut-off write skips the events already there, marked with the run id)."""

    async def append(_args: Any, _key: str) -> int:
        fresh = await service.get_session(
            app_name=outer.app_name, user_id=outer.user_id, session_id=outer.id
        )
        assert fresh is not None
        there = sum(1 for e in fresh.events if (e.custom_metadata or {}).get(_RUN_MARK) == run_id)
        for ev in events[there:]:
            marked = ev.model_copy(deep=True)
            marked.custom_metadata = {**(marked.custom_metadata or {}), _RUN_MARK: run_id}
            await service.append_event(fresh, marked)
        return len(events)

    await journal.tool_call(
        SESSION_APPEND, {"session": outer.id, "events": len(events)}, call=append, idempotent=True
    )
