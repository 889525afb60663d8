"""verify-record holds every signed approval to the event that carries it, as the library
does when it accepts one: a ``result`` / ``not_done`` verdict must name the outcome the
event records and the call it settles (an outsider's finding: a forged result under an
honest note verified). A redacted field an approval check needs makes that check
``unchecked`` (never a finding, never verified); disclosures that restore it check it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.approvals import Pending, sign_approval
from ares_events.agents.journal import Journal
from ares_events.agents.recording import hash_of
from ares_events.agents.runs import pending_call, resolve_step, resume_run
from ares_events.cli import main
from ares_events.core.catalog import new_event
from ares_events.records import export_record, verify_record
from tests.fixtures.approvals import ALICE, paused
from tests.records.helpers import LOG

APPROVERS = [ALICE.verifier.text]


def _in_doubt(store: Any, run: str) -> Pending:
    """A run whose `wire` call at step 1 died in flight (requested, no outcome): what a
    verdict on it must name."""

    def dies(args: Any, key: str) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Journal(store, run).tool_call("wire", {"amount": 5}, call=dies)
    with pytest.raises(ae.InDoubtToolCall):
        Journal(store, run).tool_call("wire", {"amount": 5}, call=dies)
    return pending_call(store, run, 1)


def _append(store: Any, run: str, type_: str, payload: dict[str, Any]) -> None:
    """An event appended behind the operator API's back (an attacker with write access)."""
    v = store.stream_version(run)
    store.append(run, [new_event(type_, "journal", payload)], expected_version=v)


@pytest.mark.parametrize("verdict", ["result", "not_done"])
def test_an_honest_verdict_verifies(tmp_path: Path, verdict: str) -> None:
    """resolve_step with a signed verdict: the record verifies, the approval listed."""
    with ae.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        p = _in_doubt(store, "r")
        if verdict == "result":
            note = sign_approval(ALICE, p, action="result", outcome=hash_of({"t": 7}, "result"))
            kw: dict[str, Any] = {"result": {"t": 7}}
        else:
            note = sign_approval(ALICE, p, action="not_done")
            kw = {"not_done": True}
        resolve_step(store, "r", 1, by="alice", approval=note, approvers=[ALICE.verifier], **kw)
        data = export_record(store, "r", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=APPROVERS)
    assert rep.ok, rep.findings
    assert [(a["action"], a.get("unchecked")) for a in rep.approvals] == [(verdict, None)]


