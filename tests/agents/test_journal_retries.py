"""Attempts are not steps: retries of model and tool calls, lost answers, abandoned steps,
and what a replay sees (issue 11).

Written as people write agent loops: the 429 loop of the issue, a tool whose answer is
lost after its side effect, a loop that gives up on a tool and tells the model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.journal import (
    AsyncJournal,
    Journal,
    ModelCallFailed,
    ModelReply,
    ReplayDivergence,
    RunNotRunnable,
    ToolCallFailed,
)
from ares_events.agents.recording import hash_of


class RateLimited(Exception):
    """A 429 from the model provider."""


class GatewayTimeout(Exception):
    """The gateway timed out after the downstream system acted."""


class FlakyLLM:
    """Answers every prompt after ``limits`` rate limits; counts paid calls by prompt."""

    def __init__(self, limits: int = 2) -> None:
        self.limits = limits
        self.seen: dict[str, int] = {}
        self.paid: list[str] = []

    def __call__(self, messages: Any, params: Mapping[str, Any]) -> ModelReply:
        content = str(messages[-1]["content"])
        self.seen[content] = self.seen.get(content, 0) + 1
        if self.seen[content] <= self.limits:
            raise RateLimited(f"429 Too Many Requests ({self.seen[content]})")
        self.paid.append(content)
        return ModelReply({"text": f"answer to {content}"}, {"total_tokens": 10})


class Tickets:
    """Creates tickets, honouring idempotency keys; loses the first answer of each key."""

    def __init__(self, lose_first: bool = True) -> None:
        self.lose_first = lose_first
        self.by_key: dict[str, dict[str, Any]] = {}
        self.side_effects = 0
        self.invocations: list[str] = []

    def create(self, args: Any, key: str) -> dict[str, Any]:
        self.invocations.append(key)
        first = key not in self.by_key
        if first:
            self.side_effects += 1
            self.by_key[key] = {"id": f"T-{len(self.by_key) + 1}", "title": args["title"]}
        if first and self.lose_first:
            raise GatewayTimeout(f"504 after creating the ticket for {key}")
        return self.by_key[key]


def issue_loop(journal: Journal, llm: Any, messages: Any) -> Any:
    """The loop from the issue, verbatim in spirit."""
    while True:
        try:
            answer = journal.model_call(messages, {"temperature": 0}, call=llm)
            break
        except RateLimited:
            continue
    return answer


def types(store: ae.EventStore, run_id: str) -> list[str]:
    """Event types of a run, in order."""
    return [e.type for e in store.read(run_id)]


def payloads(store: ae.EventStore, run_id: str, type_: str) -> list[dict[str, Any]]:
    """Payloads of the run's events of one type."""
    return [dict(e.payload) for e in store.read(run_id) if e.type == type_]


MSGS = [{"role": "user", "content": "hello"}]


# -- model calls ------------------------------------------------------------------------------


def test_the_issue_429_loop_is_one_step_with_three_attempts(store: ae.EventStore) -> None:
    """Two rate limits then an answer: one step (1), attempts 1, 2, 3, two recorded
    failures naming the error, one completion; a reopened run returns it without calling
    and without any divergence."""
    llm = FlakyLLM(limits=2)
    answer = issue_loop(Journal(store, "r-429"), llm, MSGS)
    assert answer == {"text": "answer to hello"}
    assert types(store, "r-429") == [
        "run.started",
        "model.call.requested",
        "model.call.failed",
        "model.call.requested",
        "model.call.failed",
        "model.call.requested",
        "model.responded",
    ]
    requested = payloads(store, "r-429", "model.call.requested")
    assert [(p["step"], p["attempt"]) for p in requested] == [(1, 1), (1, 2), (1, 3)]
    failed = payloads(store, "r-429", "model.call.failed")
    assert [(p["step"], p["attempt"], p["error_type"]) for p in failed] == [
        (1, 1, "RateLimited"),
        (1, 2, "RateLimited"),
    ]
    assert failed[1]["error"] == "429 Too Many Requests (2)"

    again = FlakyLLM(limits=0)
    j2 = Journal(store, "r-429")
    assert issue_loop(j2, again, MSGS) == answer
    assert again.paid == [] and j2.stats.model_calls_from_log == 1 and j2.replaying
    # The next model call is a new step (2), not a retry of step 1.
    issue_loop(j2, again, [{"role": "user", "content": "next"}])
    assert [p["step"] for p in payloads(store, "r-429", "model.call.requested")][-1] == 2


