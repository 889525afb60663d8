"""A blocking function handed a store on the asyncio face says so at once, naming itself and
what to use instead, and touches nothing. Before, it failed far from the call (``cannot
unpack non-iterable coroutine object``, a coroutine never awaited), or, like
``MerkleLog(...).size()``, answered about nothing."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents import demo, runs, supervision
from ares_events.archive.job import archive
from ares_events.archive.retention import retire
from ares_events.core.store_async import aemit
from ares_events.integrations.langgraph import AresSaver, AsyncAresSaver
from ares_events.integrations.langgraph_approvals import ApprovalGate
from ares_events.integrations.pydantic_ai import AresMessageStore
from ares_events.integrity import anchors
from ares_events.integrity.notes import SigningKey
from ares_events.projections import AgentStateProjection
from ares_events.records import export_record
from ares_events.stores.blobs import gc_blobs

STREAM = "agent-1"
CONFIG: Any = {"configurable": {"thread_id": "t-1", "checkpoint_ns": ""}}
PROJ = AgentStateProjection()
VKEY = SigningKey.generate("alice").verifier

CALLS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "erase": ("ae.erase", lambda s: ae.erase(s, STREAM, 1, reason="r", by="b")),
    "recover": ("ae.arecover", lambda s: ae.recover(s, STREAM, PROJ)),
    "replay": ("ae.areplay", lambda s: ae.replay(s, STREAM, lambda st, e: st, {})),
    "snapshot": ("ae.asnapshot", lambda s: ae.snapshot(s, STREAM, PROJ)),
    "Snapshotter": ("AsyncSnapshotter", lambda s: ae.Snapshotter(s, [PROJ])),
    "Journal": ("ae.AsyncJournal", lambda s: ae.Journal(s, "run-1")),
    "verify_stream": ("averify_stream", lambda s: ae.integrity.verify_stream(s, STREAM)),
    "audit": ("ae.integrity.audit", ae.integrity.audit),
    "MerkleLog": ("ae.MerkleLog", lambda s: ae.MerkleLog(s).size()),
    "archive": ("archive", lambda s: archive(s, "file:///nowhere", before=1)),
    "retire": ("retire", lambda s: retire(s, before=1, reason="r", by="b")),
    "export_record": (
        "export_record",
        lambda s: export_record(s, STREAM, key=SigningKey.generate("k")),
    ),
    "gc_blobs": ("gc_blobs", lambda s: gc_blobs(s, timedelta(0))),
    "ProjectionRunner": ("ProjectionRunner", lambda s: ae.projections.ProjectionRunner(s, [PROJ])),
    "rebuild": ("ae.projections.rebuild", lambda s: ae.projections.rebuild(s, PROJ)),
    "verify_rebuild": ("verify_rebuild", lambda s: ae.projections.verify_rebuild(s, PROJ)),
    "read_model": ("read_model", lambda s: ae.projections.read_model(s, PROJ, STREAM)),
    "ProcessSupervisor": ("ProcessSupervisor", supervision.ProcessSupervisor),
    "inspect_run": ("runs_async", lambda s: runs.inspect_run(s, "run-1")),
    "list_runs": ("runs_async", runs.list_runs),
    "cancel_run": ("runs_async", lambda s: runs.cancel_run(s, "run-1", by="b")),
    "resume_run": ("runs_async", lambda s: runs.resume_run(s, "run-1", by="b")),
    "resolve_step": (
        "runs_async",
        lambda s: runs.resolve_step(s, "run-1", 1, not_done=True, by="b"),
    ),
    "pending_call": ("runs_async", lambda s: runs.pending_call(s, "run-1")),
    "approval_request": ("runs_async", lambda s: runs.approval_request(s, "run-1")),
    "emit": ("store_async.aemit", lambda s: ae.emit(s, STREAM, "t", "m", {"n": 2})),
    "record_start": ("agents.supervision ", lambda s: supervision.record_start(s, STREAM, "i")),
    "record_stop": ("agents.supervision ", lambda s: supervision.record_stop(s, STREAM, "done")),
    "AresSaver": ("AsyncAresSaver", AresSaver),
    # what an AsyncAresSaver user has at hand: its asyncio store
    "ApprovalGate": ("ApprovalGate", lambda s: ApprovalGate(s, approvers=[VKEY])),
    # new_run_id looped for ever on coroutines, each one taken for a stream that exists
    "new_run_id": ("demo.new_run_id", lambda s: demo.new_run_id(s, 2)),
    "run_demo": ("demo.run_demo", lambda s: demo.run_demo(s, agents=1)),
    "check_anchors": ("check_anchors", lambda s: anchors.check_anchors(s, "file:///nowhere")),
    "verify_anchors": ("verify_anchors", lambda s: anchors.verify_anchors(s, "file:///nowhere")),
    "AresMessageStore": ("AsyncAresMessageStore", lambda s: AresMessageStore(store=s)),
}


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_blocking_function_refuses_an_asyncio_store_and_writes_nothing(
    name: str, tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    named, call = CALLS[name]
    db = tmp_path / "a.db"

    async def opened() -> ae.AsyncEventStore:
        store = await ae.open_async_store(f"sqlite:///{db}")
        await store.append(STREAM, [ae.NewEvent(module="m", type="t", payload={"n": 1})])
        return store

    store = loop.run_until_complete(opened())
    try:
        with warnings.catch_warnings(record=True) as caught, pytest.raises(TypeError) as err:
            warnings.simplefilter("always")
            call(store)
        assert [str(w.message) for w in caught] == []  # no coroutine left unawaited
        text = str(err.value)
        assert "asyncio store (AsyncEventStore)" in text, text
        assert named in text, text
        assert "ae.open_store" in text, text
    finally:
        loop.run_until_complete(store.close())
    with ae.open_store(f"sqlite:///{db}") as again:
        assert [e.version for e in again.read(STREAM)] == [1]
        assert [e.stream_id for e in again.read_all()] == [STREAM]  # nothing appended


def test_the_blocking_face_still_takes_a_blocking_store(tmp_path: Path) -> None:
    with ae.open_store(f"sqlite:///{tmp_path / 'b.db'}") as store:
        store.append(STREAM, [ae.NewEvent(module="m", type="t", payload={"n": 1})])
        assert ae.integrity.verify_stream(store, STREAM).ok
        assert ae.replay(store, STREAM, lambda st, e: st + 1, 0).state == 1


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("aemit", lambda s: aemit(s, STREAM, "t", "m", {"n": 1})),
        ("AsyncAresSaver", lambda s: AsyncAresSaver(s).aget_tuple(CONFIG)),
    ],
)
def test_an_asyncio_only_function_refuses_a_blocking_store_before_it_writes(
    name: str, call: Callable[[Any], Any], tmp_path: Path, loop: asyncio.AbstractEventLoop
) -> None:
    """A blocking store's calls would run at once and the ``await`` on their result fail:
    an event written under an error, and written again by the caller's retry."""
    with ae.open_store(f"sqlite:///{tmp_path / 'c.db'}") as store:
        with pytest.raises(TypeError) as err:
            loop.run_until_complete(call(store))
        assert f"{name} is for asyncio stores" in str(err.value), err.value
        assert list(store.read_all()) == []
