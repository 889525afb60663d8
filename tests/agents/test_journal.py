"""The durable run journal: write-ahead steps, resume without re-paying, kill -9 at every
step boundary, in-doubt tool calls, interrupts across processes, the version gate,
fencing, the asyncio twin, and the runnable example of docs/guide-journal.md.

Crash tests run ``tests/children/journal_child.py`` as a real subprocess that SIGKILLs itself at a
chosen point; the fake services it talks to keep their own SQLite file, which is what
the assertions read.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.journal import (
    AsyncJournal,
    InDoubtToolCall,
    Journal,
    ModelReply,
    ReplayDivergence,
    RunNotRunnable,
    RunRefused,
    migrating_gate,
    strict_gate,
)
from ares_events.errors import ConcurrencyError
from tests.children import journal_child as child
from tests.fixtures.fix_backends import store_url_for

CHILD = Path(__file__).resolve().parents[1] / "children" / "journal_child.py"
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-journal.md"
TIMEOUT = 120  # seconds; only to turn a hang into a failure

# The events of one clean run of journal_child (flow=basic), in order.
CLEAN_RUN = [
    "run.started",
    "model.call.requested",
    "model.responded",
    "tool.call.requested",
    "tool.returned",
    "state.patched",
    "model.call.requested",
    "model.responded",
    "run.completed",
]


# -- helpers ------------------------------------------------------------------------------


class CountingLLM:
    """A fake model that counts its calls; the reply depends on the call number."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def __call__(self, messages: Any, params: Mapping[str, Any]) -> ModelReply:
        self.calls.append(messages)
        n = len(self.calls)
        return ModelReply(
            {"text": f"reply {n}: {messages[-1]['content']}"},
            {"prompt_tokens": 7 * n, "completion_tokens": 3, "total_tokens": 7 * n + 3},
        )


def agent_loop(journal: Journal, llm: Any, steps: int, *, topic: str = "tides") -> list[Any]:
    """A deterministic loop of ``steps`` model calls, each fed the previous answer."""
    answers: list[Any] = []
    last = "nothing yet"
    for i in range(1, steps + 1):
        msgs = [{"role": "user", "content": f"{topic} part {i}; so far: {last}"}]
        answer = journal.model_call(msgs, {"temperature": 0}, call=llm)
        answers.append(answer)
        last = answer["text"]
        journal.patch("progress", i)
    return answers


def types(store: ae.EventStore, run_id: str) -> list[str]:
    """Event types of a run, in order."""
    return [e.type for e in store.read(run_id)]


def events_of(store: ae.EventStore, run_id: str, type_: str) -> list[ae.RecordedEvent]:
    """The run's events of one type."""
    return [e for e in store.read(run_id) if e.type == type_]


