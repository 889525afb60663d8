"""Chain verification: :func:`verify_stream`, :func:`audit` and the incremental
:class:`ChainVerifier` that replay and recovery use to check a chain while folding it.

Verification never raises on a bad link: it returns a report of findings. Finding kinds:

``hash_mismatch``
    an event's stored hash is not ``blake3(prev_hash + header)`` of its stored fields
    (an edited payload, type, time, ... or an edited hash).
``broken_link``
    an event's ``prev_hash`` is not the previous event's hash (or the genesis value).
``gap``
    versions jump (a row deleted from the middle).
``duplicate_version``
    a version appears twice.
``truncated``
    the head says N but the events end before N (rows deleted from the tail).
``head_mismatch``
    the head row disagrees with the last event (hash differs, head behind, or no head).
``position_gap`` / ``position_order``
    global positions are not strictly increasing and gap-free (audit only).
``snapshot_mismatch``
    a stored snapshot no longer matches its stream (deep audit only).
``blob_missing`` / ``blob_corrupted``
    a spilled payload is gone or altered (deep audit only).
``anchor_*``
    the store no longer extends an anchor (see :mod:`ares_events.integrity.anchors`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import blake3

from ares_events.core.events import RecordedEvent
from ares_events.core.recorder import Capability, Head
from ares_events.errors import BlobError, BlobMissing, InvalidEvent
from ares_events.integrity.anchors import check_anchors
from ares_events.integrity.chain import (
    _HEADER,
    _NAME_CACHE,
    ChainKey,
    _cache_name,
    genesis,
    header_bytes,
    link_hash,
    payload_digest,
)
from ares_events.integrity.findings import AuditReport, Finding, VerifyReport

if TYPE_CHECKING:
    from ares_events.core.store import EventStore

logger = logging.getLogger(__name__)

_blake3 = blake3.blake3
_HEADER_PLAIN = _HEADER.replace(b'"at":%b,"id":%b,', b'"at":"%b","id":"%b",', 1)
assert _HEADER_PLAIN != _HEADER  # the template above must keep this shape

__all__ = [
    "AuditReport",
    "ChainVerifier",
    "Finding",
    "VerifyReport",
    "audit",
    "verify_stream",
]


class ChainVerifier:
    """Checks one stream's events as they go by, one at a time.

    Start at genesis (``ChainVerifier(stream_id)``) or from a trusted point
    (``start_version``/``start_hash``, e.g. a snapshot's ``at_version``/``at_hash``).
    """

    __slots__ = ("findings", "key", "last", "last_hash", "start_version", "stream_id")

    def __init__(
        self,
        stream_id: str,
        key: ChainKey | None = None,
        *,
        start_version: int = 0,
        start_hash: bytes | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.key = key
        self.start_version = start_version
        self.last = start_version
        last_hash = genesis(stream_id) if start_version == 0 else start_hash
        if last_hash is None:
            raise InvalidEvent("start_hash", "is required when start_version > 0")
        self.last_hash: bytes = last_hash
        self.findings: list[Finding] = []

    def check(self, e: RecordedEvent) -> bool:
        """Check the next event; record findings; return True when it is sound."""
        # Fast path (every event of a healthy stream): the next version, linked to the
        # last hash, with an inline payload. The header is built inline from the same
        # template as chain.header_bytes; any doubt falls through to the full check.
        if (
            e[1] == self.last + 1
            and e[9] == self.last_hash
            and e[11] is None
            and type(e[6]) is bytes
            and type(e[7]) is bytes
        ):
            raw = e[6]
            cache = _NAME_CACHE
            st = cache.get(e[0]) or _cache_name(e[0])
            ty = cache.get(e[4]) or _cache_name(e[4])
            mo = cache.get(e[5]) or _cache_name(e[5])
            try:
                # ``at`` and the event id are written by the library in forms that JSON
                # never escapes (a fixed timestamp format, UUID text), so they are quoted
                # here without the escaper. Anything else cannot match the stored hash
                # and falls through to the full check below, which escapes properly.
                header = _HEADER_PLAIN % (
                    e[8].encode(),
                    e[3].encode(),
                    e[7],
                    mo,
                    _blake3(raw).hexdigest().encode(),
                    len(raw),
                    st,
                    ty,
                    e[1],
                )
            except TypeError:
                header = b""
            key = self.key
            if key is None:
                h = _blake3(self.last_hash + header).digest()
            else:
                h = _blake3(self.last_hash + header, key=key.key).digest()
            if header and h == e[10]:
                self.last = e[1]
                self.last_hash = h
                return True
        return self._check_slow(e)

    def _check_slow(self, e: RecordedEvent) -> bool:
        ok = True
        sid = self.stream_id
        v = e.version
        add = self.findings.append
        if v == self.last and v > self.start_version:
            add(Finding("duplicate_version", sid, v, "version appears more than once"))
            ok = False
        elif v <= self.last:
            add(
                Finding(
                    "duplicate_version" if v > 0 else "gap",
                    sid,
                    v,
                    f"version {v} after version {self.last}",
                )
            )
            ok = False
        elif v != self.last + 1:
            add(Finding("gap", sid, v, f"versions {self.last + 1}..{v - 1} are missing"))
            ok = False
        elif e.prev_hash != self.last_hash:
            add(
                Finding(
                    "broken_link",
                    sid,
                    v,
                    f"prev_hash is not the hash of version {self.last}"
                    if self.last
                    else "prev_hash is not the genesis hash",
                )
            )
            ok = False
        ref = e.payload_ref
        try:
            if ref is None:
                raw = e.payload_bytes
                digest_hex = payload_digest(raw).hex()
                size = len(raw)
            else:
                digest_hex, size = ref.digest.hex(), ref.size
            header = header_bytes(
                sid, v, e.event_id_str, e.type, e.module, e.metadata_json, e.at, digest_hex, size
            )
            computed: bytes | None = link_hash(e.prev_hash, header, self.key)
        except (TypeError, ValueError):
            # A stored value of the wrong type (e.g. a payload or hash rewritten as TEXT in
            # SQLite) cannot be hashed: that is tampering to report, not a crash.
            computed = None
        if computed is None or computed != e.hash:
            add(
                Finding(
                    "hash_mismatch",
                    sid,
                    v,
                    "hash does not match the stored fields (an edit, or a wrong chain key)",
                )
            )
            ok = False
        if v >= self.last:
            # A stale version arriving late (a duplicate met in position order by the
            # audit) must not replace the tail hash the head is compared with.
            self.last = v
            self.last_hash = e.hash
        return ok

    def check_head(self, head: Head | None) -> None:
        """Compare the last event checked with the stream's head row."""
        sid = self.stream_id
        if head is None:
            if self.last > 0:
                self.findings.append(
                    Finding(
                        "head_mismatch",
                        sid,
                        self.last,
                        "events exist but the stream has no head row",
                    )
                )
            return
        if head.version > self.last:
            self.findings.append(
                Finding(
                    "truncated",
                    sid,
                    head.version,
                    f"head says version {head.version} but the events end at {self.last}",
                )
            )
        elif head.version < self.last:
            self.findings.append(
                Finding(
                    "head_mismatch",
                    sid,
                    head.version,
                    f"head says version {head.version} but events go on to {self.last}",
                )
            )
        elif head.hash != self.last_hash:
            self.findings.append(
                Finding(
                    "head_mismatch",
                    sid,
                    head.version,
                    "head hash differs from the last event's hash",
                )
            )


def verify_events(
    stream_id: str, events: Iterable[RecordedEvent], head: Head | None, key: ChainKey | None = None
) -> VerifyReport:
    """Verify an iterable of one stream's events against its head."""
    v = ChainVerifier(stream_id, key)
    n = 0
    for e in events:
        v.check(e)
        n += 1
    v.check_head(head)
    return VerifyReport(stream_id, v.findings, n, v.last, head.version if head else 0)


def verify_stream(store: EventStore, stream_id: str) -> VerifyReport:
    """Recompute ``stream_id``'s chain from the stored fields and compare with its head.

    The head is read first, so events appended during verification do not count as
    a mismatch.

    Returns:
        A report with ``ok``, ``findings`` and ``events_checked``.

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    head = store.head(stream_id)
    v = ChainVerifier(stream_id, store.chain_key)
    n = 0
    # Straight from the system of record, under any cache wrapper (``inner``).
    recorder = getattr(store.recorder, "inner", store.recorder)
    for e in recorder.read(stream_id, 1, None, None):
        v.check(e)
        n += 1
    if head is None or v.last > head.version:
        # Events past the head read at the start may be a concurrent append: re-read it.
        head = store.head(stream_id)
    v.check_head(head)
    return VerifyReport(stream_id, v.findings, n, v.last, head.version if head else 0)


def audit(
    store: EventStore,
    *,
    deep: bool = False,
    progress: Callable[[int, int], None] | None = None,
    anchors: str | None = None,
) -> AuditReport:
    """Verify every stream, the global positions and (``deep=True``) every spilled blob
    and every snapshot.

    Two passes. First every stream with a head is read by version and its chain checked
    against its head (stream reads see every committed event, whatever the backend's
    ``read_all`` visibility rule). Then one pass over ``read_all`` checks that global
    positions increase (without gaps where the backend promises that) and finds events
    of streams that have no head row.

    Args:
        store: the store to audit.
        deep: also fetch every spilled payload and check its digest, and check every
            snapshot against its stream (``snapshot_mismatch`` findings).
        progress: called as ``progress(events_done, events_total)`` now and then.
        anchors: a witness URL; also check the store still extends every anchor there
            (see :mod:`ares_events.integrity.anchors`).

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    report = AuditReport()
    heads = dict(store.recorder.heads())
    expected = sum(h.version for h in heads.values())
    key = store.chain_key
    blobs_seen: set[str] = set()
    done = 0
    # Straight from the system of record, under any cache wrapper (``inner``).
    recorder = getattr(store.recorder, "inner", store.recorder)
    for sid, head in heads.items():
        ver = ChainVerifier(sid, key)
        n = 0
        for e in recorder.read(sid, 1, None, None):
            ver.check(e)
            n += 1
            ref = e.payload_ref
            if deep and ref is not None and ref.key not in blobs_seen:
                blobs_seen.add(ref.key)
                report.blobs_checked += 1
                _check_blob(store, e, report)
            done += 1
            if progress is not None and done % 1000 == 0:
                progress(done, max(expected, done))
        shead: Head | None = head
        if ver.last > head.version:  # maybe appended since the heads were read
            shead = store.head(sid)
        ver.check_head(shead)
        r = VerifyReport(sid, ver.findings, n, ver.last, shead.version if shead else 0)
        report.streams[sid] = r
        report.findings.extend(r.findings)
    report.events_checked = done
    total = store.last_position()
    gapless = Capability.GAPLESS_POSITIONS in store.capabilities
    orphans: dict[str, ChainVerifier] = {}
    orphan_counts: dict[str, int] = {}
    last_pos = 0
    for e in recorder.read_all(0, None):
        pos = e.position
        if pos > total:
            continue  # appended after the audit started
        sid = e.stream_id
        if pos <= last_pos:
            report.findings.append(
                Finding("position_order", sid, e.version, f"position {pos} after {last_pos}")
            )
        elif gapless and pos != last_pos + 1:
            report.findings.append(
                Finding(
                    "position_gap",
                    sid,
                    e.version,
                    f"positions {last_pos + 1}..{pos - 1} are missing",
                )
            )
        last_pos = max(last_pos, pos)
        if sid not in heads:
            ov = orphans.get(sid)
            if ov is None:
                ov = orphans[sid] = ChainVerifier(sid, key)
                orphan_counts[sid] = 0
            ov.check(e)
            orphan_counts[sid] += 1
    for sid, ov in sorted(orphans.items()):
        ohead = store.head(sid)
        if ohead is not None:
            continue  # a stream created after the audit started
        ov.check_head(None)
        r = VerifyReport(sid, ov.findings, orphan_counts[sid], ov.last, 0)
        report.streams[sid] = r
        report.findings.extend(r.findings)
        report.events_checked += orphan_counts[sid]
    report.streams_checked = len(report.streams)
    if deep and Capability.SNAPSHOTS in store.capabilities:
        # A snapshot that no longer matches its stream (edited state, a rewritten or
        # truncated stream) is ignored by recovery; the audit says so.
        for info, reason in store.snapshots.verify_all():
            report.snapshots_checked += 1
            if reason is not None:
                report.findings.append(
                    Finding(
                        "snapshot_mismatch",
                        info.stream_id,
                        info.at_version,
                        f"snapshot of {info.projection!r}: {reason}",
                    )
                )
    if anchors is not None:
        report.findings.extend(check_anchors(store, anchors))
    if progress is not None:
        progress(report.events_checked, max(total, report.events_checked))
    return report


def _check_blob(store: EventStore, e: RecordedEvent, report: AuditReport) -> None:
    ref = e.payload_ref
    assert ref is not None
    if store.blobs is None:
        report.findings.append(
            Finding(
                "blob_missing", e.stream_id, e.version, f"blob {ref.key}: no blob store configured"
            )
        )
        return
    try:
        store.blobs.verify(ref)
    except BlobMissing as exc:
        report.findings.append(Finding("blob_missing", e.stream_id, e.version, exc.detail))
    except BlobError as exc:
        report.findings.append(Finding("blob_corrupted", e.stream_id, e.version, exc.detail))
