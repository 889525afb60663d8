"""Durable Google ADK runs: an agent's model calls and function tools go through the run
journal (:class:`~ares_events.agents.journal.AsyncJournal`, the stream ``run_id``), so a
run killed at any point and started again with the same ``run_id`` replays what was
answered and done, and goes on live from the first step that was not::

    from ares_events.integrations.google_adk_journal import run_durably

    result = await run_durably(agent, "Refund order 42", store=store, run_id="refund-42")
    print(result.final_output)

- :class:`JournaledLlm` is a ``BaseLlm`` that delegates to the agent's model: a model
  call answered before the kill is returned from the log, not paid again. A wrapper
  rather than ``before_model_callback``/``after_model_callback``: with the callbacks the
  write-ahead request and the recorded answer would sit in two hooks the agent's own
  callbacks share (ADK stops at the first one that answers, so ours could be skipped); the
  wrapper is one call the journal brackets. The request identity is what the model sees,
  the system instruction and the contents, with the ids ADK makes up for function calls
  (``adk-...``, new on every run) left out.
- :class:`JournaledTool` wraps a ``FunctionTool``: a call that returned is answered from
  the log, never run again; one cut off inside the tool is *in doubt* (reconciled,
  retried with the same key when named in ``idempotent=``, else the run stops with
  :class:`~ares_events.agents.journal.InDoubtToolCall`). :func:`idempotency_key` gives
  the running call's key, ``run_id:step``.
- ADK runs a response's function calls in parallel (one asyncio task each,
  ``flows/llm_flows/tools/_batch_executor.py``) and has no setting to run them one at a
  time. :class:`ToolCallOrder` numbers them instead: the journaled model hands it the
  response's calls in the order the model emitted them, and each journaled call waits
  for the ones before it to finish, so a replay numbers the journal's steps the same way.
  The agent's own model and tool callbacks are watched: a response one of them puts in
  the model's place is the batch, and a call one of them answers gives up its turn.
- :func:`run_durably` clones the agent with both wrappers and runs it through an ADK
  ``Runner`` in an in-memory session rebuilt by replay (a caller's session service gets
  the run's events once, when it completes); it returns a :class:`DurableRun`.

Not journaled (they run live on a replay): the models and tools of sub-agents (a
transfer runs them as they are; wrap them with the same pieces), toolsets, other tools than
``FunctionTool``, long-running tools, and what a tool does to ADK state through its
``tool_context`` (a replayed call returns its recorded result and nothing else). A tool's
output is recorded as JSON (``pydantic_core``'s ``to_jsonable_python``) and a replayed
tool returns that JSON form.

It may import anything in the package, and ``google.adk``.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
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

from ares_events.agents.journal import (
    AsyncJournal,
    ModelReply,
)
from ares_events.agents.journal_errors import journal_error_in
from ares_events.errors import ConfigError

if TYPE_CHECKING:
    from google.adk.agents.run_config import RunConfig
    from google.adk.events.event import Event
    from google.adk.models.llm_request import LlmRequest
    from google.adk.sessions.base_session_service import BaseSessionService
    from google.adk.sessions.session import Session
    from google.adk.tools.tool_context import ToolContext

    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

logger = logging.getLogger(__name__)

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

_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ares_adk_key", default=None)


def idempotency_key() -> str | None:
    """The idempotency key (``run_id:step``) of the journaled tool call running now, to
    pass downstream; None outside one."""
    return _KEY.get()


def _args_hash(name: str, args: Any) -> str:
    return name + "\x00" + json.dumps(to_jsonable_python(args), sort_keys=True)


def _scrub(value: Any) -> Any:
    """``value`` (serialised contents) without the function-call ids ADK generates."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in ("function_call", "function_response") and isinstance(v, dict):
                out[k] = _scrub(
                    {
                        ik: iv
                        for ik, iv in v.items()
                        if not (ik == "id" and str(iv).startswith(AF_FUNCTION_CALL_ID_PREFIX))
                    }
                )
            else:
                out[k] = _scrub(v)
        return out
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
    """Numbers the journaled tool calls of one model response in the order the model
    emitted them, though ADK runs them concurrently.

    The journaled model calls :meth:`expect` with each response's function calls; a
    journaled tool call :meth:`claim` s the first unclaimed slot with its name and
    arguments, waits (:meth:`turn`) until every earlier slot is released, and
    :meth:`release` s its own when done (or answered without running, or cancelled).
    A call that matches no slot (a callback changed the response) runs when it gets the
    lock, in arrival order.

    Args:
        names: the tool names that are journaled (other calls take no slot).
    """

    def __init__(self, names: Collection[str]) -> None:
        self.names = frozenset(names)
        self.lock = asyncio.Lock()
        self._slots: list[str] = []
        self._claimed: list[bool] = []
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
        self._slots = calls
        self._claimed = [False] * len(calls)
        self._done = [asyncio.Event() for _ in calls]

    def claim(self, name: str, args: Any) -> int | None:
        """The first unclaimed slot with this name and these arguments, or None (two
        identical calls are interchangeable: the journal compares name and arguments)."""
        h = _args_hash(name, args)
        for i, s in enumerate(self._slots):
            if s == h and not self._claimed[i]:
                self._claimed[i] = True
                return i
        return None

    async def turn(self, slot: int | None) -> None:
        """Wait until every slot before ``slot`` is released."""
        if slot is None:
            return
        done = self._done
        for ev in done[:slot]:
            await ev.wait()

    def release(self, slot: int | None) -> None:
        """Mark ``slot`` finished (idempotent)."""
        if slot is not None and slot < len(self._done):
            self._done[slot].set()


