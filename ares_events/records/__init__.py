"""Verifiable agent records: a stream exported as one signed, self-contained file that
anyone checks offline (docs/records.md).

What lives here: :mod:`~ares_events.records.export` (``export_record``: the record of a
run or a session stream, JSON or CBOR, signed with COSE_Sign1), its helpers
:mod:`~ares_events.records.entries` (the draft's entries) and
:mod:`~ares_events.records.redact` (JSONPath redaction into salted digests), and
:mod:`~ares_events.records.verify` (``verify_record``, ``check_disclosures``: the
auditor's verifier, one file that imports nothing of ares-events).

It may import the core, integrity and projections; ``verify`` imports only the standard
library, cryptography, blake3 and cbor2. Nothing here imports the agent runtime.
"""

from __future__ import annotations

from ares_events.records.export import Export, export_record
from ares_events.records.verify import RecordReport, check_disclosures, verify_record

__all__ = ["Export", "RecordReport", "check_disclosures", "export_record", "verify_record"]
