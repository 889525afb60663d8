"""The event model: what callers append (:class:`NewEvent`) and what stores return
(:class:`RecordedEvent`), expected-version markers, and input validation.

``RecordedEvent`` keeps the stored forms (canonical payload bytes, the ``at`` string, the
event id string) and decodes them on first access, so a replay that only looks at types
and versions never parses a payload, and one that never touches a spilled payload never
downloads it.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from ares_events.errors import ConcurrencyError, InvalidEvent
from ares_events.integrity.chain import canonical_json, header_bytes, payload_digest

__all__ = [
    "ANY",
    "MAX_NAME_LENGTH",
    "NO_STREAM",
    "STREAM_EXISTS",
    "AppendResult",
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
    if expected is ANY:
        return
    if expected is NO_STREAM:
        if actual != 0:
            raise ConcurrencyError(stream_id, expected, actual, "the stream already exists")
        return
    if expected is STREAM_EXISTS:
        if actual == 0:
            raise ConcurrencyError(stream_id, expected, actual, "the stream does not exist")
        return
    if expected != actual:
        raise ConcurrencyError(stream_id, expected, actual)


def _normalize_expected(expected: object) -> ExpectedVersion:
    if isinstance(expected, Expect):
        return expected
    if type(expected) is int and expected >= 0:
        return expected
    raise InvalidEvent(
        "expected_version", f"{expected!r} is not a version >= 0, ANY, NO_STREAM or STREAM_EXISTS"
    )


def validate_name(
    value: object, field: str, *, stream_id: str | None = None, index: int | None = None
) -> str:
    """Check a stream id, event type or module name.

    Raises:
        InvalidEvent: not a str, empty, longer than 256 characters, or holding a control
            character.
    """
    if not isinstance(value, str):
        raise InvalidEvent(
            field, f"must be a str, got {type(value).__name__}", stream_id=stream_id, index=index
        )
    if not value:
        raise InvalidEvent(field, "must not be empty", stream_id=stream_id, index=index)
    if len(value) > MAX_NAME_LENGTH:
        raise InvalidEvent(
            field,
            f"is {len(value)} characters long, the limit is {MAX_NAME_LENGTH}",
            stream_id=stream_id,
            index=index,
        )
    if not value.isprintable():
        for i, ch in enumerate(value):
            if not ch.isprintable() and (
                ord(ch) < 0x20
                or 0x7F <= ord(ch) < 0xA0
                or ch in "\u2028\u2029"
                or 0xD800 <= ord(ch) < 0xE000
            ):
                raise InvalidEvent(
                    field,
                    f"contains control character U+{ord(ch):04X} at offset {i}",
                    stream_id=stream_id,
                    index=index,
                )
    return value


def format_at(dt: datetime) -> str:
    """Format a UTC datetime as the chain's ``at`` string ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_at(at: str) -> datetime:
    """Inverse of :func:`format_at`; returns an aware UTC datetime."""
    return datetime.strptime(at, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True, kw_only=True)
class NewEvent:
    """An event to append.

    Attributes:
        type: event type, e.g. ``"task.created"``.
        module: the component that emitted it (required), e.g. ``"runtime"``.
        payload: any canonical-JSON value (normally an object).
        metadata: a JSON object of context (correlation ids, ...); ``{}`` when none.
        event_id: makes appends idempotent; a fresh UUID4 by default.
    """

    type: str
    module: str = ""  # required: an empty or missing module is InvalidEvent at append
    payload: Any = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    event_id: uuid.UUID | str = field(default_factory=uuid.uuid4)


@dataclass(frozen=True, slots=True)
class PayloadRef:
    """Where a spilled payload lives: blob key, size of its canonical bytes, digest."""

    key: str
    size: int
    digest: bytes

    def to_json(self) -> bytes:
        """Compact stored form."""
        return orjson.dumps({"key": self.key, "size": self.size, "digest": self.digest.hex()})

    @classmethod
    def from_json(cls, raw: bytes | str) -> PayloadRef:
        """Parse the stored form."""
        d = orjson.loads(raw)
        return cls(key=d["key"], size=int(d["size"]), digest=bytes.fromhex(d["digest"]))


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


