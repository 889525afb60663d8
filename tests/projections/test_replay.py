"""ae.replay: ordered folds, the max_replay cap (reported or strict), mid-stream starts
and chain findings."""

from __future__ import annotations

import contextlib
import inspect
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

import ares_events as ae
from ares_events.errors import ChainIntegrityError, InvalidEvent, ReplayCapExceeded
from ares_events.projections.recovery import DEFAULT_MAX_REPLAY


def _fill(store: ae.EventStore, stream: str, n: int) -> None:
    for start in range(0, n, 1000):
        store.append(
            stream,
            [
                ae.NewEvent(type="step", module="test", payload={"n": i})
                for i in range(start, min(n, start + 1000))
            ],
        )


def _collect(state: list[int], e: ae.RecordedEvent) -> list[int]:
    return [*state, e.payload["n"]]


def _start() -> list[int]:
    return []


@pytest.fixture
def mem() -> Iterator[ae.EventStore]:
    """A fresh memory store."""
    with ae.open_store("memory://") as s:
        yield s


def test_folds_in_order(store: ae.EventStore) -> None:
    """replay folds every event in version order and reports a clean, uncapped result."""
    _fill(store, "s", 7)
    _fill(store, "other", 3)
    res = ae.replay(store, "s", _collect, _start())
    evs = list(store.read("s"))
    assert res.state == list(range(7))
    assert (res.version, res.replayed, res.head_version) == (7, 7, 7)
    assert res.capped is False
    assert res.ok
    assert res.findings == []
    assert res.truncated is False
    assert res.last_hash == evs[-1].hash


def test_fold_receives_recorded_events() -> None:
    """The fold gets RecordedEvents with consecutive versions of the stream."""
    with ae.open_store("memory://") as s:
        _fill(s, "s", 4)
        seen: list[tuple[str, int]] = []
        res = ae.replay(s, "s", lambda acc, e: [*acc, (e.stream_id, e.version)], seen)
    assert res.state == [("s", 1), ("s", 2), ("s", 3), ("s", 4)]


def test_empty_stream(mem: ae.EventStore) -> None:
    """Replaying a missing stream returns the initial state, version 0, nothing capped."""
    res = ae.replay(mem, "none", _collect, [-1])
    assert res.state == [-1]
    assert (res.version, res.replayed, res.head_version) == (0, 0, 0)
    assert not res.capped
    assert res.ok
    assert res.last_hash is None


def test_default_cap_is_10000(mem: ae.EventStore) -> None:
    """max_replay defaults to 10,000: a 10,001-event stream is capped at 10,000."""
    assert inspect.signature(ae.replay).parameters["max_replay"].default == 10_000
    assert DEFAULT_MAX_REPLAY == 10_000
    _fill(mem, "s", 10_001)
    res = ae.replay(mem, "s", lambda n, e: n + 1, 0)
    assert res.capped is True
    assert res.replayed == res.state == 10_000
    assert res.version == 10_000
    assert res.head_version == 10_001


def test_capped_is_reported(mem: ae.EventStore) -> None:
    """Hitting the cap before the end gives capped=True and replayed == cap."""
    _fill(mem, "s", 8)
    res = ae.replay(mem, "s", _collect, _start(), max_replay=5)
    assert res.capped is True
    assert res.replayed == 5
    assert res.state == [0, 1, 2, 3, 4]
    assert res.version == 5
    assert res.head_version == 8
    assert res.last_hash == list(mem.read("s"))[4].hash
    assert res.findings == []  # a capped replay is not a broken chain


def test_capped_raises_in_strict_mode(mem: ae.EventStore) -> None:
    """strict=True raises ReplayCapExceeded carrying the stream, cap and version."""
    _fill(mem, "s", 8)
    with pytest.raises(ReplayCapExceeded) as ei:
        ae.replay(mem, "s", _collect, _start(), max_replay=5, strict=True)
    err = ei.value
    assert (err.stream_id, err.cap, err.version) == ("s", 5, 5)
    assert "'s'" in str(err)
    assert "5" in str(err)


def test_stream_of_exactly_the_cap_is_not_capped(mem: ae.EventStore) -> None:
    """A stream exactly max_replay long is folded whole, not capped, even strictly."""
    _fill(mem, "s", 5)
    res = ae.replay(mem, "s", _collect, _start(), max_replay=5, strict=True)
    assert res.capped is False
    assert res.replayed == 5
    assert res.state == list(range(5))


def test_zero_cap(mem: ae.EventStore) -> None:
    """max_replay=0 folds nothing and reports capped on a non-empty stream only."""
    _fill(mem, "s", 1)
    assert ae.replay(mem, "s", _collect, _start(), max_replay=0).capped is True
    assert ae.replay(mem, "empty", _collect, _start(), max_replay=0).capped is False


def test_mid_stream_start_with_start_hash(store: ae.EventStore) -> None:
    """from_version with the previous event's hash folds only the tail and verifies it."""
    _fill(store, "s", 10)
    evs = list(store.read("s"))
    res = ae.replay(store, "s", _collect, _start(), from_version=7, start_hash=evs[5].hash)
    assert res.state == [6, 7, 8, 9]
    assert (res.version, res.replayed) == (10, 4)
    assert res.ok
    capped = ae.replay(
        store, "s", _collect, _start(), from_version=4, start_hash=evs[2].hash, max_replay=3
    )
    assert capped.capped
    assert capped.state == [3, 4, 5]


