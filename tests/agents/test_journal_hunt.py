"""Journal bugs found by a hunt: replies it cannot record, streams that are not runs,
snapshots that cannot be taken after a commit, and re-entrant use (real SQLite files)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.journal import (
    AsyncJournal,
    Journal,
    ModelReply,
    ReentrantCall,
    RunNotFound,
)
from ares_events.agents.journal_errors import journal_error_in
from ares_events.agents.supervision import record_start
from ares_events.core.store import EventStore
from ares_events.errors import InvalidEvent

ASK = [{"role": "user", "content": "q"}]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[EventStore]:
    s = ae.open_store(f"sqlite:///{tmp_path}/s.db")
    try:
        yield s
    finally:
        s.close()


def _types(store: EventStore, stream: str) -> list[str]:
    return [e.type for e in store.read(stream)]


# -- 1. a reply the journal cannot record ------------------------------------------------

UNRECORDABLE: dict[str, Any] = {
    "set": {"a", "b"},
    "tuple": ("first", "second"),
    "none_usage": ModelReply("ok", None),  # type: ignore[arg-type]  # what a client may do
    "int_usage": {"completion": "ok", "usage": 7},
}


@pytest.mark.parametrize("case", sorted(UNRECORDABLE))
def test_unrecordable_reply_is_a_failed_attempt_paid_once(store: EventStore, case: str) -> None:
    """A reply that cannot be recorded raises InvalidEvent, is recorded as a failed
    attempt, and a re-run replays that failure instead of paying the call again."""
    paid: list[int] = []

    def llm(messages: Any, params: Mapping[str, Any]) -> Any:
        paid.append(1)
        return UNRECORDABLE[case]

    def loop(j: Journal) -> str:
        try:
            out = j.model_call(ASK, call=llm)
        except InvalidEvent as exc:
            out = f"fallback after {type(exc).__name__}"
        j.patch("out", out)
        return str(out)

    for _ in range(3):
        out = loop(Journal(store, "run-x"))
        assert out == "fallback after InvalidEvent"
    assert paid == [1]
    types = _types(store, "run-x")
    assert types[:4] == [
        "run.started",
        "model.call.requested",
        "model.call.failed",
        "step.abandoned",
    ]
    assert "model.responded" not in types
    failed = next(e for e in store.read("run-x") if e.type == "model.call.failed")
    assert failed.payload["step"] == 1 and failed.payload["attempt"] == 1
    assert failed.payload["error_type"] == "InvalidEvent"
    step = Journal.inspect(store, "run-x").steps[0]
    assert (step.kind, step.status) == ("model", "abandoned")


def test_unrecordable_reply_names_the_problem(store: EventStore) -> None:
    """The InvalidEvent of a bad usage names the usage and its type."""
    j = Journal(store, "run-u")
    with pytest.raises(InvalidEvent, match=r"usage.*mapping.*got str") as info:
        j.model_call(ASK, call=lambda m, p: ("first", "second"))
    assert info.value.field == "usage"
    with pytest.raises(InvalidEvent, match="completion"):
        j.model_call(ASK, call=lambda m, p: {"a", "b"})  # the retry of the same step
    assert j.stats.model_attempts_failed == 2 and j.stats.model_calls_made == 0


def test_a_failed_attempt_with_a_bad_reply_is_retried_live(store: EventStore) -> None:
    """A loop that retries after an unrecordable reply gets a new attempt of the same
    step, and the good answer is then recorded."""
    replies: list[Any] = [{"a"}, ModelReply("fine", {"total_tokens": 3})]
    j = Journal(store, "run-r")
    with pytest.raises(InvalidEvent):
        j.model_call(ASK, call=lambda m, p: replies.pop(0))
    assert j.model_call(ASK, call=lambda m, p: replies.pop(0)) == "fine"
    assert (j.position, j.attempt) == (1, 2)
    assert Journal(store, "run-r").model_call(ASK, call=lambda m, p: 1 / 0) == "fine"


def test_params_not_a_mapping_is_invalid_event_and_writes_nothing(store: EventStore) -> None:
    """model_call with params that are not a mapping raises InvalidEvent; nothing is written."""
    j = Journal(store, "run-p")
    before = store.stream_version("run-p")
    with pytest.raises(InvalidEvent, match=r"params.*mapping.*got list"):
        j.model_call(ASK, [1, 2], call=lambda m, p: "x")  # type: ignore[arg-type]
    assert store.stream_version("run-p") == before
    assert j.position == 0


# -- 2. a stream that is not a run ---------------------------------------------------------


@pytest.mark.parametrize("gate", ["strict", "migrate"])
def test_journal_on_a_stream_that_is_not_a_run(store: EventStore, gate: str) -> None:
    """Opening a Journal on a supervisor's stream raises RunNotFound and writes nothing."""
    record_start(store, "agent-7", "i-1")
    before = _types(store, "agent-7")
    g = ae.agents.journal.migrating_gate if gate == "migrate" else ae.agents.journal.strict_gate
    with pytest.raises(RunNotFound, match=r"not a run.*agent\.started") as info:
        Journal(store, "agent-7", gate=g)
    assert info.value.run_id == "agent-7"
    assert _types(store, "agent-7") == before


