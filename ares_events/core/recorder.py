"""The backend contract: a narrow recorder under a rich core.

A backend (:class:`Recorder`) persists and returns records and enforces the
expected-version check atomically. It never serializes payloads, computes digests or
folds state: the core hands it a :class:`Batch` whose :meth:`Batch.seal` computes the
versions and link hashes from the head the backend read *inside its write transaction*,
so two writers can never fork a chain.

Write protocol every backend follows, in one transaction::

    lock the stream (or the database)
    rows = existing events whose event_id is in batch.event_ids
    if rows: return AppendOutcome(rows, duplicate=True)      # core decides: replay or error
    head = current (version, hash) of the stream
    check_expected_version(stream_id, expected, head.version)
    sealed = batch.seal(head)
    insert sealed rows with the next global positions; upsert the head
    commit

Backends that declare :attr:`Capability.MULTI_STREAM_APPEND` also implement
``append_many(batches, tracking)`` and ``tracked_position(name)``: several batches (each
with its own expected version) and an optional :class:`TrackingRecord`, in ONE
transaction::

    lock every stream of the batches (and the tracking name) in one sorted order
    if any batch's event ids are stored: return its duplicate outcome, write nothing
    check the tracking record is above the name's tracked position (ConcurrencyError)
    for each batch: head, check_expected_version, seal, insert (positions consecutive in
        batch order); upsert its head
    upsert the tracked position
    commit

The events of one call get consecutive global positions in batch order, so the core
knows every event's position from the last one.

Backends that declare :attr:`Capability.ERASE` implement ``erase(stream_id, version,
position, event_hash, ref) -> EraseOutcome``: in one transaction, set the matching row's
payload to NULL and its ``payload_ref`` to ``ref.to_json()`` (an
:class:`~ares_events.core.events.ErasedPayloadRef`), then count the other rows whose
``payload_ref`` names the same blob key; make the old bytes unreadable where the
backend can (SQLite: ``secure_delete`` and a WAL checkpoint); drop any cached copy.

Optional methods the core looks for (duck-typed; a wrapper such as the Redis cache keeps
its backend in ``.inner``): ``wait_for(position, timeout)`` (native wake-ups),
``default_blobs_url()`` (where spilled payloads go by default) and
``snapshot_store(event_store)``, which returns the backend's
:class:`~ares_events.core.snapshots.SnapshotStore`; ``EventStore.snapshots`` calls it,
so the core never imports a backend.
"""

from __future__ import annotations

import enum
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, runtime_checkable
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from ares_events.core.events import ExpectedVersion, PreparedEvent, RecordedEvent
from ares_events.errors import ConcurrencyError, ConfigError
from ares_events.integrity.chain import (
    ChainKey,
    genesis,
    header_bytes,
    link_hash,
    link_hashes,
)

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "AppendOutcome",
    "AsyncRecorder",
    "Batch",
    "Capability",
    "EraseOutcome",
    "Head",
    "Recorder",
    "SealedEvent",
    "StoreURL",
    "TrackingRecord",
    "check_tracking",
    "parse_bool",
    "prefix_range",
]


class Capability(enum.Enum):
    """Optional behaviours a backend declares explicitly."""

    GAPLESS_POSITIONS = "gapless_positions"
    """Global positions are 1, 2, 3, ... with no holes (memory, SQLite)."""
    PERSISTENT = "persistent"
    """Data survives closing and reopening the store."""
    MULTI_PROCESS = "multi_process"
    """Several processes may append at once."""
    WAKEUPS = "wakeups"
    """``wait_for(position, timeout)`` blocks until new events arrive without polling."""
    SNAPSHOTS = "snapshots"
    """The backend has a snapshot table (its ``snapshot_store(event_store)`` hook)."""
    MULTI_STREAM_APPEND = "multi_stream_append"
    """``append_many(batches, tracking)``: one transaction over several streams, with an
    optional :class:`TrackingRecord`; and ``tracked_position(name)``."""
    ERASE = "erase"
    """``erase(stream_id, version, position, event_hash, ref) -> EraseOutcome``: replace
    one event's payload (inline bytes or blob reference) with an
    :class:`~ares_events.core.events.ErasedPayloadRef`, leaving every other column, the
    hash chain and the global order as they are (see :class:`EraseOutcome`)."""


@dataclass(frozen=True, slots=True)
class TrackingRecord:
    """ "``name`` has processed everything up to ``position``", written atomically with
    the events of an :meth:`~ares_events.core.store.EventStore.append_many` (a consumer's
    exactly-once bookmark). A name's tracked position only ever increases."""

    name: str
    position: int


