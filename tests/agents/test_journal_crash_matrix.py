"""The crash matrix (issue 11): the loop every agent has, with a rate-limited model, tools
that lose their answer after the side effect and a tool that stays down, SIGKILLed at
every event-append boundary and inside every service call of runs in three modes
(reconcile, idempotent, neither), then resumed by a new process.

Each run is its own real process (``tests/children/journal_matrix_child.py`` forks one per run and
per resumption); what the assertions count comes from the fake services' own tables and
the event log, not from what the processes say. Runs that stop on an explicit in-doubt
call (mode "neither") are settled by an operator through ``ares-events runs resolve`` and
``runs resume`` and then finish.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.journal import Journal
from tests.children import journal_child as child
from tests.fixtures.cli_helpers import run, run_json

DRIVER = Path(__file__).resolve().parents[1] / "children" / "journal_matrix_child.py"
TIMEOUT = 900  # seconds; only to turn a hang into a failure
MODES = ("reconcile", "idempotent", "none")


def drive(url: str, services: Path, *args: str) -> list[dict[str, Any]]:
    """Run the matrix driver; its JSON lines."""
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "--services", str(services), *args],
        env=dict(os.environ, ARES_STORE_URL=url),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def counts(services: Path, sql: str) -> Counter[tuple[Any, ...]]:
    """Rows of a ``SELECT a, b, count(*) ... GROUP BY a, b`` as a Counter."""
    with child.services_db(str(services)) as c:
        return Counter({tuple(r[:-1]): int(r[-1]) for r in c.execute(sql)})


@pytest.mark.slow
def test_kill_9_at_every_boundary_of_retrying_runs_converges(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every run completes with the result of an uninterrupted run; no answered model
    call is paid twice (only a call in flight at the kill is asked again); every side
    effect happens once; rate limits and lost answers were really absorbed; only runs
    without a reconciler or idempotency stop, on an explicit in-doubt call, which
    `runs resolve` + `runs resume` settle."""
    url = f"sqlite:///{tmp_path / 'matrix.db'}"
    services = tmp_path / "services.db"
    records = drive(url, services, "--prefix", "m", "--modes", ",".join(MODES))

    clean = {r["mode"]: r for r in records if r["point"] == "clean"}
    assert set(clean) == set(MODES)
    for r in clean.values():
        assert r["resume"]["outcome"] == "completed", r
        # Rate limits, lost answers, retries (a reconciled retry asks the reconciler and does
        # not invoke the tool again, so a run can have as few as 10 service calls).
        assert r["appends"] >= 25 and r["calls"] >= 10
    killed = [r for r in records if r["point"] != "clean"]
    expected_points = sum(r["appends"] + r["calls"] for r in clean.values())
    assert len(killed) == expected_points
    assert all(r["killed"] for r in killed), [r["run_id"] for r in killed if not r["killed"]]
    errors = [r for r in records if r["resume"].get("outcome") == "error"]
    assert errors == [], errors[:3]

    # Runs that stopped on an in-doubt call: only without a reconciler or idempotency.
    stopped = [r for r in killed if r["resume"]["outcome"] == "in_doubt"]
    assert stopped and {r["mode"] for r in stopped} == {"none"}
    before = {r["run_id"] for r in stopped}
    code, listed = run_json(capsys, "--store", url, "runs", "list", "--status", "in_doubt")
    assert code == 0 and {r["run_id"] for r in listed["runs"]} == before

    # The operator settles each one from what the downstream system says.
    for r in stopped:
        run_id = r["run_id"]
        code, shown = run_json(capsys, "--store", url, "runs", "show", run_id)
        (doubt,) = shown["in_doubt"]
        landed, result = child.FakeTicketing(str(services), run_id).lookup(doubt["key"])
        verdict = ["--result", json.dumps(result)] if landed else ["--not-done"]
        step = str(doubt["step"])
        code, _, err = run(capsys, "--store", url, "runs", "resolve", run_id, step, *verdict)
        assert code == 0, err
        code, _, err = run(capsys, "--store", url, "runs", "resume", run_id, "--by", "ops")
        assert code == 0, err
    resumed = drive(url, services, "--resume", *[f"{r['run_id']}:none" for r in stopped])
    assert [r["resume"]["outcome"] for r in resumed] == ["completed"] * len(stopped)

    run_ids = [r["run_id"] for r in records]
    paid = counts(services, "SELECT run, content, count(*) FROM model_calls GROUP BY run, content")
    limited = counts(
        services, "SELECT run, content, count(*) FROM rate_limited GROUP BY run, content"
    )
    in_flight = counts(
        services, "SELECT run, detail, count(*) FROM kills WHERE what = 'model' GROUP BY 1, 2"
    )
    effects = counts(services, "SELECT run, key, count(*) FROM side_effects GROUP BY run, key")
    lost = counts(services, "SELECT run, count(*) FROM lost_answers GROUP BY run")
    with ae.open_store(url) as store:
        for run_id in run_ids:
            info = Journal.inspect(store, run_id)
            assert info.status == "completed" and info.ok, (run_id, info.status)
            assert info.result == child.expected_retry_result(run_id), run_id
            assert ae.integrity.verify_stream(store, run_id).ok
            prompts = [k[1] for k in paid if k[0] == run_id]
            assert len(prompts) == 2, run_id  # two model steps
            for content in prompts:
                # Answered calls are never paid again; only a call killed in flight is.
                assert paid[(run_id, content)] == 1 + in_flight[(run_id, content)], run_id
                assert limited[(run_id, content)] == child.RATE_LIMITS, run_id
            assert {k[1]: n for k, n in effects.items() if k[0] == run_id} == {
                f"{run_id}:2": 1,
                f"{run_id}:6": 1,
            }
            assert lost[(run_id,)] == 2, run_id
    assert sum(in_flight.values()) == 2 * len(MODES)  # each mode killed both paid calls once
