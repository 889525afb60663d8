"""OpenAI Agents SDK tools with ``needs_approval`` under ``run_durably``, with the SDK's
scripted test model, on SQLite and PostgreSQL: the run pauses for a signed approval
instead of the SDK's ``RunState.approve()``; a valid approval lets exactly the approved
call run once; a forged, expired, replayed, reused or wrong-call approval raises its typed
error through the SDK and nothing runs; a policy callable decides per call; the record
of the run carries the approval and verifies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call

import ares_events as ae
from ares_events.agents.approvals import Pending, sign_approval
from ares_events.agents.journal import Journal
from ares_events.agents.runs import pending_call, resume_run
from ares_events.core.catalog import new_event
from ares_events.integrations.openai_agents_journal import run_durably
from ares_events.records import export_record, verify_record
from tests.fixtures.approvals import ALICE, ERRORS, MALLORY
from tests.records.helpers import LOG

set_tracing_disabled(True)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/oai.db"
    return str(request.getfixturevalue("postgres_url"))


class Bank:
    """An agent that asks to pay ``amounts`` (one tool call each, in one response) and
    then says it is done; ``pay`` needs approval as ``policy`` says."""

    def __init__(self, amounts: list[int], policy: Any = True) -> None:
        self.amounts, self.policy = amounts, policy
        self.paid: list[int] = []
        self.model_calls = 0

    def agent(self) -> Agent[Any]:
        def respond(call: Any) -> Any:
            self.model_calls += 1
            if isinstance(call.input, str) or len(call.input) == 1:
                return [
                    function_call("pay", {"amount": a}, call_id=f"c{i}")
                    for i, a in enumerate(self.amounts)
                ]
            return [assistant_message("paid")]

        @function_tool(needs_approval=self.policy)
        def pay(amount: int) -> str:
            self.paid.append(amount)
            return f"paid {amount}"

        model = ScriptedModel([ModelStep.respond(respond) for _ in range(4)])
        return Agent(name="bank", model=model, tools=[pay])

    def run(self, store: Any, run_id: str) -> Any:
        return asyncio.run(
            run_durably(self.agent(), "pay", store=store, run_id=run_id, approvers=[ALICE.verifier])
        )


def approve(store: Any, run_id: str, key: Any = ALICE, **kw: Any) -> str:
    note = sign_approval(key, pending_call(store, run_id), **kw)
    resume_run(store, run_id, by="alice", approval=note, approvers=[key.verifier])
    return note


def events(store: Any) -> list[tuple[str, int, bytes]]:
    """The store's events but the journal's gate decisions (each open of a run appends
    one): what 'nothing happened' compares."""
    return [(e.stream_id, e.version, e.hash) for e in store.read_all() if e.type != "run.gate"]


def test_a_signed_approval_lets_exactly_the_approved_call_run_once(url: str) -> None:
    """First run: paused for approval, the tool not run (the SDK's own gate is not used:
    no interruptions to approve client-side). Approved: the next run replays the model's
    answer and runs the tool once; a third run replays everything. The record verifies,
    its approval checked with alice's key."""
    bank = Bank([5])
    with ae.open_store(url) as store:
        with pytest.raises(ae.ApprovalRequired):
            bank.run(store, "pay-1")
        assert bank.paid == [] and Journal.inspect(store, "pay-1").status == "paused"
        approve(store, "pay-1")
        assert bank.run(store, "pay-1").final_output == "paid"
        assert bank.run(store, "pay-1").final_output == "paid"
        assert bank.paid == [5] and bank.model_calls == 2
        data = export_record(store, "pay-1", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert rep.ok, rep.findings
    assert [a["action"] for a in rep.approvals] == ["approve"]


def _present(store: Any, run_id: str, note: str) -> None:
    """An approval appended behind the operator API's back."""
    store.append(
        run_id,
        [new_event("run.resumed", "journal", {"by": "x", "approval": note})],
        expected_version=store.stream_version(run_id),
    )


def _bad(kind: str, store: Any) -> str:
    p = pending_call(store, "pay-2")
    if kind == "forged":
        return sign_approval(MALLORY, p)
    if kind == "expired":
        return sign_approval(ALICE, p, expires_in=-1)
    if kind == "wrong_call":
        return sign_approval(ALICE, Pending(p.run_id, p.step, "00" * 32, p.head))
    if kind == "reused":
        return sign_approval(ALICE, Pending("pay-other", p.step, p.args, p.head))
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_a_bad_approval_is_refused_through_the_sdk(url: str, kind: str) -> None:
    """An approval wrong in one way, presented on the run: run_durably raises its typed
    error (not the SDK's wrapper), the tool does not run and nothing is written."""
    bank = Bank([5])
    with ae.open_store(url) as store:
        with pytest.raises(ae.ApprovalRequired):
            bank.run(store, "pay-2")
        _present(store, "pay-2", _bad(kind, store))
        before = events(store)
        with pytest.raises(ERRORS[kind]):
            bank.run(store, "pay-2")
        assert bank.paid == [] and events(store) == before


def test_a_replayed_approval_is_refused_through_the_sdk(url: str) -> None:
    """Two calls of the same tool with the same arguments: the first one's approval,
    presented again for the second, raises ApprovalReplayed and the second does not run;
    a fresh approval lets it run."""
    bank = Bank([5, 5])
    with ae.open_store(url) as store:
        with pytest.raises(ae.ApprovalRequired):
            bank.run(store, "pay-3")
        first = approve(store, "pay-3")
        with pytest.raises(ae.ApprovalRequired):
            bank.run(store, "pay-3")
        assert bank.paid == [5]
        _present(store, "pay-3", first)
        before = events(store)
        with pytest.raises(ae.ApprovalReplayed):
            bank.run(store, "pay-3")
        assert bank.paid == [5] and events(store) == before
        approve(store, "pay-3")
        assert bank.run(store, "pay-3").final_output == "paid"
        assert bank.paid == [5, 5]


def test_an_approval_policy_decides_per_call(url: str) -> None:
    """The SDK's policy callable (ctx, params, call_id): a small payment runs at once, a
    large one waits for a signed approval."""

    def large(ctx: Any, params: dict[str, Any], call_id: str) -> bool:
        return int(params["amount"]) > 100

    bank = Bank([5, 500], policy=large)
    with ae.open_store(url) as store:
        with pytest.raises(ae.ApprovalRequired):
            bank.run(store, "pay-4")
        assert bank.paid == [5]
        approve(store, "pay-4")
        assert bank.run(store, "pay-4").final_output == "paid"
        assert bank.paid == [5, 500]
