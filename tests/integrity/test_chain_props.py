"""Property tests of the chain: every hashed field is bound by the link hash, keyed and
unkeyed chains differ, a sealed chain verifies clean, and any stored field flipped in any
event is found by :class:`ChainVerifier`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.chain import (
    ChainKey,
    canonical_json,
    genesis,
    header_bytes,
    link_hash,
    payload_digest,
)
from ares_events.core.backend import Batch, Head
from ares_events.core.events import NewEvent, PayloadRef, RecordedEvent, prepare
from ares_events.integrity.verifier import ChainVerifier
from tests.fixtures.tier import examples
from tests.integrity.test_codec import scalars, text, values

SETTINGS = settings(
    max_examples=examples(250), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

# Per-field tests run once per field, so each gets a smaller budget.
PER_FIELD = settings(SETTINGS, max_examples=examples(100))
# Whole chains are costlier to generate than single headers.
CHAINS = settings(SETTINGS, max_examples=examples(150))
small_values = st.recursive(
    scalars,
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(text, c, max_size=3)),
    max_leaves=6,
)
keys = st.one_of(st.none(), st.binary(min_size=32, max_size=32).map(ChainKey))


@dataclass(frozen=True)
class Fields:
    """Every input of one link hash."""

    stream: str
    version: int
    id: str
    type: str
    module: str
    meta: dict[str, Any]
    at: str
    payload: Any
    prev: bytes
    key: ChainKey | None

    def link(self) -> bytes:
        pb = canonical_json(self.payload)
        header = header_bytes(
            self.stream, self.version, self.id, self.type, self.module,
            canonical_json(self.meta, field="metadata"), self.at,
            payload_digest(pb).hex(), len(pb),
        )  # fmt: skip
        return link_hash(self.prev, header, self.key)


def strategy_for(name: str) -> st.SearchStrategy[Any]:
    """Values of one hashed field."""
    return {
        "stream": text,
        "version": st.integers(1, 2**63 - 1),
        "id": st.uuids().map(str),
        "type": text,
        "module": text,
        "meta": st.dictionaries(text, values, max_size=4),
        "at": text,
        "payload": values,
        "prev": st.binary(min_size=32, max_size=32),
        "key": keys,
    }[name]


FIELD_NAMES = ["stream", "version", "id", "type", "module", "meta", "at", "payload", "prev", "key"]
fields = st.builds(Fields, **{n: strategy_for(n) for n in FIELD_NAMES})


def _canon(name: str, value: Any) -> Any:
    """The form of a field that is actually hashed (so 'different' means different bytes)."""
    if name in ("meta", "payload"):
        return canonical_json(value)
    if name == "key":
        return None if value is None else value.key
    return value


@pytest.mark.parametrize("name", FIELD_NAMES)
@PER_FIELD
@given(base=fields, data=st.data())
def test_any_change_to_a_hashed_field_changes_the_link_hash(
    name: str, base: Fields, data: st.DataObject
) -> None:
    """Changing any one hashed field (stream, version, id, type, module, meta, at,
    payload, prev hash, key) changes the link hash."""
    new = data.draw(strategy_for(name), label=name)
    assume(_canon(name, new) != _canon(name, getattr(base, name)))
    assert replace(base, **{name: new}).link() != base.link()


@SETTINGS
@given(base=fields, key=st.binary(min_size=32, max_size=32))
def test_keyed_and_unkeyed_link_hashes_differ(base: Fields, key: bytes) -> None:
    """The same header gives different link hashes unkeyed and keyed."""
    assert replace(base, key=None).link() != replace(base, key=ChainKey(key)).link()


@SETTINGS
@given(stream=text)
def test_genesis_is_unkeyed_and_per_stream(stream: str) -> None:
    """genesis depends only on the stream id (no key) and differs between streams."""
    assert genesis(stream) == genesis(stream)
    assert genesis(stream) != genesis(stream + "x")
    assert len(genesis(stream)) == 32


# -- sealed chains and tampering -------------------------------------------------------------

names = st.text(
    alphabet=st.characters(exclude_categories=["Cc", "Cs", "Zl", "Zp"]), min_size=1, max_size=12
)
new_events = st.builds(
    NewEvent,
    type=names,
    module=names,
    payload=small_values,
    metadata=st.dictionaries(text, small_values, max_size=3),
    event_id=st.uuids(),
)


@st.composite
def chains(draw: st.DrawFn) -> tuple[str, ChainKey | None, list[RecordedEvent]]:
    """A sealed chain of 1-6 events, appended in 1-3 batches with their own ``at``."""
    stream = draw(names)
    key = draw(keys)
    evs = draw(st.lists(new_events, min_size=1, max_size=6, unique_by=lambda e: e.event_id))
    cuts = sorted(draw(st.sets(st.integers(1, len(evs) - 1), max_size=2))) if len(evs) > 1 else []
    head: Head | None = None
    out: list[RecordedEvent] = []
    for i, (lo, hi) in enumerate(zip([0, *cuts], [*cuts, len(evs)], strict=True)):
        at = f"2026-01-01T00:00:{i:02d}.{draw(st.integers(0, 999999)):06d}Z"
        sealed = Batch(stream, prepare(stream, evs[lo:hi], at), key).seal(head)
        out.extend(s.recorded(stream, len(out) + j + 1) for j, s in enumerate(sealed))
        head = Head(out[-1].version, out[-1].hash)
    return stream, key, out


def _verify(stream: str, key: ChainKey | None, evs: list[RecordedEvent]) -> ChainVerifier:
    v = ChainVerifier(stream, key)
    for e in evs:
        v.check(e)
    v.check_head(Head(evs[-1].version, evs[-1].hash))
    return v


@CHAINS
@given(chains())
def test_sealed_chain_verifies_clean(chain: tuple[str, ChainKey | None, list[Any]]) -> None:
    """A chain sealed by Batch verifies with no findings against its head."""
    stream, key, evs = chain
    assert _verify(stream, key, evs).findings == []
    assert [e.version for e in evs] == list(range(1, len(evs) + 1))
    assert evs[0].prev_hash == genesis(stream)


@CHAINS
@given(chains())
def test_wrong_key_is_found(chain: tuple[str, ChainKey | None, list[Any]]) -> None:
    """Verifying with the wrong key (or keyed vs unkeyed) flags every event."""
    stream, key, evs = chain
    wrong = ChainKey(bytes(range(32))) if key is None else None
    v = _verify(stream, wrong, evs)
    assert [f.version for f in v.findings if f.kind == "hash_mismatch"] == [e.version for e in evs]


STORED = ["version", "event_id", "type", "module", "payload", "meta", "at", "prev_hash", "hash"]


def _rebuild(e: RecordedEvent, **changes: Any) -> RecordedEvent:
    f: dict[str, Any] = {
        "stream_id": e.stream_id,
        "version": e.version,
        "position": e.position,
        "event_id": e.event_id_str,
        "type": e.type,
        "module": e.module,
        "payload_bytes": e.payload_bytes,
        "meta_json": e.metadata_json,
        "at": e.at,
        "prev_hash": e.prev_hash,
        "hash": e.hash,
        "payload_ref": e.payload_ref,
    }
    f.update(changes)
    return RecordedEvent(**f)


def _flip(draw: Any, name: str, e: RecordedEvent) -> RecordedEvent:
    """A copy of ``e`` with stored field ``name`` changed to a different value."""
    if name == "version":
        return _rebuild(e, version=draw(st.integers(0, 50).filter(lambda v: v != e.version)))
    if name == "event_id":
        return _rebuild(
            e, event_id=str(draw(st.uuids().filter(lambda u: str(u) != e.event_id_str)))
        )
    if name in ("type", "module", "at"):
        old = {"type": e.type, "module": e.module, "at": e.at}[name]
        return _rebuild(e, **{name: draw(names.filter(lambda s: s != old))})
    if name == "payload":
        raw = bytearray(e.payload_bytes)
        i = draw(st.integers(0, len(raw) - 1))
        raw[i] ^= draw(st.integers(1, 255))
        return _rebuild(e, payload_bytes=bytes(raw))
    if name == "meta":
        return _rebuild(e, meta_json=draw(st.binary(max_size=20).filter(e.metadata_json.__ne__)))
    attr = name
    old_b: bytes = getattr(e, attr)
    i = draw(st.integers(0, 31))
    raw = bytearray(old_b)
    raw[i] ^= draw(st.integers(1, 255))
    return _rebuild(e, **{attr: bytes(raw)})


@CHAINS
@given(chain=chains(), name=st.sampled_from(STORED), data=st.data())
def test_flipping_any_stored_field_is_found(
    chain: tuple[str, ChainKey | None, list[Any]], name: str, data: st.DataObject
) -> None:
    """Changing any stored field of any one event yields a finding at that event
    (hash_mismatch for content; gap/duplicate/broken_link for a moved version)."""
    stream, key, evs = chain
    i = data.draw(st.integers(0, len(evs) - 1), label="index")
    tampered = list(evs)
    tampered[i] = _flip(data.draw, name, evs[i])
    v = _verify(stream, key, tampered)
    assert v.findings, f"{name} of version {i + 1} changed unnoticed"
    if name in ("event_id", "type", "module", "payload", "meta", "at", "hash"):
        assert ("hash_mismatch", i + 1) in {(f.kind, f.version) for f in v.findings}
    if name == "prev_hash":
        kinds = {(f.kind, f.version) for f in v.findings}
        assert ("broken_link", i + 1) in kinds
        assert ("hash_mismatch", i + 1) in kinds
    if name == "hash" and i + 1 < len(evs):
        assert ("broken_link", i + 2) in {(f.kind, f.version) for f in v.findings}


@CHAINS
@given(chain=chains(), data=st.data())
def test_spilled_payload_verifies_from_its_ref(
    chain: tuple[str, ChainKey | None, list[Any]], data: st.DataObject
) -> None:
    """An event whose payload lives in a blob verifies from the ref's digest and size
    without fetching the blob; an edited digest or size in the ref is found."""
    stream, key, evs = chain
    i = data.draw(st.integers(0, len(evs) - 1), label="index")
    e = evs[i]
    ref = PayloadRef(f"blobs/{uuid.uuid4().hex}", len(e.payload_bytes), e.payload_digest)
    spilled = list(evs)
    spilled[i] = _rebuild(e, payload_bytes=None, payload_ref=ref)
    assert _verify(stream, key, spilled).findings == []
    what = data.draw(st.sampled_from(["digest", "size"]))
    bad = (
        PayloadRef(ref.key, ref.size, bytes([ref.digest[0] ^ 1]) + ref.digest[1:])
        if what == "digest"
        else PayloadRef(ref.key, ref.size + data.draw(st.integers(1, 10)), ref.digest)
    )
    spilled[i] = _rebuild(e, payload_bytes=None, payload_ref=bad)
    kinds = {(f.kind, f.version) for f in _verify(stream, key, spilled).findings}
    assert ("hash_mismatch", i + 1) in kinds


def test_store_chain_matches_properties() -> None:
    """A memory store's appended events verify clean with verify_stream (sanity link
    between the properties above and the public API)."""
    with ae.open_store("memory://", chain_key=bytes(range(32))) as store:
        for n in range(3):
            ae.emit(store, "s", "t.x", "m", {"n": n})
        report = ae.integrity.verify_stream(store, "s")
        assert report.ok and report.events_checked == 3
