"""Read models under races: a diff against a live runner, concurrent rebuilds and runner
replicas after a version bump (child processes), and keys that are not strings."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.events import RecordedEvent
from ares_events.core.recorder import backend_of
from ares_events.errors import InvalidEvent, StoreError
from ares_events.projections import ProjectionRunner, read_model, rebuild, verify_rebuild
from ares_events.projections import runner as runner_module
from ares_events.projections.tables import tables_for
from ares_events.stores.memory.read_models import MemoryReadModels
from ares_events.stores.sqlite.recorder import SQLiteRecorder
from tests.children.projection_race_child import ANOTHER, VersionedCounter
from tests.fixtures.fix_backends import open_backend, store_url_for
from tests.projections.test_runner import corrupt_row

ROOT = Path(__file__).resolve().parents[2]
SQL = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]
ALL = [pytest.param("memory", id="memory"), *SQL]


@pytest.fixture(params=ALL)
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ae.EventStore]:
    """A fresh memory, SQLite or PostgreSQL store."""
    with open_backend(request.param, tmp_path, request) as store:
        yield store


def _tick(n: int) -> ae.NewEvent:
    return ae.NewEvent(type="x.tick", module="t", payload={"i": n})


def _append(store: ae.EventStore, streams: list[str], each: int) -> None:
    """``each`` more events on every stream, 50 to an append, interleaved."""
    for start in range(0, each, 50):
        for sid in streams:
            store.append(sid, [_tick(i) for i in range(start, min(start + 50, each))])


def _counts(store: ae.EventStore) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in store.read_all():
        out[e.stream_id] = out.get(e.stream_id, 0) + 1
    return out


def _rm_tables(store: ae.EventStore, name: str) -> set[str]:
    """Every read-model table of projection ``name`` in the store's database."""
    tables, rec = tables_for(store), backend_of(store.recorder)
    prefix = f"ares_rm_{name}_"
    if isinstance(tables, MemoryReadModels):
        return {t for t in tables.tables if t.startswith(prefix)}
    if isinstance(rec, SQLiteRecorder):
        conn = sqlite3.connect(str(rec.path))
        try:
            rows = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            conn.close()
    else:
        with rec.connection() as conn:
            rows = conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (rec.schema,),
            ).fetchall()
    return {r[0] for r in rows if str(r[0]).startswith(prefix)}


class Counter:
    """Events per stream."""

    name = "counter"
    version = 1

    def initial(self) -> int:
        """Nothing counted."""
        return 0

    def apply(self, state: Any, event: RecordedEvent) -> int:
        """Count one event."""
        return int(state) + 1


# -- F1: rebuild --verify against a live runner ---------------------------------------------


def test_verify_against_a_working_runner_reports_no_false_difference(
    any_store: ae.EventStore,
) -> None:
    """A writer appends and a live runner keeps the table current while verify_rebuild
    runs again and again: the runner commits during many of the verifies, and not one
    reports a difference; a row edited behind the runner's back is still reported."""
    store, p = any_store, Counter()
    writers = [f"w{i}" for i in range(8)]
    _append(store, ["still", *writers], 100)
    runner = ProjectionRunner(store, [p], batch_size=13)
    runner.run_until_idle()
    tables = tables_for(store)
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        i = 0
        try:
            while not stop.is_set():
                store.append(writers[i % len(writers)], [_tick(i)])
                i += 1
        except BaseException as exc:  # shown by the assertion below
            errors.append(exc)

    def cursor() -> int:
        meta = tables.meta(p.name)
        assert meta is not None
        return meta.position

    threads = [
        threading.Thread(target=write),
        threading.Thread(target=runner.run_forever, args=(stop,), kwargs={"idle_wait": 0.01}),
    ]
    for t in threads:
        t.start()
    overlapped, false_alarms = 0, []
    try:
        for _ in range(1000):
            before = cursor()
            rep = verify_rebuild(store, p, batch_size=200)
            if cursor() != before:
                overlapped += 1  # the runner committed while this verify ran
            if not rep.ok:
                false_alarms.append(rep.to_dict())
            if overlapped >= 20:
                break
        # A real difference, on a key the writer never touches, while the runner works.
        meta = tables.meta(p.name)
        assert meta is not None and meta.active_table is not None
        corrupt_row(store, meta.active_table, "still", b"1000")
        real = verify_rebuild(store, p, batch_size=200)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors and not any(t.is_alive() for t in threads)
    assert overlapped >= 20, "the runner never committed during a verify: no race was run"
    assert false_alarms == []
    assert not real.ok
    assert (real.different, real.only_live, real.only_rebuilt) == (["still"], [], [])


