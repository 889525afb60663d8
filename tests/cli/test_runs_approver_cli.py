"""The approver from the command line (outsider hunt, records finding 5), on a real SQLite
file: `runs show` names the call waiting for a signed approval (tool, arguments as
recorded, terminal-safe, and their digest), `runs resume --key` says what it signed, and
a second signed resume of a run already resumed is a usage error that appends nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.approvals import sign_approval
from ares_events.agents.journal import Journal
from ares_events.agents.recording import hash_of
from ares_events.agents.runs import pending_call
from ares_events.core.catalog import new_event
from ares_events.integrity.notes import write_key_file
from tests.fixtures.approvals import ALICE, state
from tests.fixtures.cli_helpers import run

ARGS = {"to": "IBAN-\u202eREKCATTA", "amount": 99999}
"""The call's arguments, with a right-to-left override a terminal must not obey."""
DIGEST = hash_of(ARGS, "args")


@pytest.fixture
def paused(tmp_path: Path) -> tuple[str, str]:
    """(store URL, alice's key file): run `r` paused for a signed approval of wire_funds."""
    url = f"sqlite:///{tmp_path}/s.db"
    key = str(write_key_file(tmp_path / "alice.key", ALICE))
    with ae.open_store(url) as store, pytest.raises(ae.ApprovalRequired):
        j = Journal(store, "r", approvers=[ALICE.verifier])
        j.tool_call("wire_funds", ARGS, call=lambda a, k: 1, needs_approval=True)
    return url, key


def test_runs_show_names_the_call_waiting_for_approval(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Text: step, tool, the arguments (hidden characters spelled out) and their digest;
    --json: the same, arguments exact."""
    url, _key = paused
    code, out, _ = run(capsys, "--store", url, "runs", "show", "r")
    assert code == 0
    assert "wire_funds" in out and DIGEST in out and "99999" in out
    assert "\u202e" not in out and "IBAN-⟨U+202E⟩REKCATTA" in out
    code, out, _ = run(capsys, "--store", url, "runs", "show", "r", "--json")
    asked = json.loads(out)["approval_request"]
    assert code == 0 and "\u202e" not in out
    assert asked == {"step": 1, "tool": "wire_funds", "args": ARGS, "args_hash": DIGEST}


def test_runs_resume_key_says_what_it_approved(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The signed resume names the step, the tool and the arguments digest it signed."""
    url, key = paused
    code, out, _ = run(capsys, "--store", url, "runs", "resume", "r", "--key", key)
    assert code == 0 and "step 1" in out and "wire_funds" in out and DIGEST in out
    code, out, _ = run(capsys, "--store", url, "runs", "show", "r", "--json")
    assert json.loads(out)["status"] == "running"


def test_runs_resume_key_json_says_what_it_approved(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url, key = paused
    code, out, _ = run(capsys, "--store", url, "runs", "resume", "r", "--key", key, "--json")
    data = json.loads(out)
    assert code == 0 and data["status"] == "running"
    assert data["approved"] == {"step": 1, "tool": "wire_funds", "args_hash": DIGEST}


def _approvals(url: str) -> int:
    with ae.open_store(url) as store:
        return sum(1 for e in store.read("r") if "approval" in e.payload)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_second_signed_resume_is_a_usage_error(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str], as_json: bool
) -> None:
    """Resumed with an approval no call used yet: another `resume --key` exits 2 and
    appends nothing, as the unsigned `resume` does."""
    url, key = paused
    assert run(capsys, "--store", url, "runs", "resume", "r", "--key", key)[0] == 0
    with ae.open_store(url) as store:
        before = state(store)
    extra = ("--json",) if as_json else ()
    code, out, err = run(capsys, "--store", url, "runs", "resume", "r", "--key", key, *extra)
    assert code == 2, out + err
    assert "no call has used yet" in err
    if as_json:
        assert json.loads(out)["error"]["exit_code"] == 2
    with ae.open_store(url) as store:
        assert state(store) == before
    assert _approvals(url) == 1
    assert run(capsys, "--store", url, "runs", "resume", "r")[0] == 2


def test_a_running_run_whose_approval_no_longer_holds_takes_a_new_one(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The approval it was resumed with expired before its agent used it (the journal
    refuses it): `resume --key` signs a new one, and the call runs under it, once."""
    url, key = paused
    with ae.open_store(url) as store:
        expired = sign_approval(ALICE, pending_call(store, "r"), expires_in=-1)
        payload: dict[str, Any] = {"by": "alice", "approval": expired}
        v = store.stream_version("r")
        store.append("r", [new_event("run.resumed", "journal", payload)], expected_version=v)
        with pytest.raises(ae.ApprovalExpired):
            Journal(store, "r", approvers=[ALICE.verifier]).tool_call(
                "wire_funds", ARGS, call=lambda a, k: 1, needs_approval=True
            )
    code, out, err = run(capsys, "--store", url, "runs", "resume", "r", "--key", key)
    assert code == 0, err
    assert "wire_funds" in out and DIGEST in out
    ran: list[str] = []
    with ae.open_store(url) as store:
        j = Journal(store, "r", approvers=[ALICE.verifier])
        j.tool_call("wire_funds", ARGS, call=lambda a, k: ran.append(k), needs_approval=True)
    assert ran == ["r:1"] and _approvals(url) == 2


def test_a_signed_resume_of_a_damaged_run_is_a_finding(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A request row that is not JSON: show and resume --key exit 1 (never 4, never a
    signature over a damaged log), appending nothing."""
    url, key = paused
    with sqlite3.connect(url.removeprefix("sqlite:///")) as c:
        c.execute("UPDATE ares_events SET payload = X'7b7b' WHERE version = 2")
    c.close()
    assert run(capsys, "--store", url, "runs", "show", "r")[0] == 1
    code, _out, err = run(capsys, "--store", url, "runs", "resume", "r", "--key", key)
    assert code == 1, err
    assert run(capsys, "--store", url, "runs", "show", "r", "--json")[0] == 1
    with ae.open_store(url) as store:
        assert store.stream_version("r") == 2
