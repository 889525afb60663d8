"""Export one stream as a signed, self-contained record that
:mod:`ares_events.records.verify` checks offline (layout and rules: docs/records.md).
"""

from __future__ import annotations

import base64
import importlib.metadata
import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from ares_events.chain import canonical_json
from ares_events.core.events import utc_now_at
from ares_events.core.faces import blocking
from ares_events.errors import (
    ChainIntegrityError,
    ConfigError,
    EventNotFound,
    MissingDependencyError,
    ProofError,
)
from ares_events.integrity import merkle
from ares_events.integrity.checkpoints import read_checkpoint
from ares_events.integrity.notes import b64, write_new_private
from ares_events.integrity.verifier import ChainVerifier
from ares_events.projections.merkle import MerkleLog
from ares_events.records.entries import agent_meta, entries_of
from ares_events.records.redact import compile_paths, redact
from ares_events.records.verify import COSE_ALG_EDDSA, RECORD_FORMAT, trace_metadata

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.integrity.checkpoints import SignedCheckpoint
    from ares_events.integrity.notes import SigningKey

logger = logging.getLogger(__name__)

__all__ = ["DRAFT_VERSION", "Export", "export_record", "write_private"]

DRAFT_VERSION: Final = "3.0.0-draft"
"""``version`` of the record: the draft -00 schema's own version string."""
DISCLOSURES_FORMAT: Final = "ares-events-disclosures/1"
_TRACE_METADATA: Final = 100  # the draft's placeholder COSE header label
_CWT_CLAIMS: Final = 15
write_private: Final = write_new_private
"""``write_private(path, data)``: a record file or the disclosures of a redacted export,
written to a new file readable by its owner only (0600), never over another (ConfigError)."""


@dataclass(frozen=True, slots=True)
class Export:
    """An exported record: the file's bytes and, when fields were redacted, the
    disclosures (values and salts: keep them as secret as the values)."""

    data: bytes
    record_id: str
    stream_id: str
    events: int
    checkpoint_size: int
    disclosures: dict[str, Any] | None = None


def _version() -> str:
    try:
        return importlib.metadata.version("ares-events")
    except importlib.metadata.PackageNotFoundError:  # running from a source tree
        return "unknown"


def _covering(log: MerkleLog, last_leaf: int, key: SigningKey | None) -> SignedCheckpoint:
    """The first stored checkpoint that covers leaf ``last_leaf`` (signing one with the
    log's own key when none does)."""
    for origin, size, _root, note, _at in log.checkpoints.all():
        if size > last_leaf:
            signed = read_checkpoint(note)
            if signed.checkpoint.origin == origin:
                return signed
    stored = log.checkpoints.origin()
    if key is not None and stored in (None, key.name):
        return log.sign(key)
    raise ProofError(
        f"no stored checkpoint covers leaf {last_leaf} yet: sign one with "
        "`ares-events checkpoint --key LOG_KEY` (or export with the log's key)"
    )


def _check_against(log: MerkleLog, signed: SignedCheckpoint) -> None:
    cp = signed.checkpoint
    if log.size() < cp.size or log.root(cp.size) != cp.root:
        raise ProofError(
            f"the log no longer matches its checkpoint at size {cp.size}: events were "
            "removed or rewritten after it was signed"
        )