def test_journal_on_a_stream_whose_first_event_is_not_run_started(store: EventStore) -> None:
    """Any stream whose first event is not run.started is refused, even when a
    run.started follows later; the stream is unchanged."""
    store.append("mixed", [ae.NewEvent(type="note", module="m", payload={})], expected_version=0)
    store.append(
        "mixed",
        [ae.NewEvent(type="run.started", module="journal", payload={"code_revision": "x"})],
        expected_version=1,
    )
    with pytest.raises(RunNotFound):
        Journal(store, "mixed")
    assert store.stream_version("mixed") == 2


def test_async_journal_on_a_stream_that_is_not_a_run(store: EventStore) -> None:
    """The asyncio face refuses a stream that is not a run the same way."""
    record_start(store, "agent-8", "i-1")
    with pytest.raises(RunNotFound):
        asyncio.run(AsyncJournal.open(store, "agent-8"))
    assert _types(store, "agent-8") == ["agent.started"]


# -- 3. a snapshot that cannot be taken after the commit -----------------------------------


@pytest.mark.parametrize("big", [{"x": 2**63 - 1}, {"cost": 1.7e308}], ids=["int", "float"])
def test_unencodable_snapshot_does_not_fail_a_committed_append(
    store: EventStore, big: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Usage sums that overflow the state's encoding skip the snapshot with a warning;
    complete() returns normally and a re-run replays from the log."""
    paid: list[int] = []

    def llm(messages: Any, params: Mapping[str, Any]) -> ModelReply:
        paid.append(1)
        return ModelReply("ok", big)

    def loop(j: Journal) -> None:
        for i in range(3):
            j.model_call([{"role": "user", "content": f"q{i}"}], call=llm)
        j.complete()

    with caplog.at_level(logging.WARNING, logger="ares_events.agents.journal"):
        j = Journal(store, "run-u", snapshot_every=4)
        loop(j)
    assert j.status == "completed"
    assert _types(store, "run-u")[-1] == "run.completed"
    assert any("snapshot at version 8 skipped" in r.getMessage() for r in caplog.records)
    again = Journal(store, "run-u", snapshot_every=4)
    loop(again)
    assert again.status == "completed" and paid == [1, 1, 1]
    assert ae.integrity.verify_stream(store, "run-u").ok


# -- 10. re-entrant use ---------------------------------------------------------------------


def test_reentrant_model_call_from_a_tool_is_refused(store: EventStore) -> None:
    """A tool that calls its own journal gets ReentrantCall before anything is written
    for the nested call; the tool's failure is recorded under its own step."""
    paid: list[int] = []

    def llm(messages: Any, params: Mapping[str, Any]) -> str:
        paid.append(1)
        return "summary"

    def loop(j: Journal) -> Any:
        def tool(args: Any, key: str) -> Any:
            s = j.model_call(ASK, call=llm)
            raise AssertionError(f"not reached: {s}")

        try:
            r = j.tool_call("create", {"x": 1}, call=tool)
        except ReentrantCall as exc:
            r = f"gave up: {exc}"  # replayed, the message is the recorded one
        j.patch("r", r)
        j.complete()
        return r

    first = loop(Journal(store, "run-r"))
    assert first.startswith("gave up: run 'run-r': model_call was called while the tool 'create'")
    assert paid == []
    events = list(store.read("run-r"))
    assert [e.type for e in events] == [
        "run.started",
        "tool.call.requested",
        "tool.call.failed",
        "step.abandoned",
        "state.patched",
        "run.completed",
    ]
    failed = events[2].payload
    assert (failed["step"], failed["error_type"]) == (1, "ReentrantCall")
    # The run replays: the recorded failure is raised again, no divergence.
    assert loop(Journal(store, "run-r")) == first


@pytest.mark.parametrize("nested", ["tool_call", "patch", "complete"])
def test_every_step_is_refused_inside_a_callable(store: EventStore, nested: str) -> None:
    """tool_call, patch and complete from inside a model callable raise ReentrantCall;
    the model attempt is recorded as failed under its own step."""
    j = Journal(store, "run-n")

    def llm(messages: Any, params: Mapping[str, Any]) -> str:
        if nested == "tool_call":
            j.tool_call("t", {}, call=lambda a, k: 1)
        elif nested == "patch":
            j.patch("k", 1)
        else:
            j.complete()
        return "x"

    with pytest.raises(ReentrantCall, match="not re-entrant") as info:
        j.model_call(ASK, call=llm)
    assert info.value.step == 1 and info.value.inside == "model call"
    wrapped = RuntimeError("a framework's wrapper")
    wrapped.__cause__ = info.value
    assert journal_error_in(wrapped) is info.value  # an adapter surfaces it
    assert _types(store, "run-n") == ["run.started", "model.call.requested", "model.call.failed"]
    # Not stuck: after the callable, the journal takes steps again.
    assert j.model_call(ASK, call=lambda m, p: "y") == "y"


def test_async_reentrant_tool_call_is_refused(store: EventStore) -> None:
    """The asyncio face refuses a nested call from a coroutine tool the same way."""

    async def main() -> list[str]:
        j = await AsyncJournal.open(store, "run-a")

        async def tool(args: Any, key: str) -> Any:
            return await j.model_call(ASK, call=lambda m, p: "s")

        with pytest.raises(ReentrantCall):
            await j.tool_call("create", {}, call=tool)
        await j.complete()
        return _types(store, "run-a")

    assert asyncio.run(main()) == [
        "run.started",
        "tool.call.requested",
        "tool.call.failed",
        "step.abandoned",
        "run.completed",
    ]


def test_tasks_sharing_a_journal_take_steps_one_at_a_time(store: EventStore) -> None:
    """Two tasks gathering tool calls on one journal (a model's parallel tool calls): the
    second is refused while the first's tool runs, with a message that names sharing, and
    nothing of it is written; the first's step is whole. Taken one after another, both
    are journaled in order."""

    async def main() -> list[Any]:
        j = await AsyncJournal.open(store, "run-p")
        running, release = asyncio.Event(), asyncio.Event()

        async def slow(args: Any, key: str) -> Any:
            running.set()
            await release.wait()  # held until the other task has been refused
            return {"n": args["n"]}

        async def second() -> Any:
            await running.wait()
            try:
                return await j.tool_call("search", {"n": 2}, call=slow)
            finally:
                release.set()

        results: list[Any] = list(
            await asyncio.gather(
                j.tool_call("search", {"n": 1}, call=slow), second(), return_exceptions=True
            )
        )
        for n in (3, 4):  # the way to journal parallel calls: one step after another
            release.set()
            results.append(await j.tool_call("search", {"n": n}, call=slow))
        await j.complete()
        return results

    first, refused, third, fourth = asyncio.run(main())
    assert first == {"n": 1} and third == {"n": 3} and fourth == {"n": 4}
    assert isinstance(refused, ReentrantCall)
    assert "tasks must not share one" in str(refused) and refused.step == 1
    requested = [e for e in store.read("run-p") if e.type == "tool.call.requested"]
    assert [e.payload["args"]["n"] for e in requested] == [1, 3, 4]
    assert _types(store, "run-p")[-1] == "run.completed"
