"""ProcessSupervisor with real child processes on a real SQLite store: an agent killed by a
real-time signal, and a command that cannot be started."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.agents.supervision import ProcessSupervisor, restore
from ares_events.projections.builtin import GenealogyProjection

OK = [sys.executable, "-c", "pass"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ae.EventStore]:
    with ae.open_store(f"sqlite:///{tmp_path / 's.db'}") as s:
        yield s


def _cleanup(sup: ProcessSupervisor) -> None:
    for a in sup.agents.values():
        if a.proc is not None and a.proc.poll() is None:
            a.proc.kill()
            a.proc.wait()


def types_of(store: ae.EventStore, agent_id: str) -> list[str]:
    return [e.type for e in store.read(agent_id)]


@pytest.mark.skipif(not hasattr(signal, "SIGRTMIN"), reason="no real-time signals here")
def test_death_by_a_real_time_signal_is_recorded_and_resurrected(store: ae.EventStore) -> None:
    """An agent killed by SIGRTMIN+5 is recorded dead with that cause and resurrected."""
    rt = signal.SIGRTMIN + 5
    sup = ProcessSupervisor(store, max_restarts=1, backoff_base=0.01)
    sup.register("agent-rt", [sys.executable, "-c", f"import os; os.kill(os.getpid(), {rt})"])
    try:
        sup.start()
        assert sup.run(timeout=60)
    finally:
        _cleanup(sup)
    a = sup.agents["agent-rt"]
    assert a.gave_up and a.restarts == 1
    genealogy = ae.recover(store, "agent-rt", GenealogyProjection()).state
    assert [d["cause"] for d in genealogy["deaths"]] == ["killed by signal SIGRTMIN+5"] * 2
    assert len(genealogy["resurrections"]) == 1


def test_a_command_that_cannot_start_records_no_start_and_others_still_start(
    store: ae.EventStore, tmp_path: Path
) -> None:
    """A missing command leaves no `agent.started`: its failure to start is recorded as a
    death (resurrected up to the cap, then given up), and the agents after it still run."""
    sup = ProcessSupervisor(store, max_restarts=2, backoff_base=0.01)
    sup.register("agent-bad", [str(tmp_path / "no-such-binary")])
    sup.register("agent-ok", OK)
    try:
        sup.start()
        assert sup.run(timeout=60)
    finally:
        _cleanup(sup)
    assert sup.agents["agent-ok"].finished
    assert types_of(store, "agent-ok") == ["agent.started", "agent.stopped"]
    bad = sup.agents["agent-bad"]
    assert bad.gave_up and bad.proc is None
    assert types_of(store, "agent-bad") == ["agent.dead"] * 3
    genealogy = ae.recover(store, "agent-bad", GenealogyProjection()).state
    causes = [d["cause"] for d in genealogy["deaths"]]
    assert causes == ["failed to start: No such file or directory"] * 3
    assert restore(store, "agent-bad").state["status"] == "dead"
