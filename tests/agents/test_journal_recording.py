"""What the journal records about a request, how a divergence is shown, redaction and the
hash-only mode, large prompts in blobs, read-only inspection, and the decorator forms."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.journal import (
    AsyncJournal,
    InDoubtToolCall,
    Journal,
    ReplayDivergence,
    RunNotFound,
    journaled_step,
    journaled_tool,
    redact_keys,
)
from ares_events.agents.recording import hash_of
from ares_events.agents.runs import inspect_run, list_runs
from ares_events.errors import ConfigError


def system(date: str) -> list[dict[str, str]]:
    """A prompt with the usual culprit: a timestamp in the system prompt."""
    return [
        {"role": "system", "content": f"You are a careful agent. Today is {date}. Be brief."},
        {"role": "user", "content": "What changed?"},
    ]


def answer(messages: Any, params: Mapping[str, Any]) -> str:
    """A model that echoes the last message."""
    return f"echo {messages[-1]['content']}"


def requested(store: ae.EventStore, run_id: str) -> list[dict[str, Any]]:
    """Payloads of the run's model.call.requested events."""
    return [dict(e.payload) for e in store.read(run_id) if e.type == "model.call.requested"]


def snapshot_count(store: ae.EventStore) -> int:
    """Stored snapshots (zero when the store keeps none)."""
    if ae.Capability.SNAPSHOTS not in store.capabilities:
        return 0
    return len(list(store.snapshots.list(None)))


def store_fingerprint(store: ae.EventStore) -> tuple[Any, ...]:
    """Every stream's version, the last global position and the snapshot count."""
    last = max((e.position for e in store.read_all()), default=0)
    return tuple(sorted(store.streams())), last, snapshot_count(store)


# -- what was asked is recorded ----------------------------------------------------------------


def test_a_model_request_records_its_messages_params_and_hash(store: ae.EventStore) -> None:
    """model.call.requested holds the canonical messages and params and the blake3 of the
    messages; inspection shows what each step asked and got."""
    msgs = system("2024-01-01")
    Journal(store, "rec-1").model_call(msgs, {"temperature": 0, "model": "m1"}, call=answer)
    req = requested(store, "rec-1")[0]
    assert req["messages"] == msgs and req["params"] == {"temperature": 0, "model": "m1"}
    assert req["messages_hash"] == hash_of(msgs, "messages")
    info = Journal.inspect(store, "rec-1")
    step = info.steps[0]
    assert step.request == {"messages": msgs, "params": {"temperature": 0, "model": "m1"}}
    assert info.state["completions"] == {"1": "echo What changed?"}  # the raw fold too
    assert step.outcome == "echo What changed?" and step.kind == "model"


def test_divergence_names_the_path_and_both_values(store: ae.EventStore) -> None:
    """A replay whose system prompt changed raises ReplayDivergence whose message names
    where (messages[0].content) and shows the recorded and the new value; the values are
    attributes too, and the model is not called."""
    Journal(store, "div-1").model_call(system("2024-01-01"), call=answer)
    called: list[Any] = []
    with pytest.raises(ReplayDivergence) as ei:
        Journal(store, "div-1").model_call(system("2024-01-02"), call=lambda m, p: called.append(m))
    exc = ei.value
    assert exc.step == 1 and exc.path == "messages[0].content" and not exc.hashes_only
    assert "2024-01-01" in str(exc) and "2024-01-02" in str(exc)
    assert "messages[0].content" in str(exc)
    assert exc.recorded is not None and "2024-01-01" in exc.recorded
    assert exc.current is not None and "2024-01-02" in exc.current
    assert called == []


def test_divergence_in_a_long_prompt_shows_the_part_that_changed(store: ae.EventStore) -> None:
    """In a 20,000-character prompt the message shows a short window around the first
    difference, on both sides, not the whole prompt."""
    head = "lorem ipsum " * 800
    Journal(store, "div-2").model_call(
        [{"role": "user", "content": head + "OLD tail"}], call=answer
    )
    with pytest.raises(ReplayDivergence) as ei:
        Journal(store, "div-2").model_call(
            [{"role": "user", "content": head + "NEW tail"}], call=answer
        )
    msg = str(ei.value)
    assert "OLD" in msg and "NEW" in msg and len(msg) < 400