def test_mid_stream_start_with_wrong_hash_is_a_finding(mem: ae.EventStore) -> None:
    """A start_hash that is not the previous event's hash is a broken_link finding."""
    _fill(mem, "s", 5)
    evs = list(mem.read("s"))
    res = ae.replay(mem, "s", _collect, _start(), from_version=3, start_hash=evs[0].hash)
    assert [f.kind for f in res.findings] == ["broken_link"]
    assert res.findings[0].version == 3
    with pytest.raises(ChainIntegrityError):
        ae.replay(mem, "s", _collect, _start(), from_version=3, start_hash=evs[0].hash, strict=True)


def test_mid_stream_start_past_the_end(mem: ae.EventStore) -> None:
    """Starting after the last version folds nothing and reports the head clean."""
    _fill(mem, "s", 3)
    head = mem.head("s")
    assert head is not None
    res = ae.replay(mem, "s", _collect, _start(), from_version=4, start_hash=head.hash)
    assert res.state == []
    assert (res.version, res.replayed) == (3, 0)
    assert res.ok


def test_bad_arguments_are_invalid(mem: ae.EventStore) -> None:
    """A negative cap, a bad from_version or a missing start_hash raise InvalidEvent."""
    _fill(mem, "s", 3)
    for kw, field in (
        ({"max_replay": -1}, "max_replay"),
        ({"from_version": 0}, "from_version"),
        ({"from_version": 2}, "start_hash"),
    ):
        with pytest.raises(InvalidEvent) as ei:
            ae.replay(mem, "s", _collect, _start(), **kw)  # type: ignore[arg-type]
        assert ei.value.field == field
    # Without verification no start hash is needed.
    assert ae.replay(mem, "s", _collect, _start(), from_version=2, verify=False).state == [1, 2]


def test_chain_finding_reported_and_strict(mem: ae.EventStore) -> None:
    """A chain that does not verify (a keyed chain read without its key) is reported as
    findings, and raised as ChainIntegrityError in strict mode."""
    keyed = ae.EventStore(mem.recorder, chain_key=ae.integrity.ChainKey(bytes(range(32))))
    _fill(keyed, "s", 3)
    assert ae.replay(keyed, "s", _collect, _start()).ok
    res = ae.replay(mem, "s", _collect, _start())  # the same data without the key
    assert not res.ok
    assert {f.kind for f in res.findings} == {"hash_mismatch"}
    assert res.state == [0, 1, 2]  # reported, not hidden: the fold still ran
    with pytest.raises(ChainIntegrityError) as ei:
        ae.replay(mem, "s", _collect, _start(), strict=True)
    assert ei.value.stream_id == "s"
    assert [f.kind for f in ei.value.findings] == ["hash_mismatch"] * 3
    unchecked = ae.replay(mem, "s", _collect, _start(), verify=False)
    assert unchecked.ok
    assert unchecked.findings == []


def _sqlite_with(tmp_path: Path, n: int) -> str:
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    with ae.open_store(url) as s:
        _fill(s, "s", n)
    return url


def test_tampered_payload_found_on_sqlite(tmp_path: Path) -> None:
    """An event payload edited in the SQLite file is a hash_mismatch at its version."""
    url = _sqlite_with(tmp_path, 5)
    with contextlib.closing(sqlite3.connect(tmp_path / "replay.db")) as c, c:
        c.execute(
            "UPDATE ares_events SET payload = ? WHERE stream_id = 's' AND version = 3",
            (b'{"n":99}',),
        )
    with ae.open_store(url) as s:
        res = ae.replay(s, "s", _collect, _start())
        assert res.state == [0, 1, 99, 3, 4]
        assert [(f.kind, f.version) for f in res.findings] == [("hash_mismatch", 3)]
        with pytest.raises(ChainIntegrityError):
            ae.replay(s, "s", _collect, _start(), strict=True)


def test_truncated_tail_found_on_sqlite(tmp_path: Path) -> None:
    """Rows deleted from the tail are reported as truncated, not a shorter healthy stream."""
    url = _sqlite_with(tmp_path, 5)
    with contextlib.closing(sqlite3.connect(tmp_path / "replay.db")) as c, c:
        c.execute("DELETE FROM ares_events WHERE stream_id = 's' AND version >= 4")
    with ae.open_store(url) as s:
        res = ae.replay(s, "s", _collect, _start())
        assert res.truncated
        assert res.version == 3
        assert res.head_version == 5
        with pytest.raises(ChainIntegrityError):
            ae.replay(s, "s", _collect, _start(), strict=True)


def test_cap_wins_over_findings_in_strict_mode(tmp_path: Path) -> None:
    """A capped strict replay raises ReplayCapExceeded; its checked prefix was clean."""
    url = _sqlite_with(tmp_path, 6)
    with contextlib.closing(sqlite3.connect(tmp_path / "replay.db")) as c, c:
        c.execute("DELETE FROM ares_events WHERE stream_id = 's' AND version = 6")
    with ae.open_store(url) as s:
        with pytest.raises(ReplayCapExceeded):
            ae.replay(s, "s", _collect, _start(), max_replay=3, strict=True)
        res = ae.replay(s, "s", _collect, _start(), max_replay=3)
        assert res.capped
        assert res.findings == []
