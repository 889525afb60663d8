"""AresSession against the OpenAI Agents SDK's own expectations of a session (the
behaviours its tests check for SQLiteSession: tests/memory/test_session.py upstream), on
memory, SQLite and PostgreSQL; plus what ares-events adds: runs that never interleave,
pops and clears recorded as events, erasure, verified reads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.memory.session_settings import SessionSettings
from agents.testing import ModelStep, ScriptedModel, assistant_message

import ares_events as ae
from ares_events.errors import ChainIntegrityError, ConcurrencyError, ConfigError
from ares_events.integrations.openai_agents import AresSession, SessionConflict, stream_of
from tests.integrations.fw_helpers import FW_BACKENDS, fw_url, tamper_sqlite

set_tracing_disabled(True)


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


@pytest.fixture
def store(url: str) -> Iterator[ae.EventStore]:
    """A blocking store (the session runs its calls on worker threads); the tests that
    open by URL use the asyncio store."""
    with ae.open_store(url) as s:
        yield s


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def text(item: Any) -> str:
    c = item.get("content")
    return c if isinstance(c, str) else c[0]["text"]


def test_the_sdk_runner_keeps_history_across_turns(url: str) -> None:
    async def main() -> None:
        session = AresSession("golden-gate", url=url)
        model = ScriptedModel([[assistant_message("San Francisco")], [assistant_message("CA")]])
        agent = Agent(name="test", model=model)
        r1 = await Runner.run(agent, "What city is the Golden Gate Bridge in?", session=session)
        assert r1.final_output == "San Francisco"
        r2 = await Runner.run(agent, "What state is it in?", session=session)
        assert r2.final_output == "CA"
        assert model.last_call is not None and len(model.last_call.input) == 3
        # A new session object (another process, later) sees the same history.
        again = AresSession("golden-gate", url=url)
        items = await again.get_items()
        assert [text(i) for i in items] == [
            "What city is the Golden Gate Bridge in?",
            "San Francisco",
            "What state is it in?",
            "CA",
        ]
        await again.close()
        await session.close()

    run(main())


def test_different_sessions_keep_separate_histories(store: ae.EventStore) -> None:
    async def main() -> None:
        model = ScriptedModel(
            [[assistant_message("cats")], [assistant_message("dogs")], [assistant_message("c")]]
        )
        agent = Agent(name="test", model=model)
        s1, s2 = AresSession("s1", store=store), AresSession("s2", store=store)
        await Runner.run(agent, "I like cats", session=s1)
        await Runner.run(agent, "I like dogs", session=s2)
        await Runner.run(agent, "What did I say I like?", session=s1)
        assert model.last_call is not None
        assert [text(i) for i in model.last_call.input] == [
            "I like cats",
            "cats",
            "What did I say I like?",
        ]

    run(main())


def test_list_input_is_appended_after_the_history(store: ae.EventStore) -> None:
    async def main() -> None:
        s = AresSession("list-input", store=store)
        initial: list[Any] = [
            {"role": "user", "content": "Earlier message"},
            {"role": "assistant", "content": "Saved reply"},
        ]
        await s.add_items(initial)
        model = ScriptedModel([[assistant_message("ok")]])
        new: list[Any] = [{"role": "user", "content": "Test message"}]
        await Runner.run(Agent(name="t", model=model), new, session=s)
        assert model.last_call is not None and model.last_call.input == initial + new

    run(main())


def test_add_get_and_clear_directly(store: ae.EventStore) -> None:
    async def main() -> None:
        s = AresSession("direct", store=store)
        items: list[Any] = [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there!"},
        ]
        await s.add_items(items)
        assert await s.get_items() == items
        await s.add_items([])  # nothing to store
        await s.clear_session()
        assert await s.get_items() == []
        # The history is not rewritten: the items and the clear are events.
        types = [e.type for e in store.read(stream_of("direct"))]
        assert types == ["oai.items", "oai.cleared"]
        await s.add_items([{"role": "user", "content": "after"}])
        assert [text(i) for i in await s.get_items()] == ["after"]

    run(main())


def test_pop_item_returns_newest_first_and_records_each_pop(store: ae.EventStore) -> None:
    async def main() -> None:
        s = AresSession("pop", store=store)
        assert await s.pop_item() is None
        await s.add_items(
            [
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there!"},
                {"role": "user", "content": "How are you?"},
            ]
        )
        assert len(await s.get_items()) == 3
        popped = await s.pop_item()
        assert popped == {"role": "user", "content": "How are you?"}
        assert [text(i) for i in await s.get_items()] == ["Hello", "Hi there!"]
        assert text(await s.pop_item()) == "Hi there!"
        assert text(await s.pop_item()) == "Hello"
        assert await s.pop_item() is None
        assert await s.get_items() == []
        types = [e.type for e in store.read(stream_of("pop"))]
        assert types == ["oai.items", "oai.popped", "oai.popped", "oai.popped"]

    run(main())


def test_pop_only_affects_its_own_session(store: ae.EventStore) -> None:
    async def main() -> None:
        s1, s2 = AresSession("p1", store=store), AresSession("p2", store=store)
        await s1.add_items([{"role": "user", "content": "Session 1 message"}])
        await s2.add_items(
            [
                {"role": "user", "content": "Session 2 message 1"},
                {"role": "user", "content": "Session 2 message 2"},
            ]
        )
        assert text(await s2.pop_item()) == "Session 2 message 2"
        assert [text(i) for i in await s1.get_items()] == ["Session 1 message"]
        assert [text(i) for i in await s2.get_items()] == ["Session 2 message 1"]

    run(main())


def test_get_items_with_limit(store: ae.EventStore) -> None:
    async def main() -> None:
        s = AresSession("limit", store=store)
        names = ["M1", "R1", "M2", "R2", "M3", "R3"]
        # Over several adds and a pop: the limit counts items, not events.
        await s.add_items([{"role": "user", "content": n} for n in names[:3]])
        await s.add_items([{"role": "user", "content": n} for n in [*names[3:], "extra"]])
        await s.pop_item()
        assert [text(i) for i in await s.get_items()] == names
        assert [text(i) for i in await s.get_items(limit=2)] == ["M3", "R3"]
        assert [text(i) for i in await s.get_items(limit=4)] == names[2:]
        assert [text(i) for i in await s.get_items(limit=10)] == names
        assert await s.get_items(limit=0) == []
        assert [text(i) for i in await s.get_items(limit=-1)] == names
        limited = AresSession("limit", store=store, session_settings=SessionSettings(limit=3))
        assert [text(i) for i in await limited.get_items()] == ["R2", "M3", "R3"]
        assert len(await limited.get_items(limit=5)) == 5

    run(main())


def test_two_concurrent_runs_on_one_session_never_interleave(store: ae.EventStore) -> None:
    """Two Runner.run on one session object at once: the first write wins, the other run
    gets SessionConflict, and the history holds one run's items only."""

    async def main() -> None:
        s = AresSession("race", store=store)

        async def slow(call: Any) -> Any:
            await asyncio.sleep(0.01)
            return [assistant_message(f"answer to {text(call.input[-1])}")]

        model = ScriptedModel([ModelStep.respond(slow), ModelStep.respond(slow)])
        agent = Agent(name="t", model=model)
        got = await asyncio.gather(
            Runner.run(agent, "A", session=s),
            Runner.run(agent, "B", session=s),
            return_exceptions=True,
        )
        losers = [g for g in got if isinstance(g, BaseException)]
        assert len(losers) == 1 and isinstance(losers[0], SessionConflict)
        assert isinstance(losers[0], ConcurrencyError)
        winner = next(g for g in got if not isinstance(g, BaseException))
        said = text(winner.input[-1])  # the run's question (its input may hold history first)
        other = "B" if said == "A" else "A"
        items = [text(i) for i in await s.get_items()]
        # Either both runs read the empty history before either wrote (the loser stored
        # nothing), or the winner started after the loser's input had landed and answered
        # on top of it (the loser's answer, its second write, is what was refused). Which
        # one happens depends on scheduling; an answer never follows another run's input.
        assert items in ([said, f"answer to {said}"], [other, said, f"answer to {said}"])
        # The loser runs its turn again on the new history: it succeeds.
        model.enqueue(ModelStep.respond(slow))
        retry = await Runner.run(agent, other, session=s)
        assert len(await s.get_items()) == len(items) + 2
        assert retry.final_output == f"answer to {other}"

    run(main())