def test_divergence_names_an_added_message_and_other_tool_args(store: ae.EventStore) -> None:
    """An extra message shows as (absent) on the recorded side; different tool args at a
    recorded tool step are a divergence naming args.<key> (the tool is not called)."""
    j = Journal(store, "div-3")
    j.model_call([{"role": "user", "content": "a"}], call=answer)
    j.tool_call("mail", {"to": "ops@example.com", "n": 1}, call=lambda a, k: "sent")
    with pytest.raises(ReplayDivergence) as ei:
        Journal(store, "div-3").model_call(
            [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], call=answer
        )
    assert ei.value.path == "messages[1]" and ei.value.recorded == "(absent)"
    j3 = Journal(store, "div-3")
    j3.model_call([{"role": "user", "content": "a"}], call=answer)
    with pytest.raises(ReplayDivergence) as ei:
        j3.tool_call("mail", {"to": "all@example.com", "n": 1}, call=lambda a, k: pytest.fail())
    assert ei.value.path == "args.to" and "ops@example.com" in str(ei.value)
    assert "all@example.com" in str(ei.value)


def test_redaction_keeps_secrets_out_of_the_log_and_errors(store: ae.EventStore) -> None:
    """With redact=redact_keys("api_key", "authorization") no secret reaches the stored
    events (payload bytes), the divergence message or the inspection; a rotated secret is
    not a divergence; a changed visible field still is, shown redacted."""
    secret, rotated = "sk-live-0123456789abcdef", "sk-live-fedcba9876543210"
    redact = redact_keys("api_key", "authorization")

    def msgs(key: str, q: str) -> list[dict[str, Any]]:
        return [{"role": "user", "content": q, "authorization": f"Bearer {key}"}]

    j = Journal(store, "red-1", redact=redact)
    j.model_call(msgs(secret, "q1"), {"api_key": secret, "temperature": 0}, call=answer)
    j.tool_call("fetch", {"url": "https://x", "api_key": secret}, call=lambda a, k: "ok")
    raw = b"".join(e.payload_bytes for e in store.read("red-1"))
    assert secret.encode() not in raw and b"[redacted]" in raw
    # A rotated key replays fine: what is compared is what was recorded.
    j2 = Journal(store, "red-1", redact=redact)
    j2.model_call(msgs(rotated, "q1"), {"api_key": rotated, "temperature": 0}, call=answer)
    j2.tool_call("fetch", {"url": "https://x", "api_key": rotated}, call=lambda a, k: "no")
    with pytest.raises(ReplayDivergence) as ei:
        Journal(store, "red-1", redact=redact).model_call(
            msgs(secret, "q2"), {"api_key": secret}, call=answer
        )
    assert secret not in str(ei.value) and "q2" in str(ei.value)
    shown = json.dumps(Journal.inspect(store, "red-1").to_dict(), default=str)
    assert secret not in shown and rotated not in shown


def test_hash_only_mode_stores_no_prompt_and_says_so(store: ae.EventStore) -> None:
    """record_prompts=False stores only the messages' hash (no message text anywhere in
    the log); a divergence then says only hashes are recorded; inspection shows the hash."""
    Journal(store, "hash-1", record_prompts=False).model_call(system("2024-01-01"), call=answer)
    raw = b"".join(e.payload_bytes for e in store.read("hash-1"))
    assert b"careful agent" not in raw
    assert "messages" not in requested(store, "hash-1")[0]
    with pytest.raises(ReplayDivergence) as ei:
        Journal(store, "hash-1", record_prompts=False).model_call(system("2024-01-02"), call=answer)
    assert ei.value.hashes_only and "only hashes are recorded" in str(ei.value)
    recorded_hash = requested(store, "hash-1")[0]["messages_hash"]
    assert ei.value.recorded == recorded_hash[:16] and recorded_hash[:16] in str(ei.value)
    assert ei.value.current and ei.value.current != ei.value.recorded
    step = Journal.inspect(store, "hash-1").steps[0]
    assert step.request is not None and "messages" not in step.request
    assert step.request_hash == requested(store, "hash-1")[0]["messages_hash"]


