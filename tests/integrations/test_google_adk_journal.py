"""Durable Google ADK runs through the run journal, in process: a second run replays (no
model call paid, no tool run), a response's parallel function calls are numbered in the
order the model emitted them, a run cut off inside a tool stops in doubt and is then
reconciled, an idempotent tool is retried with its key, another prompt under the same run
is a divergence, and a caller's session gets the run's events once (the SIGKILL version,
in child processes: test_framework_kills.py)."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.tools.function_tool import FunctionTool
from google.genai import types

import ares_events as ae
from ares_events.agents.journal import InDoubtToolCall, Journal, ReplayDivergence
from ares_events.errors import ConfigError
from ares_events.integrations.google_adk import AresSessionService
from ares_events.integrations.google_adk_journal import (
    SESSION_APPEND,
    SESSION_BASE,
    idempotency_key,
    run_durably,
    stable_request,
)
from tests.integrations.fw_helpers import FW_BACKENDS, Killed, dies, fw_url


def calls(*items: str) -> list[types.Part]:
    return [
        types.Part(function_call=types.FunctionCall(name="ship", args={"item": i})) for i in items
    ]


class ShopLlm(BaseLlm):
    """First request: ship ``items`` (one response, parallel calls); then a text."""

    model: str = "shop"
    items: list[str] = ["book", "lamp"]  # noqa: RUF012 - a pydantic field (copied per instance)
    paid: int = 0

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.paid += 1
        if len(llm_request.contents) == 1:
            parts = calls(*self.items)
        else:
            parts = [types.Part(text="shipped both")]
        yield LlmResponse(content=types.Content(role="model", parts=parts))


class Shop:
    def __init__(self, die_on_first: bool = False, items: tuple[str, ...] = ("book", "lamp")):
        self.model = ShopLlm(items=list(items))
        self.shipped: list[tuple[str, str | None]] = []
        self.die_on_first = die_on_first
        # The first call sleeps longest: ADK starts them together, the lamp's would win.
        self.delays = {item: 0.03 * (len(items) - i) for i, item in enumerate(items)}

    @property
    def paid(self) -> int:
        return self.model.paid

    def agent(self, **kw: Any) -> LlmAgent:
        async def ship(item: str) -> str:
            """Ship an item."""
            await asyncio.sleep(self.delays[item])
            self.shipped.append((item, idempotency_key()))
            if self.die_on_first and len(self.shipped) == 1:
                raise Killed
            return f"shipped {item}"

        self.model = ShopLlm(items=list(self.model.items))
        return LlmAgent(name="shop", model=self.model, tools=[ship], **kw)


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def tool_args(store: Any, run_id: str) -> list[Any]:
    return [e.payload["args"] for e in store.read(run_id) if e.type == "tool.call.requested"]


def test_a_second_run_replays_from_the_journal(url: str) -> None:
    """A second run with the same run id pays no model call and runs no tool."""
    shop = Shop()
    with ae.open_store(url) as store:
        r = asyncio.run(run_durably(shop.agent(), "ship", store=store, run_id="g-1"))
        assert r.final_output == "shipped both" and shop.paid == 2
        assert shop.shipped == [("book", "g-1:2"), ("lamp", "g-1:3")]
        r = asyncio.run(run_durably(shop.agent(), "ship", store=store, run_id="g-1"))
        assert r.final_output == "shipped both" and shop.paid == 0 and len(shop.shipped) == 2
        assert r.final_response is not None and r.events[0].author == "user"
        info = Journal.inspect(store, "g-1")
        assert [s.kind for s in info.steps] == ["model", "tool", "tool", "model"]
        assert info.status == "completed"
        assert ae.integrity.verify_stream(store, "g-1").ok


def test_parallel_function_calls_are_numbered_in_emitted_order() -> None:
    """Three calls of one response, the first slowest to reach its tool: steps follow
    the model's order, and a replay numbers them the same way."""
    shop = Shop(items=("book", "lamp", "desk"))

    async def slow_check(tool: Any, args: dict[str, Any], tool_context: Any) -> None:
        # An awaiting callback before the tool (a permission check): the later calls
        # reach the tool first.
        await asyncio.sleep(shop.delays[args["item"]])

    with ae.open_store("memory://") as store:
        agent = shop.agent(before_tool_callback=slow_check)
        asyncio.run(run_durably(agent, "ship", store=store, run_id="g-o"))
        assert shop.shipped == [("book", "g-o:2"), ("lamp", "g-o:3"), ("desk", "g-o:4")]
        assert tool_args(store, "g-o") == [{"item": i} for i in ("book", "lamp", "desk")]
        agent = shop.agent(before_tool_callback=slow_check)
        r = asyncio.run(run_durably(agent, "ship", store=store, run_id="g-o"))
        assert r.final_output == "shipped both" and len(shop.shipped) == 3


