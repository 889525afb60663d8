"""Snapshot stores: the shared contract on every backend, plus tampering with stored rows.

Tampering is backend-specific (it edits rows behind the store's back), so it lives here,
not in :class:`~ares_events.testing.snapshots.SnapshotContract`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.backend import AppendOutcome, Batch, Capability, Head
from ares_events.core.events import ExpectedVersion
from ares_events.core.snapshot_format import Snapshot, SnapshotCheck
from ares_events.core.snapshots import SnapshotStore, make_snapshot, snapshot_store_for
from ares_events.core.store import EventStore
from ares_events.errors import SnapshotMismatch, StoreError
from ares_events.stores.memory import MemorySnapshotRows
from ares_events.stores.postgres import PostgresSnapshotRows
from ares_events.stores.sqlite import SQLiteSnapshotRows
from ares_events.testing import SnapshotContract
from ares_events.testing.snapshots import append_events
from tests.fixtures.fix_backends import _params, run_behind_store


@pytest.fixture(params=_params(["memory", "sqlite", "postgres"]))
def backend(request: pytest.FixtureRequest) -> str:
    """The three systems of record (snapshots are never cached, so no +cache variants)."""
    return str(request.param)


class TestSnapshotContract(SnapshotContract):
    """The snapshot contract on memory, SQLite and PostgreSQL."""


# -- tampering, per backend -----------------------------------------------------------------


_sql = run_behind_store


def tamper_state(
    store: ae.EventStore, backend: str, stream_id: str, projection: str, new_state_json: bytes
) -> None:
    """Overwrite a stored snapshot's state bytes, leaving its digest as it was."""
    if backend == "memory":
        table = store.recorder.snapshot_table  # type: ignore[attr-defined]
        row = table[(stream_id, projection)]
        table[(stream_id, projection)] = (*row[:3], new_state_json, *row[4:])
        return
    _sql(
        store,
        backend,
        "UPDATE ares_snapshots SET state = ? WHERE stream_id = ? AND projection = ?",
        "UPDATE {schema}.ares_snapshots SET state = %s WHERE stream_id = %s AND projection = %s",
        (new_state_json, stream_id, projection),
    )


def tamper_at_hash(
    store: ae.EventStore, backend: str, stream_id: str, projection: str, at_hash: bytes
) -> None:
    """Overwrite a stored snapshot's at_hash."""
    if backend == "memory":
        table = store.recorder.snapshot_table  # type: ignore[attr-defined]
        row = table[(stream_id, projection)]
        table[(stream_id, projection)] = (row[0], row[1], at_hash, *row[3:])
        return
    _sql(
        store,
        backend,
        "UPDATE ares_snapshots SET at_hash = ? WHERE stream_id = ? AND projection = ?",
        "UPDATE {schema}.ares_snapshots SET at_hash = %s WHERE stream_id = %s AND projection = %s",
        (at_hash, stream_id, projection),
    )


def truncate_stream(store: ae.EventStore, backend: str, stream_id: str, keep: int) -> None:
    """Delete every event of the stream after version ``keep`` (the head row stays)."""
    if backend == "memory":
        del store.recorder._d.streams[stream_id][keep:]  # type: ignore[attr-defined]
        return
    _sql(
        store,
        backend,
        "DELETE FROM ares_events WHERE stream_id = ? AND version > ?",
        "DELETE FROM {schema}.ares_events WHERE stream_id = %s AND version > %s",
        (stream_id, keep),
    )


def test_edited_state_is_a_digest_mismatch(store: ae.EventStore, backend: str) -> None:
    """A stored state edited behind the store's back is rejected: state digest mismatch."""
    append_events(store, "s", 3)
    store.snapshots.save(make_snapshot(store, "s", "p", 1, {"pending": ["t1"]}, 3))
    tamper_state(store, backend, "s", "p", b'{"pending":[]}')
    with pytest.raises(SnapshotMismatch, match="state digest mismatch") as info:
        store.snapshots.load("s", "p", 1)
    assert (info.value.stream_id, info.value.projection) == ("s", "p")
    assert store.snapshots.load_checked("s", "p", 1) == SnapshotCheck(None, "state digest mismatch")
    raw = store.snapshots.load("s", "p", verify=False)
    assert raw is not None
    assert raw.state == {"pending": []}
    assert [r for _, r in store.snapshots.verify_all()] == ["state digest mismatch"]


