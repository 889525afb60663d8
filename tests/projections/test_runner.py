"""The catch-up projection runner, rebuilds, rebuild diffs, and the rebuild CLI."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

import ares_events as ae
from ares_events.core.events import RecordedEvent
from ares_events.core.recorder import KeepsReadModels, backend_of
from ares_events.errors import ConfigError
from ares_events.projections import (
    AgentStateProjection,
    ProjectionRunner,
    RecoveryStateProjection,
    fold,
    read_model,
    rebuild,
    verify_rebuild,
)
from ares_events.projections.tables import table_name, tables_for
from ares_events.stores.memory.read_models import MemoryReadModels
from ares_events.stores.memory.recorder import MemoryRecorder
from ares_events.stores.sqlite.recorder import SQLiteRecorder
from tests.children.runner_child import CountingProjection
from tests.fixtures.cli_helpers import run, run_json
from tests.projections.test_recovery import append_life

ROOT = Path(__file__).resolve().parents[2]


class Counter:
    """In-process counting projection (no sleep): state = events applied per stream."""

    name: ClassVar[str] = "counter"
    version: ClassVar[int] = 1

    def initial(self) -> int:
        """Nothing counted."""
        return 0

    def apply(self, state: Any, event: RecordedEvent) -> int:
        """Count one event."""
        return int(state) + 1


class FailingAfter(AgentStateProjection):
    """AgentStateProjection that raises after ``n`` events (a crash mid-rebuild)."""

    def __init__(self, n: int) -> None:
        self.left = n

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """Apply, or fail once the budget is spent."""
        if self.left == 0:
            raise RuntimeError("simulated crash")
        self.left -= 1
        return super().apply(state, event)


class AgentStateV2(AgentStateProjection):
    """A new version with a different meaning: also counts events seen."""

    version: ClassVar[int] = 2

    def apply(self, state: dict[str, Any], event: RecordedEvent) -> dict[str, Any]:
        """v1 plus an event counter."""
        state = super().apply(state, event)
        state["seen"] = state.get("seen", 0) + 1
        return state


def fill(store: ae.EventStore, streams: int = 3, each: int = 20) -> list[str]:
    """Append ``each`` life events to ``streams`` streams, interleaved; returns their ids."""
    ids = [f"agent-{i}" for i in range(streams)]
    for _ in range(each // 10):
        for sid in ids:
            append_life(store, sid, 10)
    return ids


def expected(store: ae.EventStore, projection: Any, sid: str) -> Any:
    """The fold of the whole stream, from scratch."""
    return fold(projection, store.read(sid)).state


def corrupt_row(store: ae.EventStore, table: str, key: str, state: bytes) -> None:
    """Overwrite one read-model row behind the runner's back."""
    tables, rec = tables_for(store), backend_of(store.recorder)
    if isinstance(tables, MemoryReadModels):
        _, pos = tables.tables[table][key]
        tables.tables[table][key] = (state, pos)
    elif isinstance(rec, SQLiteRecorder):
        conn = sqlite3.connect(str(rec.path))
        with conn:
            conn.execute(f"UPDATE {table} SET state = ? WHERE key = ?", (state, key))
        conn.close()
    else:
        qualified = f'"{rec.schema}".{table}'  # the store's own schema
        with rec.connection() as conn:
            conn.execute(f"UPDATE {qualified} SET state = %s WHERE key = %s", (state, key))


def table_exists(store: ae.EventStore, table: str) -> bool:
    """Whether a read-model generation table exists in the store's database."""
    tables, rec = tables_for(store), backend_of(store.recorder)
    if isinstance(tables, MemoryReadModels):
        return table in tables.tables
    if isinstance(rec, SQLiteRecorder):
        conn = sqlite3.connect(str(rec.path))
        row = conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone()
        conn.close()
        return row is not None
    with rec.connection() as conn:
        found = conn.execute("SELECT to_regclass(%s)", (f'"{rec.schema}".{table}',)).fetchone()
    return found[0] is not None


def positions(store: ae.EventStore) -> list[int]:
    """Global positions of every event, in order (not dense on PostgreSQL)."""
    return [e.position for e in store.read_all()]


# -- catch-up ---------------------------------------------------------------------------------