class JournaledLlm(BaseLlm):
    """A ``BaseLlm`` whose calls go through the run journal (see the module docstring):
    answered from the log on replay, else requested (write-ahead), made, and recorded.
    Every response the wrapped model yields (partial ones too, when streaming) is
    recorded, and replayed in order."""

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
        request = stable_request(llm_request)

        async def call(_messages: Any, _params: Any) -> ModelReply:
            got = [r async for r in self.wrapped.generate_content_async(llm_request, stream)]
            usage: dict[str, Any] = {}
            meta = got[-1].usage_metadata if got else None
            if meta is not None:
                usage = {
                    "input_tokens": meta.prompt_token_count or 0,
                    "output_tokens": meta.candidates_token_count or 0,
                    "total_tokens": meta.total_token_count or 0,
                }
            dumped = [r.model_dump(mode="json", exclude_none=True) for r in got]
            return ModelReply({"responses": dumped}, usage)

        completion = await journal.model_call(
            request, {"model": self.wrapped.model, "stream": stream}, call=call
        )
        responses = [LlmResponse.model_validate(r) for r in completion["responses"]]
        if self.order is not None:
            self.order.expect(responses)
        for r in responses:
            yield r


class JournaledTool(BaseTool):
    """A ``FunctionTool`` whose calls go through the run journal (see the module
    docstring); it declares itself to the model as the wrapped tool does.

    Args:
        wrapped: the tool.
        journal: the run's journal.
        order: the run's :class:`ToolCallOrder` (shared with its :class:`JournaledLlm`).
        idempotent: safe to call again with the same key when in doubt.
        reconcile: ``reconcile(tool_name, key) -> (landed, result)``.
    """

    def __init__(
        self,
        wrapped: BaseTool,
        journal: AsyncJournal,
        order: ToolCallOrder,
        *,
        idempotent: bool = False,
        reconcile: Callable[[str, str], Any] | None = None,
    ) -> None:
        super().__init__(
            name=wrapped.name,
            description=wrapped.description,
            is_long_running=wrapped.is_long_running,
            custom_metadata=wrapped.custom_metadata,
        )
        self.wrapped = wrapped
        self.journal = journal
        self.order = order
        self.idempotent = idempotent
        self.reconcile = reconcile

    def _get_declaration(self) -> types.FunctionDeclaration | None:
        return self.wrapped._get_declaration()

    async def run_async(self, *, args: dict[str, Any], tool_context: ToolContext) -> Any:
        """The tool's result: from the log when this call returned before, else run."""
        name = self.name
        # The slot is found by name and arguments, not by arrival: the tasks of one
        # response reach this line in whatever order their callbacks let them.
        slot = self.order.claim(name, args)

        async def call(_args: Any, key: str) -> Any:
            token = _KEY.set(key)
            try:
                return to_jsonable_python(
                    await self.wrapped.run_async(args=args, tool_context=tool_context)
                )
            finally:
                _KEY.reset(token)

        reconcile = self.reconcile
        rec = (lambda key: reconcile(name, key)) if reconcile is not None else None
        try:
            await self.order.turn(slot)
            # The lock orders the calls no slot names; the journal takes one step at a time.
            async with self.order.lock:
                return await self.journal.tool_call(
                    name,
                    to_jsonable_python(args),
                    call=call,
                    reconcile=rec,
                    idempotent=self.idempotent,
                )
        finally:
            self.order.release(slot)


@dataclass(frozen=True)
class DurableRun:
    """What :func:`run_durably` returns.

    Attributes:
        final_output: the text of the run's last final response (its text parts joined,
            thoughts left out), None when it ended without one.
        final_response: the final response event, or None.
        events: every event of the run (the user message first), as this call produced
            them (a replay produces them again, with new ids).
        session: the in-memory session the run ran in.
    """

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
    model = JournaledLlm(
        model=agent.canonical_model.model,
        wrapped=agent.canonical_model,
        journal=journal,
        order=order,
    )
    update: dict[str, Any] = {"model": model, "tools": tools}
    # The agent's own callbacks may answer a tool call (it never reaches the journal) or
    # put another response in the model's place: the order must follow what ADK runs.
    if agent.before_tool_callback is not None:
        update["before_tool_callback"] = [
            _watching_tool(cb, order) for cb in agent.canonical_before_tool_callbacks
        ]
    if agent.before_model_callback is not None:
        update["before_model_callback"] = [
            _watching_model(cb, order, "llm_request")
            for cb in agent.canonical_before_model_callbacks
        ]
    if agent.after_model_callback is not None:
        update["after_model_callback"] = [
            _watching_model(cb, order, "llm_response")
            for cb in agent.canonical_after_model_callbacks
        ]
    return agent.clone(update=update)