class Run:
    """A run context of our own (the SDK passes its RunContextWrapper)."""


def test_direct_writers_of_two_session_objects_both_land(store: ae.EventStore) -> None:
    """Without a run context a write is one atomic step on the stream as it is then (the
    SDK's sessions' semantics): nothing is refused, nothing lost."""

    async def main() -> None:
        a, b = AresSession("direct2", store=store), AresSession("direct2", store=store)
        assert await a.get_items() == [] and await b.get_items() == []
        await a.add_items([{"role": "user", "content": "from a"}])
        await b.add_items([{"role": "user", "content": "from b"}])  # b read before a wrote
        assert [text(i) for i in await a.get_items()] == ["from a", "from b"]
        await a.add_items([{"role": "user", "content": "a again"}])
        popped = await b.pop_item()  # the newest now, though b never saw it
        assert popped is not None and text(popped) == "a again"
        await b.clear_session()
        assert await a.get_items() == []

    run(main())


def test_a_stale_run_is_refused_and_stores_nothing(store: ae.EventStore) -> None:
    async def main() -> None:
        a, b = AresSession("stale", store=store), AresSession("stale", store=store)
        run_b = Run()
        assert await a.get_items() == [] and await b.get_items(wrapper=run_b) == []
        await a.add_items([{"role": "user", "content": "from a"}])
        with pytest.raises(SessionConflict) as info:
            await b.add_items([{"role": "user", "content": "from b"}], wrapper=run_b)
        assert info.value.session_id == "stale"
        assert info.value.expected == 0 and info.value.actual == 1
        with pytest.raises(SessionConflict):
            await b.pop_item(wrapper=run_b)
        with pytest.raises(SessionConflict):
            await b.clear_session(wrapper=run_b)
        assert [text(i) for i in await b.get_items()] == ["from a"]
        again = Run()  # the turn run again: a new run reads the new history
        await b.get_items(wrapper=again)
        await b.add_items([{"role": "user", "content": "from b"}], wrapper=again)
        await b.add_items([{"role": "user", "content": "b, its 2nd"}], wrapper=again)
        assert [text(i) for i in await a.get_items()] == ["from a", "from b", "b, its 2nd"]

    run(main())


