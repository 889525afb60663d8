"""Property tests: any change to a record makes verify-record fail with a finding that
names what: a flipped byte anywhere in the file, an event removed or two swapped (and
the record re-signed by the exporter), a cut tail, a swapped checkpoint, a wrong key."""

from __future__ import annotations

import json
from typing import Any

import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.projections.merkle import MerkleLog
from ares_events.records import export_record, verify_record
from ares_events.records.export import _sign
from ares_events.records.verify import load_record
from tests.fixtures.tier import examples
from tests.records.helpers import LOG, OTHER, small_run

VK = [LOG.verifier.text]


def _exports() -> dict[str, bytes]:
    with ae.open_store("memory://") as store:
        small_run(store, steps=3)
        MerkleLog(store).sign(LOG)
        small_run(store, "run-2")
        MerkleLog(store).sign(LOG)
        return {
            form: export_record(
                store, "run-1", key=LOG, form=form, redact_paths=["$.args.card"]
            ).data
            for form in ("json", "cbor")
        }


EXPORTS = _exports()
FAST = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _resign(data: bytes, change: Any) -> bytes:
    """The record changed by ``change(record)`` and signed again with the right key: what
    an exporter holding the key could produce."""
    loaded = load_record(data)
    record = json.loads(json.dumps(loaded.record))
    change(record)
    return _sign(record, LOG, loaded.form)


def _kinds(data: bytes, keys: list[str] = VK) -> set[str]:
    rep = verify_record(data, keys)
    assert not rep.ok
    assert all(f.detail for f in rep.findings)
    return {f.kind for f in rep.findings}


def test_the_untouched_records_verify() -> None:
    """The baseline: both forms verify."""
    for data in EXPORTS.values():
        assert verify_record(data, VK).ok


@FAST
@given(form=st.sampled_from(["json", "cbor"]), where=st.floats(0, 1), bit=st.integers(0, 7))
def test_any_flipped_bit_is_a_finding(form: str, where: float, bit: int) -> None:
    """Flipping one bit anywhere in the file makes verification fail, naming what."""
    data = bytearray(EXPORTS[form])
    i = min(int(where * len(data)), len(data) - 1)
    data[i] ^= 1 << bit
    kinds = _kinds(bytes(data))
    assert kinds <= {
        "malformed",
        "signature",
        "checkpoint",
        "consistency",
        "sequence",
        "link",
        "payload",
        "inclusion",
        "head",
        "redaction",
        "entries",
        "approval",
    }


@FAST
@given(form=st.sampled_from(["json", "cbor"]), data=st.data())
def test_a_removed_event_is_a_finding_even_when_resigned(form: str, data: st.DataObject) -> None:
    """An event taken out (re-signed by the exporter) breaks the sequence and the links."""
    n = len(load_record(EXPORTS[form]).record["ares-events"]["events"])
    k = data.draw(st.integers(0, n - 2))

    def drop(r: dict[str, Any]) -> None:
        del r["ares-events"]["events"][k]
        r["ares-events"]["head"]["version"] -= 1

    kinds = _kinds(_resign(EXPORTS[form], drop))
    assert "sequence" in kinds and "link" in kinds


@FAST
@given(form=st.sampled_from(["json", "cbor"]), data=st.data())
def test_reordered_events_are_a_finding(form: str, data: st.DataObject) -> None:
    """Two events swapped (re-signed): sequence and link findings name their versions."""
    n = len(load_record(EXPORTS[form]).record["ares-events"]["events"])
    i = data.draw(st.integers(0, n - 2))
    j = data.draw(st.integers(i + 1, n - 1))

    def swap(r: dict[str, Any]) -> None:
        evs = r["ares-events"]["events"]
        evs[i], evs[j] = evs[j], evs[i]

    rep = verify_record(_resign(EXPORTS[form], swap), VK)
    assert {"sequence", "link"} <= {f.kind for f in rep.findings}
    assert i + 1 in {f.version for f in rep.findings}


@pytest.mark.parametrize("form", ["json", "cbor"])
@pytest.mark.parametrize("cut", [1, 2, 5])
def test_a_cut_tail_is_a_finding(form: str, cut: int) -> None:
    """The last events cut off: the head names the cut (and the bytes cut off the file
    end are malformed or unsigned)."""

    def drop_tail(r: dict[str, Any]) -> None:
        del r["ares-events"]["events"][-cut:]

    assert "head" in _kinds(_resign(EXPORTS[form], drop_tail))
    assert _kinds(EXPORTS[form][: -(cut + 1)]) & {"malformed", "signature"}


@pytest.mark.parametrize("form", ["json", "cbor"])
def test_a_swapped_checkpoint_is_a_finding(form: str) -> None:
    """Another validly signed checkpoint of the same log: the proofs do not lead to it."""
    latest = load_record(EXPORTS[form]).record["ares-events"]["latest-checkpoint"]

    def swap(r: dict[str, Any]) -> None:
        r["ares-events"]["checkpoint"] = latest

    assert "inclusion" in _kinds(_resign(EXPORTS[form], swap))

    def consistency(r: dict[str, Any]) -> None:
        r["ares-events"]["consistency"] = r["ares-events"]["consistency"][:-1]

    assert "consistency" in _kinds(_resign(EXPORTS[form], consistency))


@pytest.mark.parametrize("form", ["json", "cbor"])
def test_a_wrong_key_is_a_finding(form: str) -> None:
    """Verifying with another key: the signature and the checkpoint are untrusted."""
    assert {"signature", "checkpoint"} <= _kinds(EXPORTS[form], [OTHER.verifier.text])


