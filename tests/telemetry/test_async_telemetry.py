"""The asyncio face emits the same spans as the blocking one (the code is generated
from one source): store operations, replay, and a journaled run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import ares_events as ae
from ares_events.agents.journal import AsyncJournal, ModelReply
from tests.telemetry.otel_helpers import Otel, attrs, parent_id


def test_async_store_and_journal_spans(otel: Otel, real_url: str) -> None:
    """append / read / replay spans nest under the caller's span on the asyncio face,
    and an AsyncJournal run is invoke_agent > chat, execute_tool."""

    async def main() -> None:
        store = await ae.open_async_store(real_url)
        try:
            with otel.tracer.start_as_current_span("caller"):
                await store.append("s", [ae.NewEvent(type="a.b", module="t", payload={"i": 1})])
                assert [e.version async for e in store.read("s")] == [1]
                res = await ae.areplay(store, "s", lambda n, e: n + 1, 0)
                assert res.state == 1

            async def model(messages: Any, params: Any) -> ModelReply:
                return ModelReply("ok", {})

            async def tool(args: Any, key: str) -> int:
                return 7

            j = await AsyncJournal.open(store, "run-async")
            async with j:
                await j.model_call(["hi"], {"model": "m"}, call=model)
                await j.tool_call("t", {}, call=tool)
                await j.complete()
        finally:
            await store.close()

    asyncio.run(main())
    caller = otel.span("caller")
    for name in ("append ares_events", "ares_events.replay"):
        assert any(
            s.parent is not None and s.parent.span_id == caller.context.span_id
            for s in otel.spans(name)
        ), name
    run = otel.span("invoke_agent")
    assert parent_id(otel.span("chat m")) == run.context.span_id
    assert parent_id(otel.span("execute_tool t")) == run.context.span_id
    assert attrs(run)["ares_events.journal.status"] == "completed"


def test_a_projection_runner_reports_its_lag(otel: Otel, tmp_path: Path) -> None:
    """The runner sets the lag gauge per projection (by name, never by stream)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        for i in range(5):
            store.append(f"s-{i}", [ae.NewEvent(type="a.b", module="t", payload={})])
        from ares_events.projections.runner import ProjectionRunner
        from tests.projections.test_runner import Counter

        runner = ProjectionRunner(store, [Counter()], batch_size=2)
        runner.run_once()
        first = {
            p.attributes["ares_events.projection.name"]: p.value
            for p in otel.metrics()["ares_events.projection.lag"]
        }
        runner.run_until_idle()
        last = {
            p.attributes["ares_events.projection.name"]: p.value
            for p in otel.metrics()["ares_events.projection.lag"]
        }
    name = Counter().name
    assert first[name] == 3
    assert last[name] == 0
