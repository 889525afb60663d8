"""A record (or a disclosure) nested deeper than Python recurses is a finding, or for
``check_disclosures`` a ValueError, never a RecursionError (it was an internal error,
exit 4): in the session's entries, in a payload that matches its chained digest, in an
approval note's body (parsed before its signature is checked)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import blake3
import cbor2
import pytest

import ares_events as ae
from ares_events.cli import main
from ares_events.records import check_disclosures, export_record, verify_record
from tests.records.helpers import LOG, small_run

COSE = base64.b64encode(
    cbor2.dumps(cbor2.CBORTag(18, [b"\xa1\x01\x27", {}, None, b"\0" * 64]), canonical=True)
).decode()


def _canon(v: Any) -> str:
    return json.dumps(v, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _record(events: list[str], types: list[str], entries: str = "[]") -> bytes:
    """An unsigned record in the canonical layout: one event per payload text (each
    matching its header's digest), ``entries`` the session's entries as JSON text."""
    evs = []
    for i, (payload, type_) in enumerate(zip(events, types, strict=True)):
        header: dict[str, Any] = {"at": "2026-01-01T00:00:00Z", "id": "i", "meta": {}}
        header.update(module="journal", payload=blake3.blake3(payload.encode()).hexdigest(), v=1)
        header.update(size=len(payload.encode()), stream="s", type=type_, version=i + 1)
        evs.append({"hash": "00" * 32, "header": _canon(header), "leaf": i, "inclusion": []})
        evs[-1]["payload"] = payload
    head = {"version": len(evs), "hash": "00" * 32}
    ext = {"format": "ares-events-record/1", "stream": "s", "events": evs, "head": head}
    body = _canon({"ares-events": ext, "session": {"entries": "@E@"}}).replace('"@E@"', entries)
    return ('{"cose_sign1":"' + COSE + '","record":' + body + "}\n").encode()


def _nest(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE = {
    "entries": _record([], [], entries=_nest(800)),
    "approved_args": _record(
        ['{"approved":"n","args":' + _nest(800) + ',"args_hash":"x","step":1}'],
        ["tool.call.requested"],
    ),
    "result": _record(['{"idempotency_key":"s:1","result":' + _nest(800) + "}"], ["tool.returned"]),
    "approval_note": _record(
        [_canon({"approval": f"ares-events/approval/v1\n{_nest(5000)}\n\n\u2014 a AAAA\n"})],
        ["run.resumed"],
    ),
}


@pytest.mark.parametrize("where", sorted(HOSTILE))
def test_deep_nesting_is_a_finding(where: str, tmp_path: Path) -> None:
    """verify_record returns findings; the CLI exits 1, not 4."""
    data = HOSTILE[where]
    rep = verify_record(data, [LOG.verifier.text], approvers=[LOG.verifier.text])
    assert not rep.ok and all(f.detail for f in rep.findings)
    path = tmp_path / "deep.json"
    path.write_bytes(data)
    argv = ["verify-record", str(path), "--vkey", LOG.verifier.text, "-q"]
    assert main(argv) == 1
    disclosures = tmp_path / "d.json"
    disclosures.write_text('{"disclosures": []}')
    assert main([*argv, "--disclosures", str(disclosures)]) == 1


def test_a_deep_disclosed_value_does_not_match() -> None:
    """check_disclosures on a disclosed value nested deeper than any stored payload: that
    disclosure does not match, on every Python (none walks it)."""
    with ae.open_store("memory://") as store:
        small_run(store)
        ex = export_record(store, "run-1", key=LOG, redact_paths=["$.args.card"])
    assert ex.disclosures is not None
    item = dict(ex.disclosures["disclosures"][0])
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    item["value"] = deep
    (result,) = check_disclosures(ex.data, {"disclosures": [item]})
    assert result["ok"] is False and "deep" in result["detail"]
    assert verify_record(ex.data, [LOG.verifier.text], disclosures={"disclosures": [item]}).ok
