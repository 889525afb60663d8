"""Supervisor hooks and the reference ProcessSupervisor, with real child processes.

The hooks (restore, record_*, flapping) run on every backend; the supervisor runs real
OS processes against a SQLite file: voluntary stops, crashes with backoff up to the
restart cap, missed heartbeats, and a supervisor that replaces a dead one.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.agents.supervision import (
    FlapSignal,
    ProcessSupervisor,
    backoff_delay,
    flapping,
    record_death,
    record_resurrection,
    record_start,
    record_stop,
    restore,
)
from ares_events.projections.builtin import AgentStateProjection, GenealogyProjection

TIMEOUT = 60.0  # seconds; only to turn a hang into a failure
CRASHER = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]

# Waits for SIGTERM; on it, records the last event of its own stream (what the
# supervisor had written before signalling) and exits 0.
TERM_WATCHER = """
import os, signal, sys, time
import ares_events as ae

def on_term(signum, frame):
    with ae.open_store(os.environ["ARES_STORE_URL"]) as s:
        last = list(s.read(os.environ["ARES_AGENT_ID"]))[-1].type
    with open(os.environ["SEEN_FILE"], "w") as f:
        f.write(last)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_term)
with open(os.environ["READY_FILE"], "w") as f:
    f.write("ready")
while True:
    time.sleep(0.05)
"""

# Beats its heartbeat file every 20 ms for 2.5 s (the first beat before any heavy
# import), then finishes.
# Beats through the library's heartbeat() until the file named by argv[1] exists.
BEATER = """
import os, sys, time
from ares_events.agents.supervision import heartbeat
while not os.path.exists(sys.argv[1]):
    heartbeat(os.environ["ARES_HEARTBEAT_FILE"])
    time.sleep(0.02)
"""


def types(store: ae.EventStore, stream: str) -> list[str]:
    """Event types of a stream, in order."""
    return [e.type for e in store.read(stream)]


def wait_for(cond: Callable[[], bool], tick: Callable[[], None] | None = None) -> None:
    """Poll until ``cond`` holds (calling ``tick`` each round); fail after TIMEOUT."""
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached within the hang guard")
        if tick is not None:
            tick()
        time.sleep(0.01)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[ae.EventStore]:
    """A SQLite file store (child processes can open it too)."""
    with ae.open_store(f"sqlite:///{tmp_path / 'sup.db'}") as s:
        yield s


@pytest.fixture
def supervisors() -> Iterator[list[ProcessSupervisor]]:
    """Supervisors made by a test; any child process still alive is killed at teardown."""
    made: list[ProcessSupervisor] = []
    yield made
    for sup in made:
        for a in sup.agents.values():
            if a.proc is not None and a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait()


def genealogy(store: ae.EventStore, agent_id: str) -> dict[str, Any]:
    """The agent's genealogy fold."""
    state: dict[str, Any] = ae.recover(store, agent_id, GenealogyProjection(3, 600.0)).state
    return state


# -- hooks (every backend) ------------------------------------------------------------------


