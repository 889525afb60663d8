"""AresSession against the rest of what the OpenAI Agents SDK's own session tests
(openai-agents 0.24: tests/memory/test_session.py and test_session_limit.py) check of a
session, beyond test_openai_agents.py: every runner method (``run``, ``run_sync`` in a
thread of its own, ``run_streamed``), the session input callback, the history limit from
the run's settings (a tool output whose call fell outside the limit is dropped), the
``session_settings`` semantics, odd content, and failures that store nothing. On memory,
SQLite and PostgreSQL. Threads, event loops and processes sharing a session are
test_framework_sharing.py's.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, RunConfig, Runner, set_tracing_disabled
from agents.memory import SessionSettings
from agents.testing import ScriptedModel, assistant_message

import ares_events as ae
from ares_events.errors import ConfigError, StoreClosed
from ares_events.integrations.openai_agents import AresSession, SessionSettingsError
from tests.integrations.fw_helpers import FW_BACKENDS, fw_url

set_tracing_disabled(True)

METHODS = ["run", "run_sync", "run_streamed"]


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


async def drive(method: str, agent: Agent[Any], prompt: Any, **kw: Any) -> Any:
    """One turn by ``method``; ``run_sync`` runs on a thread with its own event loop."""
    if method == "run":
        return await Runner.run(agent, prompt, **kw)
    if method == "run_sync":

        def sync_turn() -> Any:
            try:
                return Runner.run_sync(agent, prompt, **kw)
            finally:  # run_sync leaves its thread's loop open, for the next run_sync
                loop = asyncio.get_event_loop_policy().get_event_loop()
                loop.run_until_complete(loop.shutdown_default_executor())
                loop.close()
                asyncio.set_event_loop(None)

        return await asyncio.to_thread(sync_turn)
    result = Runner.run_streamed(agent, prompt, **kw)
    async for _ in result.stream_events():
        pass
    return result


def text(item: Any) -> str:
    c = item.get("content")
    return c if isinstance(c, str) else c[0]["text"]


def user(content: str) -> Any:
    return {"role": "user", "content": content}


@pytest.mark.parametrize("method", METHODS)
def test_every_runner_method_keeps_the_history(method: str, url: str) -> None:
    async def main() -> None:
        model = ScriptedModel([[assistant_message("San Francisco")], [assistant_message("CA")]])
        agent = Agent(name="t", model=model)
        async with AresSession("turns", url=url) as session:
            await drive(method, agent, "Where is the Golden Gate Bridge?", session=session)
            await drive(method, agent, "Which state?", session=session)
            assert model.last_call is not None and len(model.last_call.input) == 3
            assert [text(i) for i in await session.get_items()] == [
                "Where is the Golden Gate Bridge?",
                "San Francisco",
                "Which state?",
                "CA",
            ]
        # Without a session the runner keeps nothing between turns.
        alone = ScriptedModel([[assistant_message("a")], [assistant_message("b")]])
        await drive(method, Agent(name="t", model=alone), "first")
        await drive(method, Agent(name="t", model=alone), "second")
        assert alone.last_call is not None and len(alone.last_call.input) == 1

    asyncio.run(main())


@pytest.mark.parametrize("method", METHODS)
def test_the_session_input_callback_shapes_what_the_model_sees(method: str, url: str) -> None:
    async def main() -> None:
        async with AresSession("callback", url=url) as session:
            history = [user("Hello there."), {"role": "assistant", "content": "Hi."}]
            await session.add_items(history)

            def users_only(past: list[Any], new: list[Any]) -> list[Any]:
                return [i for i in past if i["role"] == "user"] + new

            model = ScriptedModel([[assistant_message("I'm a bot")]])
            config = RunConfig(session_input_callback=users_only)
            new = [user("What is your name?")]
            await drive(
                method, Agent(name="t", model=model), new, session=session, run_config=config
            )
            assert model.last_call is not None and model.last_call.input == [history[0], new[0]]

    asyncio.run(main())


@pytest.mark.parametrize("method", METHODS)
def test_a_callback_that_repeats_history_does_not_grow_the_session(method: str, url: str) -> None:
    def repeat_first(past: list[Any], new: list[Any]) -> list[Any]:
        return [*past, past[0], *new] if past else new

    async def main() -> None:
        async with AresSession("repeat", url=url) as session:
            model = ScriptedModel([[assistant_message(f"assistant {k}")] for k in range(3)])
            agent = Agent(name="t", model=model)
            config = RunConfig(session_input_callback=repeat_first)
            for k in range(3):
                await drive(method, agent, f"user {k}", session=session, run_config=config)
            stored = await session.get_items()
            assert len(stored) == 6
            assert [text(i) for i in stored if i.get("role") == "user"] == [
                "user 0",
                "user 1",
                "user 2",
            ]

    asyncio.run(main())


@pytest.mark.parametrize("method", METHODS)
def test_the_runs_limit_drops_a_tool_output_whose_call_it_left_out(method: str, url: str) -> None:
    history: list[Any] = [
        user("What is the weather?"),
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
        },
    ]

    async def main() -> None:
        async with AresSession("tool-pair", url=url) as session:
            await session.add_items(history)
            assert await session.get_items(limit=2) == history[-2:]
            model = ScriptedModel([[assistant_message("Sunny too.")]])
            config = RunConfig(session_settings=SessionSettings(limit=2))
            await drive(
                method,
                Agent(name="t", model=model),
                "And tomorrow?",
                session=session,
                run_config=config,
            )
            assert model.last_call is not None
            assert model.last_call.input == [history[-1], user("And tomorrow?")]

    asyncio.run(main())


@pytest.mark.parametrize(("limit", "seen"), [(2, 2), (0, 0), (None, 6), (100, 6)])
def test_the_runs_limit_picks_the_newest_history(limit: int | None, seen: int, url: str) -> None:
    """RunConfig's session_settings override the session's own (limit 100 here)."""

    async def main() -> None:
        settings = SessionSettings(limit=100)
        async with AresSession("limits", url=url, session_settings=settings) as session:
            await session.add_items([user(f"Turn {k}") for k in range(6)])
            model = ScriptedModel([[assistant_message("ok")]])
            config = RunConfig(session_settings=SessionSettings(limit=limit))
            await Runner.run(
                Agent(name="t", model=model), "New", session=session, run_config=config
            )
            assert model.last_call is not None
            got = [text(i) for i in model.last_call.input]
            assert got == [f"Turn {k}" for k in range(6 - seen, 6)] + ["New"]

    asyncio.run(main())


def test_session_settings_are_the_sdks() -> None:
    """None is the defaults; a SessionSettings is kept as given; a dict is normalised
    (and resolves like one); an unknown field or another type is refused with the SDK's
    TypeError, which is also our ConfigError."""
    plain = AresSession("defaults", url="memory://")
    assert isinstance(plain.session_settings, SessionSettings)
    assert plain.session_settings.limit is None
    given = SessionSettings(limit=5)
    assert AresSession("given", url="memory://", session_settings=given).session_settings is given
    from_dict = AresSession("dict", url="memory://", session_settings={"limit": 0})
    assert isinstance(from_dict.session_settings, SessionSettings)
    assert from_dict.session_settings.limit == 0
    assert from_dict.session_settings.resolve({"limit": 4}).limit == 4
    assert SessionSettings(limit=100).resolve(None).limit == 100
    with pytest.raises(TypeError, match="Unknown session settings: limitt") as info:
        AresSession("bad", url="memory://", session_settings={"limitt": 1})
    assert isinstance(info.value, SessionSettingsError) and isinstance(info.value, ConfigError)
    with pytest.raises(SessionSettingsError):
        AresSession("bad", url="memory://", session_settings=cast(Any, 3))


def test_get_items_takes_the_settings_limit_unless_given_one(url: str) -> None:
    async def main() -> None:
        five = AresSession("settings", url=url, session_settings=SessionSettings(limit=3))
        await five.add_items([user(f"Message {k}") for k in range(10)])
        assert [text(i) for i in await five.get_items()] == ["Message 7", "Message 8", "Message 9"]
        assert [text(i) for i in await five.get_items(limit=2)] == ["Message 8", "Message 9"]
        await five.close()

    asyncio.run(main())


def test_unicode_and_sql_like_content_round_trip(url: str) -> None:
    odd = [
        user("こんにちは"),
        {"role": "assistant", "content": "😊👍"},
        user("Здравствуйте"),
        user("O'Reilly; DROP TABLE ares_events; --"),
        user('"quoted" \\ back\\slash %s ? \x01'),
        user("Robert'); DELETE FROM ares_heads WHERE ('1'='1"),
    ]

    async def main() -> None:
        async with AresSession("odd'; --", url=url) as session:
            await session.add_items(odd)
            assert await session.get_items() == odd
        async with AresSession("odd'; --", url=url) as again:
            assert await again.get_items() == odd

    asyncio.run(main())


def test_a_failed_add_stores_nothing_and_the_session_goes_on(url: str) -> None:
    async def main() -> None:
        async with AresSession("fails", url=url) as session:
            await session.add_items([user("kept")])
            with pytest.raises(ae.InvalidEvent):
                await session.add_items([user("fine"), user(cast(Any, object()))])
            assert [text(i) for i in await session.get_items()] == ["kept"]
            await session.add_items([user("after")])
            assert [text(i) for i in await session.get_items()] == ["kept", "after"]

    asyncio.run(main())


def test_a_session_error_ends_run_streamed_instead_of_hanging(url: str) -> None:
    async def main() -> None:
        store = ae.open_store(url)
        session = AresSession("closed", store=store)
        store.close()  # every session call now fails
        model = ScriptedModel([[assistant_message("never")]])
        result = Runner.run_streamed(Agent(name="t", model=model), "Hello", session=session)

        async def consume() -> None:
            async for _ in result.stream_events():
                pass

        with pytest.raises(StoreClosed):
            await asyncio.wait_for(consume(), timeout=60)

    asyncio.run(main())
