"""Signed notes (C2SP ``signed-note``) with Ed25519 keys, and witness cosignatures
(C2SP ``tlog-cosignature``, the timestamped Ed25519 kind); text forms and rules:
docs/proofs.md.

A :class:`SigningKey` never shows its seed in ``repr``, ``str``, errors or logs and refuses
to be pickled; only :meth:`SigningKey.private_text` (for the key file) spells it out.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from ares_events.errors import ConfigError, ProofError

__all__ = [
    "ALG_COSIGNATURE_V1",
    "ALG_ED25519",
    "EM_DASH",
    "Note",
    "NoteSignature",
    "SigningKey",
    "VerifierKey",
    "holds_private_key",
    "key_id",
    "open_note",
    "read_key_file",
    "sign_note",
    "write_key_file",
    "write_new_private",
]

ALG_ED25519: Final = 0x01
ALG_COSIGNATURE_V1: Final = 0x04
EM_DASH: Final = "\u2014"
MAX_SIGNATURES: Final = 100
"""Signature lines a note may carry (the spec asks verifiers to accept at least 16)."""
_COSIG_HEADER: Final = b"cosignature/v1\n"
_PRIVATE_PREFIX: Final = "PRIVATE+KEY+"
_ALG_NAMES: Final = {ALG_ED25519: "Ed25519", ALG_COSIGNATURE_V1: "cosignature/v1 (Ed25519)"}


def b64(data: bytes) -> str:
    """Standard, padded base64 text."""
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    """Strict standard base64 (padded, canonical)."""
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("not standard base64") from None
    if b64(raw) != text:
        raise ValueError("not canonical standard base64")
    return raw


def _key_bytes(b64: str, source: str, what: str) -> bytes:
    """``alg || 32 bytes`` of a key's base64, ``what`` naming the kind in the error."""
    try:
        raw = _unb64(b64)
    except ValueError:
        raise ConfigError(f"{source}: the key is not standard base64") from None
    if len(raw) != 33 or raw[0] not in _ALG_NAMES:
        raise ConfigError(f"{source}: expected a 0x01 {what} of 32 bytes")
    return raw


def check_key_name(name: object, where: str = "key name") -> str:
    """A key name: non-empty well-formed UTF-8, no Unicode space, no ``+``, no control
    character.

    Raises:
        ConfigError: anything else.
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where} must be a non-empty string")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate: what Python makes of command-line bytes that are not UTF-8.
        raise ConfigError(f"{where} {name!r} is not well-formed UTF-8") from None
    for ch in name:
        if ch.isspace() or ch == "+" or ord(ch) < 0x20 or ord(ch) == 0x7F:
            raise ConfigError(
                f"{where} {name!r} must not contain spaces, '+' or control characters"
            )
    return name


def holds_private_key(text: str) -> bool:
    """Whether ``text`` holds a signing key's text (``PRIVATE+KEY+...``): an error or a
    report must then show none of it."""
    return _PRIVATE_PREFIX in text


def key_id(name: str, alg: int, public_key: bytes) -> bytes:
    """``SHA-256(name || 0x0A || alg || public_key)[:4]``."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([alg]) + public_key).digest()[:4]


