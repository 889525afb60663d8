"""Writers sharing one framework session (tests/integrations/test_framework_sharing.py):
each adds its items one at a time to the same session, in a thread of its own with its
own event loop or in a process of its own, and the test checks that every item of every
writer is stored once, in the writer's order.

- OpenAI Agents SDK: a direct ``add_items`` per item (no run context: a plain append).
- Pydantic AI: ``load`` then ``append``, again on ``ConversationConflict``.
- Google ADK: ``get_session`` then ``append_event``, again on ``SessionConflict`` (ADK's
  ``StaleSessionError``): each item is one event, its ``invocation_id`` the item.
"""

from __future__ import annotations

import asyncio
from typing import Any

APP, USER = "share", "u"


async def add_all(adapter: str, session: Any, sid: str, name: str, count: int) -> int:
    """Add ``name-0`` .. ``name-{count-1}`` to session ``sid`` through ``session`` (the
    adapter's object); return how many writes were refused and done again."""
    again = 0
    for i in range(count):
        item = f"{name}-{i}"
        if adapter == "openai-agents":
            await session.add_items([{"role": "user", "content": item}])
            continue
        while True:
            try:
                if adapter == "pydantic-ai":
                    from pydantic_ai.messages import ModelRequest, UserPromptPart

                    await session.load(sid)
                    await session.append(sid, [ModelRequest(parts=[UserPromptPart(item)])])
                else:
                    from google.adk.events.event import Event

                    got = await session.get_session(app_name=APP, user_id=USER, session_id=sid)
                    await session.append_event(got, Event(invocation_id=item, author="user"))
                break
            except Exception as exc:  # a conflict: read again and write again
                if not _is_conflict(exc):
                    raise
                again += 1
    return again


def _is_conflict(exc: Exception) -> bool:
    from ares_events.errors import ConcurrencyError

    return isinstance(exc, ConcurrencyError)


def open_session(adapter: str, url: str, sid: str) -> Any:
    """The adapter's object for session ``sid`` on ``url`` (opened from the URL)."""
    if adapter == "openai-agents":
        from ares_events.integrations.openai_agents import AresSession

        return AresSession(sid, url=url)
    if adapter == "pydantic-ai":
        from ares_events.integrations.pydantic_ai import AsyncAresMessageStore

        return AsyncAresMessageStore(url=url)
    from ares_events.integrations.google_adk import AresSessionService

    return AresSessionService(url=url)


async def stored(adapter: str, session: Any, sid: str) -> list[str]:
    """The items of session ``sid``, in stored order."""
    if adapter == "openai-agents":
        return [str(i["content"]) for i in await session.get_items()]
    if adapter == "pydantic-ai":
        return [str(m.parts[0].content) for m in await session.load(sid)]
    got = await session.get_session(app_name=APP, user_id=USER, session_id=sid)
    return [e.invocation_id for e in got.events]


def writer(
    sessions: list[tuple[str, str, str]], name: str, count: int, barrier: Any, out: Any
) -> None:
    """A process's writer: for each ``(adapter, url, sid)`` in turn, opens its own
    session object, waits for every writer, adds its items; reports ``(name, [(refused
    and done again, problems), ...])``, one pair per session."""
    report: list[tuple[int, list[str]]] = []

    async def main(adapter: str, url: str, sid: str) -> int:
        session = open_session(adapter, url, sid)
        try:
            return await add_all(adapter, session, sid, name, count)
        finally:
            await session.close()

    for adapter, url, sid in sessions:
        try:
            barrier.wait(timeout=120)
            report.append((asyncio.run(main(adapter, url, sid)), []))
        except Exception as exc:  # reported, so the test shows it
            report.append((0, [f"{type(exc).__name__}: {exc}"]))
    out.put((name, report))