def check_tracking(record: TrackingRecord, current: int | None) -> None:
    """Raise :class:`ConcurrencyError` unless ``record`` is above the tracked position.

    Backends call this inside their write transaction, under the tracking name's lock.

    Raises:
        ConcurrencyError: ``record.position`` is not above ``current``.
    """
    if current is not None and record.position <= current:
        raise ConcurrencyError(
            f"tracking:{record.name}",
            f"a position above {current}",
            current,
            f"position {record.position} is not above the tracked position",
        )


@dataclass(frozen=True, slots=True)
class Head:
    """A stream head: last version and the hash of that event."""

    version: int
    hash: bytes


@dataclass(slots=True)  # not frozen: one per appended event, internal
class SealedEvent:
    """A prepared event with its place in the chain, ready to insert."""

    event: PreparedEvent
    version: int
    prev_hash: bytes
    hash: bytes

    def recorded(self, stream_id: str, position: int) -> RecordedEvent:
        """Build the :class:`RecordedEvent` once the backend knows the position."""
        e = self.event
        return RecordedEvent(
            stream_id,
            self.version,
            position,
            e.event_id,
            e.type,
            e.module,
            e.payload_bytes,
            e.meta_json,
            e.at,
            self.prev_hash,
            self.hash,
            e.payload_ref,
        )


class Batch:
    """Events to append to one stream, validated and encoded by the core."""

    __slots__ = ("_key", "event_ids", "events", "stream_id")

    def __init__(
        self, stream_id: str, events: Sequence[PreparedEvent], key: ChainKey | None
    ) -> None:
        self.stream_id = stream_id
        self.events = list(events)
        self.event_ids = [e.event_id for e in self.events]
        self._key = key

    def seal(self, head: Head | None) -> list[SealedEvent]:
        """Assign versions after ``head`` and compute the link hashes."""
        stream_id = self.stream_id
        if head is None or head.version == 0:
            version, prev = 0, genesis(stream_id)
        else:
            version, prev = head.version, head.hash
        events = self.events
        if len(events) == 1:  # the common append: no hasher worth reusing
            e = events[0]
            header = header_bytes(
                stream_id,
                version + 1,
                e.event_id,
                e.type,
                e.module,
                e.meta_json,
                e.at,
                e.digest.hex(),
                e.size,
            )
            return [SealedEvent(e, version + 1, prev, link_hash(prev, header, self._key))]
        hashes = link_hashes(stream_id, version, prev, events, self._key)
        out = []
        for e, h in zip(events, hashes, strict=True):
            version += 1
            out.append(SealedEvent(e, version, prev, h))
            prev = h
        return out


@dataclass(frozen=True, slots=True)
class AppendOutcome:
    """What a backend's append returns: the events written, or the stored events that
    already carry the batch's ids (``duplicate=True``; nothing was written)."""

    events: list[RecordedEvent]
    duplicate: bool = False
    version: int | None = None
    """Last version written; backends may set it (with ``position``) and leave ``events``
    empty on the normal path, which saves building events nobody reads."""
    position: int | None = None


@dataclass(frozen=True, slots=True)
class EraseOutcome:
    """What a backend's ``erase`` returns.

    ``erased`` is True when the row (matched by stream, version, position *and* hash, so
    a row rewritten since it was read is never touched) now holds the erased reference;
    ``blob_refs`` counts the *other* events whose payload still lives in the same blob
    (counted in the same transaction; the core deletes the blob only when it is 0).
    """

    erased: bool
    blob_refs: int = 0


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL. ``redacted()`` is the only form ever logged or shown."""

    raw: str
    scheme: str
    username: str | None
    password: str | None
    host: str | None
    port: int | None
    path: str
    query: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, url: str, *, source: str = "store URL") -> StoreURL:
        """Parse ``url``.

        Raises:
            ConfigError: the URL has no scheme or an invalid port.
        """
        if not isinstance(url, str) or "://" not in url:
            raise ConfigError(
                f"{source} must look like scheme://..., got {_redact_text(str(url))!r}"
            )
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"{source} has an invalid port") from None
        return cls(
            raw=url,
            scheme=parts.scheme.lower(),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            host=parts.hostname,
            port=port,
            path=unquote(parts.path),
            query=tuple(parse_qsl(parts.query, keep_blank_values=True)),
        )

    @property
    def params(self) -> dict[str, str]:
        """Query parameters (last one wins)."""
        return dict(self.query)

    def check_params(self, allowed: Sequence[str]) -> dict[str, str]:
        """Return the query parameters, refusing unknown ones.

        Raises:
            ConfigError: a parameter is not in ``allowed``; lists the valid ones.
        """
        params = self.params
        unknown = sorted(set(params) - set(allowed))
        if unknown:
            raise ConfigError(
                f"unknown parameter(s) {', '.join(unknown)} in "
                f"{self.redacted()}; valid: {', '.join(sorted(allowed)) or 'none'}"
            )
        return params

    def redacted(self) -> str:
        """The URL with any password replaced by ``***``."""
        return _redact_text(self.raw)

    def __repr__(self) -> str:
        return f"StoreURL({self.redacted()!r})"

    __str__ = redacted


# Query parameters that carry credentials (libpq takes password= and sslpassword=).
_SECRET_PARAM: Final = re.compile(
    r"([?&;][^=&#]*(?:password|secret|token|passwd)[^=&#]*=)[^&#]*", re.IGNORECASE
)


_BOOLS: Final = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


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


def parse_bool(value: object, name: str, where: str) -> bool:
    """A boolean URL parameter or option: a bool, or true/false/1/0/yes/no.

    Raises:
        ConfigError: anything else (names the parameter and the redacted URL).
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in _BOOLS:
        return _BOOLS[value.lower()]
    raise ConfigError(f"{name} must be true or false, got {value!r} in {where}")