class RecordedEvent:
    """An event as stored, immutable. Payload, metadata, id and time decode lazily."""

    __slots__ = (
        "_at",
        "_event_id",
        "_loader",
        "_meta",
        "_meta_json",
        "_payload",
        "_payload_bytes",
        "hash",
        "module",
        "payload_ref",
        "position",
        "prev_hash",
        "stream_id",
        "type",
        "version",
    )

    stream_id: str
    version: int
    position: int
    type: str
    module: str
    prev_hash: bytes
    hash: bytes
    payload_ref: PayloadRef | None
    _event_id: str
    _payload_bytes: bytes | None
    _meta_json: bytes
    _at: str
    _loader: Callable[[PayloadRef], bytes] | None
    _payload: Any
    _meta: Any

    def __init__(
        self,
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
    ) -> None:
        s = object.__setattr__
        s(self, "stream_id", stream_id)
        s(self, "version", version)
        s(self, "position", position)
        s(self, "_event_id", event_id)
        s(self, "type", type)
        s(self, "module", module)
        s(self, "_payload_bytes", payload_bytes)
        s(self, "_meta_json", meta_json)
        s(self, "_at", at)
        s(self, "prev_hash", prev_hash)
        s(self, "hash", hash)
        s(self, "payload_ref", payload_ref)
        s(self, "_loader", loader)
        s(self, "_payload", _MISSING)
        s(self, "_meta", _MISSING)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"RecordedEvent is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"RecordedEvent is immutable; cannot delete {name!r}")

    @property
    def event_id(self) -> uuid.UUID:
        """The event's id."""
        return uuid.UUID(self._event_id)

    @property
    def event_id_str(self) -> str:
        """The event's id as stored (and as hashed)."""
        return self._event_id

    @property
    def at(self) -> str:
        """``recorded_at`` exactly as it is hashed: ``YYYY-MM-DDTHH:MM:SS.ffffffZ``."""
        return self._at

    @property
    def recorded_at(self) -> datetime:
        """When the library recorded the event (UTC, microsecond precision)."""
        return parse_at(self._at)

    @property
    def metadata_json(self) -> bytes:
        """Canonical JSON bytes of the metadata, as hashed."""
        return self._meta_json

    @property
    def metadata(self) -> dict[str, Any]:
        """The metadata object (decoded on first access)."""
        m = self._meta
        if m is _MISSING:
            m = orjson.loads(self._meta_json)
            object.__setattr__(self, "_meta", m)
        return m  # type: ignore[no-any-return]

    @property
    def payload_bytes(self) -> bytes:
        """Canonical JSON bytes of the payload. Fetches a spilled payload (and checks its
        digest) on first access.

        Raises:
            BlobMissing: the spilled payload is not in the blob store.
            BlobCorrupted: the fetched bytes do not match the chained digest.
        """
        b = self._payload_bytes
        if b is None:
            ref = self.payload_ref
            if ref is None or self._loader is None:
                from ares_events.errors import BlobMissing

                raise BlobMissing(
                    ref.key if ref else "?",
                    "no blob store configured to load it",
                    stream_id=self.stream_id,
                    version=self.version,
                )
            b = self._loader(ref)
            object.__setattr__(self, "_payload_bytes", b)
        return b

    @property
    def payload_loaded(self) -> bool:
        """False while a spilled payload has not been fetched."""
        return self._payload_bytes is not None

    def _with_loader(self, loader: Callable[[PayloadRef], bytes]) -> RecordedEvent:
        """A copy of this event whose spilled payload is fetched by ``loader`` (internal;
        blob stores attach themselves to events read from a backend)."""
        return RecordedEvent(
            self.stream_id,
            self.version,
            self.position,
            self._event_id,
            self.type,
            self.module,
            self._payload_bytes,
            self._meta_json,
            self._at,
            self.prev_hash,
            self.hash,
            self.payload_ref,
            loader,
        )

    @property
    def payload(self) -> Any:
        """The payload (decoded, and for spilled payloads fetched, on first access)."""
        p = self._payload
        if p is _MISSING:
            p = orjson.loads(self.payload_bytes)
            object.__setattr__(self, "_payload", p)
        return p

    @property
    def payload_size(self) -> int:
        """Length of the canonical payload bytes."""
        ref = self.payload_ref
        if ref is not None:
            return ref.size
        assert self._payload_bytes is not None  # inline payloads always have bytes
        return len(self._payload_bytes)

    @property
    def payload_digest(self) -> bytes:
        """blake3 of the canonical payload bytes (from the ref for spilled payloads)."""
        ref = self.payload_ref
        if ref is not None:
            return ref.digest
        assert self._payload_bytes is not None
        return payload_digest(self._payload_bytes)

    def header(self) -> bytes:
        """The canonical header bytes this event's hash commits to."""
        return header_bytes(
            self.stream_id,
            self.version,
            self._event_id,
            self.type,
            self.module,
            self._meta_json,
            self._at,
            self.payload_digest.hex(),
            self.payload_size,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RecordedEvent):
            return NotImplemented
        return (self.stream_id, self.version, self.hash, self.position) == (
            other.stream_id,
            other.version,
            other.hash,
            other.position,
        )

    def __hash__(self) -> int:
        return hash((self.stream_id, self.version, self.hash))

    def __repr__(self) -> str:
        return (
            f"RecordedEvent(stream_id={self.stream_id!r}, version={self.version}, "
            f"position={self.position}, type={self.type!r}, module={self.module!r}, "
            f"event_id={self._event_id!r}, hash={self.hash.hex()[:16]}…)"
        )