def test_a_live_failure_reraises_the_original_exception_object(store: ae.EventStore) -> None:
    """The caller gets the very exception its call raised (same object, same traceback
    frames), after the failed attempt is durable."""
    boom = RateLimited("slow down")
    seen_durable: list[bool] = []

    def llm(messages: Any, params: Mapping[str, Any]) -> Any:
        raise boom

    j = Journal(store, "r-orig")
    with pytest.raises(RateLimited) as ei:
        try:
            j.model_call(MSGS, call=llm)
        finally:
            seen_durable.append(types(store, "r-orig")[-1] == "model.call.failed")
    assert ei.value is boom and seen_durable == [True]
    assert ei.traceback[-1].name == "llm"
    assert j.attempt == 1 and not j.replaying and j.stats.model_attempts_failed == 1


def test_a_long_error_message_is_recorded_shortened(store: ae.EventStore) -> None:
    """A failure's message is kept to 2,000 characters (an HTML error page is not a
    message); its type name and class path are recorded."""

    def llm(messages: Any, params: Mapping[str, Any]) -> Any:
        raise RateLimited("<html>" + "x" * 50_000)

    with pytest.raises(RateLimited):
        Journal(store, "r-long").model_call(MSGS, call=llm)
    failed = payloads(store, "r-long", "model.call.failed")[0]
    assert len(failed["error"]) == 2000 and failed["error"].endswith("…")
    assert failed["error_class"] == f"{__name__}:RateLimited"


def test_an_open_failed_step_is_attempted_for_real_after_a_restart(store: ae.EventStore) -> None:
    """A process that died after a failed attempt leaves the step open: the next
    incarnation's first call at that step is a real attempt (2), and the attempt count
    survives the restart so a retry budget can be kept across crashes."""
    llm = FlakyLLM(limits=1)
    with pytest.raises(RateLimited):
        Journal(store, "r-open").model_call(MSGS, call=llm)
    j2 = Journal(store, "r-open")
    assert j2.model_call(MSGS, call=llm) == {"text": "answer to hello"}
    assert j2.attempt == 2 and not j2.replaying
    assert llm.paid == ["hello"]
    requested = payloads(store, "r-open", "model.call.requested")
    assert [(p["step"], p["attempt"]) for p in requested] == [(1, 1), (1, 2)]


def test_a_kill_inside_a_retry_asks_again_under_the_same_request(store: ae.EventStore) -> None:
    """Died inside attempt 2 (requested, neither answered nor failed): the next
    incarnation calls the model once more for that attempt without a new request."""
    llm = FlakyLLM(limits=1)
    j = Journal(store, "r-inflight")
    with pytest.raises(RateLimited):
        j.model_call(MSGS, call=llm)

    def dies(messages: Any, params: Mapping[str, Any]) -> Any:
        raise KeyboardInterrupt  # stands for a SIGKILL inside the call

    with pytest.raises(KeyboardInterrupt):
        j.model_call(MSGS, call=dies)
    assert types(store, "r-inflight")[-1] == "model.call.requested"  # attempt 2, no outcome
    j2 = Journal(store, "r-inflight")
    assert j2.model_call(MSGS, call=llm) == {"text": "answer to hello"}
    requested = payloads(store, "r-inflight", "model.call.requested")
    assert [p["attempt"] for p in requested] == [1, 2]
    assert payloads(store, "r-inflight", "model.responded")[0]["step"] == 1


