"""The event model: what callers append (:class:`NewEvent`) and what stores return
(:class:`RecordedEvent`, decoded lazily), expected-version markers, and input validation.
"""

from __future__ import annotations

import enum
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, Final, cast

import orjson

from ares_events.chain import (
    _native,
    canonical_json,
    header_bytes,
    payload_digest,
    payload_digester,
)
from ares_events.errors import BlobMissing, ConcurrencyError, InvalidEvent, PayloadErased

__all__ = [
    "ANY",
    "ERASURE_STREAM",
    "ERASURE_TYPE",
    "MAX_NAME_LENGTH",
    "NO_STREAM",
    "RECORD_STREAMS",
    "RETENTION_STREAM",
    "SNAPSHOT_COVERS",
    "SNAPSHOT_STREAM_PREFIX",
    "STREAM_EXISTS",
    "AppendResult",
    "ErasedPayloadRef",
    "Expect",
    "ExpectedVersion",
    "NewEvent",
    "PayloadRef",
    "RecordedEvent",
    "check_expected_version",
    "format_at",
    "parse_at",
    "validate_name",
]

MAX_NAME_LENGTH: Final = 256
ERASURE_STREAM: Final = "ares-events/erasures"
"""The system stream recording every erasure (``payload.erased`` events)."""
ERASURE_TYPE: Final = "payload.erased"
RETENTION_STREAM: Final = "ares-events/retention"
"""The system stream recording every retired archive segment."""
RECORD_STREAMS: Final = frozenset({ERASURE_STREAM, RETENTION_STREAM})
"""The store's own records, which the audit checks erasures and retired segments against:
never erased, never archived (archived, they would be retired one day with the segments
they vouch for): either way the audit could no longer tell an erasure or a retirement
from tampering or a deletion."""
SNAPSHOT_STREAM_PREFIX: Final = "snapshots/"
"""Snapshot events: a stream ``snapshots/<S>`` may hold snapshots of stream ``S`` as
ordinary events (an integration's own snapshots, say). Each one names in its metadata, under
:data:`SNAPSHOT_COVERS`, the highest version of ``S`` it folds (an int); erasing version
``v`` of ``S`` erases those whose ``covers`` is ``v`` or more (they hold its content) and
leaves those without an int ``covers``."""
SNAPSHOT_COVERS: Final = "covers"
"""The metadata key of a snapshot event (:data:`SNAPSHOT_STREAM_PREFIX`): the highest
version of its stream that it folds."""


class Expect(enum.Enum):
    """Symbolic expected versions for :meth:`EventStore.append`."""

    ANY = "any"
    NO_STREAM = "no_stream"
    STREAM_EXISTS = "stream_exists"

    def __repr__(self) -> str:
        return f"ae.{self.name}"

    __str__ = __repr__


ANY: Final = Expect.ANY
NO_STREAM: Final = Expect.NO_STREAM
STREAM_EXISTS: Final = Expect.STREAM_EXISTS

ExpectedVersion = int | Expect


def check_expected_version(stream_id: str, expected: ExpectedVersion, actual: int) -> None:
    """Raise :class:`ConcurrencyError` unless ``actual`` satisfies ``expected``.

    Backends call this inside their write transaction, after reading the stream head.

    Raises:
        ConcurrencyError: the stream's version does not satisfy ``expected``.
    """
    if expected is NO_STREAM and actual != 0:
        raise ConcurrencyError(stream_id, expected, actual, "the stream already exists")
    if expected is STREAM_EXISTS and actual == 0:
        raise ConcurrencyError(stream_id, expected, actual, "the stream does not exist")
    if not isinstance(expected, Expect) and expected != actual:
        raise ConcurrencyError(stream_id, expected, actual)


def _normalize_expected(expected: object) -> ExpectedVersion:
    if isinstance(expected, Expect):
        return expected
    if type(expected) is int and 0 <= expected < 2**63:  # a version is a signed 64-bit column
        return expected
    raise InvalidEvent(
        "expected_version",
        f"{expected!r} is not a version (0 to 2**63-1), ANY, NO_STREAM or STREAM_EXISTS",
    )


