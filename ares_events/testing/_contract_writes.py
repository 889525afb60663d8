"""The conformance suite's write half. May import the public API."""

from __future__ import annotations

import dataclasses
import math
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.stores import Capability
from ares_events.testing._contract_helpers import (
    _MAX_I64,
    _ev,
    _evs,
    _in_threads,
    _invalid,
    _require,
    _same_cell,
    run_concurrent_appenders,
    store_state,
)


class WriteContract:
    """Appends: what every store must accept, refuse and keep atomic."""

    def test_versions_start_at_one_without_gaps(self, store: ae.EventStore) -> None:
        """Versions in a stream are 1..N with no gaps, across single and batch appends."""
        store.append("s", [_ev(0)])
        store.append("s", _evs(3, 1))
        store.append("other", _evs(2))
        store.append("s", [_ev(4)])
        assert [e.version for e in store.read("s")] == [1, 2, 3, 4, 5]
        assert [e.payload["n"] for e in store.read("s")] == [0, 1, 2, 3, 4]
        assert [e.version for e in store.read("other")] == [1, 2]

    def test_append_result_reports_last_version_and_position(self, store: ae.EventStore) -> None:
        """AppendResult names the stream, its last version, last position and the ids."""
        evs = _evs(3)
        res = store.append("s", evs)
        assert (res.stream_id, res.version) == ("s", 3)
        assert res.duplicate is False
        assert res.event_ids == tuple(e.event_id for e in evs)
        assert res.position == list(store.read("s"))[-1].position
        res2 = store.append("s", [_ev()])
        assert res2.version == 4
        assert res2.position > res.position

    def test_positions_strictly_increase(self, store: ae.EventStore) -> None:
        """Global positions strictly increase in append order, across streams."""
        for i in range(5):
            store.append(f"s{i % 2}", _evs(i + 1))
        positions = [e.position for e in store.read_all()]
        assert len(positions) == 15
        assert positions == sorted(set(positions))
        assert all(p > 0 for p in positions)
        for sid in ("s0", "s1"):
            ps = [e.position for e in store.read(sid)]
            assert ps == sorted(ps)

    def test_positions_are_gapless(self, store: ae.EventStore) -> None:
        """Under GAPLESS_POSITIONS, positions are exactly 1..N, even after rejected appends."""
        _require(store, Capability.GAPLESS_POSITIONS)
        store.append("a", _evs(2))
        with pytest.raises(ConcurrencyError):
            store.append("a", [_ev()], expected_version=0)
        with pytest.raises(InvalidEvent):
            store.append("a", [_ev(payload={"x": math.nan})])
        store.append("b", _evs(3))
        store.append("a", [_ev()])
        assert [e.position for e in store.read_all()] == list(range(1, 7))
        assert store.last_position() == 6

    def test_expected_version_accepted_forms(self, store: ae.EventStore) -> None:
        """Every expected_version form appends when it matches the stream."""
        assert store.append("s", [_ev()], expected_version=ae.NO_STREAM).version == 1
        assert store.append("s", [_ev()], expected_version=ae.STREAM_EXISTS).version == 2
        assert store.append("s", [_ev()], expected_version=2).version == 3
        assert store.append("s", [_ev()], expected_version=ae.ANY).version == 4
        assert store.append("t", [_ev()], expected_version=ae.ANY).version == 1
        assert store.append("u", [_ev()], expected_version=0).version == 1
        assert store.append("s", [_ev()]).version == 5  # ANY is the default

    def test_expected_version_rejections(self, store: ae.EventStore) -> None:
        """Each mismatching expected_version raises ConcurrencyError with stream,
        expected and actual, and writes nothing."""
        store.append("s", _evs(2))
        before = store_state(store)
        cases: list[tuple[str, Any, int]] = [
            ("s", ae.NO_STREAM, 2),
            ("s", 0, 2),
            ("s", 1, 2),
            ("s", 3, 2),
            ("missing", ae.STREAM_EXISTS, 0),
            ("missing", 1, 0),
        ]
        for sid, expected, actual in cases:
            with pytest.raises(ConcurrencyError) as ei:
                store.append(sid, _evs(2), expected_version=expected)
            err = ei.value
            assert (err.stream_id, err.expected, err.actual) == (sid, expected, actual)
            assert repr(sid) in str(err)
            assert store_state(store) == before

    def test_expected_version_bad_values_are_invalid(self, store: ae.EventStore) -> None:
        """expected_version that is no version (negative, bool, str, float) is InvalidEvent."""
        store.append("s", [_ev()])
        before = store_state(store)
        for bad in (-1, True, "1", 1.0, None):
            _invalid("expected_version", store.append, "s", [_ev()], expected_version=bad)
        assert store_state(store) == before

    def test_batch_with_one_invalid_event_writes_nothing(self, store: ae.EventStore) -> None:
        """A batch whose last event is invalid is refused whole, naming the event index."""
        store.append("s", [_ev()])
        before = store_state(store)
        batch = [*_evs(3), _ev(payload={"bad": math.inf})]
        with pytest.raises(InvalidEvent) as ei:
            store.append("s", batch)
        assert (ei.value.index, ei.value.stream_id) == (3, "s")
        assert store_state(store) == before
        # The valid events can still be appended afterwards, ids unused.
        assert store.append("s", batch[:3]).version == 4

    def test_batch_is_all_or_nothing_on_conflict(self, store: ae.EventStore) -> None:
        """A multi-event batch refused by the version check writes none of its events."""
        store.append("s", _evs(2))
        before = store_state(store)
        batch = _evs(5)
        with pytest.raises(ConcurrencyError):
            store.append("s", batch, expected_version=1)
        assert store_state(store) == before
        res = store.append("s", batch, expected_version=2)
        assert res.version == 7
        assert [e.event_id for e in store.read("s", from_version=3)] == [e.event_id for e in batch]

    def test_empty_batch_is_invalid(self, store: ae.EventStore) -> None:
        """Appending no events, or something that is not a NewEvent, is InvalidEvent."""
        _invalid("events", store.append, "s", [])
        _invalid("event", store.append, "s", [{"type": "t", "module": "m"}])
        assert store_state(store) == ([], [])

    def test_single_event_may_be_passed_bare(self, store: ae.EventStore) -> None:
        """append accepts a lone NewEvent as a one-event batch."""
        assert store.append("s", _ev()).version == 1  # type: ignore[arg-type]

    def test_reappend_same_events_is_idempotent(self, store: ae.EventStore) -> None:
        """Re-appending a stored batch returns the original result with duplicate=True
        and writes nothing, whatever expected_version says."""
        batch = _evs(3)
        first = store.append("s", batch, expected_version=ae.NO_STREAM)
        store.append("other", [_ev()])
        before = store_state(store)
        for expected in (ae.NO_STREAM, ae.ANY, 0, 3, ae.STREAM_EXISTS):
            again = store.append("s", batch, expected_version=expected)
            assert again.duplicate is True
            assert dataclasses.replace(again, duplicate=False) == first
            assert store_state(store) == before

    def test_reappend_with_string_ids(self, store: ae.EventStore) -> None:
        """An event_id given as a UUID string is the same id as the UUID."""
        eid = uuid.uuid4()
        first = store.append("s", [_ev(event_id=str(eid).upper())])
        again = store.append("s", [_ev(event_id=eid)])
        assert again.duplicate
        assert first.event_ids == again.event_ids == (eid,)
        assert next(store.read("s")).event_id == eid
        assert store.stream_version("s") == 1

    def test_reused_id_with_different_content_is_refused(self, store: ae.EventStore) -> None:
        """A different event under a stored event_id raises ConcurrencyError."""
        eid = uuid.uuid4()
        store.append("s", [_ev(1, event_id=eid)])
        before = store_state(store)
        variants = [
            _ev(2, event_id=eid),
            _ev(1, event_id=eid, type="other.type"),
            _ev(1, event_id=eid, module="other"),
            _ev(1, event_id=eid, metadata={"m": 1}),
        ]
        for ev in variants:
            with pytest.raises(ConcurrencyError) as ei:
                store.append("s", [ev])
            assert ei.value.stream_id == "s"
            assert str(eid) in str(ei.value)
        if _same_cell(store, "s", "elsewhere"):  # event ids are unique per cell
            with pytest.raises(ConcurrencyError):
                store.append("elsewhere", [_ev(1, event_id=eid)])
        assert store_state(store) == before

    def test_batch_mixing_new_and_stored_ids_is_refused(self, store: ae.EventStore) -> None:
        """A batch holding both stored and new event ids is refused and writes nothing."""
        batch = _evs(2)
        store.append("s", batch)
        before = store_state(store)
        with pytest.raises(ConcurrencyError):
            store.append("s", [batch[0], _ev(9)])
        with pytest.raises(ConcurrencyError):
            store.append("s", [_ev(9), batch[1]])
        assert store_state(store) == before

    def test_repeated_id_within_batch_is_invalid(self, store: ae.EventStore) -> None:
        """The same event_id twice in one batch raises InvalidEvent naming event_id."""
        eid = uuid.uuid4()
        batch = [_ev(1, event_id=eid), _ev(2), _ev(1, event_id=eid)]
        assert _invalid("event_id", store.append, "s", batch).index == 2
        assert store_state(store) == ([], [])

    def test_bad_event_id_is_invalid(self, store: ae.EventStore) -> None:
        """An event_id that is not a UUID raises InvalidEvent naming event_id."""
        for bad in ("not-a-uuid", 12, b"0" * 16):
            _invalid("event_id", store.append, "s", [_ev(event_id=bad)])
        assert store_state(store) == ([], [])

    @pytest.mark.parametrize(
        ("make", "field"),
        [
            (lambda: _ev(payload={"x": math.nan}), "payload"),
            (lambda: _ev(payload={"x": [1, -math.inf]}), "payload"),
            (lambda: _ev(payload={1: "non-str key"}), "payload"),
            (lambda: _ev(payload={"t": (1, 2)}), "payload"),
            (lambda: _ev(payload=(1, 2)), "payload"),
            (lambda: _ev(payload={"n": _MAX_I64 + 1}), "payload"),
            (lambda: _ev(payload={"n": -(2**63) - 1}), "payload"),
            (lambda: _ev(payload={"s": {1, 2}}), "payload"),
            (lambda: _ev(payload={"b": b"bytes"}), "payload"),
            (lambda: _ev(payload={"u": uuid.uuid4()}), "payload"),
            (lambda: _ev(payload={"s": "\ud800"}), "payload"),
            (lambda: _ev(metadata={"x": math.nan}), "metadata"),
            (lambda: _ev(metadata={2: "x"}), "metadata"),
            (lambda: _ev(metadata=["not", "an", "object"]), "metadata"),
            (lambda: _ev(type=""), "type"),
            (lambda: _ev(type="bad\ntype"), "type"),
            (lambda: _ev(type="t" * 257), "type"),
            (lambda: _ev(type=None), "type"),
            (lambda: _ev(module="bad\x00module"), "module"),
            (lambda: _ev(module=""), "module"),
            (lambda: _ev(module=None), "module"),
            (lambda: _ev(module="m\x7f"), "module"),
        ],
    )
    def test_bad_event_is_invalid(self, store: ae.EventStore, make: Any, field: str) -> None:
        """Non-JSON payloads/metadata and bad types/modules raise InvalidEvent naming the
        field, and the store is unchanged."""
        store.append("s", [_ev()])
        before = store_state(store)
        with pytest.raises(InvalidEvent) as ei:
            store.append("s", [_ev(), make()])
        err = ei.value
        assert err.field.split(".")[0].split("[")[0] == field
        assert field in str(err)
        assert err.index == 1
        assert "'s'" in str(err)
        assert store_state(store) == before

    @pytest.mark.parametrize(
        "sid",
        ["", "x" * 257, "bad\nstream", "tab\tstream", "nul\x00", "del\x7f", "ls\u2028x", None, 7],
    )
    def test_bad_stream_id_is_invalid(self, store: ae.EventStore, sid: Any) -> None:
        """Empty, over-long, non-str or control-character stream ids raise InvalidEvent
        naming stream_id, for writes and reads, and the store is unchanged."""
        store.append("ok", [_ev()])
        before = store_state(store)
        calls: list[Callable[[], object]] = [
            lambda: store.append(sid, [_ev()]),
            lambda: ae.emit(store, sid, "t", "m"),
            lambda: store.read(sid),
            lambda: store.stream_version(sid),
        ]
        for call in calls:
            assert "stream_id" in str(_invalid("stream_id", call))
        assert store_state(store) == before

    def test_threads_racing_for_one_version_have_one_winner(self, store: ae.EventStore) -> None:
        """Threads appending with the same expected_version: exactly one wins each round,
        the rest get ConcurrencyError, and the chain never forks."""
        threads, rounds = 6, 8
        barrier = threading.Barrier(threads)
        results: list[list[tuple[int, str]]] = [[] for _ in range(rounds)]
        lock = threading.Lock()

        def worker(t: int) -> None:
            for r in range(rounds):
                barrier.wait()
                try:
                    store.append("race", [_ev(t)], expected_version=r)
                    outcome = "won"
                except ConcurrencyError as exc:
                    assert exc.actual == r + 1
                    outcome = "lost"
                with lock:
                    results[r].append((t, outcome))
                barrier.wait()  # everyone has tried before the next round starts

        _in_threads(threads, worker, barrier.abort)
        for r in range(rounds):
            assert sorted(o for _, o in results[r]) == ["lost"] * (threads - 1) + ["won"]
        evs = list(store.read("race"))
        assert [e.version for e in evs] == list(range(1, rounds + 1))
        assert ae.integrity.verify_stream(store, "race").ok

    def test_threads_appending_with_retries_lose_nothing(self, store: ae.EventStore) -> None:
        """Threads appending to one stream, retrying on ConcurrencyError, produce versions
        1..N with every event exactly once and a clean chain."""
        threads, per = 6, 25

        def worker(t: int) -> None:
            for k in range(per):
                while True:
                    v = store.stream_version("shared")
                    try:
                        store.append("shared", [_ev(payload={"t": t, "k": k})], expected_version=v)
                        break
                    except ConcurrencyError:
                        continue
                store.append(f"own-{t}", [_ev(k)])

        _in_threads(threads, worker)
        evs = list(store.read("shared"))
        assert [e.version for e in evs] == list(range(1, threads * per + 1))
        assert sorted((e.payload["t"], e.payload["k"]) for e in evs) == [
            (i, k) for i in range(threads) for k in range(per)
        ]
        for i in range(threads):
            assert [e.payload["n"] for e in store.read(f"own-{i}")] == list(range(per))
        report = ae.integrity.audit(store)
        assert report.ok, report.findings
        assert report.events_checked == 2 * threads * per

    def test_processes_appending_never_fork(
        self, store: ae.EventStore, store_url: str, tmp_path: Path
    ) -> None:
        """Under MULTI_PROCESS, real processes appending with expected_version retries
        produce one unforked chain with nothing lost."""
        _require(store, Capability.MULTI_PROCESS)
        procs, per = 3, 40
        run_concurrent_appenders(
            store_url, ["mp"], processes=procs, appends=per, workdir=tmp_path, pause=0.002
        )
        evs = list(store.read("mp"))
        assert [e.version for e in evs] == list(range(1, procs * per + 1))
        assert sorted((e.payload["proc"], e.payload["k"]) for e in evs) == [
            (p, k) for p in range(procs) for k in range(per)
        ]
        assert ae.integrity.audit(store).ok
