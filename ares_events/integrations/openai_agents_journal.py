"""Durable OpenAI Agents SDK runs: the agent's model calls and function tools go through
the run journal (:class:`~ares_events.agents.journal.AsyncJournal`, the stream
``run_id``), so a run killed at any point and started again with the same ``run_id``
replays what was answered and done, and goes on live from the first step that was not::

    from ares_events.integrations.openai_agents_journal import run_durably

    result = await run_durably(agent, "Refund order 42", store=store, run_id="refund-42")

- :class:`JournaledModel` wraps the agent's ``Model``: a model call answered before the
  kill is returned from the log, not paid again. The request is compared as the system
  instructions and the input items (what the model sees).
- :func:`journaled_tool` wraps a ``FunctionTool``: a call that returned is answered from
  the log, never run again; one cut off inside the tool is *in doubt* (reconciled, retried
  with the same key when named in ``idempotent=``, else the run stops with
  :class:`~ares_events.agents.journal.InDoubtToolCall`). A tool gets its idempotency key
  from :func:`~ares_events.integrations.pydantic_ai.idempotency_key`'s twin here,
  :func:`idempotency_key`.
- A tool's ``needs_approval`` (a bool, or the SDK's policy ``(ctx, params, call_id)``)
  goes to the journal, not to ``RunState.approve()``: a call that needs approval pauses the
  run (:class:`~ares_events.agents.journal.ApprovalRequired`) and runs, once, only under an
  approver's signed approval that the journal checks against ``approvers=``
  (``ares-events runs resume RUN --key FILE``, the console, or
  :func:`~ares_events.agents.runs.resume_run`); then ``run_durably`` again goes on. A
  forged, expired, replayed, reused or wrong-call approval raises its
  :class:`~ares_events.errors.ApprovalRefused` and nothing runs. No client-held
  ``RunState`` carries the approval, so none can be altered.
- :func:`run_durably` clones the agent with both wrappers and runs it with
  ``max_function_tool_concurrency=1``: the SDK then runs a response's tool calls one at a
  time, in the order the model emitted them, so a replay numbers the journal's steps the
  same way. Streaming is not journaled (``run_durably`` uses ``Runner.run``), nor are the
  models and tools of agents handed off to (wrap them with the same pieces).

A tool's output is recorded as JSON (``pydantic_core``'s ``to_jsonable_python``) and a
replayed tool returns that JSON form. Combine it with :class:`AresSession` for the
conversation history (a session is one stream, the run journal another).

It may import anything in the package, and ``agents``.
"""

from __future__ import annotations

import contextvars
import dataclasses
import inspect
import json
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.run import Runner
from agents.run_config import RunConfig, ToolExecutionConfig
from agents.tool import FunctionTool
from agents.usage import Usage
from openai.types.responses import ResponseOutputItem
from pydantic import TypeAdapter
from pydantic_core import to_jsonable_python

from ares_events.agents.journal import AsyncJournal, ModelReply
from ares_events.agents.journal_errors import journal_error_in
from ares_events.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from agents import Agent

    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore
    from ares_events.integrity.notes import VerifierKey

__all__ = ["JournaledModel", "idempotency_key", "journaled_tool", "run_durably"]

_OUTPUT: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])
_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar("ares_oai_key", default=None)


def idempotency_key() -> str | None:
    """The idempotency key (``run_id:step``) of the journaled tool call running now, to
    pass downstream; None outside one."""
    return _KEY.get()


