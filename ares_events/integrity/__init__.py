"""Hash chain (format v1), verification and audits.

The verification names are loaded on first use: ``chain`` is imported by the event model
itself, and importing the verifier eagerly here would make that a cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ares_events.integrity.chain import ChainKey, canonical_json, genesis, link_hash

if TYPE_CHECKING:
    from ares_events.integrity.verify import (
        AuditReport,
        ChainVerifier,
        Finding,
        VerifyReport,
        audit,
        verify_stream,
    )

_LAZY = frozenset(
    {"AuditReport", "ChainVerifier", "Finding", "VerifyReport", "audit", "verify_stream"}
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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from ares_events.integrity import verify

        return getattr(verify, name)
    raise AttributeError(f"module 'ares_events.integrity' has no attribute {name!r}")
