"""Spans and metrics of journaled runs (GenAI conventions), a resumed run linked to its
first incarnation across a SIGKILL, and supervisor deaths and backoffs, against real
stores with the SDK's in-memory exporters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest
from opentelemetry.trace import SpanKind, StatusCode

import ares_events as ae
from ares_events.agents import supervision
from ares_events.agents.journal import Journal, ModelReply
from ares_events.agents.journal_telemetry import TRACE_KEY
from ares_events.core import telemetry
from tests.fixtures.servers import TEST_PASSWORD
from tests.telemetry import journal_otel_child as child
from tests.telemetry.otel_helpers import Otel, attrs, parent_id, start_time

PROMPT = "PROMPT-MARKER-91c2"
ANSWER = "ANSWER-MARKER-1b7d"
TOOL_ARG = "TOOL-ARG-MARKER-55e0"


class RateLimited(Exception):
    pass


def _run(store: Any, run_id: str, calls: dict[str, int]) -> Any:
    """A run whose model call fails once (a retried attempt) and then a tool call."""

    def model(messages: Any, params: Any) -> ModelReply:
        calls["model"] += 1
        if calls["model"] == 1:
            raise RateLimited("slow down")
        return ModelReply(ANSWER, {"input_tokens": 11, "output_tokens": 7})

    def tool(args: Any, key: str) -> dict[str, Any]:
        calls["tool"] += 1
        return {"ticket": 42}

    with Journal(store, run_id) as j:
        msgs = [{"role": "user", "content": PROMPT}]
        for _ in range(2):
            try:
                j.model_call(msgs, {"model": "gpt-test", "temperature": 0}, call=model)
                break
            except RateLimited:
                continue
        j.tool_call("create_ticket", {"title": TOOL_ARG}, call=tool)
        j.complete({"ok": True})
    return j


def test_a_run_is_invoke_agent_with_chat_attempts_and_a_tool(otel: Otel, real_url: str) -> None:
    """invoke_agent (the run) parents one chat span per attempt (the first failed, the
    second is attempt 2 of the same step) and an execute_tool span; the store's
    appends are children of the call that made them."""
    calls = {"model": 0, "tool": 0}
    with ae.open_store(real_url) as store:
        _run(store, "run-a", calls)
    run = otel.span("invoke_agent")
    assert run.kind is SpanKind.INTERNAL
    assert attrs(run)["gen_ai.operation.name"] == "invoke_agent"
    assert attrs(run)["gen_ai.conversation.id"] == "run-a"
    assert attrs(run)["ares_events.journal.resumed"] is False
    assert attrs(run)["ares_events.journal.status"] == "completed"
    chats = otel.spans("chat gpt-test")
    assert len(chats) == 2
    first, second = sorted(chats, key=start_time)
    for c in chats:
        assert c.kind is SpanKind.CLIENT
        assert parent_id(c) == run.context.span_id
        assert attrs(c)["gen_ai.request.model"] == "gpt-test"
        assert attrs(c)["gen_ai.conversation.id"] == "run-a"
        assert attrs(c)["ares_events.journal.step"] == 1
        assert attrs(c)["ares_events.journal.from_log"] is False
    assert first.status.status_code is StatusCode.ERROR
    assert cast(str, attrs(first)["error.type"]).endswith("RateLimited")
    assert (
        attrs(first)["ares_events.journal.attempt"],
        attrs(second)["ares_events.journal.attempt"],
    ) == (1, 2)
    assert attrs(second)["gen_ai.usage.input_tokens"] == 11
    assert attrs(second)["gen_ai.usage.output_tokens"] == 7
    tool = otel.span("execute_tool create_ticket")
    assert tool.kind is SpanKind.INTERNAL
    assert parent_id(tool) == run.context.span_id
    assert attrs(tool)["gen_ai.tool.name"] == "create_ticket"
    assert attrs(tool)["gen_ai.tool.call.id"] == "run-a:2"
    appends = otel.spans("append ares_events")
    assert any(a.parent and a.parent.span_id == second.context.span_id for a in appends)
    assert any(a.parent and a.parent.span_id == tool.context.span_id for a in appends)
    assert otel.total("ares_events.journal.retries", **{"gen_ai.operation.name": "chat"}) == 1
    assert otel.total("ares_events.journal.calls", **{"ares_events.journal.from_log": False}) == 3
    durations = otel.metrics()["gen_ai.client.operation.duration"]
    assert tuple(durations[0].explicit_bounds) == telemetry.GENAI_DURATION_BUCKETS


def test_a_rerun_is_answered_from_the_log_and_linked(otel: Otel, real_url: str) -> None:
    """Running the same loop again pays nothing: its calls are spans with from_log=True
    (counted as such), and its invoke_agent links to the first run's trace, whose
    context run.started stored."""
    calls = {"model": 0, "tool": 0}
    with ae.open_store(real_url) as store:
        _run(store, "run-b", calls)
        first_run = otel.span("invoke_agent")
        otel.exporter.clear()
        again = {"model": 0, "tool": 0}
        j = Journal(store, "run-b")
        with j:
            j.model_call(
                [{"role": "user", "content": PROMPT}],
                {"model": "gpt-test", "temperature": 0},
                call=lambda m, p: 1 / 0,
            )
        opening = next(iter(store.read("run-b", 1, 1)))
    assert again == {"model": 0, "tool": 0}
    tp = opening.metadata[TRACE_KEY]["traceparent"]
    assert tp.split("-")[1] == f"{first_run.context.trace_id:032x}"
    run = otel.span("invoke_agent")
    assert attrs(run)["ares_events.journal.resumed"] is True
    assert [ln.context.trace_id for ln in run.links] == [first_run.context.trace_id]
    assert [ln.context.span_id for ln in run.links] == [first_run.context.span_id]
    chat = otel.span("chat gpt-test")
    assert attrs(chat)["ares_events.journal.from_log"] is True
    assert otel.total("ares_events.journal.calls", **{"ares_events.journal.from_log": True}) == 1


@pytest.mark.slow  # starts child processes: the whole suite runs it
def test_a_run_resumed_after_sigkill_links_to_the_original(
    otel: Otel, real_url: str, tmp_path: Path
) -> None:
    """A run killed by SIGKILL inside its tool call is resumed in another process: the
    resumed invoke_agent links to the trace the killed process started (the trace of
    its exported chat span), and the answered model call is not paid again."""
    spans_file = tmp_path / "spans.jsonl"
    env = {**os.environ, "ARES_STORE_URL": real_url}
    proc = subprocess.run(
        [sys.executable, child.__file__, "--spans", str(spans_file), "--run-id", "run-k"],
        env=env,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    exported = [json.loads(line) for line in spans_file.read_text().splitlines()]
    chat = next(s for s in exported if s["name"] == "chat m-1")
    assert not any(s["name"] == "invoke_agent" for s in exported)  # it died with the process
    with ae.open_store(real_url) as store:
        result = child.loop(Journal(store, "run-k"), die=False)
        status = Journal.inspect(store, "run-k").status
    assert result == {"ticket": 1} and status == "completed"
    run = otel.span("invoke_agent")
    assert attrs(run)["ares_events.journal.resumed"] is True
    assert [f"{ln.context.trace_id:032x}" for ln in run.links] == [chat["trace_id"]]
    assert [f"{ln.context.span_id:016x}" for ln in run.links] == [chat["parent"]]
    resumed_chat = otel.span("chat m-1")
    assert attrs(resumed_chat)["ares_events.journal.from_log"] is True
    tool = otel.span("execute_tool create_ticket")
    assert attrs(tool)["ares_events.journal.from_log"] is False
    assert attrs(tool)["ares_events.journal.attempt"] == 1


def test_content_is_captured_only_when_opted_in(otel: Otel, tmp_path: Path) -> None:
    """By default no prompt, completion, tool argument or result is on any span or
    metric (nor the PostgreSQL password); the opt-in is tested next."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _run(store, "run-c", {"model": 0, "tool": 0})
    text = "\n".join(otel.strings())
    for marker in (PROMPT, ANSWER, TOOL_ARG, TEST_PASSWORD):
        assert marker not in text