def test_another_call_after_a_failure_abandons_the_step(store: ae.EventStore) -> None:
    """After a failed attempt, a call with other messages (a fallback prompt) records
    step.abandoned for the failed step and becomes the next step."""
    llm = FlakyLLM(limits=5)
    j = Journal(store, "r-fallback")
    with pytest.raises(RateLimited):
        j.model_call(MSGS, call=llm)
    fallback = [{"role": "user", "content": "hello (short)"}]
    j.model_call(fallback, call=lambda m, p: "fallback answer")
    assert types(store, "r-fallback")[3:] == [
        "step.abandoned",
        "model.call.requested",
        "model.responded",
    ]
    assert payloads(store, "r-fallback", "step.abandoned") == [{"step": 1}]
    assert payloads(store, "r-fallback", "model.responded")[0]["step"] == 2
    assert j.stats.steps_abandoned == 1


def test_complete_after_giving_up_abandons_the_open_step(store: ae.EventStore) -> None:
    """complete() (and fail()) after a failed attempt record the step as abandoned."""
    j = Journal(store, "r-giveup")
    with pytest.raises(RateLimited):
        j.model_call(MSGS, call=FlakyLLM(limits=9))
    j.complete({"gave_up": True})
    assert types(store, "r-giveup")[-2:] == ["step.abandoned", "run.completed"]
    info = Journal.inspect(store, "r-giveup")
    assert info.steps[0].status == "abandoned" and info.status == "completed"


# -- tool calls -------------------------------------------------------------------------------


def test_a_lost_answer_is_retried_with_the_same_key_and_acts_once(store: ae.EventStore) -> None:
    """The ticket was created, then the gateway timed out: the natural retry is attempt 2
    of the same step with the same idempotency key, so the downstream dedupe returns the
    existing ticket; one side effect."""
    tickets = Tickets(lose_first=True)
    j = Journal(store, "r-lost")
    while True:
        try:
            ticket = j.tool_call("create_ticket", {"title": "disk full"}, call=tickets.create)
            break
        except GatewayTimeout:
            continue
    assert ticket == {"id": "T-1", "title": "disk full"}
    assert tickets.invocations == ["r-lost:1", "r-lost:1"] and tickets.side_effects == 1
    requested = payloads(store, "r-lost", "tool.call.requested")
    assert {p["idempotency_key"] for p in requested} == {"r-lost:1"}
    assert [p["attempt"] for p in requested] == [1, 2]
    assert payloads(store, "r-lost", "tool.call.failed")[0]["error_type"] == "GatewayTimeout"
    # Replayed: the recorded result, nothing invoked.
    j2 = Journal(store, "r-lost")
    assert j2.tool_call("create_ticket", {"title": "disk full"}, call=tickets.create) == ticket
    assert tickets.invocations == ["r-lost:1", "r-lost:1"]


def test_same_tool_with_other_args_after_a_failure_is_a_new_step(store: ae.EventStore) -> None:
    """A loop that skips a failed item and goes on with the next one (same tool, other
    args) abandons the failed step: the next item gets its own step and its own key, so
    the downstream never mistakes it for a retry of the first."""
    tickets = Tickets(lose_first=False)

    def create(args: Any, key: str) -> Any:
        if args["title"] == "bad":
            raise ValueError("title rejected")
        return tickets.create(args, key)

    j = Journal(store, "r-items")
    for title in ("bad", "good"):
        try:
            j.tool_call("create_ticket", {"title": title}, call=create)
        except ValueError:
            pass
    assert list(tickets.by_key) == ["r-items:2"]
    assert payloads(store, "r-items", "step.abandoned") == [{"step": 1}]


