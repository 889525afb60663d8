"""Verify an exported record offline: no store, no network, no other ares-events module (over
800 lines because it is the one file an auditor vendors whole).

It imports only the standard library, ``cryptography``, ``blake3`` and ``cbor2`` (CBOR
form): copy it into another code base and it works unchanged. ``docs/records.md``
specifies the format and every check; each failure is a finding naming what failed.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Final

import blake3
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "COSE_ALG_EDDSA",
    "RECORD_FORMAT",
    "REDACTED",
    "RecordFinding",
    "RecordReport",
    "check_disclosures",
    "load_record",
    "parse_path",
    "redaction_digest",
    "trace_metadata",
    "verify_record",
]

RECORD_FORMAT: Final = "ares-events-record/1"
"""The ``format`` of the record's ``ares-events`` member."""
REDACTED: Final = "_ares_redacted"
"""A redacted value becomes ``{"_ares_redacted": "<64 hex: blake3(salt || value)>"}``."""
APPROVAL_PREFIX: Final = "ares-events/approval/v1"
"""First line of a signed approval note."""
COSE_ALG_EDDSA: Final = -8
TRACE_FORMAT: Final = "ietf-vac-v3.0"
_GENESIS: Final = b"ares-events/v1\x00"
_EM_DASH: Final = "\u2014"
_KEY_ED25519: Final = 0x01