# -- F2: concurrent rebuilds --------------------------------------------------------------


class _TakenOverMidFill(VersionedCounter):
    """The first time this rebuild keys a batch (it claimed its table, before it loads
    rows), ``rebuild(..., from_scratch=True)`` of the same projection takes the slot over
    and drops that table; the takeover itself is ``then``."""

    def __init__(self, store: ae.EventStore, then: Any, version: int = 1) -> None:
        super().__init__(version)
        self.store, self.then, self.armed = store, then, True

    def key(self, event: RecordedEvent) -> str:
        if self.armed:
            self.armed = False
            try:
                rebuild(self.store, self.then, from_scratch=True, batch_size=25)
            except RuntimeError:
                pass  # a takeover that crashed half-way: its slot stays claimed
        return event.stream_id


class _CrashesAfter(VersionedCounter):
    """Raises after ``n`` events (a rebuild that died half-way)."""

    def __init__(self, n: int, version: int) -> None:
        super().__init__(version)
        self.left = n

    def apply(self, state: Any, event: RecordedEvent) -> dict[str, int]:
        if self.left == 0:
            raise RuntimeError("simulated crash")
        self.left -= 1
        return super().apply(state, event)


def test_a_rebuild_whose_table_is_taken_over_gets_the_documented_error(
    any_store: ae.EventStore,
) -> None:
    """A rebuild from scratch takes over the slot of a running rebuild and drops its
    table: the running one stops with "another rebuild ... is running" (not the driver's
    missing-table error), and the winner's read model is exact."""
    store = any_store
    _append(store, ["a", "b", "c"], 60)
    ProjectionRunner(store, [VersionedCounter(1)]).run_until_idle()
    loser = _TakenOverMidFill(store, VersionedCounter(1))
    with pytest.raises(StoreError, match=ANOTHER) as exc:
        rebuild(store, loser, batch_size=25)
    assert "no such table" not in str(exc.value) and "does not exist" not in str(exc.value)
    meta = tables_for(store).meta("race")
    assert meta is not None and meta.building_table is None
    assert _rm_tables(store, "race") == {meta.active_table}
    for sid in "abc":
        assert read_model(store, "race", sid) == {"n": 60, "v": 1}


