"""Verified reads (``ARES_VERIFY_READS=true``): every aggregate read through an
eventsourcing application is checked against its stream's hash chain (and head), and a
tampered event is refused with an error naming the stream and the finding; it is never
returned. Rows are edited behind the store, in a real SQLite file and in PostgreSQL.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eventsourcing.application import Application
from eventsourcing.domain import Aggregate, event
from eventsourcing.persistence import DataError, IntegrityError, PersistenceError

import ares_events as ae
from ares_events.chain import ChainKey, header_bytes, link_hash, payload_digest
from ares_events.errors import ChainIntegrityError, ConfigError
from ares_events.integrations import eventsourcing as es
from tests.fixtures.fix_backends import run_behind_store

MODULE = "ares_events.integrations.eventsourcing"
KEY = "7e" * 32


class Dog(Aggregate):
    @event("Registered")
    def __init__(self, name: str) -> None:
        self.name = name
        self.tricks: list[str] = []

    @event("TrickAdded")
    def add_trick(self, trick: str) -> None:
        self.tricks.append(trick)


class Kennel(Application[uuid.UUID]):
    """The application under test."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite file or PostgreSQL schema."""
    return str(request.param)


@pytest.fixture
def url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh store of ``backend``."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'kennel.db'}"
    return str(request.getfixturevalue("postgres_url"))


@contextlib.contextmanager
def kennel(url: str, **env: str) -> Iterator[Any]:
    """A Kennel on ``url`` (verified reads unless told otherwise), closed afterwards."""
    env = {"PERSISTENCE_MODULE": MODULE, "ARES_STORE_URL": url, **env}
    env.setdefault("ARES_VERIFY_READS", "true")
    a = Kennel(env=env)
    try:
        yield a
    finally:
        a.close()


def new_dog(url: str, tricks: int = 3, **env: str) -> tuple[uuid.UUID, str]:
    """Save a dog with ``tricks`` tricks; return its id and stream id."""
    with kennel(url, **env) as k:
        d = Dog("Fido")
        for i in range(tricks):
            d.add_trick(f"trick-{i}")
        k.save(d)
        return d.id, k.factory.datastore.stream_id(d.id)


def edit(
    url: str, backend: str, sid: str, version: int, key: str | None = None, **cols: Any
) -> None:
    """Set columns of one event row behind the store."""
    sets = ", ".join(f"{c} = ?" for c in cols)
    with ae.open_store(url, chain_key=key) as store:
        run_behind_store(
            store,
            backend,
            f"UPDATE ares_events SET {sets} WHERE stream_id = ? AND version = ?",
            "UPDATE {schema}.ares_events SET "
            + ", ".join(f"{c} = %s" for c in cols)
            + " WHERE stream_id = %s AND version = %s",
            (*cols.values(), sid, version),
        )


def event_at(url: str, sid: str, version: int, key: str | None = None) -> ae.RecordedEvent:
    with ae.open_store(url, chain_key=key) as store:
        return next(store.read(sid, version, version))


def forged_payload(e: ae.RecordedEvent, old: bytes, new: bytes) -> bytes:
    raw = e.payload_bytes
    assert old in raw
    return raw.replace(old, new)


def relinked_hash(e: ae.RecordedEvent, payload: bytes, key: ChainKey | None = None) -> bytes:
    """The link hash ``e`` would have with ``payload`` (what a forger recomputes)."""
    header = header_bytes(
        e.stream_id,
        e.version,
        e.event_id_str,
        e.type,
        e.module,
        e.metadata_json,
        e.at,
        payload_digest(payload).hex(),
        len(payload),
    )
    return link_hash(e.prev_hash, header, key)


def refused(
    k: Any, dog_id: uuid.UUID, sid: str, kind: str, **get: Any
) -> es.ChainVerificationError:
    """Getting the dog raises ChainVerificationError naming ``sid`` and ``kind``."""
    with pytest.raises(es.ChainVerificationError) as info:
        k.repository.get(dog_id, **get)
    err = info.value
    assert isinstance(err, DataError) and isinstance(err, PersistenceError)
    assert isinstance(err, ChainIntegrityError) and not isinstance(err, IntegrityError)
    assert err.stream_id == sid
    assert kind in {f.kind for f in err.findings}
    assert sid in str(err) and kind in str(err)
    return err


