"""Hash chain (format v1), verification and audits."""

from __future__ import annotations

from ares_events.integrity.chain import ChainKey, canonical_json, genesis, link_hash
from ares_events.integrity.verify import (
    AuditReport,
    ChainVerifier,
    Finding,
    VerifyReport,
    audit,
    verify_stream,
)

__all__ = [
    "AuditReport",
    "ChainKey",
    "ChainVerifier",
    "Finding",
    "VerifyReport",
    "audit",
    "canonical_json",
    "genesis",
    "link_hash",
    "verify_stream",
]