def test_backoff_delay_doubles_from_one_second_up_to_thirty() -> None:
    """backoff_delay gives 1, 2, 4, 8, 16, 30, 30 s, scales with base, and is 1-based."""
    assert [backoff_delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert [backoff_delay(n, base=0.01) for n in (1, 2, 3)] == [0.01, 0.02, 0.04]
    assert backoff_delay(10, base=0.5, cap=2.0) == 2.0
    with pytest.raises(ValueError):
        backoff_delay(0)


def test_restore_returns_the_agents_state_snapshot_first(store: ae.EventStore) -> None:
    """restore() folds the lifecycle hooks' events into the agent's state, from a
    snapshot plus the tail when one exists."""
    record_start(store, "agent-r", "i-1")
    ae.emit(store, "agent-r", "task.created", "runtime", {"task_id": "t1"})
    ae.emit(store, "agent-r", "task.created", "runtime", {"task_id": "t2"})
    record_death(store, "agent-r", "exit status 1")
    ae.snapshot(store, "agent-r", AgentStateProjection())
    record_resurrection(store, "agent-r", "i-2", 1)
    ae.emit(store, "agent-r", "task.completed", "runtime", {"task_id": "t1"})

    rep = restore(store, "agent-r")
    assert rep.ok
    assert str(rep.source) == "snapshot" and rep.replayed == 2
    st = rep.state
    assert (st["status"], st["instance_id"]) == ("running", "i-2")
    assert (st["deaths"], st["restarts"]) == (1, 1)
    assert (st["pending_tasks"], st["done_tasks"]) == (["t2"], ["t1"])
    assert (
        restore(store, "agent-r", GenealogyProjection()).state["resurrections"][0]["instance_id"]
        == "i-2"
    )


def test_record_hooks_build_the_genealogy_and_flapping_signal(store: ae.EventStore) -> None:
    """record_death/record_resurrection/record_stop land in the genealogy; flapping()
    says yes once the death count reaches its threshold within the window."""
    record_start(store, "agent-g", "i-1")
    for attempt in (1, 2):
        record_death(store, "agent-g", f"exit status {attempt}")
        record_resurrection(store, "agent-g", f"i-{attempt + 1}", attempt)
    record_death(store, "agent-g", "killed by signal SIGKILL")
    record_stop(store, "agent-g", "decommissioned")
    g = genealogy(store, "agent-g")
    assert [d["cause"] for d in g["deaths"]] == [
        "exit status 1",
        "exit status 2",
        "killed by signal SIGKILL",
    ]
    assert [(r["instance_id"], r["attempt"]) for r in g["resurrections"]] == [
        ("i-2", 1),
        ("i-3", 2),
    ]
    assert [s["reason"] for s in g["stops"]] == ["decommissioned"]
    sig = flapping(store, "agent-g", deaths=3, window_s=600)
    assert sig == FlapSignal("agent-g", True, 3, 3, (3, 600))
    assert not flapping(store, "agent-g", deaths=4, window_s=600).flapping


# -- the reference supervisor (real processes) -----------------------------------------------


def test_voluntary_stop_is_marked_before_the_signal_and_never_resurrected(
    sqlite_store: ae.EventStore, tmp_path: Path, supervisors: list[ProcessSupervisor]
) -> None:
    """stop() writes agent.stopped before signalling (the child sees it in its SIGTERM
    handler), and the exit is not taken for a crash: no death, no resurrection, even
    for a later supervisor."""
    url = f"sqlite:///{tmp_path / 'sup.db'}"
    ready, seen = tmp_path / "ready", tmp_path / "seen"
    sup = ProcessSupervisor(sqlite_store, max_restarts=5, backoff_base=0.01)
    supervisors.append(sup)
    sup.register(
        "agent-s",
        [sys.executable, "-c", TERM_WATCHER],
        env={"ARES_STORE_URL": url, "READY_FILE": str(ready), "SEEN_FILE": str(seen)},
    )
    sup.start()
    proc = sup.agents["agent-s"].proc
    assert proc is not None
    wait_for(ready.exists)
    sup.stop("agent-s", "maintenance")
    assert proc.returncode == 0  # it ran its SIGTERM handler and exited
    assert seen.read_text() == "agent.stopped"
    assert sup.run(tick=0.01, timeout=TIMEOUT)
    for _ in range(5):
        sup.poll()
    assert types(sqlite_store, "agent-s") == ["agent.started", "agent.stopped"]
    assert restore(sqlite_store, "agent-s").state["status"] == "stopped"

    later = ProcessSupervisor(sqlite_store, backoff_base=0.01)
    supervisors.append(later)
    later.register("agent-s", SLEEPER)
    later.start()
    assert later.agents["agent-s"].proc is None and later.agents["agent-s"].stopped
    assert types(sqlite_store, "agent-s") == ["agent.started", "agent.stopped"]


def test_stop_of_a_sleeping_agent_records_no_death(
    sqlite_store: ae.EventStore, supervisors: list[ProcessSupervisor]
) -> None:
    """An agent killed by the supervisor's own SIGTERM (stop) is not dead: the
    supervisor settles with no agent.dead and no agent.resurrected."""
    sup = ProcessSupervisor(sqlite_store, max_restarts=5, backoff_base=0.01)
    supervisors.append(sup)
    sup.register("agent-z", SLEEPER)
    sup.start()
    proc = sup.agents["agent-z"].proc
    assert proc is not None
    sup.stop("agent-z")
    assert proc.returncode == -signal.SIGTERM
    assert sup.run(tick=0.01, timeout=TIMEOUT)
    assert types(sqlite_store, "agent-z") == ["agent.started", "agent.stopped"]
    assert sup.total_restarts == 0


def test_crashing_agent_is_resurrected_with_backoff_until_the_cap(
    sqlite_store: ae.EventStore, supervisors: list[ProcessSupervisor]
) -> None:
    """An agent that keeps exiting 3 is resurrected up to max_restarts, every death and
    resurrection is in its genealogy, on_flap fires from the threshold on, then the
    supervisor gives up."""
    flaps: list[FlapSignal] = []
    sup = ProcessSupervisor(
        sqlite_store,
        max_restarts=3,
        backoff_base=0.01,
        flap_deaths=3,
        flap_window_s=600.0,
        on_flap=flaps.append,
    )
    supervisors.append(sup)
    sup.register("agent-c", CRASHER)
    sup.start()
    assert sup.run(tick=0.01, timeout=TIMEOUT)
    a = sup.agents["agent-c"]
    assert a.gave_up and a.proc is None and not a.resurrecting
    assert a.restarts == 3 and sup.total_restarts == 3
    assert types(sqlite_store, "agent-c") == [
        "agent.started",
        *["agent.dead", "agent.resurrected"] * 3,
        "agent.dead",
    ]
    g = genealogy(sqlite_store, "agent-c")
    assert [d["cause"] for d in g["deaths"]] == ["exit status 3"] * 4
    assert [r["attempt"] for r in g["resurrections"]] == [1, 2, 3]
    assert len({r["instance_id"] for r in g["resurrections"]}) == 3
    assert flapping(sqlite_store, "agent-c", deaths=3, window_s=600).flapping
    assert [(f.agent_id, f.flapping, f.deaths) for f in flaps] == [
        ("agent-c", True, 3),
        ("agent-c", True, 4),
    ]
    st = restore(sqlite_store, "agent-c").state
    assert (st["status"], st["deaths"], st["restarts"]) == ("dead", 4, 3)


def test_resurrection_waits_for_the_backoff_schedule(
    sqlite_store: ae.EventStore, supervisors: list[ProcessSupervisor]
) -> None:
    """With the default schedule on the supervisor's clock, attempt n is due exactly
    backoff_delay(n) after the death (1, 2, 4 s) and not a moment earlier."""
    now = [1000.0]
    sup = ProcessSupervisor(sqlite_store, max_restarts=3, clock=lambda: now[0])
    supervisors.append(sup)
    sup.register("agent-b", CRASHER)
    sup.start()
    a = sup.agents["agent-b"]
    for attempt, delay in enumerate([1.0, 2.0, 4.0], 1):
        wait_for(lambda: a.resurrecting, sup.poll)  # the child exited; death recorded
        assert a.proc is None and a.next_start == now[0] + delay
        now[0] += delay - 0.5
        sup.poll()
        assert a.proc is None and a.resurrecting  # not due yet
        now[0] += 0.5
        sup.poll()
        assert a.proc is not None and a.attempt == attempt
        assert types(sqlite_store, "agent-b")[-1] == "agent.resurrected"
    wait_for(lambda: a.gave_up, sup.poll)
    assert not a.resurrecting
    assert types(sqlite_store, "agent-b").count("agent.resurrected") == 3


def test_missed_heartbeat_is_killed_and_counted_dead(
    sqlite_store: ae.EventStore, tmp_path: Path, supervisors: list[ProcessSupervisor]
) -> None:
    """A live child that never touches its heartbeat file is killed after the timeout
    and recorded dead with a heartbeat cause, each incarnation, up to the cap."""
    sup = ProcessSupervisor(
        sqlite_store,
        heartbeat_dir=tmp_path / "hb",
        heartbeat_timeout=0.5,
        max_restarts=1,
        backoff_base=0.01,
    )
    supervisors.append(sup)
    sup.register("agent-h", SLEEPER)
    sup.start()
    first = sup.agents["agent-h"].proc
    assert first is not None
    assert sup.run(tick=0.02, timeout=TIMEOUT)
    assert first.returncode == -signal.SIGKILL  # killed, though it never exited itself
    causes = [d["cause"] for d in genealogy(sqlite_store, "agent-h")["deaths"]]
    assert len(causes) == 2 and all("heartbeat" in c for c in causes)
    assert sup.agents["agent-h"].gave_up


def test_each_agent_id_has_a_heartbeat_file_of_its_own(
    sqlite_store: ae.EventStore, tmp_path: Path
) -> None:
    """Ids that differ only in '/' against '_' (or an escape) get different files: one
    agent's beat never keeps another alive."""
    sup = ProcessSupervisor(sqlite_store, heartbeat_dir=tmp_path / "hb", heartbeat_timeout=5)
    ids = ["a/b", "a_b", "a%2Fb", "../x", "é"]
    files = [sup.register(i, SLEEPER).heartbeat_file for i in ids]
    assert len(set(files)) == len(ids)
    assert all(f is not None and f.parent == tmp_path / "hb" for f in files)


def test_a_beating_agent_is_left_alone(
    sqlite_store: ae.EventStore, tmp_path: Path, supervisors: list[ProcessSupervisor]
) -> None:
    """An agent that calls heartbeat() on the file the supervisor passes it
    (ARES_HEARTBEAT_FILE) outlives the timeout and finishes without a death."""
    # The supervisor's clock moves only when the agent has beaten since the last poll, so
    # how slowly the child starts or runs on a loaded machine cannot make it look silent.
    now = [0.0]
    sup = ProcessSupervisor(
        sqlite_store, heartbeat_dir=tmp_path / "hb", heartbeat_timeout=4.0, clock=lambda: now[0]
    )
    supervisors.append(sup)
    done = tmp_path / "done"
    a = sup.register("agent-ok", [sys.executable, "-c", BEATER, str(done)])
    sup.start()
    assert a.heartbeat_file is not None
    hb = a.heartbeat_file
    seen = [a.beat[0]]
    for _ in range(10):  # 30 s on the supervisor's clock, ten beats of the agent's own
        wait_for(lambda: hb.exists() and hb.stat().st_mtime_ns != seen[0])
        seen[0] = hb.stat().st_mtime_ns
        now[0] += 3.0
        sup.poll()
        assert a.proc is not None and a.proc.poll() is None
    done.touch()
    wait_for(lambda: a.proc is None, tick=sup.poll)
    assert a.finished
    assert types(sqlite_store, "agent-ok") == ["agent.started", "agent.stopped"]
    (stopped,) = [e for e in sqlite_store.read("agent-ok") if e.type == "agent.stopped"]
    assert stopped.payload["reason"] == "finished"
    later = ProcessSupervisor(sqlite_store)
    supervisors.append(later)
    later.register("agent-ok", [sys.executable, "-c", BEATER, str(done)])
    later.start()  # a finished agent is neither a death nor a resurrection
    assert later.agents["agent-ok"].proc is None
    assert types(sqlite_store, "agent-ok") == ["agent.started", "agent.stopped"]


def test_a_beat_is_a_change_seen_on_the_supervisors_clock(
    sqlite_store: ae.EventStore, tmp_path: Path, supervisors: list[ProcessSupervisor]
) -> None:
    """Heartbeats are timed by the supervisor's own (injected) clock, when it sees the
    file's mtime change: a file stamped an hour in the past (a file server whose clock lags,
    a wall clock stepped forward) is a beat, not an hour of silence; a file that stops
    changing is a death once the timeout passes on that clock, not before."""
    now = [0.0]
    sup = ProcessSupervisor(
        sqlite_store, heartbeat_dir=tmp_path / "hb", heartbeat_timeout=4.0, clock=lambda: now[0]
    )
    supervisors.append(sup)
    a = sup.register("agent-skew", SLEEPER)
    sup.start()
    assert a.heartbeat_file is not None and a.proc is not None
    stamp = (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000  # an hour ago
    for beat in range(1, 11):  # 30 s on the supervisor's clock, a beat every 3 s
        now[0] += 3.0
        os.utime(a.heartbeat_file, ns=(stamp + beat, stamp + beat))
        sup.poll()
        assert a.proc is not None and a.proc.poll() is None, beat
    now[0] += 4.0  # silent for exactly the timeout: still alive
    sup.poll()
    assert a.proc is not None
    now[0] += 0.5
    sup.poll()
    assert a.proc is None
    assert types(sqlite_store, "agent-skew") == ["agent.started", "agent.dead"]
    (died,) = [e for e in sqlite_store.read("agent-skew") if e.type == "agent.dead"]
    assert "missed heartbeat (4s)" in died.payload["cause"]


def test_two_supervisors_starting_at_once_take_a_lost_agent_once(
    sqlite_store: ae.EventStore,
    supervisors: list[ProcessSupervisor],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two supervisors whose start() both read an agent a dead supervisor left "running"
    before either writes: its loss is recorded once, it is resurrected once (attempt 1)
    and one process runs it; the other supervisor leaves it (its records are written at
    the version it read). Both reads are held until both are done, so the race is the
    same every round, in threads released together."""
    import threading

    from ares_events.agents import supervision
    from ares_events.agents.supervision import record_start

    real = supervision.restore
    for round_ in range(12):
        both_read = threading.Barrier(2)

        def read_then_wait(*args: Any, both_read: threading.Barrier = both_read) -> Any:
            report = real(*args)
            both_read.wait(30)
            return report

        monkeypatch.setattr(supervision, "restore", read_then_wait)
        agent = f"agent-race-{round_}"
        record_start(sqlite_store, agent, "i-gone")  # its supervisor died with it
        pair = [ProcessSupervisor(sqlite_store), ProcessSupervisor(sqlite_store)]
        supervisors.extend(pair)
        for sup in pair:
            sup.register(agent, SLEEPER)
        threads = [threading.Thread(target=sup.start) for sup in pair]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert types(sqlite_store, agent) == ["agent.started", "agent.dead", "agent.resurrected"]
        running = [sup.agents[agent] for sup in pair if sup.agents[agent].proc is not None]
        assert len(running) == 1, round_
        assert sum(sup.agents[agent].elsewhere for sup in pair) == 1
        assert all(sup.settled or sup.agents[agent].proc is not None for sup in pair)


def test_a_long_agent_id_gets_a_heartbeat_file_and_stop_is_recorded_once(
    sqlite_store: ae.EventStore, tmp_path: Path, supervisors: list[ProcessSupervisor]
) -> None:
    """A 256-character id (the longest stream id) whose encoded name is past what a file
    name holds gets a heartbeat file of its own (start() raised OSError and the agents
    after it never started); stop() twice, or after the agent finished, records one stop."""
    sup = ProcessSupervisor(sqlite_store, heartbeat_dir=tmp_path / "hb", heartbeat_timeout=60)
    supervisors.append(sup)
    long_ids = ["x" * 256, "é" * 256]
    for agent in (*long_ids, "after"):
        sup.register(agent, SLEEPER)
    sup.start()
    files = {sup.agents[a].heartbeat_file for a in (*long_ids, "after")}
    assert len(files) == 3 and all(f is not None and f.exists() for f in files)
    for agent in (*long_ids, "after"):
        assert sup.agents[agent].proc is not None
        sup.stop(agent, "op")
        sup.stop(agent, "op again")
        assert types(sqlite_store, agent) == ["agent.started", "agent.stopped"]


def test_new_supervisor_resurrects_agents_its_predecessor_lost(
    sqlite_store: ae.EventStore, supervisors: list[ProcessSupervisor]
) -> None:
    """When a supervisor and its agents die together, the next supervisor's start()
    records the loss as a death and resurrects the agent (attempt 1)."""
    first = ProcessSupervisor(sqlite_store)
    supervisors.append(first)
    first.register("agent-l", SLEEPER)
    first.start()
    lost = first.agents["agent-l"].proc
    assert lost is not None
    os.kill(lost.pid, signal.SIGKILL)  # the whole group died; nobody recorded it
    lost.wait()

    second = ProcessSupervisor(sqlite_store)
    supervisors.append(second)
    second.register("agent-l", SLEEPER)
    second.start()
    a = second.agents["agent-l"]
    assert a.proc is not None and a.proc.poll() is None
    assert types(sqlite_store, "agent-l") == ["agent.started", "agent.dead", "agent.resurrected"]
    g = genealogy(sqlite_store, "agent-l")
    assert g["deaths"][0]["cause"] == "lost: its supervisor died"
    assert g["resurrections"][0]["attempt"] == 1
    second.shutdown()
    assert a.stopped and types(sqlite_store, "agent-l")[-1] == "agent.stopped"