def validate_name(
    value: object, field: str, *, stream_id: str | None = None, index: int | None = None
) -> str:
    """Check a stream id, event type or module name.

    Raises:
        InvalidEvent: not a str, empty, longer than 256 characters, or holding a control
            character.
    """
    if isinstance(value, str) and 0 < len(value) <= MAX_NAME_LENGTH and value.isprintable():
        return value

    def bad(problem: str) -> InvalidEvent:
        return InvalidEvent(field, problem, stream_id=stream_id, index=index)

    if not isinstance(value, str):
        raise bad(f"must be a str, got {type(value).__name__}")
    if not value:
        raise bad("must not be empty")
    if len(value) > MAX_NAME_LENGTH:
        raise bad(f"is {len(value)} characters long, the limit is {MAX_NAME_LENGTH}")
    for i, ch in enumerate(value):
        if not ch.isprintable() and (
            ord(ch) < 0x20
            or 0x7F <= ord(ch) < 0xA0
            or ch in "\u2028\u2029"
            or 0xD800 <= ord(ch) < 0xE000
        ):
            kind = "a lone surrogate" if 0xD800 <= ord(ch) < 0xE000 else "control character"
            raise bad(f"contains {kind} U+{ord(ch):04X} at offset {i}")
    return value


def format_at(dt: datetime) -> str:
    """Format a UTC datetime as the chain's ``at`` string ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_at(at: str) -> datetime:
    """Inverse of :func:`format_at`; returns an aware UTC datetime."""
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


class _UUID7(uuid.UUID):
    """A UUID that keeps its canonical text (computed once, when it is made)."""

    __slots__ = ("_text",)
    _text: str

    def __str__(self) -> str:
        return self._text

    def __reduce__(self) -> Any:
        # UUID's own state carries only the int: a pickled or copied id comes back as a
        # plain UUID (equal, and with its text), never as an object without _text.
        return (uuid.UUID, (self._text,))


_set = object.__setattr__
# Bound to the module's generator, which random reseeds in every forked child (an
# at-fork hook), so processes forked from one parent do not repeat ids.
_getrandbits = random.getrandbits
_UNKNOWN = uuid.SafeUUID.unknown
_make_uuid7: Any = None if _native is None else _native.make_uuid7
_native_uuid7: Any = None
if _native is not None:
    _native.uuid7_setup(_UUID7, _UNKNOWN, _getrandbits, time.time_ns)
    _native_uuid7 = _native.uuid7
_last_ms = 0
_seq = 0


def uuid7() -> uuid.UUID:
    """A new RFC 9562 UUIDv7: 48-bit Unix milliseconds, then 74 random bits.

    Within one millisecond a 12-bit counter in ``rand_a`` keeps ids from one process
    increasing (so index inserts stay at the end of the B-tree).
    """
    if _native_uuid7 is not None:  # the same steps in C: no Python frame (~1 µs less)
        return _native_uuid7()  # type: ignore[no-any-return]
    return uuid7_python()


def uuid7_python() -> uuid.UUID:
    """:func:`uuid7` in Python (the reference of ``ares_events._native.uuid7``, which
    takes the same steps: the clock's milliseconds, the counter, ``getrandbits(10)`` at
    a new millisecond and ``getrandbits(62)`` for every id)."""
    global _last_ms, _seq
    ms = time.time_ns() // 1_000_000
    if ms == _last_ms:
        _seq = (_seq + 1) & 0xFFF
    else:
        _last_ms, _seq = ms, _getrandbits(10)
    rand_b = _getrandbits(62)
    if _make_uuid7 is not None:  # the same object, built in C (~1 µs less an event)
        return _make_uuid7(_UUID7, ms, _seq, rand_b, _UNKNOWN)  # type: ignore[no-any-return]
    return uuid7_reference(ms, _seq, rand_b)


def uuid7_reference(ms: int, seq: int, rand_b: int) -> uuid.UUID:
    """The UUIDv7 object of 48-bit ``ms``, 12-bit ``seq`` and 62-bit ``rand_b``, with its
    canonical text kept (what ``ares_events._native.make_uuid7`` builds too)."""
    value = (ms << 80) | (0x7000 | seq) << 64 | 0x8000000000000000 | rand_b
    u = object.__new__(_UUID7)
    _set(u, "int", value)
    _set(u, "is_safe", _UNKNOWN)
    h = "%032x" % value  # noqa: UP031 - fastest way to zero-pad 128 bits of hex
    _set(u, "_text", f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return u


_new_event_id: Callable[[], uuid.UUID] = uuid7 if _native_uuid7 is None else _native_uuid7


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event to append.

    Attributes:
        type: event type, e.g. ``"task.created"``.
        module: the component that emitted it (required), e.g. ``"runtime"``.
        payload: any canonical-JSON value (normally an object).
        metadata: a JSON object of context (correlation ids, ...); ``{}`` when none.
        event_id: makes appends idempotent; a fresh time-ordered UUIDv7 by default (so
            the event-id index grows at its end instead of touching random pages).
    """

    type: str
    module: str = ""  # required: an empty or missing module is InvalidEvent at append
    payload: Any = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID | str = field(default_factory=_new_event_id)


