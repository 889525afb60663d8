"""Pydantic AI on ares-events: the message store on both faces (round trip through
``ModelMessagesTypeAdapter``, the history a second run sees, conflicts, clear and erase,
verified reads) on memory, SQLite and PostgreSQL, and durable runs through the journal
(replayed model calls and tools, in-doubt tools, reconcilers, divergence)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.conversation_store import ConversationConflict as PydanticConflict
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

import ares_events as ae
from ares_events.agents.journal import InDoubtToolCall, Journal, ReplayDivergence
from ares_events.core.events import RecordedEvent
from ares_events.errors import ChainIntegrityError, ConcurrencyError, ConfigError
from ares_events.integrations.pydantic_ai import (
    AresMessageStore,
    AsyncAresMessageStore,
    ConversationConflict,
    JournaledToolset,
    idempotency_key,
    run_durably,
    stream_of,
)
from ares_events.projections.runner import ProjectionRunner, read_model
from tests.integrations.fw_helpers import FW_BACKENDS, Killed, dies, fw_url, tamper_sqlite


@pytest.fixture(params=FW_BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return fw_url(str(request.param), tmp_path, request)


def echo_model() -> FunctionModel:
    def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [
            p.content
            for m in messages
            if isinstance(m, ModelRequest)
            for p in m.parts
            if isinstance(p, UserPromptPart)
        ]
        return ModelResponse(parts=[TextPart(f"seen: {' | '.join(map(str, prompts))}")])

    return FunctionModel(reply)


# -- the message store -------------------------------------------------------------------


def test_history_round_trips_and_a_second_run_sees_it(url: str) -> None:
    agent = Agent(echo_model())
    with ae.open_store(url) as store:
        history = AresMessageStore(store=store)
        assert history.load("c-1") == []
        r1 = asyncio.run(agent.run("hello", message_history=history.load("c-1")))
        history.append("c-1", r1.new_messages())
        r2 = asyncio.run(agent.run("again", message_history=history.load("c-1")))
        assert r2.output == "seen: hello | again"
        history.append("c-1", r2.new_messages())
        # Another store object (another process) loads exactly what the runs produced.
        loaded = AresMessageStore(store=store).load("c-1")
        assert loaded == r2.all_messages()
        assert [e.type for e in store.read(stream_of("c-1"))] == ["pai.messages"] * 2
        assert AresMessageStore(store=store).load("c-2") == []


def test_binary_content_survives_the_round_trip(url: str) -> None:
    msgs: list[ModelMessage] = [
        ModelRequest(
            parts=[UserPromptPart(["look", BinaryContent(b"\x00\xff", media_type="image/png")])]
        ),
        ModelResponse(parts=[ToolCallPart("zoom", {"x": 1.5}, tool_call_id="t1")]),
    ]
    with AresMessageStore(url=url) as history:
        history.append("bin", msgs)
    # Exactly what Pydantic AI's own adapter gives back (it reads an image as BinaryImage).
    own = ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(msgs))
    with AresMessageStore(url=url) as again:
        loaded = again.load("bin")
    assert loaded == own
    part = loaded[0].parts[0]
    assert isinstance(part, UserPromptPart) and not isinstance(part.content, str)
    image = part.content[1]
    assert isinstance(image, BinaryContent) and image.data == b"\x00\xff"
    history.close()


def test_the_async_store_is_the_same_store(url: str) -> None:
    agent = Agent(echo_model())

    async def main() -> None:
        async with AsyncAresMessageStore(url=url) as history:
            r1 = await agent.run("hi", message_history=await history.load("a-1"))
            assert await history.append("a-1", r1.new_messages()) == 1
            r2 = await agent.run("there", message_history=await history.load("a-1"))
            await history.append("a-1", r2.new_messages())
            assert await history.load("a-1") == r2.all_messages()

    asyncio.run(main())
    with AresMessageStore(url=url) as again:
        assert len(again.load("a-1")) == 4


def test_a_second_writer_gets_a_conflict_and_stores_nothing(url: str) -> None:
    agent = Agent(echo_model())
    with ae.open_store(url) as store:
        a, b = AresMessageStore(store=store), AresMessageStore(store=store)
        ha, hb = a.load("c"), b.load("c")
        ra = asyncio.run(agent.run("from a", message_history=ha))
        rb = asyncio.run(agent.run("from b", message_history=hb))
        a.append("c", ra.new_messages())
        with pytest.raises(ConversationConflict) as info:
            b.append("c", rb.new_messages())
        err = info.value
        assert isinstance(err, ConcurrencyError) and isinstance(err, PydanticConflict)
        assert err.conversation_id == "c" and (err.expected, err.actual) == (0, 1)
        assert a.load("c") == ra.all_messages()
        # The loser loads again and runs its turn on the new history.
        rb = asyncio.run(agent.run("from b", message_history=b.load("c")))
        b.append("c", rb.new_messages())
        assert rb.output == "seen: from a | from b"
        assert len(a.load("c")) == 4


def _turn(text: str) -> list[ModelMessage]:
    return [
        ModelRequest(parts=[UserPromptPart(text)]),
        ModelResponse(parts=[TextPart(f"re: {text}")]),
    ]


def _two_requests(blocking: AresMessageStore, shared: AsyncAresMessageStore, face: str) -> Any:
    """Two threads, one request each on the shared store object (``face``: blocking, or
    asyncio in the thread's own asyncio.run): both load, then the first appends, then the
    second; what each append returned or raised."""
    import threading

    loaded, first_done = threading.Barrier(2), threading.Event()
    out: dict[str, Any] = {}

    def request(name: str) -> None:
        async def handle() -> int:
            await shared.load(face)
            loaded.wait(60)
            if name == "second":
                first_done.wait(60)
            return await shared.append(face, _turn(name))

        try:
            if face == "blocking":
                blocking.load(face)
                loaded.wait(60)
                if name == "second":
                    first_done.wait(60)
                out[name] = blocking.append(face, _turn(name))
            else:
                out[name] = asyncio.run(handle())
        except ConversationConflict as exc:
            out[name] = exc
        finally:
            if name == "first":
                first_done.set()

    threads = [threading.Thread(target=request, args=(n,)) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out["first"], out["second"]


def test_requests_sharing_one_store_object_conflict_like_two_objects(url: str) -> None:
    """One store object shared by two threads (each running its request in its own
    asyncio.run, or blocking) and by two asyncio tasks: both requests load the same
    history, the first append wins and the second is refused, as with two objects (each
    caller's append is written at the version that caller loaded)."""
    blocking = AresMessageStore(url=url)
    shared = AsyncAresMessageStore(url=url)
    try:
        for face in ("blocking", "asyncio"):
            first, second = _two_requests(blocking, shared, face)
            assert first == 1 and isinstance(second, ConversationConflict), (face, second)
            assert (second.expected, second.actual) == (0, 1)
            assert len(blocking.load(face)) == 2  # the loser stored nothing

        async def tasks() -> tuple[Any, ...]:
            first_done, both_loaded = asyncio.Event(), asyncio.Barrier(2)

            async def request(name: str) -> Any:
                await shared.load("tasks")
                await both_loaded.wait()
                if name == "second":
                    await first_done.wait()
                try:
                    return await shared.append("tasks", _turn(name))
                finally:
                    first_done.set()

            return await asyncio.gather(request("first"), request("second"), return_exceptions=True)

        first, second = asyncio.run(tasks())
        assert first == 1 and isinstance(second, ConversationConflict)
        # A caller that loads again appends on the new history.
        assert blocking.load("tasks") and blocking.append("tasks", _turn("again")) == 2
    finally:
        blocking.close()
        asyncio.run(shared.close())


def test_clear_and_erase(url: str) -> None:
    msgs: list[ModelMessage] = [ModelRequest(parts=[UserPromptPart("my card is 4111")])]
    with ae.open_store(url) as store:
        h = AresMessageStore(store=store)
        h.append("e", msgs)
        h.clear("e")
        assert h.load("e") == []
        h.append("e", msgs)
        h.clear("e", erase=True, reason="user asked", by="support")
        assert h.load("e") == []
        events = list(store.read(stream_of("e")))
        assert [(e.type, e.payload_erased) for e in events] == [
            ("pai.messages", True),
            ("pai.cleared", False),
            ("pai.messages", True),
            ("pai.cleared", False),
        ]
        assert ae.integrity.verify_stream(store, stream_of("e")).ok


class _Texts:
    """A fold that keeps the text of every payload it reads."""

    name = "texts"
    version = 1

    def initial(self) -> list[str]:
        return []

    def apply(self, state: list[str], event: RecordedEvent) -> list[str]:
        return [*state, str(event.payload)]


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_clear_with_erase_drops_the_snapshots_and_read_models_that_folded_it(
    url: str, face: str
) -> None:
    """clear(erase=True) erases as ``ares-events erase`` does, on either face: a snapshot
    of the conversation and a read model that folded its messages go too."""
    secret, sid, proj = "my card is 4111", stream_of("e"), _Texts()
    with ae.open_store(url) as store:
        AresMessageStore(store=store).append("e", [ModelRequest(parts=[UserPromptPart(secret)])])
        ae.snapshot(store, sid, proj)
        ProjectionRunner(store, [proj]).run_until_idle()
        assert secret in str(read_model(store, proj, sid))
        if face == "blocking":
            AresMessageStore(store=store).clear("e", erase=True, reason="r", by="b")
        else:

            async def clear() -> None:
                opened = await ae.open_async_store(url)
                try:
                    await AsyncAresMessageStore(store=opened).clear("e", erase=True, by="b")
                finally:
                    await opened.close()

            asyncio.run(clear())
        assert list(store.snapshots.list(sid)) == []
        assert read_model(store, proj, sid) is None
        assert ae.integrity.audit(store, deep=True).ok


def test_a_tampered_message_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    h = AresMessageStore(url=url)
    h.append("t", [ModelRequest(parts=[UserPromptPart("transfer 10")])])
    h.close()
    tamper_sqlite(tmp_path / "t.db", "transfer 10", "transfer 99")
    with AresMessageStore(url=url) as again, pytest.raises(ChainIntegrityError):
        again.load("t")


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError):
        AresMessageStore()
    with AresMessageStore(url="memory://") as h, pytest.raises(ae.InvalidEvent):
        h.load("")
    assert "hunter2" not in repr(AresMessageStore(url="postgresql://u:hunter2@127.0.0.1/db"))


# -- durable runs ------------------------------------------------------------------------


class Shop:
    """A downstream system, its charges counted; a model that asks for two charges, then
    answers; every paid model call counted."""

    def __init__(self) -> None:
        self.charges: list[tuple[int, str | None]] = []
        self.paid = 0

    def model(self) -> FunctionModel:
        def reply(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
            self.paid += 1
            if len(messages) == 1:
                return ModelResponse(
                    parts=[
                        ToolCallPart("charge", {"cents": 500}, tool_call_id="c1"),
                        ToolCallPart("charge", {"cents": 700}, tool_call_id="c2"),
                    ]
                )
            return ModelResponse(parts=[TextPart("charged twice")])

        return FunctionModel(reply)

    def agent(self) -> Agent[None, str]:
        agent = Agent(self.model())

        @agent.tool_plain
        def charge(cents: int) -> str:
            self.charges.append((cents, idempotency_key()))
            return f"charged {cents}"

        return agent


def test_a_durable_run_replays_without_paying_or_charging_again(url: str) -> None:
    shop = Shop()
    with ae.open_store(url) as store:
        r1 = asyncio.run(run_durably(shop.agent(), "pay", store=store, run_id="order-1"))
        assert r1.output == "charged twice"
        assert shop.paid == 2
        assert shop.charges == [(500, "order-1:2"), (700, "order-1:3")]
        # The same run again (a restart): answered from the journal.
        r2 = asyncio.run(run_durably(shop.agent(), "pay", store=store, run_id="order-1"))
        assert r2.output == "charged twice"
        assert shop.paid == 2 and len(shop.charges) == 2
        info = Journal.inspect(store, "order-1")
        assert info.status == "completed"
        assert [s.kind for s in info.steps] == ["model", "tool", "tool", "model"]


def crashing(shop: Shop) -> Agent[None, str]:
    """The shop's agent whose first charge dies after charging, before answering."""
    agent = Agent(shop.model())

    @agent.tool_plain
    def charge(cents: int) -> str:
        shop.charges.append((cents, idempotency_key()))
        if len(shop.charges) == 1:
            raise Killed
        return f"charged {cents}"

    return agent


def test_a_run_cut_off_inside_a_tool_stops_for_a_human(url: str) -> None:
    shop = Shop()
    with ae.open_store(url) as store:
        dies(run_durably(crashing(shop), "pay", store=store, run_id="order-2"))
        assert shop.charges == [(500, "order-2:2")]
        # Resumed without a reconciler and not idempotent: the run stops, nothing charged.
        with pytest.raises(InDoubtToolCall) as info:
            asyncio.run(run_durably(shop.agent(), "pay", store=store, run_id="order-2"))
        assert info.value.key == "order-2:2" and len(shop.charges) == 1
        assert Journal.inspect(store, "order-2").status == "in_doubt"
        # An operator resumes it with a reconciler that finds the charge landed: the
        # first charge is not made again, the second one is made, once.
        Journal(store, "order-2").resume(by="operator")

        def landed(name: str, key: str) -> tuple[bool, Any]:
            return (True, "charged 500") if key == "order-2:2" else (False, None)

        r = asyncio.run(
            run_durably(shop.agent(), "pay", store=store, run_id="order-2", reconcile=landed)
        )
        assert r.output == "charged twice"
        assert shop.charges == [(500, "order-2:2"), (700, "order-2:3")]
        assert shop.paid == 2  # the first model call was answered from the journal


def test_a_tool_named_idempotent_is_retried_with_the_same_key(url: str) -> None:
    shop = Shop()
    with ae.open_store(url) as store:
        dies(run_durably(crashing(shop), "pay", store=store, run_id="order-3"))
        r = asyncio.run(
            run_durably(shop.agent(), "pay", store=store, run_id="order-3", idempotent={"charge"})
        )
        assert r.output == "charged twice"
        # The same key again: a downstream that dedupes on it charges once.
        assert shop.charges == [(500, "order-3:2"), (500, "order-3:2"), (700, "order-3:3")]
        assert shop.paid == 2


def test_another_prompt_under_the_same_run_id_is_a_divergence(url: str) -> None:
    with ae.open_store(url) as store:
        asyncio.run(run_durably(Shop().agent(), "pay", store=store, run_id="order-4"))
        with pytest.raises(ReplayDivergence):
            asyncio.run(run_durably(Shop().agent(), "refund", store=store, run_id="order-4"))


def test_a_toolset_without_a_journal_is_a_config_error() -> None:
    """A JournaledToolset made without its journal says so (a ConfigError, also under
    ``python -O``, which drops asserts) and runs no tool."""
    from pydantic_ai.toolsets import FunctionToolset

    ran: list[int] = []
    toolset = JournaledToolset(FunctionToolset([lambda: ran.append(1)]))
    with pytest.raises(ConfigError, match="journal"):
        asyncio.run(toolset.call_tool("t", {}, Any, Any))  # type: ignore[arg-type]
    assert ran == []
