"""Verifiable records: a journaled run exports (JSON and CBOR) and verifies offline on
memory, SQLite and PostgreSQL; redacted and erased records verify and disclosed values
check; keyed chains, checkpoints that grew, refusals; the verifier imports nothing of
ares-events."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import cbor2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ares_events as ae
from ares_events.chain import ChainKey
from ares_events.errors import ChainIntegrityError, ConfigError, EventNotFound, ProofError
from ares_events.integrity.notes import Note, NoteSignature, SigningKey
from ares_events.projections.merkle import MerkleLog
from ares_events.records import check_disclosures, export_record, verify_record
from ares_events.records import verify as verify_module
from ares_events.records.export import _sign
from ares_events.records.redact import compile_paths, normalized, redact
from tests.fixtures.tier import examples
from tests.records.helpers import LOG, OTHER, small_run

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/r.db"
    return str(request.getfixturevalue("postgres_url"))


@pytest.mark.parametrize("form", ["json", "cbor"])
def test_a_run_exports_and_verifies(url: str, form: str) -> None:
    """A journaled run's record verifies with the log key and maps to the draft's entries."""
    with ae.open_store(url) as store:
        small_run(store)
        ex = export_record(store, "run-1", key=LOG, form=form)
        rep = verify_record(ex.data, [LOG.verifier.text])
    assert rep.ok, rep.findings
    assert (rep.form, rep.stream, rep.events) == (form, "run-1", ex.events)
    record = verify_module.load_record(ex.data).record
    types = [e["type"] for e in record["session"]["entries"]]
    assert types == [
        "system-event",
        "user",
        "assistant",
        "tool-call",
        "tool-result",
        "tool-call",
        "tool-result",
        "system-event",
    ]
    assert record["session"]["agent-meta"]["model-id"] == "gpt-x"
    assert record["session"]["entries"][2]["token-usage"] == {"input": 3, "output": 2, "total": 5}


def test_the_json_form_signs_the_bytes_it_holds() -> None:
    """The JSON file is canonical JSON: the record's bytes stand in it as signed."""
    with ae.open_store("memory://") as store:
        small_run(store)
        data = export_record(store, "run-1", key=LOG).data
    doc = json.loads(data)
    assert data == verify_module.canonical(doc) + b"\n"
    start = data.index(b'"record":') + len(b'"record":')
    assert data[start:-2] == verify_module.canonical(doc["record"])


def test_an_erased_payload_exports_as_erased_and_verifies(tmp_path: Path) -> None:
    """An erased event keeps its header and proof: the record says erased and verifies."""
    with ae.open_store(f"sqlite:///{tmp_path}/e.db") as store:
        small_run(store)
        ae.erase(store, "run-1", 4, reason="gdpr", by="dpo")
        ex = export_record(store, "run-1", key=LOG)
        rep = verify_record(ex.data, [LOG.verifier.text])
    assert rep.ok, rep.findings
    assert rep.erased == 1
    ev = verify_module.load_record(ex.data).record["ares-events"]["events"][3]
    assert ev["erased"] is True and "payload" not in ev


@pytest.mark.parametrize("form", ["json", "cbor"])
def test_a_redacted_record_verifies_and_disclosures_check(form: str) -> None:
    """Redacted fields become salted digests; the record verifies; each disclosed value
    checks against its digest and the rebuilt payload against the chained digest."""
    with ae.open_store("memory://") as store:
        small_run(store)
        ex = export_record(store, "run-1", key=LOG, form=form, redact_paths=["$.args.card"])
        rep = verify_record(ex.data, [LOG.verifier.text])
    assert rep.ok and rep.redacted == 2
    assert b"4242-4242" not in ex.data
    assert ex.disclosures is not None
    checked = check_disclosures(ex.data, ex.disclosures)
    assert checked and all(c["ok"] for c in checked)
    assert [c["path"] for c in checked].count("$") == 2
    # A wrong value, or a wrong salt, does not check.
    bad = json.loads(json.dumps(ex.disclosures))
    bad["disclosures"][0]["value"] = "4242-4243"
    bad["disclosures"][1]["salt"] = "00" * 16
    results = check_disclosures(ex.data, bad)
    assert [r["ok"] for r in results[:2]] == [False, False]