if _native is not None:
    # The same __init__ in C (~0.5 µs less an event): the generated one above stays in
    # the class as the reference (new_event_reference), and subclasses keep using it.
    _native.install_init(
        NewEvent,
        tuple(f.name for f in fields(NewEvent)),
        tuple(f.default for f in fields(NewEvent)),
        tuple(f.default_factory for f in fields(NewEvent)),
        MISSING,
    )


def new_event_reference(**kwargs: Any) -> NewEvent:
    """``NewEvent(**kwargs)`` through the dataclass-generated ``__init__`` (the reference
    of the C one that ``NewEvent(...)`` runs when the extension is built)."""
    ev = object.__new__(NewEvent)
    NewEvent.__init__(ev, **kwargs)
    return ev


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a spilled payload lives: blob key, size of its canonical bytes, digest."""

    key: str
    size: int
    digest: bytes

    def to_json(self) -> bytes:
        """Compact stored form."""
        return orjson.dumps({"key": self.key, "size": self.size, "digest": self.digest.hex()})

    @staticmethod
    def like_key(blob_key: str) -> str:
        """A SQL ``LIKE`` pattern matching the stored form (:meth:`to_json`) of any
        reference to ``blob_key``."""
        return f'%"key":"{blob_key}"%'

    @property
    def erased(self) -> bool:
        """True for the reference an erasure leaves (:class:`ErasedPayloadRef`)."""
        return False

    @classmethod
    def from_json(cls, raw: bytes | str) -> PayloadRef:
        """Parse the stored form (an erased payload's form gives an
        :class:`ErasedPayloadRef`).

        Raises:
            ValueError: not the stored form (not JSON, missing or mistyped fields).
        """
        try:
            d = orjson.loads(raw)
            if isinstance(d, dict) and d.get("erased") is True:
                size, digest = d["size"], d["digest"]
                if type(size) is not int or type(digest) is not str:
                    raise TypeError("erased payload_ref fields have the wrong types")
                return ErasedPayloadRef(key="", size=size, digest=bytes.fromhex(digest))
            key, size, digest = d["key"], d["size"], d["digest"]
        except (orjson.JSONDecodeError, TypeError, KeyError) as exc:
            raise ValueError(f"payload_ref is not a stored reference ({exc})") from None
        if type(key) is not str or type(size) is not int or type(digest) is not str:
            raise ValueError("payload_ref fields have the wrong types")
        return cls(key=key, size=size, digest=bytes.fromhex(digest))

    @classmethod
    def parse_stored(cls, raw: Any) -> PayloadRef:
        """Like :meth:`from_json`, but never raises: a stored value that is not a
        reference (a tampered row) becomes a :class:`MalformedPayloadRef`, which
        verification reports as a ``malformed_row`` finding."""
        try:
            return cls.from_json(raw)
        except (ValueError, TypeError) as exc:
            return MalformedPayloadRef(key="", size=0, digest=b"", problem=str(exc))


@dataclass(frozen=True, slots=True)
class ErasedPayloadRef(PayloadRef):
    """What an erased payload leaves: its size and digest (the chain commits to both),
    no bytes and no blob. Stored as ``{"erased": true, "size": N, "digest": hex}``."""

    @property
    def erased(self) -> bool:
        """Always True."""
        return True

    def to_json(self) -> bytes:
        """Stored form (no blob key: nothing can be fetched)."""
        return orjson.dumps({"erased": True, "size": self.size, "digest": self.digest.hex()})


@dataclass(frozen=True, slots=True)
class MalformedPayloadRef(PayloadRef):
    """A ``payload_ref`` column that does not parse (internal; see
    :meth:`PayloadRef.parse_stored`). Its payload cannot be fetched."""

    problem: str = ""


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Outcome of an append: last version in the stream and last global position."""

    stream_id: str
    version: int
    position: int
    event_ids: tuple[uuid.UUID, ...] = ()
    duplicate: bool = False
    """True when every event was already stored and nothing was written."""


