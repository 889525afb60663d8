"""Smoke test of the shared fixtures."""

from __future__ import annotations

import ares_events as ae


def test_append_then_read_round_trips(store: ae.EventStore) -> None:
    """An appended event reads back with the same payload and a valid chain."""
    store.append("s", [ae.NewEvent(type="t", module="m", payload={"a": 1})])
    assert [e.payload for e in store.read("s")] == [{"a": 1}]
    assert ae.integrity.verify_stream(store, "s").ok
