"""The savers against LangGraph's own, on what a graph or a caller sees: a list limit of 0
or less (InMemorySaver), the blocking methods of the asyncio saver (AsyncSqliteSaver),
an int thread id in the configs returned (InMemorySaver)."""

from __future__ import annotations

import asyncio
import copy
import operator
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import START, StateGraph

from ares_events.integrations.langgraph import AresSaver, AsyncAresSaver
from tests.children.langgraph_fork_child import checkpoint
from tests.integrations.fw_helpers import FW_BACKENDS, fw_url


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    builder = StateGraph(Log)
    builder.add_node("n", lambda s: {"log": ["n"]})
    builder.add_edge(START, "n")
    return builder.compile(checkpointer=saver)


def _cfg(tid: Any) -> Any:
    return {"configurable": {"thread_id": tid}}


@pytest.mark.parametrize("backend", FW_BACKENDS)
def test_list_limit_of_zero_or_less_gives_what_in_memory_saver_gives(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``list``/``alist``/``get_state_history`` with limit 0 or -1 give nothing, as
    InMemorySaver; positive limits and none give the same counts too."""
    url = fw_url(backend, tmp_path, request)
    tid = f"lim-{uuid.uuid4().hex[:8]}"
    limits = (-1, 0, 1, 2, None)

    def counts(saver: Any) -> list[tuple[int, int, int]]:
        graph = _graph(saver)
        for _ in range(2):
            graph.invoke({"log": []}, _cfg(tid))
        return [
            (
                len(list(graph.get_state_history(_cfg(tid), limit=n))),
                len(list(saver.list(_cfg(tid), limit=n))),
                len(list(saver.list(None, limit=n))),
            )
            for n in limits
        ]

    async def async_counts() -> list[int]:
        async with await AsyncAresSaver.from_url(url) as saver:
            return [len([t async for t in saver.alist(_cfg(tid), limit=n)]) for n in limits]

    expected = counts(InMemorySaver())
    assert expected[:2] == [(0, 0, 0)] * 2
    with AresSaver.from_url(url) as saver:
        assert counts(saver) == expected
    assert asyncio.run(async_counts()) == [c[1] for c in expected]


@pytest.mark.parametrize("backend", FW_BACKENDS)
def test_int_thread_id_comes_back_as_given_as_in_memory_saver(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An int thread id stays an int in every config ``put``, ``get_tuple`` and ``list``
    return (and in their parent configs), as InMemorySaver returns it."""
    url = fw_url(backend, tmp_path, request)
    tid = uuid.uuid4().int % 10**12
    cps = [checkpoint() for _ in range(2)]

    def configs(saver: Any) -> list[Any]:
        out: list[Any] = []
        cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        for i, cp in enumerate(cps):
            cfg = saver.put(cfg, copy.deepcopy(cp), {"source": "loop", "step": i}, {})
            out.append(cfg)
        saver.put_writes(cfg, [("log", "w")], "task-1")
        for got in (saver.get_tuple(_cfg(tid)), saver.get_tuple(cfg), *saver.list(_cfg(tid))):
            out.append((got.config, got.parent_config))
        return out

    expected = configs(InMemorySaver())
    assert expected[0]["configurable"]["thread_id"] == tid
    with AresSaver.from_url(url) as saver:
        assert configs(saver) == expected


def _blocking_from_a_worker(graph: Any, saver: Any, tid: str) -> list[Any]:
    """What a blocking caller in another thread sees: state, history, an update (put and
    put_writes), a whole run, then a delete."""
    cfg = _cfg(tid)
    out: list[Any] = [graph.get_state(cfg).values]
    out.append([s.metadata["step"] for s in graph.get_state_history(cfg)])
    graph.update_state(cfg, {"log": ["u"]})
    out.append(graph.invoke({"log": ["y"]}, cfg))
    out.append(len(list(saver.list(cfg, limit=2))))
    saver.delete_thread(tid)
    out.append(saver.get_tuple(cfg))
    return out


@pytest.mark.parametrize("backend", FW_BACKENDS)
def test_blocking_methods_run_on_the_saver_loop_as_async_sqlite_saver(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A graph driven through the blocking methods of the asyncio saver from a worker
    thread gives what AsyncSqliteSaver gives; on the loop's own thread they raise
    asyncio.InvalidStateError, as AsyncSqliteSaver's do (its put would wait forever)."""
    url = fw_url(backend, tmp_path, request)

    async def run(saver: Any) -> list[Any]:
        tid = f"blk-{uuid.uuid4().hex[:8]}"
        graph = _graph(saver)
        await graph.ainvoke({"log": ["x"]}, _cfg(tid))
        got = await asyncio.to_thread(_blocking_from_a_worker, graph, saver, tid)
        await graph.ainvoke({"log": ["z"]}, _cfg(tid))
        for call in (
            lambda: saver.get_tuple(_cfg(tid)),
            lambda: list(saver.list(_cfg(tid))),
            lambda: saver.get_delta_channel_history(config=_cfg(tid), channels=["log"]),
            lambda: saver.delete_thread(tid),
        ):
            with pytest.raises(asyncio.InvalidStateError, match="different thread"):
                call()
        return got

    async def main() -> tuple[list[Any], list[Any]]:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "lg.db")) as sq:
            expected = await run(sq)
        async with await AsyncAresSaver.from_url(url) as saver:
            got = await run(saver)
            cfg: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
            for call in (
                lambda: saver.put(cfg, checkpoint(), {"source": "input", "step": -1}, {}),
                lambda: saver.put_writes(cfg, [("log", "w")], "task-1"),
                lambda: saver.copy_thread("t", "t2"),
                lambda: saver.prune(["t"]),
                lambda: saver.delete_for_runs(["run"]),
            ):
                with pytest.raises(asyncio.InvalidStateError, match="different thread"):
                    call()
        return expected, got

    expected, got = asyncio.run(main())
    assert got == expected
    assert expected[-1] is None and expected[2] == {"log": ["x", "n", "u", "y", "n"]}


