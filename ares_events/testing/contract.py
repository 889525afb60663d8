"""The store conformance suite: :class:`StoreContract`.

Every store passes the same tests. Subclass :class:`StoreContract` in a module pytest
collects and provide two fixtures::

    import ares_events as ae
    from ares_events.testing import StoreContract

    @pytest.fixture
    def store_url(tmp_path) -> str:          # a fresh, empty store's URL
        return f"mystore://{tmp_path}/db"

    @pytest.fixture
    def store(store_url) -> Iterator[ae.EventStore]:   # that store, opened
        with ae.open_store(store_url) as s:
            yield s

    class TestMyStore(StoreContract):
        pass

``store`` and ``store_url`` must name the same store: a test may open ``store_url`` a
second time to check what another open sees. Tests of optional capabilities
(:class:`~ares_events.stores.Capability`) skip with a reason when the store does not
declare the capability; every other test always runs.

The class name deliberately does not start with ``Test``, so pytest does not collect it
where it is defined.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import random
import subprocess
import sys
import threading
import time
import unicodedata
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.events import format_at, parse_at
from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.stores import Capability

logger = logging.getLogger(__name__)

__all__ = ["StoreContract", "run_concurrent_appenders", "store_state"]

_MAX_I64 = 2**63 - 1


def _ev(n: int = 0, **kw: Any) -> ae.NewEvent:
    kw.setdefault("type", "test.happened")
    kw.setdefault("module", "contract")
    kw.setdefault("payload", {"n": n})
    return ae.NewEvent(**kw)


def _evs(count: int, start: int = 0) -> list[ae.NewEvent]:
    return [_ev(start + i) for i in range(count)]


def store_state(store: ae.EventStore) -> tuple[list[tuple[str, int]], list[tuple[Any, ...]]]:
    """Everything observable about a store's contents, for "unchanged" comparisons.

    Returns:
        The streams with their versions and every event's identity and hash, in order.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    events = [
        (e.stream_id, e.version, e.position, e.event_id_str, e.hash) for e in store.read_all()
    ]
    return list(store.streams()), events


def _require(store: ae.EventStore, cap: Capability) -> None:
    if cap not in store.capabilities:
        pytest.skip(f"store does not declare Capability.{cap.name}")


# -- real processes ---------------------------------------------------------------------


def _appender_main(argv: Sequence[str]) -> None:
    """Child process body of :func:`run_concurrent_appenders` (internal)."""
    url, stream, proc_s, n_s, pause_s, go = argv
    proc, n, pause = int(proc_s), int(n_s), float(pause_s)
    Path(f"{go}.ready.{proc}").touch()
    deadline = time.monotonic() + 60
    while not Path(go).exists():
        if time.monotonic() > deadline:
            raise SystemExit("start signal never came")
        time.sleep(0.005)
    conflicts = 0
    with ae.open_store(url) as store:
        for k in range(n):
            event = ae.NewEvent(
                type="contract.appended", module="contract", payload={"proc": proc, "k": k}
            )
            while True:
                version = store.stream_version(stream)
                try:
                    store.append(stream, [event], expected_version=version)
                    break
                except ConcurrencyError:
                    conflicts += 1  # another process won this version: re-read and retry
            if pause:
                time.sleep(pause * random.random())  # "work" between steps, as agents do
    print(json.dumps({"proc": proc, "stream": stream, "appended": n, "conflicts": conflicts}))


