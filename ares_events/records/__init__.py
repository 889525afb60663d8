"""Verifiable agent records: a stream exported as one signed, self-contained file that
anyone checks offline (docs/records.md): ``export``, ``entries``, ``redact`` and
``verify`` (the auditor's verifier).

It may import the core, integrity and projections; ``verify`` imports only the standard
library, cryptography, blake3 and cbor2. Nothing here imports the agent runtime.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ares_events.records import verify as _verify
from ares_events.records.entries import entries_of
from ares_events.records.export import Export, export_record
from ares_events.records.verify import RecordReport, check_disclosures

__all__ = ["Export", "RecordReport", "check_disclosures", "export_record", "verify_record"]


def verify_record(
    data: bytes,
    keys: Sequence[str],
    *,
    chain_key: bytes | None = None,
    approvers: Sequence[str] = (),
    disclosures: Mapping[str, Any] | None = None,
) -> RecordReport:
    """:func:`ares_events.records.verify.verify_record` that also holds the session's
    entries to those export derives from the record's events (the vendorable file alone
    checks only their order)."""
    return _verify.verify_record(
        data,
        keys,
        chain_key=chain_key,
        approvers=approvers,
        derive_entries=entries_of,
        disclosures=disclosures,
    )