def test_a_replayed_abandoned_step_reraises_its_failures_without_calling(
    store: ae.EventStore,
) -> None:
    """A loop that gives up on a tool after two attempts and tells the model: on replay
    each attempt re-raises the recorded failure (same class, same message) without calling,
    so the loop builds the same prompt and the next model step replays without divergence."""
    calls: list[str] = []

    class ServiceDown(Exception):
        """Local class: replay finds it among the classes this process has seen."""

    def weather(args: Any, key: str) -> Any:
        calls.append(key)
        raise ServiceDown(f"503 for {args['city']}")

    def loop(j: Journal) -> Any:
        tries = 0
        while True:
            try:
                w = j.tool_call("weather", {"city": "Oslo"}, call=weather)
                break
            except ServiceDown as exc:
                tries += 1
                if tries == 2:
                    w = f"unknown ({type(exc).__name__}: {exc})"
                    break
        msgs = [{"role": "user", "content": f"weather: {w}"}]
        return j.model_call(msgs, call=lambda m, p: m[-1]["content"].upper())

    first = loop(Journal(store, "r-aband"))
    assert calls == ["r-aband:1", "r-aband:1"]
    j2 = Journal(store, "r-aband")
    assert loop(j2) == first == "WEATHER: UNKNOWN (SERVICEDOWN: 503 FOR OSLO)"
    assert calls == ["r-aband:1", "r-aband:1"]  # not called again
    assert j2.stats.failures_from_log == 2 and j2.stats.model_calls_from_log == 1


def test_a_replayed_failure_is_an_instance_of_the_original_class(store: ae.EventStore) -> None:
    """The replayed exception is an instance of the recorded class with the recorded
    message as str(), a note saying it was replayed, and the attempt it reproduces."""
    j = Journal(store, "r-class")
    with pytest.raises(GatewayTimeout):
        j.tool_call("t", {"a": 1}, call=lambda a, k: (_ for _ in ()).throw(GatewayTimeout("lost")))
    j.patch("gave_up", True)
    j2 = Journal(store, "r-class")
    with pytest.raises(GatewayTimeout) as ei:
        j2.tool_call("t", {"a": 1}, call=lambda a, k: pytest.fail("called on replay"))
    exc = ei.value
    assert str(exc) == "lost" and type(exc).__name__ == "GatewayTimeout"
    assert repr(exc) == "GatewayTimeout('lost')"
    assert any("replayed from the run journal" in n for n in exc.__notes__)
    assert j2.replaying and j2.attempt == 1


def test_a_failure_of_a_class_not_loaded_replays_as_a_library_error(store: ae.EventStore) -> None:
    """A recorded failure whose class this process cannot find (an older deployment's
    exception, written by another process) replays as ModelCallFailed / ToolCallFailed
    carrying the type name, message, step and attempt; never by calling again."""
    j = Journal(store, "r-gone")
    j.model_call(MSGS, call=lambda m, p: "ok")  # step 1
    v = store.stream_version("r-gone")
    mh = hash_of(MSGS, "messages")
    gone = {"error_type": "Gone", "error": "vanished", "error_class": "nowhere.mod:Gone"}
    store.append(
        "r-gone",
        [
            ae.catalog.new_event(
                "model.call.requested",
                "journal",
                {"step": 2, "attempt": 1, "messages_hash": mh, "params": {}, "messages": MSGS},
            ),
            ae.catalog.new_event("model.call.failed", "journal", {"step": 2, "attempt": 1, **gone}),
            ae.catalog.new_event("step.abandoned", "journal", {"step": 2}),
        ],
        expected_version=v,
    )
    j2 = Journal(store, "r-gone")
    assert j2.model_call(MSGS, call=lambda m, p: pytest.fail("called")) == "ok"
    with pytest.raises(ModelCallFailed) as ei:
        j2.model_call(MSGS, call=lambda m, p: pytest.fail("called"))
    assert (ei.value.step, ei.value.attempt, ei.value.error_type) == (2, 1, "Gone")
    assert ei.value.error == "vanished" and ei.value.replayed
    assert "Gone: vanished" in str(ei.value)