def test_redaction_paths_select_what_they_say() -> None:
    """The JSONPath subset: members, indexes, wildcards, descent; outer selections win."""
    payload = {"a": {"email": "x", "b": [{"email": "y"}, 2]}, "email": "z"}
    _, made = redact(payload, compile_paths(["$..email"]))
    assert sorted(r.path for r in made) == [
        "$['a']['b'][0]['email']",
        "$['a']['email']",
        "$['email']",
    ]
    _, made = redact(payload, compile_paths(["$.a", "$.a.b[1]"]))
    assert [r.path for r in made] == ["$['a']"]
    _, made = redact(payload, compile_paths(["$.a.b[*]"]))
    assert [r.path for r in made] == ["$['a']['b'][0]", "$['a']['b'][1]"]
    for bad in ("a.b", "$.a[?(@.x)]", "$[-1]"):
        with pytest.raises(ConfigError):
            compile_paths([bad])
    assert verify_module.parse_path(normalized(["it's", 3, '\\"q\n'])) == ["it's", 3, '\\"q\n']


@given(name=st.text(max_size=12))
@settings(max_examples=examples(200), deadline=None)
def test_a_quoted_name_selects_the_key_it_spells(name: str) -> None:
    """``--redact`` takes the normalized paths the tool prints (escapes and all), and a
    double-quoted name in JSON's escapes: each selects exactly the key it spells, so a
    key holding ', \\ or ] is redacted, never left in clear."""
    payload = {name: "SECRET", "other": 1}
    for path in (normalized([name]), "$[" + json.dumps(name) + "]"):
        out, made = redact(payload, compile_paths([path]))
        assert [r.path for r in made] == [normalized([name])]
        assert out["other"] == 1 and out[name] != "SECRET"


def test_a_disclosure_of_a_path_the_payload_lacks_does_not_check() -> None:
    """A disclosure naming a path the record lists as redacted but whose redacted payload
    does not hold it: not checked (ok False), never an exception."""
    with ae.open_store("memory://") as store:
        small_run(store)
        ex = export_record(store, "run-1", key=LOG, redact_paths=["$.args.card"])
    assert ex.disclosures is not None
    loaded = verify_module.load_record(ex.data)
    record = json.loads(json.dumps(loaded.record))
    v = next(i for i, e in enumerate(record["ares-events"]["events"], 1) if "redacted" in e)
    record["ares-events"]["events"][v - 1]["redacted"]["paths"].append("$['args']['nope']")
    data = _sign(record, LOG, "json")
    lie = {"disclosures": [{"version": v, "path": "$['args']['nope']", "salt": "00", "value": 1}]}
    assert check_disclosures(data, lie) == [
        {"version": v, "path": "$['args']['nope']", "ok": False, "detail": "not redacted there"}
    ]


def test_a_keyed_chain_verifies_with_its_key_only() -> None:
    """A keyed chain's links are MACs: verified with the key, a finding without it."""
    key = ChainKey(b"k" * 32)
    with ae.open_store("memory://", chain_key=key) as store:
        small_run(store)
        data = export_record(store, "run-1", key=LOG).data
    assert verify_record(data, [LOG.verifier.text], chain_key=key.key).ok
    rep = verify_record(data, [LOG.verifier.text])
    assert [f.kind for f in rep.findings] == ["link"]
    rep = verify_record(data, [LOG.verifier.text], chain_key=b"x" * 32)
    assert {f.kind for f in rep.findings} == {"link"} and len(rep.findings) == rep.events
    # A plain chain's record verifies whatever key is passed (a verifier run with
    # ARES_EVENTS_CHAIN_KEY set for other stores).
    with ae.open_store("memory://") as store:
        small_run(store)
        plain = export_record(store, "run-1", key=LOG).data
    assert verify_record(plain, [LOG.verifier.text], chain_key=key.key).ok


def test_a_later_checkpoint_comes_with_a_consistency_proof() -> None:
    """Proofs are against the first checkpoint covering the stream; the newest one at
    export time is proved consistent with it."""
    with ae.open_store("memory://") as store:
        small_run(store)
        first = MerkleLog(store).sign(LOG)
        small_run(store, "run-2", steps=5)
        MerkleLog(store).sign(LOG)
        ex = export_record(store, "run-1", key=LOG)
    rep = verify_record(ex.data, [LOG.verifier.text])
    assert rep.ok and rep.checkpoint is not None
    assert rep.checkpoint["size"] == first.checkpoint.size
    assert rep.checkpoint["latest_size"] > first.checkpoint.size
    ext = verify_module.load_record(ex.data).record["ares-events"]
    assert ext["consistency"]


def test_export_refuses_what_it_cannot_prove() -> None:
    """No stream, a damaged chain, or no checkpoint and a key that is not the log's."""
    with ae.open_store("memory://") as store:
        with pytest.raises(EventNotFound):
            export_record(store, "nope", key=LOG)
        small_run(store)
        MerkleLog(store).sign(LOG)
        small_run(store, "run-2")
        with pytest.raises(ProofError, match="no stored checkpoint"):
            export_record(store, "run-2", key=SigningKey.generate("exporter"))
        with pytest.raises(ConfigError):
            export_record(store, "run-1", key=LOG, form="xml")