def _watching_tool(cb: Callable[..., Any], order: ToolCallOrder) -> Callable[..., Any]:
    """``cb`` (a before-tool callback), releasing the slot of a journaled call it answers:
    that tool never runs, and the calls after it must not wait for it."""

    async def before_tool(tool: BaseTool, args: dict[str, Any], tool_context: Any) -> Any:
        got = _invoke_callback(cb, tool=tool, args=args, tool_context=tool_context)
        if inspect.isawaitable(got):
            got = await got
        if got is not None and isinstance(tool, JournaledTool):
            order.release(order.claim(tool.name, args))
        return got

    return before_tool


def _watching_model(cb: Callable[..., Any], order: ToolCallOrder, arg: str) -> Callable[..., Any]:
    """``cb`` (a before- or after-model callback): a response it returns in the model's
    place is the batch of calls ADK runs next."""

    async def model_callback(callback_context: Any, value: Any) -> Any:
        got = _invoke_callback(cb, callback_context=callback_context, **{arg: value})
        if inspect.isawaitable(got):
            got = await got
        if isinstance(got, LlmResponse):
            order.expect([got])
        return got

    # ADK passes the value by its name (llm_request / llm_response).
    if arg == "llm_request":

        async def before_model(callback_context: Any, llm_request: Any) -> Any:
            return await model_callback(callback_context, llm_request)

        return before_model

    async def after_model(callback_context: Any, llm_response: Any) -> Any:
        return await model_callback(callback_context, llm_response)

    return after_model


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
    """Run ``agent`` on ``new_message`` as the durable run ``run_id``; the same call after
    a crash resumes it. Returns a :class:`DurableRun` (``final_output``: the final
    response's text).

    The run works in an in-memory ADK session (``session_id``, default ``run_id``) that
    each call rebuilds by replay. With ``session_service`` the session starts as a copy of
    that service's session (created when missing) as it was when the run began (its
    event count is the journal's first step, :data:`SESSION_BASE`), and the run's events
    are appended to it once, when the run completes (the last step,
    :data:`SESSION_APPEND`): a cut-off attempt leaves nothing half-written there.

    Args:
        agent: the agent (cloned: its model and function tools wrapped for the run).
        new_message: the user's message (text or a ``types.Content``).
        store: the event store holding the run's journal.
        run_id: the run's stable id (its stream; the idempotency-key prefix).
        session_service: the service whose session the run continues and writes to.
        app_name: the ADK app name of the session.
        user_id: the ADK user of the session.
        session_id: the session id (default ``run_id``).
        idempotent: names of tools safe to call again with the same key when in doubt.
        reconcile: ``reconcile(tool_name, key) -> (landed, result)`` asks the downstream
            system whether an in-doubt call landed.
        code_revision: recorded by the journal; a resume under another revision is
            refused (the journal's version gate).
        run_config: ADK's ``RunConfig`` for the runner.

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
    outer: Session | None = None
    if session_service is not None:
        outer = await _seed(journal, session_service, local, app_name, user_id, sid)
    else:
        await local.create_session(app_name=app_name, user_id=user_id, session_id=sid)
    base = len(await _events(local, app_name, user_id, sid))
    message = (
        new_message
        if isinstance(new_message, types.Content)
        else types.Content(role="user", parts=[types.Part(text=new_message)])
    )
    runner = Runner(agent=durable, app_name=app_name, session_service=local)
    final: Event | None = None
    try:
        async for event in runner.run_async(
            user_id=user_id, session_id=sid, new_message=message, run_config=run_config
        ):
            # The last final response, whichever agent gave it (a transfer hands the
            # answer to a sub-agent).
            if event.is_final_response() and not event.partial:
                final = event
    except Exception as exc:
        # ADK re-raises what a tool raised, perhaps wrapped: hand the journal's own
        # verdict (in doubt, diverged, not runnable) to the caller as itself.
        cause = journal_error_in(exc)
        if cause is not None and cause is not exc:
            raise cause from exc
        raise
    session = await local.get_session(app_name=app_name, user_id=user_id, session_id=sid)
    assert session is not None  # created above, in this call's own in-memory service
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


async def _events(
    service: InMemorySessionService, app_name: str, user_id: str, sid: str
) -> list[Event]:
    session = await service.get_session(app_name=app_name, user_id=user_id, session_id=sid)
    return list(session.events) if session is not None else []


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