def test_a_human_recorded_error_outcome_replays_as_tool_call_failed(store: ae.EventStore) -> None:
    """An in-doubt call a human resolved with an error has that error as its outcome:
    every replay raises ToolCallFailed with it and the tool is never called."""
    j = Journal(store, "r-human")

    def ctrl_c(args: Any, key: str) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        j.tool_call("send", {"to": "ops"}, call=ctrl_c)
    Journal(store, "r-human").resolve_tool_call("r-human:1", error="bounced", by="alice")
    for _ in range(2):
        with pytest.raises(ToolCallFailed) as ei:
            Journal(store, "r-human").tool_call("send", {"to": "ops"}, call=ctrl_c)
        assert ei.value.error == "bounced" and ei.value.key == "r-human:1"


# -- the replay rule ---------------------------------------------------------------------------


def test_another_kind_of_step_at_a_recorded_step_is_a_divergence(store: ae.EventStore) -> None:
    """A patch, interrupt or tool call where the log recorded a model call raises
    ReplayDivergence naming both kinds, and appends nothing."""
    j = Journal(store, "r-kind")
    j.model_call(MSGS, call=lambda m, p: "a")
    j.patch("k", 1)
    version = store.stream_version("r-kind")
    acts: list[Callable[[Journal], Any]] = [
        lambda jj: jj.patch("k", 1),
        lambda jj: jj.interrupt("approval"),
        lambda jj: jj.tool_call("t", {}, call=lambda a, k: 1),
    ]
    for act in acts:
        j2 = Journal(store, "r-kind")
        base = store.stream_version("r-kind")
        with pytest.raises(ReplayDivergence) as ei:
            act(j2)
        assert ei.value.step == 1 and ei.value.path == "kind"
        assert ei.value.recorded == "model" and "model" in str(ei.value)
        assert store.stream_version("r-kind") == base
    assert store.stream_version("r-kind") == version + 3  # the three gate decisions


def test_a_cancelled_run_replays_but_takes_no_new_attempt(store: ae.EventStore) -> None:
    """After cancel_run, recorded outcomes still replay but an open failed step is not
    attempted again: RunNotRunnable with status cancelled; and reopening is not gated."""
    from ares_events.agents.runs import cancel_run

    j = Journal(store, "r-cancel")
    j.model_call(MSGS, call=lambda m, p: "a")
    with pytest.raises(RateLimited):
        j.model_call([{"role": "user", "content": "b"}], call=FlakyLLM(limits=1))
    cancel_run(store, "r-cancel", by="alice", reason="stop")
    j2 = Journal(store, "r-cancel", code_revision="other")
    assert j2.status == "cancelled" and j2.model_call(MSGS, call=FlakyLLM()) == "a"
    with pytest.raises(RunNotRunnable) as ei:
        j2.model_call([{"role": "user", "content": "b"}], call=FlakyLLM(limits=0))
    assert ei.value.status == "cancelled"
    assert "run.gate" not in types(store, "r-cancel")


def test_async_journal_records_attempts_like_the_sync_one(store: ae.EventStore) -> None:
    """AsyncJournal: a coroutine that raises records a failed attempt and the original
    exception propagates; the retry is attempt 2 of the same step with the same key."""
    tickets = Tickets(lose_first=True)

    async def create(args: Any, key: str) -> Any:
        await asyncio.sleep(0)
        return tickets.create(args, key)

    flaky = FlakyLLM(limits=1)

    async def llm(messages: Any, params: Mapping[str, Any]) -> Any:
        await asyncio.sleep(0)
        return flaky(messages, params)

    async def scenario() -> tuple[Any, Any]:
        j = await AsyncJournal.open(store, "r-async")
        while True:
            try:
                answer = await j.model_call(MSGS, call=llm)
                break
            except RateLimited:
                assert j.attempt == 1 and not j.replaying
        while True:
            try:
                ticket = await j.tool_call("create_ticket", {"title": "t"}, call=create)
                break
            except GatewayTimeout:
                continue
        return answer, ticket

    answer, ticket = asyncio.run(scenario())
    assert answer == {"text": "answer to hello"} and ticket["id"] == "T-1"
    assert tickets.invocations == ["r-async:2", "r-async:2"] and tickets.side_effects == 1
    failed = types(store, "r-async").count("model.call.failed")
    assert failed == 1 and types(store, "r-async").count("tool.call.failed") == 1