@dataclass(frozen=True, slots=True)
class VerifierKey:
    """A public key that verifies signatures of one name: ``alg`` 0x01 (a log's Ed25519
    signature) or 0x04 (a witness's timestamped cosignature)."""

    name: str
    alg: int
    public_key: bytes

    @property
    def key_id(self) -> bytes:
        """The 4-byte key ID."""
        return key_id(self.name, self.alg, self.public_key)

    @property
    def text(self) -> str:
        """``<name>+<8 hex>+<base64(alg || public key)>``."""
        return f"{self.name}+{self.key_id.hex()}+{b64(bytes([self.alg]) + self.public_key)}"

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str, *, source: str = "verifier key") -> VerifierKey:
        """Parse ``<name>+<8 hex>+<base64(alg || public key)>``.

        Raises:
            ConfigError: malformed, an unknown type, or a key ID that does not match. The
                message names ``source`` and never repeats the text: what is given in a
                verifier key's place may be a secret (a private key, a chain key).
        """
        if not isinstance(text, str):
            raise ConfigError(f"{source} must be a string")
        text = text.strip()
        if text.startswith(_PRIVATE_PREFIX):
            raise ConfigError(
                f"{source} is a private signing key, not a verifier key (give the verifier "
                "key keygen printed, and keep the signing key secret)"
            )
        shape = "<name>+<8 hex digits>+<base64 key>"
        parts = text.split("+", 2)  # the base64 key may itself hold '+'
        if len(parts) != 3:
            raise ConfigError(f"{source} is not a verifier key ({shape})")
        name, hex_id, b64 = parts
        try:
            check_key_name(name)
        except ConfigError:
            raise ConfigError(
                f"{source} is not a verifier key ({shape}): its name is empty or holds "
                "spaces, control characters or malformed UTF-8"
            ) from None
        raw = _key_bytes(b64, source, "(Ed25519) or 0x04 (cosignature) key")
        key = cls(name, raw[0], raw[1:])
        if len(hex_id) != 8 or hex_id.lower() != key.key_id.hex():
            raise ConfigError(f"{source}: its key ID does not match the key")
        try:
            Ed25519PublicKey.from_public_bytes(key.public_key)
        except ValueError:
            raise ConfigError(f"{source}: not an Ed25519 public key") from None
        return key

    def verify(self, text: bytes, signature: bytes) -> bool:
        """True when ``signature`` (the decoded bytes of a signature line, key ID first)
        is this key's valid signature over the note text ``text``."""
        cosig = self.alg == ALG_COSIGNATURE_V1
        start = 4 + 8 if cosig else 4  # key ID, then a cosignature's timestamp
        ts = int.from_bytes(signature[4:12], "big")  # a cosignature's
        if signature[:4] != self.key_id or len(signature) != start + 64 or (cosig and ts >= 2**63):
            return False
        message = _cosigned_message(text, ts) if cosig else text
        try:
            Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature[start:], message)
        except (InvalidSignature, ValueError):
            return False
        return True


def _cosigned_message(text: bytes, timestamp: int) -> bytes:
    return _COSIG_HEADER + b"time %d\n" % timestamp + text


class SigningKey:
    """An Ed25519 signing key with its name (``alg`` 0x01 for a log, 0x04 for a witness).

    The seed never appears in ``repr``, ``str``, errors or logs; pickling is refused.
    """

    __slots__ = ("_key", "alg", "name", "verifier")

    def __init__(self, name: str, seed: bytes, *, alg: int = ALG_ED25519) -> None:
        check_key_name(name)
        if alg not in _ALG_NAMES:
            raise ConfigError(f"unknown signature type 0x{alg:02x}")
        if not isinstance(seed, bytes) or len(seed) != 32:
            raise ConfigError("an Ed25519 seed is exactly 32 bytes")
        self.name = name
        self.alg = alg
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.verifier = VerifierKey(name, alg, public)

    @classmethod
    def generate(cls, name: str, *, alg: int = ALG_ED25519) -> SigningKey:
        """A new random key (``os.urandom``).

        Raises:
            ConfigError: a bad name.
        """
        return cls(name, os.urandom(32), alg=alg)

    @classmethod
    def from_text(cls, text: str, *, source: str = "signing key") -> SigningKey:
        """Parse ``PRIVATE+KEY+<name>+<8 hex>+<base64(alg || seed)>``.

        Raises:
            ConfigError: malformed or inconsistent; the message never repeats the key.
        """
        text = text.strip() if isinstance(text, str) else ""
        if not text.startswith(_PRIVATE_PREFIX):
            raise ConfigError(f"{source} is not a signing key (PRIVATE+KEY+<name>+...)")
        parts = text[len(_PRIVATE_PREFIX) :].split("+", 2)  # base64 may hold '+'
        if len(parts) != 3:
            raise ConfigError(f"{source} is malformed (PRIVATE+KEY+<name>+<hex id>+<key>)")
        name, hex_id, b64 = parts
        raw = _key_bytes(b64, source, "or 0x04 Ed25519 seed")
        key = cls(name, raw[1:], alg=raw[0])
        if hex_id.lower() != key.verifier.key_id.hex():
            raise ConfigError(f"{source}: its key ID does not match the key")
        return key

    def private_text(self) -> str:
        """The key file's content. Contains the secret: write it to a 0600 file only."""
        secret = b64(bytes([self.alg]) + self._key.private_bytes_raw())
        return f"{_PRIVATE_PREFIX}{self.name}+{self.verifier.key_id.hex()}+{secret}"

    def signature(self, text: bytes, *, timestamp: int | None = None) -> bytes:
        """The signature bytes of a signature line over the note text ``text`` (key ID
        first; for a cosignature also the timestamp, default now).

        Raises:
            ProofError: ``text`` is not a valid note text.
        """
        _check_text(text)
        kid = self.verifier.key_id
        if self.alg == ALG_COSIGNATURE_V1:
            ts = int(time.time()) if timestamp is None else int(timestamp)
            if not 0 <= ts <= 2**63 - 1:
                raise ProofError("a cosignature timestamp must be between 0 and 2**63-1")
            sig = self._key.sign(_cosigned_message(text, ts))
            return kid + ts.to_bytes(8, "big") + sig
        return kid + self._key.sign(text)

    def signature_line(self, text: bytes, *, timestamp: int | None = None) -> str:
        """``— <name> <base64(signature)>\\n`` over the note text ``text``.

        Raises:
            ProofError: ``text`` is not a valid note text.
        """
        return NoteSignature(self.name, self.signature(text, timestamp=timestamp)).line()

    def __repr__(self) -> str:
        return f"SigningKey(name={self.name!r}, key_id={self.verifier.key_id.hex()})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a SigningKey is not picklable (keep secrets out of queues and logs)")