@pytest.mark.parametrize("backend", FW_BACKENDS)
def test_every_blocking_method_of_the_async_saver_works_from_a_worker(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The blocking methods AsyncSqliteSaver lacks (copy, prune, delete for runs) run on
    the saver's loop too, and give what the a-methods give; with no running loop (the
    loop that used the saver ended) a call says so."""
    url = fw_url(backend, tmp_path, request)
    tid = f"all-{uuid.uuid4().hex[:8]}"

    def work(saver: AsyncAresSaver) -> list[int]:
        cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        for i in range(3):
            md: Any = {"source": "loop", "step": i, "run_id": f"run-{i}"}
            cfg = saver.put(cfg, checkpoint(), md, {})
        saver.copy_thread(tid, tid + "-copy")
        saver.prune([tid], keep_last=2)
        saver.delete_for_runs(["run-2"])
        return [len(list(saver.list(_cfg(t)))) for t in (tid, tid + "-copy")]

    async def main() -> tuple[AsyncAresSaver, list[int]]:
        async with await AsyncAresSaver.from_url(url) as saver:
            return saver, await asyncio.to_thread(work, saver)

    saver, counts = asyncio.run(main())
    assert counts == [1, 2]
    with pytest.raises(asyncio.InvalidStateError, match="none is running"):
        saver.get_tuple(_cfg(tid))


@pytest.mark.parametrize("backend", ["memory", "sqlite"])  # an asyncio pool keeps its loop
def test_blocking_methods_follow_the_loop_that_uses_the_saver(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A saver built on one event loop and used on another runs its blocking methods on
    the one that uses it (the first has ended)."""
    url = fw_url(backend, tmp_path, request)
    saver = asyncio.run(AsyncAresSaver.from_url(url))

    async def use() -> Any:
        graph = _graph(saver)
        await graph.ainvoke({"log": ["x"]}, _cfg("later"))
        return (await asyncio.to_thread(graph.get_state, _cfg("later"))).values

    try:
        assert asyncio.run(use()) == {"log": ["x", "n"]}
    finally:
        asyncio.run(saver.aclose())


def test_blocking_method_errors_name_the_method_called(tmp_path: Path) -> None:
    """On the loop's thread, and once the saver's loop has ended, the error names the method
    the caller used (``list`` too, which runs one item at a time)."""

    async def main() -> AsyncAresSaver:
        async with await AsyncAresSaver.from_url(f"sqlite:///{tmp_path}/s.db") as saver:
            for call, name in (
                (lambda: saver.get_tuple(_cfg("t")), "get_tuple"),
                (lambda: list(saver.list(_cfg("t"))), "list"),
            ):
                with pytest.raises(asyncio.InvalidStateError) as err:
                    call()
                assert f"await checkpointer.a{name}(...)" in str(err.value)
            return saver

    saver = asyncio.run(main())
    for call, name in (
        (lambda: saver.get_tuple(_cfg("t")), "get_tuple"),
        (lambda: list(saver.list(_cfg("t"))), "list"),
    ):
        with pytest.raises(asyncio.InvalidStateError) as err:
            call()
        assert f"AsyncAresSaver.{name} runs on the saver's event loop" in str(err.value)
