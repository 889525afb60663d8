"""Verifiable agent records: a stream exported as one signed, self-contained file that
anyone checks offline (docs/records.md): ``export``, ``entries``, ``redact`` and
``verify`` (the auditor's verifier).

It may import the core, integrity and projections; ``verify`` imports only the standard
library, cryptography, blake3 and cbor2. Nothing here imports the agent runtime.
"""

from __future__ import annotations

from ares_events.records.export import Export, export_record
from ares_events.records.verify import RecordReport, check_disclosures, verify_record

__all__ = ["Export", "RecordReport", "check_disclosures", "export_record", "verify_record"]
