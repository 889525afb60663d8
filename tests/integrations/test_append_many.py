"""EventStore.append_many (the core's atomic multi-stream append with a tracking record),
on every backend that declares MULTI_STREAM_APPEND."""

from __future__ import annotations

import pytest

import ares_events as ae
from ares_events.core.backend import Capability
from ares_events.integrity.verify import verify_stream

pytestmark = pytest.mark.parametrize("backend", ["memory", "sqlite", "postgres"], indirect=True)


def _ev(i: int) -> ae.NewEvent:
    return ae.NewEvent(type="t", module="m", payload={"i": i})


def test_append_many_is_atomic_and_positions_are_consecutive(store: ae.EventStore) -> None:
    """All batches commit together with consecutive positions; a conflict writes nothing."""
    assert Capability.MULTI_STREAM_APPEND in store.capabilities
    r = store.append_many(
        [("a", [_ev(1), _ev(2)], ae.NO_STREAM), ("b", [_ev(3)], ae.NO_STREAM)],
        tracking=("up", 5),
    )
    assert [(x.stream_id, x.version) for x in r] == [("a", 2), ("b", 1)]
    assert r[1].position > r[0].position
    pos = [e.position for e in store.read("a")] + [e.position for e in store.read("b")]
    assert pos == list(range(pos[0], pos[0] + 3))
    assert store.tracked_position("up") == 5
    with pytest.raises(ae.errors.ConcurrencyError):
        store.append_many([("c", [_ev(4)], ae.NO_STREAM), ("a", [_ev(5)], 1)])
    assert store.stream_version("c") == 0 and store.stream_version("a") == 2
    with pytest.raises(ae.errors.ConcurrencyError):
        store.append_many([("d", [_ev(6)], ae.NO_STREAM)], tracking=("up", 5))
    assert store.stream_version("d") == 0 and store.tracked_position("up") == 5
    store.append_many([], tracking=("up", 7))
    assert store.tracked_position("up") == 7
    assert verify_stream(store, "a").ok and verify_stream(store, "b").ok


def test_append_many_exact_reappend_is_idempotent(store: ae.EventStore) -> None:
    """Re-appending the same event ids returns the original results and writes nothing."""
    batches = [("x", [_ev(1)], ae.NO_STREAM), ("y", [_ev(2), _ev(3)], ae.NO_STREAM)]
    first = store.append_many(batches)
    again = store.append_many(batches)
    assert [(r.version, r.position) for r in again] == [(r.version, r.position) for r in first]
    assert all(r.duplicate for r in again)
    with pytest.raises(ae.errors.ConcurrencyError):
        store.append_many([batches[0], ("z", [_ev(9)], ae.NO_STREAM)])
    assert store.stream_version("z") == 0
