"""Bad input is ``InvalidEvent`` naming the field, the stream and the event's index in the
batch, and nothing is written (issue 2, item 2)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

import ares_events as ae
from ares_events.core.events import format_at, parse_at, utc_now_at
from ares_events.errors import InvalidEvent
from tests.fixtures.fix_backends import open_backend

STREAM = "agent-1"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ae.EventStore]:
    """A fresh store per backend that validation goes through (it is backend-independent)."""
    with open_backend(request.param, tmp_path, request) as s:
        ae.emit(s, "other", "seed.event", "tests", {"n": 0})  # an unrelated existing stream
        yield s


def good(**kw: Any) -> ae.NewEvent:
    """A valid event, with fields overridden by ``kw``."""
    base: dict[str, Any] = {"type": "task.created", "module": "runtime", "payload": {"k": 1}}
    base.update(kw)
    return ae.NewEvent(**base)


def assert_nothing_written(store: ae.EventStore, stream_id: str = STREAM) -> None:
    """The store holds only the seed event."""
    assert store.last_position() == 1
    assert list(store.streams()) == [("other", 1)]
    if stream_id and len(stream_id) <= 256 and stream_id.isprintable():
        assert store.stream_version(stream_id) == 0
        assert list(store.read(stream_id)) == []


class Unjsonable:
    """An arbitrary object that is not a JSON value."""


# (case id, field overrides of the bad event, expected exc.field)
EVENT_CASES: list[tuple[str, dict[str, Any], str]] = [
    ("payload-set", {"payload": {"a": {1, 2}}}, "payload.a"),
    ("payload-tuple", {"payload": {"a": [0, (1, 2)]}}, "payload.a[1]"),
    ("payload-bytes", {"payload": b"raw"}, "payload"),
    ("payload-object", {"payload": {"o": Unjsonable()}}, "payload.o"),
    ("payload-nan", {"payload": {"x": float("nan")}}, "payload.x"),
    ("payload-inf", {"payload": [float("inf")]}, "payload[0]"),
    ("payload-neg-inf", {"payload": {"x": {"y": float("-inf")}}}, "payload.x.y"),
    ("payload-int-too-big", {"payload": {"n": 2**63}}, "payload.n"),
    ("payload-int-too-small", {"payload": {"n": -(2**63) - 1}}, "payload.n"),
    ("payload-non-str-key", {"payload": {"ok": {1: "one"}}}, "payload.ok"),
    ("payload-none-key", {"payload": {None: 1}}, "payload"),
    ("payload-lone-surrogate", {"payload": {"s": "\ud800"}}, "payload"),
    ("metadata-nan", {"metadata": {"score": float("nan")}}, "metadata.score"),
    ("metadata-bytes", {"metadata": {"blob": b"x"}}, "metadata.blob"),
    ("metadata-non-str-key", {"metadata": {2: "two"}}, "metadata"),
    ("metadata-not-object", {"metadata": ["a", "list"]}, "metadata"),
    ("metadata-str", {"metadata": "text"}, "metadata"),
    ("type-empty", {"type": ""}, "type"),
    ("type-too-long", {"type": "t" * 257}, "type"),
    ("type-not-str", {"type": 5}, "type"),
    ("type-newline", {"type": "task\ncreated"}, "type"),
    ("type-nul", {"type": "task\x00"}, "type"),
    ("type-del", {"type": "task\x7f"}, "type"),
    ("type-c1", {"type": "task\x85"}, "type"),
    ("type-line-sep", {"type": "task\u2028"}, "type"),
    ("module-missing-none", {"module": None}, "module"),
    ("module-missing-empty", {"module": ""}, "module"),
    ("module-too-long", {"module": "m" * 257}, "module"),
    ("module-control", {"module": "run\ttime"}, "module"),
    ("event-id-not-uuid", {"event_id": "not-a-uuid"}, "event_id"),
    ("event-id-int", {"event_id": 12}, "event_id"),
]


@pytest.mark.parametrize(
    ("overrides", "field"), [c[1:] for c in EVENT_CASES], ids=[c[0] for c in EVENT_CASES]
)
def test_bad_event_is_rejected_naming_field_stream_and_index(
    store: ae.EventStore, overrides: dict[str, Any], field: str
) -> None:
    """A bad event at index 1 raises InvalidEvent naming the field, the stream and
    ``event #1``; the good event at index 0 is not written either."""
    with pytest.raises(InvalidEvent) as info:
        store.append(STREAM, [good(), good(**overrides)], expected_version=ae.NO_STREAM)
    exc = info.value
    assert exc.field == field
    assert exc.stream_id == STREAM
    assert exc.index == 1
    msg = str(exc)
    assert field in msg
    assert repr(STREAM) in msg
    assert "event #1" in msg
    assert_nothing_written(store)


@pytest.mark.parametrize(
    ("overrides", "field"), [c[1:] for c in EVENT_CASES], ids=[c[0] for c in EVENT_CASES]
)
def test_bad_event_through_emit(
    store: ae.EventStore, overrides: dict[str, Any], field: str
) -> None:
    """emit() rejects the same bad input with the same field, as event #0."""
    ev = good(**overrides)
    with pytest.raises(InvalidEvent) as info:
        store.append(STREAM, [ev])
    assert info.value.field == field
    assert info.value.index == 0
    if "event_id" not in overrides:
        with pytest.raises(InvalidEvent) as info2:
            ae.emit(
                store,
                STREAM,
                ev.type,
                ev.module,
                ev.payload,
                metadata=ev.metadata,  # type: ignore[arg-type]
            )
        assert info2.value.field == field
    assert_nothing_written(store)