def run_concurrent_appenders(
    url: str,
    streams: Sequence[str],
    *,
    processes: int,
    appends: int,
    workdir: str | os.PathLike[str],
    pause: float = 0.0,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Run ``processes`` real OS processes appending to ``url`` at the same time.

    Process ``i`` appends ``appends`` events (payload ``{"proc": i, "k": k}``) one at a
    time to ``streams[i % len(streams)]``, each with ``expected_version`` set to the
    version it just read, re-reading and retrying on :class:`ConcurrencyError`. All
    processes start appending together (they wait for a start signal once imported).
    With ``pause``, each process sleeps up to that many seconds between appends, which
    interleaves the processes more finely.

    Returns:
        One summary per process: ``proc``, ``stream``, ``appended``, ``conflicts``.

    Raises:
        pytest.fail.Exception: a process failed or did not finish within ``timeout``.
    """
    go = Path(workdir) / f"go-{uuid.uuid4().hex}"
    code = (
        "import sys; from ares_events.testing.contract import _appender_main as m; m(sys.argv[1:])"
    )
    procs = [
        subprocess.Popen(  # noqa: S603 - runs this Python with this module's own code
            [
                sys.executable,
                "-c",
                code,
                url,
                streams[i % len(streams)],
                str(i),
                str(appends),
                str(pause),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        deadline = time.monotonic() + timeout
        while not all(Path(f"{go}.ready.{i}").exists() for i in range(processes)):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.01)
        go.touch()
        out = []
        for p in procs:
            stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            if p.returncode != 0:
                pytest.fail(f"appender process exited with {p.returncode}:\n{stderr[-3000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        return out
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


class StoreContract:
    """Behaviour every event store shares. Subclass it with ``store``/``store_url``
    fixtures (see the module docstring)."""

    # -- versions and positions ---------------------------------------------------------

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
        assert res.stream_id == "s"
        assert res.version == 3
        assert res.duplicate is False
        assert res.event_ids == tuple(e.event_id for e in evs)
        last = list(store.read("s"))[-1]
        assert res.position == last.position
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

    # -- read_all -----------------------------------------------------------------------

    def test_read_all_global_order(self, store: ae.EventStore) -> None:
        """read_all returns every stream's events interleaved in append order."""
        order = []
        for i in range(6):
            sid = ("x", "y", "z")[i % 3]
            store.append(sid, [_ev(i)])
            order.append((sid, i))
        assert [(e.stream_id, e.payload["n"]) for e in store.read_all()] == order

    def test_read_all_after_position_and_limit(self, store: ae.EventStore) -> None:
        """read_all honours after_position (exclusive) and limit."""
        store.append("a", _evs(4))
        store.append("b", _evs(4, 4))
        allp = [e.position for e in store.read_all()]
        assert [e.position for e in store.read_all(after_position=allp[2])] == allp[3:]
        assert [e.position for e in store.read_all(after_position=allp[2], limit=2)] == allp[3:5]
        assert [e.position for e in store.read_all(limit=3)] == allp[:3]
        assert list(store.read_all(limit=0)) == []
        assert list(store.read_all(after_position=allp[-1])) == []
        assert list(store.read_all(after_position=allp[-1] + 1000)) == []

    def test_read_all_paging_by_after_position(self, store: ae.EventStore) -> None:
        """Paging read_all by the last position seen returns each event exactly once."""
        for i in range(7):
            store.append(f"s{i % 3}", _evs(5, 5 * i))
        seen: list[int] = []
        after = 0
        while True:
            page = list(store.read_all(after_position=after, limit=4))
            if not page:
                break
            seen.extend(e.payload["n"] for e in page)
            after = page[-1].position
        assert seen == list(range(35))

    def test_read_all_empty_store(self, store: ae.EventStore) -> None:
        """An empty store reads nothing and lists no streams."""
        assert list(store.read_all()) == []
        assert list(store.streams()) == []
        assert store.last_position() == 0

    # -- read ---------------------------------------------------------------------------

    def test_read_version_range_and_limit(self, store: ae.EventStore) -> None:
        """read honours from_version, to_version (inclusive) and limit together."""
        store.append("s", _evs(10))

        def versions(**kw: Any) -> list[int]:
            return [e.version for e in store.read("s", **kw)]

        assert versions() == list(range(1, 11))
        assert versions(from_version=4) == list(range(4, 11))
        assert versions(to_version=3) == [1, 2, 3]
        assert versions(from_version=3, to_version=6) == [3, 4, 5, 6]
        assert versions(from_version=3, to_version=6, limit=2) == [3, 4]
        assert versions(from_version=8, limit=10) == [8, 9, 10]
        assert versions(limit=0) == []
        assert versions(from_version=5, to_version=5) == [5]
        assert versions(from_version=6, to_version=5) == []
        assert versions(to_version=0) == []
        assert versions(from_version=11) == []
        assert versions(from_version=1000) == []
        assert versions(to_version=1000) == list(range(1, 11))

    def test_read_positional_arguments(self, store: ae.EventStore) -> None:
        """read accepts (stream, from_version, to_version, limit) positionally too."""
        store.append("s", _evs(5))
        assert [e.version for e in store.read("s", 2, 4, 2)] == [2, 3]

    def test_read_missing_stream_is_empty(self, store: ae.EventStore) -> None:
        """Reading a stream that does not exist yields nothing and creates nothing."""
        store.append("present", [_ev()])
        assert list(store.read("absent")) == []
        assert list(store.read("absent", from_version=3, to_version=9)) == []
        assert store.stream_version("absent") == 0
        assert [s for s, _ in store.streams()] == ["present"]

    def test_read_bad_range_is_invalid(self, store: ae.EventStore) -> None:
        """Nonsense ranges raise InvalidEvent naming the argument."""
        store.append("s", [_ev()])
        for kw, field in (
            ({"from_version": 0}, "from_version"),
            ({"from_version": -1}, "from_version"),
            ({"to_version": -1}, "to_version"),
            ({"limit": -1}, "limit"),
            ({"from_version": "1"}, "from_version"),
        ):
            with pytest.raises(InvalidEvent) as ei:
                store.read("s", **kw)
            assert ei.value.field == field
            assert field in str(ei.value)
        with pytest.raises(InvalidEvent) as ei:
            store.read_all(after_position=-1)
        assert ei.value.field == "after_position"

    def test_read_is_lazy(self, store: ae.EventStore) -> None:
        """read/read_all return iterators; a partly consumed one blocks neither appends,
        nor other reads, and yields a consistent run of versions when resumed."""
        n = 2600  # more than one page of a paged backend
        for i in range(0, n, 650):
            store.append("big", _evs(650, i))
        it = store.read("big")
        assert iter(it) is it
        assert not isinstance(it, list | tuple)
        first = next(it)
        assert first.version == 1
        all_it = store.read_all()
        assert next(all_it).position == first.position
        # While both iterators are open mid-way, the store keeps working.
        res = store.append("big", _evs(10, n))
        assert res.version == n + 10
        assert store.append("other", [_ev()]).version == 1
        assert [e.version for e in store.read("big", from_version=n - 1)] == list(
            range(n - 1, n + 11)
        )
        rest = [e.version for e in it]
        # The resumed iterator continues without repeats or gaps; it may or may not see
        # the events appended after it started.
        assert rest == list(range(2, len(rest) + 2))
        assert n <= len(rest) + 1 <= n + 10
        abandoned = store.read("big")
        next(abandoned)
        del abandoned, all_it
        assert ae.integrity.verify_stream(store, "big").ok

    def test_read_unconsumed_iterator_costs_nothing(self, store: ae.EventStore) -> None:
        """Creating read iterators and never consuming them leaves the store usable."""
        store.append("s", _evs(3))
        iters = [store.read("s") for _ in range(50)] + [store.read_all() for _ in range(50)]
        store.append("s", [_ev()])
        assert store.stream_version("s") == 4
        # An iterator created before an append may or may not include it.
        assert [e.version for e in iters[0]] in ([1, 2, 3], [1, 2, 3, 4])
        assert [e.version for e in store.read("s")] == [1, 2, 3, 4]

    # -- expected_version ---------------------------------------------------------------

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
        bads: list[Any] = [-1, True, "1", 1.0, None]
        for bad in bads:
            with pytest.raises(InvalidEvent) as ei:
                store.append("s", [_ev()], expected_version=bad)
            assert ei.value.field == "expected_version"
        assert store_state(store) == before

    # -- atomic batches -----------------------------------------------------------------

    def test_batch_with_one_invalid_event_writes_nothing(self, store: ae.EventStore) -> None:
        """A batch whose last event is invalid is refused whole, naming the event index."""
        store.append("s", [_ev()])
        before = store_state(store)
        batch = [*_evs(3), _ev(payload={"bad": math.inf})]
        with pytest.raises(InvalidEvent) as ei:
            store.append("s", batch)
        assert ei.value.index == 3
        assert ei.value.stream_id == "s"
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
        with pytest.raises(InvalidEvent) as ei:
            store.append("s", [])
        assert ei.value.field == "events"
        with pytest.raises(InvalidEvent) as ei:
            store.append("s", [{"type": "t", "module": "m"}])  # type: ignore[list-item]
        assert ei.value.field == "event"
        assert store_state(store) == ([], [])

    def test_single_event_may_be_passed_bare(self, store: ae.EventStore) -> None:
        """append accepts a lone NewEvent as a one-event batch."""
        assert store.append("s", _ev()).version == 1  # type: ignore[arg-type]

    # -- idempotency --------------------------------------------------------------------

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
        with pytest.raises(InvalidEvent) as ei:
            store.append("s", [_ev(1, event_id=eid), _ev(2), _ev(1, event_id=eid)])
        assert ei.value.field == "event_id"
        assert ei.value.index == 2
        assert store_state(store) == ([], [])

    def test_bad_event_id_is_invalid(self, store: ae.EventStore) -> None:
        """An event_id that is not a UUID raises InvalidEvent naming event_id."""
        for bad in ("not-a-uuid", 12, b"0" * 16):
            with pytest.raises(InvalidEvent) as ei:
                store.append("s", [_ev(event_id=bad)])
            assert ei.value.field == "event_id"
        assert store_state(store) == ([], [])

    # -- stream_version, streams, emit --------------------------------------------------

    def test_stream_version(self, store: ae.EventStore) -> None:
        """stream_version is 0 for a missing stream and the last version otherwise."""
        assert store.stream_version("s") == 0
        store.append("s", _evs(3))
        assert store.stream_version("s") == 3
        store.append("s", [_ev()])
        assert store.stream_version("s") == 4
        assert store.stream_version("t") == 0

    def test_streams_lists_every_stream_with_version(self, store: ae.EventStore) -> None:
        """streams() yields (stream_id, version) for every stream, ordered by id."""
        for sid, n in (("b", 2), ("a", 1), ("c", 3), ("a", 2)):
            store.append(sid, _evs(n))
        assert list(store.streams()) == [("a", 3), ("b", 2), ("c", 3)]

    def test_emit(self, store: ae.EventStore) -> None:
        """emit appends one event with type, module, payload and metadata."""
        res = ae.emit(store, "agent", "agent.started", "runtime", {"i": 1}, metadata={"c": "x"})
        assert isinstance(res, ae.AppendResult)
        assert res.version == 1
        e = next(store.read("agent"))
        assert (e.type, e.module, e.payload, e.metadata) == (
            "agent.started",
            "runtime",
            {"i": 1},
            {"c": "x"},
        )
        assert ae.emit(store, "agent", "agent.stopped", "runtime").version == 2
        assert list(store.read("agent"))[1].payload == {}
        with pytest.raises(ConcurrencyError):
            ae.emit(store, "agent", "x", "runtime", expected_version=ae.NO_STREAM)

    def test_emit_requires_module(self, store: ae.EventStore) -> None:
        """emit without a module (None or empty) raises InvalidEvent naming module."""
        for module in (None, ""):
            with pytest.raises(InvalidEvent) as ei:
                ae.emit(store, "agent", "agent.started", module, {})  # type: ignore[arg-type]
            assert ei.value.field == "module"
        assert store_state(store) == ([], [])

    # -- RecordedEvent ------------------------------------------------------------------

    def test_recorded_event_fields(self, store: ae.EventStore) -> None:
        """Every RecordedEvent field round-trips what was appended."""
        eid = uuid.uuid4()
        before = datetime.now(UTC)
        res = store.append(
            "s",
            [
                ae.NewEvent(
                    type="task.created",
                    module="runtime",
                    payload={"task": "t1", "n": [1, 2.5, None, True], "deep": {"x": {}}},
                    metadata={"corr": "c-1", "nested": {"a": [1]}},
                    event_id=eid,
                )
            ],
        )
        after = datetime.now(UTC)
        (e,) = list(store.read("s"))
        assert isinstance(e, ae.RecordedEvent)
        assert e.stream_id == "s"
        assert e.version == 1
        assert e.position == res.position
        assert e.event_id == eid
        assert isinstance(e.event_id, uuid.UUID)
        assert e.type == "task.created"
        assert e.module == "runtime"
        assert e.payload == {"task": "t1", "n": [1, 2.5, None, True], "deep": {"x": {}}}
        assert e.metadata == {"corr": "c-1", "nested": {"a": [1]}}
        assert e.payload_ref is None
        assert isinstance(e.prev_hash, bytes)
        assert len(e.prev_hash) == 32
        assert isinstance(e.hash, bytes)
        assert len(e.hash) == 32
        ts = e.recorded_at
        assert ts.tzinfo is not None
        assert ts.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=1) <= ts <= after + timedelta(seconds=1)
        assert next(store.read_all()) == e

    def test_metadata_defaults_to_empty_object(self, store: ae.EventStore) -> None:
        """An event appended without metadata reads back with metadata == {}."""
        store.append("s", [ae.NewEvent(type="t", module="m")])
        e = next(store.read("s"))
        assert e.metadata == {}
        assert e.payload == {}

    def test_recorded_at_round_trips_to_the_microsecond(self, store: ae.EventStore) -> None:
        """recorded_at is UTC with microseconds, identical on every read and to the hashed
        ``at`` string."""
        for _ in range(5):
            store.append("s", [_ev()])
        first = [(e.recorded_at, e.at) for e in store.read("s")]
        second = [(e.recorded_at, e.at) for e in store.read_all()]
        assert first == second
        for ts, at in first:
            assert format_at(ts) == at
            assert parse_at(at) == ts
            assert ts.tzinfo is not None
            assert ts.utcoffset() == timedelta(0)
        stamps = [ts for ts, _ in first]
        assert stamps == sorted(stamps)

    def test_recorded_event_is_immutable(self, store: ae.EventStore) -> None:
        """Assigning or deleting a RecordedEvent attribute raises AttributeError."""
        store.append("s", [_ev()])
        e = next(store.read("s"))
        for name in ("version", "payload", "hash", "stream_id", "metadata", "new_attr"):
            with pytest.raises(AttributeError):
                setattr(e, name, 1)
        with pytest.raises(AttributeError):
            del e.version
        assert e.version == 1

    def test_mutating_a_read_payload_does_not_change_the_store(self, store: ae.EventStore) -> None:
        """Changing a payload or metadata dict obtained from read does not change what
        later reads return."""
        store.append("s", [_ev(payload={"x": [1]}, metadata={"k": "v"})])
        e = next(store.read("s"))
        e.payload["x"].append(2)
        e.payload["y"] = 1
        e.metadata["k"] = "changed"
        for again in (next(store.read("s")), next(store.read_all())):
            assert again.payload == {"x": [1]}
            assert again.metadata == {"k": "v"}

    # -- chain --------------------------------------------------------------------------

    def test_chain_links(self, store: ae.EventStore) -> None:
        """Event 1 links to genesis, each later event to its predecessor's hash, and each
        hash is blake3(prev_hash + header)."""
        store.append("s", _evs(3))
        store.append("s", _evs(2))
        store.append("t", _evs(2))
        for sid in ("s", "t"):
            evs = list(store.read(sid))
            assert evs[0].prev_hash == ae.integrity.genesis(sid)
            for prev, cur in itertools.pairwise(evs):
                assert cur.prev_hash == prev.hash
            for e in evs:
                assert ae.integrity.link_hash(e.prev_hash, e.header()) == e.hash
            head = store.head(sid)
            assert head is not None
            assert (head.version, head.hash) == (evs[-1].version, evs[-1].hash)
        assert len({e.hash for e in store.read_all()}) == 7

    def test_verify_stream_clean(self, store: ae.EventStore) -> None:
        """verify_stream reports ok with every event checked on an untouched store."""
        store.append("s", _evs(4))
        store.append("s", [_ev()])
        rep = ae.integrity.verify_stream(store, "s")
        assert rep.ok
        assert rep.findings == []
        assert rep.events_checked == 5
        empty = ae.integrity.verify_stream(store, "nothing")
        assert empty.ok
        assert empty.events_checked == 0
        audit = ae.integrity.audit(store)
        assert audit.ok
        assert audit.events_checked == 5

    def test_keyed_chain(self, store_url: str) -> None:
        """A keyed chain verifies with its key and reports hash_mismatch without it."""
        key = bytes(range(32))
        with ae.open_store(store_url, chain_key=key) as keyed:
            keyed.append("s", _evs(3))
            assert ae.integrity.verify_stream(keyed, "s").ok
            for e in keyed.read("s"):
                assert e.hash == ae.integrity.link_hash(
                    e.prev_hash, e.header(), ae.integrity.ChainKey(key)
                )
            assert next(keyed.read("s")).prev_hash == ae.integrity.genesis("s")
            unkeyed = ae.EventStore(keyed.recorder)  # the same data, read without the key
            rep = ae.integrity.verify_stream(unkeyed, "s")
            assert not rep.ok
            assert {f.kind for f in rep.findings} == {"hash_mismatch"}
            assert [f.version for f in rep.findings] == [1, 2, 3]
            wrong = ae.EventStore(keyed.recorder, chain_key=ae.integrity.ChainKey(bytes(32)))
            assert not ae.integrity.verify_stream(wrong, "s").ok
            assert not ae.integrity.audit(unkeyed).ok

    def test_keyed_chain_reopened_without_key(self, store: ae.EventStore, store_url: str) -> None:
        """Under PERSISTENT, reopening a keyed store without its key finds hash_mismatch."""
        _require(store, Capability.PERSISTENT)
        store.close()
        with ae.open_store(store_url, chain_key=bytes(32)) as keyed:
            keyed.append("s", _evs(2))
        with ae.open_store(store_url) as plain:
            rep = ae.integrity.verify_stream(plain, "s")
            assert [f.kind for f in rep.findings] == ["hash_mismatch", "hash_mismatch"]
        with ae.open_store(store_url, chain_key=bytes(32)) as keyed:
            assert ae.integrity.verify_stream(keyed, "s").ok

    # -- unicode and names --------------------------------------------------------------

    def test_unicode_round_trip(self, store: ae.EventStore) -> None:
        """Non-ASCII stream ids, types, modules, payloads and metadata round-trip."""
        sid = "агент-7 🤖 智能体"
        payload = {
            "ключ": "值 🎉",
            "emoji": "👩‍👩‍👧",
            "rtl": "שלום",
            "esc": '"\\/\n\t',
            "z": "\u00e9",
        }
        store.append(
            sid,
            [
                ae.NewEvent(
                    type="задача.создана", module="モジュール", payload=payload, metadata={"ü": "ß"}
                )
            ],
        )
        e = next(store.read(sid))
        assert (e.stream_id, e.type, e.module) == (sid, "задача.создана", "モジュール")
        assert e.payload == payload
        assert e.metadata == {"ü": "ß"}
        assert list(store.streams()) == [(sid, 1)]
        assert ae.integrity.verify_stream(store, sid).ok

    def test_stream_ids_are_exact(self, store: ae.EventStore) -> None:
        """Stream ids differing only in case, Unicode normalization or trailing space are
        distinct streams."""
        nfc = unicodedata.normalize("NFC", "café")
        nfd = unicodedata.normalize("NFD", "café")
        ids = ["agent", "Agent", "agent ", nfc, nfd]
        for i, sid in enumerate(ids):
            store.append(sid, _evs(i + 1))
        for i, sid in enumerate(ids):
            assert store.stream_version(sid) == i + 1
            assert [e.stream_id for e in store.read(sid)] == [sid] * (i + 1)
        assert sorted(dict(store.streams()).items()) == sorted(
            (sid, i + 1) for i, sid in enumerate(ids)
        )

    def test_longest_stream_id(self, store: ae.EventStore) -> None:
        """A 256-character stream id (even of 4-byte characters) is accepted."""
        for sid in ("s" * 256, "🤖" * 256):
            store.append(sid, [_ev()])
            assert store.stream_version(sid) == 1
            assert next(store.read(sid)).stream_id == sid
            assert ae.integrity.verify_stream(store, sid).ok

    def test_large_values_round_trip(self, store: ae.EventStore) -> None:
        """Extreme but valid JSON values (64-bit bounds, floats, deep nesting, 100 KB
        strings) round-trip exactly."""
        nested: Any = "leaf"
        for _ in range(50):
            nested = {"d": [nested]}
        payload = {
            "max": _MAX_I64,
            "min": -(2**63),
            "f": 0.1,
            "tiny": 5e-324,
            "neg0": -0.0,
            "big": 1e308,
            "s": "x" * 100_000,
            "nested": nested,
            "list": [],
            "none": None,
            "b": False,
        }
        store.append("s", [_ev(payload=payload)])
        got = next(store.read("s")).payload
        assert got == payload
        assert math.copysign(1.0, got["neg0"]) == -1.0
        assert ae.integrity.verify_stream(store, "s").ok

    # -- bad input ----------------------------------------------------------------------

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
            with pytest.raises(InvalidEvent) as ei:
                call()
            assert ei.value.field == "stream_id"
            assert "stream_id" in str(ei.value)
        assert store_state(store) == before

    # -- concurrency --------------------------------------------------------------------

    def test_threads_racing_for_one_version_have_one_winner(self, store: ae.EventStore) -> None:
        """Threads appending with the same expected_version: exactly one wins each round,
        the rest get ConcurrencyError, and the chain never forks."""
        threads, rounds = 6, 8
        barrier = threading.Barrier(threads)
        results: list[list[tuple[int, str]]] = [[] for _ in range(rounds)]
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker(t: int) -> None:
            try:
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
            except BaseException as exc:
                errors.append(exc)
                barrier.abort()

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors, errors
        for r in range(rounds):
            assert sorted(o for _, o in results[r]) == ["lost"] * (threads - 1) + ["won"]
        evs = list(store.read("race"))
        assert [e.version for e in evs] == list(range(1, rounds + 1))
        assert ae.integrity.verify_stream(store, "race").ok

    def test_threads_appending_with_retries_lose_nothing(self, store: ae.EventStore) -> None:
        """Threads appending to one stream, retrying on ConcurrencyError, produce versions
        1..N with every event exactly once and a clean chain."""
        threads, per = 6, 25
        errors: list[BaseException] = []

        def worker(t: int) -> None:
            try:
                for k in range(per):
                    while True:
                        v = store.stream_version("shared")
                        try:
                            store.append(
                                "shared", [_ev(payload={"t": t, "k": k})], expected_version=v
                            )
                            break
                        except ConcurrencyError:
                            continue
                    store.append(f"own-{t}", [_ev(k)])
            except BaseException as exc:
                errors.append(exc)

        ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(120)
        assert not errors, errors
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

    # -- wait_for -----------------------------------------------------------------------

    def test_wait_for_returns_true_when_event_exists(self, store: ae.EventStore) -> None:
        """wait_for returns True at once when an event after the position exists."""
        res = store.append("s", _evs(2))
        assert store.wait_for(0, timeout=5) is True
        assert store.wait_for(res.position - 1, timeout=5) is True

    def test_wait_for_times_out(self, store: ae.EventStore) -> None:
        """wait_for returns False after its timeout when no later event exists."""
        assert store.wait_for(0, timeout=0.05) is False
        res = store.append("s", [_ev()])
        assert store.wait_for(res.position, timeout=0.05) is False

    def test_wait_for_wakes_on_append(self, store: ae.EventStore) -> None:
        """A thread blocked in wait_for returns True once another thread appends."""
        res = store.append("s", [_ev()])
        got: list[bool] = []
        started = threading.Event()

        def waiter() -> None:
            started.set()
            got.append(store.wait_for(res.position, timeout=60))

        t = threading.Thread(target=waiter)
        t.start()
        started.wait()
        store.append("t", [_ev()])
        t.join(60)
        assert got == [True]

    def test_wakeups_are_native(self, store: ae.EventStore) -> None:
        """Under WAKEUPS, the backend itself implements wait_for (no polling fallback)."""
        _require(store, Capability.WAKEUPS)
        waiter = getattr(store.recorder, "wait_for", None)
        assert callable(waiter)
        assert waiter(0, 0.01) is False
        store.append("s", [_ev()])
        assert waiter(0, 0.01) is True

    # -- persistence --------------------------------------------------------------------

    def test_data_survives_reopen(self, store: ae.EventStore, store_url: str) -> None:
        """Under PERSISTENT, events, heads and fields survive close and reopen, and the
        chain continues."""
        _require(store, Capability.PERSISTENT)
        store.append("s", _evs(3))
        store.append("t", [_ev(payload={"ü": 1.5})])
        before = [
            (e.stream_id, e.version, e.position, e.event_id, e.at, e.payload, e.hash)
            for e in store.read_all()
        ]
        store.close()
        store.close()  # idempotent
        with ae.open_store(store_url) as again:
            after = [
                (e.stream_id, e.version, e.position, e.event_id, e.at, e.payload, e.hash)
                for e in again.read_all()
            ]
            assert after == before
            assert list(again.streams()) == [("s", 3), ("t", 1)]
            assert again.append("s", [_ev()], expected_version=3).version == 4
            assert ae.integrity.audit(again).ok

    def test_two_opens_see_each_other(self, store: ae.EventStore, store_url: str) -> None:
        """Under PERSISTENT, a second open of the same URL sees the first one's appends and
        its version checks."""
        _require(store, Capability.PERSISTENT)
        store.append("s", [_ev()])
        with ae.open_store(store_url) as other:
            assert other.stream_version("s") == 1
            other.append("s", [_ev()], expected_version=1)
        assert store.stream_version("s") == 2
        with pytest.raises(ConcurrencyError):
            store.append("s", [_ev()], expected_version=1)
        assert ae.integrity.verify_stream(store, "s").ok

    # -- snapshots ----------------------------------------------------------------------

    def test_snapshot_store_present(self, store: ae.EventStore) -> None:
        """Under SNAPSHOTS, store.snapshots exists and load() of an unknown one is None."""
        _require(store, Capability.SNAPSHOTS)
        assert store.snapshots.load("no-such-stream", "no_such_projection") is None

    # -- misc ---------------------------------------------------------------------------

    def test_repr_and_url_are_safe(self, store: ae.EventStore) -> None:
        """repr(store) and store.url are strings naming the store without a password."""
        assert isinstance(store.url, str)
        assert "EventStore" in repr(store)
        assert ":***@" in store.url or "@" not in store.url
