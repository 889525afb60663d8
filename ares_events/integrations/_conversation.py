# Generated from _conversation_async.py by tools/async_to_sync.py: do not edit.
""":class:`ConversationStream` (one face written, the other generated): one framework
conversation as one hash-chained stream, verified before an adapter decodes it, written
at the version the caller names (a conflict is raised, never merged or retried).

It may import anything in the package (an integration is top layer), and no framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ares_events.core.backend import Capability
from ares_events.core.events import ERASURE_STREAM, NewEvent, RecordedEvent
from ares_events.errors import ChainIntegrityError
from ares_events.integrity.verifier import ChainVerifier
from ares_events.projections.erasure import erasure_record, reset_read_models, scrubbing

if TYPE_CHECKING:
    from ares_events.core.events import AppendResult, ExpectedVersion
    from ares_events.core.store import EventStore

__all__ = ["ConversationStream", "erase_events"]


def erase_events(
    store: EventStore, stream_id: str, versions: Sequence[int], reason: str, by: str
) -> int:
    """Erase the payloads of ``versions`` as ``ares-events erase`` (:func:`ares_events.erase`)
    erases one: their blobs, the stream's snapshots from the first of them on and the read
    models that folded one go too, and each erasure is recorded in ``ares-events/erasures``
    (the chain still verifies: the payload digests stay in it). Return how many were
    erased now (already erased ones are skipped)."""
    if not versions:
        return 0
    scrub = scrubbing(store)
    with scrub:
        records, olds = [], []
        for v in versions:
            old, _shared = store.erase_payload(stream_id, v)
            olds.append(old)
            if not (old.payload_ref is not None and old.payload_ref.erased):
                records.append(erasure_record(old, reason, by))
        first = min(olds, key=lambda e: e.version)  # whatever folded one of them folded it
        if Capability.SNAPSHOTS in store.capabilities:
            snaps = store.snapshots  # listed first, then deleted
            stale = [i.projection for i in snaps.list(stream_id) if i.at_version >= first.version]
            for name in stale:
                snaps.delete(stream_id, name)
        reset_read_models(store, first.position)
        if records:
            store.append(ERASURE_STREAM, records)
    return len(records)


class ConversationStream:
    """A verified, incrementally refreshed view of one stream: ``events`` holds every event
    read so far. The view is not locked: an adapter serialises its own use of one view."""

    def __init__(self, store: EventStore, stream_id: str) -> None:
        self.store = store
        self.stream_id = stream_id
        self.events: list[RecordedEvent] = []
        self._verifier = ChainVerifier(stream_id, store.chain_key)

    @property
    def version(self) -> int:
        """The last version read and verified (0 before anything was read)."""
        return self._verifier.last

    def refresh(self) -> None:
        """Read and verify the events appended since the last refresh. On a
        ChainIntegrityError the view is dropped (the next refresh reads it all again)."""
        head = self.store.head(self.stream_id)
        last = self._verifier.last
        if head is None or head.version <= last:  # nothing new (behind: a finding)
            if head is not None or last:
                self._verifier.check_head(head)
                self._raise_findings()
            return
        new = list(self.store.read(self.stream_id, last + 1, head.version))
        for e in new:
            if not self._verifier.check(e):
                self._raise_findings()
        self._verifier.check_head(head)
        self._raise_findings()
        self.events.extend(new)

    def tail(self, count: int) -> list[RecordedEvent]:
        """The stream's last ``count`` events, verified from the first one's recorded link
        to the head row without reading the events before them (a cost of O(tail)); the
        view is left as it is."""
        head = self.store.head(self.stream_id)
        if head is None or count <= 0:
            return []
        start = max(1, head.version - count + 1)
        events = list(self.store.read(self.stream_id, start, head.version))
        if not events:
            return []
        v0, h0 = events[0].version - 1, events[0].prev_hash
        check = ChainVerifier(self.stream_id, self.store.chain_key, start_version=v0, start_hash=h0)
        check.check_page(events)
        check.check_head(head)
        if check.findings:
            raise ChainIntegrityError(self.stream_id, check.findings)
        return events

    def append(self, events: Sequence[NewEvent], expected: ExpectedVersion) -> AppendResult:
        """Append ``events`` at ``expected`` (another writer in between: ConcurrencyError)."""
        return self.store.append(self.stream_id, list(events), expected_version=expected)

    def erase(self, versions: Sequence[int], *, reason: str, by: str) -> None:
        """:func:`erase_events` of this stream."""
        erase_events(self.store, self.stream_id, versions, reason, by)
        # What this view read of those events still holds the payloads: read again.
        erased = set(versions)
        self.events = [e if e.version not in erased else self._reread(e) for e in self.events]

    def _reread(self, e: RecordedEvent) -> RecordedEvent:
        got = list(self.store.read(self.stream_id, e.version, e.version))
        return got[0] if got else e

    def _raise_findings(self) -> None:
        if self._verifier.findings:
            findings = list(self._verifier.findings)
            self._verifier = ChainVerifier(self.stream_id, self.store.chain_key)
            self.events = []
            raise ChainIntegrityError(self.stream_id, findings)
