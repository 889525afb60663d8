"""Merkle tree math of RFC 9162 (section 2.1) over SHA-256, pure: no I/O, no store.

Proofs are built through a *subtree source*: a function ``node(level, index)`` returning
the hash of the complete subtree of ``2**level`` leaves that starts at leaf
``index * 2**level``, so a proof costs ``O(log n)`` node reads (docs/proofs.md).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Final

__all__ = [
    "EMPTY_ROOT",
    "HASH_SIZE",
    "NodeSource",
    "consistency_proof",
    "inclusion_proof",
    "leaf_hash",
    "node_hash",
    "perfect_root",
    "root",
    "root_from_consistency",
    "root_from_inclusion",
    "subtree_hash",
    "verify_consistency",
    "verify_inclusion",
]

HASH_SIZE: Final = 32
EMPTY_ROOT: Final = hashlib.sha256(b"").digest()
"""MTH of the empty tree: SHA-256 of the empty string."""

_sha256 = hashlib.sha256

NodeSource = Callable[[int, int], bytes]
"""``node(level, index)``: hash of the complete subtree of ``2**level`` leaves starting at
leaf ``index * 2**level`` (level 0: the leaf hash itself)."""


def leaf_hash(data: bytes) -> bytes:
    """``SHA-256(0x00 || data)``."""
    return _sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """``SHA-256(0x01 || left || right)``."""
    return _sha256(b"\x01" + left + right).digest()


def _largest_power_below(n: int) -> int:
    """The largest power of two strictly smaller than ``n`` (``n >= 2``)."""
    return 1 << ((n - 1).bit_length() - 1)


def perfect_root(hashes: Sequence[bytes]) -> bytes:
    """Root of a complete subtree whose ``len(hashes)`` (a power of two) bottom hashes
    are given, pairing neighbours level by level."""
    level = list(hashes)
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """``MTH`` of a list of leaf hashes (in memory; for small trees and tests)."""
    n = len(leaf_hashes)
    if n == 0:
        return EMPTY_ROOT
    return subtree_hash(0, n, lambda lv, i: perfect_root(leaf_hashes[i << lv : (i + 1) << lv]))


def subtree_hash(lo: int, hi: int, node: NodeSource) -> bytes:
    """``MTH(D[lo:hi])`` for a range the RFC's recursions visit (``lo`` a multiple of the
    largest power of two not above ``hi - lo``), from complete subtrees.

    Raises:
        ValueError: an empty or misaligned range.
    """
    n = hi - lo
    if n <= 0:
        raise ValueError(f"empty subtree range [{lo}, {hi})")
    if n & (n - 1) == 0:  # a power of two: one complete subtree
        level = n.bit_length() - 1
        if lo % n:
            raise ValueError(f"subtree range [{lo}, {hi}) is not aligned")
        return node(level, lo >> level)
    k = _largest_power_below(n)
    return node_hash(subtree_hash(lo, lo + k, node), subtree_hash(lo + k, hi, node))


def inclusion_proof(index: int, size: int, node: NodeSource) -> list[bytes]:
    """``PATH(index, D[size])`` of RFC 9162, leaf to root.

    Raises:
        ValueError: ``index`` is not below ``size``.
    """
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is not in a tree of size {size}")
    path: list[bytes] = []
    lo, hi = 0, size
    # Iterative PATH: descend from the root, collecting siblings, then reverse.
    while hi - lo > 1:
        k = _largest_power_below(hi - lo)
        if index - lo < k:
            path.append(subtree_hash(lo + k, hi, node))
            hi = lo + k
        else:
            path.append(subtree_hash(lo, lo + k, node))
            lo = lo + k
    path.reverse()
    return path


def consistency_proof(old_size: int, new_size: int, node: NodeSource) -> list[bytes]:
    """``PROOF(old_size, D[new_size])`` of RFC 9162 (empty when ``old_size`` is 0 or equal
    to ``new_size``).

    Raises:
        ValueError: ``old_size`` is negative or above ``new_size``.
    """
    if not 0 <= old_size <= new_size:
        raise ValueError(f"no consistency proof from size {old_size} to size {new_size}")
    if old_size in (0, new_size):
        return []
    proof: list[bytes] = []
    lo, hi, m, complete = 0, new_size, old_size, True
    # Iterative SUBPROOF(m, D[lo:hi], complete): siblings are collected top-down and the
    # RFC appends them after the recursive part, so the list is reversed at the end.
    while True:
        n = hi - lo
        if m == n:
            if not complete:
                proof.append(subtree_hash(lo, hi, node))
            break
        k = _largest_power_below(n)
        if m <= k:
            proof.append(subtree_hash(lo + k, hi, node))
            hi = lo + k
        else:
            proof.append(subtree_hash(lo, lo + k, node))
            lo, m, complete = lo + k, m - k, False
    proof.reverse()
    return proof


def root_from_inclusion(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes:
    """The root the inclusion proof ``path`` of the leaf *hash* ``leaf``
    (``leaf_hash(data)``) at ``index`` in a tree of ``size`` leads to (RFC 9162 section
    2.1.3.2).

    Raises:
        ValueError: the proof cannot be right for this index and size (wrong length,
            index out of range, a hash of the wrong size).
    """
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is not in a tree of size {size}")
    return _walk(index, size - 1, leaf, path, "inclusion")[1]


def _walk(fn: int, sn: int, start: bytes, path: Sequence[bytes], what: str) -> tuple[bytes, bytes]:
    """The walk both RFC 9162 verifications share: ``(fr, sr)`` from ``start`` along
    ``path`` (``fr`` takes only the left siblings)."""
    fr = sr = start
    for c in path:
        if len(c) != HASH_SIZE:
            raise ValueError("a proof hash is not 32 bytes")
        if sn == 0:
            raise ValueError(f"the {what} proof is too long")
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while fn and not fn & 1:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ValueError(f"the {what} proof is too short")
    return fr, sr


def verify_inclusion(
    index: int, size: int, leaf: bytes, path: Sequence[bytes], root: bytes
) -> bool:
    """True when ``path`` proves the leaf hash ``leaf`` at ``index`` in the tree of
    ``size`` leaves whose root is ``root``."""
    try:
        return root_from_inclusion(index, size, leaf, path) == root
    except ValueError:
        return False


def root_from_consistency(
    old_size: int, new_size: int, old_root: bytes, proof: Sequence[bytes]
) -> bytes:
    """Check ``proof`` against ``old_root`` and return the new root it leads to (RFC 9162
    section 2.1.4.2).

    Raises:
        ValueError: the proof does not verify against ``old_root`` or cannot be right for
            these sizes.
    """
    if not 0 <= old_size <= new_size:
        raise ValueError(f"no consistency proof from size {old_size} to size {new_size}")
    if any(len(c) != HASH_SIZE for c in proof):
        raise ValueError("a proof hash is not 32 bytes")
    if old_size == 0:
        if proof:
            raise ValueError("a consistency proof from size 0 must be empty")
        raise ValueError("size 0 proves nothing about the new root")
    if old_size == new_size:
        if proof:
            raise ValueError("a consistency proof between equal sizes must be empty")
        return old_root
    if not proof:
        raise ValueError("the consistency proof is empty")
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # an exact power of two
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr, sr = _walk(fn, sn, path[0], path[1:], "consistency")
    if fr != old_root:
        raise ValueError("the consistency proof does not lead to the old root")
    return sr


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """True when ``proof`` shows the tree of ``new_size`` leaves with root ``new_root``
    extends the tree of ``old_size`` leaves with root ``old_root``.

    From size 0 any new tree is consistent (the proof must be empty); between equal sizes
    the proof must be empty and the roots equal.
    """
    if old_size == 0 and new_size >= 0:
        return not proof and old_root == EMPTY_ROOT and (new_size > 0 or new_root == EMPTY_ROOT)
    try:
        return root_from_consistency(old_size, new_size, old_root, proof) == new_root
    except ValueError:
        return False