def test_content_capture_opt_in(otel_content: Otel, tmp_path: Path) -> None:
    """With capture opted into, the messages, the completion and the tool arguments
    are on the chat and execute_tool spans (and never in a metric)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        _run(store, "run-d", {"model": 0, "tool": 0})
    chats = otel_content.spans("chat gpt-test")
    assert any(PROMPT in str(attrs(c).get("gen_ai.input.messages")) for c in chats)
    assert any(ANSWER in str(attrs(c).get("gen_ai.output.messages")) for c in chats)
    tool = otel_content.span("execute_tool create_ticket")
    assert TOOL_ARG in cast(str, attrs(tool)["gen_ai.tool.call.arguments"])
    for points in otel_content.metrics().values():
        for p in points:
            assert PROMPT not in repr(dict(p.attributes))


def test_journal_metric_attributes_are_bounded(otel: Otel, tmp_path: Path) -> None:
    """No metric of a journaled run carries a run id or a stream id."""
    runs = [f"run-unique-{i}" for i in range(3)]
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        for r in runs:
            _run(store, r, {"model": 0, "tool": 0})
    for name, points in otel.metrics().items():
        for p in points:
            assert set(p.attributes) <= telemetry.METRIC_ATTRIBUTES, (name, p.attributes)
            values = " ".join(map(str, p.attributes.values()))
            assert not any(r in values for r in runs), name


def test_supervisor_deaths_and_backoffs_are_span_events_and_metrics(
    otel: Otel, tmp_path: Path
) -> None:
    """A supervised agent that keeps dying: each death and backoff is an event of the
    supervise span, flapping is signalled, the restart cap is reached, and the metrics
    count deaths by cause kind (never by agent id)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        sup = supervision.ProcessSupervisor(
            store, max_restarts=2, backoff_base=0.01, backoff_cap=0.02, flap_deaths=2
        )
        sup.register("agent-x", [sys.executable, "-c", "raise SystemExit(3)"])
        sup.start()
        assert sup.run(tick=0.01, timeout=60)
    span = otel.span("ares_events.supervise")
    names = [e.name for e in span.events]
    assert names.count("ares_events.agent.death") == 3
    assert names.count("ares_events.supervisor.backoff") == 2
    assert names.count("ares_events.agent.resurrection") == 2
    assert "ares_events.agent.flapping" in names
    assert names[-1] == "ares_events.agent.gave_up"
    assert otel.total("ares_events.agent.deaths", **{"ares_events.death.cause": "exit"}) == 3
    assert otel.total("ares_events.agent.resurrections") == 2
    assert otel.total("ares_events.agent.gave_up") == 1
    for points in otel.metrics().values():
        for p in points:
            assert "agent-x" not in repr(dict(p.attributes))