def test_clear_with_erase_erases_the_payloads_and_keeps_the_chain(url: str) -> None:
    async def main() -> None:
        store = await ae.open_async_store(url)
        try:
            s = AresSession("erase-me", store=store)
            await s.add_items([{"role": "user", "content": "my card is 4111"}])
            await s.clear_session(erase=True, reason="user asked", by="support")
            assert await s.get_items() == []
            events = [e async for e in store.read(stream_of("erase-me"))]
            assert events[0].payload_erased and not events[1].payload_erased
            records = [e.payload async for e in store.read("ares-events/erasures")]
            assert [(r["version"], r["reason"], r["by"]) for r in records] == [
                (1, "user asked", "support")
            ]
            assert await AresSession("erase-me", store=store).get_items() == []
        finally:
            await store.close()
        with ae.open_store(url) as blocking:
            assert ae.integrity.verify_stream(blocking, stream_of("erase-me")).ok

    run(main())


def test_a_tampered_item_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/tamper.db"

    async def main() -> None:
        s = AresSession("tamper", url=url)
        await s.add_items([{"role": "user", "content": "pay 10"}])
        await s.close()
        tamper_sqlite(tmp_path / "tamper.db", "pay 10", "pay 99")
        again = AresSession("tamper", url=url)
        with pytest.raises(ChainIntegrityError) as info:
            await again.get_items()
        assert info.value.stream_id == stream_of("tamper")
        await again.close()

    run(main())


def test_bad_arguments_are_typed_errors() -> None:
    with pytest.raises(ConfigError):
        AresSession("x")
    with pytest.raises(ConfigError):
        AresSession("x", url="memory://", store=ae.open_store("memory://"))
    with pytest.raises(ae.InvalidEvent):
        AresSession("", url="memory://")
    with pytest.raises(ae.InvalidEvent):
        AresSession("bad\nid", url="memory://")


def test_repr_never_shows_the_password() -> None:
    s = AresSession("x", url="postgresql://root:hunter2@127.0.0.1:5432/db")
    assert "hunter2" not in repr(s)


def test_editing_returned_items_does_not_edit_the_session(store: ae.EventStore) -> None:
    async def main() -> None:
        s = AresSession("copies", store=store)
        await s.add_items([{"role": "user", "content": "keep me"}])
        got = await s.get_items()
        first = cast(dict[str, Any], got[0])  # a user message item
        first["content"] = "changed"
        assert [text(i) for i in await s.get_items()] == ["keep me"]

    run(main())
