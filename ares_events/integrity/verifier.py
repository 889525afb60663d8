"""Chain verification with no I/O: the incremental :class:`ChainVerifier` that
``verify_stream``, the audit, replay and recovery use to check a chain while reading it.

It never raises on a bad link: it reports findings (every kind: docs/security.md).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import blake3
import orjson

from ares_events import chain
from ares_events.chain import (
    ChainKey,
    _cache_name,
    genesis,
    header_bytes,
    link_hash,
    payload_digest,
)
from ares_events.core.backend import Head
from ares_events.core.events import MalformedPayloadRef, PayloadRef, RecordedEvent
from ares_events.core.row_pages import EventPage
from ares_events.errors import InvalidEvent
from ares_events.integrity.findings import Finding

logger = logging.getLogger(__name__)

_blake3 = blake3.blake3


PAGE = 64
"""Events a reader hands :meth:`ChainVerifier.check_page` at a time: enough to spread a
call's cost, few enough that a page's events die young (256 cost a garbage collection
every page)."""

__all__ = ["PAGE", "ChainVerifier", "head_problem", "malformed_reason"]


def _decodes(e: RecordedEvent) -> bool:
    """Whether an unsound row's inline payload and its metadata are JSON (an edited
    row's bytes need not be)."""
    try:
        if e.payload_ref is None:
            orjson.loads(e.payload_bytes)
        orjson.loads(e.metadata_json)
    except (orjson.JSONDecodeError, TypeError):
        return False
    return True


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
        self._sid = _cache_name(stream_id) if type(stream_id) is str else None

    def check(self, e: RecordedEvent) -> bool:
        """Check the next event; record findings; return True when it is sound."""
        return self._run((e,), 0) == 1 or self._check_slow(e)

    def check_page(self, events: Sequence[RecordedEvent]) -> Sequence[RecordedEvent]:
        """Check a page of the stream's next events, in order; record findings.

        Returns the events to use: ``events`` itself when every row is a well-formed event
        (sound or not: a hash mismatch is a finding, the event still comes back, as with
        :meth:`check`), otherwise a list without the malformed rows and without the
        unsound rows whose payload or metadata is not even JSON (folding them would crash
        on bytes the chain never vouched for). The healthy run of a page is checked in one
        call (:func:`~ares_events.chain.vouch`).
        """
        n = len(events)
        # A page of rows (a SQLite read) is checked straight from the rows, the events
        # built only if the slow path needs them (a sound page builds none here).
        i = self._run(events.rows if type(events) is EventPage else events, 0)
        if i == n:
            return events
        if type(events) is EventPage:
            events = list(events)
        out = list(events[:i])
        while i < n:
            e = events[i]
            before = len(self.findings)
            if self._check_slow(e) or (
                not any(f.kind == "malformed_row" for f in self.findings[before:]) and _decodes(e)
            ):
                out.append(e)
            j = self._run(events, i + 1)
            out.extend(events[i + 1 : j])
            i = j
        return out

    def sound_prefix(self, events: Sequence[RecordedEvent]) -> int:
        """Check ``events`` in order up to the first one that is not sound; return how
        many came before it (``len(events)`` when all are sound). That event's findings
        are recorded; the events after it are not checked."""
        if type(events) is EventPage:
            events = list(events)
        n = len(events)
        i = self._run(events, 0)
        while i < n and self._check_slow(events[i]):
            i = self._run(events, i + 1)
        return i

    def _run(self, events: Sequence[Any], start: int) -> int:
        """Check ``events[start:]`` on the fast path; return the index of the first event
        it could not vouch for (``len(events)`` when it vouched for all)."""
        if self._sid is None:
            return start
        key = None if self.key is None else self.key.key
        i, self.last, self.last_hash = chain.vouch(
            events,
            start,
            self.stream_id,
            self._sid,
            self.last,
            self.last_hash,
            key,
            self._payload,
            self._link,
        )
        return i

    def _add(self, kind: str, version: Any, detail: str) -> None:
        self.findings.append(Finding(kind, self.stream_id, version, detail))

    def _check_slow(self, e: RecordedEvent) -> bool:
        before = len(self.findings)
        sid = self.stream_id
        v = e.version
        add = self._add
        problem = malformed_reason(e)
        if problem is not None:
            where = v if type(v) is int else None
            add("malformed_row", where, f"position {e.position!r}: {problem}")
            # Go on from this row: its successor is checked against what it stores.
            if type(v) is int and v >= self.last:
                self.last = v
                h = e.hash
                if isinstance(h, bytes) and len(h) == 32:
                    self.last_hash = h
            return False
        if v == self.last and v > self.start_version:
            add("duplicate_version", v, "version appears more than once")
        elif v <= self.last:
            add(
                "duplicate_version" if v > 0 else "gap", v, f"version {v} after version {self.last}"
            )
        elif v != self.last + 1:
            add("gap", v, f"versions {self.last + 1}..{v - 1} are missing")
        elif e.prev_hash != self.last_hash:
            what = f"the hash of version {self.last}" if self.last else "the genesis hash"
            add("broken_link", v, f"prev_hash is not {what}")
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
            add("hash_mismatch", v, _EDITED)
        if v >= self.last:
            # A stale version arriving late (a duplicate met in position order by the
            # audit) must not replace the tail hash the head is compared with.
            self.last = v
            self.last_hash = e.hash
        return len(self.findings) == before

    def check_head(self, head: Head | None) -> None:
        """Compare the last event checked with the stream's head row."""
        if head is None:
            if self.last > 0:
                self._add("head_mismatch", self.last, "events exist but the stream has no head row")
            return
        problem = head_problem(head)
        if problem is not None:
            self._add("malformed_row", None, f"head row: {problem}")
        elif head.version > self.last:
            said = f"head says version {head.version} but the events end at {self.last}"
            self._add("truncated", head.version, said)
        elif head.version < self.last:
            said = f"head says version {head.version} but events go on to {self.last}"
            self._add("head_mismatch", head.version, said)
        elif head.hash != self.last_hash:
            self._add("head_mismatch", head.version, "head hash differs from the last event's hash")


_HASH_LEN = 32
_EDITED = "hash does not match the stored fields (an edit, or a wrong chain key)"


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
    # The usual row (inline payload), in one expression: a rebuild asks for every event.
    if (
        type(e[0]) is str and type(e[1]) is int and type(e[2]) is int and type(e[3]) is str
        and type(e[4]) is str and type(e[5]) is str and type(e[6]) is bytes
        and type(e[7]) is bytes and type(e[8]) is str and type(e[9]) is bytes
        and type(e[10]) is bytes and len(e[9]) == len(e[10]) == _HASH_LEN and e[11] is None
    ):  # fmt: skip
        return None
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
