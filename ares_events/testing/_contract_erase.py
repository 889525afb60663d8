"""The conformance suite's erasure part (``Capability.ERASE``). May import the public API."""

from __future__ import annotations

from operator import attrgetter

import pytest

import ares_events as ae
from ares_events.errors import EventNotFound, PayloadErased
from ares_events.stores import Capability
from ares_events.testing._contract_helpers import _ev, _evs, _require, store_state


class EraseContract:
    """Erasure: what every store that declares ``Capability.ERASE`` must do."""

    def test_erase_keeps_digest_size_hash_and_order(self, store: ae.EventStore) -> None:
        """An erased event keeps its digest, size, hash and position; its payload reads as
        erased; the other events and the chain are untouched."""
        _require(store, Capability.ERASE)
        store.append("s", [_ev(0), _ev(1, payload={"secret": "x" * 50}), _ev(2)])
        store.append("other", _evs(2))
        before = {(e.stream_id, e.version): e for e in store.read_all()}
        target = before[("s", 2)]
        digest, size = target.payload_digest, target.payload_size
        report = ae.erase(store, "s", 2, reason="test", by="contract")
        assert not report.already_erased and report.payload_size == size
        after = {(e.stream_id, e.version): e for e in store.read_all()}
        erased = after[("s", 2)]
        assert erased.payload_erased
        assert (erased.payload_digest, erased.payload_size) == (digest, size)
        chained = attrgetter("hash", "prev_hash", "position")
        assert chained(erased) == chained(target)
        with pytest.raises(PayloadErased) as info:
            _ = erased.payload
        assert (info.value.stream_id, info.value.version) == ("s", 2)
        with pytest.raises(PayloadErased):
            _ = erased.payload_bytes
        (via_read,) = store.read("s", 2, 2)
        assert via_read.payload_erased and via_read.hash == target.hash
        for key, e in before.items():
            if key != ("s", 2):
                assert not after[key].payload_erased and after[key].payload == e.payload
        assert ae.integrity.verify_stream(store, "s").ok
        audit = ae.integrity.audit(store)
        assert audit.ok, audit.findings
        assert [(x["stream_id"], x["version"]) for x in audit.erased] == [("s", 2)]

    def test_erase_records_itself_once(self, store: ae.EventStore) -> None:
        """The erasure is a payload.erased event naming the event; erasing again changes
        nothing and records nothing."""
        _require(store, Capability.ERASE)
        res = store.append("s", _evs(2))
        first = ae.erase(store, "s", 1, reason="why", by="who")
        again = ae.erase(store, "s", 1, reason="why", by="who")
        assert again.already_erased and again.record_position is None
        (rec,) = store.read(ae.ERASURE_STREAM)  # one record
        assert (rec.position, rec.type) == (first.record_position, "payload.erased")
        if Capability.CELL_CURSORS in store.capabilities:
            # positions are points of each stream's own cell, on its own clock: no order
            # across cells to compare; read_all yields the record once
            order = [(e.stream_id, e.version) for e in store.read_all()]
            assert order.count((ae.ERASURE_STREAM, 1)) == 1 and ("s", 2) in order
        else:
            assert rec.position > res.position
        assert rec.payload["stream_id"] == "s" and rec.payload["version"] == 1
        assert rec.payload["event_id"] == first.event_id
        assert (rec.payload["by"], rec.payload["reason"]) == ("who", "why")

    def test_erase_of_a_missing_event_changes_nothing(self, store: ae.EventStore) -> None:
        """Erasing a version or stream that does not exist raises EventNotFound and leaves
        the store exactly as it was; a bad reason or author is InvalidEvent."""
        _require(store, Capability.ERASE)
        store.append("s", _evs(2))
        state = store_state(store)
        for sid, version in (("s", 3), ("nope", 1), ("s", 0)):
            with pytest.raises(EventNotFound):
                ae.erase(store, sid, version, reason="r", by="b")
        for reason, by in (("", "b"), ("r", " ")):
            with pytest.raises(ae.InvalidEvent):
                ae.erase(store, "s", 1, reason=reason, by=by)
        assert store_state(store) == state
        assert not any(e.payload_erased for e in store.read_all())

    def test_the_store_records_cannot_be_erased(self, store: ae.EventStore) -> None:
        """An erasure record (or a retention record) is refused as a target, through
        ``erase`` and ``erase_payload``, and the store is left exactly as it was: erased,
        the audit could no longer tell that erasure from tampering, for good."""
        _require(store, Capability.ERASE)
        store.append("s", _evs(2))
        ae.erase(store, "s", 1, reason="r", by="b")
        state = store_state(store)
        for sid in (ae.ERASURE_STREAM, "ares-events/retention"):
            with pytest.raises(ae.InvalidEvent, match="record"):
                ae.erase(store, sid, 1, reason="r", by="b")
            with pytest.raises(ae.InvalidEvent, match="record"):
                store.erase_payload(sid, 1)
        assert store_state(store) == state
        assert ae.integrity.audit(store).ok

    def test_reappend_of_an_erased_event_stays_erased(self, store: ae.EventStore) -> None:
        """Re-appending the original event (same id, same payload) after its erasure is a
        duplicate: nothing is written and the payload stays erased."""
        _require(store, Capability.ERASE)
        ev = _ev(7, payload={"name": "Ada"})
        res = store.append("s", [ev])
        ae.erase(store, "s", 1, reason="r", by="b")
        again = store.append("s", [ev])
        assert again.duplicate and again.version == res.version
        (e,) = store.read("s")
        assert e.payload_erased and store.stream_version("s") == 1

    def test_appends_go_on_after_an_erasure(self, store: ae.EventStore) -> None:
        """A stream with an erased event takes new events on its unchanged head."""
        _require(store, Capability.ERASE)
        store.append("s", _evs(2))
        ae.erase(store, "s", 2, reason="r", by="b")
        store.append("s", [_ev(3)], expected_version=2)
        assert [e.payload_erased for e in store.read("s")] == [False, True, False]
        assert ae.integrity.verify_stream(store, "s").ok