def test_stored_state_that_is_not_json_is_rejected(store: ae.EventStore, backend: str) -> None:
    """Garbage in the stored state is reported as a mismatch, never a decode crash."""
    append_events(store, "s", 1)
    store.snapshots.save(make_snapshot(store, "s", "p", 1, {"a": 1}, 1))
    tamper_state(store, backend, "s", "p", b"\xff{not json")
    assert store.snapshots.load_checked("s", "p") == SnapshotCheck(None, "state digest mismatch")
    with pytest.raises(SnapshotMismatch, match="cannot be decoded"):
        store.snapshots.load("s", "p", verify=False)


def test_stored_hash_of_other_version_is_rejected(store: ae.EventStore, backend: str) -> None:
    """A stored at_hash that is another event's hash is rejected: at_hash mismatch."""
    events = append_events(store, "s", 4)
    store.snapshots.save(make_snapshot(store, "s", "p", 1, {"n": 3}, 3))
    tamper_at_hash(store, backend, "s", "p", events[1].hash)
    with pytest.raises(SnapshotMismatch, match="at_hash does not match stream at version 3"):
        store.snapshots.load("s", "p")
    snap, reason = store.snapshots.load_checked("s", "p", 1)
    assert snap is None
    assert reason == "at_hash does not match stream at version 3"


def test_snapshot_from_a_rewritten_stream_is_stale(store: ae.EventStore, backend: str) -> None:
    """A snapshot of a stream that was deleted and rewritten no longer matches it."""
    append_events(store, "s", 2)
    store.snapshots.save(make_snapshot(store, "s", "p", 1, {"old": True}, 2))
    # Same stream id, same versions, different events: the old snapshot is stale.
    truncate_stream(store, backend, "s", 0)
    if backend == "memory":
        store.recorder._d.heads.pop("s")  # type: ignore[attr-defined]
    else:
        _sql(
            store,
            backend,
            "DELETE FROM ares_streams WHERE stream_id = ?",
            "DELETE FROM {schema}.ares_streams WHERE stream_id = %s",
            ("s",),
        )
    assert len(append_events(store, "s", 2)) == 2
    reason = store.snapshots.load_checked("s", "p", 1).reason
    assert reason == "at_hash does not match stream at version 2"


def test_truncated_stream_rejects_snapshot(store: ae.EventStore, backend: str) -> None:
    """Events deleted below at_version: the snapshot is rejected as a truncated stream."""
    append_events(store, "s", 5)
    store.snapshots.save(make_snapshot(store, "s", "p", 1, {"n": 5}, 5))
    truncate_stream(store, backend, "s", 3)
    with pytest.raises(SnapshotMismatch, match=r"shorter than at_version 5.*truncated\?") as info:
        store.snapshots.load("s", "p")
    assert "head says version 5" in info.value.reason
    again = make_snapshot(store, "s", "p", 1, {"n": 3}, 3)
    with pytest.raises(SnapshotMismatch, match="shorter than at_version 5"):
        store.snapshots.save(make_snapshot_unchecked(again, at_version=5))


def make_snapshot_unchecked(snap: Snapshot, *, at_version: int) -> Snapshot:
    """``snap`` claiming another at_version (a stale snapshot built elsewhere)."""
    import dataclasses

    return dataclasses.replace(snap, at_version=at_version)


def test_event_missing_at_at_version_is_rejected(store: ae.EventStore, backend: str) -> None:
    """The event at at_version deleted from the middle: the snapshot is rejected."""
    append_events(store, "s", 4)
    store.snapshots.save(make_snapshot(store, "s", "p", 1, {}, 2))
    if backend == "memory":
        del store.recorder._d.streams["s"][1]  # type: ignore[attr-defined]
    else:
        _sql(
            store,
            backend,
            "DELETE FROM ares_events WHERE stream_id = ? AND version = ?",
            "DELETE FROM {schema}.ares_events WHERE stream_id = %s AND version = %s",
            ("s", 2),
        )
    reason = store.snapshots.load_checked("s", "p").reason
    assert reason == "stream has no event at version 2 (next is 3; deleted?)"


# -- dispatch ---------------------------------------------------------------------------------


_EXPECTED_ROWS: dict[str, type[Any]] = {
    "memory": MemorySnapshotRows,
    "sqlite": SQLiteSnapshotRows,
    "postgres": PostgresSnapshotRows,
}


def test_each_backend_gets_its_own_snapshot_store(store: ae.EventStore, backend: str) -> None:
    """store.snapshots keeps its rows in the events' own backend."""
    assert type(store.snapshots) is SnapshotStore
    assert type(store.snapshots._rows) is _EXPECTED_ROWS[backend]
    assert Capability.SNAPSHOTS in store.capabilities
    assert "password" not in repr(store.snapshots)
    assert "***" in repr(store.snapshots) or backend != "postgres"