STREAM_CASES: list[tuple[str, Any]] = [
    ("empty", ""),
    ("too-long", "s" * 257),
    ("not-str", 42),
    ("none", None),
    ("newline", "agent\n1"),
    ("nul", "agent\x001"),
    ("escape", "agent\x1b[31m"),
    ("del", "agent\x7f"),
    ("c1", "agent\x9b"),
    ("para-sep", "agent\u2029"),
    ("lone-surrogate", "agent\udc00"),
]


@pytest.mark.parametrize(
    "stream_id", [c[1] for c in STREAM_CASES], ids=[c[0] for c in STREAM_CASES]
)
def test_bad_stream_id_is_rejected(store: ae.EventStore, stream_id: Any) -> None:
    """Empty, over-long (> 256), non-str and control-character stream ids raise
    InvalidEvent with field ``stream_id`` from append, emit, read and stream_version."""
    for call in (
        lambda: store.append(stream_id, [good()]),
        lambda: ae.emit(store, stream_id, "t", "m", {}),
        lambda: list(store.read(stream_id)),
        lambda: store.stream_version(stream_id),
    ):
        with pytest.raises(InvalidEvent) as info:
            call()
        assert info.value.field == "stream_id"
        assert "stream_id" in str(info.value)
    assert_nothing_written(store, "")


def test_name_length_limit_is_inclusive(store: ae.EventStore) -> None:
    """Stream ids, types and modules of exactly 256 characters (non-ASCII allowed) are
    accepted; 257 are not."""
    name = "é" * 255 + "🚀"
    res = store.append(name, [good(type=name, module=name)])
    assert res.version == 1
    e = next(store.read(name))
    assert (e.stream_id, e.type, e.module) == (name, name, name)
    assert ae.integrity.verify_stream(store, name).ok


@pytest.mark.parametrize(
    ("events", "field"),
    [([], "events"), ("not events", "events"), ([{"type": "x", "module": "m"}], "event")],
    ids=["empty-batch", "str", "dict-not-newevent"],
)
def test_bad_batch_is_rejected(store: ae.EventStore, events: Any, field: str) -> None:
    """An empty batch, a non-sequence or a non-NewEvent item is InvalidEvent."""
    with pytest.raises(InvalidEvent) as info:
        store.append(STREAM, events)
    assert info.value.field == field
    assert repr(STREAM) in str(info.value)
    assert_nothing_written(store)


def test_duplicate_event_id_in_one_batch(store: ae.EventStore) -> None:
    """The same event_id twice in one batch is InvalidEvent naming event_id and index."""
    a = good()
    with pytest.raises(InvalidEvent) as info:
        store.append(STREAM, [a, good(event_id=a.event_id)])
    assert info.value.field == "event_id"
    assert info.value.index == 1
    assert_nothing_written(store)


@pytest.mark.parametrize("expected", [-1, "1", 1.0, None, True, 2**63], ids=repr)
def test_bad_expected_version(store: ae.EventStore, expected: Any) -> None:
    """An expected_version that is not an int >= 0 or a marker is InvalidEvent."""
    with pytest.raises(InvalidEvent) as info:
        store.append(STREAM, [good()], expected_version=expected)
    assert info.value.field == "expected_version"
    assert_nothing_written(store)


def test_invalid_event_is_a_value_error_of_the_public_tree() -> None:
    """InvalidEvent is an AresError and a ValueError, exported as ares_events.InvalidEvent."""
    assert issubclass(InvalidEvent, ae.errors.AresError)
    assert issubclass(InvalidEvent, ValueError)
    assert InvalidEvent.__module__ == "ares_events"


def test_payload_over_the_inline_limit_is_invalid_unless_it_spills(tmp_path: Path) -> None:
    """A payload bigger than max_inline_bytes is InvalidEvent (naming the limit and the
    fix) when nothing spills it, is spilled when a blob store is configured, and a
    refused batch writes nothing."""
    big = ae.NewEvent(type="t", module="m", payload={"x": "y" * 5000})
    small = ae.NewEvent(type="t", module="m", payload={"x": 1})
    for url in ("memory://", f"sqlite:///{tmp_path / 'a.db'}"):
        with ae.open_store(url, blobs=False, max_inline_bytes=1000) as store:
            with pytest.raises(InvalidEvent) as info:
                store.append("s", [small, big])
            assert info.value.field == "payload" and info.value.index == 1
            assert "blob store" in str(info.value)
            assert store.stream_version("s") == 0
    with ae.open_store(
        f"sqlite:///{tmp_path / 'b.db'}", max_inline_bytes=1000, spill_threshold=1000
    ) as store:
        store.append("s", [small, big])
        assert [e.payload_ref is not None for e in store.read("s")] == [False, True]


def test_metadata_over_its_limit_is_invalid(store: ae.EventStore) -> None:
    """Metadata over 1 MiB (it is hashed into every header) is InvalidEvent; nothing is
    written."""
    ev = ae.NewEvent(type="t", module="m", metadata={"x": "y" * (1024 * 1024)})
    with pytest.raises(InvalidEvent) as info:
        store.append("s", [ev])
    assert info.value.field == "metadata"
    assert store.stream_version("s") == 0


def test_utc_now_at_is_format_at_of_now() -> None:
    """The cached-second clock gives exactly format_at's layout, between two readings of
    datetime.now, across a second boundary too."""
    shape = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
    end = time.monotonic() + 1.2  # crosses at least one second boundary
    while time.monotonic() < end:
        before = datetime.now(UTC)
        at = utc_now_at()
        after = datetime.now(UTC)
        assert shape.fullmatch(at), at
        assert before <= parse_at(at) <= after
        assert format_at(parse_at(at)) == at