def _redact_text(url: str) -> str:
    return _SECRET_PARAM.sub(r"\1***", _redact_userinfo(url))


def _redact_userinfo(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        # urlsplit sees no password when one holds an unencoded '/', '?' or '#', or when
        # the scheme is missing: redact anything shaped like "user:secret@" regardless.
        head, at, tail = url.rpartition("@")
        prefix, sep, userinfo = head.partition("://")
        if not sep:
            prefix, userinfo = "", head
        user, colon, _ = userinfo.partition(":")
        if not at or not colon:
            return url
        return f"{prefix}{sep}{user}:***@{tail}"
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = quote(unquote(parts.username or ""), safe="")
    return parts._replace(netloc=f"{user}:***@{netloc}").geturl()


@runtime_checkable
class Recorder(Protocol):
    """What a backend implements. Third-party stores need not inherit anything."""

    scheme: ClassVar[tuple[str, ...]]
    capabilities: ClassVar[frozenset[Capability]]

    @classmethod
    def from_url(cls, url: StoreURL, **options: Any) -> Self:
        """Open the backend described by ``url``."""
        ...

    def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append atomically, following the write protocol in the module docstring."""
        ...

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> Iterator[RecordedEvent]:
        """Events of one stream in version order, lazily."""
        ...

    def read_all(
        self, after_position: int, limit: int | None, *, stream_prefix: str | None = None
    ) -> Iterator[RecordedEvent]:
        """Events of every stream in global position order, lazily.

        With ``stream_prefix`` (never empty when given), only the events of streams whose id
        starts with it, as the range condition of :func:`prefix_range`; ``limit`` counts
        those events. The core passes the keyword only when a prefix is asked for.
        """
        ...

    def head(self, stream_id: str) -> Head | None:
        """The stream's head row, or None when the stream does not exist."""
        ...

    def heads(self) -> Iterator[tuple[str, Head]]:
        """Every stream head, ordered by stream id."""
        ...

    def last_position(self) -> int:
        """The highest global position committed (0 when empty)."""
        ...

    def close(self) -> None:
        """Release connections and files. Idempotent."""
        ...


@runtime_checkable
class AsyncRecorder(Protocol):
    """The asyncio face of a backend: the same contract as :class:`Recorder`, each I/O
    method a coroutine and each read an async iterator. What
    :class:`~ares_events.core.store_async.AsyncEventStore` drives.

    A backend provides one natively (memory, PostgreSQL) or gets the generic adapter
    that runs its blocking :class:`Recorder` in a small pool of worker threads
    (:class:`~ares_events.stores.threaded.ThreadedRecorder`: SQLite, the Redis cache,
    third-party stores). Optional methods mirror the blocking ones (``append_many``,
    ``tracked_position``, ``wait_for``, ``meta_get``/``meta_put_if_absent``/``meta_set``,
    ``find_duplicates``, ``default_blobs_url``, ``snapshot_rows``).
    """

    capabilities: frozenset[Capability]

    def describe(self) -> str:
        """The store's URL, redacted."""
        ...

    async def append(self, batch: Batch, expected_version: ExpectedVersion) -> AppendOutcome:
        """Append atomically, following the write protocol in the module docstring."""
        ...

    def read(
        self, stream_id: str, from_version: int, to_version: int | None, limit: int | None
    ) -> AsyncIterator[RecordedEvent]:
        """Events of one stream in version order, lazily."""
        ...

    def read_all(self, after_position: int, limit: int | None) -> AsyncIterator[RecordedEvent]:
        """Events of every stream in global position order, lazily."""
        ...

    async def head(self, stream_id: str) -> Head | None:
        """The stream's head row, or None when the stream does not exist."""
        ...

    def heads(self) -> AsyncIterator[tuple[str, Head]]:
        """Every stream head, ordered by stream id."""
        ...

    async def last_position(self) -> int:
        """The highest global position visible to ``read_all`` (0 when empty)."""
        ...

    async def close(self) -> None:
        """Release connections; calls in flight fail with ``StoreClosed``. Idempotent."""
        ...