_MISSING: Final = object()
KEEP_FETCHED_BYTES: Final = 16 * 1024 * 1024
"""A spilled payload larger than this is not kept as bytes once it has been decoded."""


class RecordedEvent(tuple):  # type: ignore[type-arg]
    """An event as stored, immutable. Payload, metadata, id and time decode lazily.

    A tuple underneath (built from a row in one C call; its last item is a private cache
    cell): use the attributes, not the indexes.
    """

    __slots__ = ()

    def __new__(
        cls,
        stream_id: str,
        version: int,
        position: int,
        event_id: str,
        type: str,
        module: str,
        payload_bytes: bytes | None,
        meta_json: bytes,
        at: str,
        prev_hash: bytes,
        hash: bytes,
        payload_ref: PayloadRef | None = None,
        loader: Callable[[PayloadRef], bytes] | None = None,
    ) -> RecordedEvent:
        return tuple.__new__(
            cls,
            (
                stream_id,
                version,
                position,
                event_id,
                type,
                module,
                payload_bytes,
                meta_json,
                at,
                prev_hash,
                hash,
                payload_ref,
                [_MISSING, _MISSING, loader],
            ),
        )

    @classmethod
    def _from_row(cls, row: tuple[Any, ...]) -> RecordedEvent:
        """Fast constructor from ``(stream_id, version, position, event_id, type, module,
        payload, metadata, at, prev_hash, hash, payload_ref_json_or_None)``."""
        ref = row[11]
        if ref is None:
            return tuple.__new__(cls, (*row, [_MISSING, _MISSING, None]))
        return tuple.__new__(
            cls, (*row[:11], PayloadRef.parse_stored(ref), [_MISSING, _MISSING, None])
        )

    def __getnewargs__(self) -> tuple[Any, ...]:
        return tuple(self[:12])

    stream_id: str = property(itemgetter(0))  # type: ignore[assignment]
    version: int = property(itemgetter(1))  # type: ignore[assignment]
    position: int = property(itemgetter(2))  # type: ignore[assignment]
    event_id_str: str = property(  # type: ignore[assignment]
        itemgetter(3), doc="The event's id as stored (and as hashed)."
    )
    type: str = property(itemgetter(4))  # type: ignore[assignment]
    module: str = property(itemgetter(5))  # type: ignore[assignment]
    _payload_bytes: bytes | None = property(itemgetter(6))  # type: ignore[assignment]
    metadata_json: bytes = property(  # type: ignore[assignment]
        itemgetter(7), doc="Canonical JSON bytes of the metadata, as hashed."
    )
    at: str = property(  # type: ignore[assignment]
        itemgetter(8), doc="``recorded_at`` exactly as hashed: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."
    )
    prev_hash: bytes = property(itemgetter(9))  # type: ignore[assignment]
    hash: bytes = property(itemgetter(10))  # type: ignore[assignment]
    payload_ref: PayloadRef | None = property(itemgetter(11))  # type: ignore[assignment]

    @property
    def event_id(self) -> uuid.UUID:
        """The event's id."""
        return uuid.UUID(self[3])

    @property
    def recorded_at(self) -> datetime:
        """When the library recorded the event (UTC, microsecond precision)."""
        return parse_at(self[8])

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata object (decoded on first access)."""
        cell = self[12]
        m = cell[1]
        if m is _MISSING:
            m = cell[1] = orjson.loads(self[7])
        return m  # type: ignore[no-any-return]

    @property
    def payload_bytes(self) -> bytes:
        """Canonical JSON bytes of the payload. Fetches a spilled payload (and checks its
        digest) on first access.

        Raises:
            PayloadErased: the payload was erased (``payload_erased`` is True).
            BlobMissing: the spilled payload is not in the blob store.
            BlobCorrupted: the fetched bytes do not match the chained digest.
        """
        b = self[6]
        if b is not None:
            return b  # type: ignore[no-any-return]
        cell = self[12]
        if isinstance(cell[2], bytes):
            return cell[2]
        fetched = self._fetch()
        cell[2] = fetched  # the loader is no longer needed once the bytes are here
        return fetched

    @property
    def payload_erased(self) -> bool:
        """True when the payload was erased: ``payload`` and ``payload_bytes`` raise
        :class:`~ares_events.errors.PayloadErased`; ``payload_digest`` and
        ``payload_size`` (what the chain commits to) stay."""
        ref = self[11]
        return ref is not None and ref.erased

    def _fetch(self) -> bytes:
        """Fetch (and digest-check) a spilled payload without keeping the bytes."""
        ref = self[11]
        if ref is not None and ref.erased:
            raise PayloadErased(self[0], self[1])
        loader = self[12][2]
        if ref is None or loader is None:
            raise BlobMissing(
                ref.key if ref else "?",
                "no blob store configured to load it",
                stream_id=self[0],
                version=self[1],
            )
        return loader(ref)  # type: ignore[no-any-return]

    @property
    def payload_loaded(self) -> bool:
        """False while a spilled payload has not been fetched."""
        cell = self[12]
        return self[6] is not None or isinstance(cell[2], bytes) or cell[0] is not _MISSING

    def _with_loader(self, loader: Callable[[PayloadRef], bytes]) -> RecordedEvent:
        """A copy of this event whose spilled payload is fetched by ``loader`` (internal;
        blob stores attach themselves to events read from a backend)."""
        return RecordedEvent(*self[:12], loader)  # type: ignore[call-arg]

    @property
    def payload(self) -> Any:
        """The payload (decoded, and for spilled payloads fetched, on first access).

        Raises:
            PayloadErased: the payload was erased (``payload_erased`` is True).
            BlobMissing: the spilled payload is not in the blob store.
            BlobCorrupted: the fetched bytes do not match the chained digest.
        """
        cell = self[12]
        p = cell[0]
        if p is _MISSING:
            raw = self[6]
            if type(raw) is bytes:  # inline, the common case: no second property call
                p = cell[0] = orjson.loads(raw)
            elif (
                raw is None
                and not isinstance(cell[2], bytes)
                and self[11] is not None
                and self[11].size > KEEP_FETCHED_BYTES
            ):
                # A big spilled payload is decoded straight from the fetch: its bytes are
                # not kept next to the decoded value (peak ~2x its size, not 3x).
                p = cell[0] = orjson.loads(self._fetch())
            else:
                p = cell[0] = orjson.loads(self.payload_bytes)
        return p

    @property
    def payload_size(self) -> int:
        """Length of the canonical payload bytes."""
        ref = self[11]
        return ref.size if ref is not None else len(self[6])

    @property
    def payload_digest(self) -> bytes:
        """blake3 of the canonical payload bytes (from the ref for spilled payloads)."""
        ref = self[11]
        return ref.digest if ref is not None else payload_digest(self[6])

    def header(self) -> bytes:
        """The canonical header bytes this event's hash commits to."""
        return header_bytes(
            self[0],
            self[1],
            self[3],
            self[4],
            self[5],
            self[7],
            self[8],
            self.payload_digest.hex(),
            self.payload_size,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordedEvent):
            return NotImplemented
        return (self[0], self[1], self[10], self[2]) == (other[0], other[1], other[10], other[2])

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return hash((self[0], self[1], self[10]))

    def __repr__(self) -> str:
        return (
            f"RecordedEvent(stream_id={self[0]!r}, version={self[1]}, "
            f"position={self[2]}, type={self[4]!r}, module={self[5]!r}, "
            f"event_id={self[3]!r}, hash={self[10].hex()[:16]}…)"
        )


