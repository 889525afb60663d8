"""The CBOR form against the CDDL of draft-birkholz-verifiable-agent-conversations-00
(pycddl), for a journaled run, a redacted and an erased one.

The rules below are reconstructed here, rule by rule, from the draft's section "CDDL
Definitions for Agent Conversations Records" (the draft's own CDDL text is not copied
into this repository). Reconstructed: verifiable-agent-record, session-trace,
agent-meta, recording-agent, the five entry types, token-usage, signed-agent-record,
protected-header, CWT_Claims, unprotected-header and trace-metadata, with the draft's
abstract-timestamp. Left out, because a record never has them: file-attribution and its
types, vcs-context, environment, x5chain/x5t and receipts. One tightening: the signed
payload is checked as a ``verifiable-agent-record`` (the draft says ``bstr``). pycddl 0.6
mis-validates ``.cbor`` inside an array, so the envelope, its protected header and its
payload are validated as three CBOR items, each against its rule; and it tries only the
first alternative of a choice between maps, so ``entry`` (a choice discriminated by
``type``) is checked entry by entry against the alternative its ``type`` names.
No rule is deliberately broken: the ``ares-events`` member and the ``ares-*`` entry
members are the draft's own ``* tstr => any`` extension points.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pycddl  # type: ignore[import-untyped]
import pytest

import ares_events as ae
from ares_events.records import export_record
from tests.records.helpers import LOG, small_run

RECORD_RULES = r"""
verifiable-agent-record = {
    version: tstr
    id: tstr
    session: session-trace
    ? created: abstract-timestamp
    ? recording-agent: recording-agent
    * tstr => any
}
abstract-timestamp = tstr .regexp date-time-regexp / uint
date-time-regexp = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}([.][0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})"
session-id = tstr / bstr
entry-id = tstr
session-trace = {
    ? format: tstr
    session-id: session-id
    ? session-start: abstract-timestamp
    ? session-end: abstract-timestamp
    agent-meta: agent-meta
    entries: [* entry]
    * tstr => any
}
agent-meta = {
    model-id: tstr
    model-provider: tstr
    ? models: [* tstr]
    ? cli-name: tstr
    ? cli-version: tstr
    * tstr => any
}
recording-agent = { name: tstr, ? version: tstr, * tstr => any }
entry = { type: tstr, * tstr => any }  ; each entry: against its alternative, below
message-entry = {
    type: "user" / "assistant"
    ? content: any
    ? timestamp: abstract-timestamp
    ? id: entry-id
    ? model-id: tstr
    ? parent-id: entry-id
    ? token-usage: token-usage
    ? children: [* entry]
    * tstr => any
}
tool-call-entry = {
    type: "tool-call"
    name: tstr
    input: any
    ? call-id: tstr
    ? timestamp: abstract-timestamp
    ? id: entry-id
    ? children: [* entry]
    * tstr => any
}
tool-result-entry = {
    type: "tool-result"
    output: any
    ? call-id: tstr
    ? status: tstr
    ? is-error: bool
    ? timestamp: abstract-timestamp
    ? id: entry-id
    ? children: [* entry]
    * tstr => any
}
reasoning-entry = {
    type: "reasoning"
    content: any
    ? encrypted: tstr
    ? subject: tstr
    ? timestamp: abstract-timestamp
    ? id: entry-id
    ? children: [* entry]
    * tstr => any
}
event-entry = {
    type: "system-event"
    event-type: tstr
    ? data: { * tstr => any }
    ? timestamp: abstract-timestamp
    ? id: entry-id
    ? children: [* entry]
    * tstr => any
}
token-usage = {
    ? input: uint
    ? output: uint
    ? cached: uint
    ? reasoning: uint
    ? total: uint
    ? cost: number
    * tstr => any
}
"""

SIGNED_RULES = (
    r"""
