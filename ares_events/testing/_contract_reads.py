"""The conformance suite's read half. May import the public API."""

from __future__ import annotations

import itertools
import math
import threading
import unicodedata
import uuid
from datetime import UTC, datetime, timedelta
from operator import attrgetter
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.events import format_at, parse_at
from ares_events.core.recorder import system_of_record
from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.stores import Capability
from ares_events.testing._contract_helpers import (
    _MAX_I64,
    _cursors,
    _ev,
    _evs,
    _in_threads,
    _invalid,
    _require,
    store_state,
)

_IDS = ("a", "a%b", "a_b", "ab", "abc", "b", "b/1", "b/2", "é/x", "\u202e-rtl")  # for streams_page


class ReadContract:
    """Reads, and paged listings of streams: what every store must give back, and when."""

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

    def test_read_all_stream_prefix(self, store: ae.EventStore) -> None:
        """read_all(stream_prefix=P) returns exactly the events of streams whose id starts
        with P, in global order, with after_position and limit counting only those; LIKE
        wildcards and the highest code point are plain characters."""
        top = "\U0010ffff"
        sids = [
            "app/1", "ap", "app", "app0", "apo", "app/2", f"app/{top}", f"app{top}x",
            "b/1", "a%_x", "abcx", "a%_", "APP/1", "app//",
        ]  # fmt: skip
        for i, sid in enumerate(sids * 2):
            store.append(sid, [_ev(i)])
        every = list(store.read_all())

        # Cell cursors are cursors of the read that gave them: compare stream and version.
        cursors = _cursors(store)

        def ident(e: ae.RecordedEvent) -> int:
            return e.version if cursors else e.position

        def got(prefix: str | None, **kw: Any) -> list[tuple[str, int]]:
            return [(e.stream_id, ident(e)) for e in store.read_all(stream_prefix=prefix, **kw)]

        def want(prefix: str) -> list[tuple[str, int]]:
            return [(e.stream_id, ident(e)) for e in every if e.stream_id.startswith(prefix)]

        def at(prefix: str, i: int) -> int:  # the position read_all(stream_prefix) gave
            return list(store.read_all(stream_prefix=prefix))[i].position

        for prefix in ("app/", "app", "a%_", "a%", "b/", top, f"app{top}", "zzz", "app//"):
            assert got(prefix) == want(prefix), prefix
        assert len(got("app/")) == 8
        assert got(None) == got("") == want("")
        mine = want("app/")
        assert got("app/", limit=3) == mine[:3]
        assert got("app/", after_position=at("app/", 2)) == mine[3:]
        assert got("app/", after_position=at("app/", 2), limit=2) == mine[3:5]
        assert got("app/", after_position=at("app/", -1)) == []
        assert got("app/", limit=0) == []
        with pytest.raises(InvalidEvent):
            list(store.read_all(stream_prefix=b"app/"))  # type: ignore[arg-type]

    def test_position_scan_is_read_all_in_three_columns(self, store: ae.EventStore) -> None:
        """Capability.POSITION_SCAN (the audit's order check): positions(after) gives
        (position, stream_id, version) of exactly the rows read_all gives, in its order,
        over more than one page."""
        _require(store, Capability.POSITION_SCAN)
        for i in range(3):
            store.append(f"s{i}", _evs(700, 700 * i))
        store.append("s0", _evs(5))
        rec: Any = system_of_record(store.recorder)
        want = [(e.position, e.stream_id, e.version) for e in store.read_all()]
        assert len(want) == 2105
        assert list(rec.positions(0)) == want
        assert list(rec.positions(want[1000][0])) == want[1001:]
        assert list(rec.positions(want[-1][0])) == []

    def test_read_all_empty_store(self, store: ae.EventStore) -> None:
        """An empty store reads nothing and lists no streams."""
        assert list(store.read_all()) == []
        assert list(store.streams()) == []
        assert store.last_position() == 0

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
        top = _MAX_I64  # the largest a column holds: every backend takes it
        assert versions(from_version=top) == []
        assert versions(to_version=top, limit=top) == list(range(1, 11))
        if not _cursors(store):  # past every position; a cell cursor may pass it
            assert list(store.read_all(after_position=top)) == []

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
            ({"from_version": 2**63}, "from_version"),  # past any column: not an overflow
            ({"to_version": 2**63}, "to_version"),
            ({"limit": 2**63}, "limit"),
        ):
            assert field in str(_invalid(field, store.read, "s", **kw))
        for after in (-1,) if _cursors(store) else (-1, 2**63):
            _invalid("after_position", store.read_all, after_position=after)

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
        head = next(all_it)
        assert (head.stream_id, head.version) == (first.stream_id, first.version)
        if not _cursors(store):
            assert head.position == first.position
        # While both iterators are open mid-way, the store keeps working.
        res = store.append("big", _evs(10, n))
        assert res.version == n + 10
        assert store.append("other", [_ev()]).version == 1
        tail = [e.version for e in store.read("big", from_version=n - 1)]
        assert tail == list(range(n - 1, n + 11))
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
        assert (e.type, e.module) == ("agent.started", "runtime")
        assert (e.payload, e.metadata) == ({"i": 1}, {"c": "x"})
        assert ae.emit(store, "agent", "agent.stopped", "runtime").version == 2
        assert list(store.read("agent"))[1].payload == {}
        with pytest.raises(ConcurrencyError):
            ae.emit(store, "agent", "x", "runtime", expected_version=ae.NO_STREAM)

    def test_emit_requires_module(self, store: ae.EventStore) -> None:
        """emit without a module (None or empty) raises InvalidEvent naming module."""
        for module in (None, ""):
            _invalid("module", ae.emit, store, "agent", "agent.started", module, {})
        assert store_state(store) == ([], [])

    def test_recorded_event_fields(self, store: ae.EventStore) -> None:
        """Every RecordedEvent field round-trips what was appended."""
        eid = uuid.uuid4()
        payload = {"task": "t1", "n": [1, 2.5, None, True], "deep": {"x": {}}}
        meta = {"corr": "c-1", "nested": {"a": [1]}}
        new = ae.NewEvent(
            type="task.created", module="runtime", payload=payload, metadata=meta, event_id=eid
        )
        before = datetime.now(UTC)
        res = store.append("s", [new])
        after = datetime.now(UTC)
        (e,) = list(store.read("s"))
        assert isinstance(e, ae.RecordedEvent)
        assert (e.stream_id, e.version, e.position, e.event_id) == ("s", 1, res.position, eid)
        assert isinstance(e.event_id, uuid.UUID)
        assert (e.type, e.module, e.payload_ref) == ("task.created", "runtime", None)
        assert e.payload == {"task": "t1", "n": [1, 2.5, None, True], "deep": {"x": {}}}
        assert e.metadata == {"corr": "c-1", "nested": {"a": [1]}}
        for h in (e.prev_hash, e.hash):
            assert isinstance(h, bytes)
            assert len(h) == 32
        ts = e.recorded_at
        assert ts.tzinfo is not None
        assert ts.utcoffset() == timedelta(0)
        assert before - timedelta(seconds=1) <= ts <= after + timedelta(seconds=1)
        merged = next(store.read_all())
        if _cursors(store):  # read_all's position is a cursor, read's the cell's own

            def fields(x: ae.RecordedEvent) -> tuple[Any, ...]:
                return (x.stream_id, x.version, x.event_id, x.type, x.module, x.payload,
                        x.metadata, x.at, x.prev_hash, x.hash, x.payload_ref)  # fmt: skip

            assert fields(merged) == fields(e)
        else:
            assert merged == e

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
        assert (rep.ok, rep.findings, rep.events_checked) == (True, [], 5)
        empty = ae.integrity.verify_stream(store, "nothing")
        assert (empty.ok, empty.events_checked) == (True, 0)
        audit = ae.integrity.audit(store)
        assert (audit.ok, audit.events_checked) == (True, 5)

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
        ev = _ev(type="задача.создана", module="モジュール", payload=payload, metadata={"ü": "ß"})
        store.append(sid, [ev])
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
        assert dict(store.streams()) == {sid: i + 1 for i, sid in enumerate(ids)}

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
        payload: dict[str, Any] = {"max": _MAX_I64, "min": -(2**63), "f": 0.1, "tiny": 5e-324}
        payload |= {"neg0": -0.0, "big": 1e308, "s": "x" * 100_000, "nested": nested}
        payload |= {"list": [], "none": None, "b": False}
        store.append("s", [_ev(payload=payload)])
        got = next(store.read("s")).payload
        assert got == payload
        assert math.copysign(1.0, got["neg0"]) == -1.0
        assert ae.integrity.verify_stream(store, "s").ok

    def test_wait_for_returns_true_when_event_exists(self, store: ae.EventStore) -> None:
        """wait_for returns True at once when an event after the position exists."""
        res = store.append("s", _evs(2))
        assert store.wait_for(0, timeout=5) is True
        assert store.wait_for(res.position - 1, timeout=5) is True

    def test_wait_for_times_out(self, store: ae.EventStore) -> None:
        """wait_for returns False after its timeout when no later event exists."""
        assert store.wait_for(0, timeout=0.05) is False
        res = store.append("s", [_ev()])
        last = store.last_position() if _cursors(store) else res.position
        assert store.wait_for(last, timeout=0.05) is False

    def test_wait_for_refuses_bad_arguments(self, store: ae.EventStore) -> None:
        """A negative or non-int position and a timeout that is negative, NaN, infinite
        or not a number are InvalidEvent at the call (NaN used to wait forever, -1 to
        answer True on an empty store), as for read_all."""
        for position in (-1, 1.5, "0", True):
            with pytest.raises(ae.InvalidEvent, match="position"):
                store.wait_for(position, timeout=0.01)  # type: ignore[arg-type]
        for timeout in (-1, math.nan, math.inf, "1", None, True):
            with pytest.raises(ae.InvalidEvent, match="timeout"):
                store.wait_for(0, timeout=timeout)  # type: ignore[arg-type]

    def test_wait_for_wakes_on_append(self, store: ae.EventStore) -> None:
        """A thread blocked in wait_for returns True once another thread appends."""
        res = store.append("s", [_ev()])
        got: list[bool] = []
        started = threading.Event()

        def waiter(_: int) -> None:
            started.set()
            got.append(store.wait_for(res.position, timeout=60))

        def append() -> None:
            started.wait()
            store.append("t", [_ev()])

        _in_threads(1, waiter, meanwhile=append)
        assert got == [True]

    def test_wakeups_are_native(self, store: ae.EventStore) -> None:
        """Under WAKEUPS, the backend itself implements wait_for (no polling fallback)."""
        _require(store, Capability.WAKEUPS)
        waiter = getattr(store.recorder, "wait_for", None)
        assert callable(waiter)
        assert waiter(0, 0.01) is False
        store.append("s", [_ev()])
        assert waiter(0, 0.01) is True

    def test_data_survives_reopen(self, store: ae.EventStore, store_url: str) -> None:
        """Under PERSISTENT, events, heads and fields survive close and reopen, and the
        chain continues."""
        _require(store, Capability.PERSISTENT)
        store.append("s", _evs(3))
        store.append("t", [_ev(payload={"ü": 1.5})])
        row = attrgetter("stream_id", "version", "position", "event_id", "at", "payload", "hash")
        before = [row(e) for e in store.read_all()]
        store.close()
        store.close()  # idempotent
        with ae.open_store(store_url) as again:
            assert [row(e) for e in again.read_all()] == before
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

    def test_snapshot_store_present(self, store: ae.EventStore) -> None:
        """Under SNAPSHOTS, store.snapshots exists and load() of an unknown one is None."""
        _require(store, Capability.SNAPSHOTS)
        assert store.snapshots.load("no-such-stream", "no_such_projection") is None

    def test_repr_and_url_are_safe(self, store: ae.EventStore) -> None:
        """repr(store) and store.url are strings naming the store without a password."""
        assert isinstance(store.url, str)
        assert "EventStore" in repr(store)
        assert ":***@" in store.url or "@" not in store.url

    def test_streams_page_walks_every_stream_once(self, store: ae.EventStore) -> None:
        """Pages of any size, chained by the last id, list every stream once, in the
        order of streams(), with the versions of its heads."""
        for i, sid in enumerate(_IDS):
            store.append(sid, [_ev(n) for n in range(i % 3 + 1)])
        expected = list(store.streams())
        for size in (1, 3, len(_IDS), 100):
            seen: list[tuple[str, int]] = []
            after = ""
            while True:
                page = store.streams_page(after=after, limit=size)
                assert len(page) <= size
                seen.extend((sid, h.version) for sid, h in page)
                if len(page) < size:
                    break
                after = page[-1][0]
            assert seen == expected

    def test_streams_page_prefix_is_exact(self, store: ae.EventStore) -> None:
        """A prefix matches ids that start with it, character for character: ``%`` and
        ``_`` are not wildcards, and paging within a prefix stops at its end."""
        for sid in _IDS:
            store.append(sid, [_ev(0)])
        for prefix in ("a", "a_", "a%", "b/", "é", "\u202e", "zz"):
            want = [sid for sid, _ in store.streams() if sid.startswith(prefix)]
            got = [sid for sid, _ in store.streams_page(prefix=prefix, limit=100)]
            assert got == want, prefix
            paged: list[str] = []
            after = ""
            while True:
                page = store.streams_page(prefix=prefix, after=after, limit=1)
                if not page:
                    break
                paged.append(page[0][0])
                after = page[0][0]
            assert paged == want, prefix

    def test_streams_page_heads_match(self, store: ae.EventStore) -> None:
        """Each listed head is the stream's head (version and hash)."""
        store.append("h1", [_ev(0), _ev(1)])
        store.append("h2", [_ev(2)])
        for sid, head in store.streams_page(limit=10):
            assert head == store.head(sid)

    def test_streams_page_refuses_bad_arguments(self, store: ae.EventStore) -> None:
        """A limit below 1 or a non-string cursor is InvalidEvent, not an empty page."""
        for bad in (0, -1, 1.5, True):
            with pytest.raises(InvalidEvent):
                store.streams_page(limit=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidEvent):
            store.streams_page(after=None)  # type: ignore[arg-type]
