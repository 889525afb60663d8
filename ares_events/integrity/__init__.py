"""Integrity: verification, audits, anchors and the verifiable log.

What lives here: :mod:`~ares_events.integrity.findings` (``Finding``, ``VerifyReport``,
``AuditReport``), :mod:`~ares_events.integrity.verifier` (``ChainVerifier``, no I/O),
:mod:`~ares_events.integrity.verify_async` (``averify_stream``; ``verify`` generated from
it), :mod:`~ares_events.integrity.audit` (``audit``), :mod:`~ares_events.integrity.anchors`
(signed checkpoints kept outside the store, and their check), and the verifiable log's
formats: :mod:`~ares_events.integrity.merkle` (RFC 9162 hashing and proofs),
:mod:`~ares_events.integrity.notes` (C2SP signed notes, Ed25519 keys),
:mod:`~ares_events.integrity.checkpoints` (C2SP checkpoints, proof documents, offline
verification) and :mod:`~ares_events.integrity.witness` (a tlog-witness). The hash-chain
format itself is :mod:`ares_events.chain`, at the base of the package.

It may import the core, the stores and :mod:`ares_events.chain`; never projections, the
agent runtime or the CLI.
"""

from __future__ import annotations

from ares_events.chain import ChainKey, canonical_json, genesis, link_hash
from ares_events.integrity.audit import audit
from ares_events.integrity.findings import AuditReport, Finding, VerifyReport
from ares_events.integrity.verifier import ChainVerifier
from ares_events.integrity.verify import verify_stream
from ares_events.integrity.verify_async import averify_stream

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