@dataclass(frozen=True, slots=True)
class NoteSignature:
    """One signature line: key name and the decoded bytes (key ID first)."""

    name: str
    signature: bytes

    @property
    def key_id(self) -> bytes:
        """The 4-byte key ID the line claims."""
        return self.signature[:4]

    def line(self) -> str:
        """The line as it appears in the note."""
        return f"{EM_DASH} {self.name} {b64(self.signature)}\n"


@dataclass(frozen=True, slots=True)
class Note:
    """A parsed signed note: its text (ending in a newline) and every signature line."""

    text: str
    signatures: tuple[NoteSignature, ...]

    def format(self) -> str:
        """The signed note as text."""
        return self.text + "\n" + "".join(s.line() for s in self.signatures)

    def with_signatures(self, extra: Iterable[NoteSignature]) -> Note:
        """This note with more signature lines (a line already present is not repeated)."""
        new = [s for s in dict.fromkeys(extra) if s not in self.signatures]
        return Note(self.text, (*self.signatures, *new))

    @classmethod
    def parse(cls, data: str | bytes) -> Note:
        """Parse a signed note (nothing is verified).

        Raises:
            ProofError: not a signed note (names what is wrong).
        """
        if isinstance(data, bytes):
            try:
                data = data.decode("utf-8")
            except UnicodeDecodeError:
                raise ProofError("a signed note must be UTF-8") from None
        if not isinstance(data, str):
            raise ProofError("a signed note must be text")
        bad = next((ch for ch in data if ord(ch) < 0x20 and ch != "\n"), None)
        if bad is not None:
            raise ProofError(f"a signed note must not contain control character U+{ord(bad):04X}")
        cut = data.rfind("\n\n")
        if cut < 0:
            raise ProofError("not a signed note: no empty line before the signatures")
        text, block = data[: cut + 1], data[cut + 2 :]
        if not block.endswith("\n"):
            raise ProofError("not a signed note: the last signature line has no final newline")
        sigs: list[NoteSignature] = []
        # Errors name a signature line by its place and kind, never by its content: what
        # stands there in a mistaken file may be a private key (a key file appended to a
        # note), and even part of its seed must never reach stderr, JSON or a finding.
        for i, line in enumerate(block[:-1].split("\n"), 1):
            where = f"line {i} after the empty line"
            if holds_private_key(line):
                raise ProofError(
                    f"not a signed note: {where} holds a private signing key, not a "
                    "signature (nothing of it is shown; keep key files out of notes)"
                )
            if not line.startswith(EM_DASH + " "):
                raise ProofError(
                    f"not a signed note: {where} is not a signature line (it must start "
                    "with an em dash and a space)"
                )
            name, sp, b64 = line[2:].partition(" ")
            shape = f"'{EM_DASH} <key name> <base64 signature>'"
            if not sp or not name or " " in b64:
                raise ProofError(f"malformed signature line ({where}): expected {shape}")
            try:
                check_key_name(name)
                raw = _unb64(b64)
            except (ConfigError, ValueError):
                raise ProofError(
                    f"malformed signature line ({where}): expected {shape} (a key name "
                    "without spaces or '+', canonical standard base64)"
                ) from None
            if len(raw) < 5:
                raise ProofError("a signature line holds fewer than 5 bytes")
            sigs.append(NoteSignature(name, raw))
        if len(sigs) > MAX_SIGNATURES:
            raise ProofError(f"a signed note with more than {MAX_SIGNATURES} signatures")
        return cls(text, tuple(sigs))


