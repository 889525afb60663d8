"""Durable OpenAI Agents SDK runs through the run journal, in process: a second run
replays (no model call paid, no tool run), a run cut off inside a tool stops in doubt
and is then reconciled, a tool named idempotent is retried with its key (the SIGKILL
version, in child processes: test_framework_kills.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import ares_events as ae
from ares_events.agents.journal import InDoubtToolCall, Journal
from ares_events.errors import ConfigError
from ares_events.integrations.openai_agents_journal import idempotency_key, run_durably
from tests.integrations.fw_helpers import FW_BACKENDS, Killed, dies, fw_url

set_tracing_disabled(True)


class Shop:
    def __init__(self, die_on_first: bool = False) -> None:
        self.paid = 0
        self.shipped: list[tuple[str, str | None]] = []
        self.die_on_first = die_on_first

    def agent(self) -> Agent[Any]:
        def respond(call: Any) -> Any:
            self.paid += 1
            if isinstance(call.input, str) or len(call.input) == 1:
                return [
                    function_call("ship", {"item": "book"}, call_id="t1"),
                    function_call("ship", {"item": "lamp"}, call_id="t2"),
                ]
            return [assistant_message("shipped both")]

        @function_tool
        def ship(item: str) -> str:
            self.shipped.append((item, idempotency_key()))
            if self.die_on_first and len(self.shipped) == 1:
                raise Killed
            return f"shipped {item}"

        model = ScriptedModel([ModelStep.respond(respond) for _ in range(4)])
        return Agent(name="shop", model=model, tools=[dataclasses.replace(ship)])


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def test_a_second_run_replays_from_the_journal(url: str) -> None:
    shop = Shop()
    with ae.open_store(url) as store:
        r = asyncio.run(run_durably(shop.agent(), "ship", store=store, run_id="o-1"))
        assert r.final_output == "shipped both" and shop.paid == 2
        assert shop.shipped == [("book", "o-1:2"), ("lamp", "o-1:3")]
        r = asyncio.run(run_durably(shop.agent(), "ship", store=store, run_id="o-1"))
        assert r.final_output == "shipped both" and shop.paid == 2 and len(shop.shipped) == 2
        info = Journal.inspect(store, "o-1")
        assert [s.kind for s in info.steps] == ["model", "tool", "tool", "model"]
        assert info.status == "completed"


def test_a_run_cut_off_in_a_tool_stops_then_reconciles(url: str) -> None:
    shop = Shop(die_on_first=True)
    with ae.open_store(url) as store:
        dies(run_durably(shop.agent(), "ship", store=store, run_id="o-2"))
        shop.die_on_first = False
        with pytest.raises(InDoubtToolCall) as info:
            asyncio.run(run_durably(shop.agent(), "ship", store=store, run_id="o-2"))
        assert info.value.key == "o-2:2" and len(shop.shipped) == 1
        Journal(store, "o-2").resume(by="operator")

        def landed(name: str, key: str) -> tuple[bool, Any]:
            return (key == "o-2:2"), "shipped book"

        r = asyncio.run(
            run_durably(shop.agent(), "ship", store=store, run_id="o-2", reconcile=landed)
        )
        assert r.final_output == "shipped both"
        assert shop.shipped == [("book", "o-2:2"), ("lamp", "o-2:3")]
        assert shop.paid == 2


def test_an_idempotent_tool_is_retried_with_its_key(url: str) -> None:
    shop = Shop(die_on_first=True)
    with ae.open_store(url) as store:
        dies(run_durably(shop.agent(), "ship", store=store, run_id="o-3"))
        shop.die_on_first = False
        r = asyncio.run(
            run_durably(shop.agent(), "ship", store=store, run_id="o-3", idempotent={"ship"})
        )
        assert r.final_output == "shipped both"
        assert shop.shipped == [("book", "o-3:2"), ("book", "o-3:2"), ("lamp", "o-3:3")]


def test_a_model_given_by_name_is_refused() -> None:
    with ae.open_store("memory://") as store, pytest.raises(ConfigError):
        asyncio.run(run_durably(Agent(name="a", model="gpt-x"), "hi", store=store, run_id="n"))