_python_getter: property = vars(RecordedEvent)["payload"]
_payload_reference = cast("Callable[[RecordedEvent], Any]", _python_getter.fget)
if _native is not None and hasattr(_native, "event_payload"):
    # The getter in C (~0.2 µs less an event a fold reads): the Python one above stays
    # the reference and decides every event but an inline or already decoded payload.
    _native.payload_setup(_MISSING, orjson.loads, _payload_reference)
    setattr(  # noqa: B010 (a property assigned to the class, not an attribute set)
        RecordedEvent, "payload", property(_native.event_payload, doc=_python_getter.__doc__)
    )


@dataclass(slots=True)  # not frozen: built for every appended event, and internal
class PreparedEvent:
    """A validated, encoded event ready to be sealed into a chain (internal)."""

    event_id: str
    type: str
    module: str
    payload_bytes: bytes | None  # None when spilled
    meta_json: bytes
    at: str
    digest: bytes
    size: int
    payload_ref: PayloadRef | None
    uid: uuid.UUID | None = None
    """The caller's event id object (returned in ``AppendResult.event_ids``)."""


_GOOD_NAMES: set[str] = set()


def _remember_good(name: str) -> None:
    if len(_GOOD_NAMES) > 4096:
        _GOOD_NAMES.clear()
    if type(name) is str:  # never cache a str subclass: its hash/eq could lie
        _GOOD_NAMES.add(name)