def test_runner_catches_up_from_its_cursor(store: ae.EventStore) -> None:
    """The runner applies everything once, then only what was appended after its cursor."""
    ids = fill(store)
    p = AgentStateProjection()
    runner = ProjectionRunner(store, [p, Counter()], batch_size=7)
    assert runner.run_until_idle() == 2 * 60
    assert runner.position() == store.last_position()
    for sid in ids:
        assert read_model(store, p, sid) == expected(store, p, sid)
        assert read_model(store, "counter", sid) == 20
    append_life(store, "agent-1", 5)
    again = ProjectionRunner(store, [p, Counter()], batch_size=100)  # a fresh process
    assert again.run_once() == 2 * 5
    assert read_model(store, "counter", "agent-1") == 25
    assert read_model(store, p, "agent-1") == expected(store, p, "agent-1")
    assert read_model(store, p, "nobody") is None


def test_run_once_is_idempotent(store: ae.EventStore) -> None:
    """Repeated run_once after catching up applies nothing and changes nothing."""
    ids = fill(store, streams=2)
    runner = ProjectionRunner(store, [Counter()], batch_size=1000)
    assert runner.run_once() == 40
    for _ in range(3):
        assert runner.run_once() == 0
        assert runner.run_until_idle() == 0
    assert [read_model(store, "counter", s) for s in ids] == [20, 20]


def test_wait_until_gives_read_your_writes(store: ae.EventStore) -> None:
    """wait_until(position) returns once a background runner has applied that position."""
    p = RecoveryStateProjection()
    runner = ProjectionRunner(store, [p], batch_size=50)
    stop = threading.Event()
    worker = threading.Thread(target=runner.run_forever, args=(stop,), kwargs={"idle_wait": 0.05})
    worker.start()
    try:
        for i in range(3):
            res = ae.emit(store, "agent-w", "task.created", "t", {"task_id": f"t{i}"})
            assert runner.wait_until(res.position, timeout=30)
            assert read_model(store, p, "agent-w")["pending_tasks"] == [
                f"t{j}" for j in range(i + 1)
            ]
        assert runner.wait_until(store.last_position() + 1000, timeout=0.05) is False
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive()


def test_runner_feeds_the_snapshotter(store: ae.EventStore) -> None:
    """A runner with a Snapshotter writes a snapshot when a stream crosses a multiple of K."""
    append_life(store, "a", 25)
    p = RecoveryStateProjection()
    snapper = ae.Snapshotter(store, [p], every=10)
    ProjectionRunner(store, [p], batch_size=10, snapshotter=snapper).run_until_idle()
    snap = store.snapshots.load("a", p.name, p.version)
    # Crossing 10 snapshots the stream as it is now (the runner may lag the head).
    assert snap is not None and snap.at_version == 25 and snapper.taken == 1
    assert snap.state == ae.recover(store, "a", p).state


def test_version_bump_triggers_rebuild(store: ae.EventStore) -> None:
    """A read model built by another projection version is rebuilt by the runner."""
    ids = fill(store, streams=2)
    ProjectionRunner(store, [AgentStateProjection()]).run_until_idle()
    assert "seen" not in read_model(store, "agent_state", ids[0])
    v2 = AgentStateV2()
    runner = ProjectionRunner(store, [v2])
    runner.run_until_idle()
    meta = tables_for(store).meta("agent_state")
    assert meta is not None and meta.projection_version == 2
    for sid in ids:
        assert read_model(store, v2, sid) == expected(store, v2, sid)
        assert read_model(store, v2, sid)["seen"] == 20