class JournaledModel(Model):
    """A ``Model`` whose responses go through the run journal (see the module docstring)."""

    def __init__(self, wrapped: Model, journal: AsyncJournal) -> None:
        self.wrapped = wrapped
        self.journal = journal

    async def get_response(
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
        **kwargs: Any,
    ) -> ModelResponse:
        request = {"system": system_instructions, "input": to_jsonable_python(input)}

        async def call(_messages: Any, _params: Any) -> ModelReply:
            resp = await self.wrapped.get_response(
                system_instructions,
                input,
                model_settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
                **kwargs,
            )
            u = resp.usage
            usage = {
                "requests": u.requests,
                "input_tokens": u.input_tokens,
                "output_tokens": u.output_tokens,
                "total_tokens": u.total_tokens,
            }
            completion = {
                "output": [o.model_dump(mode="json") for o in resp.output],
                "usage": usage,
                "response_id": resp.response_id,
            }
            return ModelReply(completion, usage)

        got = await self.journal.model_call(request, {}, call=call)
        usage = got.get("usage") or {}
        return ModelResponse(
            output=list(_OUTPUT.validate_python(got["output"])),
            usage=Usage(
                requests=int(usage.get("requests", 1)),
                input_tokens=int(usage.get("input_tokens", 0)),
                output_tokens=int(usage.get("output_tokens", 0)),
                total_tokens=int(usage.get("total_tokens", 0)),
            ),
            response_id=got.get("response_id"),
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """Not journaled: a durable run is not streamed (use ``run_durably``)."""
        raise ConfigError("a journaled model does not stream: run it with Runner.run")


def journaled_tool(
    tool: FunctionTool,
    journal: AsyncJournal,
    *,
    idempotent: bool = False,
    reconcile: Callable[[str, str], Any] | None = None,
) -> FunctionTool:
    """``tool`` with its invocations written through ``journal`` (see the module
    docstring). ``reconcile(tool_name, key) -> (landed, result)``. The tool's
    ``needs_approval`` is the journal's gate in the returned tool, not the SDK's."""
    invoke = tool.on_invoke_tool
    name = tool.name
    policy = tool.needs_approval

    async def on_invoke_tool(ctx: Any, raw_input: str) -> Any:
        async def call(_args: Any, key: str) -> Any:
            token = _KEY.set(key)
            try:
                return to_jsonable_python(await invoke(ctx, raw_input))
            finally:
                _KEY.reset(token)

        rec = (lambda key: reconcile(name, key)) if reconcile is not None else None
        return await journal.tool_call(
            name,
            {"input": raw_input},
            call=call,
            reconcile=rec,
            idempotent=idempotent,
            needs_approval=await _needs_approval(policy, ctx, raw_input),
        )

    return dataclasses.replace(tool, on_invoke_tool=on_invoke_tool, needs_approval=False)


async def _needs_approval(policy: Any, ctx: Any, raw_input: str) -> bool:
    """The SDK's ``needs_approval`` for this call: a bool, or its policy called as the SDK
    does; arguments the policy cannot inspect need approval (as in the SDK)."""
    if isinstance(policy, bool):
        return policy
    try:
        params = json.loads(raw_input or "{}")
    except ValueError:
        return True
    if not isinstance(params, dict):
        return True
    got = policy(ctx, params, getattr(ctx, "tool_call_id", ""))
    return bool(await got if inspect.isawaitable(got) else got)


async def run_durably(
    agent: Agent[Any],
    input: Any,
    *,
    store: AsyncEventStore | EventStore,
    run_id: str,
    idempotent: Collection[str] = (),
    reconcile: Callable[[str, str], Any] | None = None,
    code_revision: str = "unversioned",
    run_config: RunConfig | None = None,
    approvers: Sequence[VerifierKey] = (),
    **run_kwargs: Any,
) -> Any:
    """Run ``agent`` on ``input`` as the durable run ``run_id``; the same call after a
    crash, or after an approval, resumes it. Returns the SDK's ``RunResult``.
    ``approvers``: the verifier keys whose signed approvals let a ``needs_approval`` tool
    run. ``run_kwargs`` go to ``Runner.run`` (``session=``, ``context=``, ``max_turns=``...).

    Raises:
        ConfigError: the agent's model is not a ``Model`` instance (a name needs the
            run's provider: resolve it first); the SDK paused for an approval this run
            does not journal (a tool of an agent handed off to).
        ApprovalRequired: a tool call needs a signed approval; the run is paused for it.
        ApprovalRefused: the approval presented is forged, expired, replayed, reused or
            for another call (a subclass says which); the tool did not run.
        InDoubtToolCall: a tool call was cut off, has no reconciler and is not idempotent.
        ReplayDivergence: the run asked for something other than what the log recorded.
        RunRefused: the journal's gate refused to resume (another ``code_revision``).
    """
    if not isinstance(agent.model, Model):
        raise ConfigError("run_durably needs an agent whose model is a Model instance")
    journal = await AsyncJournal.open(
        store, run_id, code_revision=code_revision, approvers=approvers
    )
    tools = [
        journaled_tool(t, journal, idempotent=t.name in idempotent, reconcile=reconcile)
        if isinstance(t, FunctionTool)
        else t
        for t in agent.tools
    ]
    durable = agent.clone(model=JournaledModel(agent.model, journal), tools=tools)
    config = dataclasses.replace(
        run_config or RunConfig(),
        tool_execution=ToolExecutionConfig(max_function_tool_concurrency=1),
    )
    try:
        result = await Runner.run(durable, input, run_config=config, **run_kwargs)
    except Exception as exc:
        # The SDK wraps what a tool raised ("Error running tool ..."): hand the journal's
        # own verdict (in doubt, diverged, not runnable) to the caller as itself.
        cause = journal_error_in(exc)
        if cause is not None and cause is not exc:
            raise cause from exc
        raise
    if result.interruptions:
        raise ConfigError(
            f"run {run_id!r}: the SDK paused for approvals run_durably does not journal "
            "(tools of an agent handed off to): wrap them with journaled_tool"
        )
    await journal.complete(to_jsonable_python(result.final_output))
    return result