# -- clean reads ---------------------------------------------------------------------------


def test_clean_reads_pass(url: str) -> None:
    """An untouched store reads the same with verification on: whole aggregates, older
    versions, after snapshots, and the notification log."""
    dog_id, _ = new_dog(url, tricks=5)
    with kennel(url, IS_SNAPSHOTTING_ENABLED="y") as k:
        assert k.repository.get(dog_id).tricks == [f"trick-{i}" for i in range(5)]
        assert k.repository.get(dog_id, version=3).tricks == ["trick-0", "trick-1"]
        k.take_snapshot(dog_id, version=4)
        d = k.repository.get(dog_id)
        d.add_trick("late")
        k.save(d)
        assert k.repository.get(dog_id).tricks[-1] == "late"
        assert len(k.recorder.select_notifications(start=None, limit=100)) == 7


# -- tampering is refused -------------------------------------------------------------------


def test_edited_payload_is_refused(url: str, backend: str) -> None:
    """A payload edited behind the store (in the file or the database) is a hash_mismatch
    on every read that would return it; without verification it comes back edited."""
    dog_id, sid = new_dog(url)
    e = event_at(url, sid, 2)
    edit(url, backend, sid, 2, payload=forged_payload(e, b"trick-0", b"trick-X"))
    with kennel(url) as k:
        refused(k, dog_id, sid, "hash_mismatch")
        refused(k, dog_id, sid, "hash_mismatch", version=2)
        assert k.repository.get(dog_id, version=1).tricks == []  # before the edit: fine
        with pytest.raises(es.ChainVerificationError, match="hash_mismatch"):
            k.recorder.select_notifications(start=None, limit=10)
    with kennel(url, ARES_VERIFY_READS="false") as k:
        assert k.repository.get(dog_id).tricks[0] == "trick-X"


def test_relinked_edit_is_caught_at_the_head(url: str, backend: str) -> None:
    """An edit of the last event with its hash recomputed (no key needed in unkeyed mode)
    no longer matches the stream's head: head_mismatch."""
    dog_id, sid = new_dog(url)
    e = event_at(url, sid, 4)
    forged = forged_payload(e, b"trick-2", b"trick-Z")
    edit(url, backend, sid, 4, payload=forged, hash=relinked_hash(e, forged))
    with kennel(url) as k:
        refused(k, dog_id, sid, "head_mismatch")


def test_deleted_tail_is_refused(url: str, backend: str) -> None:
    """Deleting the last events makes a read that reaches the head report truncated."""
    dog_id, sid = new_dog(url)
    with ae.open_store(url) as store:
        run_behind_store(
            store,
            backend,
            "DELETE FROM ares_events WHERE stream_id = ? AND version >= ?",
            "DELETE FROM {schema}.ares_events WHERE stream_id = %s AND version >= %s",
            (sid, 3),
        )
    with kennel(url) as k:
        refused(k, dog_id, sid, "truncated")
        assert k.repository.get(dog_id, version=2).tricks == ["trick-0"]


def test_deleted_middle_event_is_refused(url: str, backend: str) -> None:
    """A row deleted from the middle is a gap."""
    dog_id, sid = new_dog(url)
    with ae.open_store(url) as store:
        run_behind_store(
            store,
            backend,
            "DELETE FROM ares_events WHERE stream_id = ? AND version = ?",
            "DELETE FROM {schema}.ares_events WHERE stream_id = %s AND version = %s",
            (sid, 2),
        )
    with kennel(url) as k:
        refused(k, dog_id, sid, "gap")


