"""Chain verification with no I/O: the incremental :class:`ChainVerifier` that
``verify_stream``, the audit, replay and recovery use to check a chain while reading it.

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

It may import the core and :mod:`.findings`.
"""

from __future__ import annotations

import binascii
import logging
from collections.abc import Iterable

import blake3

from ares_events.chain import (
    _HEADER,
    _NAME_CACHE,
    ChainKey,
    _cache_name,
    genesis,
    header_bytes,
    link_hash,
    payload_digest,
)
from ares_events.core.backend import Head
from ares_events.core.events import (
    MalformedPayloadRef,
    PayloadRef,
    RecordedEvent,
)
from ares_events.errors import InvalidEvent
from ares_events.integrity.findings import Finding, VerifyReport

logger = logging.getLogger(__name__)

_blake3 = blake3.blake3
_hexlify = binascii.hexlify
_HEADER_PLAIN = _HEADER.replace(b'"at":%b,"id":%b,', b'"at":"%b","id":"%b",', 1)
assert _HEADER_PLAIN != _HEADER  # the template above must keep this shape

__all__ = ["ChainVerifier", "head_problem", "malformed_reason", "verify_events"]


class ChainVerifier:
    """Checks one stream's events as they go by, one at a time.

    Start at genesis (``ChainVerifier(stream_id)``) or from a trusted point
    (``start_version``/``start_hash``, e.g. a snapshot's ``at_version``/``at_hash``).
    """

    __slots__ = (
        "_link",
        "_payload",
        "_sid",
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
        self._sid = _cache_name(stream_id) if type(stream_id) is str else b""

    def check(self, e: RecordedEvent) -> bool:
        """Check the next event; record findings; return True when it is sound."""
        # Fast path (every event of a healthy stream): the next version, linked to the
        # last hash, with an inline payload. The header is built inline from the same
        # template as chain.header_bytes; any doubt (a wrong type raises here) falls
        # through to the full check, which names the problem. Each blake3 call costs about
        # as much as hashing 300 bytes, hence one update per hash.
        version = e[1]
        if type(version) is int and version == self.last + 1 and e[9] == self.last_hash:
            raw = e[6]
            if e[11] is None and type(raw) is bytes:
                ph = self._payload
                try:
                    sid = e[0]
                    st = (
                        self._sid
                        if sid == self.stream_id
                        else _NAME_CACHE.get(sid) or _cache_name(sid)
                    )
                    ty = e[4]
                    ty = _NAME_CACHE.get(ty) or _cache_name(ty)
                    mo = e[5]
                    mo = _NAME_CACHE.get(mo) or _cache_name(mo)
                    ph.update(raw)
                    # hexlify, not blake3's hexdigest(): the binding's hex costs ~10x more.
                    digest_hex = _hexlify(ph.digest())
                    ph.reset()
                    # ``at`` and the event id are written by the library in forms JSON never
                    # escapes (a fixed timestamp format, UUID text), so they are quoted here
                    # without the escaper; anything else cannot match the stored hash.
                    header = _HEADER_PLAIN % (
                        e[8].encode(),
                        e[3].encode(),
                        e[7],
                        mo,
                        digest_hex,
                        len(raw),
                        st,
                        ty,
                        version,
                    )
                except (TypeError, AttributeError, ValueError):
                    ph.reset()
                    return self._check_slow(e)
                lh = self._link
                lh.update(self.last_hash + header)
                h = lh.digest()
                lh.reset()
                if h == e[10]:
                    self.last = version
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
