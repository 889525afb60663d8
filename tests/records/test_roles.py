"""verify_record trusts each key for its role only: an approver's key never vouches for the
log or the record's signature, and the session's entries are held to the checked events.
Found by forging: with one flat set of trusted keys, the approver alice could rewrite a
paid call's arguments, build her own Merkle tree, sign its checkpoint as a log named
"alice" and the envelope with her key, and the record verified."""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from typing import Any

import blake3
import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.integrity.notes import SigningKey
from ares_events.records import export_record, verify_record
from ares_events.records.export import _sign
from ares_events.records.verify import canonical, load_record
from tests.records.helpers import LOG, small_run

ALICE = SigningKey.generate("alice")


def _mth(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return leaves[0]
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def _path(m: int, leaves: list[bytes]) -> list[bytes]:
    if len(leaves) == 1:
        return []
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    if m < k:
        return [*_path(m, leaves[:k]), _mth(leaves[k:])]
    return [*_path(m - k, leaves[k:]), _mth(leaves[:k])]


def _forge(data: bytes, by: SigningKey, edit: Any) -> bytes:
    """The record ``data`` with ``edit(record)`` applied, its plain chain relinked, a Merkle
    tree of its own signed as a log named after ``by``, and the envelope signed by ``by``."""
    r = copy.deepcopy(load_record(data).record)
    edit(r)
    ext = r["ares-events"]
    prev = blake3.blake3(b"ares-events/v1\x00" + ext["stream"].encode()).digest()
    for e in ext["events"]:
        h = json.loads(e["header"])
        raw = e["payload"].encode()
        h["payload"], h["size"] = blake3.blake3(raw).hexdigest(), len(raw)
        e["header"] = canonical(h).decode()
        prev = blake3.blake3(prev + e["header"].encode()).digest()
        e["hash"] = prev.hex()
    ext["head"]["hash"] = prev.hex()
    leaves = [hashlib.sha256(b"\x00" + bytes.fromhex(e["hash"])).digest() for e in ext["events"]]
    for i, e in enumerate(ext["events"]):
        e["leaf"] = i
        e["inclusion"] = [base64.b64encode(p).decode() for p in _path(i, leaves)]
    text = f"{by.name}\n{len(leaves)}\n{base64.b64encode(_mth(leaves)).decode()}\n"
    ext["checkpoint"] = text + "\n" + by.signature_line(text.encode())
    ext.pop("latest-checkpoint", None)
    ext.pop("consistency", None)
    return _sign(r, by, "json")


def _ship_more(r: dict[str, Any]) -> None:
    """item-0 becomes item-9, in the evidence and in the draft's view alike."""
    for e in r["ares-events"]["events"]:
        e["payload"] = e["payload"].replace("item-0", "item-9")
    entries = json.loads(json.dumps(r["session"]["entries"]).replace("item-0", "item-9"))
    r["session"]["entries"] = entries


@pytest.fixture
def record() -> bytes:
    with ae.open_store("memory://") as store:
        small_run(store)
        return export_record(store, "run-1", key=LOG).data


def test_an_approvers_key_cannot_sign_for_the_log(record: bytes) -> None:
    """alice's whole-record forgery: refused when alice is trusted as an approver (the
    checkpoint and the envelope need the log's or the signer's key), in the API and the
    CLI; it verifies only for a reader who declares alice a log."""
    forged = _forge(record, ALICE, _ship_more)
    rep = verify_record(forged, [LOG.verifier.text], approvers=[ALICE.verifier.text])
    assert not rep.ok
    assert {f.kind for f in rep.findings} >= {"signature", "checkpoint"}
    assert verify_record(record, [LOG.verifier.text], approvers=[ALICE.verifier.text]).ok
    assert verify_record(forged, [ALICE.verifier.text]).ok  # the reader's own statement


def test_the_cli_keeps_the_roles_apart(record: bytes, tmp_path: Any) -> None:
    forged = tmp_path / "forged.json"
    forged.write_bytes(_forge(record, ALICE, _ship_more))
    log_v, alice_v = tmp_path / "log.vkey", tmp_path / "alice.vkey"
    log_v.write_text(LOG.verifier.text)
    alice_v.write_text(ALICE.verifier.text)
    args = ["verify-record", str(forged), "--vkey", str(log_v), "--approver", str(alice_v)]
    assert main([*args, "--json"]) == 1
    genuine = tmp_path / "genuine.json"
    genuine.write_bytes(record)
    args[1] = str(genuine)
    assert main(args) == 0


def test_entries_that_are_not_the_events_are_a_finding(record: bytes) -> None:
    """The log's own key re-signs a record whose draft entries were edited (the evidence
    untouched): the entries are derived again from the checked events and differ."""

    def edit_view(r: dict[str, Any]) -> None:
        r["session"]["entries"] = json.loads(
            json.dumps(r["session"]["entries"]).replace("item-0", "item-9")
        )

    rep = verify_record(_forge(record, LOG, edit_view), [LOG.verifier.text])
    assert [f.kind for f in rep.findings] == ["entries"]
    dropped = verify_record(
        _forge(record, LOG, lambda r: r["session"]["entries"].pop()), [LOG.verifier.text]
    )
    assert [f.kind for f in dropped.findings] == ["entries"]
    assert verify_record(_forge(record, LOG, lambda r: None), [LOG.verifier.text]).ok


@pytest.mark.parametrize("step", [[1], {"a": 1}, 1.5, None, "1"])
def test_a_step_of_any_type_is_never_a_crash(step: Any, tmp_path: Any) -> None:
    """An event that names an approval request or a call under approval with a step that
    is not an integer: checked like any other (it was a TypeError, exit 4)."""
    with ae.open_store("memory://") as store:
        ae.emit(store, "w", "x.y", "m", {"reason": "approval required", "step": step})
        ae.emit(store, "w", "x.z", "m", {"approved": "abc", "step": step, "name": "pay"})
        data = export_record(store, "w", key=LOG).data
    rep = verify_record(data, [LOG.verifier.text])
    assert [f.kind for f in rep.findings] == ["approval"]  # a nonce nobody granted
    path = tmp_path / "w.json"
    path.write_bytes(data)
    vkey = tmp_path / "log.vkey"
    vkey.write_text(LOG.verifier.text)
    assert main(["verify-record", str(path), "--vkey", str(vkey), "--json"]) == 1
