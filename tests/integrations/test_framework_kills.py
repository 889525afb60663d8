"""A durable run (Pydantic AI, and the journal under the OpenAI Agents SDK and Google ADK)
killed with SIGKILL between its model and tool calls (and inside a tool, after its side
effect), then resumed by a new process: no answered model call is paid again and no side
effect happens twice."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.agents.journal import Journal
from tests.fixtures.zygote import Zygote
from tests.integrations.fw_helpers import ADAPTERS, SHARED_BACKENDS, fw_url

POINTS = ["model1-paid", "tool1-before", "tool1-after", "tool2-after", "model2-before"]
PRELOAD = [  # what the child imports, so that each forked child starts with it imported
    "ares_events.integrations.pydantic_ai",
    "pydantic_ai.models.function",
    "ares_events.integrations.google_adk_journal",
    "google.adk.agents",
    "google.adk.models.llm_response",
    "ares_events.integrations.openai_agents_journal",
    "agents.testing",
]


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    """The children fork from a process that imported the three frameworks once."""
    z = Zygote(PRELOAD, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    yield z
    z.close()


def _child(zygote: Zygote, adapter: str, url: str, run_id: str, ledger: Path, kill_at: str) -> int:
    proc = zygote.run(
        "tests.children.framework_kill_child",
        [adapter, url, run_id, str(ledger), kill_at],
        timeout=240,
    )
    if proc.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(proc.stderr[-3000:])
    return proc.returncode


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend", SHARED_BACKENDS)
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_a_killed_durable_run_resumes_without_repaying_or_repeating(
    adapter: str, backend: str, tmp_path: Path, request: pytest.FixtureRequest, zygote: Zygote
) -> None:
    url = fw_url(backend, tmp_path, request)
    for point in POINTS:
        run_id = f"ship-{point}-{uuid.uuid4().hex[:6]}"
        ledger = tmp_path / f"{run_id}.ledger"
        assert _child(zygote, adapter, url, run_id, ledger, point) == -signal.SIGKILL, point
        assert _child(zygote, adapter, url, run_id, ledger, "none") == 0, point
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
        assert _child(zygote, adapter, url, run_id, ledger, "none") == 0
        again = ledger.read_text().splitlines()
        assert again[len(lines) :] == ["output shipped both"], (point, again)


@pytest.mark.slow
def test_the_zygote_reports_what_subprocess_would(zygote: Zygote, tmp_path: Path) -> None:
    """A child that fails exits 1 with its traceback on stderr; one killed reports -9: the
    matrix above cannot pass on a helper that loses a child's outcome."""
    failed = zygote.run("tests.children.framework_kill_child", [], timeout=60)
    assert failed.returncode == 1 and "IndexError" in failed.stderr
    ledger = tmp_path / "ledger"
    url = f"sqlite:///{tmp_path}/z.db"
    assert _child(zygote, "pydantic-ai", url, "z-run", ledger, "model1-paid") == -signal.SIGKILL
    assert ledger.read_text() == "paid 1\n"