def export_record(
    store: EventStore,
    stream_id: str,
    *,
    key: SigningKey,
    form: str = "json",
    redact_paths: Sequence[str] = (),
) -> Export:
    """Export ``stream_id`` (every event, from version 1) as a signed record.

    Args:
        store: the store.
        stream_id: a run id (the journal's stream) or any stream, e.g. an adapter's
            session stream.
        key: the Ed25519 key that signs the record (COSE ``kid`` is its
            ``<name>+<key id>``): the log's key, or a separate export key.
        form: ``"json"`` or ``"cbor"``.
        redact_paths: JSONPath expressions (the subset of
            :mod:`ares_events.records.redact`) evaluated against each event's payload.

    Raises:
        EventNotFound: no such stream.
        ConfigError: an unknown ``form`` or a bad ``redact_paths`` expression.
        ChainIntegrityError: the stream's chain does not verify (never sign a damaged log).
        ProofError: no checkpoint covers the stream (and ``key`` cannot sign one), or the
            log no longer matches a checkpoint.
        MissingDependencyError: ``cbor2`` / ``pycose`` are not installed.
        StoreUnavailable: the store cannot be reached.
    """
    store = blocking(store, "ares_events.records.export_record")
    if form not in ("json", "cbor"):
        raise ConfigError(f"record format must be json or cbor, got {form!r}")
    compiled = compile_paths(redact_paths)
    # The head first, then its events: an append meanwhile is not a mismatch.
    head = store.head(stream_id)
    upto = head.version if head is not None and type(head.version) is int else None
    events = list(store.read(stream_id, to_version=upto))
    if not events:
        raise EventNotFound(stream_id, 1, "no such stream")
    # The one chain check (integrity.verifier): links, versions and hashes, and the head
    # (a record of a stream whose tail was cut would claim a shorter history).
    verifier = ChainVerifier(stream_id, store.chain_key)
    verifier.check_page(events)
    verifier.check_head(head)
    if verifier.findings:
        raise ChainIntegrityError(stream_id, verifier.findings)
    log = MerkleLog(store)
    log.catch_up()
    proofs_at = log.inclusion_proofs([e.position for e in events], log.size())
    missing = [e.version for e, p in zip(events, proofs_at, strict=True) if p is None]
    if missing:
        raise ProofError(f"stream {stream_id!r} version {missing[0]} is not in the Merkle log")
    last_leaf = max(p[0] for p in proofs_at if p is not None)
    first = _covering(log, last_leaf, key)
    latest = log.latest_checkpoint()
    _check_against(log, first)
    size = first.checkpoint.size
    proofs = log.inclusion_proofs([e.position for e in events], size)
    record_id = str(uuid.uuid4())
    evidence: list[dict[str, Any]] = []
    entries: list[dict[str, Any]] = []
    disclosures: list[dict[str, Any]] = []
    models: list[str] = []
    for e, proof in zip(events, proofs, strict=True):
        assert proof is not None  # every leaf is below the covering checkpoint's size
        index, leaf, path = proof
        if leaf != merkle.leaf_hash(e.hash):
            raise ProofError(
                f"stream {stream_id!r} version {e.version} does not have the chain hash "
                f"logged at leaf {index}: it was rewritten after it was logged"
            )
        ev: dict[str, Any] = {
            "header": e.header().decode("utf-8"),
            "hash": e.hash.hex(),
            "leaf": index,
            "inclusion": [b64(h) for h in path],
        }
        shown: Any = None
        if e.payload_erased:
            ev["erased"] = True
        else:
            shown, made = redact(e.payload, compiled)
            if made:
                ev["redacted"] = {"payload": shown, "paths": [r.path for r in made]}
                disclosures += [
                    {"version": e.version, "path": r.path, "salt": r.salt.hex(), "value": r.value}
                    for r in made
                ]
            else:
                ev["payload"] = e.payload_bytes.decode("utf-8")
            if e.type == "model.call.requested" and isinstance(shown, dict):
                params = shown.get("params")
                if isinstance(params, dict) and isinstance(params.get("model"), str):
                    models.append(params["model"])
        evidence.append(ev)
        entries += entries_of(e.version, e.type, e.at, shown, erased=e.payload_erased)
    ext: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "stream": stream_id,
        "chain": "keyed" if store.chain_key is not None else "plain",
        "head": {"version": events[-1].version, "hash": events[-1].hash.hex()},
        "checkpoint": first.text,
        "events": evidence,
    }
    if latest is not None and latest.checkpoint.size > size:
        _check_against(log, latest)
        ext["latest-checkpoint"] = latest.text
        ext["consistency"] = [b64(h) for h in log.consistency_proof(size, latest.checkpoint.size)]
    interactive = any(e.type in ("run.interrupted", "run.resumed") for e in events)
    record = {
        "version": DRAFT_VERSION,
        "id": record_id,
        "created": utc_now_at(),
        "recording-agent": {"name": "ares-events", "version": _version()},
        "session": {
            "format": "interactive" if interactive else "autonomous",
            "session-id": stream_id,
            "session-start": events[0].at,
            "session-end": events[-1].at,
            "agent-meta": agent_meta(stream_id, events[0].type, entries, models),
            "entries": entries,
        },
        "ares-events": ext,
    }
    data = _sign(record, key, form)
    logger.info("exported stream %r: %d event(s), checkpoint size %d", stream_id, len(events), size)
    about = {"format": DISCLOSURES_FORMAT, "record": record_id, "stream": stream_id}
    disc = {**about, "disclosures": disclosures} if disclosures else None
    return Export(data, record_id, stream_id, len(events), size, disc)


def _sign(record: dict[str, Any], key: SigningKey, form: str) -> bytes:
    """The record file: CBOR (COSE_Sign1 carrying the record) or JSON (the record and a
    detached COSE_Sign1 over its canonical JSON)."""
    try:
        import cbor2
        from pycose.keys.curves import Ed25519
        from pycose.keys.okp import OKPKey
        from pycose.messages.sign1message import Sign1Message
    except ImportError as exc:
        raise MissingDependencyError("exporting a record (cbor2, pycose)", "records") from exc
    payload = (
        cbor2.dumps(record, canonical=True)
        if form == "cbor"
        else canonical_json(record, field="record")
    )
    # The seed, read from the key's own text form: it goes to pycose and nowhere else.
    # (PRIVATE+KEY+<name>+<id>+<base64>: names hold no "+", base64 may)
    seed = base64.b64decode(key.private_text().split("+", 4)[4])[1:]
    msg = Sign1Message(
        phdr={
            1: COSE_ALG_EDDSA,
            3: "application/agent-conversation" if form == "cbor" else "application/json",
            4: f"{key.name}+{key.verifier.key_id.hex()}".encode(),
            _CWT_CLAIMS: {1: key.name, 2: record["session"]["session-id"]},
        },
        uhdr={_TRACE_METADATA: trace_metadata(record, payload)},
        payload=payload,
    )
    msg.key = OKPKey(crv=Ed25519, d=seed)
    encoded: bytes = msg.encode()
    if form == "cbor":
        return encoded
    protected, unprotected, _payload, signature = cbor2.loads(encoded).value
    detached = cbor2.dumps(
        cbor2.CBORTag(18, [protected, dict(unprotected), None, signature]), canonical=True
    )
    # Sorted keys: the file is the canonical JSON of {"cose_sign1", "record"}, so the
    # record's signed bytes stand in the file as they are.
    return b'{"cose_sign1":"' + b64(detached).encode() + b'","record":' + payload + b"}\n"


def disclosures_bytes(disclosures: dict[str, Any]) -> bytes:
    """The disclosures file's content (JSON)."""
    return json.dumps(disclosures, ensure_ascii=False, indent=1).encode("utf-8") + b"\n"
