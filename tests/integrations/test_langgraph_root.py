"""A new LangGraph thread cannot fork at its root: the first parentless checkpoint of a
namespace is appended only while the namespace is empty (issue 22), whether the two
writers use two savers or share one (one compiled graph serving concurrent requests)."""

from __future__ import annotations

import asyncio
import contextlib
import operator
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

import ares_events as ae
from ares_events.integrations.langgraph import (
    AresSaver,
    AsyncAresSaver,
    StaleWriteError,
    stream_of,
)
from tests.children.langgraph_fork_child import checkpoint

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
SHARED = pytest.mark.parametrize("shared", [False, True], ids=["two-savers", "one-saver"])


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/root.db"
    return str(request.getfixturevalue("postgres_url"))


@SHARED
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_writers_starting_one_thread_get_one_root(
    backend: str, shared: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Both read the new thread (empty), then both write: the second is refused."""
    url = _url(backend, tmp_path, request)
    tid = f"root-{uuid.uuid4().hex[:8]}"
    cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(AresSaver.from_url(url))
        b = a if shared else stack.enter_context(AresSaver.from_url(url))
        assert a.get_tuple(cfg) is None
        assert b.get_tuple(cfg) is None
        first, second = checkpoint(), checkpoint()
        a.put(cfg, first, {"source": "input", "step": -1}, {})
        with pytest.raises(StaleWriteError) as info:
            b.put(cfg, second, {"source": "input", "step": -1}, {})
        err = info.value
        assert err.is_stale_write_owner_error is True
        assert err.parent_checkpoint_id is None
        assert err.winner_checkpoint_id == first["id"]
        assert err.attempted_checkpoint_id == second["id"]
        # The loser reloads and continues the winner's root: that is an ordinary child.
        tip = b.get_tuple(cfg)
        assert tip is not None and tip.checkpoint["id"] == first["id"]
        b.put(tip.config, checkpoint(), {"source": "loop", "step": 0}, {})
        # Re-putting the root itself stays idempotent; another namespace starts freely.
        a.put(cfg, first, {"source": "input", "step": -1}, {})
        sub: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": "child:1"}}
        a.put(sub, checkpoint(), {"source": "input", "step": -1}, {})
        roots = [t for t in a.list({"configurable": {"thread_id": tid}}) if t.parent_config is None]
        assert sorted(t.config["configurable"]["checkpoint_ns"] for t in roots) == ["", "child:1"]
    with ae.open_store(url) as store:
        assert ae.integrity.verify_stream(store, stream_of(tid)).ok


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_update_may_still_start_a_branch_without_parent(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A deliberate branch (source ``update``/``fork``) is not refused."""
    url = _url(backend, tmp_path, request)
    tid = f"rootu-{uuid.uuid4().hex[:8]}"
    cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
    with AresSaver.from_url(url) as a:
        a.put(cfg, checkpoint(), {"source": "input", "step": -1}, {})
        a.put(cfg, checkpoint(), {"source": "update", "step": 0}, {})


@SHARED
@pytest.mark.parametrize("backend", BACKENDS)
def test_two_async_savers_starting_one_thread_race_to_one_root(
    backend: str, shared: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """100 new threads, each started by two writers at once (two AsyncAresSavers, or one
    shared): one root each."""
    url = _url(backend, tmp_path, request)

    async def race() -> list[list[str]]:
        a = await AsyncAresSaver.from_url(url)
        b = a if shared else await AsyncAresSaver.from_url(url)
        out: list[list[str]] = []
        try:
            for _ in range(100):
                cfg: Any = {"configurable": {"thread_id": uuid.uuid4().hex, "checkpoint_ns": ""}}
                assert await a.aget_tuple(cfg) is None
                assert await b.aget_tuple(cfg) is None
                md: Any = {"source": "input", "step": -1}
                got = await asyncio.gather(
                    a.aput(cfg, checkpoint(), md, {}),
                    b.aput(cfg, checkpoint(), md, {}),
                    return_exceptions=True,
                )
                out.append(
                    sorted(
                        "lose" if isinstance(g, StaleWriteError) else type(g).__name__ for g in got
                    )
                )
        finally:
            await a.aclose()
            if b is not a:
                await b.aclose()
        return out

    assert asyncio.run(race()) == [["dict", "lose"]] * 100


class _Log(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    async def anode(state: _Log) -> _Log:
        await asyncio.sleep(0.005)
        return {"log": ["n"]}

    def node(state: _Log) -> _Log:
        return {"log": ["n"]}

    g = StateGraph(_Log)
    g.add_node("n", anode if isinstance(saver, AsyncAresSaver) else node)
    g.add_edge(START, "n")
    return g.compile(checkpointer=saver)


def _round_ok(saver: Any, graph: Any, cfg: Any, got: list[Any]) -> None:
    """One run of the round won, the other got StaleWriteError; the thread holds the
    winner's turn and has one root."""
    assert sorted(type(g).__name__ for g in got) == ["StaleWriteError", "dict"], got
    won = next(g for g in got if isinstance(g, dict))
    assert graph.get_state(cfg).values["log"] == won["log"]
    roots = [t for t in saver.list(cfg) if t.parent_config is None]
    assert len(roots) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_async_saver_serving_two_runs_of_a_new_thread(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two ``ainvoke`` of one graph through asyncio.gather on a new thread, both reading it
    empty before either writes, 20 rounds: one completes, the other is refused."""
    url = _url(backend, tmp_path, request)

    async def rounds() -> None:
        saver = await AsyncAresSaver.from_url(url)
        graph = _graph(saver)
        read = saver.aget_tuple
        try:
            for _ in range(20):
                cfg: Any = {"configurable": {"thread_id": uuid.uuid4().hex}}
                both = asyncio.Barrier(2)

                async def aget_tuple(config: Any, both: asyncio.Barrier = both) -> Any:
                    got = await read(config)
                    await asyncio.wait_for(both.wait(), 30)
                    return got

                saver.aget_tuple = aget_tuple  # type: ignore[method-assign]
                runs = [graph.ainvoke({"log": [who]}, cfg) for who in "AB"]
                got = await asyncio.gather(*runs, return_exceptions=True)
                saver.aget_tuple = read  # type: ignore[method-assign]
                await asyncio.to_thread(_round_ok, saver, graph, cfg, got)
        finally:
            await saver.aclose()

    asyncio.run(rounds())


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_saver_serving_two_threads_on_a_new_thread(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two OS threads ``invoke`` one graph on a new LangGraph thread, both reading it empty
    before either writes, 20 rounds: one completes, the other is refused."""
    url = _url(backend, tmp_path, request)
    with AresSaver.from_url(url) as saver, ThreadPoolExecutor(2) as pool:
        graph = _graph(saver)
        read = saver.get_tuple
        for _ in range(20):
            cfg: Any = {"configurable": {"thread_id": uuid.uuid4().hex}}
            both = threading.Barrier(2, timeout=30)

            def get_tuple(config: Any, both: threading.Barrier = both) -> Any:
                got = read(config)
                both.wait()
                return got

            def run(who: str, cfg: Any = cfg) -> Any:
                try:
                    return graph.invoke({"log": [who]}, cfg)
                except StaleWriteError as exc:
                    return exc

            saver.get_tuple = get_tuple  # type: ignore[method-assign]
            got = list(pool.map(run, "AB"))
            saver.get_tuple = read  # type: ignore[method-assign]
            _round_ok(saver, graph, cfg, got)


@pytest.mark.parametrize("backend", BACKENDS)
def test_time_travel_restarts_a_persistent_subgraph_as_langgraph_does(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Replayed from before its first run, a persistent subgraph starts its namespace
    again (a parentless first checkpoint in a started namespace): accepted, as by
    LangGraph's own saver."""
    url = _url(backend, tmp_path, request)
    tid = uuid.uuid4().hex

    def replay(saver: Any) -> tuple[list[str], list[str]]:
        sub = StateGraph(_Log)
        sub.add_node("s", lambda s: {"log": ["s"]})
        sub.add_edge(START, "s")
        g = StateGraph(_Log)
        g.add_node("n", lambda s: {"log": ["n"]})
        g.add_node("sub", sub.compile(checkpointer=True))
        g.add_edge(START, "n")
        g.add_edge("n", "sub")
        graph = g.compile(checkpointer=saver)
        cfg: Any = {"configurable": {"thread_id": tid}}
        graph.invoke({"log": ["A"]}, cfg)
        graph.invoke({"log": ["B"]}, cfg)
        first = [h for h in graph.get_state_history(cfg) if (h.metadata or {}).get("step") == 0][-1]
        out = graph.invoke(None, first.config)["log"]
        tip = saver.get_tuple({"configurable": {"thread_id": tid, "checkpoint_ns": "sub"}})
        return out, tip.checkpoint["channel_values"]["log"]

    with AresSaver.from_url(url) as saver:
        assert replay(saver) == replay(InMemorySaver())
