"""The snapshot store conformance suite: :class:`SnapshotContract`, with the fixtures of
:mod:`ares_events.testing.contract`.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import ares_events as ae
from ares_events.chain import canonical_json
from ares_events.core.snapshot_format import Snapshot, SnapshotCheck, SnapshotInfo, state_digest
from ares_events.core.snapshots import make_snapshot
from ares_events.errors import InvalidEvent, SnapshotMismatch
from ares_events.stores import Capability

__all__ = ["SnapshotContract", "append_events"]

STATE: dict[str, Any] = {
    "session_id": "s-1",
    "pending_tasks": ["t1", "t2"],
    "ratio": 0.25,
    "nested": {"ünïcode": "✓", "none": None, "flag": True, "big": 2**62},
}


def append_events(store: ae.EventStore, stream_id: str, count: int) -> list[ae.RecordedEvent]:
    """Append ``count`` small events to ``stream_id`` and return the whole stream."""
    store.append(
        stream_id,
        [
            ae.NewEvent(type="test.happened", module="snapshot-contract", payload={"n": i})
            for i in range(count)
        ],
    )
    return list(store.read(stream_id))


def _loaded(store: ae.EventStore, *args: Any, **kwargs: Any) -> Snapshot:
    """``store.snapshots.load(*args, **kwargs)``, which must find a snapshot."""
    snap = store.snapshots.load(*args, **kwargs)
    assert snap is not None
    return snap


def _save_three(store: ae.EventStore) -> None:
    """One event in streams a and b; snapshots a/p1, a/p2 and b/p1 at version 1."""
    append_events(store, "a", 1)
    append_events(store, "b", 1)
    for sid, proj in [("a", "p1"), ("a", "p2"), ("b", "p1")]:
        store.snapshots.save(make_snapshot(store, sid, proj, 1, {}, 1))


class SnapshotContract:
    """Conformance tests for ``store.snapshots``; needs ``store`` and ``store_url`` fixtures."""

    def test_snapshots_property_is_a_snapshot_store(self, store: ae.EventStore) -> None:
        """``store.snapshots`` has the snapshot store's methods and is reused."""
        snaps = store.snapshots
        for name in ("save", "load", "load_checked", "check", "verify_all", "delete", "list"):
            assert callable(getattr(snaps, name)), name
        assert store.snapshots is snaps

    def test_save_then_load_round_trips(self, store: ae.EventStore) -> None:
        """A saved snapshot loads back with the same state, digest, at_hash and time."""
        events = append_events(store, "agent-1", 3)
        snap = make_snapshot(store, "agent-1", "recovery_state", 2, STATE, 2)
        saved = store.snapshots.save(snap)
        loaded = _loaded(store, "agent-1", "recovery_state")
        assert loaded == saved == snap
        assert loaded.state == STATE
        assert loaded.state_json == canonical_json(STATE)
        assert loaded.state_digest == state_digest(canonical_json(STATE))
        assert len(loaded.state_digest) == 32
        assert (loaded.at_version, loaded.at_hash) == (2, events[1].hash)
        assert (loaded.projection, loaded.projection_version) == ("recovery_state", 2)
        assert loaded.created_at.tzinfo is not None
        assert loaded.created_at.utcoffset() == timedelta(0)
        assert loaded.created_at == snap.created_at
        assert abs(datetime.now(UTC) - loaded.created_at) < timedelta(minutes=5)

    def test_load_with_matching_projection_version(self, store: ae.EventStore) -> None:
        """Loading with the snapshot's own projection version returns it."""
        append_events(store, "s", 2)
        store.snapshots.save(make_snapshot(store, "s", "p", 3, {"x": 1}, 2))
        assert _loaded(store, "s", "p", 3).state == {"x": 1}

    def test_scalar_and_empty_states_round_trip(self, store: ae.EventStore) -> None:
        """Any JSON value is a valid state: null, a number, a list, an empty object."""
        append_events(store, "s", 1)
        states: list[Any] = [None, 7, [1, "a"], {}, "text", 1.5]
        for i, state in enumerate(states):
            store.snapshots.save(make_snapshot(store, "s", f"p{i}", 1, state, 1))
            assert _loaded(store, "s", f"p{i}").state == state

    def test_load_of_missing_snapshot_is_none(self, store: ae.EventStore) -> None:
        """No snapshot stored: load returns None and load_checked returns (None, None)."""
        append_events(store, "s", 1)
        assert store.snapshots.load("s", "p") is None
        assert store.snapshots.load("no-such-stream", "p") is None
        assert store.snapshots.load_checked("s", "p") == SnapshotCheck(None, None)

    def test_load_checked_returns_verified_snapshot(self, store: ae.EventStore) -> None:
        """load_checked returns (snapshot, None) for a snapshot that matches the stream."""
        append_events(store, "s", 2)
        snap = store.snapshots.save(make_snapshot(store, "s", "p", 1, {"a": 1}, 2))
        got, reason = store.snapshots.load_checked("s", "p", 1)
        assert reason is None
        assert got == snap

    def test_repr_never_shows_state(self, store: ae.EventStore) -> None:
        """A snapshot's repr is short and holds neither the state nor its JSON."""
        append_events(store, "s", 1)
        secret_like = "x" * 5000
        snap = make_snapshot(store, "s", "p", 1, {"blob": secret_like}, 1)
        text = repr(snap)
        assert secret_like[:20] not in text
        assert len(text) < 300
        assert "'s'" in text
        assert "at_version=1" in text

    def test_save_keeps_only_latest_per_stream_and_projection(self, store: ae.EventStore) -> None:
        """Saving again replaces the previous snapshot of the same (stream, projection)."""
        events = append_events(store, "s", 5)
        store.snapshots.save(make_snapshot(store, "s", "p", 1, {"n": 2}, 2))
        store.snapshots.save(make_snapshot(store, "s", "p", 1, {"n": 5}, 5))
        loaded = _loaded(store, "s", "p")
        assert (loaded.at_version, loaded.state, loaded.at_hash) == (5, {"n": 5}, events[4].hash)
        assert [(i.stream_id, i.projection) for i in store.snapshots.list("s")] == [("s", "p")]

    def test_upsert_replaces_projection_version(self, store: ae.EventStore) -> None:
        """A snapshot of a new projection version replaces the old version's snapshot."""
        append_events(store, "s", 3)
        store.snapshots.save(make_snapshot(store, "s", "p", 1, {"v": 1}, 3))
        store.snapshots.save(make_snapshot(store, "s", "p", 2, {"v": 2}, 3))
        assert _loaded(store, "s", "p", 2).state == {"v": 2}
        with pytest.raises(SnapshotMismatch, match="projection version 2 != 1"):
            store.snapshots.load("s", "p", 1)

    def test_saving_the_same_snapshot_twice_is_harmless(self, store: ae.EventStore) -> None:
        """Re-saving an identical snapshot leaves exactly that snapshot stored."""
        append_events(store, "s", 1)
        snap = make_snapshot(store, "s", "p", 1, {"a": 1}, 1)
        store.snapshots.save(snap)
        store.snapshots.save(snap)
        assert store.snapshots.load("s", "p") == snap
        assert len(list(store.snapshots.list())) == 1

    def test_projections_and_streams_are_independent(self, store: ae.EventStore) -> None:
        """Snapshots of different projections or streams never overwrite each other."""
        append_events(store, "a", 2)
        append_events(store, "b", 2)
        store.snapshots.save(make_snapshot(store, "a", "p1", 1, {"who": "a/p1"}, 1))
        store.snapshots.save(make_snapshot(store, "a", "p2", 1, {"who": "a/p2"}, 2))
        store.snapshots.save(make_snapshot(store, "b", "p1", 1, {"who": "b/p1"}, 2))
        for sid, proj in [("a", "p1"), ("a", "p2"), ("b", "p1")]:
            assert _loaded(store, sid, proj).state == {"who": f"{sid}/{proj}"}
        assert store.snapshots.load("b", "p2") is None

    def test_delete_one_projection(self, store: ae.EventStore) -> None:
        """delete(stream, projection) removes that snapshot only and returns 1, then 0."""
        _save_three(store)
        assert store.snapshots.delete("a", "p1") == 1
        assert store.snapshots.delete("a", "p1") == 0
        assert store.snapshots.load("a", "p1") is None
        assert store.snapshots.load("a", "p2") is not None
        assert store.snapshots.load("b", "p1") is not None

    def test_delete_whole_stream(self, store: ae.EventStore) -> None:
        """delete(stream) removes every projection's snapshot of that stream only."""
        _save_three(store)
        assert store.snapshots.delete("a") == 2
        assert store.snapshots.delete("a") == 0
        assert store.snapshots.delete("never-existed") == 0
        assert [(i.stream_id, i.projection) for i in store.snapshots.list()] == [("b", "p1")]

    def test_delete_never_touches_events(self, store: ae.EventStore) -> None:
        """Deleting snapshots leaves the stream and its chain intact."""
        before = append_events(store, "s", 3)
        store.snapshots.save(make_snapshot(store, "s", "p", 1, {}, 3))
        store.snapshots.delete("s")
        assert list(store.read("s")) == before
        assert ae.integrity.verify_stream(store, "s").ok

    def test_list_describes_snapshots_without_state(self, store: ae.EventStore) -> None:
        """list() yields SnapshotInfo in (stream, projection) order, filterable by stream."""
        append_events(store, "b", 2)
        append_events(store, "a", 2)
        a2 = store.snapshots.save(make_snapshot(store, "a", "z", 4, {"k": "v"}, 2))
        store.snapshots.save(make_snapshot(store, "a", "m", 1, [1, 2], 1))
        store.snapshots.save(make_snapshot(store, "b", "m", 1, None, 2))
        infos = list(store.snapshots.list())
        assert [(i.stream_id, i.projection) for i in infos] == [("a", "m"), ("a", "z"), ("b", "m")]
        assert all(isinstance(i, SnapshotInfo) for i in infos)
        assert not hasattr(infos[0], "state")
        z = infos[1]
        assert z == a2.info()
        assert z.state_size == len(canonical_json({"k": "v"}))
        assert z.state_digest == a2.state_digest
        assert (z.projection_version, z.at_version, z.at_hash) == (4, 2, a2.at_hash)
        assert z.created_at == a2.created_at
        d = z.to_dict()
        assert d["at_hash"] == a2.at_hash.hex()
        assert d["state_digest"] == a2.state_digest.hex()
        assert [i.projection for i in store.snapshots.list("a")] == ["m", "z"]
        assert list(store.snapshots.list("nobody")) == []

    def test_list_of_empty_store_is_empty(self, store: ae.EventStore) -> None:
        """A store without snapshots lists nothing."""
        assert list(store.snapshots.list()) == []

    def test_save_refuses_at_version_beyond_stream(self, store: ae.EventStore) -> None:
        """A snapshot claiming a version the stream has not reached is refused; nothing kept."""
        events = append_events(store, "s", 2)
        snap = make_snapshot(store, "s", "p", 1, {}, 2)
        ahead = dataclasses.replace(snap, at_version=3)
        with pytest.raises(SnapshotMismatch, match="shorter than at_version 3") as info:
            store.snapshots.save(ahead)
        assert info.value.stream_id == "s"
        assert info.value.projection == "p"
        assert store.snapshots.load("s", "p") is None
        unknown = Snapshot.of(
            "nobody", "p", projection_version=1, at_version=1, at_hash=events[0].hash, state={}
        )
        with pytest.raises(SnapshotMismatch):
            store.snapshots.save(unknown)
        assert list(store.snapshots.list()) == []

    def test_save_refuses_hash_of_another_version(self, store: ae.EventStore) -> None:
        """A snapshot whose at_hash is another event's hash is refused; the old one stays."""
        events = append_events(store, "s", 3)
        good = store.snapshots.save(make_snapshot(store, "s", "p", 1, {"ok": True}, 1))
        forged = Snapshot.of(
            "s", "p", projection_version=1, at_version=3, at_hash=events[1].hash, state={}
        )
        with pytest.raises(SnapshotMismatch, match="at_hash does not match stream at version 3"):
            store.snapshots.save(forged)
        assert store.snapshots.load("s", "p") == good

    def test_make_snapshot_refuses_missing_version(self, store: ae.EventStore) -> None:
        """make_snapshot raises SnapshotMismatch when the stream has no event at at_version."""
        append_events(store, "s", 1)
        with pytest.raises(SnapshotMismatch, match="at_version 2"):
            make_snapshot(store, "s", "p", 1, {}, 2)
        with pytest.raises(SnapshotMismatch):
            make_snapshot(store, "empty", "p", 1, {}, 1)

    @pytest.mark.parametrize(
        "state",
        [
            {"bad": float("nan")},
            {"bad": float("inf")},
            {"bad": {1, 2}},
            {1: "non-str key"},
            {"bad": b"bytes"},
            {"bad": 2**64},
            {"bad": object()},
        ],
        ids=["nan", "inf", "set", "int-key", "bytes", "huge-int", "object"],
    )
    def test_state_that_is_not_json_is_refused(self, store: ae.EventStore, state: Any) -> None:
        """A state that is not canonical JSON raises InvalidEvent and writes nothing."""
        append_events(store, "s", 1)
        with pytest.raises(InvalidEvent, match="state"):
            make_snapshot(store, "s", "p", 1, state, 1)
        good = make_snapshot(store, "s", "p", 1, {"fine": 1}, 1)
        with pytest.raises(InvalidEvent, match="state"):
            store.snapshots.save(dataclasses.replace(good, state=state))
        assert store.snapshots.load("s", "p") is None

    def test_save_refuses_inconsistent_fields(self, store: ae.EventStore) -> None:
        """A Snapshot whose state, JSON or digest disagree is refused with InvalidEvent."""
        append_events(store, "s", 1)
        good = make_snapshot(store, "s", "p", 1, {"a": 1}, 1)
        bad = [
            dataclasses.replace(good, state={"a": 2}),
            dataclasses.replace(good, state_json=b'{"a": 1}'),
            dataclasses.replace(good, state_digest=bytes(32)),
            dataclasses.replace(good, at_hash=b"short"),
            dataclasses.replace(good, at_version=0),
            dataclasses.replace(good, projection_version=-1),
            dataclasses.replace(good, projection=""),
            dataclasses.replace(good, created_at=datetime(2026, 1, 1)),  # naive on purpose
        ]
        for snap in bad:
            with pytest.raises(InvalidEvent):
                store.snapshots.save(snap)
        with pytest.raises(InvalidEvent, match="Snapshot"):
            store.snapshots.save({"stream_id": "s"})  # type: ignore[arg-type]
        assert store.snapshots.load("s", "p") is None

    def test_bad_arguments_are_invalid_event(self, store: ae.EventStore) -> None:
        """Bad stream ids, projection names or versions raise InvalidEvent naming the field."""
        with pytest.raises(InvalidEvent, match="stream_id"):
            store.snapshots.load("", "p")
        with pytest.raises(InvalidEvent, match="projection"):
            store.snapshots.load("s", "")
        with pytest.raises(InvalidEvent, match="version"):
            store.snapshots.load("s", "p", -1)
        with pytest.raises(InvalidEvent, match="stream_id"):
            store.snapshots.delete("bad\x00id")
        with pytest.raises(InvalidEvent, match="stream_id"):
            list(store.snapshots.list(""))

    def test_load_rejects_other_projection_version(self, store: ae.EventStore) -> None:
        """A different projection version raises SnapshotMismatch; load_checked says why."""
        append_events(store, "s", 2)
        store.snapshots.save(make_snapshot(store, "s", "p", 2, {"a": 1}, 2))
        with pytest.raises(SnapshotMismatch, match="projection version 2 != 3") as info:
            store.snapshots.load("s", "p", 3)
        assert info.value.reason == "projection version 2 != 3"
        assert store.snapshots.load_checked("s", "p", 3) == SnapshotCheck(
            None, "projection version 2 != 3"
        )
        assert _loaded(store, "s", "p", 3, verify=False).projection_version == 2

    def test_check_reports_forged_snapshots(self, store: ae.EventStore) -> None:
        """check() names each way a snapshot can disagree with its stream."""
        events = append_events(store, "s", 3)
        good = make_snapshot(store, "s", "p", 1, {"a": 1}, 2)
        snaps = store.snapshots
        assert snaps.check(good) is None
        assert snaps.check(good, 1) is None
        assert snaps.check(good, 2) == "projection version 1 != 2"
        tampered = dataclasses.replace(good, state={"a": 2}, state_json=b'{"a":2}')
        assert snaps.check(tampered) == "state digest mismatch"
        other = dataclasses.replace(good, at_hash=events[2].hash)
        assert snaps.check(other) == "at_hash does not match stream at version 2"
        ahead = dataclasses.replace(good, at_version=9)
        reason = snaps.check(ahead)
        assert reason is not None
        assert "shorter than at_version 9" in reason

    def test_snapshot_stays_valid_as_stream_grows(self, store: ae.EventStore) -> None:
        """Appending after a snapshot keeps it valid: at_hash still matches at_version."""
        append_events(store, "s", 2)
        snap = store.snapshots.save(make_snapshot(store, "s", "p", 1, {"n": 2}, 2))
        append_events(store, "s", 5)
        assert store.snapshots.load("s", "p", 1) == snap

    def test_verify_all_reports_every_snapshot(self, store: ae.EventStore) -> None:
        """verify_all yields each stored snapshot with None when it matches its stream."""
        append_events(store, "a", 1)
        append_events(store, "b", 1)
        store.snapshots.save(make_snapshot(store, "a", "p", 1, {}, 1))
        store.snapshots.save(make_snapshot(store, "b", "p", 1, {}, 1))
        results = list(store.snapshots.verify_all())
        assert [(i.stream_id, r) for i, r in results] == [("a", None), ("b", None)]

    def test_keyed_chain_snapshots_verify(self, store_url: str) -> None:
        """With a chain key, at_hash is the keyed link hash and still verifies."""
        key = bytes(range(32))
        with ae.open_store(store_url, chain_key=key) as keyed:
            events = append_events(keyed, "k", 2)
            snap = keyed.snapshots.save(make_snapshot(keyed, "k", "p", 1, {"k": 1}, 2))
            assert snap.at_hash == events[1].hash
            assert keyed.snapshots.load("k", "p", 1) == snap

    def test_snapshots_survive_reopen(self, store: ae.EventStore, store_url: str) -> None:
        """A snapshot saved and the store closed loads, verified, after reopening."""
        if Capability.PERSISTENT not in store.capabilities:
            pytest.skip(f"{store.url} does not declare Capability.PERSISTENT")
        append_events(store, "s", 3)
        snap = store.snapshots.save(make_snapshot(store, "s", "p", 1, STATE, 3))
        store.close()
        with ae.open_store(store_url) as again:
            assert again.snapshots.load("s", "p", 1) == snap
            assert [i.projection for i in again.snapshots.list()] == ["p"]