MAX_METADATA_BYTES: Final = 1024 * 1024
"""Canonical metadata is hashed into every header; it may be at most this big."""


_native_prepare: Any = None if _native is None else _native.prepare
_SORT_KEYS: Final = orjson.OPT_SORT_KEYS


def prepare(stream_id: str, events: Sequence[NewEvent], at: str) -> list[PreparedEvent]:
    """Validate and encode a batch (everything but versions and hashes): event types,
    ids, canonical payload and metadata (at most :data:`MAX_METADATA_BYTES`), digests.
    The C pass does the plain case and hands anything else to :func:`prepare_reference`.

    Raises:
        InvalidEvent: names the field and the event's index in the batch.
    """
    if _native_prepare is not None:
        out = _native_prepare(
            events,
            at,
            NewEvent,
            PreparedEvent,
            _UUID7,
            _GOOD_NAMES,
            orjson.dumps,
            _SORT_KEYS,
            MAX_METADATA_BYTES,
        )
        if out is not None:
            return out  # type: ignore[no-any-return]
    return prepare_reference(stream_id, events, at)


def prepare_reference(stream_id: str, events: Sequence[NewEvent], at: str) -> list[PreparedEvent]:
    """:func:`prepare` in Python, the reference (and the path of every unusual batch)."""
    out: list[PreparedEvent] = []
    seen: set[str] = set()
    i = 0

    def bad(field: str, problem: str) -> InvalidEvent:
        return InvalidEvent(field, problem, stream_id=stream_id, index=i)

    # A batch reuses one blake3 hasher (same digests, less per-call cost).
    digest = payload_digester() if len(events) > 2 else payload_digest
    for i, ev in enumerate(events):
        if type(ev) is not NewEvent and not isinstance(ev, NewEvent):
            raise bad("event", f"expected ae.NewEvent, got {type(ev).__name__}")
        # Types and modules repeat from event to event: check each distinct one once.
        if ev.type not in _GOOD_NAMES:
            _remember_good(validate_name(ev.type, "type", stream_id=stream_id, index=i))
        if ev.module not in _GOOD_NAMES:
            _remember_good(validate_name(ev.module, "module", stream_id=stream_id, index=i))
        uid = ev.event_id
        if isinstance(uid, str):
            try:
                uid = uuid.UUID(uid)
            except ValueError:
                raise bad("event_id", f"{uid!r} is not a UUID") from None
        elif not isinstance(uid, uuid.UUID):
            raise bad("event_id", f"must be a UUID, got {type(uid).__name__}")
        eid_s = str(uid)
        if eid_s in seen:
            raise bad("event_id", f"{eid_s} appears twice in one batch")
        seen.add(eid_s)
        meta = ev.metadata if ev.metadata is not None else {}
        # A plain dict (the usual case) spares the Mapping ABC's instance check.
        if type(meta) is not dict:
            if not isinstance(meta, Mapping):
                raise bad("metadata", f"must be a JSON object, got {type(meta).__name__}")
            meta = dict(meta)  # canonical JSON takes a plain dict only
        try:
            payload_bytes = canonical_json(ev.payload, field="payload")
            meta_json = canonical_json(meta, field="metadata") if meta else b"{}"
        except InvalidEvent as exc:
            raise bad(exc.field, exc.problem) from None
        if len(meta_json) > MAX_METADATA_BYTES:
            raise bad(
                "metadata",
                f"is {len(meta_json):,} bytes; the limit is {MAX_METADATA_BYTES:,} "
                "(metadata is hashed into every header: put big data in the payload)",
            )
        out.append(
            PreparedEvent(
                eid_s,
                ev.type,
                ev.module,
                payload_bytes,
                meta_json,
                at,
                digest(payload_bytes),
                len(payload_bytes),
                None,
                uid,
            )
        )
    return out