def test_a_run_cut_off_in_a_tool_stops_then_reconciles(url: str) -> None:
    """A call cut off inside the tool is in doubt: the run stops, then a reconciler that
    says it landed answers it; the other call runs once, under its own key."""
    shop = Shop(die_on_first=True)
    with ae.open_store(url) as store:
        dies(run_durably(shop.agent(), "ship", store=store, run_id="g-2"))
        shop.die_on_first = False
        with pytest.raises(InDoubtToolCall) as info:
            asyncio.run(run_durably(shop.agent(), "ship", store=store, run_id="g-2"))
        assert info.value.key == "g-2:2" and len(shop.shipped) == 1
        Journal(store, "g-2").resume(by="operator")

        def landed(name: str, key: str) -> tuple[bool, Any]:
            return (key == "g-2:2"), "shipped book"

        r = asyncio.run(
            run_durably(shop.agent(), "ship", store=store, run_id="g-2", reconcile=landed)
        )
        assert r.final_output == "shipped both"
        assert shop.shipped == [("book", "g-2:2"), ("lamp", "g-2:3")]
        assert shop.paid == 1  # the second model call only; the first is in the log


def test_an_idempotent_tool_is_retried_with_its_key() -> None:
    """A tool named idempotent is called again with the same key when in doubt."""
    shop = Shop(die_on_first=True)
    with ae.open_store("memory://") as store:
        dies(run_durably(shop.agent(), "ship", store=store, run_id="g-3"))
        shop.die_on_first = False
        r = asyncio.run(
            run_durably(shop.agent(), "ship", store=store, run_id="g-3", idempotent={"ship"})
        )
        assert r.final_output == "shipped both"
        assert shop.shipped == [("book", "g-3:2"), ("book", "g-3:2"), ("lamp", "g-3:3")]


def test_another_prompt_under_the_same_run_id_is_a_divergence() -> None:
    """The model sees another message than the log recorded: ReplayDivergence."""
    with ae.open_store("memory://") as store:
        asyncio.run(run_durably(Shop().agent(), "ship", store=store, run_id="g-4"))
        with pytest.raises(ReplayDivergence):
            asyncio.run(run_durably(Shop().agent(), "refund", store=store, run_id="g-4"))


def test_the_request_identity_leaves_out_adk_generated_ids() -> None:
    """ADK's ``adk-`` call ids (new on every run) are not part of a request's identity;
    a model's own ids are."""

    def request(call_id: str) -> LlmRequest:
        fc = types.FunctionCall(name="ship", args={"item": "book"}, id=call_id)
        fr = types.FunctionResponse(name="ship", response={"result": "ok"}, id=call_id)
        return LlmRequest(
            contents=[
                types.Content(role="model", parts=[types.Part(function_call=fc)]),
                types.Content(role="user", parts=[types.Part(function_response=fr)]),
            ],
            config=types.GenerateContentConfig(system_instruction="be brief"),
        )

    assert stable_request(request("adk-1")) == stable_request(request("adk-2"))
    assert stable_request(request("call_1")) != stable_request(request("call_2"))
    assert stable_request(request("adk-1"))["system"] == "be brief"


def test_a_callback_that_answers_a_call_does_not_stall_the_next() -> None:
    """A before_tool_callback answering the first call (the tool never runs) releases
    its place: the second call runs, under step 2."""
    shop = Shop()

    def skip_book(tool: Any, args: dict[str, Any], tool_context: Any) -> Any:
        return {"result": "book skipped"} if args.get("item") == "book" else None

    with ae.open_store("memory://") as store:
        agent = shop.agent(before_tool_callback=skip_book)
        r = asyncio.run(asyncio.wait_for(run_durably(agent, "ship", store=store, run_id="g-5"), 10))
        assert r.final_output == "shipped both"
        assert shop.shipped == [("lamp", "g-5:2")]


