"""Signed approvals of LangGraph interrupts (ApprovalGate) with real graphs and the
ares-events saver, on SQLite and PostgreSQL: a node waits for a signed approval; the
approved resume lets its work run exactly once (also when the node runs again from its
start after a later resume); a forged, expired, replayed, reused or wrong-call approval,
and a resume that carries none, are refused with their typed error by the operator's
``resume`` (nothing recorded) and by the node itself (its work never runs, no approval
is used); the thread's record carries the approval and verifies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

import ares_events as ae
from ares_events.agents.approvals import Pending, sign_approval
from ares_events.core.catalog import new_event
from ares_events.integrations.langgraph import AresSaver
from ares_events.integrations.langgraph_approvals import PRESENTED, USED, ApprovalGate
from ares_events.records import export_record, verify_record
from tests.fixtures.approvals import ALICE, ERRORS, MALLORY, state
from tests.records.helpers import LOG


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/lg.db"
    return str(request.getfixturevalue("postgres_url"))


class Pay(TypedDict):
    amount: int
    rounds: int


class Bank:
    """A graph whose `pay` node pays only under a signed approval, ``rounds`` times
    (a cycle: each round is a new task of the node); with ``confirm``, the node also asks
    a plain question after the gate, so it runs again from its start."""

    def __init__(self, saver: AresSaver, *, confirm: bool = False, gates: int = 1) -> None:
        self.gate = ApprovalGate(saver.store, approvers=[ALICE.verifier])
        self.paid: list[int] = []
        self.keys: list[str] = []  # what the gate returned each time the node went on

        def pay(state: Pay) -> dict[str, Any]:
            for _ in range(gates):
                self.keys.append(self.gate.interrupt({"amount": state["amount"]}))
            if confirm:
                interrupt("sure?")
            self.paid.append(state["amount"])
            return {"rounds": state["rounds"] - 1}

        b = StateGraph(Pay)
        b.add_node("pay", pay)
        b.add_edge(START, "pay")
        b.add_conditional_edges("pay", lambda s: "pay" if s["rounds"] > 0 else END)
        self.graph = b.compile(checkpointer=saver)


def config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}


def approve(bank: Bank, thread: str) -> Command[Any]:
    """The approver signs what the thread waits for; the operator presents it."""
    return bank.gate.resume(config(thread), sign_approval(ALICE, bank.gate.pending(config(thread))))


def test_an_approved_resume_runs_the_node_once_and_the_record_verifies(url: str) -> None:
    """Paused at the gate (the node's work not done); approved and resumed; a plain
    question after the gate makes LangGraph run the node again from its start, and the
    gate lets the same task through with the approval it used (returning the same
    nonce, the side effect's idempotency key); the work runs once. The
    thread's record carries the approval, its use, and verifies with alice's key."""
    with AresSaver.from_url(url) as saver:
        bank = Bank(saver, confirm=True)
        out = bank.graph.invoke({"amount": 5, "rounds": 1}, config("t1"))
        assert "__interrupt__" in out and bank.paid == []
        out = bank.graph.invoke(approve(bank, "t1"), config("t1"))
        assert out["__interrupt__"][0].value == "sure?" and bank.paid == []
        out = bank.graph.invoke(Command(resume="yes"), config("t1"))
        assert out["rounds"] == 0 and bank.paid == [5]
        # The node went on twice (it ran again after "sure?"), with one key: the nonce.
        assert len(bank.keys) == 2 and len(set(bank.keys)) == 1 and len(bank.keys[0]) == 32
        types = [e.type for e in saver.store.read("langgraph/t1")]
        assert types.count(USED) == 1 and types.count(PRESENTED) == 1
        data = export_record(saver.store, "langgraph/t1", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert rep.ok, rep.findings
    assert [a["action"] for a in rep.approvals] == ["approve"]


def _bad(kind: str, bank: Bank, saver: AresSaver) -> str:
    """A note wrong in the way ``kind`` says, for the interrupt thread t2 waits on."""
    p = bank.gate.pending(config("t2"))
    if kind == "forged":
        return sign_approval(MALLORY, p)
    if kind == "expired":
        return sign_approval(ALICE, p, expires_in=-1)
    if kind == "wrong_call":
        return sign_approval(ALICE, Pending(p.run_id, p.step, "00" * 32, p.head))
    if kind == "reused":  # a valid approval of another thread
        bank.graph.invoke({"amount": 5, "rounds": 1}, config("t-other"))
        return sign_approval(ALICE, bank.gate.pending(config("t-other")))
    raise AssertionError(kind)


def _present(saver: AresSaver, thread: str, note: str, step: int) -> None:
    """Record an approval behind the operator's back (an attacker with write access)."""
    stream = f"langgraph/{thread}"
    saver.store.append(
        stream,
        [new_event(PRESENTED, "langgraph", {"approval": note, "step": step})],
        expected_version=saver.store.stream_version(stream),
    )


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_a_bad_approval_is_refused_and_the_node_does_not_run(url: str, kind: str) -> None:
    """The operator's resume refuses it and records nothing; recorded behind its back,
    the node refuses it whatever the graph is resumed with: the graph raises the typed
    error, the work does not run and no approval is used; the thread's record shows it."""
    with AresSaver.from_url(url) as saver:
        bank = Bank(saver)
        out = bank.graph.invoke({"amount": 5, "rounds": 1}, config("t2"))
        note = _bad(kind, bank, saver)
        before = state(saver.store)
        with pytest.raises(ERRORS[kind]):
            bank.gate.resume(config("t2"), note)
        assert state(saver.store) == before
        _present(saver, "t2", note, bank.gate.pending(config("t2")).step)
        nonce = note.split('"nonce":"')[1].split('"')[0]
        iid = out["__interrupt__"][0].id
        with pytest.raises(ERRORS[kind]):
            bank.graph.invoke(Command(resume={iid: nonce}), config("t2"))
        assert bank.paid == []
        assert USED not in [e.type for e in saver.store.read("langgraph/t2")]
        data = export_record(saver.store, "langgraph/t2", key=LOG).data
    # The record shows the approval presented and never used; verify-record flags it
    # unless it is authentic (a wrong-call approval is a valid note of another call).
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert {f.kind for f in rep.findings} == (set() if kind == "wrong_call" else {"approval"})


def test_a_resume_without_an_approval_is_refused(url: str) -> None:
    """A Command answering the gate's interrupt with no approval presented: ApprovalForged
    from the node, which does not run; a signed approval presented afterwards lets it run
    (the node checks the thread's record, not the answer that sticks to the task)."""
    with AresSaver.from_url(url) as saver:
        bank = Bank(saver)
        out = bank.graph.invoke({"amount": 5, "rounds": 1}, config("t3"))
        iid = out["__interrupt__"][0].id
        with pytest.raises(ae.ApprovalForged):
            bank.graph.invoke(Command(resume={iid: "approved"}), config("t3"))
        assert bank.paid == []
        bank.graph.invoke(approve(bank, "t3"), config("t3"))
        assert bank.paid == [5]


def test_an_approval_used_once_is_replayed_onto_the_next_round(url: str) -> None:
    """Two rounds of the same payment (two tasks of the node, the same arguments): the
    first round's approval, presented again for the second round, raises
    ApprovalReplayed and the second payment does not run; a fresh approval runs it."""
    with AresSaver.from_url(url) as saver:
        bank = Bank(saver)
        bank.graph.invoke({"amount": 5, "rounds": 2}, config("t4"))
        note = sign_approval(ALICE, bank.gate.pending(config("t4")))
        out = bank.graph.invoke(bank.gate.resume(config("t4"), note), config("t4"))
        assert bank.paid == [5] and "__interrupt__" in out
        _present(saver, "t4", note, bank.gate.pending(config("t4")).step)
        with pytest.raises(ae.ApprovalReplayed):
            bank.graph.invoke(Command(resume={out["__interrupt__"][0].id: "x"}), config("t4"))
        assert bank.paid == [5]
        assert bank.graph.invoke(approve(bank, "t4"), config("t4"))["rounds"] == 0
        assert bank.paid == [5, 5]


def test_two_gates_in_one_node_are_refused(tmp_path: Path) -> None:
    """A node with two gates: its task is the position an approval binds to, so the
    second gate is a ConfigError, not a second approval of the same task."""
    with AresSaver.from_url(f"sqlite:///{tmp_path}/lg.db") as saver:
        bank = Bank(saver, gates=2)
        bank.graph.invoke({"amount": 5, "rounds": 1}, config("t5"))
        with pytest.raises(ae.ConfigError, match="one gate per node"):
            bank.graph.invoke(approve(bank, "t5"), config("t5"))
        assert bank.paid == []