def same_event(prepared: PreparedEvent, stored: RecordedEvent) -> bool:
    """True when a re-appended event is the one already stored under its id."""
    return (
        prepared.type == stored.type
        and prepared.module == stored.module
        and prepared.digest == stored.payload_digest
        and prepared.meta_json == stored.metadata_json
    )


_AT_SECOND: tuple[int, str] = (-1, "")


def utc_now_at() -> str:
    """The current time as an ``at`` string: ``format_at(datetime.now(UTC))``, with the
    part up to the seconds formatted once per second (strftime costs ~2 µs a call)."""
    global _AT_SECOND
    sec, us = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _AT_SECOND
    if cached[0] != sec:
        cached = _AT_SECOND = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return f"{cached[1]}.{us:06d}Z"


def prefix_range(prefix: str) -> tuple[str, str | None]:
    """The stream ids starting with ``prefix`` as a range ``lo <= stream_id < hi``.

    ``hi`` is ``prefix`` with its last character replaced by the next code point (after
    dropping trailing U+10FFFF, which has no successor; surrogates, which no stream id
    holds, are skipped); None means no upper bound. Code point order is the byte order of
    UTF-8, so SQL backends compare with a binary collation (``COLLATE "C"`` on
    PostgreSQL) and no character is a wildcard, as it would be in ``LIKE``.
    """
    head = prefix.rstrip("\U0010ffff")
    if not head:
        return prefix, None
    nxt = ord(head[-1]) + 1
    if 0xD800 <= nxt < 0xE000:
        nxt = 0xE000
    return prefix, head[:-1] + chr(nxt)