def _check_text(text: bytes) -> None:
    """A note text: UTF-8, ends in a newline, no control character but newlines."""
    try:
        s = text.decode("utf-8")
    except (UnicodeDecodeError, AttributeError):
        raise ProofError("a note text must be UTF-8 bytes") from None
    if not s.endswith("\n"):
        raise ProofError("a note text must end in a newline")
    if any(ord(ch) < 0x20 and ch != "\n" for ch in s):
        raise ProofError("a note text must not contain control characters")


def sign_note(text: str, keys: Sequence[SigningKey], *, timestamp: int | None = None) -> str:
    """``text`` signed by every key in ``keys`` (a signed note).

    Raises:
        ProofError: ``text`` is not a valid note text, or no key was given.
    """
    if not keys:
        raise ProofError("signing a note needs at least one key")
    raw = text.encode("utf-8")
    return text + "\n" + "".join(k.signature_line(raw, timestamp=timestamp) for k in keys)


def open_note(
    data: str | bytes | Note, known: Iterable[VerifierKey]
) -> tuple[Note, list[VerifierKey]]:
    """Parse and verify a signed note against the ``known`` keys.

    Returns:
        The note and the known keys whose signatures verified (at least one).

    Raises:
        ProofError: malformed; a signature from a known key does not verify; or no known
            key signed it.
    """
    note = data if isinstance(data, Note) else Note.parse(data)
    by_id = {(k.name, k.key_id): k for k in known}
    raw = note.text.encode("utf-8")
    verified: list[VerifierKey] = []
    for sig in note.signatures:
        key = by_id.get((sig.name, sig.key_id))
        if key is None:
            continue  # an unknown key (another witness, a rotated key): ignored
        if not key.verify(raw, sig.signature):
            raise ProofError(f"the signature of {sig.name} ({sig.key_id.hex()}) does not verify")
        if key not in verified:
            verified.append(key)
    if not verified:
        names = ", ".join(sorted({k.name for k in by_id.values()})) or "none given"
        raise ProofError(f"no signature from a trusted key (trusted: {names})")
    return note, verified


# -- key files ----------------------------------------------------------------------------


def write_key_file(path: str | os.PathLike[str], key: SigningKey) -> Path:
    """Write ``key`` to a new file readable by its owner only (0600).

    Raises:
        ConfigError: the file exists (it is never overwritten) or cannot be created.
    """
    return write_new_private(path, (key.private_text() + "\n").encode("utf-8"), "key file ")


def write_new_private(path: str | os.PathLike[str], data: bytes, label: str = "") -> Path:
    """Write ``data`` to a new file readable by its owner only (0600), synced; never
    overwrites. ``label`` starts the error messages (``"key file "``).

    Raises:
        ConfigError: the file exists or cannot be created.
    """
    p = Path(path)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise ConfigError(f"{label}{p} already exists; refusing to overwrite it") from None
    except OSError as exc:
        raise ConfigError(f"cannot create {label}{p}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(OSError):
            os.chmod(p, 0o600)  # umask cannot widen O_CREAT's mode, but be explicit
    except BaseException:
        with contextlib.suppress(OSError):
            p.unlink()
        raise
    return p


def read_key_file(path: str | os.PathLike[str], *, source: str | None = None) -> SigningKey:
    """Read a signing key file written by :func:`write_key_file` (``keygen``).

    Raises:
        ConfigError: missing, unreadable or malformed (the message names the file, never
            its content).
    """
    p = Path(path)
    where = source or f"key file {p}"
    try:
        text = p.read_text(encoding="utf-8")  # key names are UTF-8 (C2SP signed-note)
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read it ({reason})") from None
    return SigningKey.from_text(text, source=where)
