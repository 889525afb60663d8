"""A new LangGraph thread cannot fork at its root: the first parentless checkpoint of a
namespace is appended only while the namespace is empty (issue 22)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.integrations.langgraph import (
    AresSaver,
    AsyncAresSaver,
    StaleWriteError,
    stream_of,
)
from tests.children.langgraph_fork_child import checkpoint

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/root.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_writers_starting_one_thread_get_one_root(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = _url(backend, tmp_path, request)
    tid = f"root-{uuid.uuid4().hex[:8]}"
    cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
    with AresSaver.from_url(url) as a, AresSaver.from_url(url) as b:
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


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_async_savers_starting_one_thread_race_to_one_root(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """100 new threads, each started by two AsyncAresSavers at once: one root each."""
    url = _url(backend, tmp_path, request)

    async def race() -> list[list[str]]:
        a = await AsyncAresSaver.from_url(url)
        b = await AsyncAresSaver.from_url(url)
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
            await b.aclose()
        return out

    assert asyncio.run(race()) == [["dict", "lose"]] * 100