@pytest.mark.parametrize("cause", ["killed by signal SIGKILL", "exit status 1", "weird"])
def test_death_causes_are_bounded(cause: str) -> None:
    """A death's cause becomes one of a few kinds for metrics."""
    from ares_events.agents.supervision_telemetry import cause_kind

    assert cause_kind(cause) in {"signal", "exit", "heartbeat", "lost", "other"}


def test_no_prompt_capture_for_a_journal_that_records_no_prompts(
    otel_content: Otel, tmp_path: Path
) -> None:
    """Even with capture opted into, a journal opened with record_prompts=False puts no
    messages on its spans (the user chose not to keep them)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        j = Journal(store, "run-np", record_prompts=False)
        with j:
            j.model_call([PROMPT], {"model": "m"}, call=lambda m, p: ModelReply("ok", {}))
            j.complete()
    assert PROMPT not in "\n".join(otel_content.strings())
    assert "gen_ai.input.messages" not in attrs(otel_content.span("chat m"))


def test_no_trace_context_is_stored_without_tracing(tmp_path: Path) -> None:
    """Without an SDK the journal writes exactly what it wrote before: no trace context
    in run.started's metadata."""
    telemetry._reset_for_tests()
    assert telemetry.current() is None
    with ae.open_store(f"sqlite:///{tmp_path / 'e.db'}") as store:
        with Journal(store, "run-off") as j:
            j.complete()
        opening = next(iter(store.read("run-off", 1, 1)))
    assert opening.type == "run.started"
    assert TRACE_KEY not in opening.metadata
