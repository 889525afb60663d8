"""A durable Pydantic AI run that kills itself (SIGKILL) at a chosen point, for
tests/integrations/test_framework_kills.py. Every model call it pays and every side
effect of its tool is written to a ledger file (one line each, appended and flushed before
going on), so the parent can count them across the kill and the resume.

Usage: python -m tests.framework_kill_child URL RUN_ID LEDGER KILL_AT
KILL_AT: none | model1-paid | tool1-before | tool1-after | model2-before | tool2-after
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any


def main(url: str, run_id: str, ledger: Path, kill_at: str) -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    import ares_events as ae
    from ares_events.integrations.pydantic_ai import idempotency_key, run_durably

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

    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        n = len(messages)
        if n == 3:
            die("model2-before")
        note(f"paid {n}")
        if n == 1:
            return ModelResponse(
                parts=[
                    ToolCallPart("ship", {"item": "book"}, tool_call_id="t1"),
                    ToolCallPart("ship", {"item": "lamp"}, tool_call_id="t2"),
                ]
            )
        return ModelResponse(parts=[TextPart("shipped both")])

    agent = Agent(FunctionModel(reply))

    if kill_at == "model1-paid":
        # Die after the first answer is recorded, before the first tool call is requested.
        from ares_events.agents.journal import AsyncJournal

        original = AsyncJournal.tool_call

        async def tool_call(self: AsyncJournal, *args: Any, **kwargs: Any) -> Any:
            die("model1-paid")
            return await original(self, *args, **kwargs)

        AsyncJournal.tool_call = tool_call  # type: ignore[method-assign]

    @agent.tool_plain
    def ship(item: str) -> str:
        key = idempotency_key()
        first = item == "book"
        if first:
            die("tool1-before")  # its request is in the log: in doubt, reconciled
        note(f"effect {key} {item}")
        die("tool1-after" if first else "tool2-after")
        return f"shipped {item}"

    def landed(name: str, key: str) -> tuple[bool, Any]:
        """The downstream system's own record: did the shipment with this key happen?"""
        return (key in effects()), f"shipped (reconciled {key})"

    async def go() -> None:
        store = await ae.open_async_store(url)
        try:
            result = await run_durably(
                agent, "ship my order", store=store, run_id=run_id, reconcile=landed
            )
            note(f"output {result.output}")
        finally:
            await store.close()

    asyncio.run(go())


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4])
