"""A durable run (Pydantic AI, and the journal under the OpenAI Agents SDK and Google ADK)
killed with SIGKILL between its model and tool calls (and inside a tool, after its side
effect), then resumed by a new process: no answered model call is paid again and no side
effect happens twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.agents.journal import Journal

ROOT = Path(__file__).resolve().parents[2]
POINTS = ["model1-paid", "tool1-before", "tool1-after", "tool2-after", "model2-before"]
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _child(adapter: str, url: str, run_id: str, ledger: Path, kill_at: str) -> int:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.children.framework_kill_child",
            adapter,
            url,
            run_id,
            str(ledger),
            kill_at,
        ],
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr[-3000:])
    return proc.returncode


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("adapter", ["pydantic-ai", "openai-agents", "google-adk"])
def test_a_killed_durable_run_resumes_without_repaying_or_repeating(
    adapter: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/kill.db"
        if backend == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    for point in POINTS:
        run_id = f"ship-{point}-{uuid.uuid4().hex[:6]}"
        ledger = tmp_path / f"{run_id}.ledger"
        assert _child(adapter, url, run_id, ledger, point) == -signal.SIGKILL, point
        assert _child(adapter, url, run_id, ledger, "none") == 0, point
        lines = ledger.read_text().splitlines()
        paid = [ln for ln in lines if ln.startswith("paid")]
        effects = [ln for ln in lines if ln.startswith("effect")]
        assert paid == ["paid 1", "paid 3"], (point, lines)  # each model call paid once
        assert sorted(effects) == sorted([f"effect {run_id}:2 book", f"effect {run_id}:3 lamp"]), (
            point,
            lines,
        )  # each shipment once, under its own key
        assert lines[-1] == "output shipped both", (point, lines)
        with ae.open_store(url) as store:
            info = Journal.inspect(store, run_id)
            assert info.status == "completed", point
            assert ae.integrity.verify_stream(store, run_id).ok
        # A third process replays the whole run from the log: nothing paid, nothing shipped.
        assert _child(adapter, url, run_id, ledger, "none") == 0
        again = ledger.read_text().splitlines()
        assert again[len(lines) :] == ["output shipped both"], (point, again)