def run_child(
    url: str, services: Path, run_id: str, *args: str, killed: bool = False
) -> dict[str, Any]:
    """Run journal_child once; assert it was SIGKILLed (``killed``) or exited 0."""
    proc = subprocess.run(
        [sys.executable, str(CHILD), "--services", str(services), "--run-id", run_id, *args],
        env=dict(os.environ, ARES_STORE_URL=url),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if killed:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
        return {}
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def query(services: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows from the fake services' own database."""
    conn = sqlite3.connect(services)
    try:
        return list(conn.execute(sql, args))
    finally:
        conn.close()


def side_effects(services: Path, run_id: str) -> list[tuple[str, int]]:
    """(title, count) of real ticket side effects of a run."""
    return [
        (str(t), int(n))
        for t, n in query(
            services,
            "SELECT title, count(*) FROM side_effects WHERE run = ? GROUP BY title",
            run_id,
        )
    ]


def invocations(services: Path, run_id: str) -> list[str]:
    """Idempotency keys the ticketing tool was invoked with, in order."""
    return [
        str(k)
        for (k,) in query(
            services, "SELECT key FROM tool_invocations WHERE run = ? ORDER BY rowid", run_id
        )
    ]


def model_calls_by_content(services: Path, run_id: str) -> dict[str, int]:
    """How many times the fake LLM was called for each last-message content."""
    rows = query(
        services,
        "SELECT content, count(*) FROM model_calls WHERE run = ? GROUP BY content",
        run_id,
    )
    return {str(c): int(n) for c, n in rows}


def open_journal(store: ae.EventStore, run_id: str, **kw: Any) -> Journal:
    """Reopen the child's run under the child's code revision and prompt hash."""
    return Journal(
        store, run_id, code_revision=child.CODE_REVISION, prompt_hash=child.PROMPT_HASH, **kw
    )


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file store URL."""
    return f"sqlite:///{tmp_path / 'events.db'}"


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL that several processes can open (SQLite file or PostgreSQL)."""
    return store_url_for(str(request.param), tmp_path, request)


@pytest.fixture
def services(tmp_path: Path) -> Path:
    """Path of the fake services' SQLite file."""
    return tmp_path / "services.db"


@pytest.fixture
def opened() -> Iterator[list[ae.EventStore]]:
    """Stores opened by a test, closed at teardown."""
    stores: list[ae.EventStore] = []
    yield stores
    for s in stores:
        s.close()


def open_url(opened: list[ae.EventStore], url: str) -> ae.EventStore:
    """Open a store and register it for closing."""
    s = ae.open_store(url)
    opened.append(s)
    return s


# -- 1. write-ahead and resume without re-paying --------------------------------------------


def test_each_intention_is_durable_before_the_call_and_outcome_before_return(
    store: ae.EventStore,
) -> None:
    """The model and the tool are called only after their request event is stored, and the
    caller gets the answer only after the outcome event is stored."""
    j = Journal(store, "run-wa")
    seen: list[str] = []

    def model(messages: Any, params: Mapping[str, Any]) -> ModelReply:
        seen.append(types(store, "run-wa")[-1])
        return ModelReply("the answer", {"total_tokens": 4})

    def tool(args: Any, key: str) -> str:
        last = list(store.read("run-wa"))[-1]
        seen.append(last.type)
        assert last.payload["idempotency_key"] == key == "run-wa:2"
        return "done"

    assert j.model_call([{"role": "user", "content": "q"}], call=model) == "the answer"
    last = list(store.read("run-wa"))[-1]
    assert (last.type, last.payload["completion"]) == ("model.responded", "the answer")
    assert j.tool_call("t", {"a": 1}, call=tool) == "done"
    last = list(store.read("run-wa"))[-1]
    assert (last.type, last.payload["result"]) == ("tool.returned", "done")
    assert seen == ["model.call.requested", "tool.call.requested"]


def test_resume_returns_recorded_completions_without_calling(store: ae.EventStore) -> None:
    """A reopened run answers its recorded steps from the log: the model is not called,
    the completions are exactly those of the first run, the tokens are counted as saved."""
    first = CountingLLM()
    j1 = Journal(store, "run-r", code_revision="r1", prompt_hash="p1")
    answers1 = agent_loop(j1, first, 3)
    assert len(first.calls) == 3 and j1.stats.model_calls_made == 3
    del j1  # the incarnation is gone; the log is not

    again = CountingLLM()
    j2 = Journal(store, "run-r", code_revision="r1", prompt_hash="p1")
    assert j2.resumed and j2.status == "running"
    answers2 = agent_loop(j2, again, 3)
    assert again.calls == []
    assert answers2 == answers1
    assert j2.stats.model_calls_from_log == 3
    assert j2.stats.model_calls_made == 0
    assert j2.stats.tokens_from_log == (7 + 3) + (14 + 3) + (21 + 3)
    assert j2.patched == {"progress": 3}
    # A new step beyond the log is a real call again.
    answers3 = agent_loop(Journal(store, "run-r", code_revision="r1", prompt_hash="p1"), again, 4)
    assert len(again.calls) == 1 and answers3[:3] == answers1
    assert types(store, "run-r").count("model.responded") == 4
    assert ae.integrity.verify_stream(store, "run-r").ok


def test_replay_with_different_messages_raises_divergence(store: ae.EventStore) -> None:
    """A replayed loop that sends other messages at a recorded step gets ReplayDivergence,
    and the model is not called."""
    agent_loop(Journal(store, "run-d"), CountingLLM(), 2)
    llm = CountingLLM()
    with pytest.raises(ReplayDivergence) as ei:
        agent_loop(Journal(store, "run-d"), llm, 2, topic="volcanoes")
    assert ei.value.step == 1 and ei.value.run_id == "run-d"
    assert llm.calls == []


def test_replay_with_another_tool_at_a_recorded_step_raises_divergence(
    store: ae.EventStore,
) -> None:
    """A different tool name at a recorded tool step is a divergence, not a new call."""
    Journal(store, "run-dt").tool_call("send_mail", {"to": "x"}, call=lambda a, k: "sent")
    called: list[str] = []

    def delete_all(args: Any, key: str) -> str:
        called.append(key)
        return "gone"

    with pytest.raises(ReplayDivergence):
        Journal(store, "run-dt").tool_call("delete_all", {}, call=delete_all)
    assert called == []


def test_model_call_accepts_every_documented_reply_shape(store: ae.EventStore) -> None:
    """A call may return a ModelReply, a (completion, usage) tuple, a dict with completion
    and usage, or a bare completion; each is recorded with its usage."""
    j = Journal(store, "run-shapes")
    replies: list[Any] = [
        ModelReply("a", {"total_tokens": 5}),
        ("b", {"prompt_tokens": 2, "completion_tokens": 4}),
        {"completion": "c", "usage": {"total_tokens": 9}},
        "d",
    ]

    def replying(reply: Any) -> Any:
        return lambda messages, params: reply

    got = [j.model_call([{"n": i}], call=replying(r)) for i, r in enumerate(replies)]
    assert got == ["a", "b", "c", "d"]
    usages = [e.payload["usage"] for e in events_of(store, "run-shapes", "model.responded")]
    assert usages == [
        {"total_tokens": 5},
        {"prompt_tokens": 2, "completion_tokens": 4},
        {"total_tokens": 9},
        {},
    ]
    j2 = Journal(store, "run-shapes")
    for i in range(4):
        j2.model_call([{"n": i}], call=lambda m, p: pytest.fail("called on replay"))
    assert j2.stats.tokens_from_log == 5 + 6 + 9


def test_a_tool_error_is_a_failed_attempt_and_the_step_stays_open(store: ae.EventStore) -> None:
    """A tool that raises records a failed attempt (tool.call.failed) and the original
    exception propagates; a reopened run attempts the open step again, for real, with the
    same key, and the recorded error is never taken for an outcome."""
    calls: list[str] = []

    def flaky(args: Any, key: str) -> Any:
        calls.append(key)
        raise RuntimeError("quota exceeded")

    with pytest.raises(RuntimeError, match="quota exceeded"):
        Journal(store, "run-err").tool_call("t", {}, call=flaky)
    failed = events_of(store, "run-err", "tool.call.failed")[0].payload
    assert (failed["step"], failed["attempt"], failed["error_type"]) == (1, 1, "RuntimeError")
    assert failed["error"] == "quota exceeded"
    assert events_of(store, "run-err", "tool.returned") == []
    assert Journal(store, "run-err").tool_call("t", {}, call=lambda a, k: {"ok": k}) == {
        "ok": "run-err:1"
    }
    assert calls == ["run-err:1"]
    attempts = [e.payload["attempt"] for e in events_of(store, "run-err", "tool.call.requested")]
    assert attempts == [1, 2]


def test_completed_run_takes_no_new_steps(store: ae.EventStore) -> None:
    """After complete() the run is completed; replaying works, a new step is refused."""
    j = Journal(store, "run-c")
    agent_loop(j, CountingLLM(), 1)
    j.complete({"ok": True})
    j.complete({"ok": True})  # idempotent
    assert types(store, "run-c").count("run.completed") == 1
    j2 = Journal(store, "run-c")
    assert j2.status == "completed"
    agent_loop(j2, CountingLLM(), 1)  # replay is fine
    with pytest.raises(RunNotRunnable) as ei:
        j2.model_call([{"content": "one more"}], call=CountingLLM())
    assert ei.value.status == "completed"


# -- 2. kill -9 at every step boundary ------------------------------------------------------


def test_clean_child_run_appends_the_expected_steps(sqlite_url: str, services: Path) -> None:
    """The crash tests' reference: a clean run of the child appends exactly CLEAN_RUN."""
    out = run_child(sqlite_url, services, "run-clean")
    assert out["outcome"] == out["status"] == "completed"
    with ae.open_store(sqlite_url) as store:
        assert types(store, "run-clean") == CLEAN_RUN
    assert invocations(services, "run-clean") == ["run-clean:2"]


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
@pytest.mark.parametrize("n", range(1, len(CLEAN_RUN) + 1))
def test_kill_after_every_append_then_rerun_completes_exactly_once(
    n: int, sqlite_url: str, services: Path
) -> None:
    """SIGKILL right after the Nth append, then a normal re-run: the run completes, the
    ticket's side effect happened once, the tool ran once, no answered model call was
    re-issued, and the log is the clean run plus one gate decision."""
    run_id = f"run-k{n}"
    run_child(sqlite_url, services, run_id, "--die-after", str(n), killed=True)
    with ae.open_store(sqlite_url) as store:
        assert types(store, run_id) == CLEAN_RUN[:n]  # died right after append N
    answered_before = CLEAN_RUN[:n].count("model.responded")

    out = run_child(sqlite_url, services, run_id)
    assert out["status"] == "completed"
    with ae.open_store(sqlite_url) as store:
        expected = (
            CLEAN_RUN if n == len(CLEAN_RUN) else [*CLEAN_RUN[:n], "run.gate", *CLEAN_RUN[n:]]
        )
        assert types(store, run_id) == expected
        assert ae.integrity.verify_stream(store, run_id).ok
        tokens = sum(
            e.payload["usage"]["total_tokens"]
            for e in events_of(store, run_id, "model.responded")[:answered_before]
        )
    assert [count for _, count in side_effects(services, run_id)] == [1]
    assert invocations(services, run_id) == [f"{run_id}:2"]  # never re-executed
    assert sorted(model_calls_by_content(services, run_id).values()) == [1, 1]
    stats = out["stats"]
    assert stats["model_calls_from_log"] == answered_before
    assert stats["model_calls_made"] == 2 - answered_before
    assert stats["tokens_from_log"] == tokens
    assert stats["tool_calls_from_log"] == (1 if n >= 5 else 0)


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
def test_kill_inside_the_tool_after_its_side_effect_is_reconciled(
    shared_url: str, services: Path
) -> None:
    """SIGKILL after the side effect but before the tool returns: the re-run asks the
    reconciler, synthesizes tool.returned from its answer and never calls the tool again."""
    run_child(shared_url, services, "run-kt", "--die-in", "tool", killed=True)
    with ae.open_store(shared_url) as store:
        assert types(store, "run-kt") == CLEAN_RUN[:4]  # requested, no outcome
    assert side_effects(services, "run-kt") != []

    out = run_child(shared_url, services, "run-kt")
    assert out["status"] == "completed"
    assert out["stats"]["tool_calls_reconciled"] == 1
    assert out["stats"]["tool_calls_made"] == 0
    assert invocations(services, "run-kt") == ["run-kt:2"]
    assert [count for _, count in side_effects(services, "run-kt")] == [1]
    with ae.open_store(shared_url) as store:
        assert types(store, "run-kt") == [*CLEAN_RUN[:4], "run.gate", *CLEAN_RUN[4:]]
        returned = events_of(store, "run-kt", "tool.returned")[0].payload
        assert returned["reconciled"] is True
        assert returned["result"]["ticket"] == "run-kt:2"
        assert ae.integrity.verify_stream(store, "run-kt").ok


def test_kill_inside_a_model_call_reissues_only_that_unanswered_call(
    sqlite_url: str, services: Path
) -> None:
    """SIGKILL inside the model call (made, never recorded): the re-run calls the model
    again for that step only, because its answer never became durable."""
    run_child(sqlite_url, services, "run-km", "--die-in", "model", killed=True)
    out = run_child(sqlite_url, services, "run-km")
    assert out["status"] == "completed"
    calls = model_calls_by_content(services, "run-km")
    assert calls[child.first_messages()[-1]["content"]] == 2
    assert sorted(calls.values()) == [1, 2]
    with ae.open_store(sqlite_url) as store:
        assert types(store, "run-km") == [*CLEAN_RUN[:2], "run.gate", *CLEAN_RUN[2:]]


# -- 3. in-doubt tool calls -------------------------------------------------------------------


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_in_doubt_without_reconciler_stops_the_run_until_a_human_resolves_it(
    sqlite_url: str, services: Path, opened: list[ae.EventStore]
) -> None:
    """A dangling non-idempotent call with no reconciler interrupts the run (reason
    in_doubt_tool_call, status paused) without re-executing it; resolve_tool_call plus
    resume(by=...) lets the run finish, the tool still run once."""
    run_child(sqlite_url, services, "run-id", "--die-in", "tool", "--mode", "none", killed=True)
    store = open_url(opened, sqlite_url)
    llm = child.FakeLLM(str(services), "run-id")
    tickets = child.FakeTicketing(str(services), "run-id")

    j = open_journal(store, "run-id")
    with pytest.raises(InDoubtToolCall) as ei:
        child.run_loop(j, llm, tickets, mode="none")
    assert ei.value.key == "run-id:2" and ei.value.name == "create_ticket"
    assert ei.value.status == "paused" and j.status == "paused"
    interrupted = events_of(store, "run-id", "run.interrupted")
    assert [e.payload["reason"] for e in interrupted] == ["in_doubt_tool_call"]
    assert interrupted[0].payload["key"] == "run-id:2"
    assert invocations(services, "run-id") == ["run-id:2"]  # not re-executed

    # Another attempt stays stopped and does not interrupt twice.
    with pytest.raises(InDoubtToolCall):
        child.run_loop(open_journal(store, "run-id"), llm, tickets, mode="none")
    assert len(events_of(store, "run-id", "run.interrupted")) == 1
    # An idempotent retry is not allowed past a paused run either.
    with pytest.raises(RunNotRunnable):
        child.run_loop(open_journal(store, "run-id"), llm, tickets, mode="idempotent")

    human = open_journal(store, "run-id")
    landed, result = tickets.lookup("run-id:2")  # the human checks the ticketing system
    assert landed
    human.resolve_tool_call("run-id:2", result=result, by="alice")
    with pytest.raises(ValueError, match="not in doubt"):
        human.resolve_tool_call("run-id:2", result=result, by="alice")
    human.resume(by="alice")

    final = open_journal(store, "run-id")
    assert child.run_loop(final, llm, tickets, mode="none") == "completed"
    assert final.status == "completed"
    assert invocations(services, "run-id") == ["run-id:2"]
    assert [count for _, count in side_effects(services, "run-id")] == [1]
    returned = events_of(store, "run-id", "tool.returned")
    assert [e.payload.get("resolved_by") for e in returned] == ["alice"]
    assert [e.payload["by"] for e in events_of(store, "run-id", "run.resumed")] == ["alice"]
    assert sorted(model_calls_by_content(services, "run-id").values()) == [1, 1]
    assert ae.integrity.verify_stream(store, "run-id").ok


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_in_doubt_idempotent_tool_is_retried_with_the_same_key(
    sqlite_url: str, services: Path
) -> None:
    """With idempotent=True and no reconciler a dangling call is retried with its
    original key, so the downstream dedupe keeps the side effect single."""
    run_child(
        sqlite_url, services, "run-ip", "--die-in", "tool", "--mode", "idempotent", killed=True
    )
    out = run_child(sqlite_url, services, "run-ip", "--mode", "idempotent")
    assert out["status"] == "completed" and out["stats"]["tool_calls_made"] == 1
    assert invocations(services, "run-ip") == ["run-ip:2", "run-ip:2"]
    assert [count for _, count in side_effects(services, "run-ip")] == [1]
    with ae.open_store(sqlite_url) as store:
        assert "run.interrupted" not in types(store, "run-ip")


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_reconciler_saying_not_landed_reexecutes_with_the_same_key(
    sqlite_url: str, services: Path
) -> None:
    """A kill after tool.call.requested but before the tool ran: the reconciler says it
    did not land, so the tool runs (once) with the recorded key."""
    run_child(sqlite_url, services, "run-nl", "--die-after", "4", killed=True)
    assert invocations(services, "run-nl") == []
    out = run_child(sqlite_url, services, "run-nl")
    assert out["status"] == "completed"
    assert out["stats"]["tool_calls_reconciled"] == 0 and out["stats"]["tool_calls_made"] == 1
    assert invocations(services, "run-nl") == ["run-nl:2"]


# -- 4. interrupts across processes ---------------------------------------------------------


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
def test_interrupt_in_one_process_resume_in_another_finish_in_a_third(
    shared_url: str, services: Path, opened: list[ae.EventStore]
) -> None:
    """A child pauses the run (awaiting_approval) and exits; a re-run before approval
    stays paused; this process resumes it by alice; a third child finishes it without
    repeating the interrupt, the tool or any answered model call."""
    out = run_child(shared_url, services, "run-ap", "--flow", "interrupt")
    assert out["outcome"] == "paused" and out["status"] == "paused"
    out = run_child(shared_url, services, "run-ap", "--flow", "interrupt")
    assert out["outcome"] == "paused"  # nobody approved yet

    store = open_url(opened, shared_url)
    approver = open_journal(store, "run-ap")
    assert approver.status == "paused"
    assert approver.state["interrupt"]["reason"] == "awaiting_approval"
    approver.resume(by="alice")
    assert approver.status == "running"
    with pytest.raises(RunNotRunnable):
        approver.resume(by="alice")

    out = run_child(shared_url, services, "run-ap", "--flow", "interrupt")
    assert out["outcome"] == out["status"] == "completed"
    assert out["stats"]["model_calls_from_log"] == 1 and out["stats"]["model_calls_made"] == 1
    run_types = types(store, "run-ap")
    assert run_types.count("run.interrupted") == 1
    assert [e.payload["by"] for e in events_of(store, "run-ap", "run.resumed")] == ["alice"]
    assert run_types.index("run.interrupted") < run_types.index("run.resumed")
    assert invocations(services, "run-ap") == ["run-ap:2"]
    assert sorted(model_calls_by_content(services, "run-ap").values()) == [1, 1]
    assert ae.integrity.verify_stream(store, "run-ap").ok


def test_paused_run_refuses_new_steps(store: ae.EventStore) -> None:
    """While paused, recorded steps replay but a new step raises RunNotRunnable."""
    j = Journal(store, "run-p")
    agent_loop(j, CountingLLM(), 1)
    assert j.interrupt("awaiting_approval") is True
    with pytest.raises(RunNotRunnable) as ei:
        j.model_call([{"content": "new"}], call=CountingLLM())
    assert ei.value.status == "paused" and "awaiting_approval" in str(ei.value)


# -- 5. the version gate ----------------------------------------------------------------------


def _gate_events(store: ae.EventStore, run_id: str) -> list[dict[str, Any]]:
    return [dict(e.payload) for e in events_of(store, run_id, "run.gate")]


def test_strict_gate_refuses_a_changed_prompt_hash(store: ae.EventStore) -> None:
    """Reopening under another prompt hash raises RunRefused and records a run.gate
    event with decision refuse; reopening unchanged records resume."""
    agent_loop(Journal(store, "run-g", code_revision="r1", prompt_hash="p1"), CountingLLM(), 1)
    Journal(store, "run-g", code_revision="r1", prompt_hash="p1")
    with pytest.raises(RunRefused) as ei:
        Journal(store, "run-g", code_revision="r1", prompt_hash="p2", gate=strict_gate)
    assert ei.value.recorded == ("r1", "p1") and ei.value.current == ("r1", "p2")
    gates = _gate_events(store, "run-g")
    assert [g["decision"] for g in gates] == ["resume", "refuse"]
    assert gates[1]["prompt_hash"] == "p2" and gates[1]["recorded_prompt_hash"] == "p1"


def test_refused_run_goes_on_when_the_recorded_versions_are_back(store: ae.EventStore) -> None:
    """A refusal is a decision about one incarnation: reopened under the recorded code
    and prompt, the gate resumes and the run takes new steps again."""
    agent_loop(Journal(store, "run-gr", code_revision="r1", prompt_hash="p1"), CountingLLM(), 1)
    with pytest.raises(RunRefused):
        Journal(store, "run-gr", code_revision="r2", prompt_hash="p1")
    assert ae.recover(store, "run-gr", ae.projections.RunStateProjection()).state["status"] == (
        "refused"
    )
    j = Journal(store, "run-gr", code_revision="r1", prompt_hash="p1")
    assert j.status == "running"
    agent_loop(j, CountingLLM(), 2)
    assert [g["decision"] for g in _gate_events(store, "run-gr")] == ["refuse", "resume"]


def test_migrating_gate_migrates_a_changed_code_revision(store: ae.EventStore) -> None:
    """migrating_gate accepts a new code revision (decision migrate, recorded) and then
    holds the run to it; it still refuses a changed prompt hash."""
    agent_loop(Journal(store, "run-m", code_revision="r1", prompt_hash="p1"), CountingLLM(), 1)
    j = Journal(store, "run-m", code_revision="r2", prompt_hash="p1", gate=migrating_gate)
    assert j.status == "running" and j.state["code_revision"] == "r2"
    gate = _gate_events(store, "run-m")[-1]
    assert gate["decision"] == "migrate"
    assert (gate["recorded_code_revision"], gate["code_revision"]) == ("r1", "r2")
    Journal(store, "run-m", code_revision="r2", prompt_hash="p1")  # strict: r2 is recorded now
    with pytest.raises(RunRefused):
        Journal(store, "run-m", code_revision="r3", prompt_hash="p9", gate=migrating_gate)
    assert [g["decision"] for g in _gate_events(store, "run-m")] == [
        "migrate",
        "resume",
        "refuse",
    ]


def test_custom_gate_policy_gets_recorded_and_current(store: ae.EventStore) -> None:
    """A custom policy is called with (recorded, current) and its decision is recorded;
    an unknown decision is rejected before anything is appended."""
    Journal(store, "run-cg", code_revision="r1", prompt_hash="p1")
    seen: list[tuple[tuple[str, str], tuple[str, str]]] = []

    def policy(recorded: tuple[str, str], current: tuple[str, str]) -> str:
        seen.append((recorded, current))
        return "resume"

    Journal(store, "run-cg", code_revision="r9", prompt_hash="p9", gate=policy)
    assert seen == [(("r1", "p1"), ("r9", "p9"))]
    assert _gate_events(store, "run-cg")[-1]["decision"] == "resume"
    version = store.stream_version("run-cg")
    with pytest.raises(ae.errors.ConfigError, match="maybe"):
        Journal(store, "run-cg", gate=lambda recorded, current: "maybe")
    assert store.stream_version("run-cg") == version


def test_finished_run_is_not_gated(store: ae.EventStore) -> None:
    """A completed run reopens under any versions without a gate decision."""
    j = Journal(store, "run-fin", code_revision="r1", prompt_hash="p1")
    j.complete()
    Journal(store, "run-fin", code_revision="r2", prompt_hash="p2")
    assert _gate_events(store, "run-fin") == []


# -- 6. fencing ---------------------------------------------------------------------------------


def test_a_stale_incarnation_is_fenced_off(store: ae.EventStore) -> None:
    """Two live Journals of one run: once one has written, the other's first append
    raises ConcurrencyError, before its model is called."""
    old = Journal(store, "run-f")
    agent_loop(old, CountingLLM(), 1)
    new = Journal(store, "run-f")  # a second incarnation (its gate decision is a write)
    new_llm = CountingLLM()
    agent_loop(new, new_llm, 2)
    stale_llm = CountingLLM()
    with pytest.raises(ConcurrencyError) as ei:
        old.model_call([{"content": "stale step"}], call=stale_llm)
    assert ei.value.stream_id == "run-f"
    assert stale_llm.calls == [] and len(new_llm.calls) == 1
    assert ae.integrity.verify_stream(store, "run-f").ok


# -- 7. the asyncio twin ------------------------------------------------------------------------


async def _async_loop(journal: AsyncJournal, steps: int, calls: list[Any]) -> list[Any]:
    async def model(messages: Any, params: Mapping[str, Any]) -> ModelReply:
        await asyncio.sleep(0)
        calls.append(messages)
        return ModelReply({"text": f"async {messages[-1]['content']}"}, {"total_tokens": 11})

    async def tool(args: Any, key: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        calls.append(key)
        return {"ticket": key}

    out: list[Any] = []
    for i in range(1, steps + 1):
        out.append(await journal.model_call([{"content": f"part {i}"}], call=model))
        out.append(await journal.tool_call("file", {"i": i}, call=tool))
        await journal.patch("i", i)
    return out


def test_async_journal_resumes_without_calling(store: ae.EventStore) -> None:
    """AsyncJournal under asyncio.run: async calls are journaled, and a reopened run
    returns the recorded answers without awaiting the model or the tool."""
    first_calls: list[Any] = []
    again_calls: list[Any] = []

    async def first() -> list[Any]:
        j = await AsyncJournal.open(store, "run-a", code_revision="r1", prompt_hash="p1")
        return await _async_loop(j, 2, first_calls)

    async def again() -> tuple[list[Any], AsyncJournal]:
        j = await AsyncJournal.open(store, "run-a", code_revision="r1", prompt_hash="p1")
        out = await _async_loop(j, 2, again_calls)
        await j.complete("done")
        return out, j

    answers = asyncio.run(first())
    assert len(first_calls) == 4
    replayed, j = asyncio.run(again())
    assert again_calls == []
    assert replayed == answers
    assert j.stats.model_calls_from_log == 2 and j.stats.tokens_from_log == 22
    assert j.stats.tool_calls_from_log == 2
    assert j.status == "completed"


def test_async_journal_interrupt_and_resume(store: ae.EventStore) -> None:
    """The async interrupt/resume pair pauses and reopens a run like the sync one."""

    async def scenario() -> list[str]:
        j = await AsyncJournal.open(store, "run-ai")
        paused = await j.interrupt("awaiting_approval")
        statuses = [str(paused), j.status]
        await (await AsyncJournal.open(store, "run-ai")).resume(by="bob")
        j2 = await AsyncJournal.open(store, "run-ai")
        statuses.append(str(await j2.interrupt("awaiting_approval")))
        await j2.fail("gave up")
        statuses.append(j2.status)
        return statuses

    assert asyncio.run(scenario()) == ["True", "paused", "False", "failed"]


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_async_reconciler_after_a_real_kill(sqlite_url: str, services: Path) -> None:
    """After a SIGKILL inside the tool, an AsyncJournal with a coroutine reconciler
    synthesizes the outcome; the tool coroutine is never awaited."""
    run_child(sqlite_url, services, "run-ar", "--die-in", "tool", killed=True)
    tickets = child.FakeTicketing(str(services), "run-ar")
    llm = child.FakeLLM(str(services), "run-ar")
    tool_awaited: list[str] = []

    async def reconcile(key: str) -> tuple[bool, Any]:
        await asyncio.sleep(0)
        return tickets.lookup(key)

    async def create(args: Any, key: str) -> Any:
        tool_awaited.append(key)
        return tickets.create(args, key)

    async def resume() -> AsyncJournal:
        store = ae.open_store(sqlite_url)
        try:
            j = await AsyncJournal.open(
                store, "run-ar", code_revision=child.CODE_REVISION, prompt_hash=child.PROMPT_HASH
            )
            c1 = await j.model_call(child.first_messages(), {"temperature": 0}, call=llm)
            ticket = await j.tool_call(
                "create_ticket",
                {"title": child.ticket_title(c1)},
                call=create,
                reconcile=reconcile,
            )
            await j.patch("ticket", ticket["ticket"])
            await j.model_call(child.second_messages(c1, ticket), {"temperature": 0}, call=llm)
            await j.complete()
            return j
        finally:
            store.close()

    j = asyncio.run(resume())
    assert j.status == "completed" and j.stats.tool_calls_reconciled == 1
    assert tool_awaited == []
    assert invocations(services, "run-ar") == ["run-ar:2"]
    assert [count for _, count in side_effects(services, "run-ar")] == [1]


# -- the guide's runnable example ---------------------------------------------------------------


def guide_blocks() -> list[str]:
    """The ```python blocks of docs/guide-journal.md, in order."""
    return re.findall(r"^```python\n(.*?)^```$", GUIDE.read_text(), flags=re.M | re.S)


def test_guide_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ```python block of docs/guide-journal.md runs, in order, in one namespace,
    against a temporary SQLite store."""
    blocks = guide_blocks()
    assert blocks, "docs/guide-journal.md has no ```python block"
    monkeypatch.chdir(tmp_path)
    ns: dict[str, Any] = {"__name__": "guide_journal"}
    for i, block in enumerate(blocks, 1):
        exec(compile(block, f"{GUIDE.name}[block {i}]", "exec"), ns)
    assert (tmp_path / "agent.db").exists()
