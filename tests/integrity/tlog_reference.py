"""An independent, deliberately simple implementation of docs/proofs.md.

Written from the page only (RFC 9162 section 2.1, C2SP signed-note, tlog-checkpoint and
tlog-cosignature as docs/proofs.md restates them). It shares no code with the package:
it imports only ``hashlib``, ``base64`` and ``cryptography`` (for Ed25519). Trees are
plain lists, every function is the recursive definition, nothing is fast.
"""

from __future__ import annotations

import base64
import hashlib

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat


def sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def k_of(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def mth(d: list[bytes]) -> bytes:
    """MTH(D[n]) of the leaf data list ``d``."""
    if not d:
        return sha256(b"")
    if len(d) == 1:
        return sha256(b"\x00" + d[0])
    k = k_of(len(d))
    return sha256(b"\x01" + mth(d[:k]) + mth(d[k:]))


def path(m: int, d: list[bytes]) -> list[bytes]:
    """PATH(m, D[n])."""
    if len(d) == 1:
        return []
    k = k_of(len(d))
    if m < k:
        return [*path(m, d[:k]), mth(d[k:])]
    return [*path(m - k, d[k:]), mth(d[:k])]


def subproof(m: int, d: list[bytes], b: bool) -> list[bytes]:
    """SUBPROOF(m, D[n], b)."""
    if m == len(d):
        return [] if b else [mth(d)]
    k = k_of(len(d))
    if m <= k:
        return [*subproof(m, d[:k], b), mth(d[k:])]
    return [*subproof(m - k, d[k:], False), mth(d[:k])]


def proof(m: int, d: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]); empty for m == 0 and m == n."""
    if m in (0, len(d)):
        return []
    return subproof(m, d, True)


def verify_inclusion(index: int, size: int, leaf_data: bytes, p: list[bytes], root: bytes) -> bool:
    """RFC 9162 section 2.1.3.2, step by step."""
    if index >= size:
        return False
    fn, sn, r = index, size - 1, sha256(b"\x00" + leaf_data)
    for x in p:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            r = sha256(b"\x01" + x + r)
            if fn % 2 == 0:
                while not (fn % 2 == 1 or fn == 0):
                    fn //= 2
                    sn //= 2
        else:
            r = sha256(b"\x01" + r + x)
        fn //= 2
        sn //= 2
    return sn == 0 and r == root


def verify_consistency(first: int, second: int, h1: bytes, h2: bytes, p: list[bytes]) -> bool:
    """RFC 9162 section 2.1.4.2, step by step (equal sizes: empty proof, equal roots)."""
    if first == second:
        return not p and h1 == h2
    if first == 0:
        return not p
    if first > second or not p:
        return False
    p = list(p)
    if first & (first - 1) == 0:
        p = [h1, *p]
    fn, sn = first - 1, second - 1
    while fn % 2 == 1:
        fn //= 2
        sn //= 2
    fr = sr = p[0]
    for c in p[1:]:
        if sn == 0:
            return False
        if fn % 2 == 1 or fn == sn:
            fr = sha256(b"\x01" + c + fr)
            sr = sha256(b"\x01" + c + sr)
            if fn % 2 == 0:
                while not (fn % 2 == 1 or fn == 0):
                    fn //= 2
                    sn //= 2
        else:
            sr = sha256(b"\x01" + sr + c)
        fn //= 2
        sn //= 2
    return fr == h1 and sr == h2 and sn == 0


# -- signed notes -------------------------------------------------------------------------


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def public_key(seed: bytes) -> bytes:
    return (
        Ed25519PrivateKey.from_private_bytes(seed)
        .public_key()
        .public_bytes(Encoding.Raw, PublicFormat.Raw)
    )


def key_id(name: str, sig_type: int, pub: bytes) -> bytes:
    return sha256(name.encode() + b"\n" + bytes([sig_type]) + pub)[:4]


def vkey_text(name: str, sig_type: int, pub: bytes) -> str:
    return f"{name}+{key_id(name, sig_type, pub).hex()}+{b64(bytes([sig_type]) + pub)}"


def private_key_text(name: str, sig_type: int, seed: bytes) -> str:
    pub = public_key(seed)
    return f"PRIVATE+KEY+{name}+{key_id(name, sig_type, pub).hex()}+{b64(bytes([sig_type]) + seed)}"


def checkpoint_body(origin: str, size: int, root: bytes) -> str:
    return f"{origin}\n{size}\n{b64(root)}\n"


def sign_note(text: str, name: str, seed: bytes) -> str:
    sig = Ed25519PrivateKey.from_private_bytes(seed).sign(text.encode())
    line = "\u2014 " + name + " " + b64(key_id(name, 1, public_key(seed)) + sig) + "\n"
    return text + "\n" + line


def cosignature_line(text: str, name: str, seed: bytes, timestamp: int) -> str:
    msg = b"cosignature/v1\ntime " + str(timestamp).encode() + b"\n" + text.encode()
    sig = Ed25519PrivateKey.from_private_bytes(seed).sign(msg)
    raw = key_id(name, 4, public_key(seed)) + timestamp.to_bytes(8, "big") + sig
    return "\u2014 " + name + " " + b64(raw) + "\n"


def open_note(note: str, name: str, pub: bytes) -> str | None:
    """The text when a valid Ed25519 (type 0x01) signature by ``name``/``pub`` is on it."""
    cut = note.rfind("\n\n")
    text, sigs = note[: cut + 1], note[cut + 2 :]
    kid = key_id(name, 1, pub)
    for line in sigs.splitlines():
        who, raw64 = line[2:].split(" ")
        raw = base64.b64decode(raw64)
        if who != name or raw[:4] != kid:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(pub).verify(raw[4:], text.encode())
        except InvalidSignature:
            return None
        return text
    return None
