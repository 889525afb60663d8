"""An eventsourcing application after ``ares-events erase`` (``ares_events.erase``) removed
one of its events' payloads: reading that aggregate raises eventsourcing's own error (a
``DataError`` naming the aggregate, its version and the stream), and the notification log
leaves the erased event out, so followers move past it instead of failing on it forever.
"""

from __future__ import annotations

import contextlib
import io
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import DataError, StoredEvent
from eventsourcing.system import ProcessApplication, SingleThreadedRunner, System

import ares_events as ae
from ares_events.cli import main
from ares_events.errors import PayloadErased
from ares_events.integrations import eventsourcing as es

MODULE = "ares_events.integrations.eventsourcing"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


class Dog(Aggregate):
    @event("Registered")
    def __init__(self, name: str) -> None:
        self.name = name
        self.tricks: list[str] = []

    @event("TrickAdded")
    def add_trick(self, trick: str) -> None:
        self.tricks.append(trick)


class DogSchool(Application[uuid.UUID]):
    """The application whose events are erased."""


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL (SQLite file or PostgreSQL schema)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'erase.db'}"
    return str(request.getfixturevalue("postgres_url"))


@contextlib.contextmanager
def school(url: str, **env: str) -> Iterator[Any]:
    """A DogSchool on ``url``, closed afterwards."""
    a = DogSchool(env={"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url, **env})
    try:
        yield a
    finally:
        a.close()


def erase(url: str, stream_id: str, version: int) -> None:
    """What ``ares-events erase`` does."""
    with ae.open_store(url) as store:
        ae.erase(store, stream_id, version, reason="gdpr", by="test")


def two_dogs(url: str) -> tuple[uuid.UUID, uuid.UUID]:
    """Two dogs of three events each; the first dog's trick "SECRET" (version 2) erased."""
    with school(url) as a:
        first, second = Dog("Fido"), Dog("Rex")
        for d, trick in ((first, "SECRET"), (second, "fetch")):
            d.add_trick(trick)
            d.add_trick("sit")
            a.save(d)
    erase(url, f"dogschool/{first.id}", 2)
    return first.id, second.id


@pytest.mark.parametrize("verify", ["n", "y"])
def test_reading_an_erased_aggregate_is_a_data_error(url: str, verify: str) -> None:
    """repository.get and select_events raise a DataError (so a PersistenceError) naming
    the aggregate, its version and the stream; the ares-events error is its cause. With
    verified reads too: an erasure keeps the chain valid."""
    first, second = two_dogs(url)
    with school(url, ARES_VERIFY_READS=verify) as a:
        reads: list[Callable[[], object]] = [
            lambda: a.repository.get(first),
            lambda: a.recorder.select_events(first),
        ]
        for read in reads:
            with pytest.raises(es.PayloadErasedError) as info:
                read()
            err = info.value
            assert isinstance(err, DataError)
            assert isinstance(err.__cause__, PayloadErased)
            assert (err.originator_id, err.originator_version) == (first, 2)
            assert (err.stream_id, err.version) == (f"dogschool/{first}", 2)
            assert str(first) in str(err)
            assert "version 2" in str(err)
        # Events before the erased one, and other aggregates, read as before.
        assert [e.originator_version for e in a.recorder.select_events(first, lte=1)] == [1]
        assert a.repository.get(second).tricks == ["fetch", "sit"]


def test_the_notification_log_leaves_an_erased_event_out(url: str) -> None:
    """select_notifications, the notification log and a subscription skip the erased event
    (as a topic filter would) and deliver every other one."""
    first, second = two_dogs(url)
    with school(url, ARES_VERIFY_READS="y") as a:
        notes = a.recorder.select_notifications(start=None, limit=10)
        got = [(n.originator_id, n.originator_version) for n in notes]
        want = [(first, 1), (first, 3), (second, 1), (second, 2), (second, 3)]
        assert got == want
        # A limit counts delivered notifications, not the skipped one.
        assert len(a.recorder.select_notifications(start=None, limit=2)) == 2
        page = a.notification_log.select(start=1, limit=10)
        assert [(n.originator_id, n.originator_version) for n in page] == want
        with a.recorder.subscribe(gt=None) as sub:
            seen = [(n.originator_id, n.originator_version) for n in itertools_take(sub, 5)]
        assert seen == want
        assert a.recorder.max_notification_id() == notes[-1].id


def itertools_take(it: Iterator[Any], n: int) -> list[Any]:
    """The first ``n`` items of ``it``."""
    out = []
    for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out


class Counter(ProcessApplication[uuid.UUID]):
    """Counts the tricks it is notified of."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tricks: list[str] = []

    def policy(self, domain_event: Any, processing_event: Any) -> None:
        if isinstance(domain_event, Dog.TrickAdded):  # type: ignore[attr-defined]
            self.tricks.append(domain_event.trick)


def test_a_process_application_moves_past_an_erased_event(url: str) -> None:
    """A follower started after the erasure processes every other event and tracks the
    leader's last notification."""
    two_dogs(url)
    env = {"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url}
    system = System(pipes=[[DogSchool, Counter]])
    runner: SingleThreadedRunner[Any] = SingleThreadedRunner(system, env=env)
    runner.start()
    try:
        leader, counter = runner.get(DogSchool), runner.get(Counter)
        counter.pull_and_process(leader.name)
        assert sorted(counter.tricks) == ["fetch", "sit", "sit"]
        last = leader.recorder.max_notification_id()
        assert counter.recorder.max_tracking_id(leader.name) == last
    finally:
        runner.stop()


def snapshotted_dog(url: str) -> uuid.UUID:
    """A dog whose trick "SECRET" (version 2) is in a snapshot at version 3, then one more
    event (version 4)."""
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        d = Dog("Fido")
        d.add_trick("SECRET")
        d.add_trick("sit")
        a.save(d)
        a.take_snapshot(d.id)
        d.add_trick("down")
        a.save(d)
    return d.id


@pytest.mark.parametrize("verify", ["n", "y"])
def test_a_snapshot_holding_an_erased_event_is_not_used(url: str, verify: str) -> None:
    """A snapshot taken at or after an erased event is never the start of a read, even
    while its own payload is still stored: repository.get raises as without snapshots.
    A snapshot from before the erased event is still used."""
    d = snapshotted_dog(url)
    with school(url, IS_SNAPSHOTTING_ENABLED="y", ARES_VERIFY_READS=verify) as a:
        a.take_snapshot(d, version=1)  # out of order: the stream is scanned
        assert a.repository.get(d).tricks == ["SECRET", "sit", "down"]
    erase(url, f"dogschool/{d}", 2)
    with school(url, IS_SNAPSHOTTING_ENABLED="y", ARES_VERIFY_READS=verify) as a:
        with pytest.raises(es.PayloadErasedError) as info:
            a.repository.get(d)
        assert (info.value.originator_id, info.value.originator_version) == (d, 2)
        snaps = a.snapshots.recorder.select_events(d, desc=True, limit=1)
        assert [s.originator_version for s in snaps] == [1]
        assert [s.originator_version for s in a.snapshots.recorder.select_events(d)] == [1]
        assert a.repository.get(d, version=1).tricks == []


def test_an_erased_snapshot_is_skipped(url: str) -> None:
    """Erasing the snapshot's event too (nothing erased stays readable): reads skip it and
    fall back to the events, which raise for the erased one."""
    d = snapshotted_dog(url)
    erase(url, f"dogschool/{d}", 2)
    erase(url, f"snapshots/dogschool/{d}", 1)
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        assert a.snapshots.recorder.select_events(d) == []
        with pytest.raises(es.PayloadErasedError) as info:
            a.repository.get(d)
        assert info.value.stream_id == f"dogschool/{d}"
        # A new snapshot below the erased version is stored and used.
        a.take_snapshot(d, version=1)
        assert a.repository.get(d, version=1).name == "Fido"


def erase_with(how: str, url: str, stream_id: str, version: int) -> dict[str, Any]:
    """Erase through ``ares-events erase`` (the CLI, in process) or ``ae.erase``; the report."""
    if how == "api":
        with ae.open_store(url) as store:
            return ae.erase(store, stream_id, version, reason="gdpr", by="test").to_dict()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["--store", url, "erase", stream_id, str(version), "--reason", "gdpr", "--json"])
    assert rc == 0
    out: dict[str, Any] = json.loads(buf.getvalue())
    return out


@pytest.mark.parametrize("how", ["cli", "api"])
def test_erase_erases_the_snapshots_holding_the_event(url: str, how: str) -> None:
    """Erasing an aggregate's event also erases (and records) its snapshots taken at or
    after it: no event of the store holds the erased text any more. A snapshot from before
    the erased version is kept and still used. Erasing again changes nothing: one erasure
    record per erased event."""
    d = snapshotted_dog(url)  # snapshot at version 3
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        a.take_snapshot(d, version=1)
    sid, ssid = f"dogschool/{d}", f"snapshots/dogschool/{d}"
    with ae.open_store(url) as store:
        covers = [e.metadata.get("covers") for e in store.read(ssid)]
        assert covers == [3, 1]  # the stream versions of the aggregate they fold
    report = erase_with(how, url, sid, 2)
    assert report["snapshot_events_erased"] == 1
    with ae.open_store(url) as store:
        for e in store.read_all():
            assert e.payload_erased or b"SECRET" not in e.payload_bytes, (e.stream_id, e.version)
        assert [e.payload_erased for e in store.read(ssid)] == [True, False]
        assert ae.integrity.audit(store).ok
    again = erase_with(how, url, sid, 2)
    assert again["already_erased"] and again["snapshot_events_erased"] == 0
    with ae.open_store(url) as store:
        recs = [
            (r.payload["stream_id"], r.payload["version"]) for r in store.read(ae.ERASURE_STREAM)
        ]
        assert sorted(recs) == [(sid, 2), (ssid, 1)]
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        assert [s.originator_version for s in a.snapshots.recorder.select_events(d)] == [1]
        assert a.repository.get(d, version=1).name == "Fido"  # from the kept snapshot
        with pytest.raises(es.PayloadErasedError):
            a.repository.get(d)


def test_a_snapshot_of_an_aggregate_without_events_has_no_covers(url: str) -> None:
    """A snapshot whose aggregate has no events yet (the offset is unknown) is written
    without ``covers``: erasure leaves it, and reads skip it once an erased event of the
    aggregate sits at or below its version."""
    oid = uuid.uuid4()
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        snap = StoredEvent(oid, 5, "tests:Snap", b"{}")
        a.snapshots.recorder.insert_events([snap])
    with ae.open_store(url) as store:
        (e,) = store.read(f"snapshots/dogschool/{oid}")
        assert "covers" not in e.metadata


class Cat(Aggregate):
    """An aggregate numbered from 0: its stream's offset is 0."""

    INITIAL_VERSION = 0

    @event("Registered")
    def __init__(self, name: str) -> None:
        self.name = name
        self.tricks: list[str] = []

    @event("TrickAdded")
    def add_trick(self, trick: str) -> None:
        self.tricks.append(trick)


def test_covers_is_the_stream_version_when_the_offset_is_not_one(url: str) -> None:
    """Original versions 0, 1, 2 are stream versions 1, 2, 3: a snapshot at original
    version 1 covers stream version 2, so erasing stream version 2 erases it and not the
    one at original version 0."""
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        c = Cat("Tom")
        c.add_trick("SECRET")
        c.add_trick("purr")
        a.save(c)
        a.take_snapshot(c.id, version=0)
        a.take_snapshot(c.id, version=1)
    ssid = f"snapshots/dogschool/{c.id}"
    with ae.open_store(url) as store:
        assert [e.metadata.get("covers") for e in store.read(ssid)] == [1, 2]
    report = erase_with("api", url, f"dogschool/{c.id}", 2)
    assert report["snapshot_events_erased"] == 1
    with ae.open_store(url) as store:
        assert [e.payload_erased for e in store.read(ssid)] == [False, True]
    with school(url, IS_SNAPSHOTTING_ENABLED="y") as a:
        assert a.repository.get(c.id, version=0).name == "Tom"
