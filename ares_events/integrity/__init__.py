"""Integrity: findings, chain verification (no I/O), ``verify``, the audit, anchors and the
verifiable log's formats (RFC 9162 Merkle hashing, C2SP signed notes and checkpoints, a
witness). The hash-chain format itself is :mod:`ares_events.chain`.

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
