"""Signed approvals on SQLite and PostgreSQL: forged, expired, replayed, reused and
wrong-call approvals are refused with their typed error, nothing runs and the store is
unchanged (presented through resume_run, or appended behind its back and met by the
journal); a valid approval lets exactly one call run once, also across a SIGKILL between
approval and call (child processes); the CLI signs; verify-record checks approvals."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.approvals import Pending, sign_approval
from ares_events.agents.journal import Journal
from ares_events.agents.runs import pending_call, resume_run
from ares_events.cli import main
from ares_events.core.catalog import new_event
from ares_events.integrations.langgraph_approvals import ApprovalGate
from ares_events.records import export_record, verify_record
from tests.fixtures.approvals import ALICE, ERRORS, MALLORY, Loop, paused, state
from tests.records.helpers import LOG

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/a.db"
    return str(request.getfixturevalue("postgres_url"))


def present(store: Any, run: str, note: str) -> None:
    """Append an approval behind the operator API's back (an attacker with write access)."""
    v = store.stream_version(run)
    store.append(
        run,
        [new_event("run.resumed", "journal", {"by": "x", "approval": note})],
        expected_version=v,
    )


def test_a_valid_approval_runs_the_call_exactly_once(url: str) -> None:
    """Paused for approval; approved; the call runs once, later runs replay it."""
    with ae.open_store(url) as store:
        loop = paused(store, "r")
        assert loop.ran == []
        note = sign_approval(ALICE, pending_call(store, "r"))
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        loop()
        loop()
        assert loop.ran == ["r:1"]
        assert Journal.inspect(store, "r").status == "completed"
        data = export_record(store, "r", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert rep.ok and [a["action"] for a in rep.approvals] == ["approve"]
    assert {f.kind for f in verify_record(data, [LOG.verifier.text]).findings} == {"approval"}


def _bad(kind: str, store: Any, loop: Loop) -> str:
    """An approval of the paused run `r` that is wrong in the way `kind` says."""
    p = pending_call(store, "r")
    if kind == "forged":
        return sign_approval(MALLORY, p)
    if kind == "expired":
        return sign_approval(ALICE, p, expires_in=-1)
    if kind == "wrong_call":
        return sign_approval(ALICE, Pending(p.run_id, p.step, "00" * 32, p.head))
    if kind == "reused":  # a valid approval of another run
        other = paused(store, "r-other")
        return sign_approval(ALICE, pending_call(store, "r-other")) if other else ""
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", sorted(ERRORS))
def test_a_bad_approval_is_refused_and_changes_nothing(url: str, kind: str) -> None:
    """resume_run refuses it before appending; appended behind its back, the journal
    refuses it before the call runs and writes nothing."""
    with ae.open_store(url) as store:
        loop = paused(store, "r")
        note = _bad(kind, store, loop)
        before = state(store)
        with pytest.raises(ERRORS[kind]):
            resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        assert state(store) == before
        present(store, "r", note)
        j = loop.journal()  # opening a run appends its gate decision
        before = state(store)
        with pytest.raises(ERRORS[kind]):
            loop.steps(j)
        assert state(store) == before and loop.ran == []


def test_a_replayed_approval_is_refused(url: str) -> None:
    """The approval that let the first call run, presented again for the second call
    (same tool, same arguments): refused, nothing runs, nothing is written."""
    with ae.open_store(url) as store:
        loop = paused(store, "r", gated_calls=2)
        note = sign_approval(ALICE, pending_call(store, "r"))
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        with pytest.raises(ae.ApprovalRequired):
            loop()
        assert loop.ran == ["r:1"]
        before = state(store)
        with pytest.raises(ae.ApprovalReplayed):
            resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        assert state(store) == before
        present(store, "r", note)
        j = loop.journal()
        before = state(store)
        with pytest.raises(ae.ApprovalReplayed):
            loop.steps(j)
        assert state(store) == before and loop.ran == ["r:1"]
        # A fresh approval of the second call lets it run, once.
        resume_run(
            store,
            "r",
            by="alice",
            approval=sign_approval(ALICE, pending_call(store, "r")),
            approvers=[ALICE.verifier],
        )
        loop()
        assert loop.ran == ["r:1", "r:2"]


def test_an_approval_must_match_a_request_no_call_consumed(url: str) -> None:
    """Once the approved call ran, the running run waits for no approval: pending_call
    says so, and an approval signed against the consumed request (valid signature, fresh
    nonce, the run's current head) is refused by resume_run, which appends nothing."""
    with ae.open_store(url) as store:
        loop = paused(store, "r")
        asked = pending_call(store, "r")
        note = sign_approval(ALICE, asked)
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        loop.journal().tool_call("pay", {"amount": 5}, call=loop.pay, needs_approval=True)
        assert loop.ran == ["r:1"] and Journal.inspect(store, "r").status == "running"
        with pytest.raises(ae.RunNotRunnable, match="waits for no approval"):
            pending_call(store, "r")
        head = store.head("r")
        assert head is not None
        stale = sign_approval(ALICE, Pending("r", asked.step, asked.args, head.hash))
        before = state(store)
        with pytest.raises(ae.RunNotRunnable):
            resume_run(store, "r", by="alice", approval=stale, approvers=[ALICE.verifier])
        assert state(store) == before and loop.ran == ["r:1"]


def test_verify_record_checks_the_call_that_used_an_approval(url: str) -> None:
    """A call recorded (behind the journal's back) as running under a valid approval of
    another call (other arguments): the record's signatures and chain verify, and
    verify-record reports that the approval names another call."""
    with ae.open_store(url) as store:
        paused(store, "r")
        p = pending_call(store, "r")
        note = sign_approval(ALICE, p)
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        nonce = note.split('"nonce":"')[1].split('"')[0]
        payload = {
            "name": "pay",
            "args": {"amount": 5000},
            "idempotency_key": "r:1",
            "step": p.step,
            "attempt": 1,
            "args_hash": "ff" * 32,
            "approved": nonce,
        }
        store.append(
            "r",
            [new_event("tool.call.requested", "journal", payload)],
            expected_version=store.stream_version("r"),
        )
        data = export_record(store, "r", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert {f.kind for f in rep.findings} == {"approval"}
    assert any("args differ" in f.detail for f in rep.findings)


def _behind_the_back(store: Any, name: str, args: Any) -> bytes:
    """Run `r` paused and approved, then a call appended under that approval's nonce with
    the approved args_hash: of tool ``name`` with ``args``. The exported record."""
    paused(store, "r")
    p = pending_call(store, "r")
    note = sign_approval(ALICE, p)
    resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
    nonce = note.split('"nonce":"')[1].split('"')[0]
    payload = {"name": name, "args": args, "idempotency_key": "r:1", "step": p.step}
    payload.update(attempt=1, args_hash=p.args, approved=nonce)
    v = store.stream_version("r")
    store.append("r", [new_event("tool.call.requested", "journal", payload)], expected_version=v)
    return export_record(store, "r", key=LOG).data


@pytest.mark.parametrize(
    ("name", "args", "finding"),
    [
        ("pay", {"amount": 5000}, "do not hash to the args_hash approved"),
        ("wire_all_funds", {"amount": 5}, "calls 'wire_all_funds' where the approval request"),
    ],
    ids=["other_args", "other_tool"],
)
def test_verify_record_checks_what_ran_is_what_was_approved(
    url: str, name: str, args: Any, finding: str
) -> None:
    """A call appended under an approval's nonce and its very args_hash, but whose own
    arguments are others, or whose tool is not the one the approver was shown: the
    signatures and the chain verify; verify-record names the mismatch."""
    with ae.open_store(url) as store:
        data = _behind_the_back(store, name, args)
    rep = verify_record(data, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert [f.kind for f in rep.findings] == ["approval"]
    assert finding in rep.findings[0].detail


def test_an_approval_does_not_run_another_tool(url: str) -> None:
    """The approver approved `pay`; the agent, resumed, calls another tool with the same
    arguments at that step: the journal refuses (wrong call), runs nothing, writes nothing."""
    with ae.open_store(url) as store:
        paused(store, "r")
        note = sign_approval(ALICE, pending_call(store, "r"))
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
        j = Journal(store, "r", approvers=[ALICE.verifier])  # appends its gate decision
        before, ran = state(store), []
        with pytest.raises(ae.ApprovalWrongCall, match="'pay', not of 'wire_all_funds'"):
            j.tool_call(
                "wire_all_funds",
                {"amount": 5},
                call=lambda a, k: ran.append(k),
                needs_approval=True,
            )
        assert ran == [] and state(store) == before


def test_an_approval_signed_by_another_trusted_key_than_it_names_is_forged(url: str) -> None:
    """An approval whose body names ALICE's key but which only another trusted key (here
    the log's) signed: the journal and verify-record both refuse it."""
    from ares_events.agents.approvals import APPROVAL_PREFIX, check_approval

    with ae.open_store(url) as store:
        paused(store, "r")
        p = pending_call(store, "r")
        text = sign_approval(ALICE, p).split("\n\n")[0] + "\n"
        assert text.startswith(APPROVAL_PREFIX)
        note = text + "\n" + LOG.signature_line(text.encode())
        with pytest.raises(ae.ApprovalForged, match="the key it names"):
            check_approval(note, p, trusted=[ALICE.verifier, LOG.verifier])
        present(store, "r", note)
        data = export_record(store, "r", key=LOG).data
    trusted = [ALICE.verifier.text, LOG.verifier.text]  # both trusted as approvers
    rep = verify_record(data, [LOG.verifier.text], approvers=trusted)
    assert any("the key it names" in f.detail for f in rep.findings)


def _child(url: str, effects: Path, kill_at: str) -> int:
    args = [
        sys.executable,
        "-m",
        "tests.children.approval_child",
        url,
        "r",
        ALICE.verifier.text,
        str(effects),
        kill_at,
    ]
    return subprocess.run(args, cwd=ROOT, timeout=120, check=False).returncode


@pytest.mark.slow
@pytest.mark.parametrize("kill_at", ["checked", "requested", "effect"])
def test_a_valid_approval_runs_once_across_a_kill(url: str, tmp_path: Path, kill_at: str) -> None:
    """SIGKILL after the approval is checked, after the call's request is written, or
    after its side effect: started again, the call has run exactly once."""
    effects = tmp_path / "effects.txt"
    assert _child(url, effects, "none") == 3  # paused for approval
    with ae.open_store(url) as store:
        note = sign_approval(ALICE, pending_call(store, "r"))
        resume_run(store, "r", by="alice", approval=note, approvers=[ALICE.verifier])
    assert _child(url, effects, kill_at) == -9
    assert _child(url, effects, "none") == 0
    assert _child(url, effects, "none") == 0
    assert effects.read_text().split() == ["r:1"]


def test_the_cli_refuses_an_unsigned_resume_of_a_run_waiting_for_approval(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """runs resume without --key on a run paused for a signed approval: exit 2 saying
    what to give, as the console refuses it (its agent would only pause again), and
    nothing is appended."""
    with ae.open_store(url) as store:
        paused(store, "r")
        before = state(store)
    code = main(["--store", url, "runs", "resume", "r", "--by", "bob"])
    err = capsys.readouterr().err
    assert code == 2 and "signed approval" in err and "--key" in err
    with ae.open_store(url) as store:
        assert state(store) == before


def test_the_cli_signs_the_approval(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """keygen --approver, then runs resume --key: the journal trusting that key runs the
    call; the CLI's signature carries the key's name."""
    key_file, vkey_file = tmp_path / "alice.key", tmp_path / "alice.vkey"
    assert main(["keygen", "bob", "--out", str(key_file), "--approver"]) == 0
    vkey_file.write_text(capsys.readouterr().out)
    bob = ae.integrity.notes.VerifierKey.parse(vkey_file.read_text())
    with ae.open_store(url) as store:
        loop = paused(store, "r")
    assert main(["--store", url, "runs", "resume", "r", "--key", str(key_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["by"] == "bob" and out["status"] == "running"
    with ae.open_store(url) as store:
        j = Journal(store, "r", approvers=[bob])
        loop.store = store
        loop.steps(j)
        assert loop.ran == ["r:1"]


def test_the_journal_takes_an_approvers_key_as_the_text_keygen_printed(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/records.md's flow as written: the .vkey file's text is an approver's key for
    the journal and the LangGraph gate; a private key or anything else in its place is a
    ConfigError that never repeats it."""
    key_file = tmp_path / "alice.key"
    assert main(["keygen", "alice", "--out", str(key_file), "--approver"]) == 0
    alice_vkey = capsys.readouterr().out
    with ae.open_store(url) as store:
        loop = paused(store, "r")
    assert main(["--store", url, "runs", "resume", "r", "--key", str(key_file)]) == 0
    with ae.open_store(url) as store:
        loop.store = store
        loop.steps(Journal(store, "r", approvers=[alice_vkey]))
        assert loop.ran == ["r:1"]
        assert Journal.inspect(store, "r").status != "failed"
        secret = key_file.read_text()
        for bad in (secret, "not a key", 42):
            with pytest.raises(ae.ConfigError) as info:
                Journal(store, "r2", approvers=[bad])  # type: ignore[list-item]
            assert secret.strip() not in str(info.value) and "not a key" not in str(info.value)
        with pytest.raises(ae.ConfigError):
            ApprovalGate(store, approvers=[secret])