class _Passthrough:
    """A real delegating recorder wrapper, the shape a cache layer has: it defines each
    method it forwards (``isinstance`` against a runtime-checkable protocol looks them up
    on the class from Python 3.12 on) and declares only what it forwards."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.capabilities = inner.capabilities & {Capability.SNAPSHOTS}

    def describe(self) -> str:
        return f"passthrough over {self.inner.describe()}"

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        out: AppendOutcome = self.inner.append(batch, expected_version)
        return out

    def read(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.read(*args, **kwargs)

    def read_all(self, *args: Any, **kwargs: Any) -> Any:
        return self.inner.read_all(*args, **kwargs)

    def head(self, stream_id: str) -> Head | None:
        head: Head | None = self.inner.head(stream_id)
        return head

    def heads(self) -> Any:
        return self.inner.heads()

    def last_position(self) -> int:
        return int(self.inner.last_position())

    def snapshot_rows(self) -> Any:
        return self.inner.snapshot_rows()

    def close(self) -> None:
        pass


def test_wrapped_recorder_is_unwrapped(store: ae.EventStore, backend: str) -> None:
    """A delegating wrapper gets the snapshot table of the backend beneath it, on every
    Python (no ``__getattr__`` forwarding)."""
    wrapped = EventStore(_Passthrough(store.recorder))
    snaps = wrapped.snapshots
    assert type(snaps._rows) is _EXPECTED_ROWS[backend]
    append_events(wrapped, "w", 2)
    snaps.save(make_snapshot(wrapped, "w", "p", 1, {"w": 1}, 2))
    loaded = store.snapshots.load("w", "p", 1)
    assert loaded is not None
    assert loaded.state == {"w": 1}


class _NoSnapshots:
    """A recorder with no snapshot table."""

    capabilities: frozenset[Capability] = frozenset()

    def describe(self) -> str:
        return "nosnap://"

    def close(self) -> None:
        """Nothing to release."""


def test_backend_without_snapshots_raises_store_error() -> None:
    """A backend with no snapshot store raises StoreError naming the backend."""
    es = EventStore(_NoSnapshots())  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="_NoSnapshots"):
        snapshot_store_for(es)


class _OwnSnapshots(_NoSnapshots):
    """A third-party recorder that declares SNAPSHOTS and provides its own rows."""

    capabilities: frozenset[Capability] = frozenset({Capability.SNAPSHOTS})

    def __init__(self) -> None:
        self.given: list[Any] = []

    def snapshot_rows(self) -> Any:
        rows = MemorySnapshotRows({}, lambda: None)
        self.given.append(rows)
        return rows


def test_recorder_hook_provides_snapshot_store() -> None:
    """A recorder that declares SNAPSHOTS hands the snapshot store its rows."""
    rec = _OwnSnapshots()
    es = EventStore(rec)  # type: ignore[arg-type]
    assert es.snapshots._rows is rec.given[0]


# -- sharing and concurrency ----------------------------------------------------------------


def test_named_memory_stores_share_snapshots() -> None:
    """Two opens of memory://NAME see the same snapshots; private memory:// do not."""
    name = f"memory://snap-share-{id(object())}"
    with ae.open_store(name) as a, ae.open_store(name) as b:
        append_events(a, "s", 1)
        a.snapshots.save(make_snapshot(a, "s", "p", 1, {"x": 1}, 1))
        assert b.snapshots.load("s", "p") is not None
    with ae.open_store("memory://") as c:
        assert list(c.snapshots.list()) == []


def test_sqlite_snapshots_are_shared_across_opens(tmp_path: Path) -> None:
    """A second open of the same SQLite file sees a snapshot as soon as it is saved."""
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    with ae.open_store(url) as a, ae.open_store(url) as b:
        append_events(a, "s", 2)
        a.snapshots.save(make_snapshot(a, "s", "p", 1, {"x": 2}, 2))
        loaded = b.snapshots.load("s", "p", 1)
        assert loaded is not None
        assert loaded.state == {"x": 2}
        assert b.snapshots.delete("s") == 1
        assert a.snapshots.load("s", "p") is None


def test_in_memory_sqlite_has_snapshots() -> None:
    """``sqlite://`` (in-memory) keeps snapshots for the life of the store."""
    with ae.open_store("sqlite://") as s:
        append_events(s, "s", 1)
        s.snapshots.save(make_snapshot(s, "s", "p", 1, [1], 1))
        loaded = s.snapshots.load("s", "p")
        assert loaded is not None
        assert loaded.state == [1]


