"""Durable OpenAI Agents SDK runs: model calls and function tools go through the run
journal, so a run started again replays what was answered and done::

    result = await run_durably(agent, "Refund order 42", store=store, run_id="refund-42")

docs/guide-openai-agents.md says the rest (approvals, what is not journaled).

It may import anything in the package, and ``agents``.
"""

from __future__ import annotations

import dataclasses
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
from ares_events.core.iterators_async import maybe_await
from ares_events.errors import ConfigError
from ares_events.integrations._journaled import idempotency_key, journal_errors, tool_call

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from agents import Agent

    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore
    from ares_events.integrity.notes import VerifierKey

__all__ = ["JournaledModel", "idempotency_key", "journaled_tool", "run_durably"]

_USAGE = ("requests", "input_tokens", "output_tokens", "total_tokens")
_OUTPUT: TypeAdapter[list[ResponseOutputItem]] = TypeAdapter(list[ResponseOutputItem])


class JournaledModel(Model):
    """A ``Model`` whose responses go through the run journal (see the module docstring)."""

    def __init__(self, wrapped: Model, journal: AsyncJournal) -> None:
        self.wrapped = wrapped
        self.journal = journal

    async def get_response(
        self, system_instructions: str | None, input: Any, *args: Any, **kwargs: Any
    ) -> ModelResponse:
        # The identity of a call is what the model sees; the rest is passed through.
        request = {"system": system_instructions, "input": to_jsonable_python(input)}

        async def call(_messages: Any, _params: Any) -> ModelReply:
            resp = await self.wrapped.get_response(system_instructions, input, *args, **kwargs)
            usage = {k: getattr(resp.usage, k) for k in _USAGE}
            output = [o.model_dump(mode="json") for o in resp.output]
            completion = {"output": output, "usage": usage, "response_id": resp.response_id}
            return ModelReply(completion, usage)

        got = await self.journal.model_call(request, {}, call=call)
        usage = got.get("usage") or {}
        counts: dict[str, Any] = {k: int(usage.get(k, int(k == "requests"))) for k in _USAGE}
        return ModelResponse(
            output=list(_OUTPUT.validate_python(got["output"])),
            usage=Usage(**counts),
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
        return await tool_call(
            journal,
            name,
            {"input": raw_input},
            lambda: invoke(ctx, raw_input),
            idempotent=idempotent,
            reconcile=reconcile,
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
    return bool(await maybe_await(policy(ctx, params, getattr(ctx, "tool_call_id", ""))))


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
    approvers: Sequence[VerifierKey | str] = (),
    **run_kwargs: Any,
) -> Any:
    """Run ``agent`` on ``input`` as the durable run ``run_id``; the same call after a
    crash, or after an approval, resumes it. Returns the SDK's ``RunResult``.
    ``approvers``: the verifier keys whose signed approvals let a ``needs_approval`` tool
    run. ``run_kwargs`` go to ``Runner.run`` (``session=``, ``context=``, ``max_turns=``...).

    Raises:
        ConfigError: the agent's model is not a ``Model`` instance, or the SDK paused for
            an approval this run does not journal (a tool of an agent handed off to).
        ApprovalRequired: a tool call needs a signed approval; the run is paused for it.
        ApprovalRefused: the approval presented is not valid now (a subclass says why).
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
    with journal_errors():  # the SDK wraps what a tool raised ("Error running tool ...")
        result = await Runner.run(durable, input, run_config=config, **run_kwargs)
    if result.interruptions:
        raise ConfigError(
            f"run {run_id!r}: the SDK paused for approvals run_durably does not journal "
            "(tools of an agent handed off to): wrap them with journaled_tool"
        )
    await journal.complete(to_jsonable_python(result.final_output))
    return result
