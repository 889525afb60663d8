"""Integrity: the hash chain (format v1), verification, audits and anchors.

What lives here: :mod:`~ares_events.integrity.chain` (canonical JSON, link hashes,
``ChainKey``), :mod:`~ares_events.integrity.findings` (``Finding``, ``VerifyReport``,
``AuditReport``), :mod:`~ares_events.integrity.verify` (``ChainVerifier``,
``verify_stream``, ``audit``), :mod:`~ares_events.integrity.anchors` and
:mod:`~ares_events.integrity.checkpoint_anchors` (checkpoints kept by a witness outside the
store), and the verifiable log's formats: :mod:`~ares_events.integrity.merkle` (RFC 9162
hashing and proofs), :mod:`~ares_events.integrity.notes` (C2SP signed notes, Ed25519
keys), :mod:`~ares_events.integrity.checkpoints` (C2SP checkpoints, proof documents,
offline verification) and :mod:`~ares_events.integrity.witness` (a tlog-witness).

``chain`` is the format itself: it may import only :mod:`ares_events.errors`, and the
core imports it. The other modules may import the core, the stores and ``chain``; never
projections, the agent runtime or the CLI.

The verification names below are loaded on first use: importing ``chain`` (as the core
does) runs this module first, and importing the verifier here eagerly would be a cycle
(the verifier imports the core).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ares_events.integrity.chain import ChainKey, canonical_json, genesis, link_hash

if TYPE_CHECKING:
    from ares_events.integrity.findings import AuditReport, Finding, VerifyReport
    from ares_events.integrity.verify import ChainVerifier, audit, averify_stream, verify_stream

_FINDINGS = frozenset({"AuditReport", "Finding", "VerifyReport"})
_VERIFY = frozenset({"ChainVerifier", "audit", "averify_stream", "verify_stream"})

__all__ = [
    "AuditReport",
    "ChainKey",
    "ChainVerifier",
    "Finding",
    "VerifyReport",
    "audit",
    "averify_stream",
    "canonical_json",
    "genesis",
    "link_hash",
    "verify_stream",
]


def __getattr__(name: str) -> Any:
    if name in _FINDINGS:
        from ares_events.integrity import findings

        return getattr(findings, name)
    if name in _VERIFY:
        from ares_events.integrity import verify

        return getattr(verify, name)
    raise AttributeError(f"module 'ares_events.integrity' has no attribute {name!r}")
