"""Format v1 test vectors: ``docs/format.md`` is checked against the code.

The ``ref_*`` functions below are an independent implementation of the format written
straight from the spec (``json.dumps`` + ``blake3``); they share no code with
``ares_events.chain``. The vectors in the docs were produced with them, and the
tests check that (1) the reference reproduces every vector, (2) the library's low-level
functions reproduce every vector, and (3) sealing the events through a real (memory)
store with the vector's ``at`` gives the same hashes and verifies clean.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import blake3
import pytest

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
from ares_events.core.events import NewEvent, prepare
from ares_events.core.store import EventStore
from ares_events.integrity.verify import verify_stream
from ares_events.stores.memory import MemoryRecorder

FORMAT_MD = Path(__file__).resolve().parents[2] / "docs" / "format.md"

# -- independent reference implementation (from the spec only) ---------------------------


def ref_canonical(x: Any) -> bytes:
    """Canonical JSON exactly as format v1 words it."""
    return json.dumps(
        x, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def ref_genesis(stream_id: str) -> bytes:
    """``blake3(b"ares-events/v1\\x00" + stream_id.encode())``."""
    return blake3.blake3(b"ares-events/v1\x00" + stream_id.encode("utf-8")).digest()


def ref_header(
    stream_id: str,
    version: int,
    event_id: str,
    type_: str,
    module: str,
    metadata: dict[str, Any],
    at: str,
    payload_bytes: bytes,
) -> bytes:
    """The header object of the spec, encoded with :func:`ref_canonical`."""
    return ref_canonical(
        {
            "v": 1,
            "stream": stream_id,
            "version": version,
            "id": event_id,
            "type": type_,
            "module": module,
            "meta": metadata,
            "at": at,
            "payload": blake3.blake3(payload_bytes).hexdigest(),
            "size": len(payload_bytes),
        }
    )


def ref_link(prev: bytes, header: bytes, key: bytes | None) -> bytes:
    """A link hash, keyed when ``key`` is given."""
    if key is None:
        return blake3.blake3(prev + header).digest()
    return blake3.blake3(prev + header, key=key).digest()


def ref_expected(vector: dict[str, Any]) -> dict[str, Any]:
    """Every expected output of a vector, computed with the reference only."""
    sid = vector["stream_id"]
    key = bytes.fromhex(vector["key"]) if vector["key"] is not None else None
    prev = ref_genesis(sid)
    out: dict[str, Any] = {"genesis": prev.hex(), "events": []}
    for version, ev in enumerate(vector["events"], start=1):
        pb = ref_canonical(ev["payload"])
        header = ref_header(
            sid, version, ev["event_id"], ev["type"], ev["module"], ev["metadata"], ev["at"], pb
        )
        h = ref_link(prev, header, key)
        out["events"].append(
            {
                "payload_json": pb.decode("utf-8"),
                "payload_digest": blake3.blake3(pb).hexdigest(),
                "size": len(pb),
                "header": header.decode("utf-8"),
                "prev_hash": prev.hex(),
                "hash": h.hex(),
            }
        )
        prev = h
    return out


# -- the vectors in docs/format.md -------------------------------------------------------


def load_vectors(path: Path = FORMAT_MD) -> list[dict[str, Any]]:
    """Every fenced ```json block of ``path`` that is a test vector (has ``expected``)."""
    text = path.read_text(encoding="utf-8")
    blocks = re.findall(r"^```json\n(.*?)^```$", text, flags=re.S | re.M)
    vectors = [json.loads(b) for b in blocks]
    return [v for v in vectors if isinstance(v, dict) and "expected" in v]


VECTORS = load_vectors()
IDS = [v["name"] for v in VECTORS]


def test_enough_vectors_with_required_cases() -> None:
    """docs/format.md holds at least 6 vectors covering every required case."""
    names = set(IDS)
    assert len(VECTORS) >= 6
    assert len(names) == len(VECTORS), "vector names must be unique"
    for required in ("simple-ascii", "unicode", "nested-metadata", "empty-payload", "keyed"):
        assert required in names
    assert any(len(v["events"]) >= 3 for v in VECTORS), "a chain of at least 3 events"
    assert any(v["key"] == bytes(range(32)).hex() for v in VECTORS), "a keyed chain"
    floats = [v for v in VECTORS if "float" in v["name"]]
    assert floats and any(-0.0 in _floats(e["payload"]) for v in floats for e in v["events"])


def _floats(x: Any) -> list[float]:
    if isinstance(x, float):
        return [x]
    if isinstance(x, dict):
        return [f for v in x.values() for f in _floats(v)]
    if isinstance(x, list):
        return [f for v in x for f in _floats(v)]
    return []


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_reference_reproduces_vector(vector: dict[str, Any]) -> None:
    """The independent spec implementation reproduces every expected value in the docs."""
    assert ref_expected(vector) == vector["expected"]


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_chain_functions_reproduce_vector(vector: dict[str, Any]) -> None:
    """canonical_json, payload_digest, header_bytes, genesis and link_hash give the vector."""
    sid = vector["stream_id"]
    key = ChainKey.from_hex(vector["key"]) if vector["key"] is not None else None
    exp = vector["expected"]
    assert genesis(sid).hex() == exp["genesis"]
    prev = genesis(sid)
    for version, (ev, want) in enumerate(zip(vector["events"], exp["events"], strict=True), 1):
        pb = canonical_json(ev["payload"])
        assert pb.decode("utf-8") == want["payload_json"]
        assert len(pb) == want["size"]
        digest = payload_digest(pb)
        assert digest.hex() == want["payload_digest"]
        meta_json = canonical_json(ev["metadata"], field="metadata")
        header = header_bytes(
            sid, version, ev["event_id"], ev["type"], ev["module"], meta_json, ev["at"],
            digest.hex(), len(pb),
        )  # fmt: skip
        assert header.decode("utf-8") == want["header"]
        assert prev.hex() == want["prev_hash"]
        h = link_hash(prev, header, key)
        assert h.hex() == want["hash"]
        prev = h


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_store_seals_vector(vector: dict[str, Any]) -> None:
    """Appending the vector's events through a memory store (fixed ``at``) stores the
    vector's hashes, and the stored chain verifies clean."""
    sid = vector["stream_id"]
    key = ChainKey.from_hex(vector["key"]) if vector["key"] is not None else None
    exp = vector["expected"]["events"]
    recorder = MemoryRecorder()
    with EventStore(recorder, chain_key=key) as store:
        for ev in vector["events"]:
            new = NewEvent(
                type=ev["type"],
                module=ev["module"],
                payload=ev["payload"],
                metadata=ev["metadata"],
                event_id=ev["event_id"],
            )
            # ``at`` is normally set by the library at append time; seal with the vector's.
            recorder.append(Batch(sid, prepare(sid, [new], ev["at"]), key), ae.ANY)
        stored = list(store.read(sid))
        assert [e.hash.hex() for e in stored] == [w["hash"] for w in exp]
        assert [e.prev_hash.hex() for e in stored] == [w["prev_hash"] for w in exp]
        for e, ev, want in zip(stored, vector["events"], exp, strict=True):
            assert e.event_id_str == ev["event_id"]
            assert e.at == ev["at"]
            assert e.payload_bytes.decode("utf-8") == want["payload_json"]
            assert e.payload_digest.hex() == want["payload_digest"]
            assert e.header().decode("utf-8") == want["header"]
            assert e.payload == ev["payload"]
            assert e.metadata == ev["metadata"]
        report = verify_stream(store, sid)
        assert report.ok, report.findings
        assert report.events_checked == len(exp)
        assert store.head(sid) == Head(len(exp), bytes.fromhex(exp[-1]["hash"]))


ONE_AT = [v for v in VECTORS if len({ev["at"] for ev in v["events"]}) == 1]


def test_some_vectors_share_one_at() -> None:
    """At least one multi-event vector can be sealed as a single batch."""
    assert any(len(v["events"]) > 1 for v in ONE_AT)


@pytest.mark.parametrize("vector", ONE_AT, ids=[v["name"] for v in ONE_AT])
def test_store_seals_vector_in_one_batch(vector: dict[str, Any]) -> None:
    """When every event shares one ``at``, sealing them as one batch gives the vector."""
    ats = {ev["at"] for ev in vector["events"]}
    sid = vector["stream_id"]
    key = ChainKey.from_hex(vector["key"]) if vector["key"] is not None else None
    news = [
        NewEvent(
            type=ev["type"],
            module=ev["module"],
            payload=ev["payload"],
            metadata=ev["metadata"],
            event_id=ev["event_id"],
        )
        for ev in vector["events"]
    ]
    sealed = Batch(sid, prepare(sid, news, ats.pop()), key).seal(None)
    assert [s.hash.hex() for s in sealed] == [w["hash"] for w in vector["expected"]["events"]]


@pytest.mark.parametrize("vector", VECTORS, ids=IDS)
def test_wrong_key_does_not_reproduce_vector(vector: dict[str, Any]) -> None:
    """Toggling keyed mode (or using another key) changes every link hash of the vector."""
    sid = vector["stream_id"]
    other = None if vector["key"] is not None else ChainKey(bytes(range(32)))
    prev = genesis(sid)
    for version, (ev, want) in enumerate(
        zip(vector["events"], vector["expected"]["events"], strict=True), 1
    ):
        pb = canonical_json(ev["payload"])
        header = header_bytes(
            sid, version, ev["event_id"], ev["type"], ev["module"],
            canonical_json(ev["metadata"]), ev["at"], payload_digest(pb).hex(), len(pb),
        )  # fmt: skip
        assert link_hash(prev, header, other).hex() != want["hash"]
        prev = bytes.fromhex(want["hash"])
