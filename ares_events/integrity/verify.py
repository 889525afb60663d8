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
    a version appears twice (seen while reading, or by the audit's uniqueness scan).
``duplicate_position`` / ``duplicate_event_id``
    two rows share a global position or an event id (audit's uniqueness scan).
``malformed_row``
    a row that cannot be read as an event or a head: a column of the wrong type (a
    BLOB where text belongs), a ``payload_ref`` that is not a reference, a bad hash
    length. Reported with stream, version or position and the reason; the rest of the
    verification goes on.
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
``erasure_unrecorded`` / ``erasure_undone``
    an erased payload no erasure record names, or a recorded erasure whose payload is
    stored again. Erased payloads themselves are information (``AuditReport.erased``),
    not findings: their chains verify.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import blake3

from ares_events.core.events import (
    ERASURE_STREAM,
    ERASURE_TYPE,
    MalformedPayloadRef,
    PayloadRef,
    RecordedEvent,
)
from ares_events.core.ports import StorePort, port_for
from ares_events.core.recorder import Capability, Head
from ares_events.core.sansio import Call, Steps, arun, run
from ares_events.errors import BlobError, BlobMissing, InvalidEvent
from ares_events.integrity.anchors import verify_anchors
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
from ares_events.integrity.notes import VerifierKey

if TYPE_CHECKING:
    from ares_events.core.store import EventStore
    from ares_events.core.store_async import AsyncEventStore

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
    "averify_stream",
    "verify_stream",
    "verify_stream_steps",
]


class ChainVerifier:
    """Checks one stream's events as they go by, one at a time.

    Start at genesis (``ChainVerifier(stream_id)``) or from a trusted point
    (``start_version``/``start_hash``, e.g. a snapshot's ``at_version``/``at_hash``).
    """

    __slots__ = (
        "_link",
        "_payload",
        "findings",
        "key",
        "last",
        "last_hash",
        "start_version",
        "stream_id",
    )

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
        # One hasher each, reused event after event (a verifier is used by one thread;
        # it spares blake3's per-call construction, ~0.3 µs a hash).
        self._payload = _blake3()
        self._link = _blake3() if key is None else _blake3(key=key.key)

    def check(self, e: RecordedEvent) -> bool:
        """Check the next event; record findings; return True when it is sound."""
        # Fast path (every event of a healthy stream): the next version, linked to the
        # last hash, with an inline payload. The header is built inline from the same
        # template as chain.header_bytes; any doubt falls through to the full check.
        if (
            type(e[1]) is int
            and e[1] == self.last + 1
            and e[9] == self.last_hash
            and e[11] is None
            and type(e[6]) is bytes
            and type(e[7]) is bytes
            and type(e[8]) is str
            and type(e[3]) is str
        ):
            raw = e[6]
            cache = _NAME_CACHE
            ph = self._payload
            try:
                st = cache.get(e[0]) or _cache_name(e[0])
                ty = cache.get(e[4]) or _cache_name(e[4])
                mo = cache.get(e[5]) or _cache_name(e[5])
                ph.update(raw)
                digest_hex = ph.hexdigest().encode()
                ph.reset()
                # ``at`` and the event id are written by the library in forms that JSON
                # never escapes (a fixed timestamp format, UUID text), so they are quoted
                # here without the escaper. Anything else cannot match the stored hash
                # and falls through to the full check below, which escapes properly.
                header = _HEADER_PLAIN % (
                    e[8].encode(),
                    e[3].encode(),
                    e[7],
                    mo,
                    digest_hex,
                    len(raw),
                    st,
                    ty,
                    e[1],
                )
            except (TypeError, AttributeError, ValueError):
                header = b""
            if header:
                lh = self._link
                lh.update(self.last_hash)
                lh.update(header)
                h = lh.digest()
                lh.reset()
                if h == e[10]:
                    self.last = e[1]
                    self.last_hash = h
                    return True
        return self._check_slow(e)

    def _check_slow(self, e: RecordedEvent) -> bool:
        ok = True
        sid = self.stream_id
        v = e.version
        add = self.findings.append
        problem = malformed_reason(e)
        if problem is not None:
            add(
                Finding(
                    "malformed_row",
                    sid,
                    v if type(v) is int else None,
                    f"position {e.position!r}: {problem}",
                )
            )
            # Go on from this row: its successor is checked against what it stores.
            if type(v) is int and v >= self.last:
                self.last = v
                h = e.hash
                if isinstance(h, bytes) and len(h) == 32:
                    self.last_hash = h
            return False
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
        if head is not None:
            problem = head_problem(head)
            if problem is not None:
                self.findings.append(Finding("malformed_row", sid, None, f"head row: {problem}"))
                return
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


_HASH_LEN = 32


def _type_name(x: object) -> str:
    return {bytes: "BLOB", str: "TEXT", int: "INTEGER", float: "REAL", type(None): "NULL"}.get(
        type(x), type(x).__name__
    )


def malformed_reason(e: RecordedEvent) -> str | None:
    """Why ``e`` (as read from a backend) is not a well-formed event row, or None.

    Checks the type of every stored column, the hash lengths and the
    payload/``payload_ref`` pairing (a well-typed but edited value is a
    ``hash_mismatch``, not a malformed row). A tampered SQLite file can hold any value in any
    column; these become ``malformed_row`` findings instead of exceptions.
    """
    expect = (
        ("stream_id", e[0], str),
        ("version", e[1], int),
        ("position", e[2], int),
        ("event_id", e[3], str),
        ("type", e[4], str),
        ("module", e[5], str),
        ("metadata", e[7], bytes),
        ("recorded_at", e[8], str),
        ("prev_hash", e[9], bytes),
        ("hash", e[10], bytes),
    )
    for name, value, want in expect:
        if type(value) is not want:
            return f"{name} is {_type_name(value)}, expected {_type_name(want())}"
    for name, value in (("prev_hash", e[9]), ("hash", e[10])):
        if len(value) != _HASH_LEN:
            return f"{name} is {len(value)} bytes, expected {_HASH_LEN}"
    ref = e[11]
    if isinstance(ref, MalformedPayloadRef):
        return f"payload_ref: {ref.problem}"
    if ref is None:
        if type(e[6]) is not bytes:
            return f"payload is {_type_name(e[6])} and there is no payload_ref"
    elif not isinstance(ref, PayloadRef) or e[6] is not None:
        return "payload and payload_ref are both set"
    elif len(ref.digest) != _HASH_LEN or ref.size < 0:
        return "payload_ref has a bad digest or size"
    return None


def head_problem(head: Head) -> str | None:
    """Why a stream head row is not well formed, or None."""
    if type(head.version) is not int or head.version < 0:
        return f"version is {_type_name(head.version)} {head.version!r:.40}"
    if type(head.hash) is not bytes or len(head.hash) != _HASH_LEN:
        return f"head_hash is not {_HASH_LEN} bytes"
    return None


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
    return run(verify_stream_steps(store.chain_key, stream_id), StorePort(store))


async def averify_stream(store: AsyncEventStore, stream_id: str) -> VerifyReport:
    """The asyncio twin of :func:`verify_stream` (the same steps, the same
    :class:`ChainVerifier`).

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    return await arun(verify_stream_steps(store.chain_key, stream_id), port_for(store))


def verify_stream_steps(chain_key: ChainKey | None, stream_id: str) -> Steps[VerifyReport]:
    """:func:`verify_stream` as steps over a store port (:mod:`ares_events.core.ports`)."""
    head = yield Call("head", stream_id)
    v = ChainVerifier(stream_id, chain_key)
    n, head = yield from _check_stream_steps(stream_id, v, head)
    v.check_head(head)
    head_version = head.version if head is not None and type(head.version) is int else 0
    return VerifyReport(stream_id, v.findings, n, v.last, head_version)


def _check_stream_steps(
    stream_id: str,
    v: ChainVerifier,
    head: Head | None,
    on_event: Callable[[RecordedEvent], None] | None = None,
) -> Steps[tuple[int, Head | None]]:
    """Check every event of the stream with ``v``, straight from the system of record
    (port call ``open_source``, under any cache wrapper); return how many and the head to
    compare with. A stream written while it is checked is followed: when the events read
    go past the head read first, the head is read again, and if it moved further the
    new events are read up to it too, so a live stream is never reported truncated."""
    n = 0
    start = 1
    while True:
        progressed = False
        handle = yield Call("open_source", stream_id, start)
        try:
            while chunk := (yield Call("next_chunk", handle)):
                for e in chunk:
                    v.check(e)
                    if on_event is not None:
                        on_event(e)
                    n += 1
                    progressed = True
        except GeneratorExit:  # the driver itself was closed: no more calls
            raise
        except BaseException:
            yield Call("close_read", handle)
            raise
        yield Call("close_read", handle)
        if head is not None and (head_problem(head) is not None or v.last <= head.version):
            return n, head
        # Events past the head read first (or no head then): concurrent appends.
        head = yield Call("head", stream_id)
        if head is None or head_problem(head) is not None or head.version <= v.last:
            return n, head
        if not progressed:
            return n, head  # the head names events the read cannot find: truncated
        start = v.last + 1


def audit(
    store: EventStore,
    *,
    deep: bool = False,
    progress: Callable[[int, int], None] | None = None,
    anchors: str | None = None,
    anchor_keys: Sequence[VerifierKey] | None = None,
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
            (see :mod:`ares_events.integrity.anchors`); a witness with no anchor at all is
            a ``no_anchor`` finding, and ``anchors_checked`` says how many were checked.
        anchor_keys: verifier keys trusted for the witness's signed checkpoints (default:
            the log keys the store recorded).

    Raises:
        StoreUnavailable: the store cannot be reached.
    """
    report = AuditReport()
    key = store.chain_key
    blobs_seen: set[str] = set()
    done = 0
    # Straight from the system of record, under any cache wrapper (``inner``).
    recorder = getattr(store.recorder, "inner", store.recorder)
    port = StorePort(store)
    heads: dict[str, Head] = {}
    for sid, head in recorder.heads():
        if type(sid) is not str:
            report.findings.append(
                Finding("malformed_row", repr(sid), None, f"head row: stream_id is {sid!r:.60}")
            )
            continue
        heads[sid] = head
    expected = sum(h.version for h in heads.values() if type(h.version) is int)
    erased: list[RecordedEvent] = []

    def seen(e: RecordedEvent) -> None:
        nonlocal done
        ref = e.payload_ref
        if ref is not None and ref.erased:
            erased.append(e)
        elif (
            deep
            and ref is not None
            and not isinstance(ref, MalformedPayloadRef)
            and ref.key not in blobs_seen
        ):
            blobs_seen.add(ref.key)
            report.blobs_checked += 1
            _check_blob(store, e, report)
        done += 1
        if progress is not None and done % 1000 == 0:
            progress(done, max(expected, done))

    for sid, head in heads.items():
        ver = ChainVerifier(sid, key)
        n, shead = run(_check_stream_steps(sid, ver, head, seen), port)
        ver.check_head(shead)
        head_version = shead.version if shead and type(shead.version) is int else 0
        r = VerifyReport(sid, ver.findings, n, ver.last, head_version)
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
        sid = e.stream_id
        if type(pos) is not int or type(sid) is not str or type(e[1]) is not int:
            # A row no stream pass can see (its stream id or version is not of its type).
            report.findings.append(
                Finding(
                    "malformed_row",
                    sid if type(sid) is str else repr(sid),
                    None,
                    f"position {pos!r}: {malformed_reason(e) or 'unreadable row'}",
                )
            )
            continue
        if pos > total:
            continue  # appended after the audit started
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
    _check_erasures(store, recorder, erased, report)
    _check_uniqueness(recorder, report)
    if deep and Capability.SNAPSHOTS in store.capabilities:
        # A snapshot that no longer matches its stream (edited state, a rewritten or
        # truncated stream, a forged seal) is ignored by recovery; the audit says so.
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
        check = verify_anchors(store, anchors, keys=anchor_keys)
        report.anchors_checked = check.anchors_checked
        report.findings.extend(check.findings)
    if progress is not None:
        progress(report.events_checked, max(total, report.events_checked))
    return report


def _check_erasures(
    store: EventStore, recorder: Any, erased: list[RecordedEvent], report: AuditReport
) -> None:
    """List erased payloads (information) and compare them with the erasure records:
    ``erasure_unrecorded`` (erased, but no ``payload.erased`` record names it: an
    interrupted erasure, run it again) and ``erasure_undone`` (a record names it, but its
    payload is back)."""
    records: dict[str, tuple[dict[str, Any], int]] = {}
    for raw in recorder.read(ERASURE_STREAM, 1, None, None):
        if raw.type != ERASURE_TYPE or raw.payload_erased or malformed_reason(raw) is not None:
            continue
        r = raw
        if r.payload_ref is not None and store.blobs is not None:
            r = store.blobs.attach(r)  # a long reason may have spilled the record
        try:
            p = r.payload
        except (ValueError, BlobError):
            continue
        if isinstance(p, dict) and isinstance(p.get("event_id"), str):
            records[p["event_id"]] = (p, r.version)
    erased_ids = set()
    for e in erased:
        erased_ids.add(e.event_id_str)
        rec, rv = records.get(e.event_id_str, ({}, None))
        report.erased.append(
            {
                "stream_id": e.stream_id,
                "version": e.version,
                "position": e.position,
                "event_id": e.event_id_str,
                "by": rec.get("by"),
                "reason": rec.get("reason"),
                "record_version": rv,
            }
        )
        if rv is None:
            report.findings.append(
                Finding(
                    "erasure_unrecorded",
                    e.stream_id,
                    e.version,
                    f"the payload was erased but no {ERASURE_TYPE} record in "
                    f"{ERASURE_STREAM!r} names it (an interrupted erasure: run it again)",
                )
            )
    for eid, (p, rv) in records.items():
        sid, ver = p.get("stream_id"), p.get("version")
        if eid in erased_ids or not isinstance(sid, str) or type(ver) is not int:
            continue
        now = next(iter(recorder.read(sid, ver, ver, 1)), None)
        if now is not None and now.event_id_str == eid and not now.payload_erased:
            report.findings.append(
                Finding(
                    "erasure_undone",
                    sid,
                    ver,
                    f"record {rv} of {ERASURE_STREAM!r} says this payload was erased, but "
                    "it is stored again",
                )
            )


def _check_uniqueness(recorder: object, report: AuditReport) -> None:
    """Rows that share a (stream, version), a position or an event id: the unique indexes
    say they cannot exist, so only a tampered database has them. Reported once each
    (a duplicated version the stream pass already saw is not repeated)."""
    scan = getattr(recorder, "find_duplicates", None)
    if not callable(scan):
        return
    seen = {(f.kind, f.stream_id, f.version) for f in report.findings}
    for kind, who, version, n, pos in scan():
        sid = who if kind != "duplicate_event_id" else None
        if (kind, sid, version) in seen:
            continue
        what = {
            "duplicate_version": f"{n} rows hold version {version!r}",
            "duplicate_position": f"{n} rows hold position {pos!r}",
            "duplicate_event_id": f"{n} rows hold event id {who!r}",
        }[kind]
        report.findings.append(
            Finding(
                kind,
                sid if sid is None or type(sid) is str else repr(sid),
                version if type(version) is int else None,
                f"{what} (first at position {pos!r}); the unique index was bypassed",
            )
        )


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
