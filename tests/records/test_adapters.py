"""A run of each framework adapter (OpenAI Agents, Pydantic AI, Google ADK, LangGraph)
exports and verifies: the journal's run stream and the adapter's session stream, with
the fake models of the adapter tests (no network). The draft's view maps their messages
and tool calls."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

import ares_events as ae
from ares_events.integrations.langgraph import AresSaver, stream_of
from ares_events.records import export_record, verify_record
from ares_events.records.verify import load_record
from tests.integrations.fw_helpers import FW_BACKENDS, fw_url
from tests.records.helpers import LOG


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def _verify_all(store: Any, prefix: str) -> dict[str, list[str]]:
    """Export and verify every stream (both forms); the entry types of each."""
    out = {}
    for stream, _v in list(store.streams()):
        if not stream.startswith((prefix, "run-")):
            continue
        for form in ("json", "cbor"):
            data = export_record(store, stream, key=LOG, form=form).data
            rep = verify_record(data, [LOG.verifier.text])
            assert rep.ok, (stream, form, rep.findings)
        record = load_record(data).record
        out[stream] = [e["type"] for e in record["session"]["entries"]]
    return out


def _has_tools(types: list[str]) -> bool:
    return "tool-call" in types and "tool-result" in types


def test_openai_agents(url: str) -> None:
    """run_durably with an AresSession: the run and the session verify."""
    from agents import Agent, function_tool, set_tracing_disabled
    from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

    from ares_events.integrations.openai_agents import AresSession
    from ares_events.integrations.openai_agents_journal import run_durably

    set_tracing_disabled(True)

    @function_tool
    def ship(item: str) -> str:
        return f"shipped {item}"

    def respond(call: Any) -> Any:
        if isinstance(call.input, str) or len(call.input) == 1:
            return [function_call("ship", {"item": "book"}, call_id="t1")]
        return [assistant_message("shipped")]

    model = ScriptedModel([ModelStep.respond(respond) for _ in range(3)])
    agent = Agent(name="shop", model=model, tools=[dataclasses.replace(ship)])
    with ae.open_store(url) as store:
        session = AresSession("s-1", store=store)
        asyncio.run(run_durably(agent, "ship", store=store, run_id="run-oai", session=session))
        found = _verify_all(store, "openai-agents/")
    assert _has_tools(found["run-oai"]) and _has_tools(found["openai-agents/s-1"])


def test_pydantic_ai(url: str) -> None:
    """run_durably and the message store: the run and the conversation verify."""
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    from ares_events.integrations.pydantic_ai import AresMessageStore, run_durably

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("ship", {"item": "book"}, tool_call_id="c1")])
        return ModelResponse(parts=[TextPart("shipped")])

    agent = Agent(FunctionModel(reply))

    @agent.tool_plain
    def ship(item: str) -> str:
        return f"shipped {item}"

    with ae.open_store(url) as store:
        r = asyncio.run(run_durably(agent, "ship", store=store, run_id="run-pai"))
        AresMessageStore(store=store).append("c-1", r.new_messages())
        found = _verify_all(store, "pydantic-ai/")
    assert _has_tools(found["run-pai"]) and _has_tools(found["pydantic-ai/c-1"])


def test_google_adk(url: str) -> None:
    """run_durably with the ADK session service: the run and the session verify."""
    from google.adk.agents import LlmAgent
    from google.adk.models.base_llm import BaseLlm
    from google.adk.models.llm_request import LlmRequest
    from google.adk.models.llm_response import LlmResponse
    from google.genai import types

    from ares_events.integrations.google_adk import AresSessionService
    from ares_events.integrations.google_adk_journal import run_durably

    class Llm(BaseLlm):
        model: str = "shop"

        async def generate_content_async(
            self, llm_request: LlmRequest, stream: bool = False
        ) -> AsyncGenerator[LlmResponse, None]:
            if len(llm_request.contents) == 1:
                call = types.FunctionCall(name="ship", args={"item": "book"})
                parts = [types.Part(function_call=call)]
            else:
                parts = [types.Part(text="shipped")]
            yield LlmResponse(content=types.Content(role="model", parts=parts))

    async def ship(item: str) -> str:
        """Ship an item."""
        return f"shipped {item}"

    agent = LlmAgent(name="shop", model=Llm(), tools=[ship])
    with ae.open_store(url) as store:
        service = AresSessionService(store=store)
        asyncio.run(
            run_durably(agent, "ship", store=store, run_id="run-adk", session_service=service)
        )
        found = _verify_all(store, "google-adk/")
    sessions = [s for s in found if s.startswith("google-adk/")]
    assert _has_tools(found["run-adk"]) and sessions
    assert _has_tools(found[sessions[0]])


def test_langgraph(url: str) -> None:
    """A StateGraph with the saver: its thread's stream verifies."""

    def bot(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"reply {len(state['messages'])}")]}

    g = StateGraph(Chat)
    g.add_node("bot", bot)
    g.add_edge(START, "bot")
    with ae.open_store(url) as store:
        graph = g.compile(checkpointer=AresSaver(store=store))
        for i in range(3):
            graph.invoke(
                {"messages": [HumanMessage(f"hi {i}")]}, {"configurable": {"thread_id": "t"}}
            )
        found = _verify_all(store, stream_of("t"))
    assert found[stream_of("t")]
