"""Two processes continue the same LangGraph checkpoint, 1,000 times: exactly one wins
each round, the other gets StaleWriteError (``is_stale_write_owner_error``), and the
thread stays one verified chain without a fork."""

from __future__ import annotations

import multiprocessing
import uuid
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.integrations.langgraph import AresSaver, stream_of
from tests.children.langgraph_fork_child import checkpoint, writer
from tests.integrations.fw_helpers import SHARED_BACKENDS, fw_url

ROUNDS = 1000


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", SHARED_BACKENDS)
def test_two_processes_never_fork_a_thread(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """1,000 rounds of two child processes putting a child of the same tip: one winner per
    round, the loser refused with the ownership error, a single verified chain."""
    url = fw_url(backend, tmp_path, request)
    tid = f"fork-{uuid.uuid4().hex[:8]}"
    with AresSaver.from_url(url) as saver:
        root = checkpoint()
        saver.put({"configurable": {"thread_id": tid, "checkpoint_ns": ""}}, root, {"step": -1}, {})
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=writer, args=(url, tid, ROUNDS, name, barrier, out))
        for name in ("a", "b")
    ]
    for p in procs:
        p.start()
    got = {name: (res, probs) for name, res, probs in (out.get(timeout=850) for _ in procs)}
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert got["a"][1] == [] and got["b"][1] == []
    a, b = got["a"][0], got["b"][0]
    assert len(a) == len(b) == ROUNDS
    wins = 0
    for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
        assert ra[1] == rb[1], f"round {i}: the writers saw different tips"
        outcomes = sorted((ra[0], rb[0]))
        assert outcomes == ["lose", "win"], f"round {i}: {outcomes}"
        winner, loser = (ra, rb) if ra[0] == "win" else (rb, ra)
        assert loser[2] == winner[2], f"round {i}: the error names another winner"
        wins += 1
    assert wins == ROUNDS
    with ae.open_store(url) as store:
        report = ae.integrity.verify_stream(store, stream_of(tid))
        assert report.ok, report.findings
    with AresSaver.from_url(url) as saver:
        tuples = list(saver.list({"configurable": {"thread_id": tid}}))
        assert len(tuples) == ROUNDS + 1
        parents = [
            t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config
        ]
        assert len(parents) == ROUNDS
        assert len(set(parents)) == ROUNDS, "a checkpoint has two children: the thread forked"


@pytest.mark.parametrize("backend", SHARED_BACKENDS)
def test_two_async_savers_never_fork_a_thread(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """200 rounds of two AsyncAresSavers (each its own store and index) putting a child of
    the same tip at once: exactly one wins, the other gets StaleWriteError."""
    import asyncio

    from ares_events.integrations.langgraph import AsyncAresSaver, StaleWriteError

    url = fw_url(backend, tmp_path, request)
    tid = f"afork-{uuid.uuid4().hex[:8]}"

    async def race() -> list[list[str]]:
        a = await AsyncAresSaver.from_url(url)
        b = await AsyncAresSaver.from_url(url)
        outcomes: list[list[str]] = []
        try:
            cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
            await a.aput(cfg, checkpoint(), {"step": -1}, {})
            for i in range(200):
                tip = await a.aget_tuple(cfg)
                assert tip is not None
                parent: Any = {
                    "configurable": {**cfg["configurable"], "checkpoint_id": tip.checkpoint["id"]}
                }
                md: Any = {"source": "loop", "step": i}
                got = await asyncio.gather(
                    a.aput(parent, checkpoint(), md, {}),
                    b.aput(parent, checkpoint(), md, {}),
                    return_exceptions=True,
                )
                outcomes.append(
                    sorted(
                        "lose" if isinstance(g, StaleWriteError) else type(g).__name__ for g in got
                    )
                )
        finally:
            await a.aclose()
            await b.aclose()
        return outcomes

    outcomes = asyncio.run(race())
    assert outcomes == [["dict", "lose"]] * 200
    with ae.open_store(url) as store:
        assert ae.integrity.verify_stream(store, stream_of(tid)).ok