def test_an_after_model_callback_that_changes_the_calls_sets_the_order() -> None:
    """A response an after_model_callback puts in the model's place (the calls reversed,
    one dropped) is the batch that is numbered: no call waits for a dropped one."""
    shop = Shop(items=("book", "lamp", "desk"))

    def rewrite(callback_context: Any, llm_response: LlmResponse) -> LlmResponse | None:
        content = llm_response.content
        if content is None or not any(p.function_call for p in content.parts or []):
            return None
        return LlmResponse(content=types.Content(role="model", parts=calls("desk", "lamp")))

    with ae.open_store("memory://") as store:
        agent = shop.agent(after_model_callback=rewrite)
        r = asyncio.run(asyncio.wait_for(run_durably(agent, "ship", store=store, run_id="g-8"), 10))
        assert r.final_output == "shipped both"
        assert shop.shipped == [("desk", "g-8:2"), ("lamp", "g-8:3")]


class SignedLlm(BaseLlm):
    """One answer with a thought signature (bytes) and token usage."""

    model: str = "signed"
    paid: int = 0

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.paid += 1
        part = types.Part(text="signed", thought_signature=b"\x00sig\xff")
        yield LlmResponse(
            content=types.Content(role="model", parts=[part]),
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=7, candidates_token_count=3, total_token_count=10
            ),
        )


def test_a_replayed_response_is_the_recorded_one() -> None:
    """Bytes and usage survive the log: the replayed answer equals the paid one, and the
    journal counts the call's tokens."""
    with ae.open_store("memory://") as store:
        first, second = SignedLlm(), SignedLlm()
        a = asyncio.run(
            run_durably(LlmAgent(name="s", model=first), "hi", store=store, run_id="g-9")
        )
        b = asyncio.run(
            run_durably(LlmAgent(name="s", model=second), "hi", store=store, run_id="g-9")
        )
        assert (first.paid, second.paid) == (1, 0)
        assert a.final_response is not None and b.final_response is not None
        assert a.final_response.content == b.final_response.content
        assert b.final_response.usage_metadata == a.final_response.usage_metadata
        assert Journal.inspect(store, "g-9").steps[0].tokens == 10


def test_only_an_llm_agent_runs_durably() -> None:
    """A workflow agent is refused (its sub-agents' models would run unjournaled)."""
    from google.adk.agents import SequentialAgent

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # ADK: "use Workflow"
        agent = SequentialAgent(name="seq", sub_agents=[LlmAgent(name="a", model=ShopLlm())])
    with ae.open_store("memory://") as store, pytest.raises(ConfigError):
        asyncio.run(run_durably(agent, "hi", store=store, run_id="g-10"))  # type: ignore[arg-type]


def test_a_tool_that_asks_for_confirmation_is_refused() -> None:
    """A confirmation pause is not the journal's to own: ConfigError before anything runs."""

    def pay(amount: int) -> str:
        """Pay."""
        return "paid"

    agent = LlmAgent(
        name="a", model=ShopLlm(), tools=[FunctionTool(pay, require_confirmation=True)]
    )
    with ae.open_store("memory://") as store, pytest.raises(ConfigError):
        asyncio.run(run_durably(agent, "pay", store=store, run_id="g-6"))


def test_a_callers_session_gets_the_runs_events_once(url: str) -> None:
    """With a session service, a cut-off run writes nothing to its session; the resumed
    run appends its events once, and a replay of the completed run appends nothing."""
    shop = Shop(die_on_first=True)

    async def session_events(service: AresSessionService) -> list[Any]:
        s = await service.get_session(app_name="shop", user_id="ana", session_id="s-1")
        assert s is not None
        return s.events

    async def go(service: AresSessionService, **kw: Any) -> Any:
        return await run_durably(
            shop.agent(),
            "ship",
            store=store,
            run_id="g-7",
            session_service=service,
            app_name="shop",
            user_id="ana",
            session_id="s-1",
            idempotent={"ship"},
            **kw,
        )

    with ae.open_store(url) as store:
        service = AresSessionService(store=store)
        dies(go(service))
        assert asyncio.run(session_events(service)) == []
        shop.die_on_first = False
        r = asyncio.run(go(service))
        events = asyncio.run(session_events(service))
        assert len(events) == len(r.events) == 4  # user, calls, responses, answer
        assert events[-1].content is not None and events[-1].content.parts is not None
        assert events[-1].content.parts[0].text == "shipped both"
        again = asyncio.run(go(service))
        assert again.final_output == "shipped both"
        assert len(asyncio.run(session_events(service))) == 4
        names = [s.name for s in Journal.inspect(store, "g-7").steps if s.kind == "tool"]
        assert names == [SESSION_BASE, "ship", "ship", SESSION_APPEND]