@dataclass(frozen=True, slots=True)
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


def prepare(stream_id: str, events: Sequence[NewEvent], at: str) -> list[PreparedEvent]:
    """Validate and encode a batch (everything but versions and hashes).

    Raises:
        InvalidEvent: names the field and the event's index in the batch.
    """
    out: list[PreparedEvent] = []
    seen: set[str] = set()
    for i, ev in enumerate(events):
        if not isinstance(ev, NewEvent):
            raise InvalidEvent(
                "event",
                f"expected ae.NewEvent, got {type(ev).__name__}",
                stream_id=stream_id,
                index=i,
            )
        validate_name(ev.type, "type", stream_id=stream_id, index=i)
        validate_name(ev.module, "module", stream_id=stream_id, index=i)
        eid = ev.event_id
        if isinstance(eid, uuid.UUID):
            eid_s = str(eid)
        elif isinstance(eid, str):
            try:
                eid_s = str(uuid.UUID(eid))
            except ValueError:
                raise InvalidEvent(
                    "event_id", f"{eid!r} is not a UUID", stream_id=stream_id, index=i
                ) from None
        else:
            raise InvalidEvent(
                "event_id",
                f"must be a UUID, got {type(eid).__name__}",
                stream_id=stream_id,
                index=i,
            )
        if eid_s in seen:
            raise InvalidEvent(
                "event_id", f"{eid_s} appears twice in one batch", stream_id=stream_id, index=i
            )
        seen.add(eid_s)
        meta = ev.metadata if ev.metadata is not None else {}
        if not isinstance(meta, Mapping):
            raise InvalidEvent(
                "metadata",
                f"must be a JSON object, got {type(meta).__name__}",
                stream_id=stream_id,
                index=i,
            )
        try:
            payload_bytes = canonical_json(ev.payload, field="payload")
            meta_json = canonical_json(
                dict(meta) if type(meta) is not dict else meta, field="metadata"
            )
        except InvalidEvent as exc:
            raise InvalidEvent(exc.field, exc.problem, stream_id=stream_id, index=i) from None
        out.append(
            PreparedEvent(
                eid_s,
                ev.type,
                ev.module,
                payload_bytes,
                meta_json,
                at,
                payload_digest(payload_bytes),
                len(payload_bytes),
                None,
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


def utc_now_at() -> str:
    """The current time as an ``at`` string."""
    return format_at(datetime.now(UTC))