@pytest.mark.parametrize("form", ["json", "cbor"])
def test_a_changed_payload_is_named(form: str) -> None:
    """A payload edited (re-signed): the payload finding names its version."""

    def edit(r: dict[str, Any]) -> None:
        ev = r["ares-events"]["events"][2]
        ev["payload"] = ev["payload"].replace("on it", "on IT")

    rep = verify_record(_resign(EXPORTS[form], edit), VK)
    assert [(f.kind, f.version) for f in rep.findings] == [("payload", 3)]


def test_cbor_payload_outside_the_signature_is_a_finding() -> None:
    """The CBOR payload replaced under an intact signature: the signature fails."""
    tag = cbor2.loads(EXPORTS["cbor"])
    protected, unprotected, payload, sig = tag.value
    other = cbor2.loads(EXPORTS["cbor"])
    record = cbor2.loads(payload)
    record["id"] = "another"
    forged = cbor2.dumps(
        cbor2.CBORTag(18, [protected, dict(unprotected), cbor2.dumps(record, canonical=True), sig])
    )
    assert other.tag == 18
    assert _kinds(forged) == {"signature"}


@pytest.mark.parametrize("form", ["json", "cbor"])
@given(extra=st.binary(min_size=1, max_size=64))
@FAST
def test_bytes_after_the_record_are_a_finding(form: str, extra: bytes) -> None:
    """Anything after the record (garbage, a second record) is no part of what was signed:
    the file is malformed, never verified."""
    data = EXPORTS[form]
    for tail in (extra, data):
        assert verify_record(data + tail, VK).ok is (form == "json" and data + tail == data)


def _cose_with(unprotected: bytes) -> bytes:
    """The CBOR record with its unprotected header replaced by the raw bytes given."""
    protected, _unprotected, payload, sig = cbor2.loads(EXPORTS["cbor"]).value
    parts = b"".join(cbor2.dumps(x) for x in (protected,)) + unprotected
    return b"\xd2\x84" + parts + cbor2.dumps(payload) + cbor2.dumps(sig)


def test_an_unprotected_header_that_only_compares_equal_is_a_finding() -> None:
    """The unprotected trace-metadata (unsigned) said twice, with a forged first copy, or
    under the float label 100.0: Python's dict equality would take either for the real
    one; the verifier compares encodings and refuses both."""
    _p, unprotected, _payload, _sig = cbor2.loads(EXPORTS["cbor"]).value
    real = cbor2.dumps(dict(unprotected))
    assert verify_record(_cose_with(real), VK).ok  # the rebuilt file is the genuine one
    forged = cbor2.dumps({"session-id": "EVIL"})
    assert not verify_record(_cose_with(b"\xa2\x18\x64" + forged + real[1:]), VK).ok
    assert not verify_record(_cose_with(b"\xa1\xf9\x56\x40" + real[3:]), VK).ok


def test_json_bytes_other_than_the_signed_ones_are_a_finding() -> None:
    """The JSON form's signed bytes are the record as it stands in the file: a repeated
    key carrying forged content (a parser keeping the first copy shows it), an escape or
    a space the signature does not cover make the file malformed."""
    data = EXPORTS["json"]
    assert verify_record(data, VK).ok and verify_record(data.rstrip(b"\n"), VK).ok
    i = data.index(b'"record":') + len(b'"record":')
    forged = b'{"ares-events":{"stream":"FORGED"},' + data[i + 1 :]
    for bad in (
        data[:i] + forged,
        data[:i] + b" " + data[i:],
        data.replace(b'"run-1"', b'"\\u0072un-1"', 1),
    ):
        assert _kinds(bad) == {"malformed"}


@pytest.mark.parametrize(
    "record",
    [b'{"x": NaN}', b'{"x": Infinity}', b'{"x": "\\ud800"}', b'{"x": ' + b"[" * 100_000],
    ids=["nan", "infinity", "surrogate", "deep"],
)
def test_input_no_json_encoder_takes_is_a_finding(record: bytes) -> None:
    """A record value the canonical encoder refuses, or nesting past the parser's limit,
    is a malformed file (a finding), never an exception."""
    data = b'{"cose_sign1":"","record":' + record + b"}"
    assert _kinds(data) == {"malformed"}


def test_a_deeply_nested_cbor_payload_is_a_finding() -> None:
    """A CBOR record nested past the decoder's depth: malformed, not a crash."""
    protected, unprotected, _payload, sig = cbor2.loads(EXPORTS["cbor"]).value
    deep = b"\x81" * 100_000 + b"\x00"
    forged = cbor2.dumps(cbor2.CBORTag(18, [protected, dict(unprotected), deep, sig]))
    assert _kinds(forged) == {"malformed"}


@pytest.mark.parametrize(
    "damage",
    [
        "DELETE FROM ares_events WHERE stream_id = 'run-1' AND version = "
        "(SELECT max(version) FROM ares_events WHERE stream_id = 'run-1')",
        "UPDATE ares_streams SET version = version - 1 WHERE stream_id = 'run-1'",
        "UPDATE ares_streams SET head_hash = zeroblob(32) WHERE stream_id = 'run-1'",
        "DELETE FROM ares_streams WHERE stream_id = 'run-1'",
    ],
)
def test_a_stream_whose_head_does_not_match_is_not_exported(tmp_path: Any, damage: str) -> None:
    """The store's tail cut or its head row edited: export refuses (ChainIntegrityError,
    nothing written) instead of signing a record of a shorter history, which verified."""
    import sqlite3

    db = tmp_path / "s.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        small_run(store)
        export_record(store, "run-1", key=LOG)  # sound: exported
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
    conn.close()
    with ae.open_store(f"sqlite:///{db}") as store, pytest.raises(ae.ChainIntegrityError):
        export_record(store, "run-1", key=LOG)
