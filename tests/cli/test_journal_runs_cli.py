"""`ares-events runs list|show|resolve|resume|cancel`, end to end: real agent processes
(tests/children/journal_child.py) stop paused or in doubt, an operator settles them through the
CLI, and the agent finishes. list and show append nothing; every action appends exactly
one event with who, why and which command in its metadata."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.journal import Journal
from tests.children import journal_child as child
from tests.fixtures.cli_helpers import run, run_json

# Each case runs the CLI as a process, several times: the full suite runs them.
pytestmark = pytest.mark.slow

CHILD = Path(__file__).resolve().parents[1] / "children" / "journal_child.py"
TIMEOUT = 120  # seconds; only to turn a hang into a failure


def child_argv(services: Path, run_id: str, *args: str) -> list[str]:
    """The agent process's command line."""
    return [sys.executable, str(CHILD), "--services", str(services), "--run-id", run_id, *args]


def agent(url: str, services: Path, run_id: str, *args: str) -> tuple[int, dict[str, Any]]:
    """Run the agent process once: (exit status, its JSON line or {} when killed)."""
    proc = subprocess.run(
        child_argv(services, run_id, *args),
        env=dict(os.environ, ARES_STORE_URL=url),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    if proc.returncode == -signal.SIGKILL:
        return proc.returncode, {}
    assert proc.returncode in (0, child.EXIT_IN_DOUBT), proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def fingerprint(url: str) -> tuple[Any, ...]:
    """Every stream's version, the last global position and the number of snapshots."""
    with ae.open_store(url) as store:
        last = max((e.position for e in store.read_all()), default=0)
        return tuple(sorted(store.streams())), last, len(list(store.snapshots.list(None)))


def events(url: str, run_id: str) -> list[ae.RecordedEvent]:
    """The run's events."""
    with ae.open_store(url) as store:
        return list(store.read(run_id))


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite file store several processes share."""
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture
def services(tmp_path: Path) -> Path:
    """The fake services' own SQLite file."""
    return tmp_path / "services.db"


@pytest.fixture
def fleet(url: str, services: Path) -> dict[str, str]:
    """Four runs in four states, each left by real agent processes: completed, paused
    (awaiting approval), in doubt (killed inside a tool, no reconciler) and completed
    after rate limits and lost answers (flow=retry)."""
    agent(url, services, "done")
    agent(url, services, "waiting", "--flow", "interrupt")
    code, _ = agent(url, services, "doubt", "--die-in", "tool", "--mode", "none")
    assert code == -signal.SIGKILL
    code, out = agent(url, services, "doubt", "--mode", "none")
    assert code == child.EXIT_IN_DOUBT and out["outcome"] == "in_doubt"
    agent(url, services, "retried", "--flow", "retry")
    return {"done": "completed", "waiting": "paused", "doubt": "in_doubt", "retried": "completed"}


# -- looking ----------------------------------------------------------------------------------


def test_list_and_show_append_nothing(
    url: str, fleet: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """runs list and runs show (JSON and tables) leave every stream version, the global
    position and the snapshots exactly as they were."""
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: table cells stay on one line
    before = fingerprint(url)
    code, data = run_json(capsys, "--store", url, "runs", "list")
    assert code == 0 and data["count"] == 4 and data["ok"] is True
    assert {r["run_id"]: r["status"] for r in data["runs"]} == fleet
    for run_id, status in fleet.items():
        code, shown = run_json(capsys, "--store", url, "runs", "show", run_id)
        assert code == 0 and shown["run_id"] == run_id and shown["status"] == status
        code, out, _ = run(capsys, "--store", url, "runs", "show", run_id)
        assert code == 0 and run_id in out
    code, out, _ = run(capsys, "--store", url, "runs", "list")
    assert code == 0 and "in_doubt" in out and "awaiting_approval" in out
    assert fingerprint(url) == before


def test_list_filters_by_status(
    url: str, fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--status keeps the runs in that state (paused includes in_doubt); a status
    outside the choices is a usage error."""

    def listed(status: str) -> list[str]:
        code, data = run_json(capsys, "--store", url, "runs", "list", "--status", status)
        assert code == 0
        return sorted(r["run_id"] for r in data["runs"])

    assert listed("completed") == ["done", "retried"]
    assert listed("in_doubt") == ["doubt"]
    assert listed("paused") == ["doubt", "waiting"]
    assert listed("failed") == listed("running") == listed("cancelled") == []
    code, _, err = run(capsys, "--store", url, "runs", "list", "--status", "sleepy")
    assert code == 2 and "sleepy" in err


def test_show_tells_what_each_step_asked_and_got(
    url: str, fleet: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """runs show --json of the retried run: each step's kind, status, attempts with their
    errors (rate limits, lost answers, the weather service that stayed down), the
    recorded messages and args, the outcome and tokens."""
    monkeypatch.setenv("COLUMNS", "200")  # a wide terminal: table cells stay on one line
    code, data = run_json(capsys, "--store", url, "runs", "show", "retried")
    assert code == 0
    steps = {s["step"]: s for s in data["steps"]}
    assert [steps[n]["kind"] for n in sorted(steps)] == [
        "model",
        "tool",
        "patch",
        "tool",
        "model",
        "tool",
    ]
    first = steps[1]
    assert first["status"] == "answered" and len(first["attempts"]) == 3
    assert [a["error_type"] for a in first["attempts"]] == ["RateLimited", "RateLimited", None]
    assert first["request"]["messages"] == child.first_messages()
    assert first["outcome"]["text"].startswith("answer-") and first["tokens"] > 0
    assert steps[2]["name"] == "create_ticket" and steps[2]["key"] == "retried:2"
    assert [a["status"] for a in steps[2]["attempts"]] == ["failed", "returned"]
    assert steps[4]["status"] == "abandoned" and steps[4]["error"].startswith("ServiceDown")
    assert data["tokens"] == sum(s["tokens"] for s in data["steps"])
    assert data["result"] == child.expected_retry_result("retried")
    code, out, _ = run(capsys, "--store", url, "runs", "show", "retried")
    assert "RateLimited" in out and "abandoned" in out and "GatewayTimeout" in out


# -- operating --------------------------------------------------------------------------------


def test_resolve_with_a_result_then_resume_settles_an_in_doubt_run(
    url: str, services: Path, fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent stopped on an in-doubt ticket (it landed downstream): runs show names the
    step and key, runs resolve --result records the outcome (one event, audited), runs
    resume answers the interrupt (one event), and the agent then completes without
    creating the ticket again."""
    code, shown = run_json(capsys, "--store", url, "runs", "show", "doubt")
    (doubt,) = shown["in_doubt"]
    assert (doubt["step"], doubt["key"], doubt["name"]) == (2, "doubt:2", "create_ticket")
    landed, result = child.FakeTicketing(str(services), "doubt").lookup(doubt["key"])
    assert landed
    v0 = len(events(url, "doubt"))
    code, data = run_json(
        capsys,
        "--store",
        url,
        "runs",
        "resolve",
        "doubt",
        "2",
        "--result",
        json.dumps(result),
        "--by",
        "alice",
        "--reason",
        "ticket exists in the tracker",
    )
    assert code == 0 and data["status"] == "paused"  # resolved, still awaiting a resume
    evs = events(url, "doubt")
    assert len(evs) == v0 + 1 and evs[-1].type == "tool.returned"
    assert evs[-1].payload["result"] == result and evs[-1].payload["resolved_by"] == "alice"
    assert evs[-1].metadata == {
        "by": "alice",
        "reason": "ticket exists in the tracker",
        "via": "ares-events runs resolve",
    }
    code, data = run_json(capsys, "--store", url, "runs", "resume", "doubt", "--by", "bob")
    assert code == 0 and data["status"] == "running"
    evs = events(url, "doubt")
    assert len(evs) == v0 + 2 and evs[-1].type == "run.resumed"
    assert evs[-1].metadata == {"by": "bob", "via": "ares-events runs resume"}

    code, out = agent(url, services, "doubt", "--mode", "none")
    assert code == 0 and out["status"] == "completed"
    effects = child_rows(services, "SELECT count(*) FROM side_effects WHERE run = 'doubt'")
    invocations = child_rows(services, "SELECT count(*) FROM tool_invocations WHERE run = 'doubt'")
    assert effects == invocations == 1


def child_rows(services: Path, sql: str) -> int:
    """One number from the fake services' database."""
    with child.services_db(str(services)) as c:
        return int(c.execute(sql).fetchone()[0])


def test_resolve_not_done_runs_the_call_again_with_the_same_key(
    url: str, services: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed right after the tool's request (it never ran): the human finds nothing
    downstream and resolves --not-done; after resume the agent runs the tool once, with
    the same idempotency key, and completes."""
    code, _ = agent(url, services, "nd", "--die-after", "4", "--mode", "none")
    assert code == -signal.SIGKILL
    code, out = agent(url, services, "nd", "--mode", "none")
    assert code == child.EXIT_IN_DOUBT and out["key"] == "nd:2"
    assert child.FakeTicketing(str(services), "nd").lookup("nd:2") == (False, None)
    code, _, err = run(capsys, "--store", url, "runs", "resolve", "nd", "nd:2", "--not-done")
    assert code == 0, err
    assert events(url, "nd")[-1].type == "tool.call.not_done"
    code, _, err = run(capsys, "--store", url, "runs", "resume", "nd")
    assert code == 0, err
    code, out = agent(url, services, "nd", "--mode", "none")
    assert code == 0 and out["status"] == "completed"
    with child.services_db(str(services)) as c:
        keys = [k for (k,) in c.execute("SELECT key FROM tool_invocations WHERE run = 'nd'")]
    assert keys == ["nd:2"]
    attempts = [e.payload["attempt"] for e in events(url, "nd") if e.type == "tool.call.requested"]
    assert attempts == [1, 2]


def test_cancel_stops_a_run_for_good(
    url: str, services: Path, fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """runs cancel appends run.cancelled (audited); the run is listed as cancelled, cannot
    be resumed, its agent takes no new step, and a live incarnation is fenced off."""
    code, data = run_json(
        capsys, "--store", url, "runs", "cancel", "waiting", "--reason", "superseded"
    )
    assert code == 0 and data["status"] == "cancelled"
    last = events(url, "waiting")[-1]
    assert last.type == "run.cancelled" and last.metadata["reason"] == "superseded"
    assert last.metadata["via"] == "ares-events runs cancel" and last.metadata["by"]
    code, _, err = run(capsys, "--store", url, "runs", "resume", "waiting")
    assert code == 2 and "cancelled" in err
    code, out = agent(url, services, "waiting", "--flow", "interrupt")
    assert out["status"] == "cancelled"
    code, data = run_json(capsys, "--store", url, "runs", "list", "--status", "cancelled")
    assert [r["run_id"] for r in data["runs"]] == ["waiting"]

    with ae.open_store(url) as store:
        live = Journal(store, "live-run")
        live.model_call([{"role": "user", "content": "a"}], call=lambda m, p: "a")
        code, _, err = run(capsys, "--store", url, "runs", "cancel", "live-run")
        assert code == 0, err
        with pytest.raises(ae.ConcurrencyError):
            live.model_call([{"role": "user", "content": "b"}], call=lambda m, p: "b")


def test_refused_actions_exit_2_and_append_nothing(
    url: str, fleet: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Actions that do not apply are usage errors (exit 2, one line naming why) and leave
    the store untouched: unknown run, a stream that is not a run, resolving a model step,
    a step that is not in doubt or does not exist, resuming an unresolved in-doubt run or
    a running one, cancelling a completed run, bad --result JSON, both or neither of
    --result / --not-done."""
    with ae.open_store(url) as store:
        ae.emit(store, "agent-1", "agent.started", "runtime", {"instance_id": "i"})
    before = fingerprint(url)
    cases = [
        (["runs", "show", "ghost"], "no such run"),
        (["runs", "show", "agent-1"], "not a run"),
        (["runs", "resume", "ghost"], "no such run"),
        (["runs", "resolve", "retried", "1", "--result", "1"], "model step"),
        (["runs", "resolve", "retried", "2", "--result", "1"], "not in doubt"),
        (["runs", "resolve", "doubt", "9", "--not-done"], "no step 9"),
        (["runs", "resume", "doubt"], "still in doubt"),
        (["runs", "resume", "done"], "only a paused run resumes"),
        (["runs", "cancel", "done"], "finished run"),
        (["runs", "resolve", "doubt", "2", "--result", "{nope"], "not JSON"),
        (["runs", "resolve", "doubt", "2"], "exactly one"),
        (["runs", "resolve", "doubt", "2", "--result", "1", "--not-done"], "exactly one"),
        (["runs", "resolve", "doubt", "two", "--not-done"], "not a step number"),
        (["runs", "resolve", "doubt", "0", "--not-done"], "not a step number"),
    ]
    for argv, why in cases:
        code, _, err = run(capsys, "--store", url, *argv)
        assert code == 2, (argv, err)
        assert why in err, (argv, err)
        assert "Traceback" not in err
    assert fingerprint(url) == before


def test_who_defaults_to_the_os_user(
    url: str, fleet: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """Without --by the event's metadata names the OS user."""
    monkeypatch.setenv("LOGNAME", "carol")
    code, data = run_json(capsys, "--store", url, "runs", "resume", "waiting")
    assert code == 0 and data["by"] == "carol"
    assert events(url, "waiting")[-1].metadata["by"] == "carol"


def test_an_action_on_a_run_that_changed_meanwhile_appends_nothing(
    url: str, fleet: dict[str, str], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    """An agent appends between the operator's read and write: the action fails (exit 5,
    a conflict, saying the run changed) instead of acting on a stale view, and appends nothing."""
    from ares_events.agents import runs as runs_module

    real = runs_module.inspect_run

    def read_then_agent_appends(store: ae.EventStore, run_id: str, **kw: Any) -> Any:
        info = real(store, run_id, **kw)
        ae.emit(store, run_id, "agent.note", "runtime", {"n": 1}, expected_version=info.version)
        return info

    monkeypatch.setattr(runs_module, "inspect_run", read_then_agent_appends)
    before = len(events(url, "waiting"))
    code, _, err = run(capsys, "--store", url, "runs", "resume", "waiting")
    assert code == 5 and "changed while resuming" in err and "runs show waiting" in err
    assert [e.type for e in events(url, "waiting")[before:]] == ["agent.note"]


@pytest.mark.slow
def test_cancel_races_a_busy_agent_and_one_of_them_wins_cleanly(
    url: str, services: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Several times over: an agent process appends steps as fast as it can while the
    operator cancels it. Either the cancel lands (the agent is then fenced off: it fails at
    its next append, and nothing follows run.cancelled) or the run finished first (cancel
    refused); a cancel that loses a write race fails with exit 5 and is simply retried.
    The chain always verifies."""
    for n in range(5):
        run_id = f"race-{n}"
        proc = subprocess.Popen(
            child_argv(services, run_id, "--flow", "long", "--snapshot-every", "50"),
            env=dict(os.environ, ARES_STORE_URL=url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            with ae.open_store(url) as store:
                while store.stream_version(run_id) < 20 * (n + 1) and proc.poll() is None:
                    pass
            lost_races = 0
            while True:
                code, _, err = run(capsys, "--store", url, "runs", "cancel", run_id)
                if code != 5:
                    break
                assert "changed while cancelling" in err, err
                lost_races += 1
            _, err = proc.communicate(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        types = [e.type for e in events(url, run_id)]
        if code == 0:
            assert types[-1] == "run.cancelled" and "run.completed" not in types
            assert proc.returncode != 0 and "ConcurrencyError" in err
        else:
            assert code == 2 and types[-1] == "run.completed" and proc.returncode == 0
        with ae.open_store(url) as store:
            assert ae.integrity.verify_stream(store, run_id).ok


def test_looking_at_a_run_while_it_is_written_never_reports_findings(
    url: str, services: Path
) -> None:
    """runs show / list read a run while its agent process appends as fast as it can: every
    read is clean (no false 'truncated' from a head that moved during the read) and
    appends nothing of its own."""
    from ares_events.agents.runs import inspect_run, list_runs

    proc = subprocess.Popen(
        child_argv(services, "busy", "--flow", "long", "--snapshot-every", "25"),
        env=dict(os.environ, ARES_STORE_URL=url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    reads = 0
    try:
        with ae.open_store(url) as store:
            while proc.poll() is None:
                if store.stream_version("busy") == 0:
                    continue
                info = inspect_run(store, "busy")
                assert info.ok, (info.findings, info.skipped)
                assert all(r.ok for r in list_runs(store))
                reads += 1
        _, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert reads > 0
    kinds = {e.type for e in events(url, "busy")}
    assert kinds == {"run.started", "state.patched", "run.completed"}


def test_a_run_edited_before_its_snapshot_is_shown_with_findings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An event edited in the file before the run's latest snapshot: `runs show`, `runs
    list` and the console's summary check the whole chain (a snapshot vouches only for the
    fold it saved), so they report the findings and exit 1, and `runs resume` refuses;
    nothing is appended."""
    import sqlite3

    from ares_events.agents.journal import ModelReply
    from ares_events.ui.queries import summarize

    db = tmp_path / "runs.db"
    url = f"sqlite:///{db}"
    with ae.open_store(url) as store:
        j = Journal(store, "run-1")
        ask = [{"role": "user", "content": "Summarise A."}]
        j.model_call(ask, {}, call=lambda m, p: ModelReply({"text": "ok"}, {"total_tokens": 1}))
        j.interrupt("waiting")
        ae.snapshot(store, "run-1", ae.projections.RunStateProjection())
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        sql = "SELECT payload FROM ares_events WHERE stream_id = 'run-1' AND version = 2"
        payload = c.execute(sql).fetchone()[0].replace(b"Summarise A.", b"Wire 1M USD")
        c.execute("UPDATE ares_events SET payload = ? WHERE version = 2", (payload,))
    before = fingerprint(url)
    code, data = run_json(capsys, "--store", url, "runs", "show", "run-1")
    assert code == 1 and [f["kind"] for f in data["findings"]] == ["hash_mismatch"]
    code, data = run_json(capsys, "--store", url, "runs", "list")
    assert code == 1
    code, _, err = run(capsys, "--store", url, "runs", "resume", "run-1")
    assert code == 1 and "Traceback" not in err
    with ae.open_store(url, read_only=True) as store:
        assert not summarize(store, "run-1").ok
    assert fingerprint(url) == before