signed-agent-record = #6.18([
    protected: bstr
    unprotected: unprotected-header
    payload: bstr
    signature: bstr
])
unprotected-header = { ? 100 => trace-metadata, * label => any }
trace-metadata = {
    session-id: session-id
    agent-vendor: tstr
    trace-format: tstr
    timestamp-start: abstract-timestamp
    ? timestamp-end: abstract-timestamp
    ? content-hash: tstr
    ? content-hash-alg: tstr
}
label = int / tstr
"""
    + RECORD_RULES
)
PROTECTED_RULES = r"""
protected-header = {
    15 => CWT_Claims
    ? 1 => int
    ? 3 => tstr / uint
    ? 4 => bstr
    * label => any
}
CWT_Claims = { 1 => tstr, 2 => tstr, * label => any }
label = int / tstr
"""


ENTRY_RULES = {
    "user": "message-entry",
    "assistant": "message-entry",
    "tool-call": "tool-call-entry",
    "tool-result": "tool-result-entry",
    "reasoning": "reasoning-entry",
    "system-event": "event-entry",
}


class Schemas:
    """The envelope, its protected header and the record, validated in turn."""

    def __init__(self) -> None:
        self.envelope = pycddl.Schema(SIGNED_RULES)
        self.protected = pycddl.Schema(PROTECTED_RULES)
        self.record = pycddl.Schema(RECORD_RULES)
        self.entries = {
            name: pycddl.Schema(f"start = {name}\n" + RECORD_RULES) for name in ENTRY_RULES.values()
        }

    def validate_cbor(self, data: bytes) -> None:
        import cbor2

        self.envelope.validate_cbor(data)
        protected, _unprotected, payload, _sig = cbor2.loads(data).value
        self.protected.validate_cbor(protected)
        self.record.validate_cbor(payload)
        entries = cbor2.loads(payload)["session"]["entries"]
        assert entries
        for e in entries:
            self.entries[ENTRY_RULES[e["type"]]].validate_cbor(cbor2.dumps(e))


@pytest.fixture(scope="module")
def schema() -> Schemas:
    return Schemas()


@pytest.mark.parametrize("variant", ["plain", "redacted", "erased"])
def test_the_cbor_form_validates_against_the_drafts_cddl(schema: Schemas, variant: str) -> None:
    """A journaled run's CBOR record is a signed-agent-record over a
    verifiable-agent-record."""
    with ae.open_store("memory://") as store:
        small_run(store)
        if variant == "erased":
            ae.erase(store, "run-1", 3, reason="test", by="t")
        redact = ["$..card"] if variant == "redacted" else []
        data = export_record(store, "run-1", key=LOG, form="cbor", redact_paths=redact).data
    schema.validate_cbor(data)


def test_the_schema_is_not_blind(schema: Schemas) -> None:
    """A record missing agent-meta, or an entry of an unknown type, is rejected."""
    import cbor2

    with ae.open_store("memory://") as store:
        small_run(store)
        data = export_record(store, "run-1", key=LOG, form="cbor").data
    tag = cbor2.loads(data)
    protected, unprotected, payload, sig = tag.value
    breaks: list[Callable[[dict[str, Any]], Any]] = [
        lambda r: r["session"].pop("agent-meta"),
        lambda r: r["session"]["entries"][3].pop("name"),
        lambda r: r["session"]["entries"][2]["token-usage"].update(input=-1),
    ]
    for break_it in breaks:
        record = cbor2.loads(payload)
        break_it(record)
        bad = cbor2.dumps(
            cbor2.CBORTag(18, [protected, dict(unprotected), cbor2.dumps(record), sig])
        )
        with pytest.raises(pycddl.ValidationError):
            schema.validate_cbor(bad)
    record = cbor2.loads(payload)
    record["session"]["entries"][0]["type"] = "oops"
    bad = cbor2.dumps(cbor2.CBORTag(18, [protected, dict(unprotected), cbor2.dumps(record), sig]))
    with pytest.raises(KeyError):  # no alternative of entry has that type
        schema.validate_cbor(bad)