def test_keyed_chain_refuses_a_forgery_without_the_key(url: str, backend: str) -> None:
    """With a chain key, an edit whose hash (and head) is recomputed without the key is a
    hash_mismatch."""
    dog_id, sid = new_dog(url, ARES_EVENTS_CHAIN_KEY=KEY)
    e = event_at(url, sid, 4, KEY)
    forged = forged_payload(e, b"trick-2", b"trick-Z")
    h = relinked_hash(e, forged)
    edit(url, backend, sid, 4, KEY, payload=forged, hash=h)
    with ae.open_store(url, chain_key=KEY) as store:
        run_behind_store(
            store,
            backend,
            "UPDATE ares_streams SET head_hash = ? WHERE stream_id = ?",
            "UPDATE {schema}.ares_streams SET head_hash = %s WHERE stream_id = %s",
            (h, sid),
        )
    with kennel(url, ARES_EVENTS_CHAIN_KEY=KEY) as k:
        refused(k, dog_id, sid, "hash_mismatch")


def test_edited_snapshot_is_refused(url: str, backend: str) -> None:
    """A snapshot edited behind the store is refused like an event (snapshots are chained
    streams of their own)."""
    dog_id, sid = new_dog(url)
    with kennel(url, IS_SNAPSHOTTING_ENABLED="y") as k:
        k.take_snapshot(dog_id)
    ssid = f"snapshots/{sid}"
    e = event_at(url, ssid, 1)
    edit(url, backend, ssid, 1, payload=forged_payload(e, b"Fido", b"Rex!"))
    with kennel(url, IS_SNAPSHOTTING_ENABLED="y") as k:
        refused(k, dog_id, ssid, "hash_mismatch")


def test_deleted_head_row_is_refused(url: str, backend: str) -> None:
    """Events whose stream lost its head row are a head_mismatch, on a read from the start
    and on a latest-first read alike."""
    dog_id, sid = new_dog(url)
    with ae.open_store(url) as store:
        run_behind_store(
            store,
            backend,
            "DELETE FROM ares_streams WHERE stream_id = ?",
            "DELETE FROM {schema}.ares_streams WHERE stream_id = %s",
            (sid,),
        )
    with kennel(url) as k:
        refused(k, dog_id, sid, "head_mismatch")
        with pytest.raises(es.ChainVerificationError, match="head_mismatch"):
            k.recorder.select_events(dog_id, desc=True, limit=1)


def test_missing_snapshot_row(url: str, backend: str) -> None:
    """A snapshot row deleted from its stream is a gap when a verified read needs that part
    of the stream (a read of the latest snapshot does not); unverified reads still work
    (the aggregate is rebuilt from its events)."""
    dog_id, sid = new_dog(url)
    with kennel(url, IS_SNAPSHOTTING_ENABLED="y") as k:
        k.take_snapshot(dog_id, version=2)
        k.take_snapshot(dog_id, version=4)
    ssid = f"snapshots/{sid}"
    with ae.open_store(url) as store:
        run_behind_store(
            store,
            backend,
            "DELETE FROM ares_events WHERE stream_id = ? AND version = ?",
            "DELETE FROM {schema}.ares_events WHERE stream_id = %s AND version = %s",
            (ssid, 1),
        )
    with kennel(url, IS_SNAPSHOTTING_ENABLED="y") as k:
        assert k.repository.get(dog_id).tricks == ["trick-0", "trick-1", "trick-2"]
        refused(k, dog_id, ssid, "gap", version=3)
    with kennel(url, IS_SNAPSHOTTING_ENABLED="y", ARES_VERIFY_READS="false") as k:
        assert k.repository.get(dog_id, version=3).tricks == ["trick-0", "trick-1"]
        assert k.repository.get(dog_id).tricks == ["trick-0", "trick-1", "trick-2"]


def test_bad_setting_is_a_config_error(tmp_path: Path) -> None:
    """ARES_VERIFY_READS must be a boolean; anything else is a ConfigError naming it."""
    with pytest.raises(ConfigError, match="ARES_VERIFY_READS"):
        Kennel(
            env={
                "PERSISTENCE_MODULE": MODULE,
                "ARES_STORE_URL": f"sqlite:///{tmp_path / 'x.db'}",
                "ARES_VERIFY_READS": "sometimes",
            }
        )