def test_export_refuses_a_rewritten_chain(tmp_path: Path) -> None:
    """A payload rewritten behind the store's back: export raises, signs nothing."""
    from tests.integrations.fw_helpers import tamper_sqlite

    db = tmp_path / "t.db"
    with ae.open_store(f"sqlite:///{db}") as store:
        small_run(store)
    tamper_sqlite(db, "item-0", "item-9")
    with ae.open_store(f"sqlite:///{db}") as store, pytest.raises(ChainIntegrityError):
        export_record(store, "run-1", key=LOG)


def test_the_wrong_key_or_a_rotated_log_key_is_a_finding() -> None:
    """Another key of the same name: signature and checkpoint findings, not ok."""
    with ae.open_store("memory://") as store:
        small_run(store)
        data = export_record(store, "run-1", key=LOG).data
    rep = verify_record(data, [OTHER.verifier.text])
    assert {f.kind for f in rep.findings} == {"signature", "checkpoint"}
    assert not rep.ok


@pytest.mark.parametrize("form", ["json", "cbor"])
def test_a_checkpoint_not_signed_by_its_origin_is_a_finding(tmp_path: Path, form: str) -> None:
    """A record whose checkpoint carries only the signature of another trusted key (here
    the exporter's own, re-signing the record) does not verify: only the log's key, named
    as the checkpoint's origin, vouches for its tree."""
    exporter = SigningKey.generate("exporter.example/records")
    with ae.open_store(f"sqlite:///{tmp_path}/r.db") as store:
        small_run(store)
        MerkleLog(store).sign(LOG)
        data = export_record(store, "run-1", key=exporter, form=form).data
    keys = [LOG.verifier.text, exporter.verifier.text]
    assert verify_record(data, keys).ok
    loaded = verify_module.load_record(data)
    record = json.loads(json.dumps(loaded.record))
    text = Note.parse(record["ares-events"]["checkpoint"]).text
    line = NoteSignature(exporter.name, exporter.signature(text.encode()))
    record["ares-events"]["checkpoint"] = Note(text, (line,)).format()
    rep = verify_record(_sign(record, exporter, form), keys)
    assert not rep.ok
    found = [f.detail for f in rep.findings if f.kind == "checkpoint"]
    assert found and "origin 'example.com/log'" in found[0]


def test_a_malformed_verifier_key_is_not_repeated() -> None:
    """A secret passed where a verifier key belongs is refused without being repeated."""
    secret = "9f" * 32
    with pytest.raises(ValueError, match="not a verifier key") as info:
        verify_record(b"{}", [secret])
    assert secret[:8] not in str(info.value)


def test_the_verifier_imports_nothing_of_ares_events() -> None:
    """verify.py can be vendored: stdlib, cryptography, blake3 and cbor2 only."""
    tree = ast.parse(Path(verify_module.__file__).read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            roots.add((node.module or "").split(".")[0])
    import sys

    third = {r for r in roots if r not in sys.stdlib_module_names}
    assert third == {"blake3", "cryptography", "cbor2"}


def test_the_cose_envelope_is_what_pycose_reads() -> None:
    """The CBOR form's COSE_Sign1 has the draft's headers: EdDSA, kid, CWT claims, and
    trace-metadata whose content-hash is the payload's SHA-256."""
    import hashlib

    with ae.open_store("memory://") as store:
        small_run(store)
        data = export_record(store, "run-1", key=LOG, form="cbor").data
    tag = cbor2.loads(data)
    assert tag.tag == 18
    protected, unprotected, payload, _sig = tag.value
    hdr = cbor2.loads(protected)
    assert hdr[1] == -8 and hdr[4] == f"{LOG.name}+{LOG.verifier.key_id.hex()}".encode()
    assert hdr[15] == {1: LOG.name, 2: "run-1"}
    assert unprotected[100]["content-hash"] == hashlib.sha256(payload).hexdigest()


def test_a_deeply_nested_disclosures_file_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify-record --disclosures on JSON nested deeper than the parser goes: exit 2
    naming the file (it was an internal error, exit 4)."""
    from ares_events.cli import main

    with ae.open_store("memory://") as store:
        small_run(store)
        ex = export_record(store, "run-1", key=LOG, redact_paths=["$.args.card"])
    record, deep = tmp_path / "run.record", tmp_path / "deep.json"
    record.write_bytes(ex.data)
    deep.write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    argv = ["verify-record", str(record), "--vkey", LOG.verifier.text]
    assert main([*argv, "--disclosures", str(deep)]) == 2
    err = capsys.readouterr().err
    assert "deep.json" in err and "internal error" not in err
