"""A writer of the framework adapters' race (tests/integrations/test_framework_races.py):
run in a child process, it reads the session/conversation, waits for its rival, writes
two items, and reports what happened, once per round."""

from __future__ import annotations

import asyncio
from typing import Any, cast


def writer(
    adapter: str, url: str, sid: str, rounds: int, name: str, barrier: Any, out: Any
) -> None:
    """Each round: read (pinning the version), wait, write two items at once, wait."""
    results: list[str] = []
    problems: list[str] = []

    def wait() -> None:
        barrier.wait(timeout=120)

    async def main() -> None:
        import ares_events as ae

        store = await ae.open_async_store(url)
        try:
            read, write, conflict = await _adapter(adapter, store, sid)
            for i in range(rounds):
                await asyncio.to_thread(wait)
                await read()
                await asyncio.to_thread(wait)
                try:
                    await write([f"{name}-{i}-a", f"{name}-{i}-b"])
                    results.append("win")
                except conflict:
                    results.append("lose")
                except Exception as exc:  # reported, so the test shows it
                    problems.append(f"round {i}: {type(exc).__name__}: {exc}")
                    results.append("error")
                await asyncio.to_thread(wait)
        finally:
            await store.close()

    asyncio.run(main())
    out.put((name, results, problems))


async def _adapter(adapter: str, store: Any, sid: str) -> Any:
    if adapter == "openai-agents":
        from ares_events.integrations.openai_agents import AresSession, SessionConflict

        s = AresSession(sid, store=store)
        runs: list[_Run] = []

        async def read_oai() -> None:
            # Each round is one run: its read pins the version its write names (direct
            # calls, without a run context, are plain appends and never conflict).
            runs[:] = [_Run()]
            await s.get_items(wrapper=runs[0])

        async def write(texts: list[str]) -> None:
            await s.add_items([{"role": "user", "content": t} for t in texts], wrapper=runs[0])

        return read_oai, write, SessionConflict
    if adapter == "pydantic-ai":
        from pydantic_ai.messages import ModelRequest, UserPromptPart

        from ares_events.integrations.pydantic_ai import (
            AsyncAresMessageStore,
            ConversationConflict,
        )

        h = AsyncAresMessageStore(store=store)

        async def read() -> None:
            await h.load(sid)

        async def write_pai(texts: list[str]) -> None:
            await h.append(sid, [ModelRequest(parts=[UserPromptPart(t)]) for t in texts])

        return read, write_pai, ConversationConflict
    from google.adk.events.event import Event
    from google.adk.sessions.session import Session

    from ares_events.integrations.google_adk import AresSessionService
    from ares_events.integrations.google_adk import SessionConflict as AdkSessionConflict

    svc = AresSessionService(store=store, snapshot_every=0)
    seen: list[Session] = []

    async def read_adk() -> None:
        got = await svc.get_session(app_name="race", user_id="u", session_id=sid)
        assert got is not None
        seen[:] = [got]

    async def write_adk(texts: list[str]) -> None:
        # One ADK event carries both items: an event is ADK's unit of append.
        await svc.append_event(seen[0], Event(invocation_id="|".join(texts), author="user"))

    return read_adk, write_adk, AdkSessionConflict


class _Run:
    """A run context (the SDK passes its RunContextWrapper; any weakly referable object
    will do)."""


def history(adapter: str, url: str, sid: str) -> list[str]:
    """The stored items, in order, as the texts the writers wrote."""

    async def main() -> list[str]:
        import ares_events as ae

        store = await ae.open_async_store(url)
        try:
            if adapter == "openai-agents":
                from ares_events.integrations.openai_agents import AresSession

                items = await AresSession(sid, store=store).get_items()
                return [str(cast(dict[str, Any], i)["content"]) for i in items]
            if adapter == "pydantic-ai":
                from ares_events.integrations.pydantic_ai import AsyncAresMessageStore

                msgs = await AsyncAresMessageStore(store=store).load(sid)
                return [str(m.parts[0].content) for m in msgs]  # type: ignore[union-attr]
            from ares_events.integrations.google_adk import AresSessionService

            got = await AresSessionService(store=store).get_session(
                app_name="race", user_id="u", session_id=sid
            )
            assert got is not None
            return [t for e in got.events for t in e.invocation_id.split("|")]
        finally:
            await store.close()

    return asyncio.run(main())
