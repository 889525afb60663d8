"""Each framework adapter shared the way servers share it (issue 29): threads that each
run their own event loop, one ``asyncio.run`` per request, and processes, all on one
session, on SQLite and PostgreSQL. Nothing hangs (every join is bounded; pytest-timeout
is on) and no item is lost: every writer's items are stored once each, in its order.

The writers start together (a barrier), so their writes race for real; what each adapter
does on a race is the framework's own semantics (tests/children/session_writers.py).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from agents import Agent, Runner, set_tracing_disabled
from agents.testing import ScriptedModel, assistant_message
from google.adk.agents import LlmAgent
from google.adk.runners import Runner as AdkRunner
from google.genai import types
from pydantic_ai import Agent as PaiAgent

from ares_events.errors import ConcurrencyError
from ares_events.integrations.google_adk import AresSessionService
from ares_events.integrations.openai_agents import AresSession, SessionConflict
from ares_events.integrations.pydantic_ai import AresMessageStore, AsyncAresMessageStore
from tests.children.session_writers import APP, USER, add_all, open_session, stored, writer
from tests.integrations.fw_helpers import ADAPTERS, FRAMEWORKS, SHARED_BACKENDS, fw_url
from tests.integrations.test_google_adk import FakeLlm
from tests.integrations.test_pydantic_ai import echo_model

set_tracing_disabled(True)

THREADS, PROCESSES, ITEMS = 4, 2, 5
JOIN = 120.0  # seconds: a writer still running after this is a hang


@pytest.fixture(params=SHARED_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def prepare(adapter: str, url: str) -> str:
    """A new session id (ADK's session created first: its writers append to it)."""
    sid = f"share-{uuid.uuid4().hex[:8]}"
    if adapter == "google-adk":

        async def make() -> None:
            service = AresSessionService(url=url)
            try:
                await service.create_session(app_name=APP, user_id=USER, session_id=sid)
            finally:
                await service.close()

        asyncio.run(make())
    return sid


def assert_every_item_once_in_order(got: list[str], writers: list[str], count: int) -> None:
    want = {f"{w}-{i}" for w in writers for i in range(count)}
    assert sorted(got) == sorted(want), "an item was lost or stored twice"
    for w in writers:
        assert [g for g in got if g.rsplit("-", 1)[0] == w] == [f"{w}-{i}" for i in range(count)]


def join_all(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.join(timeout=JOIN)
    assert not [t.name for t in threads if t.is_alive()], "a writer hangs"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_threads_each_with_its_own_event_loop_share_one_session(adapter: str, url: str) -> None:
    """One session object, created outside any loop, used by threads that each run
    ``asyncio.run`` (a thread-per-request server; ADK's ``Runner.run``)."""
    sid = prepare(adapter, url)
    session = open_session(adapter, url, sid)
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            barrier.wait(timeout=JOIN)
            asyncio.run(add_all(adapter, session, sid, name, ITEMS))
        except BaseException as exc:  # reported below
            errors.append(exc)

    names = [f"t{k}" for k in range(THREADS)]
    threads = [threading.Thread(target=work, args=(n,), name=n, daemon=True) for n in names]
    for t in threads:
        t.start()
    join_all(threads)
    assert errors == []
    assert_every_item_once_in_order(asyncio.run(stored(adapter, session, sid)), names, ITEMS)
    asyncio.run(session.close())


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
@pytest.mark.postgres
def test_processes_share_one_session(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Each adapter on each backend in turn: processes, each with its own session
    object, add to one session at once (the children start once for all six)."""
    sessions = [
        (adapter, url, prepare(adapter, url))
        for url in (fw_url("sqlite", tmp_path, request), fw_url("postgres", tmp_path, request))
        for adapter in ADAPTERS
    ]
    # A fork server imports the frameworks once and forks each child from its clean,
    # thread-free process: a spawned child spends most of its time importing them.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.children.session_writers", *FRAMEWORKS])
    barrier = ctx.Barrier(PROCESSES)
    out = ctx.Queue()
    names = [f"p{k}" for k in range(PROCESSES)]
    procs = [ctx.Process(target=writer, args=(sessions, n, ITEMS, barrier, out)) for n in names]
    for p in procs:
        p.start()
    reports = dict(out.get(timeout=JOIN) for _ in procs)
    for p in procs:
        p.join(timeout=JOIN)
        assert p.exitcode == 0
    for k, (adapter, url, sid) in enumerate(sessions):
        assert [reports[n][k][1] for n in names] == [[]] * PROCESSES, (adapter, url)
        if adapter == "openai-agents":  # plain appends: never refused
            assert [reports[n][k][0] for n in names] == [0] * PROCESSES

        async def read(adapter: str = adapter, url: str = url, sid: str = sid) -> list[str]:
            session = open_session(adapter, url, sid)
            try:
                return await stored(adapter, session, sid)
            finally:
                await session.close()

        assert_every_item_once_in_order(asyncio.run(read()), names, ITEMS)


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_one_event_loop_per_request_shares_one_session(adapter: str, url: str) -> None:
    """Each request a new ``asyncio.run`` (the loop before it closed), one object."""
    sid = prepare(adapter, url)
    session = open_session(adapter, url, sid)
    for k in range(3):
        asyncio.run(add_all(adapter, session, sid, f"r{k}", 2))
    assert_every_item_once_in_order(
        asyncio.run(stored(adapter, session, sid)), ["r0", "r1", "r2"], 2
    )
    asyncio.run(session.close())
    asyncio.run(add_all(adapter, session, sid, "after-close", 1))  # opens the store again
    asyncio.run(session.close())


def test_openai_runner_turns_each_in_their_own_asyncio_run(url: str) -> None:
    session = AresSession("per-request", url=url)
    model = ScriptedModel([[assistant_message(f"answer {k}")] for k in range(3)])
    agent = Agent(name="t", model=model)
    for k in range(3):
        asyncio.run(Runner.run(agent, f"question {k}", session=session))
    assert model.last_call is not None and len(model.last_call.input) == 5
    assert len(asyncio.run(session.get_items())) == 6
    asyncio.run(session.close())


class BothRead(AresSession):
    """A session whose first read of a run in each thread returns only once both
    threads' runs have read: the two runs then write on the same history, whatever the
    timing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.both_read = threading.Barrier(2)
        self.waited = threading.local()

    async def get_items(self, limit: int | None = None, *, wrapper: Any = None) -> Any:
        got = await super().get_items(limit, wrapper=wrapper)
        if wrapper is not None and not getattr(self.waited, "done", False):
            self.waited.done = True
            await asyncio.to_thread(self.both_read.wait, JOIN)
        return got


def test_openai_runs_in_two_threads_never_interleave(url: str) -> None:
    """Two runs of one session, each in its own thread and event loop, both read the
    history before either writes: one stores its turn, the other gets SessionConflict
    and stores nothing (the SDK saves a run's input before it calls the model)."""
    session = BothRead("two-threads", url=url)
    model = ScriptedModel([[assistant_message("answer")], [assistant_message("answer")]])
    agent = Agent(name="t", model=model)
    results: dict[str, Any] = {}

    def work(text: str) -> None:
        try:
            results[text] = asyncio.run(Runner.run(agent, text, session=session))
        except BaseException as exc:  # one of the two
            results[text] = exc

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in ("A", "B")]
    for t in threads:
        t.start()
    join_all(threads)
    lost = [t for t, r in results.items() if isinstance(r, SessionConflict)]
    assert len(lost) == 1 and len(results) == 2, results
    won = "A" if lost == ["B"] else "B"
    items = asyncio.run(session.get_items())
    assert [i.get("content") for i in items][:1] == [won] and len(items) == 2
    asyncio.run(session.close())


def test_adk_sync_runner_runs_each_turn_on_a_new_thread_and_loop(url: str) -> None:
    """ADK's ``Runner.run`` runs every invocation on a new thread with its own event
    loop: the service opened from a URL serves both turns."""
    service = AresSessionService(url=url)
    agent = LlmAgent(name="a", model=FakeLlm(replies=["one", "two"]))
    runner = AdkRunner(agent=agent, app_name=APP, session_service=service)
    asyncio.run(service.create_session(app_name=APP, user_id=USER, session_id="sync"))
    for text in ("first", "second"):
        msg = types.Content(role="user", parts=[types.Part(text=text)])
        events = list(runner.run(user_id=USER, session_id="sync", new_message=msg))
        assert events and events[-1].content is not None
    got = asyncio.run(service.get_session(app_name=APP, user_id=USER, session_id="sync"))
    assert got is not None
    texts = [p.text for e in got.events if e.content for p in e.content.parts or []]
    assert texts == ["first", "one", "second", "two"]
    asyncio.run(service.close())


def test_pydantic_ai_history_one_event_loop_per_request(url: str) -> None:
    history = AsyncAresMessageStore(url=url)
    agent = PaiAgent(echo_model())

    async def turn(prompt: str) -> str:
        past = await history.load("c")
        result = await agent.run(prompt, message_history=past)
        await history.append("c", result.new_messages())
        return str(result.output)

    assert asyncio.run(turn("one")) == "seen: one"
    assert asyncio.run(turn("two")) == "seen: one | two"
    asyncio.run(history.close())


def test_pydantic_ai_blocking_store_shared_by_threads(url: str) -> None:
    """The blocking store, one object, used by plain threads at once."""
    from pydantic_ai.messages import ModelRequest, UserPromptPart

    history = AresMessageStore(url=url)
    barrier = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def work(name: str) -> None:
        try:
            barrier.wait(timeout=JOIN)
            for i in range(ITEMS):
                while True:
                    history.load("c")
                    try:
                        history.append("c", [ModelRequest(parts=[UserPromptPart(f"{name}-{i}")])])
                        break
                    except ConcurrencyError:  # ConversationConflict: load again
                        continue
        except BaseException as exc:  # reported below
            errors.append(exc)

    names = [f"t{k}" for k in range(THREADS)]
    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in names]
    for t in threads:
        t.start()
    join_all(threads)
    assert errors == []
    got = [str(cast(Any, m.parts[0]).content) for m in history.load("c")]
    assert_every_item_once_in_order(got, names, ITEMS)
    history.close()