def canonical(value: Any) -> bytes:
    """The chain's canonical JSON (format v1): Python's ``json.dumps`` with sorted keys,
    no spaces, UTF-8, no NaN."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def redaction_digest(salt: bytes, value: Any) -> str:
    """``blake3(salt || canonical(value))`` in hex: what a redacted field becomes."""
    return blake3.blake3(salt + canonical(value)).hexdigest()


@dataclass(frozen=True, slots=True)
class RecordFinding:
    """One failed check: what (``kind``), where (``version`` of the event, if any), why."""

    kind: str
    detail: str
    version: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"kind": self.kind, "version": self.version, "detail": self.detail}


@dataclass(slots=True)
class RecordReport:
    """What :func:`verify_record` found. ``ok`` only when there is no finding at all."""

    findings: list[RecordFinding] = field(default_factory=list)
    stream: str | None = None
    form: str | None = None
    """``"cbor"`` or ``"json"``."""
    events: int = 0
    redacted: int = 0
    erased: int = 0
    signed_by: str | None = None
    checkpoint: dict[str, Any] | None = None
    approvals: list[dict[str, Any]] = field(default_factory=list)
    """Each signed approval: ``version``, ``signed_by``, ``step``, ``action``, and
    ``unchecked`` (what a redaction kept from being checked), if any."""

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return not self.findings

    def add(self, kind: str, detail: str, version: int | None = None) -> None:
        """Record a finding."""
        self.findings.append(RecordFinding(kind, detail, version))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "findings"}
        return {"ok": self.ok, **rest, "findings": [f.to_dict() for f in self.findings]}


class _Malformed(ValueError):
    """The input is not a record at all (reported as one ``malformed`` finding)."""


# Keys and signed notes: C2SP signed-note, Ed25519.
@dataclass(frozen=True, slots=True)
class _Key:
    name: str
    key_id: bytes
    public: bytes

    @property
    def label(self) -> str:
        return f"{self.name}+{self.key_id.hex()}"


def _b64(text: str) -> bytes:
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise ValueError("not standard base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        raise ValueError("not canonical base64")
    return raw


def _parse_key(text: str) -> _Key:
    """``<name>+<8 hex key id>+<base64(0x01 || 32-byte Ed25519 public key)>``."""
    parts = text.strip().split("+", 2)
    if len(parts) != 3:
        # Never the text itself: a secret given by mistake would end up in the report.
        raise ValueError("not a verifier key (<name>+<8 hex digits>+<base64 key>)")
    name, hex_id, b64 = parts
    raw = _b64(b64)
    if len(raw) != 33 or raw[0] != _KEY_ED25519:
        raise ValueError(f"verifier key {name!r} is not an Ed25519 (type 0x01) key")
    kid = hashlib.sha256(name.encode("utf-8") + b"\n" + raw).digest()[:4]
    if hex_id.lower() != kid.hex():
        raise ValueError(f"verifier key {name!r}: its key ID does not match the key")
    return _Key(name, kid, raw[1:])


def _ed25519_ok(public: bytes, signature: bytes, message: bytes) -> bool:
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


def _open_note(note: str, keys: Sequence[_Key]) -> tuple[str, list[str]]:
    """The text of a signed note and the trusted keys that signed it (ValueError: not
    signed by a trusted key, or a trusted key's signature fails)."""
    cut = note.rfind("\n\n")
    if cut < 0 or not note.endswith("\n"):
        raise ValueError("not a signed note")
    text, block = note[: cut + 1], note[cut + 2 : -1]
    signed: list[str] = []
    seen: list[str] = []
    for line in block.split("\n"):
        if not line.startswith(_EM_DASH + " "):
            raise ValueError("malformed signature line")
        name, _, b64 = line[2:].partition(" ")
        raw = _b64(b64)
        seen.append(f"{name}+{raw[:4].hex()}")
        for k in keys:
            if k.name == name and k.key_id == raw[:4]:
                if len(raw) != 68 or not _ed25519_ok(k.public, raw[4:], text.encode("utf-8")):
                    raise ValueError(f"the signature of {k.label} does not verify")
                signed.append(k.label)
    if not signed:
        raise ValueError(f"signed by {', '.join(seen)}: none of them is a trusted key")
    return text, signed


def _checkpoint(note: str, keys: Sequence[_Key]) -> tuple[str, int, bytes, list[str]]:
    """(origin, size, root, trusted signers) of a signed checkpoint note; a trusted key
    named as its origin must be among the signers."""
    text, signers = _open_note(note, keys)
    lines = text[:-1].split("\n")
    if len(lines) < 3 or not re.fullmatch(r"0|[1-9][0-9]{0,18}", lines[1]):
        raise ValueError("not a checkpoint")
    # Only the log's own key vouches for its tree: the record's signer, or any other
    # trusted key, must not be able to sign a checkpoint in the log's name.
    if not any(k.name == lines[0] and k.label in signers for k in keys):
        raise ValueError(f"no trusted key of its origin {lines[0]!r} signed it")
    root = _b64(lines[2])
    if len(root) != 32:
        raise ValueError("a checkpoint root is 32 bytes")
    return lines[0], int(lines[1]), root, signers


# RFC 9162 Merkle proofs (SHA-256).
def _leaf(data: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + data).digest()


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _walk(fn: int, sn: int, fr: bytes, path: Sequence[bytes]) -> tuple[bytes, bytes] | None:
    """The walk both RFC 9162 verifications share: ``(fr, sr)`` (None: wrong length)."""
    sr = fr
    for c in path:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            fr, sr = _node(c, fr), _node(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = _node(sr, c)
        fn >>= 1
        sn >>= 1
    return (fr, sr) if sn == 0 else None


def inclusion_root(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes | None:
    """The root RFC 9162 section 2.1.3.2 computes from an inclusion proof (None: the proof
    cannot be one for this index and size)."""
    got = _walk(index, size - 1, leaf, path) if 0 <= index < size else None
    return None if got is None else got[1]


def consistency_ok(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 section 2.1.4.2: the tree ``new_size``/``new_root`` extends
    ``old_size``/``old_root``."""
    if not 0 < old_size <= new_size:
        return False
    if old_size == new_size:
        return not proof and old_root == new_root
    path = list(proof)
    if not path:
        return False
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    return _walk(fn, sn, path[0], path[1:]) == (old_root, new_root)


# JSONPath normalized paths: RFC 9535 section 2.7.
_ESCAPES: Final = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "'": "'", "\\": "\\"}


def parse_path(path: str) -> list[str | int]:
    """The steps of a normalized path such as ``$['args']['card'][0]``.

    Raises:
        ValueError: not a normalized path.
    """
    if not path.startswith("$"):
        raise ValueError(f"{path!r} is not a normalized path")
    steps: list[str | int] = []
    i, n = 1, len(path)
    while i < n:
        if path.startswith("['", i):
            i += 2
            out = []
            while i < n and path[i] != "'":
                ch = path[i]
                if ch == "\\":
                    nxt = path[i + 1 : i + 2]
                    if nxt == "u":
                        out.append(chr(int(path[i + 2 : i + 6], 16)))
                        i += 6
                        continue
                    if nxt not in _ESCAPES:
                        raise ValueError(f"{path!r}: bad escape")
                    out.append(_ESCAPES[nxt])
                    i += 2
                    continue
                out.append(ch)
                i += 1
            if not path.startswith("']", i):
                raise ValueError(f"{path!r}: unterminated name")
            steps.append("".join(out))
            i += 2
        elif path.startswith("[", i):
            j = path.find("]", i)
            digits = path[i + 1 : j] if j > 0 else ""
            if not re.fullmatch(r"0|[1-9][0-9]*", digits):
                raise ValueError(f"{path!r}: bad index")
            steps.append(int(digits))
            i = j + 1
        else:
            raise ValueError(f"{path!r} is not a normalized path")
    return steps


def _at(value: Any, steps: Sequence[str | int]) -> Any:
    for s in steps:
        if isinstance(s, int):
            if not isinstance(value, list) or s >= len(value):
                raise KeyError(s)
        elif not isinstance(value, dict) or s not in value:
            raise KeyError(s)
        value = value[s]
    return value


def _placeholder(value: Any) -> str | None:
    """The digest of a redaction placeholder (None: not one)."""
    d = value.get(REDACTED) if isinstance(value, dict) and len(value) == 1 else None
    return d if isinstance(d, str) and re.fullmatch(r"[0-9a-f]{64}", d) else None


@dataclass(slots=True)
class _Loaded:
    record: dict[str, Any]
    form: str
    signed: bytes
    """The bytes the signature covers (the COSE payload)."""
    protected: bytes
    unprotected: Mapping[Any, Any]
    signature: bytes


def _plain(x: Any) -> Any:
    """cbor2 decodes inside tags to immutable containers: back to dicts and lists."""
    if isinstance(x, Mapping):
        return {k: _plain(v) for k, v in x.items()}
    return [_plain(v) for v in x] if isinstance(x, list | tuple) else x


def _cose(raw: Any) -> tuple[bytes, Mapping[Any, Any], Any, bytes]:
    tag = getattr(raw, "tag", None)
    value = getattr(raw, "value", None)
    if tag != 18 or not isinstance(value, Sequence) or len(value) != 4:
        raise _Malformed("not a COSE_Sign1 (CBOR tag 18 of four items)")
    protected, unprotected, payload, signature = value
    if not isinstance(protected, bytes) or not isinstance(signature, bytes):
        raise _Malformed("COSE_Sign1: the protected header and signature must be bytes")
    if not isinstance(unprotected, Mapping):
        raise _Malformed("COSE_Sign1: the unprotected header must be a map")
    return protected, unprotected, payload, signature


def _no_constant(name: str) -> Any:
    raise _Malformed(f"not JSON: {name} is not a JSON number")


def _cbor_file(data: bytes, what: str, *, canonical: bool = True) -> Any:
    """The CBOR item ``data`` holds, exactly as the exporter encodes it (RFC 8949's
    deterministic form if ``canonical``, else pycose's): trailing bytes, a repeated map
    key or a longer encoding could carry content no signature covers."""
    import cbor2

    try:
        raw = cbor2.loads(data)
        again = cbor2.dumps(raw, canonical=canonical)
    except Exception as exc:  # any decoding failure: malformed
        raise _Malformed(f"{what}: {exc}") from None
    if again != data:
        raise _Malformed(f"{what}: not one item in the encoding export writes")
    return raw


def load_record(data: bytes) -> _Loaded:
    """Parse a record file, JSON or CBOR form (nothing is verified yet).

    Raises:
        ValueError: not a record file.
    """
    if data[:1] in (b"{", b" ", b"\n", b"\t", b"\r"):
        try:
            doc = json.loads(data, parse_constant=_no_constant)
            record = doc.get("record") if isinstance(doc, dict) else None
            if not isinstance(record, dict) or not isinstance(doc.get("cose_sign1"), str):
                raise _Malformed("a JSON record file is an object with 'record' and 'cose_sign1'")
            signed = canonical(record)
        except (ValueError, RecursionError) as exc:  # _Malformed included
            detail = str(exc) if isinstance(exc, _Malformed) else f"not JSON: {exc}"
            raise _Malformed(detail) from None
        # The signed bytes are the record's canonical JSON as it stands in the file, which
        # is exactly the layout export writes: no other bytes (a repeated key, an escape,
        # a space) can show a reader content that differs from what was signed.
        layout = b'{"cose_sign1":"' + doc["cose_sign1"].encode() + b'","record":' + signed + b"}"
        if data not in (layout, layout + b"\n"):
            raise _Malformed("the JSON form is not the canonical layout export writes")
        try:
            cose = _b64(doc["cose_sign1"])
        except ValueError:
            raise _Malformed("'cose_sign1' is not base64") from None
        raw = _cbor_file(cose, "'cose_sign1' is not CBOR")
        protected, unprotected, payload, signature = _cose(raw)
        if payload is not None:
            raise _Malformed("the JSON form's COSE_Sign1 has a detached (null) payload")
        return _Loaded(record, "json", signed, protected, _plain(unprotected), signature)
    raw = _cbor_file(data, "neither JSON nor CBOR", canonical=False)
    protected, unprotected, payload, signature = _cose(raw)
    if not isinstance(payload, bytes):
        raise _Malformed("the CBOR form's COSE_Sign1 carries the record as its payload")
    try:
        record = _plain(_cbor_file(payload, "the COSE payload is not CBOR"))
    except RecursionError:
        raise _Malformed("the COSE payload is nested too deeply") from None
    if not isinstance(record, dict):
        raise _Malformed("the COSE payload is not a record (a map)")
    return _Loaded(record, "cbor", payload, protected, _plain(unprotected), signature)


def _check_signature(loaded: _Loaded, keys: Sequence[_Key], rep: RecordReport) -> None:
    import cbor2

    try:
        hdr = _plain(cbor2.loads(loaded.protected))
    except Exception:  # any decoding failure: malformed
        rep.add("signature", "the COSE protected header is not CBOR")
        return
    if not isinstance(hdr, dict) or hdr.get(1) != COSE_ALG_EDDSA:
        rep.add("signature", "the COSE algorithm is not EdDSA (-8)")
        return
    kid = hdr.get(4)
    label = kid.decode("utf-8", "replace") if isinstance(kid, bytes) else None
    key = next((k for k in keys if k.label == label), None)
    if key is None:
        rep.add("signature", f"signed by {label!r}, which is not a trusted key")
        return
    # Sig_structure of RFC 9052 section 4.4: ["Signature1", protected, external_aad, payload]
    to_be_signed = cbor2.dumps(["Signature1", loaded.protected, b"", loaded.signed])
    if not _ed25519_ok(key.public, loaded.signature, to_be_signed):
        rep.add("signature", f"the COSE_Sign1 signature of {key.label} does not verify")
        return
    rep.signed_by = key.label
    # The unprotected header is not signed: it must say exactly what the record says,
    # compared as encoded (Python's == takes 100.0 and True for 100 and 1).
    want = {100: trace_metadata(loaded.record, loaded.signed)}
    if cbor2.dumps(dict(loaded.unprotected), canonical=True) != cbor2.dumps(want, canonical=True):
        rep.add("signature", "the unprotected trace-metadata is not the record's")


def trace_metadata(record: Mapping[str, Any], signed: bytes) -> dict[str, Any]:
    """The draft's trace-metadata (COSE unprotected header 100) of ``record``, whose
    signed bytes are ``signed``: what the exporter writes and the verifier expects."""
    found = record.get("session")
    session: dict[str, Any] = found if isinstance(found, dict) else {}
    agent = session.get("agent-meta")
    meta: dict[str, Any] = agent if isinstance(agent, dict) else {}
    return {
        "session-id": session.get("session-id"),
        "agent-vendor": meta.get("model-provider"),
        "trace-format": TRACE_FORMAT,
        "timestamp-start": session.get("session-start"),
        "timestamp-end": session.get("session-end"),
        "content-hash": hashlib.sha256(signed).hexdigest(),
        "content-hash-alg": "sha-256",
    }


def _hashes(items: Any, what: str) -> list[bytes]:
    if not isinstance(items, list) or len(items) > 64:
        raise ValueError(f"{what} is not a list of at most 64 hashes")
    out = [_b64(h) if isinstance(h, str) else b"" for h in items]
    if any(len(h) != 32 for h in out):
        raise ValueError(f"{what} holds something that is not a base64 32-byte hash")
    return out


def _check_checkpoints(
    ext: Mapping[str, Any], keys: Sequence[_Key], rep: RecordReport
) -> tuple[int, bytes] | None:
    """Verify the checkpoint (and the newest one with the consistency proof); return the
    (size, root) the inclusion proofs are checked against (None: no usable checkpoint)."""
    try:
        origin, size, root, signers = _checkpoint(str(ext.get("checkpoint", "")), keys)
    except ValueError as exc:
        rep.add("checkpoint", f"the checkpoint does not verify: {exc}")
        return None
    rep.checkpoint = {"origin": origin, "size": size, "signed_by": signers}
    latest = ext.get("latest-checkpoint")
    if latest is not None:
        try:
            lorigin, lsize, lroot, _ = _checkpoint(str(latest), keys)
            proof = _hashes(ext.get("consistency"), "the consistency proof")
        except ValueError as exc:
            rep.add("consistency", f"the newest checkpoint does not verify: {exc}")
            return size, root
        if lorigin != origin:
            rep.add("consistency", f"the newest checkpoint is of log {lorigin!r}, not {origin!r}")
        elif not consistency_ok(size, lsize, root, lroot, proof):
            rep.add(
                "consistency",
                f"the consistency proof does not show size {lsize} extends size {size}",
            )
        else:
            rep.checkpoint["latest_size"] = lsize
    return size, root


def _check_event(
    i: int,
    ev: Any,
    stream: str,
    prev: bytes,
    chain_key: bytes | None,
    check_links: bool,
    tree: tuple[int, bytes] | None,
    last_leaf: int,
    rep: RecordReport,
) -> tuple[bytes, int, dict[str, Any], dict[str, Any] | None]:
    """Check one event's evidence; return its hash, its leaf index, its header (``{}``:
    not parseable) and its payload as recorded (None: erased or not parseable)."""
    version = i + 1
    if not isinstance(ev, dict) or not isinstance(ev.get("header"), str):
        rep.add("sequence", f"event #{version} has no header", version)
        return prev, last_leaf, {}, None
    header = ev["header"].encode("utf-8")
    try:
        h = json.loads(header)
        claimed = bytes.fromhex(ev.get("hash", ""))
    except (ValueError, TypeError, RecursionError):
        rep.add("sequence", f"event #{version}: its header or hash does not parse", version)
        return prev, last_leaf, {}, None
    if not isinstance(h, dict) or h.get("v") != 1:
        rep.add("sequence", f"event #{version}: not a format v1 header", version)
        return claimed, last_leaf, {}, None
    if h.get("stream") != stream:
        rep.add("sequence", f"event #{version} is of stream {h.get('stream')!r}", version)
    if h.get("version") != version:
        rep.add(
            "sequence",
            f"event #{version} is version {h.get('version')!r}: events are missing, "
            "duplicated or out of order",
            version,
        )
    link = blake3.blake3() if chain_key is None else blake3.blake3(key=chain_key)
    link.update(prev + header)
    if check_links and link.digest() != claimed:
        rep.add(
            "link",
            f"version {h.get('version')}: the header does not hash to the recorded "
            "hash from the previous one (changed, or an event before it is missing)",
            version,
        )
    payload: dict[str, Any] | None = None
    if "payload" in ev:
        text = ev["payload"]
        data = text.encode("utf-8") if isinstance(text, str) else b""
        if blake3.blake3(data).hexdigest() != h.get("payload") or len(data) != h.get("size"):
            rep.add("payload", f"version {version}: the payload is not the one chained", version)
        else:
            try:
                payload = {"value": json.loads(data)}
            except (ValueError, RecursionError):
                rep.add("payload", f"version {version}: the payload is not JSON", version)
    elif ev.get("erased") is True:
        rep.erased += 1
    elif isinstance(ev.get("redacted"), dict):
        rep.redacted += 1
        _check_redacted(version, ev["redacted"], rep)
        payload = {"value": ev["redacted"].get("payload"), "redacted": True}
    else:
        rep.add("payload", f"version {version}: no payload, erasure or redaction", version)
    leaf = ev.get("leaf")
    if type(leaf) is not int or leaf <= last_leaf:
        rep.add("sequence", f"version {version}: its log leaf is not after the previous", version)
        leaf = last_leaf
    elif tree is not None:
        try:
            path = _hashes(ev.get("inclusion"), "the inclusion proof")
            got = inclusion_root(leaf, tree[0], _leaf(claimed), path)
        except ValueError:
            got = None
        if got != tree[1]:
            rep.add(
                "inclusion",
                f"version {version}: the inclusion proof of leaf {leaf} does not lead to the "
                f"root of the checkpoint (size {tree[0]})",
                version,
            )
    return claimed, leaf, h, payload


def _check_redacted(version: int, red: Mapping[str, Any], rep: RecordReport) -> None:
    paths = red.get("paths")
    if not isinstance(paths, list) or not paths:
        rep.add("redaction", f"version {version}: a redaction lists no paths", version)
        return
    for p in paths:
        try:
            found = _at(red.get("payload"), parse_path(str(p)))
        except (ValueError, KeyError):
            found = None
        if _placeholder(found) is None:
            rep.add("redaction", f"version {version}: {p} is not a redacted value", version)


def _approval_body(note: str) -> dict[str, Any]:
    text = note[: note.rfind("\n\n") + 1] if "\n\n" in note else ""
    lines = text.split("\n")
    if len(lines) != 3 or lines[0] != APPROVAL_PREFIX:
        raise ValueError("not an approval note")
    try:
        body = json.loads(lines[1])
    except RecursionError:  # parsed before its signature is checked: any text may come
        body = None
    if not isinstance(body, dict):
        raise ValueError("not an approval note")
    return body


def _parse_time(text: Any) -> datetime | None:
    for layout in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"):
        try:
            return datetime.strptime(str(text).replace("Z", "+00:00"), layout)
        except ValueError:
            continue
    return None


_MAX_DEPTH: Final = 200
"""No stored payload nests deeper (the store refuses it): a deeper disclosed value is
refused before anything walks it, the same on every Python (their recursion differs)."""


def _nodes(value: Any) -> Iterator[tuple[Any, int]]:
    """Every value inside ``value`` with its depth, walked without recursion."""
    todo = [(value, 0)]
    while todo:
        v, depth = todo.pop()
        yield v, depth
        items = v.values() if isinstance(v, dict) else v if isinstance(v, list) else ()
        todo.extend((x, depth + 1) for x in items)


_VEILED: Final = object()
"""A payload member that holds a redacted value (so the checks that need it are not made)."""


def _hides(value: Any) -> bool:
    """Whether a redaction placeholder is anywhere in ``value``."""
    return any(_placeholder(v) is not None for v, _ in _nodes(value))


def _terms(type_: Any, value: Mapping[str, Any]) -> tuple[Any, Any]:
    """The ``action`` and ``outcome`` of an approval carried by an event, as the library
    signs and checks them (``runs resolve|resume``): ``result`` with the digest of the
    result a ``tool.returned`` records, ``not_done`` on a ``tool.call.not_done``, and
    ``approve`` on any other event (the call that consumes it is checked there)."""
    if type_ == "tool.call.not_done":
        return "not_done", None
    if type_ != "tool.returned" or value.get("error") not in (None, _VEILED):
        return "approve", None
    if _VEILED in (value.get("error"), value.get("result")):
        return "result", _VEILED
    try:
        return "result", blake3.blake3(canonical(value.get("result"))).hexdigest()
    except (ValueError, TypeError):
        return "result", ""  # no note names it


def _unchecked(entry: dict[str, Any] | None, names: set[str]) -> None:
    if entry is not None and names:
        entry["unchecked"] = sorted(names.union(entry.get("unchecked", ())))


def _check_approvals(
    stream: str,
    events: list[tuple[int, dict[str, Any], bytes, dict[str, Any] | None]],
    keys: Sequence[_Key],
    rep: RecordReport,
) -> None:
    """Every signed approval an event carries (``payload.approval``), as the library
    accepts one: signed by the key it names, of this run, after the head it names, not
    expired, a nonce named once, and of the event: a ``tool.returned`` carries the
    ``result`` of the result it records, a ``tool.call.not_done`` the ``not_done``, each
    of the call it settles (that request's ``step`` and ``args_hash``); any other event an
    ``approve``. A consumed nonce (``payload.approved``) names an approval made before it
    in this run, of this very call (its ``step`` and ``args_hash``, where the event names
    them), whose arguments hash to that ``args_hash`` and whose tool is the one the
    approval request named. A check that needs a redacted value is not made: the
    approval's ``unchecked`` names it (``approval``: the note; ``use``: the call that used
    it may be one whose nonce is redacted)."""
    first: dict[str, int] = {}  # nonce -> the version of the first note naming it
    notes: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # nonce -> (body, entry)
    consumed: set[str] = set()
    asked: dict[int, Any] = {}  # step -> the tool name its approval request showed
    calls: dict[str, tuple[Any, Any]] = {}  # idempotency key -> (step, args_hash) requested
    veiled: set[str] = set()  # payload members a redaction hid so far; "*": a whole payload
    for version, header, prev, payload in events:
        value = payload.get("value") if payload else None
        if payload and payload.get("redacted"):
            if not isinstance(value, dict):
                veiled.add("*")
                continue
            value = {k: _VEILED if _hides(x) else x for k, x in value.items()}
            veiled.update(k for k, x in value.items() if x is _VEILED)
        if not isinstance(value, dict):
            continue
        step = value.get("step")
        step = step if type(step) is int else None  # a forged step of any other type
        if value.get("reason") == "approval required" and step is not None:
            asked[step] = value.get("name")
        key = value.get("idempotency_key")
        if header.get("type") == "tool.call.requested" and isinstance(key, str):
            calls[key] = (value.get("step"), value.get("args_hash"))
        used = value.get("approved")
        if isinstance(used, str):
            runs = f"version {version} runs a call under approval"
            problems = []  # each completes the sentence `runs` begins
            unchecked: set[str] = set()
            ah = value.get("args_hash")
            if "args" in value and _VEILED in (ah, value["args"]):
                unchecked.add("args")
            elif "args" in value:
                try:
                    if blake3.blake3(canonical(value["args"])).hexdigest() != ah:
                        problems.append(": its arguments do not hash to the args_hash approved")
                except (ValueError, TypeError):
                    problems.append(": its arguments are not canonical JSON")
            name, want = value.get("name"), None if step is None else asked.get(step)
            if name is not None and _VEILED in (name, want, value.get("step")):
                unchecked.add("name")
            elif name is not None and want is None and veiled & {"*", "reason", "step"}:
                unchecked.add("name")  # its request may be among the redacted
            elif name is not None and want is not None and name != want:
                problems.append(f": it calls {name!r} where the approval request named {want!r}")
            body, entry = notes.get(used, ({}, None))
            if used in consumed or (not body and not veiled & {"*", "approval"}):
                problems.append(
                    f" nonce {used[:12]}, which no earlier event grants or an earlier call "
                    "already used"
                )
            call = {"action": "approve", "step": value.get("step"), "args": ah}
            unchecked |= {k for k, v in call.items() if body and v is _VEILED}
            wrong = [k for k, v in call.items() if body and v not in (None, _VEILED, body.get(k))]
            if wrong:
                problems.append(
                    f" nonce {used[:12]}, whose {', '.join(wrong)} differ from that call's"
                )
            for p in problems:
                rep.add("approval", runs + p, version)
            _unchecked(entry, unchecked)
            consumed.add(used)
        note = value.get("approval")
        if note is _VEILED:
            rep.approvals.append({"version": version, "unchecked": ["approval"]})
            continue
        if not isinstance(note, str):
            continue
        seen: dict[str, Any] = {"version": version}
        rep.approvals.append(seen)
        try:
            body = _approval_body(note)
            if isinstance(body.get("nonce"), str):
                first.setdefault(body["nonce"], version)  # granted or not: named once
                notes.setdefault(body["nonce"], (body, seen))
            _, signers = _open_note(note, keys)
        except ValueError as exc:
            rep.add("approval", f"version {version}: the approval does not verify: {exc}", version)
            continue
        seen.update(signed_by=signers, step=body.get("step"), action=body.get("action"))
        problems = []
        if body.get("key") not in signers:
            problems.append(f"no trusted signature of the key it names, {body.get('key')!r}")
        if body.get("run") != stream:
            problems.append(f"it approves run {body.get('run')!r}")
        if body.get("head") != prev.hex():
            problems.append("it names another chain head than the event before it")
        expires, at = _parse_time(body.get("expires")), _parse_time(header.get("at"))
        if expires is None or at is None or at > expires:
            problems.append("it was recorded after it expired")
        nonce = body.get("nonce")
        if not isinstance(nonce, str) or first.get(nonce) != version:
            problems.append("its nonce was used before")
        action, outcome = _terms(header.get("type"), value)
        terms = {"action": action, "outcome": outcome}
        of = f"the {header.get('type')} that carries it"
        if action != "approve":  # a verdict on the call this event settles
            settled = calls.get(key) if isinstance(key, str) else None
            if settled is not None:
                terms.update(step=settled[0], args=settled[1])
                of += f" and the call {key!r} it settles"
            elif key is _VEILED or veiled & {"*", "idempotency_key"}:
                terms.update(step=_VEILED, args=_VEILED)
            else:
                problems.append(f"it settles call {key!r}, which no earlier event requests")
        _unchecked(seen, {k for k, v in terms.items() if v is _VEILED})
        wrong = [k for k, v in terms.items() if v is not _VEILED and body.get(k) != v]
        if wrong:
            problems.append(f"its {', '.join(wrong)} differ from {of}")
        for p in problems:
            rep.add("approval", f"version {version}: {p}", version)
    if veiled & {"*", "approved"}:  # a call may have run under any approval not seen used
        for nonce, (body, seen) in notes.items():
            if body.get("action") == "approve" and nonce not in consumed:
                _unchecked(seen, {"use"})


def verify_record(
    data: bytes,
    keys: Sequence[str],
    *,
    chain_key: bytes | None = None,
    approvers: Sequence[str] = (),
    derive_entries: Callable[..., list[Any]] | None = None,
    disclosures: Mapping[str, Any] | None = None,
) -> RecordReport:
    """Check a record file (JSON or CBOR form) against trusted verifier keys, each trusted
    for its role only (a key that may sign approvals must not be able to sign the log's
    checkpoints: with both roles, an approver could forge a whole record).

    Args:
        data: the file's bytes.
        keys: verifier keys as text (``<name>+<hex id>+<base64 key>``) trusted as the log
            (its checkpoints) and as the record's signer.
        chain_key: the store's 32-byte chain key, for a record of a keyed chain (its links
            are MACs that only the key checks).
        approvers: verifier keys trusted for the record's signed approvals only.
        derive_entries: ``entries_of(version, type, at, payload, erased=...)``, the
            function export maps an event to the draft's entries with
            (``ares_events.records.entries.entries_of``; ``ares_events.records.verify_record``
            passes it): the session's entries must then be exactly those of the checked
            events. Without it (this file vendored alone) only their order is checked.
        disclosures: the disclosures file's object (or a subset, as for
            :func:`check_disclosures`): the values that match their salted digests are
            put back for the approval checks, which a redacted value otherwise leaves
            ``unchecked``.

    Returns:
        A :class:`RecordReport`; ``ok`` is True only when no check failed.

    Raises:
        ValueError: a malformed verifier key, or ``disclosures`` without a list.
    """
    trusted = [_parse_key(k) for k in keys]
    approver_keys = [_parse_key(k) for k in approvers]
    rep = RecordReport()
    try:
        _verify(data, trusted, approver_keys, rep, chain_key, derive_entries, disclosures)
    except RecursionError:  # nested deeper than Python walks: a hostile file, not a bug
        rep.add("malformed", "the record nests values too deeply to check")
    return rep


def _verify(
    data: bytes,
    trusted: Sequence[_Key],
    approver_keys: Sequence[_Key],
    rep: RecordReport,
    chain_key: bytes | None,
    derive_entries: Callable[..., list[Any]] | None,
    disclosures: Mapping[str, Any] | None,
) -> None:
    try:
        loaded = load_record(data)
    except _Malformed as exc:
        rep.add("malformed", str(exc))
        return
    rep.form = loaded.form
    _check_signature(loaded, trusted, rep)
    record = loaded.record
    ext = record.get("ares-events")
    if not isinstance(ext, dict) or ext.get("format") != RECORD_FORMAT:
        rep.add("malformed", f"the record has no 'ares-events' member of {RECORD_FORMAT}")
        return
    stream = ext.get("stream")
    events = ext.get("events")
    if not isinstance(stream, str) or not isinstance(events, list):
        rep.add("malformed", "the record's 'ares-events' member has no stream or events")
        return
    rep.stream = stream
    keyed = ext.get("chain") == "keyed"
    key = chain_key if keyed else None  # a plain chain's links are plain whatever is passed
    if keyed and chain_key is None:
        rep.add("link", "the chain is keyed: its links cannot be checked without the chain key")
    tree = _check_checkpoints(ext, trusted, rep)
    prev = blake3.blake3(_GENESIS + stream.encode("utf-8")).digest()
    last_leaf = -1
    seen: list[tuple[int, dict[str, Any], bytes, dict[str, Any] | None]] = []
    for i, ev in enumerate(events):
        before = prev
        # A keyed chain without its key: one finding above, not one per event.
        prev, last_leaf, header, payload = _check_event(
            i, ev, stream, prev, key, not keyed or key is not None, tree, last_leaf, rep
        )
        seen.append((i + 1, header, before, payload))
    rep.events = len(events)
    head = ext.get("head")
    if not isinstance(head, dict) or head.get("version") != len(events):
        rep.add(
            "head",
            f"the record holds {len(events)} event(s) but its head is version "
            f"{head.get('version') if isinstance(head, dict) else None}: its tail was cut",
        )
    elif head.get("hash") != prev.hex():
        rep.add("head", "the last event is not the head the record claims")
    _check_entries(record, events, seen, rep, derive_entries)
    if disclosures is not None:  # disclosed values back in place, for the approvals
        rebuilt = _disclose(events, disclosures)[1]
        seen = [(v, h, b, {"value": rebuilt[v], "redacted": True} if v in rebuilt else p)
                for v, h, b, p in seen]  # fmt: skip
    _check_approvals(stream, seen, approver_keys, rep)


def _check_entries(
    record: Mapping[str, Any],
    events: list[Any],
    seen: list[tuple[int, dict[str, Any], bytes, dict[str, Any] | None]],
    rep: RecordReport,
    derive: Callable[..., list[Any]] | None,
) -> None:
    """``session.entries`` must be those ``derive`` makes of the checked events (an edited
    entry would otherwise read as verified); without ``derive``, their order only."""
    session = record.get("session")
    entries = session.get("entries") if isinstance(session, dict) else None
    if not isinstance(entries, list):
        rep.add("entries", "the record's session has no entries")
        return
    if derive is None:
        last = 0
        for e in entries:
            v = e.get("ares-version") if isinstance(e, dict) else None
            if type(v) is not int or not last <= v <= len(events):
                rep.add("entries", f"an entry names event {v!r}, not one of the record in order")
                return
            last = v
        return
    want: list[Any] = []
    for (version, header, _, payload), ev in zip(seen, events, strict=True):
        erased = isinstance(ev, dict) and ev.get("erased") is True
        if not header or (payload is None and not erased):
            return  # that event's own finding says what is wrong
        shown = None if payload is None else payload.get("value")
        try:
            want += derive(version, header.get("type"), header.get("at"), shown, erased=erased)
        except (TypeError, ValueError, AttributeError, KeyError):
            rep.add("entries", f"version {version}: its entries cannot be derived", version)
            return
    if _plain(entries) != _plain(want):
        pairs = zip(map(_plain, entries), map(_plain, want), strict=False)
        at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(entries), len(want)))
        rep.add(
            "entries",
            f"the session's entries are not those of the record's events (from entry {at + 1} "
            f"of {len(entries)}; {len(want)} expected)",
        )


def check_disclosures(data: bytes, disclosures: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Check disclosed values of a redacted record (the disclosures file ``export``
    wrote, or any subset of its entries).

    Each disclosure ``{"version", "path", "salt", "value"}`` is checked against the
    salted digest the record holds at that path; when every redacted path of an event is
    disclosed, the whole payload is rebuilt and checked against the digest and size its
    header commits to. The record itself is not verified here (use :func:`verify_record`).

    Returns:
        One ``{"version", "path", "ok", "detail"}`` per disclosure, then one
        ``{"version", "path": "$", "ok", "detail"}`` per fully disclosed event.

    Raises:
        ValueError: the record or the disclosures are malformed.
    """
    record = load_record(data).record
    events = record.get("ares-events", {}).get("events", [])
    try:
        out, rebuilt, done = _disclose(events, disclosures)
        for v, paths in done.items():
            if paths != set(events[v - 1]["redacted"]["paths"]):
                continue
            text = events[v - 1].get("header")
            header = json.loads(text) if isinstance(text, str) else None
            header = header if isinstance(header, dict) else {}
            full = canonical(rebuilt[v])
            digest = blake3.blake3(full).hexdigest()
            ok = digest == header.get("payload") and len(full) == header.get("size")
            detail = "the whole payload matches its chained digest" if ok else "it does not"
            out.append({"version": v, "path": "$", "ok": ok, "detail": detail})
    except RecursionError:
        raise ValueError("the record or a disclosed value is nested too deeply") from None
    return out


def _disclose(
    events: Sequence[Any], disclosures: Any
) -> tuple[list[dict[str, Any]], dict[int, Any], dict[int, set[str]]]:
    """Each disclosure checked against its salted digest: the results, and by version the
    redacted payloads with the matching values put back and the paths put back."""
    items = disclosures.get("disclosures") if isinstance(disclosures, Mapping) else None
    if not isinstance(items, list):
        raise ValueError("the disclosures object has no 'disclosures' list")
    out: list[dict[str, Any]] = []
    rebuilt: dict[int, Any] = {}
    done: dict[int, set[str]] = {}
    for item in items:
        d: Any = item if isinstance(item, Mapping) else {}
        v, path = d.get("version"), d.get("path")
        ev = events[v - 1] if type(v) is int and 0 < v <= len(events) else None
        red = ev.get("redacted") if isinstance(ev, dict) else None
        try:
            if not isinstance(red, dict) or path not in red.get("paths", []):
                raise KeyError(path)
            steps = parse_path(path)
            digest = _placeholder(_at(red["payload"], steps))
        except (ValueError, KeyError):  # not a path the redacted payload holds
            out.append({"version": v, "path": path, "ok": False, "detail": "not redacted there"})
            continue
        if any(depth > _MAX_DEPTH for _, depth in _nodes(d.get("value"))):
            out.append({"version": v, "path": path, "ok": False, "detail": "nested too deeply"})
            continue
        try:
            ok = digest == redaction_digest(bytes.fromhex(d["salt"]), d["value"])
        except (KeyError, ValueError, TypeError):
            ok = False
        detail = "matches its salted digest" if ok else "does not match its digest"
        out.append({"version": v, "path": path, "ok": ok, "detail": detail})
        if ok:
            base = rebuilt.setdefault(v, copy.deepcopy(red["payload"]))
            if steps:
                _at(base, steps[:-1])[steps[-1]] = d["value"]
            else:
                rebuilt[v] = d["value"]
            done.setdefault(v, set()).add(path)
    return out, rebuilt, done