def _run_threads(n: int, fn: Callable[[int], None]) -> list[BaseException]:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def run(i: int) -> None:
        try:
            barrier.wait(10)
            fn(i)
        except BaseException as exc:  # collected and re-raised by the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return errors


def test_concurrent_saves_from_threads(store: ae.EventStore) -> None:
    """Threads saving snapshots at once all succeed; each (stream, projection) keeps one."""
    events = append_events(store, "s", 20)

    def save_many(i: int) -> None:
        for v in range(1, 21):
            store.snapshots.save(make_snapshot(store, "s", f"p{i % 3}", 1, {"v": v, "t": i}, v))

    assert _run_threads(6, save_many) == []
    infos = list(store.snapshots.list("s"))
    assert [i.projection for i in infos] == ["p0", "p1", "p2"]
    for info in infos:
        snap = store.snapshots.load("s", info.projection, 1)
        assert snap is not None
        assert snap.at_hash == events[snap.at_version - 1].hash
        assert snap.state["v"] == snap.at_version


def test_sqlite_saves_from_two_stores_on_one_file(tmp_path: Path) -> None:
    """Two stores on one SQLite file saving at once never fail with 'database is locked'."""
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(ae.open_store(url)) for _ in range(3)]
        append_events(stores[0], "s", 10)

        def save_many(i: int) -> None:
            st = stores[i % len(stores)]
            for v in range(1, 11):
                st.snapshots.save(make_snapshot(st, "s", f"p{i}", 1, {"v": v}, v))
                st.snapshots.delete("s", f"gone{i}")

        assert _run_threads(6, save_many) == []
        assert [i.at_version for i in stores[1].snapshots.list("s")] == [10] * 6


def test_list_pages_through_many_snapshots(store: ae.EventStore) -> None:
    """list() returns every snapshot across internal pages, in order, exactly once."""
    append_events(store, "s", 1)
    snap = make_snapshot(store, "s", "p", 1, {}, 1)
    names = sorted(f"proj-{i:04d}" for i in range(1203))
    for name in names:
        store.snapshots.save(make_snapshot_named(snap, name))
    assert [i.projection for i in store.snapshots.list()] == names
    assert [i.projection for i in store.snapshots.list("s")] == names


def make_snapshot_named(snap: Snapshot, projection: str) -> Snapshot:
    """``snap`` under another projection name."""
    import dataclasses

    return dataclasses.replace(snap, projection=projection)


def test_snapshot_store_after_close_raises_store_closed(store: ae.EventStore) -> None:
    """Using the snapshot store after the event store closed raises StoreClosed (a
    StoreError), on every backend, memory included."""
    append_events(store, "s", 1)
    snap = make_snapshot(store, "s", "p", 1, {}, 1)
    snaps = store.snapshots
    store.close()
    with pytest.raises(ae.StoreClosed, match="closed"):
        snaps.save(snap)
    with pytest.raises(ae.StoreClosed, match="closed"):
        snaps.load("s", "p")
    with pytest.raises(StoreError):
        list(snaps.list())


def test_database_failure_is_a_store_error_naming_the_stream(
    store: ae.EventStore, backend: str
) -> None:
    """A failing snapshot table raises StoreError naming the action and the stream."""
    if backend == "memory":
        pytest.skip("memory:// has no database to fail")
    append_events(store, "s", 1)
    _sql(store, backend, "DROP TABLE ares_snapshots", "DROP TABLE {schema}.ares_snapshots", ())
    with pytest.raises(StoreError, match="loading snapshot of stream 's'") as info:
        store.snapshots.load("s", "p")
    assert info.value.__cause__ is not None
    assert "p@ss" not in str(info.value)
    assert "***" in str(info.value) or backend == "sqlite"


def test_deep_audit_reports_a_snapshot_that_no_longer_matches(
    store: ae.EventStore, backend: str
) -> None:
    """audit(deep=True) checks every snapshot: an edited one is a snapshot_mismatch
    finding; a plain audit does not read snapshots."""
    append_events(store, "s", 5)
    snap = make_snapshot(store, "s", "p", 1, {"n": 5}, 5)
    store.snapshots.save(snap)
    clean = ae.integrity.audit(store, deep=True)
    assert clean.ok and clean.snapshots_checked == 1
    tamper_state(store, backend, "s", "p", b'{"n":6}')
    assert ae.integrity.audit(store).ok  # the chain itself is fine
    deep = ae.integrity.audit(store, deep=True)
    assert [(f.kind, f.stream_id, f.version) for f in deep.findings] == [
        ("snapshot_mismatch", "s", 5)
    ]
