"""A durable run (Pydantic AI, the OpenAI Agents SDK or Google ADK) that kills itself (SIGKILL) at a
chosen point, for tests/integrations/test_framework_kills.py. Every model call it pays
and every side effect of its tool is written to a ledger file (one line each, appended
and flushed before going on), so the parent can count them across the kill and the
resume.

Usage: python -m tests.children.framework_kill_child ADAPTER URL RUN_ID LEDGER KILL_AT
KILL_AT: none | model1-paid | tool1-before | tool1-after | model2-before | tool2-after
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any


def main(adapter: str, url: str, run_id: str, ledger: Path, kill_at: str) -> None:
    import ares_events as ae

    def note(line: str) -> None:
        with ledger.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())

    def die(point: str) -> None:
        if kill_at == point:
            os.kill(os.getpid(), signal.SIGKILL)

    def effects() -> list[str]:
        if not ledger.exists():
            return []
        return [ln.split()[1] for ln in ledger.read_text().splitlines() if ln.startswith("effect")]

    def plan(first: bool) -> None:
        """The model's side: die before paying the second call, else pay (a ledger line)."""
        if not first:
            die("model2-before")
        note(f"paid {1 if first else 3}")

    def ship_item(item: str, key: str | None) -> str:
        first = item == "book"
        if first:
            die("tool1-before")  # its request is in the log: in doubt, reconciled
        note(f"effect {key} {item}")
        die("tool1-after" if first else "tool2-after")
        return f"shipped {item}"

    agent: Any
    run_durably: Callable[..., Coroutine[Any, Any, Any]]
    if adapter == "pydantic-ai":
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
        from pydantic_ai.models.function import AgentInfo, FunctionModel

        from ares_events.integrations.pydantic_ai import idempotency_key, run_durably

        def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            plan(len(messages) == 1)
            if len(messages) == 1:
                return ModelResponse(
                    parts=[
                        ToolCallPart("ship", {"item": "book"}, tool_call_id="t1"),
                        ToolCallPart("ship", {"item": "lamp"}, tool_call_id="t2"),
                    ]
                )
            return ModelResponse(parts=[TextPart("shipped both")])

        pai_agent = Agent(FunctionModel(reply))

        @pai_agent.tool_plain
        def ship(item: str) -> str:
            return ship_item(item, idempotency_key())

        agent = pai_agent
        output = "output"
    elif adapter == "google-adk":
        from google.adk.agents import LlmAgent
        from google.adk.models.base_llm import BaseLlm
        from google.adk.models.llm_response import LlmResponse
        from google.genai import types

        from ares_events.integrations.google_adk_journal import idempotency_key as adk_key
        from ares_events.integrations.google_adk_journal import run_durably

        class ScriptedLlm(BaseLlm):
            model: str = "scripted"

            async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
                first = len(llm_request.contents) == 1
                plan(first)
                if first:
                    parts = [
                        types.Part(function_call=types.FunctionCall(name="ship", args={"item": i}))
                        for i in ("book", "lamp")
                    ]
                else:
                    parts = [types.Part(text="shipped both")]
                yield LlmResponse(content=types.Content(role="model", parts=parts))

        async def ship(item: str) -> str:
            """Ship an item."""
            return ship_item(item, adk_key())

        agent = LlmAgent(name="shop", model=ScriptedLlm(), tools=[ship])
        output = "final_output"
    else:
        from agents import Agent as OAgent
        from agents import function_tool, set_tracing_disabled
        from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

        from ares_events.integrations.openai_agents_journal import idempotency_key as oai_key
        from ares_events.integrations.openai_agents_journal import run_durably

        set_tracing_disabled(True)

        def respond(call: Any) -> Any:
            first = isinstance(call.input, str) or len(call.input) == 1
            plan(first)
            if first:
                return [
                    function_call("ship", {"item": "book"}, call_id="t1"),
                    function_call("ship", {"item": "lamp"}, call_id="t2"),
                ]
            return [assistant_message("shipped both")]

        @function_tool
        def ship_tool(item: str) -> str:
            return ship_item(item, oai_key())

        ship_tool = dataclasses.replace(ship_tool, name="ship")
        model = ScriptedModel([ModelStep.respond(respond) for _ in range(4)])
        agent = OAgent(name="shop", model=model, tools=[ship_tool])
        output = "final_output"

    if kill_at == "model1-paid":
        # Die after the first answer is recorded, before the first tool call is requested.
        from ares_events.agents.journal import AsyncJournal

        original = AsyncJournal.tool_call

        async def tool_call(self: AsyncJournal, *args: Any, **kwargs: Any) -> Any:
            die("model1-paid")
            return await original(self, *args, **kwargs)

        AsyncJournal.tool_call = tool_call  # type: ignore[method-assign]

    def landed(name: str, key: str) -> tuple[bool, Any]:
        """The downstream system's own record: did the shipment with this key happen?"""
        return (key in effects()), f"shipped (reconciled {key})"

    async def go() -> None:
        store = await ae.open_async_store(url)
        try:
            result = await run_durably(
                agent, "ship my order", store=store, run_id=run_id, reconcile=landed
            )
            note(f"output {getattr(result, output)}")
        finally:
            await store.close()

    asyncio.run(go())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5])