@pytest.mark.slow  # a kill or race in child processes: the whole suite, not the quick tier
def test_exactly_once_across_sigkill(tmp_path: Path) -> None:
    """SIGKILL mid-batch, several times: every stream's count equals its event count."""
    url = f"sqlite:///{tmp_path / 'crash.db'}"
    sizes = {f"s-{i}": 150 + 37 * i for i in range(5)}
    with ae.open_store(url) as store:
        for step in range(0, max(sizes.values()), 25):
            for sid, n in sizes.items():
                if step < n:
                    store.append(
                        sid,
                        [
                            ae.NewEvent(type="x.tick", module="t", payload={"n": k})
                            for k in range(step, min(step + 25, n))
                        ],
                    )
        total = store.last_position()
        assert total == sum(sizes.values())
        tables = tables_for(store)

        def cursor() -> int:
            m = tables.meta("counter")
            return m.position if m else 0

        env = dict(os.environ, PYTHONPATH=str(ROOT))
        kills = 0
        last = 0
        for _ in range(4):
            child = subprocess.Popen(
                [sys.executable, "-m", "tests.children.runner_child", url, "7"], cwd=ROOT, env=env
            )
            try:
                # Kill once the cursor has moved past the previous kill point.
                while child.poll() is None and cursor() <= last:
                    time.sleep(0.002)
                if child.poll() is None:
                    child.send_signal(signal.SIGKILL)
                    assert child.wait(timeout=60) == -signal.SIGKILL
                    kills += 1
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            at = cursor()
            assert at >= last
            last = at
            if at >= total:
                break
        assert kills >= 2, "the runner finished before it could be killed twice"
        # The final run finishes the job in a child that is left alone.
        done = subprocess.run(
            [sys.executable, "-m", "tests.children.runner_child", url, "7"],
            cwd=ROOT,
            env=env,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0
        assert cursor() == total
        for sid, n in sizes.items():
            assert read_model(store, CountingProjection(), sid) == n, sid


# -- rebuild ------------------------------------------------------------------------------------


def test_rebuild_swaps_in_fresh_table_while_live_serves(store: ae.EventStore) -> None:
    """During a rebuild the live table answers reads; the swap replaces it atomically."""
    ids = fill(store)
    p = AgentStateProjection()
    ProjectionRunner(store, [p]).run_until_idle()
    tables = tables_for(store)
    old = tables.meta(p.name)
    assert old is not None and old.active_table is not None
    live_before = read_model(store, p, ids[0])
    corrupt_row(store, old.active_table, ids[0], b'{"stale":true}')
    seen: list[Any] = []

    def progress(done: int, total: int) -> None:
        seen.append((done, total, read_model(store, p, ids[0])))

    rep = rebuild(store, p, batch_size=11, progress=progress)
    assert seen and all(s[2] == {"stale": True} for s in seen)  # live served until the swap
    assert seen[-1][0] == rep.events == len(positions(store))
    new = tables.meta(p.name)
    assert new is not None and new.active_table == rep.table != old.active_table
    assert new.position == rep.position == store.last_position()
    assert rep.rows == len(ids) and rep.resumed_from == 0 and rep.events_per_s > 0
    assert read_model(store, p, ids[0]) == live_before == expected(store, p, ids[0])
    assert not table_exists(store, old.active_table)  # the old generation is dropped
    assert table_exists(store, rep.table)
    assert rep.to_dict()["table"] == rep.table
    # The runner carries on from the rebuilt cursor.
    append_life(store, ids[0], 3)
    assert ProjectionRunner(store, [p]).run_until_idle() == 3
    assert read_model(store, p, ids[0]) == expected(store, p, ids[0])


def test_rebuild_resumes_after_interruption(store: ae.EventStore) -> None:
    """A rebuild that crashed resumes from its cursor and ends with the right state."""
    ids = fill(store)
    p = AgentStateProjection()
    ProjectionRunner(store, [p]).run_until_idle()
    with pytest.raises(RuntimeError, match="simulated crash"):
        rebuild(store, FailingAfter(25), batch_size=10)
    meta = tables_for(store).meta(p.name)
    assert meta is not None and meta.building_table is not None
    assert meta.building_position == positions(store)[19]  # two whole batches committed
    assert read_model(store, p, ids[1]) == expected(store, p, ids[1])  # live still served
    rep = rebuild(store, p, batch_size=10)
    assert rep.resumed_from == positions(store)[19] and rep.events == len(positions(store)) - 20
    for sid in ids:
        assert read_model(store, p, sid) == expected(store, p, sid)
    assert verify_rebuild(store, p).ok


def test_rebuild_from_scratch_discards_interrupted_build(store: ae.EventStore) -> None:
    """--from-scratch starts over instead of resuming."""
    ids = fill(store, streams=2)
    p = AgentStateProjection()
    with pytest.raises(RuntimeError):
        rebuild(store, FailingAfter(15), batch_size=5)  # the first build ever
    assert read_model(store, p, ids[0]) is None  # nothing live yet
    rep = rebuild(store, p, from_scratch=True, batch_size=5)
    assert rep.resumed_from == 0 and rep.events == len(positions(store))
    for sid in ids:
        assert read_model(store, p, sid) == expected(store, p, sid)


def test_verify_rebuild_finds_corrupted_row(store: ae.EventStore) -> None:
    """verify_rebuild reports an edited row in different, extra and missing keys too."""
    ids = fill(store)
    p = AgentStateProjection()
    ProjectionRunner(store, [p]).run_until_idle()
    clean = verify_rebuild(store, p, batch_size=13)
    assert clean.ok and clean.rows_compared == 3 and clean.position == store.last_position()
    meta = tables_for(store).meta(p.name)
    assert meta is not None and meta.active_table is not None
    bad = dict(expected(store, p, ids[1]), restarts=999)
    corrupt_row(store, meta.active_table, ids[1], json.dumps(bad).encode())
    rep = verify_rebuild(store, p)
    assert not rep.ok
    assert rep.different == [ids[1]] and rep.only_live == [] and rep.only_rebuilt == []
    assert rep.to_dict()["different"] == [ids[1]]
    # Verification never swaps or repairs anything.
    assert read_model(store, p, ids[1])["restarts"] == 999
    assert rebuild(store, p).rows == 3
    assert verify_rebuild(store, p).ok


def test_verify_rebuild_on_never_run_projection(store: ae.EventStore) -> None:
    """verify on a projection never run says so, registers nothing and creates no table
    (a pass over zero rows would vouch for a read model that is not there); once built,
    it compares every key."""
    ids = fill(store, streams=2)
    with pytest.raises(ConfigError, match="never built"):
        verify_rebuild(store, AgentStateProjection())
    assert tables_for(store).meta(AgentStateProjection.name) is None
    assert tables_for(store).names() == []
    ProjectionRunner(store, [AgentStateProjection()]).run_until_idle()
    assert verify_rebuild(store, AgentStateProjection()).rows_compared == len(ids)


def test_read_models_belong_to_the_backend(store: ae.EventStore) -> None:
    """The backend declares Capability.READ_MODELS and hands out one read-model object
    per store, which a second handle of the same store (over the same recorder) shares."""
    assert ae.Capability.READ_MODELS in store.capabilities
    tables = tables_for(store)
    recorder = store.recorder
    assert isinstance(recorder, KeepsReadModels)
    assert tables is recorder.read_models() is tables_for(store)
    other = ae.EventStore(store.recorder, check_identity=False)
    assert tables_for(other) is tables


def test_a_store_without_read_models_is_refused_by_name(tmp_path: Path) -> None:
    """A recorder that does not declare Capability.READ_MODELS gets a ConfigError that
    names its store from the runner, and the console's look finds nothing."""
    from ares_events.projections.tables import read_models, stored_checkpoints

    class Bare(MemoryRecorder):
        capabilities = MemoryRecorder.capabilities - {ae.Capability.READ_MODELS}

    with ae.EventStore(Bare(), url="bare://x") as store:
        store.append("s", [ae.NewEvent(type="a.b", module="t", payload={})])
        with pytest.raises(ConfigError, match="bare://x"):
            ProjectionRunner(store, [AgentStateProjection()])
        assert read_models(store) == [] and stored_checkpoints(store) == []


# -- CLI: rebuild ---------------------------------------------------------------------------------


@pytest.fixture
def cli_db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """URL of a SQLite file with 3 streams x 20 events; ARES_* env cleared."""
    for name in list(os.environ):
        if name.startswith("ARES_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with ae.open_store(url) as s:
        fill(s)
    return url


def test_cli_rebuild_and_verify(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """rebuild reports events, rows and rate; --verify is clean, then lists a corrupted key."""
    code, data = run_json(capsys, "--store", cli_db, "rebuild", "agent_state", "--batch-size", "7")
    assert code == 0
    assert (data["events"], data["rows"], data["position"]) == (60, 3, 60)
    assert data["resumed_from"] == 0 and data["events_per_s"] >= 0
    code, out, _ = run(capsys, "--store", cli_db, "rebuild", "agent_state", "--from-scratch")
    assert code == 0 and "rebuilt agent_state: 60 event(s) into 3 row(s)" in out
    assert "events/s" in out
    code, data = run_json(capsys, "--store", cli_db, "rebuild", "agent_state", "--verify")
    assert code == 0 and data["ok"] is True and data["rows_compared"] == 3
    with ae.open_store(cli_db) as s:
        meta = tables_for(s).meta("agent_state")
        assert meta is not None and meta.active_table is not None
        corrupt_row(s, meta.active_table, "agent-2", b'{"status":"forged"}')
    code, data = run_json(capsys, "--store", cli_db, "rebuild", "agent_state", "--verify")
    assert code == 1 and data["different"] == ["agent-2"] and data["ok"] is False
    code, out, _ = run(capsys, "--store", cli_db, "rebuild", "agent_state", "--verify")
    assert code == 1 and "agent-2" in out and "state differs" in out
    code, _, _ = run(capsys, "--store", cli_db, "rebuild", "agent_state")
    assert code == 0
    code, _, _ = run(capsys, "--store", cli_db, "rebuild", "agent_state", "--verify")
    assert code == 0


def test_cli_rebuild_usage_errors(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Unknown projection or --verify with --from-scratch: exit 2."""
    code, _, _ = run(capsys, "--store", cli_db, "rebuild", "nope")
    assert code == 2
    code, _, err = run(
        capsys, "--store", cli_db, "rebuild", "agent_state", "--verify", "--from-scratch"
    )
    assert code == 2 and "--from-scratch" in err


def test_cli_rebuild_schema_error_exits_1_and_resumes(
    cli_db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad event stops the rebuild with stream and version (exit 1); nothing is swapped."""
    with ae.open_store(cli_db) as s:
        ae.emit(s, "agent-0", "agent.dead", "t", {"no_cause": True})
    code, out, err = run(capsys, "--store", cli_db, "rebuild", "agent_state", "--batch-size", "10")
    assert code == 1 and out == ""
    assert "'agent-0'" in err and "version 21" in err
    with ae.open_store(cli_db) as s:
        meta = tables_for(s).meta("agent_state")
        assert meta is not None and meta.building_position == 60 and meta.position == 0


def test_runner_and_rebuild_running_at_once_apply_each_event_once(store: ae.EventStore) -> None:
    """A live runner and a rebuild of the same projection never rewind each other's cursor:
    every event is counted exactly once in the read model after the swap."""
    p = CountingProjection()
    for i in range(300):
        ae.emit(store, f"s{i % 3}", "tick", "t", {"i": i})
    runner = ProjectionRunner(store, [p], batch_size=7)
    runner.run_once()
    stop = threading.Event()
    worker = threading.Thread(target=runner.run_forever, args=(stop,), kwargs={"idle_wait": 0.01})
    worker.start()
    try:
        for i in range(300, 450):
            ae.emit(store, f"s{i % 3}", "tick", "t", {"i": i})
            if i == 350:
                rebuild(store, p, batch_size=50)
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    runner.run_until_idle()
    for k in range(3):
        assert read_model(store, p, f"s{k}") == 150
    assert verify_rebuild(store, p).ok


class _RebuildsOnceMidFold(CountingProjection):
    """Counts per stream; the first time the live runner keys a batch (after it has read
    the registry, before it loads rows) a rebuild swaps in a new table and drops the old."""

    def __init__(self, store: ae.EventStore) -> None:
        self.store = store
        self.armed = True

    def key(self, event: RecordedEvent) -> str:
        if self.armed:
            self.armed = False
            rebuild(self.store, self, batch_size=50)
        return event.stream_id


def test_a_rebuild_that_drops_the_table_mid_fold_is_a_move_not_a_crash(
    store: ae.EventStore,
) -> None:
    """The runner read the registry, then a rebuild swapped and dropped that generation
    before the runner loaded its rows: the pass retries on the new table (no exception),
    and every event is still counted exactly once."""
    p = _RebuildsOnceMidFold(store)
    p.armed = False
    for i in range(60):
        ae.emit(store, f"s{i % 3}", "tick", "t", {"i": i})
    runner = ProjectionRunner(store, [p], batch_size=7)
    runner.run_once()
    for i in range(60, 90):
        ae.emit(store, f"s{i % 3}", "tick", "t", {"i": i})
    p.armed = True
    runner.run_until_idle()
    assert not p.armed
    for k in range(3):
        assert read_model(store, p, f"s{k}") == 30
    assert verify_rebuild(store, p).ok


def _named_counter(name: str, step: int) -> Any:
    """A counting projection called ``name`` that adds ``step`` per event."""

    class Named:
        version: ClassVar[int] = 1

        def initial(self) -> int:
            return 0

        def apply(self, state: Any, event: RecordedEvent) -> int:
            return int(state) + step

    Named.name = name  # type: ignore[attr-defined]
    return Named()


@pytest.mark.parametrize(("a", "b"), [("inj-x", "inj_x"), ("Agent", "agent"), ("a.b", "a b")])
def test_projection_names_that_look_alike_keep_separate_read_models(
    store: ae.EventStore, a: str, b: str
) -> None:
    """Two projection names that sanitize to the same text get separate tables: each
    read model holds only its own fold (the table name carries a hash of the exact name)."""
    ids = fill(store, streams=2, each=10)
    pa, pb = _named_counter(a, 1), _named_counter(b, 100)
    assert table_name(a, 1) != table_name(b, 1)
    ProjectionRunner(store, [pa, pb], batch_size=3).run_until_idle()
    for sid in ids:
        assert read_model(store, a, sid) == 10
        assert read_model(store, b, sid) == 1000