def test_a_large_prompt_spills_to_blobs_and_replays(tmp_path: Path) -> None:
    """A prompt larger than the spill threshold goes to the blob store through the normal
    append path; replay, divergence and inspection read it back."""
    url = f"sqlite:///{tmp_path / 'big.db'}"
    big = [{"role": "user", "content": "x" * 200_000}]
    with ae.open_store(url, spill_threshold=4096) as store:
        Journal(store, "big-1").model_call(big, call=lambda m, p: "fine")
        req = next(e for e in store.read("big-1") if e.type == "model.call.requested")
        assert req.payload_ref is not None
        assert Journal(store, "big-1").model_call(big, call=lambda m, p: pytest.fail()) == "fine"
        with pytest.raises(ReplayDivergence) as ei:
            Journal(store, "big-1").model_call(
                [{"role": "user", "content": "x" * 199_999 + "y"}], call=answer
            )
        assert ei.value.path == "messages[0].content"
        assert Journal.inspect(store, "big-1").steps[0].request["messages"] == big
    assert any((tmp_path / "big.db.blobs").rglob("*"))


# -- looking is read-only ---------------------------------------------------------------------


def test_inspect_appends_nothing_where_opening_would(store: ae.EventStore) -> None:
    """Journal.inspect and list_runs on running, paused, in-doubt and refused runs leave
    every stream version, the global position and the snapshots as they were (opening a
    Journal on the same runs appends a gate decision)."""
    Journal(store, "ro-run", code_revision="r1").model_call(system("d"), call=answer)
    Journal(store, "ro-pause").interrupt("approval")
    j = Journal(store, "ro-doubt")
    with pytest.raises(KeyboardInterrupt):
        j.tool_call("t", {}, call=lambda a, k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(InDoubtToolCall):
        Journal(store, "ro-doubt").tool_call("t", {}, call=lambda a, k: 1)
    before = store_fingerprint(store)
    for run_id in ("ro-run", "ro-pause", "ro-doubt"):
        info = Journal.inspect(store, run_id)
        assert info.ok and info.run_id == run_id
    statuses = {r.run_id: r.status for r in list_runs(store)}
    assert statuses == {"ro-run": "running", "ro-pause": "paused", "ro-doubt": "in_doubt"}
    assert [s.key for s in inspect_run(store, "ro-doubt").in_doubt] == ["ro-doubt:1"]
    assert store_fingerprint(store) == before
    Journal(store, "ro-run", code_revision="r1")
    assert store_fingerprint(store) != before  # the runner's gate decision


def test_inspecting_what_is_not_a_run_raises_run_not_found(store: ae.EventStore) -> None:
    """An unknown id or a stream that is not a run (first event is not run.started) is
    RunNotFound (a LookupError) naming the run, and nothing is created."""
    ae.emit(store, "agent-1", "agent.started", "runtime", {"instance_id": "i-1"})
    with pytest.raises(RunNotFound, match="no such run"):
        Journal.inspect(store, "nope")
    with pytest.raises(LookupError, match="not a run"):
        Journal.inspect(store, "agent-1")
    assert store.stream_version("nope") == 0
    assert [r.run_id for r in list_runs(store)] == []


def test_async_inspect_is_read_only(store: ae.EventStore) -> None:
    """AsyncJournal.inspect returns the same view without appending."""
    Journal(store, "ro-async").model_call(system("d"), call=answer)
    before = store_fingerprint(store)
    info = asyncio.run(AsyncJournal.inspect(store, "ro-async"))
    assert info.steps[0].outcome == "echo What changed?"
    assert store_fingerprint(store) == before


# -- decorators --------------------------------------------------------------------------------


class Mailer:
    """A downstream system that honours idempotency keys."""

    def __init__(self) -> None:
        self.sent: dict[str, dict[str, Any]] = {}
        self.invocations = 0

    def send(self, to: str, subject: str = "hi", *, idempotency_key: str) -> dict[str, Any]:
        self.invocations += 1
        self.sent.setdefault(idempotency_key, {"to": to, "subject": subject})
        return {"id": idempotency_key}


def test_journal_tool_decorator_records_bound_args_and_passes_the_key(
    store: ae.EventStore,
) -> None:
    """@journal.tool: a call is a journaled tool call whose args are the bound arguments
    (defaults applied, the key left out) and whose idempotency_key parameter receives
    run_id:step; replayed, the function is not called."""
    mailer = Mailer()
    j = Journal(store, "dec-1")
    send = j.tool(mailer.send, name="mail")
    assert send("ops@example.com") == {"id": "dec-1:1"}
    req = next(e.payload for e in store.read("dec-1") if e.type == "tool.call.requested")
    assert req["name"] == "mail" and req["args"] == {"to": "ops@example.com", "subject": "hi"}
    send2 = Journal(store, "dec-1").tool(mailer.send, name="mail")
    assert send2("ops@example.com") == {"id": "dec-1:1"} and mailer.invocations == 1


def test_journaled_step_and_tool_use_the_active_journal(store: ae.EventStore) -> None:
    """Module-level @journaled_step / @journaled_tool work inside `with journal:`; a step
    (idempotent) whose process died is run again, a tool's result is replayed; outside any
    journal they raise ConfigError."""
    runs: list[int] = []

    @journaled_step
    def roll(sides: int) -> int:
        runs.append(sides)
        return 4

    @journaled_tool(name="charge", idempotent=False)
    def charge(amount: int, *, idempotency_key: str) -> str:
        return f"charged {amount} as {idempotency_key}"

    with Journal(store, "dec-2") as j:
        assert roll(6) == 4 and charge(5) == "charged 5 as dec-2:2"
        assert j.position == 2
    with Journal(store, "dec-2"):
        assert roll(6) == 4 and charge(5) == "charged 5 as dec-2:2"
    assert runs == [6]
    with pytest.raises(ConfigError, match="no journal is active"):
        roll(6)


def test_async_decorators_go_through_the_async_journal(store: ae.EventStore) -> None:
    """A coroutine function decorated with AsyncJournal.tool (or @journaled_tool under
    `async with`) is awaited once; on replay its recorded result comes back."""
    awaited: list[str] = []

    @journaled_tool
    async def fetch(url: str, *, idempotency_key: str) -> str:
        await asyncio.sleep(0)
        awaited.append(idempotency_key)
        return f"body of {url}"

    async def get(url: str, *, idempotency_key: str) -> str:
        awaited.append(idempotency_key)
        return f"body of {url}"

    async def scenario() -> list[str]:
        out = []
        for _ in range(2):
            async with await AsyncJournal.open(store, "dec-3") as j:
                out.append(await fetch("https://x"))
                out.append(await j.tool(get)("https://y"))
        return out

    assert asyncio.run(scenario()) == ["body of https://x", "body of https://y"] * 2
    assert awaited == ["dec-3:1", "dec-3:2"]


@pytest.fixture
def memory_store() -> Iterator[ae.EventStore]:
    """A private in-memory store."""
    with ae.open_store("memory://") as s:
        yield s


def test_a_decorated_method_leaves_self_out_of_the_args(memory_store: ae.EventStore) -> None:
    """A method decorated at class level records its arguments without self."""

    class Client:
        @journaled_tool
        def lookup(self, q: str) -> str:
            return q.upper()

    with Journal(memory_store, "dec-4"):
        assert Client().lookup("abc") == "ABC"
    req = next(e.payload for e in memory_store.read("dec-4") if e.type == "tool.call.requested")
    assert req["args"] == {"q": "abc"} and req["name"] == "lookup"