def test_a_runner_that_lost_its_rebuild_waits_then_takes_over_a_stalled_one(
    any_store: ae.EventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner whose version changed loses its rebuild to another one: it does not crash
    and does not fold into the old table; it waits while that rebuild holds the slot, and
    takes over once the slot made no progress for the stall time."""
    store = any_store
    _append(store, ["a", "b", "c"], 60)
    ProjectionRunner(store, [VersionedCounter(1)]).run_until_idle()
    tables = tables_for(store)
    v2 = _TakenOverMidFill(store, _CrashesAfter(30, 2), version=2)
    runner = ProjectionRunner(store, [v2])
    assert runner.run_once() == 0  # lost to the takeover, which then died half-way
    stalled = tables.meta("race")
    assert stalled is not None and stalled.building_table is not None
    assert stalled.projection_version == 1 and stalled.building_position > 0
    _append(store, ["a"], 5)
    assert runner.run_once() == 0  # waits: the slot is held, the live table untouched
    assert tables.meta("race") == stalled
    assert read_model(store, "race", "a") == {"n": 60, "v": 1}
    monkeypatch.setattr(runner_module, "_STALLED_AFTER_S", 0.0)
    runner.run_until_idle()  # no progress since: taken over, rebuilt, caught up
    meta = tables.meta("race")
    assert meta is not None and meta.projection_version == 2 and meta.building_table is None
    assert meta.position == store.last_position()
    assert _rm_tables(store, "race") == {meta.active_table}
    assert {sid: read_model(store, "race", sid) for sid in "abc"} == {
        "a": {"n": 65, "v": 2},
        "b": {"n": 60, "v": 2},
        "c": {"n": 60, "v": 2},
    }


def _race(url: str, roles: list[str], version: int, batch: int) -> list[tuple[int, str]]:
    """Start one child per role, let them all go at once; their (exit code, stderr)."""
    args = (version, batch)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.children.projection_race_child",
                url,
                role,
                *map(str, args),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for role in roles
    ]
    try:
        for c in children:
            assert c.stdout is not None and c.stdout.readline().strip() == "ready"
        for c in children:
            assert c.stdin is not None
            c.stdin.write("go\n")
            c.stdin.flush()
        return [(c.wait(timeout=240), c.communicate()[1]) for c in children]
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait()


def _assert_exact(store: ae.EventStore, version: int) -> None:
    """The read model is the fold of the whole log by ``version``, nothing half-built."""
    meta = tables_for(store).meta("race")
    assert meta is not None and meta.projection_version == version
    assert meta.building_table is None and meta.position == store.last_position()
    assert meta.active_table is not None
    assert _rm_tables(store, "race") == {meta.active_table}
    rows = dict(tables_for(store).scan(meta.active_table))
    assert rows == {sid: {"n": n, "v": version} for sid, n in _counts(store).items()}


@pytest.mark.slow  # races in child processes
@pytest.mark.parametrize("backend", SQL)
def test_two_runners_started_after_a_version_bump_both_finish(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two runner replicas start at once with a bumped projection version, again and
    again: both rebuild first and neither crashes (no missing-table error); each returns
    with the read model rebuilt by the new version, exact, and no table left over."""
    url = store_url_for(backend, tmp_path, request)
    streams = [f"s{i}" for i in range(8)]
    with ae.open_store(url) as store:
        _append(store, streams, 300)
        ProjectionRunner(store, [VersionedCounter(1)]).run_until_idle()
        waited = 0
        for version in range(2, 10):
            _append(store, streams, 50)
            results = _race(url, ["runner", "runner"], version, 100)
            assert [rc for rc, _ in results] == [0, 0], results
            _assert_exact(store, version)
            waited += any("waiting for its swap" in err for _, err in results)
        assert waited, "no runner ever lost the rebuild: no race was run"


@pytest.mark.slow  # races in child processes
@pytest.mark.parametrize("backend", SQL)
def test_concurrent_rebuilds_lose_with_the_documented_error(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two rebuilds of one projection at once (resuming or from scratch), again and
    again: each finishes or stops with "another rebuild of the same projection is
    running", never a missing-table error; one finishes, and its read model is exact."""
    url = store_url_for(backend, tmp_path, request)
    streams = [f"s{i}" for i in range(8)]
    pairs = [
        ["rebuild", "rebuild"],
        ["rebuild-scratch", "rebuild-scratch"],
        ["rebuild", "rebuild-scratch"],
    ]
    with ae.open_store(url) as store:
        _append(store, streams, 300)
        ProjectionRunner(store, [VersionedCounter(1)]).run_until_idle()
        lost = 0
        for i in range(9):
            _append(store, streams, 50)
            results = _race(url, pairs[i % len(pairs)], 1, 100)
            assert all(rc in (0, 3) for rc, _ in results), results
            assert any(rc == 0 for rc, _ in results), results
            lost += any(rc == 3 for rc, _ in results)
            _assert_exact(store, 1)
            assert verify_rebuild(store, VersionedCounter(1)).ok
        assert lost, "no rebuild ever lost: no race was run"


# -- F5: keys that are not strings -----------------------------------------------------------


class _IntKeys(Counter):
    """Keys every event by an int (the key must be a str or None)."""

    name = "by_mod"

    def key(self, event: RecordedEvent) -> int:
        return int(event.payload["i"]) % 3


def test_a_key_that_is_not_a_string_is_refused_on_every_backend(
    any_store: ae.EventStore,
) -> None:
    """A projection whose key() returns an int is an InvalidEvent naming the projection
    and the key's type, from the runner and from a rebuild, on every backend; nothing is
    committed (no silently lost counts)."""
    store = any_store
    _append(store, ["a", "b"], 30)
    runner = ProjectionRunner(store, [_IntKeys()], batch_size=10)
    with pytest.raises(InvalidEvent, match=r"key of projection 'by_mod'.*got int") as exc:
        runner.run_once()
    assert exc.value.stream_id == "a"
    meta = tables_for(store).meta("by_mod")
    assert meta is not None and meta.position == 0 and meta.active_table is not None
    assert list(tables_for(store).scan(meta.active_table)) == []
    with pytest.raises(InvalidEvent, match=r"key of projection 'by_mod'.*got int"):
        rebuild(store, _IntKeys())
