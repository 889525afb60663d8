"""A run's numbers have one definition (``run_info.run_counts``) and every view shows it:
``runs list/show`` (JSON and text), the journal API (``Journal.inspect`` and a live
journal's ``counts``), the console's run pages, and the demo's report (tests/agents/
test_demo.py holds the demo to the same views)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.run_info import run_counts
from ares_events.cli import main
from ares_events.projections.builtin import RunStateProjection
from tests.fixtures.run_numbers import assert_same, from_log, views

ROOT = Path(__file__).resolve().parents[2]


def _incarnation(url: str, services: Path, run_id: str, die_after: int = 0) -> dict[str, Any]:
    """One process of the run; SIGKILLed after ``die_after`` appends (then ``{}``)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.children.run_numbers_child",
            "--services",
            str(services),
            "--run-id",
            run_id,
            "--die-after",
            str(die_after),
        ],
        cwd=ROOT,
        env=dict(os.environ, ARES_STORE_URL=url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if die_after:
        assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr)
        return {}
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_every_view_of_a_killed_resumed_retried_run_shows_the_same_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed twice (recovered three times from snapshot + tail), paused and resumed
    by an operator, with rate-limited model calls and a lost tool answer (retries) and
    tokens: the raw log, runs list/show, Journal.inspect, the live journal and the
    console's pages all give steps 5, attempts 6, retries 3, recoveries 3, resumes 1 and
    the same tokens."""
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    services = tmp_path / "services.db"
    run = "run-numbers"
    # Started, asked, rate-limited: killed before the retry.
    assert _incarnation(url, services, run, die_after=3) == {}
    assert _incarnation(url, services, run)["outcome"] == "paused"
    assert main(["--store", url, "-q", "runs", "resume", run, "--by", "alice"]) == 0
    capsys.readouterr()
    # Gate, then the second model call asked: killed before it is made.
    assert _incarnation(url, services, run, die_after=2) == {}
    last = _incarnation(url, services, run)
    assert last["outcome"] == "completed"
    with ae.open_store(url) as store:
        expected = from_log(store, run)
        assert store.snapshots.load(run, "run_state") is not None  # recovered from snapshots
    assert expected["tokens"] > 0
    assert {k: v for k, v in expected.items() if k != "tokens"} == {
        "steps": 5,
        "attempts": 6,
        "retries": 3,
        "recoveries": 3,
        "resumes": 1,
    }
    seen = views(url, run, capsys)
    seen["live journal (last incarnation)"] = last["counts"]
    assert_same(seen, expected)


def test_a_refused_gate_is_not_a_recovery_and_a_finished_run_reopened_is_none() -> None:
    """recoveries counts the gates that let the run go on: a refusal is not one, and
    opening a finished run appends nothing."""
    from ares_events.agents.journal import Journal, RunRefused

    with ae.open_store("memory://") as store:
        j = Journal(store, "r", code_revision="a", prompt_hash="p")
        j.patch("k", 1)
        Journal(store, "r", code_revision="a", prompt_hash="p")
        with pytest.raises(RunRefused):
            Journal(store, "r", code_revision="b", prompt_hash="p")
        Journal(store, "r", code_revision="a", prompt_hash="p").complete()
        Journal(store, "r", code_revision="a", prompt_hash="p")
        counts = Journal.inspect(store, "r").counts
        assert (counts.recoveries, counts.steps, counts.resumes) == (2, 1, 0)
        state = RunStateProjection().initial()
        for e in store.read("r"):
            state = RunStateProjection().apply(state, e)
        assert run_counts(state) == counts
        assert from_log(store, "r") == counts.to_dict()
