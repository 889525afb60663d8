"""Checkpoints (C2SP ``tlog-checkpoint``) and the proof documents ``prove`` writes and
``verify-proof`` checks offline with :func:`verify_proof` (formats: docs/proofs.md).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from ares_events.errors import ProofError
from ares_events.integrity import merkle
from ares_events.integrity.notes import (
    ALG_ED25519,
    Note,
    NoteSignature,
    SigningKey,
    VerifierKey,
    b64,
    open_note,
    sign_note,
)

__all__ = [
    "Checkpoint",
    "ProofCheck",
    "SignedCheckpoint",
    "b64",
    "consistency_document",
    "cosign_checkpoint",
    "inclusion_document",
    "open_checkpoint",
    "parse_checkpoint",
    "proof_kind",
    "sign_checkpoint",
    "verify_proof",
]

_SIZE: Final = re.compile(r"0|[1-9][0-9]*")
_HEX: Final = re.compile(r"(?:[0-9a-f]{2})*")
MAX_PROOF_HASHES: Final = 64
"""A proof of a tree below 2**63 leaves has at most 63 hashes (tlog-witness says so too)."""


def unb64_hash(text: object, what: str) -> bytes:
    """A 32-byte hash from canonical standard base64.

    Raises:
        ProofError: not a string, not canonical base64, or not 32 bytes.
    """
    if not isinstance(text, str):
        raise ProofError(f"{what} must be a base64 string")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ProofError(f"{what} is not standard base64") from None
    if len(raw) != merkle.HASH_SIZE or b64(raw) != text:
        raise ProofError(f"{what} is not the base64 of a 32-byte hash")
    return raw


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A tree head: origin, size, root hash and optional extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        """The note text (every line ends in a newline)."""
        lines = [self.origin, str(self.size), b64(self.root), *self.extensions]
        return "".join(line + "\n" for line in lines)


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse a checkpoint note text (the part before the signatures).

    Raises:
        ProofError: not a checkpoint (names the line).
    """
    if not text.endswith("\n"):
        raise ProofError("a checkpoint body must end in a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise ProofError("a checkpoint has at least three lines: origin, size, root hash")
    origin, size, root, *ext = lines
    if not origin:
        raise ProofError("the checkpoint's origin line is empty")
    if not _SIZE.fullmatch(size) or len(size) > 19:
        raise ProofError("the checkpoint's tree size (its second line) is not a decimal number")
    n = int(size)
    if n >= 2**63:
        raise ProofError("the checkpoint's tree size is too large")
    root_hash = unb64_hash(root, "the checkpoint's root hash")
    if any(not e for e in ext):
        raise ProofError("a checkpoint extension line is empty")
    return Checkpoint(origin, n, root_hash, tuple(ext))


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    """A checkpoint with its signed note and the trusted keys that verified it."""

    checkpoint: Checkpoint
    note: Note
    verified_by: tuple[VerifierKey, ...] = ()

    @property
    def text(self) -> str:
        """The whole signed note."""
        return self.note.format()


def sign_checkpoint(checkpoint: Checkpoint, key: SigningKey) -> str:
    """The signed note of ``checkpoint`` by the log key ``key``.

    Raises:
        ProofError: the key's name is not the checkpoint's origin (C2SP: the log's key
            name matches the origin line).
    """
    if key.name != checkpoint.origin:
        raise ProofError(
            f"the log key is named {key.name!r} but the checkpoint's origin is "
            f"{checkpoint.origin!r}"
        )
    return sign_note(checkpoint.body(), [key])


def open_checkpoint(data: str | bytes, known: Iterable[VerifierKey]) -> SignedCheckpoint:
    """Parse a signed checkpoint and verify it against ``known`` keys: a known log key
    (type 0x01) named as its origin must have signed it; other known keys (witnesses'
    cosignatures) are verified and listed too.

    Raises:
        ProofError: malformed, a bad signature from a known key, or no signature of a
            known log key of its origin.
    """
    note, verified = open_note(data, known)
    cp = parse_checkpoint(note.text)
    # Only the log's own key vouches for its tree: another trusted log's key, or a
    # witness's cosignature alone, would let whoever holds it forge this log's checkpoints.
    if not any(k.name == cp.origin and k.alg == ALG_ED25519 for k in verified):
        raise ProofError(f"no trusted log key of its origin {cp.origin!r} signed it")
    return SignedCheckpoint(cp, note, tuple(verified))


def read_checkpoint(data: str | bytes) -> SignedCheckpoint:
    """Parse a signed checkpoint *without* verifying any signature (for display and for
    the log's own bookkeeping of notes it signed).

    Raises:
        ProofError: malformed.
    """
    note = Note.parse(data)
    return SignedCheckpoint(parse_checkpoint(note.text), note, ())


def cosign_checkpoint(
    note: Note, key: SigningKey, *, timestamp: int | None = None
) -> NoteSignature:
    """A witness cosignature (``key`` of type 0x04) over ``note``'s checkpoint.

    Raises:
        ProofError: the note's text is not a checkpoint.
    """
    parse_checkpoint(note.text)
    return NoteSignature(key.name, key.signature(note.text.encode("utf-8"), timestamp=timestamp))


def inclusion_document(
    leaf_index: int, tree_size: int, leaf_data: bytes, path: Sequence[bytes], checkpoint: str
) -> dict[str, Any]:
    """The JSON object of an inclusion proof."""
    return {
        "leaf_index": leaf_index,
        "tree_size": tree_size,
        "leaf_data": leaf_data.hex(),
        "inclusion": [b64(h) for h in path],
        "checkpoint": checkpoint,
    }


def consistency_document(
    old_size: int,
    new_size: int,
    proof: Sequence[bytes],
    checkpoint: str,
    old_checkpoint: str | None,
) -> dict[str, Any]:
    """The JSON object of a consistency proof."""
    return {
        "old_size": old_size,
        "new_size": new_size,
        "consistency": [b64(h) for h in proof],
        "checkpoint": checkpoint,
        "old_checkpoint": old_checkpoint,
    }


def proof_kind(doc: Mapping[str, Any]) -> str:
    """``"inclusion"`` or ``"consistency"``: the one kind of proof ``doc`` holds.

    Raises:
        ProofError: not a proof: the object holds neither ``inclusion`` nor
            ``consistency``, or both.
    """
    kinds = [kind for kind in ("inclusion", "consistency") if kind in doc]
    if not kinds:
        raise ProofError("not a proof: the object has neither 'inclusion' nor 'consistency'")
    # Only one kind is ever checked: a document of both would be called valid with its
    # other proof unread (a growth check by exit code would pass garbage).
    if len(kinds) > 1:
        raise ProofError(
            "not a proof: the object has both 'inclusion' and 'consistency' (a proof is "
            "of one kind, as `prove` writes it)"
        )
    return kinds[0]


@dataclass(slots=True)
class ProofCheck:
    """Outcome of :func:`verify_proof`: ``ok``, what was checked, and why not."""

    kind: str
    ok: bool
    reason: str | None = None
    origin: str | None = None
    tree_size: int | None = None
    root: bytes | None = None
    signed_by: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: ``ok`` first, the fields, then the details."""
        d: dict[str, Any] = {"ok": self.ok} | asdict(self)
        d["root"] = b64(self.root) if self.root is not None else None
        d.update(d.pop("details"))  # last, after the fields
        return d


def _int(doc: Mapping[str, Any], name: str) -> int:
    if type(v := doc.get(name)) is not int or v < 0:
        raise ProofError(f"{name!r} must be an integer >= 0")
    return v


def _hashes(doc: Mapping[str, Any], name: str) -> list[bytes]:
    if not isinstance(v := doc.get(name), list):
        raise ProofError(f"{name!r} must be a list of base64 hashes")
    if len(v) > MAX_PROOF_HASHES:
        raise ProofError(f"{name!r} holds more than {MAX_PROOF_HASHES} hashes")
    return [unb64_hash(h, f"{name}[{i}]") for i, h in enumerate(v)]


def verify_proof(
    doc: Mapping[str, Any], known: Sequence[VerifierKey], *, old_checkpoint: str | None = None
) -> ProofCheck:
    """Check a proof document offline (no store): the checkpoint's signature, its size,
    and the proof against its root.

    Args:
        doc: the JSON object ``prove --json`` printed.
        known: trusted verifier keys (a log key named as the checkpoint's origin must
            have signed it).
        old_checkpoint: for a consistency proof, the signed old checkpoint the caller
            trusts (it replaces the document's ``old_checkpoint``).

    Returns:
        A :class:`ProofCheck`; ``ok`` False with the ``reason`` for any failure.

    Raises:
        ProofError: the document is not a proof object at all (it holds neither kind
            of proof, or both).
    """
    kind = proof_kind(doc)
    check = ProofCheck(kind, False)
    try:
        if not isinstance(text := doc.get("checkpoint"), str):
            raise ProofError("'checkpoint' must be the text of a signed checkpoint")
        signed = open_checkpoint(text, known)
        cp = signed.checkpoint
        check.origin, check.tree_size, check.root = cp.origin, cp.size, cp.root
        check.signed_by = [k.name for k in signed.verified_by]
        if kind == "inclusion":
            _verify_inclusion(doc, cp, check)
        else:
            _verify_consistency(doc, cp, known, old_checkpoint, check)
    except ProofError as exc:
        check.reason = exc.reason
    else:
        check.ok = True
    return check


def _verify_inclusion(doc: Mapping[str, Any], cp: Checkpoint, check: ProofCheck) -> None:
    index, size = _int(doc, "leaf_index"), _int(doc, "tree_size")
    if size != cp.size:
        raise ProofError(f"the proof is for tree size {size}, the checkpoint for {cp.size}")
    if not isinstance(data := doc.get("leaf_data"), str):
        raise ProofError("'leaf_data' must be hex")
    # Lowercase hex only, as prove writes it: bytes.fromhex also reads upper case and
    # spaces, so a proof with a changed byte would still verify (the base64 hashes are
    # held to canonical form likewise).
    if not _HEX.fullmatch(data):
        raise ProofError("'leaf_data' is not lowercase hex")
    leaf = bytes.fromhex(data)
    path = _hashes(doc, "inclusion")
    check.details.update(leaf_index=index, leaf_data=leaf.hex())
    if not merkle.verify_inclusion(index, size, merkle.leaf_hash(leaf), path, cp.root):
        raise ProofError(
            f"the inclusion proof of leaf {index} does not lead to the checkpoint's root"
        )


def _verify_consistency(
    doc: Mapping[str, Any],
    cp: Checkpoint,
    known: Sequence[VerifierKey],
    given_old: str | None,
    check: ProofCheck,
) -> None:
    old_size, new_size = _int(doc, "old_size"), _int(doc, "new_size")
    if new_size != cp.size:
        raise ProofError(f"the proof is to tree size {new_size}, the checkpoint is of {cp.size}")
    if old_size > new_size:
        raise ProofError(f"old size {old_size} is above new size {new_size}")
    proof = _hashes(doc, "consistency")
    check.details.update(old_size=old_size, new_size=new_size)
    if old_size == 0:
        if proof:
            raise ProofError("a consistency proof from size 0 must be empty")
        return
    old_text = given_old if given_old is not None else doc.get("old_checkpoint")
    if not isinstance(old_text, str):
        raise ProofError(
            "no old checkpoint to check the proof against: the document has none "
            "(pass the old signed checkpoint you trust with --old)"
        )
    old = open_checkpoint(old_text, known).checkpoint
    if old.origin != cp.origin:
        raise ProofError(f"the old checkpoint is of log {old.origin!r}, the new of {cp.origin!r}")
    if old.size != old_size:
        raise ProofError(f"the old checkpoint is of size {old.size}, the proof from {old_size}")
    check.details["old_root"] = b64(old.root)
    if not merkle.verify_consistency(old_size, new_size, old.root, cp.root, proof):
        raise ProofError(
            f"the consistency proof does not show size {new_size} extends size {old_size}"
        )