# (event type, its payload beyond the idempotency key, the note's action and outcome,
# what verify-record's finding says)
FORGED: dict[str, tuple[str, dict[str, Any], str, Any, str]] = {
    "other_outcome": ("tool.returned", {"result": "X"}, "result", {"t": 7}, "its outcome differ"),
    "not_done_on_returned": (
        "tool.returned", {"result": "X"}, "not_done", None, "its action, outcome differ",
    ),
    "result_on_not_done": (
        "tool.call.not_done", {"by": "x"}, "result", {"t": 7}, "its action, outcome differ",
    ),
    "result_on_error": ("tool.returned", {"error": "boom"}, "result", None, "its action, outcome"),
    "unrequested_call": (
        "tool.returned", {"idempotency_key": "r:9", "result": 1}, "result", 1,
        "settles call 'r:9', which no earlier event requests",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(FORGED))
def test_a_verdict_the_event_contradicts_is_a_finding(tmp_path: Path, case: str) -> None:
    """Alice's valid note appended with an event that records another verdict: the
    library refuses the pair before appending; verify-record names what differs."""
    type_, extra, action, outcome, finding = FORGED[case]
    with ae.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        p = _in_doubt(store, "r")
        digest = hash_of(outcome, "result") if action == "result" else None
        note = sign_approval(ALICE, p, action=action, outcome=digest)
        if case in ("other_outcome", "not_done_on_returned"):  # resolve_step refuses them
            with pytest.raises(ae.ApprovalWrongCall):
                resolve_step(
                    store, "r", 1, result=extra["result"], by="x", approval=note,
                    approvers=[ALICE.verifier],
                )  # fmt: skip
        _append(store, "r", type_, {"idempotency_key": "r:1", **extra, "approval": note})
        data = export_record(store, "r", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=APPROVERS)
    assert [f.kind for f in rep.findings] == ["approval"]
    assert finding in rep.findings[0].detail


def test_a_verdict_on_another_call_is_a_finding(tmp_path: Path) -> None:
    """A valid verdict on the in-doubt call at step 1, carried by a tool.returned that
    settles another call (step 2, other arguments): its step and args differ from it."""
    with ae.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        p = _in_doubt(store, "r")
        _append(store, "r", "tool.call.requested", {
            "name": "wire", "args": {"amount": 9}, "idempotency_key": "r:2", "step": 2,
            "attempt": 1, "args_hash": hash_of({"amount": 9}, "args"),
        })  # fmt: skip
        head = store.head("r")
        assert head is not None
        note = sign_approval(
            ALICE, Pending("r", 1, p.args, head.hash), action="result",
            outcome=hash_of("done", "result"),
        )  # fmt: skip
        _append(store, "r", "tool.returned", {"idempotency_key": "r:2", "result": "done",
                                              "approval": note})  # fmt: skip
        data = export_record(store, "r", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=APPROVERS)
    assert [f.kind for f in rep.findings] == ["approval"]
    assert "its step, args differ from the tool.returned that carries it and the call 'r:2'" in (
        rep.findings[0].detail
    )


def _approved_run(store: Any) -> None:
    """`r`: paused for approval of `pay`, approved by ALICE, the call ran, completed."""
    loop = paused(store, "r")
    note = sign_approval(ALICE, pending_call(store, "r"))
    resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
    loop()


REDACTED = {
    "$.approval": ["approval"],
    "$.approved": ["use"],
    "$.step": ["name", "step"],
    "$.name": ["name"],
    "$.args_hash": ["args"],
    "$.args": ["args"],
}


@pytest.mark.parametrize("path", sorted(REDACTED))
def test_a_redacted_field_leaves_its_approval_check_unchecked(tmp_path: Path, path: str) -> None:
    """An honest record exported with ``--redact PATH`` verifies; the approval says which
    checks a redaction kept it from; with the disclosures every check is made again."""
    with ae.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        _approved_run(store)
        ex = export_record(store, "r", key=LOG, redact_paths=[path])
    assert ex.disclosures is not None
    rep = verify_record(ex.data, [LOG.verifier.text], approvers=APPROVERS)
    assert rep.ok, rep.findings
    assert [a.get("unchecked") for a in rep.approvals] == [REDACTED[path]]
    full = verify_record(
        ex.data, [LOG.verifier.text], approvers=APPROVERS, disclosures=ex.disclosures
    )
    assert full.ok and [a.get("unchecked") for a in full.approvals] == [None]
    # The CLI: exit 0 both ways, and the JSON names what was left unchecked.
    record, disc = tmp_path / "r.json", tmp_path / "r.disclosures.json"
    record.write_bytes(ex.data)
    disc.write_text(json.dumps(ex.disclosures))
    vkey, akey = tmp_path / "log.vkey", tmp_path / "alice.vkey"
    vkey.write_text(LOG.verifier.text)
    akey.write_text(ALICE.verifier.text)
    argv = ["verify-record", str(record), "--vkey", str(vkey), "--approver", str(akey), "-q"]
    assert main(argv) == 0
    assert main([*argv, "--disclosures", str(disc)]) == 0


def test_a_forged_call_under_a_redacted_field_is_still_caught_when_disclosed(
    tmp_path: Path,
) -> None:
    """A call appended under a valid approval with other arguments, exported with its
    args_hash redacted: unchecked without the disclosures, a finding with them."""
    with ae.open_store(f"sqlite:///{tmp_path}/s.db") as store:
        paused(store, "r")
        p = pending_call(store, "r")
        note = sign_approval(ALICE, p)
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        nonce = note.split('"nonce":"')[1].split('"')[0]
        _append(store, "r", "tool.call.requested", {
            "name": "pay", "args": {"amount": 5000}, "idempotency_key": "r:1", "step": p.step,
            "attempt": 1, "args_hash": "ff" * 32, "approved": nonce,
        })  # fmt: skip
        ex = export_record(store, "r", key=LOG, redact_paths=["$.args_hash"])
    rep = verify_record(ex.data, [LOG.verifier.text], approvers=APPROVERS)
    assert rep.ok and [a.get("unchecked") for a in rep.approvals] == [["args"]]
    full = verify_record(
        ex.data, [LOG.verifier.text], approvers=APPROVERS, disclosures=ex.disclosures
    )
    assert {f.kind for f in full.findings} == {"approval"}
    assert any("whose args differ" in f.detail for f in full.findings)
